"""kube/cel_rules.py and kserve/crd_rules.py: the x-kubernetes-validations (CEL) rules of the real KServe CRDs,
evaluated as a 1.25+ kube-apiserver does, on every manifest the collection renders, before anything is written.

The rules come from the CRD files the test bed uses (tests/testbed/crds.py), read as they are; the rules the collection
ships (kserve/crd_rules_releases.py) are checked to be exactly those."""
import copy
import importlib.util
import json
import os

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import crd_rules
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import crd_rules_releases
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import render as llmisvc_render
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import cel_rules
from tests.module_run import run_module
from tests.paths import REPO
from tests.testbed import crds
from tests.testbed.controlplane import _load_crd
from tests.testbed.llmisvc_standin import schema_errors

LLMISVC_FILE = "serving.kserve.io_llminferenceservices.yaml"
_SPEC = importlib.util.spec_from_file_location("kserve_crd_rules", os.path.join(REPO, "hack", "kserve_crd_rules.py"))
kserve_crd_rules = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(kserve_crd_rules)
NOT_EVALUATED = os.path.join(REPO, "tests", "fixtures", "kserve", "cel_rules_not_evaluated.yml")


@pytest.fixture(scope="module")
def real():
    """The real LLMInferenceService CRD's rules per version, read from the file as it is (its defaults included)."""
    return cel_rules.rules_of(_load_crd(os.path.join(crds.resolve(), LLMISVC_FILE), as_is=True))["versions"]


def _llmisvc(spec, version="v1alpha2"):
    return {"apiVersion": "serving.kserve.io/" + version, "kind": "LLMInferenceService",
            "metadata": {"name": "llama", "namespace": "models"}, "spec": spec}


def _route(rule):
    return {"model": {"uri": "pvc://m/"}, "router": {"route": {"http": {"spec": {"rules": [rule]}}}}}


def _failures(schema, manifest):
    result = cel_rules.evaluate(schema, manifest)
    assert result.not_evaluated == []
    return [(v.field, v.message) for v in result.violations]


# -- the evaluator on rules of the real LLMInferenceService CRD --------------------------------------------------------

