"""KServe v0.20's own test vectors for the ServingRuntime merge and the runtime selection, run on both readings of
KServe: the collection's (plugins/module_utils/kserve/isvc/runtime.py, runtime_selection.py) and the test bed's KServe
stand-in (tests/testbed/kserve_runtimes.py through KServeStandIn._resolve_runtime / _container / _refused_status).

The vectors are data (tests/fixtures/kserve/runtime_merge.yaml, runtime_selection.yaml), each naming the Go test (or
code) it comes from; what the collection does not model is in not_modelled.yaml. Both sides must give KServe's answer,
so neither is pinned to the other.
"""
from __future__ import annotations

import re

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime as product
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_selection as selection
from tests.paths import kserve_vectors
from tests.testbed import kserve_runtimes as standin_runtimes
from tests.testbed.kserve_standin import KServeStandIn

MERGE = kserve_vectors("runtime_merge.yaml")
SELECTION = kserve_vectors("runtime_selection.yaml")
NOT_MODELLED = kserve_vectors("not_modelled.yaml")
SR, CSR = "ServingRuntime", "ClusterServingRuntime"


def _by_id(doc):
    return pytest.mark.parametrize("case", doc["cases"], ids=[c["id"] for c in doc["cases"]])


def _go(value):
    """A value as Go's json.Marshal writes it: empty fields left out (so [] and absent compare equal)."""
    if isinstance(value, dict):
        return {k: _go(v) for k, v in value.items() if v not in (None, "", [], {})}
    if isinstance(value, list):
        return [_go(v) for v in value]
    return value


def _check_container(case, got):
    expected = case["expected"]
    if case.get("compare") == "fields":
        got = {k: _go(got).get(k) for k in expected}
    assert _go(got) == _go(expected), "%s (%s)" % (case["id"], case.get("test") or case.get("code"))


def _runtimes(doc, case):
    """(namespaced, cluster) runtime lists of a case: a named set, its manifest files, or inline."""
    ref = case["runtimes"]
    if isinstance(ref, str):
        ref = doc["runtime_sets"][ref]
    items = {SR: list(ref.get(SR) or []), CSR: list(ref.get(CSR) or [])}
    for name in ref.get("files") or []:
        body = kserve_vectors(name)
        items[body["kind"]].append(body)
    return items[SR], items[CSR]


class ListReader:
    """The product's reader (reader.get / reader.list) over the case's runtimes."""

    def __init__(self, namespaced, cluster):
        self.items = {SR: namespaced, CSR: cluster}

    def list(self, kind, namespace):
        return [rt for rt in self.items[kind] if kind == CSR or rt["metadata"].get("namespace", namespace) == namespace]

    def get(self, kind, namespace, name):
        return next((rt for rt in self.list(kind, namespace) if rt["metadata"]["name"] == name), None)


class ListApi:
    """What the stand-in's _resolve_runtime lists from the API server, answered from the case's runtimes."""

    def __init__(self, namespaced, cluster):
        self.reader = ListReader(namespaced, cluster)

    def get(self, path):
        match = re.fullmatch(r"/apis/serving.kserve.io/v1alpha1/(?:namespaces/([^/]+)/)?(servingruntimes|clusterservingruntimes)", path)
        assert match, path
        return {"items": self.reader.list(SR if match.group(2) == "servingruntimes" else CSR, match.group(1))}


def _standin():
    """The stand-in as the integration tests run it with strict_runtimes (no cluster: nothing is started)."""
    return KServeStandIn(None, strict_runtimes=True)


def _isvc(case, predictor=None):
    meta = dict(case.get("metadata") or {"name": "vectors", "namespace": case.get("namespace")})
    meta.setdefault("namespace", case.get("namespace"))
    return {"metadata": meta, "spec": {"predictor": predictor or case["predictor"]}}


# -- the fixtures themselves --------------------------------------------------------------------------------------------

def test_vectors_name_their_source_and_count():
    cases = MERGE["cases"] + SELECTION["cases"]
    assert len(cases) >= 30
    assert len({c["id"] for c in cases}) == len(cases)
    for doc in (MERGE, SELECTION):
        assert doc["upstream"] == {"repo": "kserve/kserve", "tag": "v0.20.0", "commit": "1fb781055dd1567164358233e1125142ca6ef1fe"}
    for case in cases:
        assert case["file"].startswith("pkg/") and case["function"] and "expected" in case, case["id"]
        assert case["test"] or (case.get("code") and case.get("why")), "%s: a case without a Go test names the code and why" % case["id"]
    ported = sum(1 for c in cases if c["test"])
    assert ported >= 30, ported
    for entry in NOT_MODELLED:
        assert set(entry) == {"source", "test", "case", "reason"} and all(entry.values()), entry


