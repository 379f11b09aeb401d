"""Newer KServe releases (kserve/releases.py): detected and named, rendered with the newest known rules, never refused for
their number; and a resource carrying speculative settings in a field KServe 0.20 does not have makes verify and rollback
refuse (both kinds, every path that reads the flag) before anything is read from pods or written."""
from __future__ import annotations

import copy
import os

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import releases
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import cluster as llmisvc_cluster
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc_flags
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import engine_config_info, rollback
from tests.testbed import crds
from tests.testbed.controlplane import _load_crd

SPEC = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'


def _crd(kind="inferenceservices"):
    """The real CRD, found as the test bed finds it (tests/testbed/crds.py; the parsed form is cached as JSON)."""
    return _load_crd(os.path.join(crds.resolve(), "serving.kserve.io_%s.yaml" % kind))


def _isvc(**predictor_extra):
    predictor = {"model": {"modelFormat": {"name": "transformers"}, "runtime": "vllm",
                           "args": ["--model", "/mnt/models", "--speculative-config", SPEC]}}
    predictor.update(predictor_extra)
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "llama", "namespace": "models", "generation": 1, "resourceVersion": "1"},
            "spec": {"predictor": predictor}}


def _llmisvc(**spec_extra):
    spec = {"model": {"uri": "pvc://store/llama"},
            "template": {"containers": [{"name": "main", "command": ["vllm", "serve", "/mnt/models"], "args": ["--port", "8000"]}]}}
    spec.update(spec_extra)
    return {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
            "metadata": {"name": "llama", "namespace": "models", "generation": 1}, "spec": spec}


# ---------------------------------------------------------------------------------------------------------------
# newer releases


