"""The baseline twin: same InferenceService, speculative flags stripped, twin label; refusals name the field."""
import copy
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.baseline_twin import FilterModule, baseline_twin as twin_filter
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import baseline_twin as bench_twin
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "rollback")


def _load(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.mark.parametrize("example", ["guide_example1_ngram", "guide_example2_eagle3"])
def test_twin_is_the_hand_written_rolled_back_spec(example):
    source = _load(example + ".yaml")
    source["metadata"]["annotations"] = dict(source["metadata"].get("annotations") or {}, **{
        "kubectl.kubernetes.io/last-applied-configuration": "{}", isvc_patch.BACKUP_ANNOTATION: "{}"})
    before = copy.deepcopy(source)
    twin = bench_twin.baseline_twin(source)
    assert source == before  # the input is not modified
    assert twin["spec"] == _load(example + ".rolled_back.yaml")["spec"]
    meta = source["metadata"]
    assert twin["metadata"]["name"] == meta["name"] + "-baseline"
    assert twin["metadata"]["namespace"] == meta["namespace"]
    assert twin["metadata"]["labels"] == dict(meta.get("labels") or {}, **{bench_twin.TWIN_LABEL: "true"})
    kept = {k: v for k, v in meta["annotations"].items() if k not in bench_twin.DROPPED_ANNOTATIONS}
    assert twin["metadata"]["annotations"] == dict(kept, **{bench_twin.TWIN_OF_ANNOTATION: "%s/%s" % (meta["namespace"], meta["name"])})
    assert (twin["apiVersion"], twin["kind"]) == (source["apiVersion"], source["kind"])
    assert bench_twin.is_twin(twin) and not bench_twin.is_twin(source)


def test_args_form_and_custom_containers():
    source = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
              "metadata": {"name": "m", "namespace": "ns", "resourceVersion": "7", "uid": "u", "generation": 3},
              "spec": {"predictor": {"containers": [{"name": "kserve-container", "image": "vllm",
                                                     "args": ["--model", "/mnt/models", "--spec-method", "ngram", "--spec-tokens", "3"]}]}},
              "status": {"url": "http://m"}}
    twin = bench_twin.baseline_twin(source, name="m-base")
    assert twin["spec"]["predictor"]["containers"][0]["args"] == ["--model", "/mnt/models"]
    assert twin["metadata"]["name"] == "m-base" and "status" not in twin
    assert set(twin["metadata"]) == {"name", "namespace", "labels", "annotations"}  # no uid/resourceVersion/generation


def test_refuses_a_baseline_and_bad_names():
    baseline = _load("guide_example2_eagle3.rolled_back.yaml")
    with pytest.raises(ValidationError) as exc:
        bench_twin.baseline_twin(baseline)
    assert "already is a baseline" in str(exc.value) and "benchmark_baseline_name" in str(exc.value)
    source = _load("guide_example2_eagle3.yaml")
    for bad in ("Upper", "x" * 64, "9lives", "with_underscore"):
        with pytest.raises(ValidationError) as exc:
            bench_twin.baseline_twin(source, name=bad)
        assert "DNS-1035" in str(exc.value)
    with pytest.raises(ValidationError):
        bench_twin.baseline_twin({"metadata": {"name": "x"}})


def test_filter():
    assert FilterModule().filters()["baseline_twin"] is twin_filter
    source = _load("guide_example1_ngram.yaml")
    assert twin_filter(source, suffix="-base")["metadata"]["name"] == source["metadata"]["name"] + "-base"
    assert twin_filter(source, name="")["metadata"]["name"] == source["metadata"]["name"] + "-baseline"
    with pytest.raises(AnsibleFilterError, match="expects an InferenceService"):
        twin_filter(["not", "a", "dict"])
    with pytest.raises(AnsibleFilterError, match="already is a baseline"):
        twin_filter(_load("guide_example1_ngram.rolled_back.yaml"))


def test_twin_drops_the_marks_of_the_source_owner():
    """A twin of an Argo CD / Flux / Helm managed service is the benchmark's: with the owner's tracking annotation Argo CD
    would count it as part of its Application (and prune it), and the rollback would take it for a managed object."""
    source = _load("guide_example2_eagle3.yaml")
    source["metadata"]["annotations"].update({"argocd.argoproj.io/tracking-id": "llm:serving.kserve.io/InferenceService:llm-demo/x",
                                              "meta.helm.sh/release-name": "llm"})
    source["metadata"]["labels"].update({"kustomize.toolkit.fluxcd.io/name": "serving", "app.kubernetes.io/instance": "llm",
                                         "team": "a"})
    twin = bench_twin.baseline_twin(source)
    assert twin["metadata"]["labels"] == {"aml.cpaas.io/runtime-type": "vllm", "team": "a", bench_twin.TWIN_LABEL: "true"}
    assert not {"argocd.argoproj.io/tracking-id", "meta.helm.sh/release-name"} & set(twin["metadata"]["annotations"])
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner  # pylint: disable=import-outside-toplevel
    assert owner.owner_of(source)["kind"] == "argocd" and owner.owner_of(twin)["kind"] == "none"