# -- merge ------------------------------------------------------------------------------------------------------------------

def _sr_isvc_merge_product(case):
    runtime = {"metadata": {"name": "runtime"}, "spec": {"containers": case["containers"]}}
    index, base = product.runtime_container(runtime, SR, name=case["target"])
    return {"index": index, "container": product.merge_runtime_container(base, case["overlay"])}


def _sr_isvc_merge_standin(case):
    runtime = {"metadata": {"name": "runtime"}, "spec": {"containers": case["containers"]}}
    container = standin_runtimes.runtime_container({"model": case["overlay"]}, runtime, {}, target=case["target"])
    return {"index": next(i for i, c in enumerate(case["containers"]) if c["name"] == case["target"]), "container": container}


def _predictor_container_standin(case):
    runtime, _kind = _standin()._resolve_runtime(ListApi(*_runtimes(MERGE, case)), case["predictor"], case["namespace"])  # pylint: disable=protected-access
    return KServeStandIn._container(case["predictor"], runtime, _isvc(case)["metadata"])  # pylint: disable=protected-access


def _merge_functions(patch, merge, placeholders, sr_isvc_merge, predictor_container, model_container):
    """A case's `function` -> how one side runs it, from that side's functions."""
    return {
        "MergeContainerWithPatch": lambda c: patch(c["base"], c["overlay"]),
        "MergeRuntimeContainers": lambda c: merge(c["base"], c["overlay"]),
        "MergeRuntimeContainers+ReplacePlaceholders": lambda c: placeholders(merge(c["base"], c["overlay"]), c["meta"]),
        "ReplacePlaceholders": lambda c: placeholders(c["container"], c["meta"], c.get("runtime")),
        "MergeServingRuntimeAndInferenceServiceSpecs": sr_isvc_merge,
        "PredictorContainer": predictor_container,
        "GetContainer": lambda c: model_container(c["model"]),
    }


# each side: the error it raises for a refusal, and how it runs each function
MERGE_SIDES = {
    "product": (ValidationError, _merge_functions(
        product.merge_container_with_patch, product.merge_runtime_container, product.replace_placeholders, _sr_isvc_merge_product,
        lambda c: product.effective_command(_isvc(c), ListReader(*_runtimes(MERGE, c))).container, product.container_of_model)),
    "standin": (standin_runtimes.Refusal, _merge_functions(
        standin_runtimes.merge_container_with_patch, standin_runtimes.merge_runtime_containers, standin_runtimes.replace_placeholders,
        _sr_isvc_merge_standin, _predictor_container_standin, standin_runtimes.go_marshal)),
}


@pytest.mark.parametrize("side", sorted(MERGE_SIDES))
@_by_id(MERGE)
def test_merge(side, case):
    refusal, functions = MERGE_SIDES[side]
    run = functions[case["function"]]
    if "error" in case["expected"]:
        with pytest.raises(refusal) as err:
            run(case)
        assert case["expected"]["error"] in str(err.value)
        return
    got = run(case)
    if case["function"] == "MergeServingRuntimeAndInferenceServiceSpecs":
        assert got["index"] == case["expected"]["index"]
        got, case = got["container"], dict(case, expected=case["expected"]["container"])
    _check_container(case, got)


# -- selection --------------------------------------------------------------------------------------------------------------

def _selection(kind):
    """The selection cases whose expected answer is of `kind` (protocol, supporting, or selected/refused)."""
    cases = [c for c in SELECTION["cases"] if set(c["expected"]) & set(kind.split("/"))]
    return pytest.mark.parametrize("case", cases, ids=[c["id"] for c in cases])


PROTOCOL = {"product": selection.model_protocol, "standin": standin_runtimes.protocol_of}
SUPPORTING = {
    "product": lambda case, reader: selection.supporting_runtimes(
        case["predictor"]["model"], reader, case["namespace"], multinode=selection.is_multinode(case["predictor"])),
    "standin": lambda case, reader: standin_runtimes.supporting_runtimes(
        case["predictor"]["model"], reader.list(SR, case["namespace"]), reader.list(CSR, None),
        multinode=case["predictor"].get("workerSpec") is not None),
}


@pytest.mark.parametrize("side", sorted(PROTOCOL))
@_selection("protocol")
def test_protocol(side, case):
    assert PROTOCOL[side](case["predictor"]["model"]) == case["expected"]["protocol"]


