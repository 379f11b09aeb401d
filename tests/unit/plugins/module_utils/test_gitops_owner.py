"""Unit tests of gitops/owner.py and gitops/owner_info.py: the owner of objects as Argo CD 3, Flux v2 and Helm leave them,
the owner objects read (the API calls are a dict of paths: the real reads are tests/integration/test_gitops_owner.py), the
refusal text and the wait for a revision."""

import copy
import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner as O
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner_info
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from tests.fake_clock import FakeClock

SHA = "4f1c2d0e9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e"
OLD_SHA = "0123456789abcdef0123456789abcdef01234567"


def _isvc(labels=None, annotations=None, managers=()):
    """An InferenceService as the API server returns it, with managedFields as each tool's apply leaves them."""
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "llama", "namespace": "models", "generation": 3, "resourceVersion": "812",
                         "labels": dict(labels or {}), "annotations": dict(annotations or {}),
                         "managedFields": [{"manager": m, "operation": op, "apiVersion": "serving.kserve.io/v1beta1",
                                            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}} for m, op in managers]},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "huggingface"}}}}}


# Argo CD 3: annotation tracking (the default), server-side or client-side apply as argocd-controller.
ARGO_ISVC = _isvc(annotations={"argocd.argoproj.io/tracking-id": "llm-serving:serving.kserve.io/InferenceService:models/llama"},
                  managers=[("argocd-controller", "Apply"), ("manager", "Update")])
# An Application in another namespace ("apps in any namespace"): <app namespace>_<app>.
ARGO_ISVC_APPNS = _isvc(annotations={"argocd.argoproj.io/tracking-id": "team-a_llm-serving:serving.kserve.io/InferenceService:models/llama"},
                        managers=[("argocd-controller", "Update")])
# Label tracking (application.resourceTrackingMethod: label) with an installation id.
ARGO_LABEL_ISVC = _isvc(labels={"app.kubernetes.io/instance": "llm-serving"},
                        annotations={"argocd.argoproj.io/installation-id": "prod-argocd"}, managers=[("argocd-controller", "Update")])
# Flux v2 kustomize-controller: its owner labels and field manager (server-side apply).
FLUX_ISVC = _isvc(labels={"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"},
                  managers=[("kustomize-controller", "Apply"), ("manager", "Update")])