@pytest.mark.parametrize("version", ["v1alpha1", "v1alpha2"])
def test_replicas_and_scaling_are_mutually_exclusive(real, version):
    ok = _llmisvc({"model": {"uri": "pvc://m/"}, "replicas": 2}, version)
    assert _failures(real[version], ok) == []
    both = _llmisvc({"model": {"uri": "pvc://m/"}, "replicas": 2,
                     "scaling": {"minReplicas": 1, "maxReplicas": 3, "keda": {"triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}}}, version)
    assert _failures(real[version], both) == [
        ("spec", "replicas and scaling are mutually exclusive; use scaling for autoscaled deployments or replicas for "
                 "static deployments")]


def test_scaling_rules_name_the_scaling_field(real):
    good = {"minReplicas": 1, "maxReplicas": 3, "keda": {"triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}}
    assert _failures(real["v1alpha2"], _llmisvc({"model": {"uri": "pvc://m/"}, "scaling": good})) == []
    bad = {"minReplicas": 4, "maxReplicas": 3, "keda": {"triggers": []}}
    assert _failures(real["v1alpha2"], _llmisvc({"model": {"uri": "pvc://m/"}, "scaling": bad})) == [
        ("spec.scaling", "at least one trigger is required when using direct KEDA scaling"),
        ("spec.scaling", "minReplicas cannot exceed maxReplicas")]


def test_a_backend_ref_takes_its_defaults_before_the_rule_reads_them(real):
    """`(size(self.group) == 0 && self.kind == 'Service') ? has(self.port) : true`: group defaults to "" and kind to
    Service in the CRD, so a backendRef with a name only needs a port (without the defaults the rule could not even read
    self.group)."""
    no_port = _llmisvc(_route({"backendRefs": [{"name": "llama-epp"}]}))
    assert _failures(real["v1alpha2"], no_port) == [
        ("spec.router.route.http.spec.rules[0].backendRefs[0]", "Must have port for Service reference")]
    with_port = _llmisvc(_route({"backendRefs": [{"name": "llama-epp", "port": 8000}]}))
    assert _failures(real["v1alpha2"], with_port) == []
    other_kind = _llmisvc(_route({"backendRefs": [{"name": "pool", "group": "inference.networking.k8s.io", "kind": "InferencePool"}]}))
    assert _failures(real["v1alpha2"], other_kind) == []


def test_path_match_regex_and_prefix_rules(real):
    def path(value):
        return _llmisvc(_route({"matches": [{"path": {"type": "PathPrefix", "value": value}}]}))
    assert _failures(real["v1alpha2"], path("/v1/chat/completions")) == []
    assert [m for _f, m in _failures(real["v1alpha2"], path("/v1//chat"))] == [
        "must not contain '//' when type one of ['Exact', 'PathPrefix']"]
    field, message = _failures(real["v1alpha2"], path("/v1 chat"))[0]
    assert field == "spec.router.route.http.spec.rules[0].matches[0].path"
    assert message.startswith("must only contain valid characters (matching ^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]")


def test_timeouts_compare_as_durations(real):
    def timeouts(request, backend):
        return _llmisvc(_route({"timeouts": {"request": request, "backendRequest": backend}}))
    assert _failures(real["v1alpha2"], timeouts("1m", "30s")) == []
    assert _failures(real["v1alpha2"], timeouts("10s", "1m")) == [
        ("spec.router.route.http.spec.rules[0].timeouts", "backendRequest timeout cannot be longer than request timeout")]
    assert _failures(real["v1alpha2"], timeouts("0s", "1m")) == []  # 0s: no request timeout


def test_filter_macros_on_lists(real):
    cors = {"type": "CORS", "cors": {"allowOrigins": ["https://a.example"]}}
    twice = _llmisvc(_route({"filters": [cors, copy.deepcopy(cors)]}))
    assert _failures(real["v1alpha2"], twice) == [
        ("spec.router.route.http.spec.rules[0].filters", "CORS filter cannot be repeated")]
    star = copy.deepcopy(cors)
    star["cors"]["allowOrigins"] = ["*", "https://a.example"]
    assert _failures(real["v1alpha2"], _llmisvc(_route({"filters": [star]}))) == [
        ("spec.router.route.http.spec.rules[0].filters[0].cors.allowOrigins", "AllowOrigins cannot contain '*' alongside other origins")]


def test_target_ports_must_be_unique(real):
    def pool(ports):
        return _llmisvc({"model": {"uri": "pvc://m/"}, "router": {"scheduler": {"pool": {"spec": {
            "selector": {"matchLabels": {"app": "llama"}}, "targetPorts": ports,
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}}}})
    assert _failures(real["v1alpha2"], pool([{"number": 8000}, {"number": 8001}])) == []
    assert _failures(real["v1alpha2"], pool([{"number": 8000}, {"number": 8000}])) == [
        ("spec.router.scheduler.pool.spec.targetPorts", "port number must be unique")]


def test_every_rule_of_the_real_crds_compiles_and_the_list_of_those_that_do_not_is_kept(real):
    """How many rules cel-expr-python evaluates, and which it cannot (with the reason), as
    tests/fixtures/kserve/cel_rules_not_evaluated.yml records for each shipped release."""
    with open(NOT_EVALUATED, encoding="utf-8") as handle:
        recorded = yaml.safe_load(handle)
    rules = [(version, path, rule["rule"]) for version, schema in real.items() for path, rule in cel_rules.iter_rules(schema)]
    problems = [dict(version=version, **p._asdict()) for version, schema in sorted(real.items())
                for p in cel_rules.compile_problems(schema)]
    newest = crd_rules.releases()[-1]
    assert recorded[newest] == {"kind": "LLMInferenceService", "rules": len(rules),
                                "distinct": len({rule for _v, _p, rule in rules}), "not_evaluated": problems}
    assert (len(rules), len({r for _v, _p, r in rules})) == (257, 67)


# -- the shipped data is the real CRDs' ---------------------------------------------------------------------------------

def test_the_shipped_rules_are_those_of_the_real_crds():
    """hack/kserve_crd_rules.py run on the test bed's CRDs gives exactly the newest shipped release (files by sha256)."""
    newest = crd_rules.releases()[-1]
    shipped = crd_rules_releases.RELEASES[newest]
    fresh = kserve_crd_rules.read_release(crds.resolve(), source=shipped["source"],
                                          load=lambda path: _load_crd(path, as_is=True))
    assert fresh["files"] == shipped["files"]
    assert fresh["rules"] == json.loads(shipped["rules"])
    assert kserve_crd_rules.load_data()[newest] == dict(shipped, rules=fresh["rules"])


# -- the render refuses, before anything is written ----------------------------------------------------------------------

def _params(**over):
    return dict(dict(name="llama-eagle3", namespace="models", method="eagle3", artifact_mode="pvc", artifacts={"pvc_name": "model-store"},
                     dtype="auto", max_model_len=8192, max_num_seqs=64, seed=42, vllm_version="0.32.0",
                     llmisvc={"image": "registry.local/vllm/vllm-openai:v0.32.0"}), **over)


def test_a_rendered_manifest_that_breaks_a_rule_is_refused_with_the_rules_message_and_field():
    out = llmisvc_render.render(_params(llmisvc={"image": "registry.local/vllm/vllm-openai:v0.32.0", "prefill": {"replicas": 1}}))
    assert out["cel_rules"]["evaluated"] == 2 and out["cel_rules"]["not_evaluated"] == []  # spec and spec.prefill
    assert out["cel_rules"]["source"] == "KServe 0.20's CRDs (shipped with the collection)"
    manifest = out["manifest"]
    # The same manifest with autoscaling added (as a kustomize patch over the GitOps file would) breaks KServe's rule.
    manifest["spec"]["prefill"]["scaling"] = {"minReplicas": 1, "maxReplicas": 2, "keda": {"triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}}
    with pytest.raises(ValidationError) as err:
        crd_rules.check(manifest)
    assert err.value.field == "spec.prefill"
    assert str(err.value).startswith(
        "spec.prefill: replicas and scaling are mutually exclusive; use scaling for autoscaled deployments or replicas for "
        "static deployments (x-kubernetes-validations rule `!(has(self.replicas) && has(self.scaling))` of KServe 0.20's CRDs")
    # the test bed's own reading of the CRD file agrees
    assert schema_errors(manifest, crds.resolve()) == [
        "spec.prefill: replicas and scaling are mutually exclusive; use scaling for autoscaled deployments or replicas for "
        "static deployments (CEL rule !(has(self.replicas) && has(self.scaling)))"]


def _user_crd(tmp_path, rule):
    """A user's newer LLMInferenceService CRD: one rule more, on spec.model."""
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "llminferenceservices.serving.kserve.io"},
           "spec": {"group": "serving.kserve.io", "names": {"kind": "LLMInferenceService", "plural": "llminferenceservices"},
                    "scope": "Namespaced", "versions": [{"name": "v1alpha2", "served": True, "storage": True, "schema": {
                        "openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {
                            "model": {"type": "object", "x-kubernetes-validations": [rule],
                                      "properties": {"uri": {"type": "string"}}}}}}}}}]}}
    (tmp_path / "crds").mkdir()
    (tmp_path / "crds" / "llmisvc.yaml").write_text(yaml.safe_dump(crd))
    return str(tmp_path / "crds")


def test_the_module_refuses_with_the_users_crds_and_names_what_it_cannot_evaluate(tmp_path):
    rule = {"rule": "!self.uri.startsWith('pvc://') || self.uri.endsWith('/model/')", "fieldPath": ".uri",
            "messageExpression": "'a PVC URI must end in /model/, got ' + self.uri", "reason": "FieldValueForbidden"}
    args = dict(name="llama", namespace="models", runtime="unused", resource_kind="LLMInferenceService", artifact_mode="pvc",
                artifacts={"pvc_name": "model-store"}, llmisvc={"image": "registry.local/vllm:v0.32.0"},
                kserve_crds=_user_crd(tmp_path, rule))
    result = run_module("isvc_manifest", args)
    assert result.failed
    assert result.msg.startswith("spec.model.uri: a PVC URI must end in /model/, got pvc://model-store/ (x-kubernetes-validations rule")
    assert "the CRDs in %s" % args["kserve_crds"] in result.msg
    # a transition rule cannot run on a create: named in a warning and in the result, not passed in silence
    (tmp_path / "crds" / "llmisvc.yaml").unlink()
    (tmp_path / "crds").rmdir()
    args["kserve_crds"] = _user_crd(tmp_path, {"rule": "self.uri == oldSelf.uri", "message": "uri is immutable"})
    result = run_module("isvc_manifest", args)
    assert not result.failed, result.msg
    reason = "transition rule (reads oldSelf): kube-apiserver runs it on an update only, and no object on the cluster was given"
    assert result["cel_rules"]["not_evaluated"] == [{"field": "spec.model", "rule": "self.uri == oldSelf.uri", "reason": reason}]
    rendered = llmisvc_render.render(_params(kserve_crds=args["kserve_crds"]))
    assert "LLMInferenceService spec.model: x-kubernetes-validations rule not evaluated (%s): self.uri == oldSelf.uri" % reason \
        in rendered["warnings"]
    # ... and against the object on the cluster it runs
    existing = copy.deepcopy(result["manifest"])
    existing["spec"]["model"]["uri"] = "pvc://other/"
    result = run_module("isvc_manifest", dict(args, existing=existing))
    assert result.failed and result.msg.startswith("spec.model: uri is immutable (x-kubernetes-validations rule")


# -- evaluator semantics on a small schema --------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
    "labels": {"type": "object", "additionalProperties": {"type": "string", "x-kubernetes-validations": [
        {"rule": "size(self) <= 5", "message": "at most 5 characters"}]}},
    "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"], "items": {
        "type": "object", "properties": {"name": {"type": "string"}, "number": {"type": "integer"}},
        "x-kubernetes-validations": [{"rule": "self.number == oldSelf.number", "message": "number is immutable"}]}},
    "weight": {"type": "number", "x-kubernetes-validations": [{"rule": "self < 1.5", "message": "weight below 1.5"}]},
    "memory": {"type": "string", "x-kubernetes-validations": [
        {"rule": "quantity(self).isLessThan(quantity('2Gi'))", "message": "below 2Gi"},
        {"rule": "self.ip().isLoopback()", "message": "uses the IP library"}]},
    "limits": {"type": "object", "properties": {"max": {"type": "integer"}}, "x-kubernetes-validations": [{"rule": "self.max > 0"}]},
    "mode": {"type": "string", "default": "fast"},
}, "x-kubernetes-validations": [{"rule": "self.mode == 'fast' || has(self.weight)", "message": "slow mode needs a weight"}]}}}