@pytest.mark.parametrize("side", sorted(SUPPORTING))
@_selection("supporting")
def test_supporting_runtimes(side, case):
    found = SUPPORTING[side](case, ListReader(*_runtimes(SELECTION, case)))
    assert [[kind, rt["metadata"]["name"]] for rt, kind in found] == case["expected"]["supporting"]


@_selection("selected/refused")
def test_runtime_choice_product(case):
    expected = case["expected"]
    reader = ListReader(*_runtimes(SELECTION, case))
    if "refused" in expected:
        with pytest.raises(ValidationError) as err:
            selection.select_runtime(_isvc(case), reader)
        assert expected["refused"]["error"] in str(err.value)
        assert "Fix:" in str(err.value)
        return
    runtime, kind = selection.select_runtime(_isvc(case), reader)
    assert [kind, runtime["metadata"]["name"]] == expected["selected"]


@_selection("selected/refused")
def test_runtime_choice_standin(case):
    expected = case["expected"]
    namespaced, cluster = _runtimes(SELECTION, case)
    standin = _standin()
    if "refused" in expected:
        want = expected["refused"]
        with pytest.raises(standin_runtimes.Refusal) as err:
            standin._resolve_runtime(ListApi(namespaced, cluster), case["predictor"], case["namespace"])  # pylint: disable=protected-access
        assert want["error"] in err.value.error
        status = KServeStandIn._refused_status({}, err.value, 3)  # pylint: disable=protected-access
        conditions = {c["type"]: c for c in status["conditions"]}
        if want.get("condition"):
            assert {k: conditions["PredictorReady"][k] for k in ("status", "reason", "message")} == \
                {"status": "False", "reason": want["reason"], "message": want["message"]}
            assert conditions["Ready"]["status"] == "False" and "modelStatus" not in status
        else:
            assert status["modelStatus"]["transitionStatus"] == "InvalidSpec"
            assert status["modelStatus"]["states"]["targetModelState"] == "FailedToLoad"
            assert status["modelStatus"]["lastFailureInfo"] == {"reason": want["reason"], "message": want["message"]}
            assert {c["status"] for c in conditions.values()} == {"Unknown"}
        assert status["observedGeneration"] == 3
        return
    runtime, kind = standin._resolve_runtime(ListApi(namespaced, cluster), case["predictor"], case["namespace"])  # pylint: disable=protected-access
    assert [kind, runtime["metadata"]["name"]] == expected["selected"]


# -- what the product adds to KServe's refusal ------------------------------------------------------------------------------

def test_unsupported_format_names_the_field_and_the_runtime_formats():
    case = next(c for c in SELECTION["cases"] if c["id"] == "named-runtime-unsupported-format")
    with pytest.raises(ValidationError) as err:
        selection.select_runtime(_isvc(case), ListReader(*_runtimes(SELECTION, case)))
    assert err.value.field == "spec.predictor.model.modelFormat"
    msg = str(err.value)
    assert msg.startswith("spec.predictor.model.modelFormat: InferenceService default/vectors: specified runtime tf-serving-unsupported")
    assert "supports the model formats tensorflow:1" in msg and "spec.predictor.model.runtime" in msg


def test_worker_spec_refusal_names_the_predictor_field():
    case = next(c for c in SELECTION["cases"] if c["id"] == "named-runtime-without-worker-spec-for-multinode-predictor")
    with pytest.raises(ValidationError) as err:
        selection.select_runtime(_isvc(case), ListReader(*_runtimes(SELECTION, case)))
    assert err.value.field == "spec.predictor.workerSpec" and "remove spec.predictor.workerSpec" in str(err.value)


def test_standin_without_strict_runtimes_runs_a_missing_runtime_but_refuses_a_mismatch():
    """The default stand-in serves manifests naming a runtime of a real cluster; a runtime that exists and that KServe
    refuses is refused whatever the mode."""
    standin = KServeStandIn(None)
    api = ListApi([], [])
    runtime, kind = standin._resolve_runtime(api, {"model": {"modelFormat": {"name": "vLLM"}, "runtime": "aml-vllm"}}, "m")  # pylint: disable=protected-access
    assert kind is None and runtime["metadata"]["name"] == "aml-vllm"
    case = next(c for c in SELECTION["cases"] if c["id"] == "named-runtime-unsupported-format")
    with pytest.raises(standin_runtimes.Refusal, match="does not support specified framework/version"):
        standin._resolve_runtime(ListApi(*_runtimes(SELECTION, case)), case["predictor"], case["namespace"])  # pylint: disable=protected-access
