"""gitops/sync_pause.py: the JSON patches that pause and resume an Argo CD Application's or a Flux Kustomization's sync,
applied to the objects as dicts (the API server's JSON-patch semantics are exercised on the test bed in
tests/integration/test_gitops_sync.py), and the errors that name their fix."""
from __future__ import annotations

import copy
import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ConflictError, SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import sync_pause
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan

KEY = sync_pause.PAUSED_SYNC_ANNOTATION
ARGO = {"kind": "argocd", "name": "serving", "namespace": "argocd"}
FLUX = {"kind": "flux", "name": "serving", "namespace": "flux-system"}
SYNC_POLICY = {"automated": {"prune": True, "selfHeal": True}, "retry": {"limit": 2}, "syncOptions": ["ServerSideApply=true"]}


def application(sync_policy=None, annotations=None, rv="41"):
    spec = {"project": "default", "destination": {"namespace": "models", "server": "https://kubernetes.default.svc"}}
    if sync_policy is not None:
        spec["syncPolicy"] = copy.deepcopy(sync_policy)
    meta = {"name": "serving", "namespace": "argocd", "resourceVersion": rv}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": meta, "spec": spec}


def kustomization(suspend=None, annotations=None, rv="7"):
    spec = {"interval": "1m", "prune": True, "path": "./serving", "sourceRef": {"kind": "GitRepository", "name": "repo"}}
    if suspend is not None:
        spec["suspend"] = suspend
    meta = {"name": "serving", "namespace": "flux-system", "resourceVersion": rv}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization", "metadata": meta, "spec": spec}


def _apply(obj, ops):
    assert patch_plan.tests_hold(obj, ops), "a test op does not hold on the object it was planned from"
    return patch_plan.apply_patch(obj, [op for op in ops if op["op"] != "test"])


def _pause(obj, owner, run_id="run-1"):
    plan = sync_pause.plan_pause(obj, owner, run_id, at="2026-12-05T13:00:00Z")
    return plan, _apply(obj, plan["ops"]) if plan["ops"] else obj


def _resume(obj, owner):
    plan = sync_pause.plan_resume(obj, owner)
    return plan, _apply(obj, plan["ops"]) if plan["ops"] else obj


@pytest.mark.parametrize("sync_policy", [SYNC_POLICY, {"automated": {}}, {"automated": {"enabled": True, "prune": False}, "syncOptions": ["A=b"]}])
@pytest.mark.parametrize("annotations", [None, {"team": "ml"}])
def test_argocd_pause_removes_automated_only_and_resume_restores_the_spec_exactly(sync_policy, annotations):
    before = application(sync_policy, annotations)
    plan, paused = _pause(before, ARGO)
    assert plan["paused_by_others"] is False and plan["already_paused"] is False
    assert "automated" not in paused["spec"]["syncPolicy"]
    assert paused["spec"]["syncPolicy"] == {k: v for k, v in sync_policy.items() if k != "automated"}
    record = json.loads(paused["metadata"]["annotations"][KEY])
    assert record == {"kind": "argocd", "previous": sync_policy, "by": "run-1", "at": "2026-12-05T13:00:00Z"}
    assert list(record["previous"]) == list(sync_policy)  # the key order as read
    if annotations:
        assert paused["metadata"]["annotations"]["team"] == "ml"
    # the guard: the value changed and the annotations as read (not resourceVersion, which Argo CD's status writes bump)
    tests = [op for op in plan["ops"] if op["op"] == "test"]
    assert {"op": "test", "path": "/spec/syncPolicy", "value": sync_policy} in tests
    assert any(op["path"] == "/metadata/resourceVersion" for op in tests) is (annotations is None)
    resume_plan, resumed = _resume(paused, ARGO)
    assert resume_plan["edited_while_paused"] is False
    assert json.dumps(resumed["spec"]) == json.dumps(before["spec"])
    assert resumed["metadata"].get("annotations", {}) == (annotations or {})