def test_semantics_maps_lists_defaults_numbers_transitions_and_what_cannot_be_evaluated():
    schema = cel_rules._prune(SCHEMA, False)  # pylint: disable=protected-access
    obj = {"spec": {"labels": {"a": "short", "b": "far too long"}, "ports": [{"name": "http", "number": 80}], "weight": 1,
                    "memory": "1Gi", "limits": {}}}
    result = cel_rules.evaluate(schema, obj)
    # a rule that cannot be evaluated on the object (a key that is not there) fails, as on the API server
    assert [(v.field, v.message, v.reason) for v in result.violations] == [
        ("spec.labels[b]", "at most 5 characters", "FieldValueInvalid"),
        ("spec.limits", "failed rule: self.max > 0 (the rule cannot be evaluated on this object: "
                        "NOT_FOUND: Key not found in map : \"max\")", "FieldValueInvalid")]
    assert sorted((n.field, n.rule) for n in result.not_evaluated) == [
        ("spec.memory", "self.ip().isLoopback()"), ("spec.ports[0]", "self.number == oldSelf.number")]
    compile_reason = next(n.reason for n in result.not_evaluated if n.rule.startswith("self.ip"))
    assert compile_reason.startswith("does not compile with cel-expr-python:") and "'ip'" in compile_reason
    # the default makes `mode` fast; a weight of 1 (an integer in a number field) is a double for the rule
    assert "self.mode == 'fast' || has(self.weight)" in result.evaluated and "self < 1.5" in result.evaluated
    slow = copy.deepcopy(obj)
    slow["spec"].update(mode="slow", memory="3Gi", labels={})
    del slow["spec"]["weight"]
    messages = {v.field: v.message for v in cel_rules.evaluate(schema, slow).violations}
    assert messages["spec"] == "slow mode needs a weight" and messages["spec.memory"] == "below 2Gi"
    # transition rules run against the old object, list items matched by their map keys
    old = {"spec": {"ports": [{"name": "metrics", "number": 1}, {"name": "http", "number": 8080}]}}
    changed = cel_rules.evaluate(schema, {"spec": {"ports": [{"name": "http", "number": 80}]}}, old=old)
    assert [(v.field, v.message) for v in changed.violations] == [("spec.ports[0]", "number is immutable")]
    same = cel_rules.evaluate(schema, {"spec": {"ports": [{"name": "http", "number": 8080}]}}, old=old)
    assert same.violations == [] and "self.number == oldSelf.number" in same.evaluated
    # an absent node runs no rule
    assert cel_rules.evaluate(schema, {"spec": {}}).violations == []
