"""ops/fleet.py (issue 53): the per-service records from the collection's own readers, the selection, the LISTs it makes
and the fallbacks when RBAC refuses one. The API server is a dict of paths here (these are the error paths: a refused
cluster-wide LIST, a forbidden namespace, an unserved kind); tests/integration/test_fleet.py runs the same on the real one."""
from __future__ import annotations

import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet, fleet_rollback

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
FLAG = ["--speculative-config", json.dumps(NGRAM)]
ISVC_API = "/apis/serving.kserve.io/v1beta1"
RT_API = "/apis/serving.kserve.io/v1alpha1"
LLM_API = "/apis/serving.kserve.io/v1alpha2"


class Refused(Exception):
    def __init__(self, status):
        super().__init__("refused")
        self.status = status
        self.reason = "Forbidden" if status == 403 else "Not Found"


class Server:
    """GET by path: the items, or a status the path is refused with; every other path is an empty list."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, _api_client, method, path, query=None):
        assert method == "GET"
        self.calls.append((path, dict(query or {})))
        answer = self.answers.get(path, [])
        if isinstance(answer, int):
            raise Refused(answer)
        return {"items": answer}


def _isvc(ns, name, args=None, command=None, runtime=None, env=None, containers=None):
    model = {"modelFormat": {"name": "vLLM"}, "storageUri": "pvc://m/x"}
    for key, value in (("args", args), ("command", command), ("runtime", runtime), ("env", env)):
        if value:
            model[key] = value
    predictor = {"containers": containers} if containers else {"model": model}
    return {"metadata": {"namespace": ns, "name": name, "generation": 1}, "spec": {"predictor": predictor}}


def _runtime(name, ns=None, args=None, command=None):
    container = {"name": "kserve-container", "image": "vllm", "args": ["--port=8080"] + (args or [])}
    if command:
        container["command"] = command
    meta = {"name": name}
    if ns:
        meta["namespace"] = ns
    return {"metadata": meta, "spec": {"supportedModelFormats": [{"name": "vLLM", "autoSelect": True}], "containers": [container]}}


def _run(answers, **params):
    server = Server(answers)
    client = fleet.CountingClient(None, request=server)
    return fleet.discover(client, params), server


def test_records_say_where_the_flag_comes_from_and_the_runtimes_are_listed_once():
    ns = "a"
    answers = {
        "%s/namespaces/a/inferenceservices" % ISVC_API: [
            _isvc(ns, "plain", runtime="plain-csr"),
            _isvc(ns, "auto"),
            _isvc(ns, "own-args", runtime="plain-csr", args=FLAG),
            _isvc(ns, "from-csr", runtime="spec-csr"),
            _isvc(ns, "from-sr", runtime="spec-sr"),
            _isvc(ns, "env", runtime="plain-csr", command=["bash", "-c", "exec vllm serve /mnt/models $EXTRA"],
                  env=[{"name": "EXTRA", "value": "--speculative-config '%s'" % json.dumps(NGRAM)}]),
            _isvc(ns, "ignored", runtime="script-csr", args=FLAG),
            _isvc(ns, "custom", containers=[{"name": "main", "image": "v", "args": ["serve", "/m"] + FLAG}]),
        ],
        "%s/namespaces/a/servingruntimes" % RT_API: [_runtime("spec-sr", ns, args=FLAG)],
        "%s/clusterservingruntimes" % RT_API: [
            _runtime("plain-csr"), _runtime("spec-csr", args=FLAG),
            _runtime("script-csr", command=["bash", "-c", "exec vllm serve /mnt/models"])],
    }
    result, server = _run(answers, namespaces=["a"], kinds=["InferenceService"])
    by_name = {r["name"]: r for r in result["services"]}
    assert {n: r["speculative"] for n, r in by_name.items()} == {
        "plain": False, "auto": True, "own-args": True, "from-csr": True, "from-sr": True, "env": True, "ignored": False, "custom": True}
    assert by_name["own-args"]["sources"] == ["inference_service"]
    assert by_name["own-args"]["speculative_config"] == NGRAM
    assert by_name["from-csr"]["sources"] == ["cluster_serving_runtime"]
    assert by_name["from-csr"]["runtime"] == {"kind": "ClusterServingRuntime", "name": "spec-csr"}
    assert by_name["from-sr"]["sources"] == ["serving_runtime"]
    assert [w["field"] for w in by_name["env"]["where"]] == ["env"]
    assert by_name["ignored"]["where"] == [{"source": "inference_service", "field": "args", "flag": "--speculative-config",
                                           "form": "argv", "reaches_engine": False}]
    # auto-selected by KServe's rule: the namespace's runtime before the cluster's
    assert by_name["auto"]["runtime"] == {"kind": "ServingRuntime", "name": "spec-sr"} and by_name["auto"]["sources"] == ["serving_runtime"]
    # one LIST of the services, one of the namespace's ServingRuntimes, one of the ClusterServingRuntimes: 3 for 8 services
    assert sorted(p for p, _q in server.calls) == sorted(answers)
    totals = result["totals"]
    assert totals["api_requests"] == 3 and totals["services"] == 8 and totals["with_flag"] == 6 and totals["without_flag"] == 2
    assert totals["api_requests_per_service"] == round(3 / 8, 3)


def test_refused_cluster_wide_list_falls_back_per_namespace_and_reports_the_forbidden_one():
    answers = {
        "%s/inferenceservices" % ISVC_API: 403,
        "/api/v1/namespaces": [{"metadata": {"name": n}} for n in ("a", "b", "c")],
        "%s/namespaces/a/inferenceservices" % ISVC_API: [_isvc("a", "x", args=FLAG)],
        "%s/namespaces/b/inferenceservices" % ISVC_API: 403,
        "%s/namespaces/c/inferenceservices" % ISVC_API: [_isvc("c", "y")],
        "%s/llminferenceservices" % LLM_API: 404,
    }
    result, server = _run(answers, all_namespaces=True, label_selector="team=x")
    assert [(r["namespace"], r["name"], r["speculative"]) for r in result["services"]] == [("a", "x", True), ("c", "y", False)]
    assert result["totals"]["forbidden_namespaces"] == ["b"]
    assert result["forbidden"][0]["status"] == 403 and "inferenceservices in b" in result["forbidden"][0]["message"]
    assert result["totals"]["kinds_not_served"] == ["LLMInferenceService"]
    assert ("%s/inferenceservices" % ISVC_API, {"labelSelector": "team=x"}) in server.calls
    assert ("%s/namespaces/c/inferenceservices" % ISVC_API, {"labelSelector": "team=x"}) in server.calls
    # the namespaces are listed once, not per kind; the unserved kind stops at its cluster-wide 404
    assert [p for p, _q in server.calls].count("/api/v1/namespaces") == 1
    assert result["totals"]["api_requests"] == len(server.calls) == 1 + 1 + 3 + 3 + 1  # ServingRuntimes of a and c, CSRs; LLMISVCs


def test_named_services_one_list_per_namespace_with_a_field_selector_for_one_name():
    answers = {"%s/namespaces/a/inferenceservices" % ISVC_API: [_isvc("a", "x")]}
    result, server = _run(answers, names=["a/x", {"namespace": "b", "name": "gone"}], kinds=["InferenceService"])
    assert ("%s/namespaces/a/inferenceservices" % ISVC_API, {"fieldSelector": "metadata.name=x"}) in server.calls
    missing = [r for r in result["services"] if not r["found"]]
    assert [(r["namespace"], r["name"]) for r in missing] == [("b", "gone")] and "not found" in missing[0]["error"]
    assert result["totals"]["not_found"] == 1 and result["totals"]["services"] == 1


def test_llmisvc_flag_from_a_preset_in_the_system_namespace():
    obj = {"metadata": {"namespace": "a", "name": "llm"}, "spec": {"model": {"uri": "hf://x"}, "template": {"containers": [
        {"name": "main", "image": "v"}]}}}
    preset = {"metadata": {"namespace": "kserve", "name": "kserve-config-llm-template"},
              "spec": {"template": {"containers": [{"name": "main", "image": "v", "args": ["serve"] + FLAG}]}}}
    answers = {"%s/namespaces/a/llminferenceservices" % LLM_API: [obj],
               "%s/namespaces/kserve/llminferenceserviceconfigs" % LLM_API: [preset]}
    result, server = _run(answers, namespaces=["a"], kinds=["LLMInferenceService"])
    (rec,) = result["services"]
    assert rec["speculative"] and rec["sources"] == ["LLMInferenceServiceConfig/kserve-config-llm-template"]
    assert rec["speculative_config"] == NGRAM
    assert len(server.calls) == 3  # the services of a, the presets of a, the presets of kserve


@pytest.mark.parametrize("params, field", [
    ({}, "names/namespaces/all_namespaces"),
    ({"names": ["justaname"]}, "names"),
    ({"all_namespaces": True, "namespaces": ["a"]}, "namespaces"),
    ({"namespaces": ["a"], "kinds": ["Pod"]}, "kinds"),
])
def test_check_params_refuses(params, field):
    with pytest.raises(ValidationError) as info:
        fleet.check_params(params)
    assert info.value.field == field and info.value.hint


# --------------------------------------------------------------------------------------------------
# The rollback role's decision over a discovery (ops/fleet_rollback.py, filters fleet_rollback_plan/_report)
# --------------------------------------------------------------------------------------------------

def _fleet_discovery():
    """A discovery of namespaces a and b (b refuses its LIST), two named services (one missing in a, one in b), a service
    whose runtime is not found: what the rollback role gets from fleet_speculative_info."""
    answers = {
        "%s/namespaces/a/inferenceservices" % ISVC_API: [
            _isvc("a", "flag-own", args=FLAG), _isvc("a", "plain", runtime="plain-sr"),
            _isvc("a", "flag-sr", runtime="spec-sr"), _isvc("a", "lost-runtime", runtime="gone")],
        "%s/namespaces/a/servingruntimes" % RT_API: [_runtime("plain-sr", "a"), _runtime("spec-sr", "a", args=FLAG)],
        "%s/namespaces/b/inferenceservices" % ISVC_API: 403,
    }
    result, _server = _run(answers, namespaces=["a", "b"], label_selector="team=x", names=["a/missing", "b/kept"],
                           kinds=["InferenceService"])
    return result


def test_rollback_plan_acts_on_the_flagged_then_the_undecided_and_reports_the_rest_without_a_write():
    discovery = _fleet_discovery()
    by_name = {(r["namespace"], r["name"]): r for r in discovery["services"]}
    assert by_name[("a", "lost-runtime")]["undecided"] and "gone" in by_name[("a", "lost-runtime")]["undecided"]
    assert by_name[("a", "plain")]["undecided"] is None and by_name[("a", "flag-sr")]["undecided"] is None
    plan = fleet_rollback.plan(discovery)
    # flagged first (sorted), then what the discovery could not decide: their per-service run reports them as for one service
    assert [(t["namespace"], t["name"]) for t in plan["targets"]] == [
        ("a", "flag-own"), ("a", "flag-sr"), ("a", "lost-runtime"), ("a", "missing"), ("b", "kept")]
    why = {t["name"]: t["why"] for t in plan["targets"]}
    assert why["flag-sr"] == "a speculative flag reaches vLLM from serving_runtime"
    assert why["missing"] == "not found (as InferenceService)"
    assert why["kept"] == "not readable: the namespace refused the LIST"
    assert plan["without_flag"] == ["a/plain"]
    assert [f["namespace"] for f in plan["forbidden"]] == ["b"]

    results = [{"isvc": "a/flag-own", "changed": True}, {"isvc": "a/flag-sr", "changed": True},
               {"isvc": "a/lost-runtime", "changed": False}]
    report = fleet_rollback.report(plan, results)
    done = {s["service"]: s["done"] for s in report["services"]}
    assert done == {"a/flag-own": "rolled_back", "a/flag-sr": "rolled_back", "a/lost-runtime": "unchanged",
                    "a/missing": "not_run", "a/plain": "skipped_without_flag", "b/kept": "not_run"}
    totals = report["totals"]
    assert (totals["selected"], totals["with_flag"], totals["rolled_back"], totals["unchanged"], totals["skipped_without_flag"],
            totals["undecided"]) == (6, 2, 2, 1, 1, 3)
    assert totals["forbidden_namespaces"] == ["b"]
    # the selector's LISTs of a and b (refused), the named ones' of a and b (a label selector does not hold them), a's
    # ServingRuntimes, the ClusterServingRuntimes (where lost-runtime's "gone" is looked for last)
    assert totals["api_requests_to_find"] == discovery["totals"]["api_requests"] == 6


@pytest.mark.parametrize("mode, remove_draft, reason", [
    ("git", False, "rollback_mode git"),
    ("emergency", False, "rollback_mode emergency"),
    ("live", True, "rollback_remove_draft_artifacts"),
])
def test_rollback_plan_acts_on_every_service_where_the_live_flag_does_not_decide(mode, remove_draft, reason):
    plan = fleet_rollback.plan(_fleet_discovery(), mode=mode, remove_draft=remove_draft)
    assert [(t["namespace"], t["name"]) for t in plan["targets"]] == [
        ("a", "flag-own"), ("a", "flag-sr"), ("a", "lost-runtime"), ("a", "missing"), ("a", "plain"), ("b", "kept")]
    assert all(t["why"].startswith(reason) for t in plan["targets"]) and plan["without_flag"] == []


def test_rollback_plan_of_a_skipped_discovery_selects_nothing_and_a_review_commit_is_no_rollback():
    assert fleet_rollback.plan({"skipped": True, "changed": False})["targets"] == []
    plan = fleet_rollback.plan(_fleet_discovery(), mode="git")
    report = fleet_rollback.report(plan, [{"isvc": "a/flag-own", "changed": True, "review_branch": "rollback-1", "commit": "abc"}])
    assert report["totals"]["rolled_back"] == 0 and report["totals"]["committed_for_review"] == 1


def test_llmisvc_with_unreadable_presets_is_undecided():
    obj = {"metadata": {"namespace": "a", "name": "llm"}, "spec": {"model": {"uri": "hf://x"}, "template": {"containers": [
        {"name": "main", "image": "v"}]}}}
    answers = {"%s/namespaces/a/llminferenceservices" % LLM_API: [obj],
               "%s/namespaces/a/llminferenceserviceconfigs" % LLM_API: 403,
               "%s/namespaces/kserve/llminferenceserviceconfigs" % LLM_API: 403}
    result, _server = _run(answers, namespaces=["a"], kinds=["LLMInferenceService"])
    (rec,) = result["services"]
    assert rec["speculative"] is False and "not readable (403)" in rec["undecided"]
    assert [t["name"] for t in fleet_rollback.plan(result)["targets"]] == ["llm"]


def test_llmisvc_well_known_presets_follow_the_controllers_prefix():
    obj = {"metadata": {"namespace": "a", "name": "llm"}, "spec": {"model": {"uri": "hf://x"}, "template": {"containers": [
        {"name": "main", "image": "v"}]}}}
    preset = {"metadata": {"namespace": "kserve", "name": "acme-config-llm-template"},
              "spec": {"template": {"containers": [{"name": "main", "image": "v", "args": ["serve"] + FLAG}]}}}
    answers = {"%s/namespaces/a/llminferenceservices" % LLM_API: [obj],
               "%s/namespaces/kserve/llminferenceserviceconfigs" % LLM_API: [preset]}
    default, _server = _run(answers, namespaces=["a"], kinds=["LLMInferenceService"])
    assert default["services"][0]["speculative"] is False  # kserve-config-llm-template: not this controller's preset
    prefixed, _server = _run(answers, namespaces=["a"], kinds=["LLMInferenceService"], llmisvc_config_prefix="acme-")
    assert prefixed["services"][0]["sources"] == ["LLMInferenceServiceConfig/acme-config-llm-template"]
