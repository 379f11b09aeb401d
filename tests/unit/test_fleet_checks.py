"""ops/fleet_checks.py (issue 53): which services verify and the watchdog check over a fleet, from one
fleet_speculative_info discovery, and the per-service report with the run's totals. The discovery runs here over a dict
of API paths (tests/unit/test_fleet.py's way); tests/integration/test_verify.py runs verify.yml over a selector for real."""
from __future__ import annotations

import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet, fleet_checks

FLAG = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})]
ISVC_API = "/apis/serving.kserve.io/v1beta1"
RT_API = "/apis/serving.kserve.io/v1alpha1"


class Refused(Exception):
    def __init__(self, status):
        super().__init__("refused")
        self.status = status
        self.reason = "Forbidden"


def _server(answers):
    def request(_api_client, method, path, query=None):  # pylint: disable=unused-argument
        assert method == "GET"
        answer = answers.get(path, [])
        if isinstance(answer, int):
            raise Refused(answer)
        return {"items": answer}
    return request


def _isvc(ns, name, args=None, runtime="plain-sr"):
    model = {"modelFormat": {"name": "vLLM"}, "storageUri": "pvc://m/x", "runtime": runtime}
    if args:
        model["args"] = args
    return {"metadata": {"namespace": ns, "name": name, "generation": 1}, "spec": {"predictor": {"model": model}}}


def _runtime(name, ns, args=None):
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"supportedModelFormats": [{"name": "vLLM", "autoSelect": True}],
                     "containers": [{"name": "kserve-container", "image": "vllm", "args": ["--port=8080"] + (args or [])}]}}


@pytest.fixture(name="discovery")
def discovery_fixture():
    """Namespaces a and b (b refuses its LIST) by label, and two named services: one missing in a, one in b; in a two
    services with the flag (their own args, their ServingRuntime), one without, one whose runtime is gone, and one whose
    runtime is gone but whose own args carry the flag."""
    answers = {
        "%s/namespaces/a/inferenceservices" % ISVC_API: [
            _isvc("a", "own", args=FLAG), _isvc("a", "plain"), _isvc("a", "from-sr", runtime="spec-sr"),
            _isvc("a", "lost-runtime", runtime="gone"), _isvc("a", "own-lost", args=FLAG, runtime="gone")],
        "%s/namespaces/a/servingruntimes" % RT_API: [_runtime("plain-sr", "a"), _runtime("spec-sr", "a", args=FLAG)],
        "%s/namespaces/b/inferenceservices" % ISVC_API: 403,
    }
    client = fleet.CountingClient(None, request=_server(answers))
    return fleet.discover(client, {"namespaces": ["a", "b"], "label_selector": "team=x", "names": ["a/missing", "b/kept"],
                                   "kinds": ["InferenceService"]})


def _keys(targets):
    return ["%s/%s" % (t["namespace"], t["name"]) for t in targets]


def test_verify_checks_the_flagged_and_the_named_it_could_not_read_and_reports_the_rest(discovery):
    plan = fleet_checks.plan(discovery, check="verify")
    # flagged first; then the named services not found or unreadable, whose own verify says why
    assert _keys(plan["targets"]) == ["a/from-sr", "a/own", "a/own-lost", "a/missing", "b/kept"]
    assert plan["targets"][3]["why"] == "not found (as InferenceService)"
    assert [n["service"] for n in plan["not_checked"]] == ["a/lost-runtime"]
    assert "gone" in plan["not_checked"][0]["why"]
    assert plan["without_flag"] == ["a/plain"]

    engine = {"speculative_config": {"method": "ngram", "model": None, "num_spec_tokens": 3}, "pods": [{"name": "p1"}, {"name": "p2"}]}
    results = [{"service": "a/from-sr", "ok": True, "result": {"engine": engine, "metrics": {"msg": "acceptance rate 0.61"}}},
               {"service": "a/own", "ok": False, "task": "Check the engine-config line on every predictor pod",
                "msg": "pod p3 runs speculative_config=None"},
               {"service": "a/missing", "ok": False, "task": "Check that the InferenceService exists", "msg": "not found"}]
    report = fleet_checks.report(plan, results)
    done = {s["service"]: s["done"] for s in report["services"]}
    assert done == {"a/from-sr": "verified", "a/own": "failed", "a/missing": "failed", "b/kept": "not_run", "a/own-lost": "not_run",
                    "a/lost-runtime": "not_checked", "a/plain": "skipped_without_flag"}
    totals = report["totals"]
    assert (totals["selected"], totals["with_flag"], totals["verified_ok"], totals["failed"], totals["not_run"],
            totals["without_flag"], totals["not_checked"]) == (7, 3, 1, 2, 2, 1, 1)
    assert totals["forbidden_namespaces"] == ["b"]
    # the selector's LISTs of a and b, the named ones' of a and b, a's ServingRuntimes, the ClusterServingRuntimes
    assert totals["api_requests_to_find"] == discovery["totals"]["api_requests"] == 6
    lines = report["lines"]
    assert lines[0] == ("totals: 7 selected, 3 with a flag, 1 verified ok, 2 failed, 1 without a flag, 1 not decided, "
                        "1 forbidden namespace(s): b, 6 API request(s) to find them")
    assert ("a/from-sr: verified - engine on 2 pod(s): method=ngram model=None num_spec_tokens=3; acceptance: acceptance rate 0.61"
            " [flag from serving_runtime]") in lines
    assert ("a/own: FAILED at 'Check the engine-config line on every predictor pod': pod p3 runs speculative_config=None"
            " [flag from inference_service]") in lines
    assert "a/missing: FAILED at 'Check that the InferenceService exists': not found" in lines
    assert "a/plain: without speculative decoding, not verified" in lines
    assert any(line.startswith("a/lost-runtime: not verified: the discovery could not decide whether a speculative flag reaches "
                               "vLLM: spec.predictor.model.runtime") for line in lines), lines
    assert lines[-1].startswith("b: not read, its services were not verified (list inferenceservices in b:")


