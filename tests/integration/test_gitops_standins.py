"""The GitOps test bed pinned to what Argo CD and Flux document (issue #47): the loopback Git server, the real CRDs,
and the stand-in controllers (tests/testbed/argocd_standin.py, flux_standin.py). Waits are short polls of the API."""
# pylint: disable=redefined-outer-name  # pytest fixtures are parameters named like the fixture functions
from __future__ import annotations

import tempfile
import uuid

import pytest

from tests.testbed.git_server import GitServerError, git
from tests.testbed.gitops_standin import wait_for
from tests.testbed.rest import ApiError

ARGO = "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications"
GITREPOS = "/apis/source.toolkit.fluxcd.io/v1/namespaces/{ns}/gitrepositories"
KUSTS = "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/{ns}/kustomizations"
ISVCS = "/apis/serving.kserve.io/v1beta1/namespaces/{ns}/inferenceservices"


def configmap(ns: str, value: str, name: str = "settings") -> str:
    return (f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\n"
            f"data:\n  mode: \"{value}\"\n  keep: \"yes\"\n")


@pytest.fixture
def api(controlplane):
    client = controlplane.rest()
    yield client
    client.close()


@pytest.fixture
def repo(git_server):
    return f"r-{uuid.uuid4().hex[:8]}"


def get_or_none(api, path):
    try:
        return api.get(path)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def cm_value(api, ns, name="settings"):
    obj = get_or_none(api, f"/api/v1/namespaces/{ns}/configmaps/{name}")
    return obj and obj["data"].get("mode")


def managers(obj) -> set:
    return {entry["manager"] for entry in obj["metadata"].get("managedFields") or []}


@pytest.fixture
def application(api, argocd, namespace):
    """create(spec) -> the Application's path; deleted after the test."""
    made = []

    def create(spec: dict) -> str:
        name = f"app-{uuid.uuid4().hex[:8]}"
        api.post(ARGO, {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                        "metadata": {"name": name, "namespace": "argocd"}, "spec": spec})
        made.append(name)
        return f"{ARGO}/{name}"

    yield create
    for name in made:
        api.delete(f"{ARGO}/{name}")


