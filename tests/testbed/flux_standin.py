"""Flux source-controller (v1.9.1) and kustomize-controller (v1.9.4) stand-ins for the loopback test bed.

As Flux's docs describe them (https://fluxcd.io/flux/components/source/gitrepositories/,
https://fluxcd.io/flux/components/kustomize/kustomizations/):

GitRepository (`source.toolkit.fluxcd.io/v1`), every `spec.interval`, on a spec change (generation) and on the
`reconcile.fluxcd.io/requestedAt` annotation (`flux reconcile`), unless `spec.suspend`: resolves `spec.ref` with real git
(precedence commit > name > tag > branch; no ref: branch `master`, the CRD's default), reads the commit (credentials:
`spec.secretRef` Secret `username` / `password`, Basic auth) and writes through the status subresource
`status.artifact` {revision `<branch>@sha1:<sha>` (tag/name: `<ref>@sha1:<sha>`, a lone commit `sha1:<sha>`), digest,
path, url, lastUpdateTime, size}, conditions Ready / ArtifactInStorage, `observedGeneration`; a failure: Ready False
(reason GitOperationFailed) with git's message, the last artifact kept.

Kustomization (`kustomize.toolkit.fluxcd.io/v1`), every `spec.interval`, on a spec change, on requestedAt and when its
source has a new artifact revision; `spec.suspend: true`: nothing at all (no apply, status unchanged):
renders `spec.path` of the source's artifact (`./` by default) the way kustomize-controller does: a folder without a
kustomization gets one generated listing every manifest in it and its sub-folders; `spec.targetNamespace`,
`spec.namePrefix`/`nameSuffix`, `spec.patches`, `spec.images` and `spec.commonMetadata` are layered on with a
kustomization around it; `kubectl kustomize` builds it. Then server-side apply of every object (field manager
`kustomize-controller`, force), labelled `kustomize.toolkit.fluxcd.io/name` / `.../namespace`. This runs at every
reconcile, so drift is corrected every interval. `spec.prune`: objects of the previous inventory the render no longer
has are deleted (if they still carry the labels). Status through the status subresource: `lastAttemptedRevision`,
`lastAppliedRevision` (on success), `observedGeneration`, `inventory.entries[]` (`<ns>_<name>_<group>_<kind>`),
`lastHandledReconcileAt`, condition Ready True (ReconciliationSucceeded, "Applied revision: <rev>") or False
(ArtifactFailed / BuildFailed / ReconciliationFailed), Reconciling / Healthy left out. Namespaced objects without a namespace
and no targetNamespace go to the Kustomization's namespace (the stand-in's leniency; write namespaces in manifests).

Test controls: `sync_now()`, `wait_idle()`, `errors`.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile

import yaml

from .gitops_standin import (GitopsError, PollingController, apply_order, condition, get_live, has_kustomization,
                             kustomize, manifest_files, now_rfc3339, parse_duration, server_side_apply, source_folder)
from .rest import ApiError

SOURCE_GROUP, KUSTOMIZE_GROUP, VERSION = "source.toolkit.fluxcd.io", "kustomize.toolkit.fluxcd.io", "v1"
GITREPO_PATH = f"/apis/{SOURCE_GROUP}/{VERSION}/gitrepositories"
KUSTOMIZATION_PATH = f"/apis/{KUSTOMIZE_GROUP}/{VERSION}/kustomizations"
FIELD_MANAGER = "kustomize-controller"
NAME_LABEL = "kustomize.toolkit.fluxcd.io/name"
NAMESPACE_LABEL = "kustomize.toolkit.fluxcd.io/namespace"
REQUESTED_AT = "reconcile.fluxcd.io/requestedAt"
DEFAULT_INTERVAL = 60.0


def artifact_revision(ref: dict, sha: str) -> str:
    """Flux's revision string for the ref that was resolved (source-controller: git.Commit.String)."""
    if ref.get("name"):
        return f"{ref['name']}@sha1:{sha}"
    if ref.get("commit") and not ref.get("branch"):
        return f"sha1:{sha}"
    if ref.get("tag") and not ref.get("commit"):
        return f"{ref['tag']}@sha1:{sha}"
    return f"{ref.get('branch') or 'master'}@sha1:{sha}"