def test_an_llmisvc_line_says_its_decode_pool_engine_and_each_decode_pods_acceptance():
    plan = {"check": "verify", "targets": [{"namespace": "a", "name": "llm", "why": "a speculative flag reaches vLLM from resource"}],
            "records": {"a/llm": {"kind": "LLMInferenceService", "found": True, "speculative": True, "sources": ["resource"]}}}
    spec = {"method": "eagle3", "model": "/mnt/models/draft", "num_spec_tokens": 3}
    result = {"kind": "LLMInferenceService", "engine": {}, "metrics": {"llm-b": {"msg": "rate 0.5"}, "llm-a": {"msg": "rate 0.6"}},
              "pools": {"decode": {"speculative_config": spec, "pods": [{"name": "llm-a"}, {"name": "llm-b"}]},
                        "prefill": {"speculative_config": None, "pods": [{"name": "llm-p"}]}}}
    report = fleet_checks.report(plan, [{"service": "a/llm", "ok": True, "result": result}])
    assert report["lines"][1] == ("a/llm: verified - engine on 2 pod(s): method=eagle3 model=/mnt/models/draft num_spec_tokens=3; "
                                  "acceptance: llm-a: rate 0.6; llm-b: rate 0.5 [flag from resource]")


def test_watch_measures_only_the_services_whose_flag_reaches_vllm(discovery):
    plan = fleet_checks.plan(discovery, check="watch")
    # a flag in the service's own args reaches vLLM whatever its runtime adds: watched although the runtime is gone
    assert _keys(plan["targets"]) == ["a/from-sr", "a/own", "a/own-lost"]
    assert [n["service"] for n in plan["not_checked"]] == ["a/lost-runtime", "a/missing", "b/kept"]
    assert [n["why"] for n in plan["not_checked"]][1:] == ["not found (as InferenceService)", "not readable: the namespace refused the LIST"]
    results = [{"service": "a/from-sr", "state": "healthy", "action": "none", "msg": "healthy: 3 windows passed"},
               {"service": "a/own", "state": "collapsed", "action": "roll_back", "msg": "collapsed: 2 failed windows"}]
    report = fleet_checks.report(plan, results, rolled_back=["a/own"])
    totals = report["totals"]
    assert (totals["watched"], totals["healthy"], totals["collapsed"], totals["rolled_back"], totals["not_checked"],
            totals["not_run"]) == (2, 1, 1, 1, 3, 1)
    assert report["lines"][0].startswith("totals: 7 selected, 3 with a flag, 2 watched (1 healthy, 0 degraded, 1 collapsed, "
                                         "0 no_traffic, 0 unknown), 1 rolled back, 1 without a flag, 3 not found or not decided")
    assert "a/own: collapsed - collapsed: 2 failed windows [flag from inference_service]" in report["lines"]


def test_a_skipped_discovery_selects_nothing_and_an_unknown_check_is_refused():
    plan = fleet_checks.plan({"skipped": True, "changed": False})
    assert plan["targets"] == [] and fleet_checks.report(plan, [])["totals"]["selected"] == 0
    with pytest.raises(ValidationError) as info:
        fleet_checks.plan({}, check="rollback")
    assert info.value.field == "check" and "verify or watch" in info.value.hint
