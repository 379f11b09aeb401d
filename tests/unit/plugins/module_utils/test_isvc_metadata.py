"""metadata.annotations and metadata.labels of the rendered InferenceService and LLMInferenceService
(kserve/isvc/render.py metadata_maps): the inventory's keys merged with the collection's, the collection's keys kept,
Kubernetes' key and value rules applied before anything is written."""
import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import render as llmisvc_render

P = dict(name="llama-eagle3", namespace="models", method="eagle3", artifact_mode="pvc",
         artifacts={"pvc_name": "store"}, runtime="aml-vllm-0.32.0", vllm_version="0.32.0", kserve_version="0.20.0",
         dtype="bfloat16", gpu_memory_utilization=0.9, max_model_len=8192, max_num_seqs=64, seed=42)
TESTBED_RUN = "testbed.alauda.io/run"


def metadata(**over):
    return isvc.render(dict(P, **over))["manifest"]["metadata"]


def refusal(**over):
    with pytest.raises(ValidationError) as info:
        isvc.render(dict(P, **over))
    return info.value


def test_inventory_annotations_and_labels_join_the_collections_own():
    meta = metadata(annotations={TESTBED_RUN: "process", "example.com/owner": "search team"},
                    labels={"team": "search", "example.com/tier": "gold"}, model_repo="llama")
    assert meta["annotations"] == {isvc.DEPLOYMENT_MODE_ANNOTATION: "Standard", isvc.MODEL_REPO_ANNOTATION: "llama",
                                   TESTBED_RUN: "process", "example.com/owner": "search team"}
    assert meta["labels"] == {isvc.RUNTIME_TYPE_LABEL: "vllm", "team": "search", "example.com/tier": "gold"}


def test_without_inventory_keys_only_the_collections_are_rendered():
    meta = metadata()
    assert meta["annotations"] == {isvc.DEPLOYMENT_MODE_ANNOTATION: "Standard"}
    assert meta["labels"] == {isvc.RUNTIME_TYPE_LABEL: "vllm"}


def test_a_collection_key_with_the_same_value_is_accepted():
    meta = metadata(annotations={isvc.DEPLOYMENT_MODE_ANNOTATION: "Standard"}, labels={isvc.RUNTIME_TYPE_LABEL: "vllm"})
    assert meta["annotations"][isvc.DEPLOYMENT_MODE_ANNOTATION] == "Standard"


@pytest.mark.parametrize("over, field, names", [
    # deploymentMode is read back from the cluster to refuse a mode change: an override would bypass that check.
    (dict(annotations={isvc.DEPLOYMENT_MODE_ANNOTATION: "Knative"}), "annotations[serving.kserve.io/deploymentMode]",
     "set spec_decoding_deployment_mode"),
    (dict(deployment_mode="Knative", annotations={isvc.PROGRESS_DEADLINE_ANNOTATION: "60s"}),
     "annotations[serving.knative.dev/progress-deadline]", "set spec_decoding_startup_timeout_seconds"),
    (dict(model_repo="llama", annotations={isvc.MODEL_REPO_ANNOTATION: "other"}), "annotations[aml-model-repo]",
     "set spec_decoding_model_repo"),
    (dict(labels={isvc.RUNTIME_TYPE_LABEL: "sglang"}), "labels[aml.cpaas.io/runtime-type]", "drop aml.cpaas.io/runtime-type"),
])
def test_a_collection_key_with_another_value_is_refused_naming_the_variable(over, field, names):
    exc = refusal(**over)
    assert exc.field == field
    assert "is set by the collection" in exc.message
    assert names in exc.hint, exc.hint


@pytest.mark.parametrize("over, field, says", [
    (dict(annotations={"example.com/replicas": 2}), "annotations[example.com/replicas]", 'example.com/replicas: "2"'),
    (dict(labels={"canary": True}), "labels[canary]", 'canary: "true"'),
    (dict(labels={"bad key!": "x"}), "labels[bad key!]", "not a Kubernetes label key"),
    (dict(annotations={"Example.com/x": "y"}), None, None),  # ValidateAnnotations lower-cases the key: accepted
    (dict(annotations={"a/b/c": "y"}), "annotations[a/b/c]", "more than one '/'"),
    (dict(annotations={"EXAMPLE_COM/x": "y"}), "annotations[EXAMPLE_COM/x]", "not a DNS-1123 subdomain"),
    (dict(labels={"note": "has spaces"}), "labels[note]", "at most 63 characters"),
    (dict(labels={"long": "x" * 64}), "labels[long]", "at most 63 characters"),
    (dict(labels={"x" * 64: "v"}), "labels[%s]" % ("x" * 64), "1-63 characters"),
    (dict(labels=["team=search"]), "labels", "must be a mapping"),
])
def test_kubernetes_key_and_value_rules(over, field, says):
    if field is None:
        assert metadata(**over)["annotations"]["Example.com/x"] == "y"
        return
    exc = refusal(**over)
    assert exc.field == field
    assert says in exc.message + " " + exc.hint, (exc.message, exc.hint)


def test_an_empty_label_value_is_valid():
    assert metadata(labels={"flag": ""})["labels"]["flag"] == ""


def test_annotations_over_256_kib_are_refused():
    exc = refusal(annotations={"example.com/blob": "x" * (256 * 1024)})
    assert exc.field == "annotations" and "256 KiB" in exc.message


def test_the_llminferenceservice_takes_the_same_keys_and_rules():
    p = dict(name="llama-eagle3", namespace="models", method="eagle3", artifact_mode="pvc", artifacts={"pvc_name": "model-store"},
             dtype="auto", max_model_len=8192, max_num_seqs=64, seed=42, vllm_version="0.32.0",
             llmisvc={"image": "registry.local/vllm/vllm-openai:v0.32.0"}, runtime="unused",
             annotations={TESTBED_RUN: "process"}, labels={"team": "search"})
    meta = llmisvc_render.render(p)["manifest"]["metadata"]
    assert meta["annotations"] == {TESTBED_RUN: "process"}
    assert meta["labels"] == {isvc.RUNTIME_TYPE_LABEL: "vllm", "team": "search"}
    with pytest.raises(ValidationError) as info:
        llmisvc_render.render(dict(p, labels={isvc.RUNTIME_TYPE_LABEL: "other"}))
    assert info.value.field == "labels[aml.cpaas.io/runtime-type]"
