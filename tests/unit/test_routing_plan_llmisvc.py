"""The routing plan in LLMInferenceService's own router (issue #52): the rules in spec.router.route.http.spec, checked
against KServe's CRD (schema and CEL, read from the CRD file by the test bed's checker), what KServe v0.20's controller
makes of them (stripModelBasedRoutingRules, ported with KServe's own test cases), the GitOps write into the deploy's
manifest, the apply object, the baseline twin without the plan's rules, and the benchmark role's write=gitops."""
import copy
import json

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.routing_gitops_file import routing_gitops_file
from ansible_collections.alauda.spec_decoding.plugins.filter.routing_plan import routing_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_gitops
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import router
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import twin
from tests.ansible_run import run_playbook
from tests.testbed import crds
from tests.testbed.llmisvc_standin import schema_errors

SPEC = {"name": "llama-ngram-kserve-workload-svc", "port": 8000}
BASE = {"name": "llama-ngram-baseline-kserve-workload-svc", "port": 8000}
REPORT = {"schema": "alauda.spec_decoding/benchmark-report/v1", "decision": {"decision": "keep"},
          "classes": {"classes": [{"class": "chat", "decision": "roll_back"}, {"class": "code", "decision": "keep"}]}}
COMMAND = ["vllm", "serve", "/mnt/models", "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}']


def _deployed(router_spec=None):
    """An LLMInferenceService as the deploy renders it (the shape of kserve/llmisvc/render.py's)."""
    spec = {"model": {"uri": "pvc://models/llama", "name": "llama"}, "replicas": 1,
            "template": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.32.0", "command": COMMAND}]},
            "router": router_spec if router_spec is not None else {"route": {}, "gateway": {}}}
    return {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
            "metadata": {"name": "llama-ngram", "namespace": "models", "labels": {"app.kubernetes.io/managed-by": "alauda.spec_decoding"}},
            "spec": spec}


def _rules(obj):
    return obj["spec"]["router"]["route"]["http"]["spec"]["rules"]


def test_the_plan_in_the_llmisvc_router_passes_kserves_crd():
    obj = routing_plan(REPORT, SPEC, BASE, render="llmisvc", llmisvc_name="llama-ngram", namespace="models",
                       parent_refs=[{"name": "inference-gateway", "namespace": "gateways"}])
    assert obj["apiVersion"] == "serving.kserve.io/v1alpha2" and obj["metadata"]["name"] == "llama-ngram"
    assert [(r["name"], r["backendRefs"][0]["name"]) for r in _rules(obj)] == [
        ("class-chat", BASE["name"]), ("class-code", SPEC["name"]), ("default", BASE["name"])]
    assert json.loads(obj["metadata"]["annotations"][router.PLAN_ANNOTATION]) == {
        "classes": {"chat": "baseline", "code": "speculative"}, "default": "baseline"}
    full = router.with_route(_deployed(), obj["spec"]["router"]["route"])
    assert full["spec"]["router"]["gateway"] == {}  # the router's other fields stay
    assert schema_errors(full, crds.resolve()) == []
    bad = copy.deepcopy(full)
    _rules(bad)[0]["matches"][0]["headers"][0]["type"] = "Fuzzy"
    assert schema_errors(bad, crds.resolve()) != []
    # KServe's controller writes <name>-kserve-route from it; the rules without model aliases reach it unchanged
    assert router.route_name("llama-ngram") == "llama-ngram-kserve-route" and router.route_name("x" * 51) is None
    assert router.controller_rules(_rules(obj)) == _rules(obj)
    v1 = routing_plan(REPORT, SPEC, BASE, render="llmisvc", llmisvc_name="llama-ngram", namespace="models", api_version="v1alpha1")
    assert v1["apiVersion"] == "serving.kserve.io/v1alpha1"
    with pytest.raises(AnsibleFilterError, match="llmisvc_name: names no LLMInferenceService"):
        routing_plan(REPORT, SPEC, BASE, render="llmisvc")


# KServe v0.20.0 pkg/controller/v1alpha2/llmisvc/config_merge_model_routing_test.go TestStripModelBasedRoutingRules
HDR = "X-Gateway-Model-Name"


def _model(path, value):
    return {"path": {"type": "Exact", "value": path}, "headers": [{"type": "Exact", "name": HDR, "value": value}]}


def _path(path):
    return {"path": {"type": "PathPrefix", "value": path}}


M1 = "publishers/ns/models/m1"
ENDPOINTS = ("/v1/completions", "/v1/completions/", "/v1/chat/completions", "/v1/chat/completions/", "/v1/responses", "/v1/responses/",
             "/v1/messages", "/v1/messages/")
KSERVE_STRIP_CASES = [
    ("strips consolidated model-routing rule with all endpoint matches",
     [{"matches": [_model(p, M1) for p in ENDPOINTS]}], HDR, []),
    ("keeps path-only rules untouched", [{"matches": [_path("/ns/name/v1/completions")]}], HDR, [1]),
    ("mixed rule: removes model-routing matches, keeps path matches",
     [{"matches": [_path("/ns/name/v1/completions"), _model("/v1/completions", M1)]}], HDR, [1]),
    ("strips messages model-routing rule alongside other endpoints",
     [{"matches": [_path("/ns/name/v1/messages")]}, {"matches": [_model("/v1/messages", M1), _model("/v1/messages/", M1)]}], HDR, [1]),
    ("empty header name: returns rules unchanged", [{"matches": [_model("/v1/completions", M1)]}], "", [1]),
    ("no model-routing matches: returns all rules",
     [{"matches": [_path("/ns/name/v1/completions")]}, {"matches": [_path("/ns/name/health")]}], HDR, [1, 1]),
]


@pytest.mark.parametrize("name, rules, header, matches_per_rule", KSERVE_STRIP_CASES, ids=[c[0] for c in KSERVE_STRIP_CASES])
def test_strip_model_routing_rules_as_kserve(name, rules, header, matches_per_rule):  # pylint: disable=unused-argument
    got = router.strip_model_routing_matches(rules, header)
    assert [len(r["matches"]) for r in got] == matches_per_rule
    assert all(not m.get("headers") for r in got for m in r["matches"]) or header == ""


def test_a_model_alias_on_kserves_model_routing_header_is_refused_unless_model_routing_is_on():
    with pytest.raises(AnsibleFilterError, match="model_aliases: rule class-code: KServe drops its 1 match") as err:
        routing_plan(REPORT, SPEC, BASE, render="llmisvc", llmisvc_name="llama-ngram", namespace="models",
                     model_aliases={"code": "llama-code"})
    assert "stripModelBasedRoutingRules" in str(err.value)
    on = routing_plan(REPORT, SPEC, BASE, render="llmisvc", llmisvc_name="llama-ngram", namespace="models",
                      model_aliases={"code": "llama-code"}, model_routing=True)
    assert _rules(on)[1]["matches"][1]["headers"][0] == {"type": "Exact", "name": HDR, "value": "llama-code"}
    # another header (a body-based router of the user's) is not KServe's: kept
    other = routing_plan(REPORT, SPEC, BASE, render="llmisvc", llmisvc_name="llama-ngram", namespace="models",
                         model_aliases={"code": "llama-code"}, model_header="x-model")
    assert router.controller_rules(_rules(other)) == _rules(other)


def test_a_router_naming_its_own_routes_is_refused():
    obj = routing_plan(REPORT, SPEC, BASE, render="llmisvc", llmisvc_name="llama-ngram", namespace="models")
    with pytest.raises(ValidationError) as err:
        router.with_route(_deployed({"route": {"http": {"refs": [{"name": "my-route"}]}}}), obj["spec"]["router"]["route"])
    assert err.value.field == "spec.router.route.http.refs" and "my-route" in str(err.value) and err.value.hint


def test_the_gitops_write_changes_only_the_route_of_the_deploys_manifest():
    obj = routing_plan(REPORT, SPEC, BASE, render="llmisvc", llmisvc_name="llama-ngram", namespace="models")
    deployed_text = isvc.to_yaml(_deployed())
    out = routing_gitops_file(obj, manifest=deployed_text)
    assert out["filename"] == "models-llama-ngram.llmisvc.yaml"
    written = yaml.safe_load(out["content"])
    assert _rules(written) == _rules(obj) and written["spec"]["template"] == _deployed()["spec"]["template"]
    assert written["metadata"]["labels"] == _deployed()["metadata"]["labels"]
    assert written["metadata"]["annotations"] == obj["metadata"]["annotations"]
    assert schema_errors(written, crds.resolve()) == []
    # the same decisions again: the same bytes (nothing to commit)
    assert routing_gitops_file(obj, manifest=out["content"]) == out
    # only the route's and the annotation's lines changed
    before, after = set(deployed_text.splitlines()), set(out["content"].splitlines())
    assert before - after == {"    route: {}"}
    with pytest.raises(AnsibleFilterError, match="benchmark_gitops_dir: the GitOps directory has no manifest of LLMInferenceService models/llama-ngram"):
        routing_gitops_file(obj, manifest="")
    with pytest.raises(ValidationError, match="no manifest"):
        routing_gitops.llmisvc_manifest(obj, isvc.to_yaml(dict(_deployed(), metadata={"name": "other", "namespace": "models"})))


def test_the_baseline_twin_does_not_copy_the_plans_rules():
    obj = routing_plan(REPORT, SPEC, BASE, render="llmisvc", llmisvc_name="llama-ngram", namespace="models")
    candidate = yaml.safe_load(routing_gitops_file(obj, manifest=isvc.to_yaml(_deployed()))["content"])
    made = twin.baseline_twin(candidate)
    assert made["spec"]["router"]["route"] == {} and router.PLAN_ANNOTATION not in made["metadata"]["annotations"]
    assert made["spec"]["router"]["gateway"] == {}
    # a route the user wrote (no plan annotation) is the user's: copied as before
    own = _deployed({"route": {"http": {"spec": {"rules": [{"matches": [_path("/")], "backendRefs": [SPEC]}]}}}})
    assert twin.baseline_twin(own)["spec"]["router"]["route"] == own["spec"]["router"]["route"]


def test_the_benchmark_role_writes_the_llmisvc_route_into_the_gitops_manifest(tmp_path):
    gitops = tmp_path / "gitops"
    gitops.mkdir()
    (gitops / "models-llama-ngram.llmisvc.yaml").write_text(isvc.to_yaml(_deployed()))
    report = tmp_path / "ab.json"
    report.write_text(json.dumps(REPORT))
    tasks = """
- name: Routes of an LLMInferenceService
  ansible.builtin.include_role:
    name: alauda.spec_decoding.benchmark
    tasks_from: routes
  vars:
    benchmark_result: {{report_json: "{report}"}}
    benchmark_report_dir: "{dir}"
    benchmark_report_name: ab
    benchmark_namespace: models
    benchmark_resource_kind: LLMInferenceService
    benchmark_candidate_name: llama-ngram
    benchmark_gitops_dir: "{gitops}"
    benchmark_gitops_repo_url: ""
    benchmark_routing_plan:
      speculative_service: {{name: llama-ngram-kserve-workload-svc, port: 8000}}
      baseline_service: {{name: llama-ngram-baseline-kserve-workload-svc, port: 8000}}
      write: gitops
""".format(report=report, dir=tmp_path, gitops=gitops)
    run = run_playbook(tmp_path, tasks=tasks)
    assert run.rc == 0, run.output
    written = yaml.safe_load((gitops / "models-llama-ngram.llmisvc.yaml").read_text())
    assert [(r["name"], r["backendRefs"][0]["name"]) for r in _rules(written)] == [
        ("class-chat", BASE["name"]), ("class-code", SPEC["name"]), ("default", BASE["name"])]
    assert yaml.safe_load((gitops / "kustomization.yaml").read_text())["resources"] == ["models-llama-ngram.llmisvc.yaml"]
    next_to_report = yaml.safe_load((tmp_path / "ab-llmisvc-route.yaml").read_text())
    assert next_to_report["kind"] == "LLMInferenceService" and _rules(next_to_report) == _rules(written)
    said = [res["msg"] for _name, _host, res in run.tasks if "msg" in res and str(res["msg"]).startswith("routes: ")]
    assert said[0].startswith("routes: class-chat -> %s, class-code -> %s, default -> %s; LLMInferenceService " % (
        BASE["name"], SPEC["name"], BASE["name"]))
