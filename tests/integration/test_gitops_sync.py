"""gitops_sync on the test bed: the real Argo CD v3.5.1 Application and Flux kustomize-controller v1.9.4 Kustomization
CRDs (../shared/gitops-crds), the module run in-process (tests/module_run.py). No stand-in controller runs here: what is
tested is what the module writes on the owner object, compared as the API server stores it.

- pause then resume leaves the owner's spec byte-for-byte as before (the JSON of spec, key order included);
- a pause killed after its record and run again (a second pause) keeps the first record, and the resume restores it;
- a sync already off before the pause (someone else's) is still off after the resume;
- an edit of the owner between the module's read and its write fails the task with nothing written;
- check mode writes nothing; RBAC without patch names the verb, the resource and the RBAC file.
"""
from __future__ import annotations

import copy
import json
import os
import time

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import sync_pause
from tests.module_run import run_module
from tests.paths import REPO

KEY = sync_pause.PAUSED_SYNC_ANNOTATION
APPS = "/apis/argoproj.io/v1alpha1/namespaces/%s/applications"
KUSTOMIZATIONS = "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/%s/kustomizations"
ISVCS = "/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices"
# Not in the alphabetical order the API server stores a custom object's keys in: what the record keeps is the stored form.
SYNC_POLICY = {"syncOptions": ["ServerSideApply=true", "CreateNamespace=false"], "retry": {"limit": 3, "backoff": {"duration": "5s"}},
               "automated": {"selfHeal": True, "prune": True, "allowEmpty": False}}


@pytest.fixture
def api(controlplane, gitops_crds):  # pylint: disable=unused-argument,redefined-outer-name
    rest = controlplane.rest()
    yield rest
    rest.close()


def _application(api, namespace, name, sync_policy):
    spec = {"project": "default", "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace},
            "source": {"repoURL": "http://127.0.0.1:9418/serving.git", "path": "models", "targetRevision": "main"}}
    if sync_policy is not None:
        spec["syncPolicy"] = copy.deepcopy(sync_policy)
    return api.post(APPS % namespace, {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                                       "metadata": {"name": name, "namespace": namespace}, "spec": spec})


def _kustomization(api, namespace, name, suspend):
    spec = {"interval": "1m", "prune": True, "path": "./models", "sourceRef": {"kind": "GitRepository", "name": "serving"}}
    if suspend is not None:
        spec["suspend"] = suspend
    return api.post(KUSTOMIZATIONS % namespace, {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                                                 "metadata": {"name": name, "namespace": namespace}, "spec": spec})


def _isvc(api, namespace, name, metadata):
    meta = dict(metadata, name=name, namespace=namespace)
    api.post(ISVCS % namespace, {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": meta,
                                 "spec": {"predictor": {"model": {"modelFormat": {"name": "vllm"}, "storageUri": "pvc://m/x"}}}})


def _spec_json(obj):
    return json.dumps(obj["spec"])


def _sync(kubeconfig, state, owner=None, check=False, diff=False, **args):
    args = dict(args, state=state, kubeconfig=kubeconfig)
    if owner:
        args.update(owner_kind=owner[0], owner_name=owner[1], owner_namespace=owner[2])
    return run_module("gitops_sync", args, check_mode=check, diff=diff)


def test_argocd_pause_then_resume_leaves_the_spec_byte_for_byte_and_a_rerun_resumes_the_first_record(api, kubeconfig, namespace):
    app = _application(api, namespace, "serving", SYNC_POLICY)
    before = _spec_json(app)
    # the serving object names its Application with Argo CD's tracking id (<app namespace>_<app> outside argocd)
    _isvc(api, namespace, "llama", {"annotations": {"argocd.argoproj.io/tracking-id":
                                                    "%s_serving:serving.kserve.io/InferenceService:%s/llama" % (namespace, namespace)}})
    obj = dict(name="llama", namespace=namespace)

    checked = _sync(kubeconfig, "paused", run_id="run-1", check=True, diff=True, **obj)
    assert not checked.failed, checked.msg
    assert checked["changed"] is True and "automated" not in checked["diff"]["after"]["syncPolicy"]
    assert _spec_json(api.get(APPS % namespace + "/serving")) == before  # check mode wrote nothing

    paused = _sync(kubeconfig, "paused", run_id="run-1", **obj)
    assert not paused.failed, paused.msg
    assert paused["changed"] is True and paused["paused"] is True and paused["paused_by_others"] is False
    assert paused["owner"]["kind"] == "argocd" and paused["owner"]["name"] == "serving" and paused["owner"]["namespace"] == namespace
    live = api.get(APPS % namespace + "/serving")
    assert "automated" not in live["spec"]["syncPolicy"]
    assert live["spec"]["syncPolicy"]["syncOptions"] == SYNC_POLICY["syncOptions"] and live["spec"]["syncPolicy"]["retry"] == SYNC_POLICY["retry"]
    record = json.loads(live["metadata"]["annotations"][KEY])
    assert record["kind"] == "argocd" and record["by"] == "run-1" and record["previous"] == SYNC_POLICY
    assert json.dumps(record["previous"]) == json.dumps(app["spec"]["syncPolicy"])  # as stored, key order included
    assert paused["previous"] == SYNC_POLICY

    # killed after the record, run again: the second pause keeps the first record (never the paused state)
    again = _sync(kubeconfig, "paused", run_id="run-2", **obj)
    assert not again.failed, again.msg
    assert again["changed"] is False and again["already_paused"] is True and again["record"]["by"] == "run-1"
    assert api.get(APPS % namespace + "/serving")["metadata"]["annotations"][KEY] == live["metadata"]["annotations"][KEY]

    resumed = _sync(kubeconfig, "resumed", diff=True, **obj)
    assert not resumed.failed, resumed.msg
    assert resumed["changed"] is True and resumed["resumed"] is True and resumed["paused"] is False
    after = api.get(APPS % namespace + "/serving")
    assert _spec_json(after) == before
    assert KEY not in (after["metadata"].get("annotations") or {})
    print("argocd: spec before/after %d bytes, identical; record %d bytes" % (len(before), len(live["metadata"]["annotations"][KEY])))

    twice = _sync(kubeconfig, "resumed", **obj)
    assert not twice.failed and twice["changed"] is False and twice["resumed"] is False and twice["previous"] is None
    assert _spec_json(api.get(APPS % namespace + "/serving")) == before


