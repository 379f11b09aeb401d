"""playbooks/benchmark.yml against the real kube-apiserver test bed: context read from the cluster, guarded rollback.

Two guide-style InferenceServices (baseline = the EAGLE-3 example without the flag, candidate = the EAGLE-3
example) are reconciled by the KServe stand-in; their pods log the real vLLM 0.32 engine lines from
../shared/vllm-captures; the node carries the NVIDIA GPU labels. The inference endpoints are loopback streaming
servers (the API server cannot proxy to loopback): the candidate one is slower, so the decision is roll_back,
and with guard=true the playbook runs the rollback role, which really strips the flag on the API server.
"""
from __future__ import annotations

import json
import os
import threading
from http.server import ThreadingHTTPServer

import pytest
import yaml

from tests.ansible_run import run_playbook
from tests.testbed.kserve_standin import DEFAULT_RUNTIME_IMAGE
from tests.unit.plugins.module_utils.test_bench_client import ScriptedSSE

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(REPO, "tests", "unit", "plugins", "module_utils", "data", "rollback")
CAPTURES = os.environ.get("ALAUDA_VLLM_CAPTURES", os.path.join(os.path.dirname(REPO), "shared", "vllm-captures"))
BASE, CAND = "llama31-8b-base", "llama31-8b-eagle3"
GPU_LABELS = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "8"}


class SlowSSE(ScriptedSSE):
    gap = 0.12


def _capture(folder):
    path = os.path.join(CAPTURES, folder, "startup.log")
    if not os.path.isfile(path):
        pytest.skip("vLLM captures not found at %s (set ALAUDA_VLLM_CAPTURES)" % path)
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _manifest(filename, namespace, name):
    with open(os.path.join(DATA, filename), encoding="utf-8") as handle:
        obj = yaml.safe_load(handle)
    obj["metadata"].update(namespace=namespace, name=name)
    return obj


@pytest.fixture
def endpoints():
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), handler) for handler in (ScriptedSSE, SlowSSE)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield ["http://127.0.0.1:%d" % s.server_address[1] for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def gpu_node(k8s_client, kubelet):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    core = client.CoreV1Api(k8s_client)
    core.patch_node(kubelet.node_name, {"metadata": {"labels": GPU_LABELS}})
    yield kubelet.node_name
    core.patch_node(kubelet.node_name, {"metadata": {"labels": {k: None for k in GPU_LABELS}}})


def _wait_ready(k8s_client, namespace, name):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils import isvc_wait  # pylint: disable=import-outside-toplevel
    isvc, _elapsed = isvc_wait.wait_ready(k8s_client, namespace, name, timeout=60, interval=0.3)
    return isvc


def test_benchmark_playbook_reads_the_cluster_and_guards(tmp_path, kubeconfig, k8s_client, kserve, namespace, gpu_node, endpoints):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    api = client.CustomObjectsApi(k8s_client)
    kserve.set_behaviour(namespace, BASE, ready_after=0.2, log_text=_capture("baseline"))
    kserve.set_behaviour(namespace, CAND, ready_after=0.2, log_text=_capture("baseline"))
    kserve.set_behaviour(namespace, CAND, ready_after=0.2, log_text=_capture("eagle3"), generation=1)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _manifest("guide_example2_eagle3.rolled_back.yaml", namespace, BASE))
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _manifest("guide_example2_eagle3.yaml", namespace, CAND))
    _wait_ready(k8s_client, namespace, BASE)
    _wait_ready(k8s_client, namespace, CAND)
    report_dir = str(tmp_path / "report")
    run = run_playbook(tmp_path, "playbooks/benchmark.yml", kubeconfig=kubeconfig, extra_vars={
        "benchmark_namespace": namespace, "benchmark_baseline_name": BASE, "benchmark_candidate_name": CAND,
        "benchmark_baseline_url": endpoints[0], "benchmark_candidate_url": endpoints[1],
        "benchmark_workload": "general_chat", "benchmark_max_tokens": 32, "benchmark_concurrency": 3,
        "benchmark_report_dir": report_dir, "guard": True,
        "rollback_wait_timeout": 60, "rollback_wait_sleep": 1, "rollback_verify_delay": 1,
    })
    assert run.rc == 0, run.output
    bench = run.result("Run the A/B benchmark")
    assert bench["changed"] is False and bench["decision"] == "roll_back", bench.get("reasons")
    assert any("TPOT" in reason or "TTFT" in reason for reason in bench["reasons"])
    with open(bench["report_json"], encoding="utf-8") as handle:
        ctx = json.load(handle)["context"]
    # Read from the cluster: GPU model from the node label, count from the pod's nvidia.com/gpu limit, image from
    # the pod, vLLM version from the engine line, commands from the InferenceServices, model and dtype from the
    # candidate's bash -c script (--served-model-name, --dtype ${DTYPE} with the container env).
    assert ctx["hardware"] == {"gpu_model": "NVIDIA-L4", "gpu_count": "1", "notes": None}
    assert ctx["runtime"] == {"vllm_version": "0.32.0", "image": DEFAULT_RUNTIME_IMAGE}
    assert ctx["model"] == {"id": CAND, "dtype": "bfloat16"}
    assert ctx["commands"]["candidate"][:2] == ["bash", "-c"] and "--speculative-config" in ctx["commands"]["candidate"][2]
    assert "--speculative-config" not in ctx["commands"]["baseline"][2]
    assert ctx["speculative_config"]["method"] == "eagle3"
    # The guard rolled the candidate back on the API server; the baseline is untouched.
    rollback = run.result("Strip the speculative config")
    assert rollback["changed"] is True
    cand = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, CAND)
    assert "--speculative-config" not in cand["spec"]["predictor"]["model"]["command"][2]
    base = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, BASE)
    assert base["metadata"]["generation"] == 1
