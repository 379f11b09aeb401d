"""The routing plan (bench/routing_plan.py): no class, one class, all classes gain; the HTTPRoute render checked against
Gateway API v1.6.1's CRD (OpenAPI schema and CEL rules), the LLMInferenceService router render against KServe's."""
import copy
import importlib.util
import os

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import gateway_api_rules
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import crd_rules
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from tests.testbed import crds
from tests.testbed.controlplane import _load_crd
from tests.testbed.gateway_crds import crd_dir as gateway_crd_dir
from tests.testbed.llmisvc_standin import schema_errors

SPEC = {"name": "llama-eagle3-predictor", "port": 80}
BASE = {"name": "llama-baseline-predictor", "port": 80}
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))


def _classes(**decisions):
    return {"classes": [{"class": name, "decision": decision, "outcome": "keep" if decision == "keep" else "no_gain",
                         "gain_confidence": 0.99 if decision == "keep" else 0.6, "speedup": 1.8 if decision == "keep" else 1.0,
                         "reasons": ["r"]} for name, decision in sorted(decisions.items())]}


@pytest.fixture(scope="module")
def httproute_schema():
    body = _load_crd(os.path.join(gateway_crd_dir(), "v1.6.1-httproutes.yaml"))
    return next(v for v in body["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


def _valid(manifest, schema):
    import jsonschema  # pylint: disable=import-outside-toplevel
    errors = sorted(e.message for e in jsonschema.Draft7Validator(schema).iter_errors(manifest))
    assert errors == []
    return routing_plan.check_httproute(manifest)


def _backend_of(rule):
    [ref] = rule["backendRefs"]
    return ref["name"]


def test_no_class_everything_to_the_baseline(httproute_schema):
    plan = routing_plan.build_plan(None, SPEC, BASE)
    assert plan["classes"] == [] and plan["speculative_classes"] == [] and plan["default_pool"] == "baseline"
    route = routing_plan.httproute(plan, "llama-classes", "models", parent_refs=[{"name": "inference-gateway"}])
    assert [r["name"] for r in route["spec"]["rules"]] == ["default"]
    assert _backend_of(route["spec"]["rules"][0]) == BASE["name"]
    assert _valid(route, httproute_schema)["evaluated"] > 0


def test_one_class_gains_the_rest_and_unclassified_stay(httproute_schema):
    plan = routing_plan.build_plan(_classes(code="keep", chat="roll_back"), SPEC, BASE, model_aliases={"code": "llama-code"})
    assert plan["speculative_classes"] == ["code"]
    assert {e["class"]: e["pool"] for e in plan["classes"]} == {"chat": "baseline", "code": "speculative"}
    route = routing_plan.httproute(plan, "llama-classes", "models", parent_refs=[{"name": "inference-gateway", "namespace": "gw"}])
    rules = {r["name"]: r for r in route["spec"]["rules"]}
    assert list(rules) == ["class-chat", "class-code", "default"]
    assert _backend_of(rules["class-code"]) == SPEC["name"] and _backend_of(rules["class-chat"]) == BASE["name"]
    assert _backend_of(rules["default"]) == BASE["name"] and rules["default"]["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rules["class-code"]["matches"][0]["headers"] == [{"type": "Exact", "name": "x-request-class", "value": "code"}]
    assert rules["class-code"]["matches"][1]["headers"] == [{"type": "Exact", "name": "X-Gateway-Model-Name", "value": "llama-code"}]
    assert route["metadata"]["annotations"]["spec-decoding.alauda.io/routing-plan"] == \
        '{"classes":{"chat":"baseline","code":"speculative"},"default":"baseline"}'
    _valid(route, httproute_schema)


def test_all_classes_gain_default_still_baseline(httproute_schema):
    plan = routing_plan.build_plan(_classes(code="keep", summarize="keep"), SPEC, dict(BASE, namespace="other"))
    assert plan["speculative_classes"] == ["code", "summarize"]
    route = routing_plan.httproute(plan, "r", parent_refs=[{"name": "gw"}])
    assert [_backend_of(r) for r in route["spec"]["rules"]] == [SPEC["name"], SPEC["name"], BASE["name"]]
    assert route["spec"]["rules"][-1]["backendRefs"][0]["namespace"] == "other"
    _valid(route, httproute_schema)


def test_llmisvc_router_render_passes_kserve_crd():
    plan = routing_plan.build_plan(_classes(code="keep", chat="roll_back"), SPEC, BASE)
    manifest = {"apiVersion": "serving.kserve.io/" + llmisvc_model.DEFAULT_API_VERSION, "kind": "LLMInferenceService",
                "metadata": {"name": "llama", "namespace": "models"},
                "spec": {"model": {"uri": "hf://org/llama"}, "router": {"route": routing_plan.llmisvc_route(plan, [{"name": "gw"}])}}}
    assert manifest["spec"]["router"]["route"]["http"]["spec"]["rules"] == routing_plan.route_rules(plan)
    assert schema_errors(manifest, crds.resolve()) == []
    assert crd_rules.check(manifest)["evaluated"] > 0  # the route rules' CEL (128 matches at most, ...) ran
    bad = copy.deepcopy(manifest)
    bad["spec"]["router"]["route"]["http"]["spec"]["rules"][0]["backendRefs"][0]["weight"] = "one"
    assert schema_errors(bad, crds.resolve()) != []


def test_cel_rules_really_refuse(httproute_schema):
    plan = routing_plan.build_plan(_classes(code="keep"), SPEC, BASE)
    route = routing_plan.httproute(plan, "r")
    bad = copy.deepcopy(route)
    del bad["spec"]["rules"][0]["backendRefs"][0]["port"]  # a Service backend without a port
    with pytest.raises(ValidationError) as err:
        routing_plan.check_httproute(bad)
    assert "Must have port for Service reference" in str(err.value) and err.value.field.startswith("spec.rules[0].backendRefs[0]")
    # the same verdict from the CRD file itself as from the shipped data
    with pytest.raises(ValidationError, match="Must have port"):
        routing_plan.check_httproute(bad, os.path.join(gateway_crd_dir(), "v1.6.1-httproutes.yaml"))


@pytest.mark.parametrize("kwargs, field", [
    ({"speculative": {"name": "Bad_Name", "port": 80}}, "speculative_service.name"),
    ({"baseline": {"name": "b", "port": 0}}, "baseline_service.port"),
    ({"class_header": "x request"}, "class_header"),
    ({"model_aliases": {"math": "m"}}, "model_aliases"),
    ({"model_aliases": {"code": ""}}, "model_aliases"),
])
def test_refusals_name_the_field(kwargs, field):
    args = dict(classes=_classes(code="keep"), speculative=SPEC, baseline=BASE)
    args.update(kwargs)
    with pytest.raises(ValidationError) as err:
        routing_plan.build_plan(**args)
    assert err.value.field == field and err.value.hint


def test_too_many_classes_for_one_route():
    with pytest.raises(ValidationError, match="at most 15") as err:
        routing_plan.build_plan(_classes(**{"c%d" % i: "keep" for i in range(16)}), SPEC, BASE)
    assert err.value.field == "classes"


def test_shipped_rules_are_the_crd_files():
    spec = importlib.util.spec_from_file_location("gateway_api_rules_hack", os.path.join(REPO, "hack", "gateway_api_rules.py"))
    hack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hack)
    release, digest, kept = hack.read(os.path.join(gateway_crd_dir(), "v1.6.1-httproutes.yaml"))
    with open(os.path.join(REPO, "plugins", "module_utils", "bench", "gateway_api_rules.py"), encoding="utf-8") as handle:
        assert handle.read() == hack.render(release, digest, kept), "regenerate with hack/gateway_api_rules.py FILE --write"
    assert gateway_api_rules.RELEASE == "v1.6.1"
