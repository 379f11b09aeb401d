"""Air gap on the image KServe runs (issue 48): the ServingRuntime an InferenceService names is read from the cluster, and
with `spec_decoding_air_gapped: true` a runtime whose image is on a public registry stops the deploy at the render (the
validation, which gets that read), naming the runtime, the image and the variable, before anything is written. (The test
bed's own runtime, on registry.invalid, passes the same check in test_airgap.py's air-gapped deploy.)"""
from __future__ import annotations

from tests.ansible_run import run_playbook
from tests.integration.test_deploy import _get, _vars

RUNTIME = "vllm-public"


def test_a_servingruntime_on_docker_hub_is_refused_before_anything_is_written(tmp_path, kubeconfig, k8s_client, namespace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    body = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime", "metadata": {"name": RUNTIME},
            "spec": {"supportedModelFormats": [{"name": "transformers", "autoSelect": True}], "protocolVersions": ["v2"],
                     "containers": [{"name": "kserve-container", "image": "vllm/vllm-openai:v0.32.0", "args": ["--port=8080"]}]}}
    client.CustomObjectsApi(k8s_client).create_namespaced_custom_object("serving.kserve.io", "v1alpha1", namespace, "servingruntimes", body)
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig,
                       extra_vars=_vars(namespace, "airgap-runtime", spec_decoding_air_gapped=True, spec_decoding_runtime=RUNTIME))
    assert run.rc != 0, run.output
    failed = run.failed[-1]
    print("refused: %s" % failed["msg"])
    names = [name for name, _host, _res in run.tasks]
    assert names[-1].endswith("Render the InferenceService"), names
    assert failed["msg"].startswith("spec_decoding_runtime: spec_decoding_air_gapped: true refuses the ServingRuntime %s" % RUNTIME)
    assert "'vllm/vllm-openai:v0.32.0' from the public registry docker.io" in failed["msg"] and "Fix:" in failed["msg"], failed["msg"]
    assert _get(k8s_client, namespace, "airgap-runtime") is None