# Flux helm-controller: its labels plus what the Helm SDK it uses writes.
FLUX_HELM_ISVC = _isvc(labels={"helm.toolkit.fluxcd.io/name": "llama", "helm.toolkit.fluxcd.io/namespace": "models",
                               "app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "llama"},
                       annotations={"meta.helm.sh/release-name": "llama", "meta.helm.sh/release-namespace": "models"},
                       managers=[("helm-controller", "Update")])
# `helm install`: Helm's ownership annotations and label, field manager helm.
HELM_ISVC = _isvc(labels={"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "llama"},
                  annotations={"meta.helm.sh/release-name": "llama", "meta.helm.sh/release-namespace": "models"},
                  managers=[("helm", "Update")])
# The collection's own deploy (server-side apply) and KServe's controller: no owner.
PLAIN_ISVC = _isvc(labels={"app.kubernetes.io/instance": "llama"}, managers=[("alauda-spec-decoding", "Apply"), ("manager", "Update")])

APPLICATION = {
    "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
    "metadata": {"name": "llm-serving", "namespace": "argocd", "generation": 7},
    "spec": {"project": "default",
             "source": {"repoURL": "https://git.example.com/platform/serving.git", "path": "models/llama", "targetRevision": "main"},
             "destination": {"server": "https://kubernetes.default.svc", "namespace": "models"},
             "syncPolicy": {"automated": {"prune": True, "selfHeal": True}, "syncOptions": ["ServerSideApply=true"]}},
    "status": {"sync": {"status": "Synced", "revision": SHA,
                        "comparedTo": {"source": {"repoURL": "https://git.example.com/platform/serving.git", "path": "models/llama",
                                                  "targetRevision": "main"}}},
               "health": {"status": "Healthy"},
               "operationState": {"phase": "Succeeded", "message": "successfully synced (all tasks run)",
                                  "syncResult": {"revision": SHA}}},
}
KUSTOMIZATION = {
    "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
    "metadata": {"name": "apps", "namespace": "flux-system", "generation": 2},
    "spec": {"interval": "10m", "path": "./clusters/prod/models", "prune": True,
             "sourceRef": {"kind": "GitRepository", "name": "serving"}},
    "status": {"observedGeneration": 2, "lastAppliedRevision": "main@sha1:" + SHA, "lastAttemptedRevision": "main@sha1:" + SHA,
               "conditions": [{"type": "Ready", "status": "True", "reason": "ReconciliationSucceeded",
                               "message": "Applied revision: main@sha1:" + SHA}]},
}
GITREPOSITORY = {
    "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
    "metadata": {"name": "serving", "namespace": "flux-system"},
    "spec": {"interval": "1m", "url": "ssh://git@git.example.com/platform/serving.git", "ref": {"branch": "main"}},
    "status": {"artifact": {"revision": "main@sha1:" + SHA, "digest": "sha256:" + "a" * 64}},
}
HELMRELEASE = {
    "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease", "metadata": {"name": "llama", "namespace": "models"},
    "spec": {"interval": "5m", "chart": {"spec": {"chart": "llm-serving", "version": "1.4.x",
                                                  "sourceRef": {"kind": "HelmRepository", "name": "charts", "namespace": "flux-system"}}},
             "driftDetection": {"mode": "enabled"}},
    "status": {"conditions": [{"type": "Ready", "status": "True", "message": "Helm upgrade succeeded"}]},
}

APP_PATH = "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/llm-serving"
KS_PATH = "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/apps"
GR_PATH = "/apis/source.toolkit.fluxcd.io/v1/namespaces/flux-system/gitrepositories/serving"
HR_PATH = "/apis/helm.toolkit.fluxcd.io/v2/namespaces/models/helmreleases/llama"
ISVC_PATH = "/apis/serving.kserve.io/v1beta1/namespaces/models/inferenceservices/llama"


class FakeApiError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.reason, self.body = status, message, json.dumps({"message": message})


class Objects:
    """The API by path: a dict path -> object (or an int: that HTTP error); records the calls."""

    def __init__(self, objects):
        self.objects, self.calls = dict(objects), []

    def request(self, _api_client, method, path, **_kwargs):
        self.calls.append((method, path))
        found = self.objects.get(path, 404)
        if isinstance(found, int):
            raise FakeApiError(found, "forbidden: User \"system:serviceaccount:models:rollback\" cannot get resource" if found == 403
                               else "not found")
        return copy.deepcopy(found)


@pytest.fixture
def api(monkeypatch):
    fake = Objects({})
    monkeypatch.setattr(kube_client, "request", fake.request)
    return fake


def test_owner_of_argocd_annotation_tracking():
    owner = O.owner_of(ARGO_ISVC)
    assert (owner["kind"], owner["namespace"], owner["name"]) == ("argocd", "argocd", "llm-serving")
    assert owner["evidence"] == ["annotation argocd.argoproj.io/tracking-id=llm-serving:serving.kserve.io/InferenceService:models/llama",
                                 "field manager argocd-controller"]
    assert owner["field_managers"] == ["argocd-controller"]
    assert owner["readable"] is None and owner["sync"]["automated"] is False and owner["source"] is None


def test_owner_of_argocd_app_in_other_namespace_and_configured_control_plane():
    assert (O.owner_of(ARGO_ISVC_APPNS)["namespace"], O.owner_of(ARGO_ISVC_APPNS)["name"]) == ("team-a", "llm-serving")
    assert O.owner_of(ARGO_ISVC, argocd_namespace="gitops")["namespace"] == "gitops"


def test_owner_of_argocd_label_tracking_needs_argo_evidence():
    owner = O.owner_of(ARGO_LABEL_ISVC)
    assert (owner["kind"], owner["name"]) == ("argocd", "llm-serving")
    assert "annotation argocd.argoproj.io/installation-id=prod-argocd" in owner["evidence"]
    # the same label set by a chart or a kustomize base, nothing of Argo CD's: no owner
    assert O.owner_of(PLAIN_ISVC)["kind"] == "none"
    assert O.owner_of(PLAIN_ISVC)["field_managers"] == []


def test_owner_of_copied_tracking_id_is_said():
    obj = copy.deepcopy(ARGO_ISVC)
    obj["metadata"]["name"] = "llama-copy"
    owner = O.owner_of(obj)
    assert owner["kind"] == "argocd"
    assert any("names serving.kserve.io/InferenceService:models/llama, not this object" in e for e in owner["evidence"])


def test_owner_of_flux_kustomization():
    owner = O.owner_of(FLUX_ISVC)
    assert (owner["kind"], owner["namespace"], owner["name"]) == ("flux", "flux-system", "apps")
    assert owner["evidence"] == ["label kustomize.toolkit.fluxcd.io/name=apps", "label kustomize.toolkit.fluxcd.io/namespace=flux-system",
                                 "field manager kustomize-controller"]


def test_owner_of_flux_helmrelease_before_its_helm_annotations():
    owner = O.owner_of(FLUX_HELM_ISVC)
    assert (owner["kind"], owner["namespace"], owner["name"]) == ("helm", "models", "llama")
    assert O.describe(owner) == "Flux HelmRelease models/llama"


def test_owner_of_plain_helm():
    owner = O.owner_of(HELM_ISVC)
    assert (owner["kind"], owner["namespace"], owner["name"]) == ("helm", "models", "llama")
    assert owner["field_managers"] == ["helm"]
    assert O.describe(owner) == "Helm release models/llama"


def test_owner_of_field_manager_alone():
    owner = O.owner_of(_isvc(managers=[("kustomize-controller", "Apply")]))
    assert (owner["kind"], owner["name"]) == ("flux", None)
    assert O.describe(owner) == "Flux Kustomization (name unknown)"


@pytest.mark.parametrize("text, sha", [
    ("main@sha1:" + SHA, SHA), ("sha1:" + SHA, SHA), (SHA, SHA), ("main/" + SHA, SHA), (SHA.upper(), SHA),
    ("v1.2.0@sha256:" + "b" * 64, "b" * 64), ("main", None), ("", None), (None, None), ("main@sha1:abc", None),
])
def test_revision_sha(text, sha):
    assert O.revision_sha(text) == sha


def test_read_owner_argocd(api):
    api.objects[APP_PATH] = APPLICATION
    owner = O.read_owner(None, ARGO_ISVC)
    assert api.calls == [("GET", APP_PATH)]
    assert owner["readable"] is True and owner["read_error"] is None
    assert owner["sync"] == {"automated": True, "self_heal": True, "prune": True, "suspended": False, "interval": None}
    assert owner["source"] == {"repo_url": "https://git.example.com/platform/serving.git", "revision": "main", "path": "models/llama",
                               "source_kind": "Application", "source_name": "llm-serving", "source_namespace": "argocd"}
    assert owner["synced_revision"] == owner["fetched_revision"] == SHA
    assert O.summary(owner) == ("owner: Argo CD Application argocd/llm-serving (automated, selfHeal, prune) from "
                                "https://git.example.com/platform/serving.git models/llama@" + SHA)


def test_read_owner_argocd_out_of_sync_disabled_automation_and_paused(api):
    app = copy.deepcopy(APPLICATION)
    app["spec"]["syncPolicy"] = {"automated": {"enabled": False, "selfHeal": True}}
    app["status"]["sync"] = {"status": "OutOfSync", "revision": OLD_SHA}
    app["metadata"]["annotations"] = {O.PAUSED_SYNC_ANNOTATION: '{"kind": "argocd", "previous": {"automated": {"selfHeal": true}}, '
                                                                '"by": "run-1", "at": "2026-12-05T13:00:00Z"}'}
    api.objects[APP_PATH] = app
    owner = O.read_owner(None, ARGO_ISVC)
    assert owner["sync"]["automated"] is False and owner["sync"]["self_heal"] is False
    assert owner["synced_revision"] is None and owner["fetched_revision"] == OLD_SHA
    assert owner["paused_by_collection"]["previous"] == {"automated": {"selfHeal": True}}
    assert O.policy_text(owner) == "manual sync"


def test_read_owner_argocd_automated_empty_object_means_automated(api):
    app = copy.deepcopy(APPLICATION)
    app["spec"]["syncPolicy"] = {"automated": {}}
    api.objects[APP_PATH] = app
    owner = O.read_owner(None, ARGO_ISVC)
    assert owner["sync"]["automated"] is True and owner["sync"]["self_heal"] is False
    assert O.policy_text(owner) == "automated"


def test_read_owner_flux_with_its_gitrepository(api):
    api.objects.update({KS_PATH: KUSTOMIZATION, GR_PATH: GITREPOSITORY})
    owner = O.read_owner(None, FLUX_ISVC)
    assert api.calls == [("GET", KS_PATH), ("GET", GR_PATH)]
    assert owner["sync"] == {"automated": True, "self_heal": True, "prune": True, "suspended": False, "interval": "10m"}
    assert owner["source"] == {"repo_url": "ssh://git@git.example.com/platform/serving.git", "revision": "main",
                               "path": "./clusters/prod/models", "source_kind": "GitRepository", "source_name": "serving",
                               "source_namespace": "flux-system"}
    assert owner["synced_revision"] == owner["fetched_revision"] == SHA
    assert O.summary(owner) == ("owner: Flux Kustomization flux-system/apps (interval 10m, corrects drift) from "
                                "ssh://git@git.example.com/platform/serving.git ./clusters/prod/models@" + SHA)


def test_read_owner_flux_suspended_and_gitrepository_forbidden(api):
    ks = copy.deepcopy(KUSTOMIZATION)
    ks["spec"]["suspend"] = True
    api.objects.update({KS_PATH: ks, GR_PATH: 403})
    owner = O.read_owner(None, FLUX_ISVC)
    assert owner["readable"] is True and owner["sync"]["suspended"] is True and owner["sync"]["automated"] is False
    assert owner["read_error"].startswith("403 Forbidden: cannot get GitRepository flux-system/serving")
    assert "docs/rbac/gitops-owner-reader.yaml" in owner["read_error"]
    assert owner["fetched_revision"] is None and owner["synced_revision"] == SHA
    assert not O.undoes_live_writes(owner)


def test_read_owner_flux_helmrelease(api):
    api.objects[HR_PATH] = HELMRELEASE
    owner = O.read_owner(None, FLUX_HELM_ISVC)
    assert owner["readable"] is True and owner["sync"]["self_heal"] is True and owner["sync"]["interval"] == "5m"
    assert owner["source"]["path"] == "llm-serving" and owner["source"]["source_kind"] == "HelmRepository"


def test_read_owner_plain_helm_reads_nothing(api):
    owner = O.read_owner(None, HELM_ISVC)
    assert api.calls == [] and owner["readable"] is None and owner["sync"]["automated"] is False


def test_read_owner_forbidden_and_gone_never_raise(api):
    api.objects[APP_PATH] = 403
    owner = O.read_owner(None, ARGO_ISVC)
    assert owner["readable"] is False
    assert owner["read_error"].startswith("403 Forbidden: cannot get Application argocd/llm-serving: forbidden")
    assert owner["read_error"].endswith("(add the RBAC in docs/rbac/gitops-owner-reader.yaml)")
    del api.objects[APP_PATH]
    owner = O.read_owner(None, ARGO_ISVC)
    assert owner["readable"] is False and "404 Not Found: Application argocd/llm-serving does not exist" in owner["read_error"]
    assert O.undoes_live_writes(owner)  # unknown counts as yes


def test_read_owner_of_unowned_object_makes_no_call(api):
    owner = O.read_owner(None, PLAIN_ISVC)
    assert owner == O.empty_owner() and api.calls == []


def test_refusal_names_owner_policy_source_and_both_fixes(api):
    api.objects[APP_PATH] = APPLICATION
    owner = O.read_owner(None, ARGO_ISVC)
    with pytest.raises(ValidationError) as err:
        O.refuse_live_write(owner, "refuse", "InferenceService models/llama")
    text = str(err.value)
    assert text.startswith("gitops_owner: Argo CD Application argocd/llm-serving (automated, selfHeal, prune) syncs InferenceService "
                           "models/llama from https://git.example.com/platform/serving.git models/llama@%s: a live patch is undone "
                           "at its next sync; nothing was written" % SHA)
    assert "rollback_mode: git" in text and "rollback_mode: emergency" in text and "gitops_owner: ignore" in text
    assert err.value.field == "gitops_owner"


def test_refusal_of_unreadable_owner_says_why(api):
    api.objects[APP_PATH] = 403
    with pytest.raises(ValidationError) as err:
        O.check_live_write("api-client", ARGO_ISVC, "refuse", "InferenceService models/llama")
    assert "Argo CD Application argocd/llm-serving (policy unknown: 403 Forbidden" in str(err.value)


def test_ignore_warns_and_none_passes(api):
    api.objects.update({KS_PATH: KUSTOMIZATION, GR_PATH: GITREPOSITORY})
    warnings = []
    owner = O.check_live_write("api-client", FLUX_ISVC, "ignore", "InferenceService models/llama", warn=warnings.append)
    assert owner["kind"] == "flux"
    assert warnings == ["gitops_owner=ignore: Flux Kustomization flux-system/apps (interval 10m, corrects drift) syncs InferenceService "
                        "models/llama from ssh://git@git.example.com/platform/serving.git ./clusters/prod/models@%s: a live patch is "
                        "undone at its next sync" % SHA]
    assert O.check_live_write("api-client", PLAIN_ISVC, "refuse", "InferenceService models/llama")["kind"] == "none"
    assert O.refuse_live_write(O.empty_owner(), "refuse", "x") is None


def test_refusal_of_plain_helm():
    with pytest.raises(ValidationError, match="Helm release models/llama .* manages InferenceService models/llama: a live patch is "
                                              "undone at the next helm upgrade"):
        O.refuse_live_write(O.owner_of(HELM_ISVC), "refuse", "InferenceService models/llama")


def _params(**more):
    out = {"kind": "InferenceService", "namespace": "models", "name": "llama", "api_version": None, "argocd_namespace": "argocd",
           "revision": None, "fetched": False, "wait": False, "wait_timeout": 30, "wait_sleep": 2}
    out.update(more)
    return out


def test_owner_info_without_revision(api):
    api.objects.update({ISVC_PATH: ARGO_ISVC, APP_PATH: APPLICATION})
    result = owner_info.owner_info(None, _params())
    assert result["managed"] is True and result["resource_generation"] == 3 and result["owner"]["readable"] is True
    assert "revision_synced" not in result


def test_owner_info_waits_for_argocd_sync(api):
    app = copy.deepcopy(APPLICATION)
    app["status"]["sync"] = {"status": "OutOfSync", "revision": OLD_SHA}
    api.objects.update({ISVC_PATH: ARGO_ISVC, APP_PATH: app})
    clock = FakeClock()
    reads = []

    def sleep(seconds):
        clock.sleep(seconds)
        reads.append(seconds)
        if len(reads) == 2:  # the owner fetched the commit, not applied yet
            api.objects[APP_PATH] = dict(app, status={"sync": {"status": "OutOfSync", "revision": SHA}})
        if len(reads) == 3:
            api.objects[APP_PATH] = APPLICATION
            api.objects[ISVC_PATH] = dict(ARGO_ISVC, metadata=dict(ARGO_ISVC["metadata"], generation=4))
    result = owner_info.owner_info(None, _params(revision=SHA, wait=True), clock=clock, sleep=sleep)
    assert result["revision_synced"] is True and reads == [2, 2, 2] and result["elapsed"] == 6
    assert result["resource_generation"] == 4


def test_owner_info_fetched_only_for_a_paused_flux_owner(api):
    ks = copy.deepcopy(KUSTOMIZATION)
    ks["spec"]["suspend"] = True
    ks["status"]["lastAppliedRevision"] = "main@sha1:" + OLD_SHA
    api.objects.update({ISVC_PATH: FLUX_ISVC, KS_PATH: ks, GR_PATH: GITREPOSITORY})
    result = owner_info.owner_info(None, _params(revision=SHA, wait=True, fetched=True), clock=FakeClock(), sleep=FakeClock().sleep)
    assert result["revision_synced"] is True and result["elapsed"] == 0
    # not applied: the synced wait would not pass
    assert owner_info.has_revision(result["owner"], SHA) is False


def test_owner_info_timeout_names_the_last_status(api):
    ks = copy.deepcopy(KUSTOMIZATION)
    ks["status"]["lastAttemptedRevision"] = "main@sha1:" + SHA
    ks["status"]["lastAppliedRevision"] = "main@sha1:" + OLD_SHA
    ks["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "ReconciliationFailed",
                                   "message": "InferenceService/models/llama dry-run failed: admission webhook denied"}]
    api.objects.update({ISVC_PATH: FLUX_ISVC, KS_PATH: ks, GR_PATH: GITREPOSITORY})
    clock = FakeClock()
    with pytest.raises(SpecDecodingError) as err:
        owner_info.owner_info(None, _params(revision=SHA, wait=True, wait_timeout=10), clock=clock, sleep=clock.sleep)
    text = str(err.value)
    assert "Flux Kustomization flux-system/apps has not synced commit %s after 10s" % SHA in text
    assert "Ready=False (ReconciliationFailed: InferenceService/models/llama dry-run failed" in text
    assert "lastAppliedRevision main@sha1:" + OLD_SHA in text
    assert clock.sleeps == [2, 2, 2, 2, 2]


def test_owner_info_refusals(api):
    api.objects.update({ISVC_PATH: PLAIN_ISVC})
    with pytest.raises(ValidationError, match="revision: must be a full commit sha"):
        owner_info.owner_info(None, _params(revision="main"))
    with pytest.raises(ValidationError, match="wait needs the commit"):
        owner_info.owner_info(None, _params(wait=True))
    with pytest.raises(ValidationError, match="no owner: there is no Git sync to wait for"):
        owner_info.owner_info(None, _params(revision=SHA, wait=True))
    api.objects[APP_PATH] = 403
    api.objects[ISVC_PATH] = ARGO_ISVC
    with pytest.raises(SpecDecodingError, match="cannot wait for Argo CD Application argocd/llm-serving to have synced commit .*403"):
        owner_info.owner_info(None, _params(revision=SHA, wait=True))
    with pytest.raises(ValidationError, match="InferenceService models/other not found"):
        owner_info.owner_info(None, _params(name="other"))


# The live writers call check_live_write with the object they have read: draft removal and the troubleshoot bundle here,
# isvc_speculative and canary_rollout on the test bed (tests/integration/test_gitops_owner.py).

class _DraftCluster:
    """draft_removal.execute's cluster: the rolled-back InferenceService, writes recorded."""

    def __init__(self, isvc):
        self.api_client, self.isvc, self.writes = "api-client", isvc, []

    def get_isvc(self):
        return copy.deepcopy(self.isvc)

    def patch_isvc(self, ops, dry_run=False):
        self.writes.append(ops)
        return self.isvc


def _rolled_back(annotations):
    import os  # pylint: disable=import-outside-toplevel
    import yaml  # pylint: disable=import-outside-toplevel
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "rollback", "guide_example2_eagle3.rolled_back.yaml"),
              encoding="utf-8") as fh:
        isvc = yaml.safe_load(fh)
    isvc["metadata"].update(namespace="models", generation=2, annotations=dict(isvc["metadata"].get("annotations") or {}, **annotations))
    isvc["status"] = {"observedGeneration": 2, "conditions": [{"type": "Ready", "status": "True"}]}
    return isvc