@pytest.mark.parametrize("suspend", [None, False])
def test_flux_pause_then_resume_restores_suspend_exactly_and_a_rerun_resumes_the_first_record(api, kubeconfig, namespace, suspend):
    before = _spec_json(_kustomization(api, namespace, "serving", suspend))
    owner = ("Kustomization", "serving", namespace)
    paused = _sync(kubeconfig, "paused", owner, run_id="run-1")
    assert not paused.failed, paused.msg
    assert paused["changed"] is True and paused["previous"] is suspend and paused["paused_by_others"] is False
    live = api.get(KUSTOMIZATIONS % namespace + "/serving")
    assert live["spec"]["suspend"] is True and json.loads(live["metadata"]["annotations"][KEY])["previous"] is suspend
    again = _sync(kubeconfig, "paused", owner, run_id="run-2")
    assert again["changed"] is False and again["record"]["by"] == "run-1" and again["previous"] is suspend
    resumed = _sync(kubeconfig, "resumed", owner)
    assert not resumed.failed, resumed.msg
    after = api.get(KUSTOMIZATIONS % namespace + "/serving")
    assert _spec_json(after) == before and ("suspend" in after["spec"]) is (suspend is not None)
    assert KEY not in (after["metadata"].get("annotations") or {})


@pytest.mark.parametrize("kind", ["argocd", "flux"])
def test_a_sync_already_off_before_the_pause_is_still_off_after_the_resume(api, kubeconfig, namespace, kind):
    if kind == "argocd":
        before = _spec_json(_application(api, namespace, "serving", {"syncOptions": ["Validate=false"]}))
        owner, path = ("Application", "serving", namespace), APPS % namespace + "/serving"
    else:
        before = _spec_json(_kustomization(api, namespace, "serving", True))
        owner, path = ("Kustomization", "serving", namespace), KUSTOMIZATIONS % namespace + "/serving"
    paused = _sync(kubeconfig, "paused", owner, run_id="run-1")
    assert not paused.failed, paused.msg
    assert paused["changed"] is True and paused["paused_by_others"] is True  # the record is written all the same
    assert any("already off" in w for w in paused.warning_messages)
    assert _spec_json(api.get(path)) == before
    resumed = _sync(kubeconfig, "resumed", owner)
    assert resumed["changed"] is True and resumed["paused_by_others"] is True
    after = api.get(path)
    assert _spec_json(after) == before and KEY not in (after["metadata"].get("annotations") or {})


@pytest.mark.parametrize("state", ["paused", "resumed"])
def test_an_edit_between_the_read_and_the_write_fails_cleanly_with_nothing_written(api, kubeconfig, namespace, monkeypatch, state):
    _application(api, namespace, "serving", SYNC_POLICY)
    path = APPS % namespace + "/serving"
    owner = ("Application", "serving", namespace)
    if state == "resumed":
        assert not _sync(kubeconfig, "paused", owner, run_id="run-1").failed
    real_patch = sync_pause._patch  # pylint: disable=protected-access

    def someone_edits_first(api_client, owner_dict, ops, check_mode):
        # another writer changes the syncPolicy after the module read the Application and before its patch arrives
        live = api.get(path)
        policy = live["spec"]["syncPolicy"]
        policy["syncOptions"] = policy["syncOptions"] + ["PruneLast=true"]
        api.patch(path, {"spec": {"syncPolicy": policy}})
        return real_patch(api_client, owner_dict, ops, check_mode)

    monkeypatch.setattr(sync_pause, "_patch", someone_edits_first)
    result = _sync(kubeconfig, state, owner, run_id="run-2")
    assert result.failed and "changed between this run's read and its" in result.msg and "nothing was written" in result.msg
    assert result["field"] == "owner" and "run the task again" in result["fix"]
    live = api.get(path)
    assert "PruneLast=true" in live["spec"]["syncPolicy"]["syncOptions"]  # the other writer's edit stands
    if state == "paused":  # neither the record nor the switch-off was written
        assert KEY not in (live["metadata"].get("annotations") or {}) and live["spec"]["syncPolicy"]["automated"] == SYNC_POLICY["automated"]
    else:  # still paused, the record untouched
        assert json.loads(live["metadata"]["annotations"][KEY])["by"] == "run-1" and "automated" not in live["spec"]["syncPolicy"]
    monkeypatch.setattr(sync_pause, "_patch", real_patch)
    if state == "resumed":  # run again: it resumes, keeping the other writer's syncOptions and putting automated back
        again = _sync(kubeconfig, "resumed", owner)
        assert not again.failed and again["edited_while_paused"] is True
        assert api.get(path)["spec"]["syncPolicy"]["automated"] == SYNC_POLICY["automated"]


