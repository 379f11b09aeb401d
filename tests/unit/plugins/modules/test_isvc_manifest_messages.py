"""isvc_manifest called directly (issue 48): a draft method without a draft says which option is missing, the method, why it
needs a draft and an example in the scheme of the target given, in one line under 300 characters - where it said
`artifacts.draft_uri: is required` with pvc:// and oci:// examples, or `cannot choose an artifact mode`."""
import pytest

from tests.module_run import run_module

BASE = {"name": "llama", "namespace": "models", "runtime": "aml-vllm-0.32.0", "kserve_version": "0.20.0", "vllm_version": "0.32.0"}


def _failed(args):
    result = run_module("isvc_manifest", dict(BASE, **args))
    assert result.failed, result
    msg = result.msg
    print("%d characters: %s" % (len(msg), msg))
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


@pytest.mark.parametrize("method,mode,target,example", [
    ("eagle3", "auto", "s3://models/llama-3.1-8b", "s3://models/llama-3.1-8b-eagle3-draft"),
    ("eagle3", "storage_uris", "hf://meta-llama/Llama-3.1-8B-Instruct", "hf://meta-llama/Llama-3.1-8B-Instruct-eagle3-draft"),
    ("eagle", "auto", "gs://bucket/llama", "gs://bucket/llama-eagle-draft"),
    ("draft_model", "auto", "oci://registry.internal.example:5000/models/llama:v1", "oci://registry.internal.example:5000/models/llama-draft:v1"),
    ("eagle3", "storage_uris", "pvc://model-store/llama/", "pvc://model-store/llama-eagle3-draft"),
    # a long target: the example keeps the scheme and the last segment, so the line stays short
    ("draft_model", "auto", "s3://" + "/".join(["a-rather-long-bucket-name-for-models"] * 4) + "/Llama-3.1-70B-Instruct-with-a-long-name",
     "s3://.../"),
])
def test_a_draft_method_without_a_draft_names_draft_uri_the_method_and_an_example_in_the_targets_scheme(method, mode, target, example):
    msg = _failed({"method": method, "artifact_mode": mode, "artifacts": {"target_uri": target}})
    assert msg.startswith("artifacts.draft_uri: method %s needs a draft (" % method), msg
    assert "set draft_uri, e.g. %s" % example in msg, msg
    assert "modelcar_image" in msg and "pvc_name" in msg, msg


def test_a_draft_method_with_no_artifact_at_all_says_it_needs_a_target_and_a_draft():
    msg = _failed({"method": "eagle3"})
    assert msg.startswith("artifacts: method eagle3 needs a draft (EAGLE-3 loads a draft head trained for the target) and a target"), msg
    assert "target_uri and draft_uri" in msg, msg


def test_an_llminferenceservice_says_the_draft_must_share_the_one_artifact():
    msg = _failed({"method": "eagle3", "resource_kind": "LLMInferenceService",
                   "artifacts": {"target_uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}})
    assert msg.startswith("artifacts: method eagle3 needs a draft") and "LLMInferenceService mounts one artifact" in msg, msg
    assert "modelcar_image (e.g. oci://" in msg and "pvc_name" in msg, msg


def test_single_names_the_method():
    msg = _failed({"method": "eagle", "artifact_mode": "single", "artifacts": {"target_uri": "pvc://store/llama"}})
    assert msg.startswith("artifact_mode: method eagle needs a draft artifact but artifact_mode is 'single'"), msg


@pytest.mark.parametrize("args", [
    {"method": "eagle3", "artifacts": {"target_uri": "s3://m/llama", "draft_uri": "s3://m/llama-eagle3"}},
    {"method": "eagle3", "artifacts": {"target_uri": "s3://m/llama", "pvc_name": "model-store"}},  # auto picks the PVC
    {"method": "ngram", "artifacts": {"target_uri": "s3://m/llama"}},
])
def test_a_draft_that_is_there_or_not_needed_renders(args):
    result = run_module("isvc_manifest", dict(BASE, **args))
    assert not result.failed, result.msg
    assert result["manifest"]["kind"] == "InferenceService"


def _runtime(image):
    return {"get": {"ServingRuntime/models/aml-vllm-0.32.0": {
        "apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime", "metadata": {"name": "aml-vllm-0.32.0", "namespace": "models"},
        "spec": {"supportedModelFormats": [{"name": "transformers", "autoSelect": True}], "protocolVersions": ["v2"],
                 "containers": [{"name": "kserve-container", "image": image, "args": ["--port=8080"]}]}}}}


def test_air_gapped_the_render_refuses_the_runtime_image_on_a_public_registry_and_only_that():
    """The runtime's image (read from the cluster by kserve_info) is refused by the render, the deploy's validation, before
    anything is written (it was a task of its own: one step less on every deploy, issue 46 P4)."""
    args = {"artifacts": {"target_uri": "pvc://model-store/llama"}, "air_gapped": True}
    result = run_module("isvc_manifest", dict(BASE, runtimes=_runtime("vllm/vllm-openai:v0.32.0"), **args))
    assert result.failed, result
    msg = result.msg
    assert msg.startswith("spec_decoding_runtime: spec_decoding_air_gapped: true refuses the ServingRuntime aml-vllm-0.32.0"), msg
    assert "'vllm/vllm-openai:v0.32.0' from the public registry docker.io" in msg and "Fix:" in msg, msg
    # the same runtime is no business of a deploy that is not air-gapped, nor is an internal image's
    for other in (dict(args, air_gapped=False, runtimes=_runtime("vllm/vllm-openai:v0.32.0")),
                  dict(args, runtimes=_runtime("registry.internal.example:5000/vllm/vllm-openai:v0.32.0"))):
        result = run_module("isvc_manifest", dict(BASE, **other))
        assert "air_gapped" not in result.msg, result.msg