def argo_spec(git_server, repo, ns, sync_policy, path="deploy"):
    spec = {"project": "default", "source": {"repoURL": git_server.git_url(repo), "targetRevision": "main", "path": path},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": ns}}
    if sync_policy is not None:
        spec["syncPolicy"] = sync_policy
    return spec


def app_status(api, path):
    return api.get(path).get("status") or {}


# ------------------------------------------------------------------------------------------------ Git server
def test_git_server_http_auth_protected_branch_and_concurrent_commit(git_server, repo):
    first = git_server.create_repo(repo, {"deploy/cm.yaml": "a: 1\n"})
    assert git_server.head(repo) == first
    with tempfile.TemporaryDirectory() as work:
        with pytest.raises(GitServerError, match="could not read Username|Authentication failed"):
            git("clone", "-q", git_server.http_url(repo), f"{work}/anon")
        git("clone", "-q", git_server.http_url(repo), f"{work}/c", env=git_server.auth_env())
        other = git_server.commit_file(repo, "main", "deploy/other.yaml", "b: 2\n", "another user's commit")
        with open(f"{work}/c/deploy/cm.yaml", "w", encoding="utf-8") as fh:
            fh.write("a: 2\n")
        git("commit", "-qam", "mine", cwd=f"{work}/c")
        with pytest.raises(GitServerError, match=r"\[rejected\].*fetch first|non-fast-forward"):
            git("push", "-q", "origin", "main", cwd=f"{work}/c", env=git_server.auth_env())
        git("pull", "-q", "--rebase", "origin", "main", cwd=f"{work}/c", env=git_server.auth_env())
        git("push", "-q", "origin", "main", cwd=f"{work}/c", env=git_server.auth_env())
        assert git_server.log(repo)[1]["sha"] == other and git_server.changed_files(repo, "main") == ["deploy/cm.yaml"]
        git_server.protect(repo, "main")
        git("commit", "-q", "--allow-empty", "-m", "again", cwd=f"{work}/c")
        with pytest.raises(GitServerError, match="GH006: Protected branch update failed for refs/heads/main"):
            git("push", "-q", git_server.git_url(repo), "main", cwd=f"{work}/c")  # git:// anonymous push, declined
        git("push", "-q", git_server.git_url(repo), "HEAD:review", cwd=f"{work}/c")
        assert "review" in git_server.branches(repo) and git_server.head(repo, "review") != git_server.head(repo)
    assert git_server.auth_failures >= 1


# ------------------------------------------------------------------------------------------------ Argo CD
def test_argocd_automated_self_heal_syncs_head_and_corrects_drift(api, argocd, git_server, repo, namespace, application):
    head = git_server.create_repo(repo, {"deploy/cm.yaml": configmap(namespace, "one")})
    path = application(argo_spec(git_server, repo, namespace, {"automated": {"selfHeal": True, "prune": False}}))
    wait_for(lambda: cm_value(api, namespace) == "one", what="first sync")
    live = api.get(f"/api/v1/namespaces/{namespace}/configmaps/settings")
    assert "argocd-controller" in managers(live)
    app_name = path.rsplit("/", 1)[1]
    assert live["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"] == f"{app_name}:/ConfigMap:{namespace}/settings"
    status = wait_for(lambda: (s := app_status(api, path)).get("sync", {}).get("status") == "Synced" and s,
                      what=lambda: f"Synced (stand-in errors: {argocd.errors[-3:]})")
    assert status["sync"]["revision"] == head
    assert status["operationState"]["phase"] == "Succeeded"
    assert status["operationState"]["syncResult"]["revision"] == head

    # Drift at an unchanged commit: selfHeal applies the render again.
    api.patch(f"/api/v1/namespaces/{namespace}/configmaps/settings", {"data": {"mode": "edited-live"}})
    wait_for(lambda: cm_value(api, namespace) == "one", what="self-heal")

    # A new commit on the branch is synced.
    new = git_server.commit_file(repo, "main", "deploy/cm.yaml", configmap(namespace, "two"))
    wait_for(lambda: cm_value(api, namespace) == "two", what="sync of the new commit")
    wait_for(lambda: app_status(api, path).get("operationState", {}).get("syncResult", {}).get("revision") == new,
             what="syncResult.revision")
    assert app_status(api, path)["sync"]["revision"] == new


def test_argocd_automated_without_self_heal_leaves_drift(request, api, argocd, git_server, repo, namespace, application):
    target = f"{namespace[:50]}-dst"  # does not exist yet: syncOptions CreateNamespace=true makes it
    request.addfinalizer(lambda: api.delete(f"/api/v1/namespaces/{target}"))
    head = git_server.create_repo(repo, {"deploy/cm.yaml": configmap(target, "one")})
    path = application(argo_spec(git_server, repo, target, {"automated": {}, "syncOptions": ["CreateNamespace=true"]}))
    wait_for(lambda: app_status(api, path).get("sync", {}).get("status") == "Synced", what="Synced")
    api.patch(f"/api/v1/namespaces/{target}/configmaps/settings", {"data": {"mode": "edited-live"}})
    # the stand-in refreshes every second; 60 s because a loaded 2-core machine once kept it from that for 20 s
    wait_for(lambda: app_status(api, path)["sync"]["status"] == "OutOfSync", timeout=60.0,
             what=lambda: "OutOfSync after drift (status %s; its last sync %s; the live data %s; the stand-in's passes %s, its last errors %s)" % (
                 app_status(api, path).get("sync"),
                 {k: v for k, v in (app_status(api, path).get("operationState") or {}).items() if k in ("phase", "startedAt", "finishedAt")},
                 api.get(f"/api/v1/namespaces/{target}/configmaps/settings").get("data"), argocd.passes(), argocd.errors[-3:]))
    argocd.wait_idle()
    argocd.wait_idle()
    assert cm_value(api, target) == "edited-live"
    status = app_status(api, path)
    assert status["sync"]["revision"] == head and status["operationState"]["syncResult"]["revision"] == head


def test_argocd_without_automated_refreshes_only(api, argocd, git_server, repo, namespace, application):
    head = git_server.create_repo(repo, {"deploy/cm.yaml": configmap(namespace, "one")})
    path = application(argo_spec(git_server, repo, namespace, {"automated": {"enabled": False, "selfHeal": True}}))
    status = wait_for(lambda: (s := app_status(api, path)).get("sync", {}).get("revision") and s, what="refresh")
    assert status["sync"] == {**status["sync"], "status": "OutOfSync", "revision": head}
    assert "operationState" not in status
    argocd.wait_idle()
    assert cm_value(api, namespace) is None


# ------------------------------------------------------------------------------------------------ Flux
def make_flux(api, git_server, repo, ns, path="./deploy", interval="1s"):
    """GitRepository `src` (http:// with a Basic-auth Secret: the CRD takes http, https and ssh URLs only) and
    Kustomization `app`; returns the Kustomization's path."""
    api.post(f"/api/v1/namespaces/{ns}/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "git-auth"},
                                                  "stringData": {"username": git_server.username, "password": git_server.token}})
    api.post(GITREPOS.format(ns=ns), {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
                                      "metadata": {"name": "src", "namespace": ns},
                                      "spec": {"url": git_server.http_url(repo), "ref": {"branch": "main"}, "interval": interval,
                                               "secretRef": {"name": "git-auth"}}})
    api.post(KUSTS.format(ns=ns), {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                                   "metadata": {"name": "app", "namespace": ns},
                                   "spec": {"sourceRef": {"kind": "GitRepository", "name": "src"}, "path": path,
                                            "interval": interval, "prune": True}})
    return f"{KUSTS.format(ns=ns)}/app"