def test_the_known_fields_are_the_v0_20_crds():
    crd = _crd()
    assert releases.newer_crd_fields(crd) == []
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert set(schema) == releases.ISVC_SPEC_FIELDS and set(schema["predictor"]["properties"]) == releases.PREDICTOR_FIELDS
    for version in _crd("llminferenceservices")["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        assert set(spec) <= releases.LLMISVC_SPEC_FIELDS and set(spec["prefill"]["properties"]) <= releases.LLMISVC_POOL_FIELDS


def test_a_crd_with_fields_v0_20_has_not_is_a_newer_kserve_with_the_newest_rules():
    crd = _crd()
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    spec["predictor"]["properties"]["speculator"] = {"type": "object"}
    spec["router"] = {"type": "object"}
    assert releases.newer_crd_fields(crd) == ["spec.predictor.speculator", "spec.router"]
    version, evidence = releases.kserve_version_from_crd(crd)
    assert version == (0, 20, 0)
    assert "spec.predictor.speculator, spec.router" in evidence and "newer than the KServe releases this collection knows" in evidence


def test_a_newer_release_number_renders_with_the_newest_rules_and_a_warning():
    assert releases.rules_release((0, 19, 2)) == ((0, 19, 2), None)
    version, warning = releases.rules_release((0, 21, 0))
    assert version == (0, 20, 0) and "KServe 0.21.0 is newer" in warning and "0.20.0's" in warning
    out = isvc.render({"name": "llama", "namespace": "models", "method": "ngram", "runtime": "vllm", "kserve_version": "0.21.1",
                       "artifacts": {"storage_uri": "pvc://store/llama"}, "dtype": "auto", "gpu_memory_utilization": 0.9,
                       "max_model_len": 4096, "max_num_seqs": 8, "seed": 0})
    assert out["manifest"]["spec"]["predictor"]["model"]["storageUri"] == "pvc://store/llama"
    assert any("KServe 0.21.1 is newer" in w for w in out["warnings"])


@pytest.mark.parametrize("image,release", [
    ("kserve/storage-initializer:v0.21.0", (0, 21, 0)), ("registry.local:5000/kserve/storage-initializer:v0.20.1", (0, 20, 1)),
    ("kserve/storage-initializer:0.22", (0, 22, 0)), ("kserve/storage-initializer:latest", None), (None, None),
])
def test_release_from_an_image_tag(image, release):
    assert releases.release_from_image(image) == release


# ---------------------------------------------------------------------------------------------------------------
# speculative settings in a field the collection does not know


def test_unknown_speculative_fields_are_found_and_known_or_other_fields_are_not():
    assert releases.unknown_speculative_fields(_isvc()) == []
    assert releases.unknown_speculative_fields(_isvc(nodeSelector={"gpu": "a100"}, someNewField={})) == []
    assert releases.unknown_speculative_fields(_isvc(speculativeDecoding={"method": "eagle3"})) == ["spec.predictor.speculativeDecoding"]
    assert releases.unknown_speculative_fields(_llmisvc(speculator={"model": {"uri": "pvc://store/draft"}})) == ["spec.speculator"]
    pooled = _llmisvc(prefill={"replicas": 1, "Speculator": {}})
    assert releases.unknown_speculative_fields(pooled) == ["spec.prefill.Speculator"]


def _refused(info, path):
    text = str(info.value)
    assert text.startswith(path + ":") and "refuses to verify or roll back" in text and "Fix: remove " + path in text, text


def test_llmisvc_verify_and_rollback_read_the_flags_in_one_place_that_refuses():
    obj = _llmisvc(speculator={"model": {"uri": "pvc://store/draft"}})
    with pytest.raises(ValidationError) as info:
        llmisvc_flags.flags(obj)
    _refused(info, "spec.speculator")
    with pytest.raises(ValidationError) as info:  # verify: before any pod is listed (no API client here at all)
        llmisvc_cluster.engine_report(None, obj)
    _refused(info, "spec.speculator")


def test_llmisvc_rollback_refuses_and_writes_nothing(monkeypatch):
    obj = _llmisvc(speculator={"model": {"uri": "pvc://store/draft"}})
    monkeypatch.setattr(llmisvc_cluster, "get", lambda *a, **k: copy.deepcopy(obj))
    monkeypatch.setattr(llmisvc_cluster, "read_presets", lambda *a, **k: {})
    monkeypatch.setattr(llmisvc_cluster, "read_env_sources", lambda *a, **k: {})
    monkeypatch.setattr(rollback, "_patch_llmisvc", lambda *a, **k: pytest.fail("the rollback wrote"))
    params = {"namespace": "models", "name": "llama", "api_version": "v1alpha2", "config_prefix": "kserve-config-llm",
              "config_namespace": "kserve", "state": "absent", "secret_env_has_no_flag": False}
    with pytest.raises(ValidationError) as info:
        rollback.strip_llmisvc(None, params)
    _refused(info, "spec.speculator")


class _Cluster(kube_service.ClusterService):
    """The cluster service: the InferenceService read, no write allowed."""

    def __init__(self, obj):
        super().__init__(None)
        self.obj = obj

    def inference_service(self, namespace, name):
        return copy.deepcopy(self.obj)

    def json_patch(self, res, name, ops, **_kwargs):
        pytest.fail("the rollback wrote %s" % ops)


def test_isvc_rollback_refuses_and_writes_nothing():
    params = {"namespace": "models", "name": "llama", "state": "absent", "container": None, "config": None, "restore_backup": False}
    with pytest.raises(ValidationError) as info:
        rollback.run(_Cluster(_isvc(speculativeDecoding={"method": "eagle3"})), params)
    _refused(info, "spec.predictor.speculativeDecoding")


def test_isvc_verify_paths_refuse(monkeypatch):
    obj = _isvc(speculativeDecoding={"method": "eagle3"})
    with pytest.raises(ValidationError) as info:
        isvc_readers.isvc_speculative_flags(obj)
    _refused(info, "spec.predictor.speculativeDecoding")
    # the verify role's flag check (serving_runtime_info), before any runtime is read
    params = {"inference_service": obj, "namespace": "models", "name": "llama", "runtime_flag": None, "missing_runtime": "warn",
              "list_users": False}
    with pytest.raises(ValidationError) as info:
        runtime_readers.runtime_info(None, params)
    _refused(info, "spec.predictor.speculativeDecoding")
    # the engine-config check (verify, and after a rollback), before any pod is listed
    monkeypatch.setattr(k8s_pods, "get_inference_service", lambda *a: copy.deepcopy(obj))
    monkeypatch.setattr(k8s_pods, "list_predictor_pods", lambda *a, **k: pytest.fail("pods were listed"))
    with pytest.raises(ValidationError) as info:
        engine_config_info.run_cluster(lambda: None, {"expected": None, "namespace": "models", "name": "llama",
                                                      "expected_from_inference_service": True}, lambda text: None)
    _refused(info, "spec.predictor.speculativeDecoding")
    # the same object without the unknown field reads as before
    assert isvc_readers.isvc_speculative_flags(_isvc())[0]["config"]["method"] == "ngram"
