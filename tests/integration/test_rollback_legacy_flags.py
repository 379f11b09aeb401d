"""Rollback of an InferenceService whose predictor runs vLLM's legacy (pre-0.10) speculative flags, on the real
kube-apiserver with the real KServe CRD: `--speculative-model` and `--num-speculative-tokens` in args form, as KServe's
huggingfaceserver README and many published manifests still write them. Before, the rollback saw no flag, said there
was nothing to roll back, and speculative decoding stayed on. The module runs in-process (tests/module_run.py)."""
from __future__ import annotations

import json

from tests.module_run import run_module

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
NAME = "llama-legacy-spec"
BACKUP_ANNOTATION = "spec-decoding.alauda.io/previous-speculative-config"
# The shape of KServe's huggingfaceserver README example (vLLM backend), with the draft model of vLLM 0.6's docs.
ARGS = ["--model_name=llama3", "--model_id=meta-llama/meta-llama-3-8b-instruct", "--speculative-model", "/mnt/models/draft",
        "--num-speculative-tokens", "5", "--use-v2-block-manager", "--max-model-len", "4096"]
REST = ["--model_name=llama3", "--model_id=meta-llama/meta-llama-3-8b-instruct", "--use-v2-block-manager", "--max-model-len", "4096"]


def _manifest(namespace):
    return {"apiVersion": "%s/%s" % (GROUP, VERSION), "kind": "InferenceService", "metadata": {"name": NAME, "namespace": namespace},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "huggingface"}, "args": list(ARGS),
                                             "storageUri": "pvc://models/llama3",
                                             "resources": {"limits": {"cpu": "6", "memory": "24Gi", "nvidia.com/gpu": "1"}}}}}}


def _api(k8s_client):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.CustomObjectsApi(k8s_client)


def test_rollback_removes_legacy_flags_in_args_form_and_nothing_else(kubeconfig, k8s_client, namespace):
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _manifest(namespace))

    checked = run_module("isvc_speculative", {"kubeconfig": kubeconfig, "name": NAME, "namespace": namespace, "state": "absent"},
                         check_mode=True, diff=True)
    assert not checked.failed, checked.msg
    assert checked["changed"] is True  # never "nothing to roll back" while a legacy flag is there
    assert _api(k8s_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)["spec"]["predictor"]["model"]["args"] == ARGS

    result = run_module("isvc_speculative", {"kubeconfig": kubeconfig, "name": NAME, "namespace": namespace, "state": "absent"})
    assert not result.failed, result.msg
    assert result["changed"] is True
    assert result["previous_legacy_flags"] == {"--speculative-model": "/mnt/models/draft", "--num-speculative-tokens": "5"}
    stored = _api(k8s_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    model = stored["spec"]["predictor"]["model"]
    assert model["args"] == REST  # both flags and their values gone, every other item byte-identical and in order
    assert "command" not in model and model["storageUri"] == "pvc://models/llama3"
    backup = json.loads(stored["metadata"]["annotations"][BACKUP_ANNOTATION])
    assert backup["legacy_flags"] == {"--speculative-model": "/mnt/models/draft", "--num-speculative-tokens": "5"}

    again = run_module("isvc_speculative", {"kubeconfig": kubeconfig, "name": NAME, "namespace": namespace, "state": "absent"})
    assert not again.failed and again["changed"] is False, again
    # Nothing written by the rerun. Not compared by resourceVersion: the KServe stand-in's status write for the
    # rolled-back generation may land after `stored` was read (CI saw it), and status is not the module's to write.
    assert _written(_api(k8s_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)) == _written(stored)


def _written(isvc):
    """What a client other than the controller writes: spec, generation, labels and annotations."""
    meta = isvc["metadata"]
    return meta["generation"], isvc["spec"], meta.get("labels"), meta.get("annotations")