def test_flux_applies_corrects_drift_and_honours_suspend(api, flux, git_server, repo, namespace):
    head = git_server.create_repo(repo, {"deploy/cm.yaml": configmap(namespace, "one")})  # no kustomization: generated
    kust = make_flux(api, git_server, repo, namespace)
    wait_for(lambda: cm_value(api, namespace) == "one", what="first apply")
    live = api.get(f"/api/v1/namespaces/{namespace}/configmaps/settings")
    assert "kustomize-controller" in managers(live)
    assert live["metadata"]["labels"] == {"kustomize.toolkit.fluxcd.io/name": "app",
                                          "kustomize.toolkit.fluxcd.io/namespace": namespace}
    status = wait_for(lambda: (s := api.get(kust).get("status") or {}).get("lastAppliedRevision") and s, what="status")
    assert status["lastAppliedRevision"] == status["lastAttemptedRevision"] == f"main@sha1:{head}"
    assert status["observedGeneration"] == api.get(kust)["metadata"]["generation"]
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == ("True", "ReconciliationSucceeded", f"Applied revision: main@sha1:{head}")
    source = api.get(f"{GITREPOS.format(ns=namespace)}/src")["status"]
    assert source["artifact"]["revision"] == f"main@sha1:{head}"
    assert {c["type"]: c["status"] for c in source["conditions"]}["Ready"] == "True"

    # Drift is corrected at the next interval.
    api.patch(f"/api/v1/namespaces/{namespace}/configmaps/settings", {"data": {"mode": "edited-live"}})
    wait_for(lambda: cm_value(api, namespace) == "one", what="drift correction")

    # Suspended: neither drift nor a new commit is applied, the status stays.
    api.patch(kust, {"spec": {"suspend": True}})
    flux.wait_idle()
    before = api.get(kust)["status"]
    new = git_server.commit_file(repo, "main", "deploy/cm.yaml", configmap(namespace, "two"))
    api.patch(f"/api/v1/namespaces/{namespace}/configmaps/settings", {"data": {"mode": "edited-live"}})
    wait_for(lambda: api.get(f"{GITREPOS.format(ns=namespace)}/src")["status"]["artifact"]["revision"] == f"main@sha1:{new}",
             what="source sees the new commit")
    flux.wait_idle()
    flux.wait_idle()
    assert cm_value(api, namespace) == "edited-live"
    assert api.get(kust)["status"] == before

    # Resumed: the new commit is applied.
    api.patch(kust, {"spec": {"suspend": None}})
    wait_for(lambda: cm_value(api, namespace) == "two", what="apply after resume")
    wait_for(lambda: api.get(kust)["status"]["lastAppliedRevision"] == f"main@sha1:{new}", what="lastAppliedRevision")


