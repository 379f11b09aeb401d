"""The GitOps side of the e2e loops (issue #47): a repository on the loopback Git server that an Argo CD Application or a
Flux Kustomization syncs into the test bed (tests/testbed/argocd_standin.py, flux_standin.py), as platform teams run
KServe. Used by tests/e2e/test_full_loop_e2e.py: the EAGLE-3 loop is deployed by committing the deploy's render (Argo CD),
the Modelcar loop's flag lives in a kustomize overlay's patch (Flux); both are rolled back with `rollback_mode: git`.
"""
from __future__ import annotations

import os
import uuid

import yaml

from tests.testbed.gitops_standin import wait_for
from tests.testbed.rest import ApiError

ARGO_APPS = "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications"
GITREPOS = "/apis/source.toolkit.fluxcd.io/v1/namespaces/%s/gitrepositories"
KUSTOMIZATIONS = "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/%s/kustomizations"
ISVC = "/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices/%s"
PER_REQUEST_FLAG = "--per-request-spec-decode-metrics"
SPEC_FLAG = "--speculative-config"


def argo_application(api, git_server, repo, namespace, path):
    """An Application (automated, selfHeal: Argo CD's own drift correction) syncing `path` of the repository's main branch
    into `namespace`; returns its API path (delete it with `delete`)."""
    name = "app-" + uuid.uuid4().hex[:8]
    api.post(ARGO_APPS, {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": name, "namespace": "argocd"},
                         "spec": {"project": "default", "syncPolicy": {"automated": {"selfHeal": True, "prune": False}},
                                  "source": {"repoURL": git_server.git_url(repo), "targetRevision": "main", "path": path},
                                  "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace}}})
    return "%s/%s" % (ARGO_APPS, name)


def flux_kustomization(api, git_server, repo, namespace, path, secret="git-auth"):
    """A GitRepository (the server's Basic-auth http:// side: Flux takes http(s) and ssh URLs) with its credentials Secret,
    and a Kustomization applying `path` every second; returns the paths to delete."""
    api.post("/api/v1/namespaces/%s/secrets" % namespace,
             {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
              "stringData": {"username": git_server.username, "password": git_server.token}})
    api.post(GITREPOS % namespace, {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
                                    "metadata": {"name": "serving", "namespace": namespace},
                                    "spec": {"url": git_server.http_url(repo), "ref": {"branch": "main"}, "interval": "1s",
                                             "secretRef": {"name": secret}}})
    api.post(KUSTOMIZATIONS % namespace, {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                                          "metadata": {"name": "serving", "namespace": namespace},
                                          "spec": {"sourceRef": {"kind": "GitRepository", "name": "serving"}, "path": path,
                                                   "interval": "1s", "prune": False}})
    return [KUSTOMIZATIONS % namespace + "/serving", GITREPOS % namespace + "/serving"]


def delete(api, *paths):
    for path in paths:
        try:
            api.delete(path)
        except ApiError as exc:
            if exc.status != 404:
                raise


def overlay_files(render_dir, name):
    """The deploy's render (args style) as a user's kustomize tree: the base serves the target alone, the overlay's
    strategic-merge patch gives the predictor the whole args list with the flag (a list of strings is replaced whole)."""
    found = [f for f in os.listdir(render_dir) if f.endswith("-%s.yaml" % name)]  # the render's <namespace>-<name>.yaml
    assert len(found) == 1, os.listdir(render_dir)
    with open(os.path.join(render_dir, found[0]), encoding="utf-8") as fh:
        isvc = yaml.safe_load(fh)
    model = isvc["spec"]["predictor"]["model"]
    args = list(model["args"])
    base = list(args)
    # the base serves the target alone: without the flag, and without --per-request-spec-decode-metrics, which vLLM 0.32
    # refuses without a speculative config (what the rollback's strip also takes)
    for flag in (SPEC_FLAG, PER_REQUEST_FLAG):
        at = next((i for i, a in enumerate(base) if a.split("=", 1)[0] == flag), None)
        if at is not None:
            base = base[:at] + base[at + (1 if "=" in base[at] else 2):]
    model["args"] = base
    patch = {"apiVersion": isvc["apiVersion"], "kind": isvc["kind"],
             "metadata": {"name": name, "namespace": isvc["metadata"]["namespace"]},
             "spec": {"predictor": {"model": {"args": args}}}}
    return {"base/isvc.yaml": yaml.safe_dump(isvc, sort_keys=False),
            "base/kustomization.yaml": "resources:\n  - isvc.yaml\n",
            "overlays/ngram/kustomization.yaml": "resources:\n  - ../../base\npatches:\n  - path: speculative.yaml\n",
            "overlays/ngram/speculative.yaml": "# speculative decoding for this model (the base serves the target alone)\n"
                                               + yaml.safe_dump(patch, sort_keys=False)}


def generation(api, namespace, name):
    return api.get(ISVC % (namespace, name))["metadata"]["generation"]


def drift_pass_keeps_it_off(standin, api, namespace, name):
    """After the Git rollback: the owner's next pass (Argo CD's self-heal, Flux's reconcile) re-applies Git's content,
    which no longer has the flag, so nothing changes: the same generation, no flag in the live object."""
    before = generation(api, namespace, name)
    standin.wait_idle()
    live = api.get(ISVC % (namespace, name))
    assert live["metadata"]["generation"] == before, live["metadata"]
    assert SPEC_FLAG not in repr(live["spec"]), live["spec"]


def synced(api, app_or_kustomization, sha):
    """Argo CD: status.sync at the commit and Synced; Flux: lastAppliedRevision at the commit."""
    status = api.get(app_or_kustomization).get("status") or {}
    if "sync" in status:
        return status["sync"].get("revision") == sha and status["sync"].get("status") == "Synced"
    return status.get("lastAppliedRevision", "").endswith(":" + sha)


def wait_synced(api, path, git_server, repo):
    wait_for(lambda: synced(api, path, git_server.head(repo)), timeout=60, what="the owner in sync at the branch head")


def ready(api, namespace, name):
    """The InferenceService exists and is Ready at its generation."""
    try:
        isvc = api.get(ISVC % (namespace, name))
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    status = isvc.get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return status.get("observedGeneration") == isvc["metadata"]["generation"] and conditions.get("Ready") == "True"