def test_helm_or_no_owner_is_refused_naming_the_fixes(api, kubeconfig, namespace):
    _isvc(api, namespace, "charted", {"labels": {"app.kubernetes.io/managed-by": "Helm"},
                                      "annotations": {"meta.helm.sh/release-name": "llm", "meta.helm.sh/release-namespace": namespace}})
    _isvc(api, namespace, "plain", {})
    for name, word in (("charted", "Helm release"), ("plain", "no GitOps owner")):
        result = _sync(kubeconfig, "paused", name=name, namespace=namespace, run_id="run-1")
        assert result.failed and word in result.msg and "rollback_mode: git" in result.msg and "rollback_mode: live" in result.msg


def _cluster_role(name):
    """A ClusterRole of docs/rbac/gitops-owner-reader.yaml (the file users apply)."""
    with open(os.path.join(REPO, "docs", "rbac", "gitops-owner-reader.yaml"), encoding="utf-8") as handle:
        items = yaml.safe_load(handle)["items"]
    return next(item for item in items if item["kind"] == "ClusterRole" and item["metadata"]["name"] == name)


def test_the_rbac_file_reader_alone_cannot_pause_and_its_pauser_role_can(api, controlplane, namespace):
    _kustomization(api, namespace, "serving", None)
    owner = ("Kustomization", "serving", namespace)
    reader = controlplane.kubeconfig_for_service_account(namespace, "spec-decoding")
    created = []
    try:
        for role in ("spec-decoding-gitops-owner-reader", "spec-decoding-gitops-sync-pauser"):
            body = _cluster_role(role)
            # cluster-scoped names are per test (the integration files share one control plane)
            body["metadata"]["name"] = "%s-%s" % (role, namespace)
            api.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", body)
            created.append(body["metadata"]["name"])
            api.post("/apis/rbac.authorization.k8s.io/v1/namespaces/%s/rolebindings" % namespace, {
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": body["metadata"]["name"]},
                "subjects": [{"kind": "ServiceAccount", "name": "spec-decoding", "namespace": namespace}]})
            result = _wait_for_rbac(reader, owner, expect_failure=role.endswith("reader"))
            if role.endswith("reader"):
                assert "patch kustomizations.kustomize.toolkit.fluxcd.io in namespace %s" % namespace in result.msg
                assert "spec-decoding-gitops-sync-pauser" in result.msg and "docs/rbac/gitops-owner-reader.yaml" in result.msg
                assert "suspend" not in api.get(KUSTOMIZATIONS % namespace + "/serving")["spec"]
            else:
                assert result["changed"] is True and api.get(KUSTOMIZATIONS % namespace + "/serving")["spec"]["suspend"] is True
                resumed = _sync(reader, "resumed", owner)
                assert not resumed.failed, resumed.msg
                assert "suspend" not in api.get(KUSTOMIZATIONS % namespace + "/serving")["spec"]
    finally:
        for name in created:
            api.delete("/apis/rbac.authorization.k8s.io/v1/clusterroles/" + name)


def _wait_for_rbac(kubeconfig, owner, expect_failure, timeout=10.0):
    """The pause as `kubeconfig`, once the new binding is in the authorizer's cache (a short poll, usually at once): a
    403 naming the verb (expect_failure) or a success."""
    deadline = time.monotonic() + timeout
    while True:
        result = _sync(kubeconfig, "paused", owner, run_id="run-1")
        # the reader's own GET is denied too until its binding reaches the authorizer: settled is the patch's denial
        settled = ("may not patch" in result.msg) if expect_failure else not result.failed
        if settled or time.monotonic() > deadline:
            assert settled, result.msg
            return result
        time.sleep(0.2)


def test_an_owner_that_does_not_exist_is_named(api, kubeconfig, namespace):  # pylint: disable=unused-argument
    result = _sync(kubeconfig, "resumed", ("Application", "gone", namespace))
    assert result.failed and "Application %s/gone not found" % namespace in result.msg and result["field"] == "owner"