# ------------------------------------------------------------------------------------------------ kustomize overlays
ISVC_BASE = """apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata:
  name: llm
spec:
  predictor:
    model:
      modelFormat:
        name: huggingface
      args:
        - --max-model-len=2048
      resources:
        limits:
          cpu: "2"
"""
OVERLAY = """apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: {ns}
resources:
  - ../../base
patches:
  - path: speculative.yaml
  - target:
      kind: InferenceService
      name: llm
    patch: |-
      - op: replace
        path: /spec/predictor/model/resources/limits/cpu
        value: "4"
"""
SMP = """apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata:
  name: llm
  annotations:
    example.com/overlay: prod
spec:
  predictor:
    model:
      args:
        - --max-model-len=2048
        - --speculative-config={"method":"ngram","num_speculative_tokens":4}
"""


@pytest.mark.parametrize("controller", ["argocd", "flux"])
def test_kustomize_overlay_with_strategic_merge_and_json6902_patches(request, api, git_server, repo, namespace, controller):
    head = git_server.create_repo(repo, {"base/isvc.yaml": ISVC_BASE, "base/kustomization.yaml": "resources:\n  - isvc.yaml\n",
                                         "overlays/prod/kustomization.yaml": OVERLAY.format(ns=namespace),
                                         "overlays/prod/speculative.yaml": SMP})
    if controller == "argocd":
        request.getfixturevalue("argocd")
        # Over http:// with Basic auth, from a repository Secret as Argo CD declares one.
        secret = f"repo-{repo}"
        api.post("/api/v1/namespaces/argocd/secrets", {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret, "labels": {"argocd.argoproj.io/secret-type": "repository"}},
            "stringData": {"url": git_server.http_url(repo), "username": git_server.username, "password": git_server.token}})
        request.addfinalizer(lambda: api.delete(f"/api/v1/namespaces/argocd/secrets/{secret}"))
        spec = argo_spec(git_server, repo, namespace, {"automated": {"selfHeal": True}}, path="overlays/prod")
        spec["source"]["repoURL"] = git_server.http_url(repo)
        request.getfixturevalue("application")(spec)
        manager, revision_of = "argocd-controller", None
    else:
        request.getfixturevalue("flux")
        kust = make_flux(api, git_server, repo, namespace, path="./overlays/prod")
        manager, revision_of = "kustomize-controller", kust
    standin = request.getfixturevalue(controller)
    isvc = wait_for(lambda: get_or_none(api, f"{ISVCS.format(ns=namespace)}/llm"),
                    what=lambda: f"InferenceService applied ({controller} errors: {standin.errors[-2:]})")
    model = isvc["spec"]["predictor"]["model"]
    assert model["args"] == ["--max-model-len=2048", '--speculative-config={"method":"ngram","num_speculative_tokens":4}']
    assert model["resources"]["limits"]["cpu"] == "4"
    assert isvc["metadata"]["annotations"]["example.com/overlay"] == "prod"
    assert manager in managers(isvc)
    if revision_of:
        wait_for(lambda: (api.get(revision_of).get("status") or {}).get("lastAppliedRevision") == f"main@sha1:{head}",
                 what="lastAppliedRevision")