def test_draft_removal_of_a_flux_object_is_refused_before_the_patch(api):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_removal  # pylint: disable=import-outside-toplevel
    api.objects.update({KS_PATH: KUSTOMIZATION, GR_PATH: GITREPOSITORY})
    isvc = _rolled_back({})
    isvc["metadata"]["labels"] = dict(FLUX_ISVC["metadata"]["labels"])
    cluster = _DraftCluster(isvc)
    params = {"draft_path": "/mnt/models/draft", "namespace": "models", "name": isvc["metadata"]["name"], "wait": False}
    with pytest.raises(ValidationError, match="gitops_owner: Flux Kustomization flux-system/apps .* syncs InferenceService models/"):
        draft_removal.execute(params, cluster)
    assert cluster.writes == []
    warnings = []
    result = draft_removal.execute(dict(params, gitops_owner="ignore"), cluster, warn=warnings.append)
    assert result["changed"] is True and len(cluster.writes) == 1 and warnings[0].startswith("gitops_owner=ignore: Flux Kustomization")


def test_troubleshoot_bundle_says_the_owner():
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import troubleshoot  # pylint: disable=import-outside-toplevel
    owner = O.owner_of(HELM_ISVC)
    snap = {"namespace": "models", "name": "llama", "isvc": HELM_ISVC, "pods": [], "events": [], "deployments": [], "logs": {},
            "owner": owner}
    assert "- owner: Helm release models/llama (no controller: applied at helm install/upgrade)" in troubleshoot.service_summary(snap, []).splitlines()
    files = troubleshoot._files_for(snap, [], [])  # pylint: disable=protected-access
    assert json.loads(files["models/llama/owner.json"])["evidence"][0] == "annotation meta.helm.sh/release-name=llama"