def revision_sha(revision: str) -> str:
    return revision.rpartition("sha1:")[2]


def inventory_id(obj: dict) -> str:
    group = obj["apiVersion"].rpartition("/")[0]
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}_{meta['name']}_{group}_{obj['kind']}"


class FluxStandIn(PollingController):
    NAME = "flux-standin"

    def __init__(self, controlplane, git_cache=None, min_interval: float = 0.2):
        self.min_interval = min_interval
        self._handled = {}  # key -> (generation, requestedAt, source revision) last reconciled
        super().__init__(controlplane, [GITREPO_PATH, KUSTOMIZATION_PATH], git_cache)

    def list_objects(self, api) -> list:
        repos = [("GitRepository", o) for o in api.get(GITREPO_PATH)["items"]]
        kusts = [("Kustomization", o) for o in api.get(KUSTOMIZATION_PATH)["items"]]
        self._repos = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for _k, o in repos}
        return repos + kusts  # sources first: a Kustomization in the same pass sees the new artifact

    _repos = {}

    def _source_of(self, obj: dict):
        ref = (obj.get("spec") or {}).get("sourceRef") or {}
        return self._repos.get((ref.get("namespace") or obj["metadata"]["namespace"], ref.get("name")))

    def _trigger(self, kind: str, obj: dict) -> tuple:
        meta = obj["metadata"]
        requested = (meta.get("annotations") or {}).get(REQUESTED_AT)
        source_rev = None
        if kind == "Kustomization":
            source = self._source_of(obj)
            source_rev = (((source or {}).get("status") or {}).get("artifact") or {}).get("revision")
        return (meta.get("generation"), requested, source_rev)

    def due(self, kind, obj, now) -> bool:
        meta = obj["metadata"]
        return self._handled.get((kind, meta["namespace"], meta["name"])) != self._trigger(kind, obj)

    def reconcile(self, api, kind, obj) -> float:
        spec = obj.get("spec") or {}
        interval = max(parse_duration(spec.get("interval"), DEFAULT_INTERVAL), self.min_interval)
        if spec.get("suspend"):
            return interval  # suspended: nothing applied, status unchanged
        meta = obj["metadata"]
        trigger = self._trigger(kind, obj)
        if kind == "GitRepository":
            self._reconcile_source(api, obj)
        else:
            self._reconcile_kustomization(api, obj, interval)
        self._handled[(kind, meta["namespace"], meta["name"])] = trigger
        return interval

    # ------------------------------------------------------------------ source-controller
    def _secret_env(self, api, namespace: str, secret_ref) -> dict:
        if not secret_ref:
            return {}
        secret = api.get(f"/api/v1/namespaces/{namespace}/secrets/{secret_ref['name']}")
        data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        return self.git.auth_env(data.get("username"), data.get("password"))

    def _reconcile_source(self, api, repo: dict) -> None:
        meta, spec = repo["metadata"], repo.get("spec") or {}
        old = repo.get("status") or {}
        status = dict(old)
        url, ref = spec.get("url"), spec.get("ref") or {}
        try:
            env = self._secret_env(api, meta["namespace"], spec.get("secretRef"))
            if ref.get("commit"):
                sha = ref["commit"]
            elif ref.get("name"):
                sha = self.git.resolve(url, "name", ref["name"], env)
            elif ref.get("tag"):
                sha = self.git.resolve(url, "tag", ref["tag"], env)
            else:
                sha = self.git.resolve(url, "branch", ref.get("branch") or "master", env)
            tree = self.git.tree(url, sha, env)
            revision = artifact_revision(ref, sha)
            previous = old.get("artifact") or {}
            if previous.get("revision") != revision:
                digest = "sha256:" + hashlib.sha256(revision.encode()).hexdigest()
                status["artifact"] = {"revision": revision, "digest": digest, "lastUpdateTime": now_rfc3339(),
                                      "path": f"gitrepository/{meta['namespace']}/{meta['name']}/{sha}.tar.gz",
                                      "url": f"http://source-controller.flux-system.svc.cluster.local./gitrepository/"
                                             f"{meta['namespace']}/{meta['name']}/{sha}.tar.gz",
                                      "size": sum(os.path.getsize(f) for f in manifest_files(tree, True))}
            message = f"stored artifact for revision '{revision}'"
            status["conditions"] = [
                condition(old.get("conditions"), "Ready", "True", "Succeeded", message, meta.get("generation")),
                condition(old.get("conditions"), "ArtifactInStorage", "True", "Succeeded", message, meta.get("generation"))]
        except (GitopsError, ApiError) as exc:
            status["conditions"] = [condition(old.get("conditions"), "Ready", "False", "GitOperationFailed", str(exc),
                                              meta.get("generation"))]
            self.errors.append(f"GitRepository {meta['namespace']}/{meta['name']}: {exc}")
        status["observedGeneration"] = meta.get("generation")
        requested = (meta.get("annotations") or {}).get(REQUESTED_AT)
        if requested:
            status["lastHandledReconcileAt"] = requested
        if status != old:
            updated = api.request("PATCH", f"/apis/{SOURCE_GROUP}/{VERSION}/namespaces/{meta['namespace']}/gitrepositories/"
                                           f"{meta['name']}/status", {"status": status},
                                  content_type="application/merge-patch+json")
            self._repos[(meta["namespace"], meta["name"])] = updated

    # ------------------------------------------------------------------ kustomize-controller
    def _build(self, tree: str, spec: dict) -> list:
        """kustomize-controller's build: generate a kustomization where there is none, layer the Kustomization's own
        overlay fields on, `kubectl kustomize`."""
        rel = os.path.relpath(source_folder(tree, spec.get("path") or "./"), tree)
        with tempfile.TemporaryDirectory(prefix="testbed-flux-build-") as work:
            # The whole artifact is copied: an overlay may name bases elsewhere in the repository (../../base).
            shutil.copytree(tree, os.path.join(work, "src"))
            base = os.path.normpath(os.path.join(work, "src", rel))
            if not has_kustomization(base):
                resources = [os.path.relpath(p, base) for p in manifest_files(base, recurse=True)]
                _write_yaml(os.path.join(base, "kustomization.yaml"),
                            {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": resources})
            overlay = {k: spec[k] for k in ("namePrefix", "nameSuffix", "patches", "images") if spec.get(k)}
            if spec.get("targetNamespace"):
                overlay["namespace"] = spec["targetNamespace"]
            common = spec.get("commonMetadata") or {}
            if common.get("labels"):
                overlay["labels"] = [{"pairs": common["labels"], "includeSelectors": False}]
            if common.get("annotations"):
                overlay["commonAnnotations"] = common["annotations"]
            if not overlay:
                return kustomize(base)
            top = os.path.join(work, "flux-overlay")
            os.makedirs(top)
            _write_yaml(os.path.join(top, "kustomization.yaml"),
                        dict({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                              "resources": [os.path.relpath(base, top)]}, **overlay))
            return kustomize(top)

    def _reconcile_kustomization(self, api, kust: dict, interval: float) -> None:
        meta, spec = kust["metadata"], kust.get("spec") or {}
        old = kust.get("status") or {}
        status = dict(old)
        gen = meta.get("generation")
        source = self._source_of(kust)
        artifact = ((source or {}).get("status") or {}).get("artifact") or {}
        reason = None
        if (spec.get("sourceRef") or {}).get("kind") != "GitRepository":
            reason, message = "ArtifactFailed", "the stand-in serves sourceRef kind GitRepository only"
        elif not artifact.get("revision"):
            ref = spec.get("sourceRef") or {}
            reason, message = "ArtifactFailed", (f"Source artifact not found, retrying in {int(interval)}s "
                                                 f"(GitRepository {ref.get('namespace') or meta['namespace']}/{ref.get('name')})")
        else:
            revision = artifact["revision"]
            status["lastAttemptedRevision"] = revision
            try:
                tree = self.git.tree(source["spec"]["url"], revision_sha(revision),
                                     self._secret_env(api, source["metadata"]["namespace"], source["spec"].get("secretRef")))
                build_inputs = {k: spec.get(k) for k in ("path", "namePrefix", "nameSuffix", "patches", "images",
                                                         "targetNamespace", "commonMetadata")}
                objs = self.cached_render((tree, json.dumps(build_inputs, sort_keys=True)), lambda: self._build(tree, spec))
            except (GitopsError, ApiError) as exc:
                reason, message = "BuildFailed", str(exc)
            else:
                try:
                    entries = self._apply(api, kust, objs)
                    if spec.get("prune"):
                        self._prune(api, kust, old, entries)
                except (GitopsError, ApiError) as exc:
                    reason, message = "ReconciliationFailed", str(exc)
                else:
                    status["lastAppliedRevision"] = revision
                    status["inventory"] = {"entries": entries}
                    message = f"Applied revision: {revision}"
        if reason:
            self.errors.append(f"Kustomization {meta['namespace']}/{meta['name']}: {message}")
            ready = condition(old.get("conditions"), "Ready", "False", reason, message, gen)
        else:
            ready = condition(old.get("conditions"), "Ready", "True", "ReconciliationSucceeded", message, gen)
        status["conditions"] = [ready]
        status["observedGeneration"] = gen
        requested = (meta.get("annotations") or {}).get(REQUESTED_AT)
        if requested:
            status["lastHandledReconcileAt"] = requested
        if status != old:
            api.request("PATCH", f"/apis/{KUSTOMIZE_GROUP}/{VERSION}/namespaces/{meta['namespace']}/kustomizations/"
                                 f"{meta['name']}/status", {"status": status}, content_type="application/merge-patch+json")

    def _apply(self, api, kust: dict, objs: list) -> list:
        meta = kust["metadata"]
        entries = []
        for item in apply_order(objs):
            self.resources.default_namespace(api, item, meta["namespace"])
            labels = item["metadata"].setdefault("labels", {})
            labels[NAME_LABEL] = meta["name"]
            labels[NAMESPACE_LABEL] = meta["namespace"]
            server_side_apply(api, self.resources, item, FIELD_MANAGER)
            entries.append({"id": inventory_id(item), "v": item["apiVersion"].rpartition("/")[2]})
        return entries

    def _prune(self, api, kust: dict, old_status: dict, entries: list) -> None:
        """Delete what the previous inventory had and this render has not, if it still carries this Kustomization's
        labels (Flux's garbage collection)."""
        keep = {e["id"] for e in entries}
        meta = kust["metadata"]
        for entry in (old_status.get("inventory") or {}).get("entries") or []:
            if entry["id"] in keep:
                continue
            namespace, name, group, kind = entry["id"].split("_", 3)
            probe = {"apiVersion": f"{group}/{entry['v']}" if group else entry["v"], "kind": kind,
                     "metadata": {"name": name, "namespace": namespace or None}}
            live = get_live(api, self.resources, probe)
            labels = ((live or {}).get("metadata") or {}).get("labels") or {}
            if live and labels.get(NAME_LABEL) == meta["name"] and labels.get(NAMESPACE_LABEL) == meta["namespace"]:
                api.delete(self.resources.path(api, probe))


def _write_yaml(path: str, body: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(body, fh, sort_keys=False)