def test_argocd_without_sync_policy_is_recorded_as_null_and_stays_absent():
    before = application(None)
    plan, paused = _pause(before, ARGO)
    assert plan["record"]["previous"] is None and plan["paused_by_others"] is True
    assert "syncPolicy" not in paused["spec"]
    assert plan["ops"][0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert any("already off" in w and "resume leaves it off" in w for w in plan["warnings"])
    resumed = _resume(paused, ARGO)[1]
    assert resumed["spec"] == before["spec"] and KEY not in resumed["metadata"]["annotations"]


@pytest.mark.parametrize("sync_policy", [{"syncOptions": ["A=b"]}, {"automated": {"enabled": False, "selfHeal": True}}])
def test_argocd_paused_by_someone_else_stays_off_after_resume(sync_policy):
    before = application(sync_policy)
    plan, paused = _pause(before, ARGO)
    assert plan["paused_by_others"] is True
    # automated with enabled: false is removed too: a controller older than the enabled field would still sync with it
    assert "automated" not in paused["spec"]["syncPolicy"]
    resumed = _resume(paused, ARGO)[1]
    assert resumed["spec"]["syncPolicy"] == sync_policy
    assert sync_pause.sync_is_off("argocd", resumed["spec"]["syncPolicy"])


@pytest.mark.parametrize("suspend", [None, False, True])
def test_flux_pause_sets_suspend_and_resume_restores_it_absent_stays_absent(suspend):
    before = kustomization(suspend)
    plan, paused = _pause(before, FLUX)
    assert paused["spec"]["suspend"] is True
    assert plan["record"]["previous"] is suspend
    assert plan["paused_by_others"] is (suspend is True)
    resumed = _resume(paused, FLUX)[1]
    assert json.dumps(resumed["spec"]) == json.dumps(before["spec"])
    assert ("suspend" in resumed["spec"]) is (suspend is not None)


@pytest.mark.parametrize("owner,make,on", [(ARGO, application, SYNC_POLICY), (FLUX, kustomization, False)])
def test_a_second_pause_keeps_the_first_record(owner, make, on):
    before = make(on)
    first, paused = _pause(before, owner, "run-1")
    second, again = _pause(paused, owner, "run-2")
    assert second["ops"] == [] and second["already_paused"] is True
    assert again == paused and second["record"]["by"] == "run-1" and second["record"]["previous"] == on
    resumed = _resume(again, owner)[1]
    assert json.dumps(resumed["spec"]) == json.dumps(before["spec"])
    assert first["record"] == second["record"]


def test_a_pause_finding_its_record_but_the_sync_on_again_switches_it_off_and_keeps_the_record():
    paused = _pause(application(SYNC_POLICY), ARGO)[1]
    by_hand = copy.deepcopy(paused)
    by_hand["spec"]["syncPolicy"]["automated"] = {"selfHeal": False}
    plan, again = _pause(by_hand, ARGO, "run-2")
    assert "automated" not in again["spec"]["syncPolicy"]
    assert again["metadata"]["annotations"][KEY] == paused["metadata"]["annotations"][KEY]
    assert plan["warnings"] and "first record kept" in plan["warnings"][0]


def test_resume_without_a_record_changes_nothing():
    for owner, obj in ((ARGO, application({"syncOptions": ["A=b"]})), (FLUX, kustomization(True))):
        plan = sync_pause.plan_resume(obj, owner)
        assert plan["ops"] == [] and plan["record"] is None


def test_resume_keeps_a_syncpolicy_edit_made_while_paused_and_puts_automated_back():
    paused = _pause(application(SYNC_POLICY), ARGO)[1]
    paused["spec"]["syncPolicy"]["syncOptions"] = ["ServerSideApply=true", "Validate=false"]
    plan, resumed = _resume(paused, ARGO)
    assert plan["edited_while_paused"] is True and plan["warnings"]
    assert resumed["spec"]["syncPolicy"] == dict(SYNC_POLICY, syncOptions=["ServerSideApply=true", "Validate=false"])


def test_resume_leaves_a_flux_suspend_changed_by_hand():
    paused = _pause(kustomization(None), FLUX)[1]
    paused["spec"]["suspend"] = False
    plan, resumed = _resume(paused, FLUX)
    assert plan["edited_while_paused"] is True and resumed["spec"]["suspend"] is False
    assert KEY not in resumed["metadata"]["annotations"]


def test_a_concurrent_edit_makes_the_guard_fail():
    before = application(SYNC_POLICY, {"team": "ml"})
    plan = sync_pause.plan_pause(before, ARGO, "run-1")
    edited = copy.deepcopy(before)
    edited["spec"]["syncPolicy"]["automated"]["prune"] = False
    assert not patch_plan.tests_hold(edited, plan["ops"])
    paused = _pause(before, ARGO)[1]
    resume_plan = sync_pause.plan_resume(paused, ARGO)
    other = copy.deepcopy(paused)
    other["metadata"]["annotations"][KEY] = other["metadata"]["annotations"][KEY].replace("run-1", "run-9")
    assert not patch_plan.tests_hold(other, resume_plan["ops"])


@pytest.mark.parametrize("kind,word", [("helm", "Helm release"), ("none", "no GitOps owner")])
def test_helm_or_no_owner_is_refused_with_the_fixes(kind, word):
    with pytest.raises(ValidationError) as err:
        sync_pause.plan_pause(application(SYNC_POLICY), {"kind": kind, "name": "x", "namespace": "y"}, "run-1")
    assert word in str(err.value) and "rollback_mode: git" in str(err.value) and "rollback_mode: live" in str(err.value)
    assert err.value.field == "owner"


def test_a_record_that_is_not_ours_is_refused():
    obj = application({"syncOptions": []}, {KEY: "paused by hand"})
    with pytest.raises(ValidationError) as err:
        sync_pause.plan_resume(obj, ARGO)
    assert "not a record the collection wrote" in str(err.value) and KEY + "-" in str(err.value)


class _ApiError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.body = json.dumps({"kind": "Status", "message": message})
        self.reason = "x"


def test_rbac_denied_names_the_verb_the_resource_and_the_rbac_file(monkeypatch):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client
    monkeypatch.setattr(client, "ApiException", _ApiError)
    obj = application(SYNC_POLICY)

    def request(api_client, method, path, **kwargs):
        if method == "GET":
            return copy.deepcopy(obj)
        raise _ApiError(403, 'applications.argoproj.io "serving" is forbidden: User "ci" cannot patch resource')
    monkeypatch.setattr(client, "request", request)
    with pytest.raises(ValidationError) as err:
        sync_pause.pause(object(), ARGO, "run-1")
    text = str(err.value)
    assert "patch applications.argoproj.io in namespace argocd" in text and "docs/rbac/gitops-owner-reader.yaml" in text


def test_a_422_whose_test_no_longer_holds_is_a_conflict_with_nothing_written(monkeypatch):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client
    monkeypatch.setattr(client, "ApiException", _ApiError)
    reads = [application(SYNC_POLICY), application(dict(SYNC_POLICY, automated={"prune": False}), rv="42")]

    def request(api_client, method, path, **kwargs):
        if method == "GET":  # the read, then the edited object on every later read
            return reads.pop(0) if len(reads) > 1 else copy.deepcopy(reads[0])
        raise _ApiError(422, "the server rejected our request due to an error in our request")
    monkeypatch.setattr(client, "request", request)
    with pytest.raises(ConflictError) as err:
        sync_pause.pause(object(), ARGO, "run-1")
    assert "nothing was written" in str(err.value) and "run the task again" in str(err.value)
    assert isinstance(err.value, SpecDecodingError)


@pytest.mark.parametrize("suspend", [None, False])
def test_a_status_write_between_the_read_and_the_pause_is_planned_again_on_the_fresh_read(monkeypatch, suspend):
    """Flux's controller writes a Kustomization's status on each reconcile: without annotations (or spec.suspend) the pause
    guards with resourceVersion, which that write moves. Spec and annotations as read: the pause plans again and is written; an
    edit of what it guards stays the conflict (test above)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client
    monkeypatch.setattr(client, "ApiException", _ApiError)
    live = {"obj": kustomization(suspend, rv="7")}
    patches = []

    def request(api_client, method, path, body=None, **kwargs):
        if method == "GET":
            return copy.deepcopy(live["obj"])
        patches.append(body)
        if len(patches) == 1:  # the controller's status write landed first
            live["obj"] = kustomization(suspend, rv="8")
            raise _ApiError(422, "the server rejected our request due to an error in our request")
        assert patch_plan.tests_hold(live["obj"], body)
        live["obj"] = patch_plan.apply_patch(live["obj"], [op for op in body if op["op"] != "test"])
        return live["obj"]
    monkeypatch.setattr(client, "request", request)
    result = sync_pause.pause(object(), FLUX, "run-1")
    assert result["changed"] and live["obj"]["spec"]["suspend"] is True and len(patches) == 2
    guards = [op for op in patches[1] if op["path"] == "/metadata/resourceVersion"]
    assert guards == [{"op": "test", "path": "/metadata/resourceVersion", "value": "8"}]  # no annotations to test: planned on the fresh read


def test_pause_needs_a_run_id():
    with pytest.raises(ValidationError) as err:
        sync_pause.pause(object(), ARGO, "")
    assert err.value.field == "run_id"
