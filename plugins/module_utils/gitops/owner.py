# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who owns a serving object (Argo CD, Flux, Helm), how that owner syncs, from which Git source, at which commit; and the
refusal of a plain live write of an object such an owner would put back.

``owner_of(obj)`` reads only the object (annotations, labels, managedFields) and returns the owner dict every other part of
the collection reads (the shape is in ``empty_owner``); ``read_owner(api_client, obj)`` then reads the owner object itself
(Application; Kustomization and its GitRepository; HelmRelease) through ``kube.client.request`` where RBAC allows, and
fills its sync policy, source and revisions. ``refuse_live_write`` is the refusal every live writer of a serving object
calls before it writes.

The markers are the projects' own (checked against the CRDs in ../shared/gitops-crds/ and the projects' docs):
- Argo CD 3 tracks a resource with the annotation ``argocd.argoproj.io/tracking-id: <app>:<group>/<kind>:<namespace>/<name>``
  (its default ``annotation`` tracking method since 3.0; ``<app>`` is ``<app namespace>_<app>`` for an Application outside
  the control-plane namespace, argo-cd util/argo/resource_tracking.go ``ParseAppInstanceValue``), or, under ``label``
  tracking, the label ``app.kubernetes.io/instance: <app>``; ``argocd.argoproj.io/installation-id`` names the instance.
- Flux's kustomize-controller and helm-controller label what they apply with ``<controller group>/name`` and ``/namespace``
  (fluxcd/pkg ssa ``owner`` labels), as field manager ``kustomize-controller`` / ``helm-controller``.
- Plain Helm adopts an object by ``meta.helm.sh/release-name`` and ``meta.helm.sh/release-namespace`` (helm
  pkg/action/validate.go ``checkOwnership``), with label ``app.kubernetes.io/managed-by: Helm``.
"""

from __future__ import annotations

import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

# The markers themselves live in kube/owner_marks.py (the baseline twin drops them, below this district).
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.owner_marks import (
    ARGOCD_INSTALLATION_ANNOTATION, ARGOCD_INSTANCE_LABEL, ARGOCD_TRACKING_ANNOTATION, HELM_MANAGED_BY_LABEL,
    HELM_RELEASE_NAME_ANNOTATION, HELM_RELEASE_NAMESPACE_ANNOTATION, HELMRELEASE_NAME_LABEL, HELMRELEASE_NAMESPACE_LABEL,
    KUSTOMIZE_NAME_LABEL, KUSTOMIZE_NAMESPACE_LABEL)

# Argo CD
ARGOCD_NAMESPACE = "argocd"  # the control-plane namespace of a default install: an Application named without "<ns>_" is there
ARGOCD_FIELD_MANAGER = "argocd-controller"
APPLICATION = ("argoproj.io", "v1alpha1", "applications", "Application")

# Flux
KUSTOMIZATION = ("kustomize.toolkit.fluxcd.io", "v1", "kustomizations", "Kustomization")
GITREPOSITORY = ("source.toolkit.fluxcd.io", "v1", "gitrepositories", "GitRepository")
HELMRELEASE = ("helm.toolkit.fluxcd.io", "v2", "helmreleases", "HelmRelease")

# The field managers that mean an owner writes the object (metadata.managedFields[].manager).
OWNER_FIELD_MANAGERS = {ARGOCD_FIELD_MANAGER: "argocd", "kustomize-controller": "flux", "helm-controller": "helm", "helm": "helm"}

# What the collection writes on an owner object while it has paused its sync (gitops/sync_pause.py writes it, this reads it):
# JSON {"kind": "argocd"|"flux", "previous": <syncPolicy | suspend>, "by": <run id>, "at": <RFC3339>}.
PAUSED_SYNC_ANNOTATION = "spec-decoding.alauda.io/paused-sync"

RBAC_FILE = "docs/rbac/gitops-owner-reader.yaml"

# Module option gitops_owner (isvc_speculative, llmisvc_speculative, canary_rollout, draft_artifacts; doc fragment
# alauda.spec_decoding.gitops_owner).
GITOPS_OWNER_CHOICES = ("refuse", "ignore")
GITOPS_OWNER_ARG_SPEC = dict(gitops_owner=dict(type="str", choices=list(GITOPS_OWNER_CHOICES), default="refuse"))

_REVISION_SHA = re.compile(r"(?:^|[@:/])(?:sha1:|sha256:)?([0-9a-f]{40}|[0-9a-f]{64})$")
_SHA = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")


def revision_sha(revision):
    """The commit sha of a revision as Argo CD and Flux write it: ``<sha>`` (Argo), ``main@sha1:<sha>`` or ``sha1:<sha>``
    (Flux v2 source-controller, ``<ref>@<algo>:<hash>``), the older ``main/<sha>``; None when there is none."""
    if not revision or not isinstance(revision, str):
        return None
    match = _REVISION_SHA.search(revision.strip().lower())
    return match.group(1) if match else None


def is_sha(text):
    return bool(text) and isinstance(text, str) and bool(_SHA.match(text.strip().lower()))


def empty_owner():
    """The owner dict of an object no GitOps tool or Helm manages (the shape every owner dict has)."""
    return {"kind": "none", "name": None, "namespace": None, "evidence": [], "field_managers": [],
            "readable": None, "read_error": None,
            "sync": {"automated": False, "self_heal": False, "prune": False, "suspended": False, "interval": None},
            "source": None, "synced_revision": None, "fetched_revision": None, "paused_by_collection": None,
            "status": None}


def _meta(obj):
    return (obj or {}).get("metadata") or {}


def field_managers(obj):
    """The distinct managers of metadata.managedFields, in their order."""
    out = []
    for entry in _meta(obj).get("managedFields") or []:
        manager = (entry or {}).get("manager")
        if manager and manager not in out:
            out.append(manager)
    return out


def parse_tracking_id(value, argocd_namespace=ARGOCD_NAMESPACE):
    """(application namespace, application name, tracked "<group>/<kind>:<namespace>/<name>") of an Argo CD tracking id."""
    app, _sep, tracked = (value or "").strip().partition(":")
    if "_" in app:  # "<app namespace>_<app>": Kubernetes names hold no "_", so the first one is the separator
        namespace, name = app.split("_", 1)
    else:
        namespace, name = argocd_namespace, app
    return namespace, name, tracked


def tracked_key(obj):
    """"<group>/<kind>:<namespace>/<name>" of an object, as an Argo CD tracking id names it."""
    group = (obj.get("apiVersion") or "").rpartition("/")[0]
    meta = _meta(obj)
    return "%s/%s:%s/%s" % (group, obj.get("kind") or "", meta.get("namespace") or "", meta.get("name") or "")


def owner_of(obj, argocd_namespace=ARGOCD_NAMESPACE):
    """The owner dict of a serving object from its own metadata (no API call): kind, name, namespace, evidence,
    field_managers; the rest is read_owner's."""
    meta = _meta(obj)
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    owner = empty_owner()
    managers = field_managers(obj)
    owner["field_managers"] = [m for m in managers if m in OWNER_FIELD_MANAGERS]
    evidence = owner["evidence"]

    def found(kind, name, namespace, *why):
        owner.update(kind=kind, name=name, namespace=namespace)
        evidence.extend(why)

    tracking = annotations.get(ARGOCD_TRACKING_ANNOTATION)
    flux_kustomization = labels.get(KUSTOMIZE_NAME_LABEL)
    flux_helmrelease = labels.get(HELMRELEASE_NAME_LABEL)
    helm_release = annotations.get(HELM_RELEASE_NAME_ANNOTATION)
    instance = labels.get(ARGOCD_INSTANCE_LABEL)
    argo_hint = ARGOCD_INSTALLATION_ANNOTATION in annotations or ARGOCD_FIELD_MANAGER in managers
    if tracking:
        namespace, name, tracked = parse_tracking_id(tracking, argocd_namespace)
        found("argocd", name, namespace, "annotation %s=%s" % (ARGOCD_TRACKING_ANNOTATION, tracking))
        if obj.get("kind") and tracked and tracked != tracked_key(obj):
            # Argo CD compares the id with the object; a copied annotation names another object
            evidence.append("the tracking id names %s, not this object (%s): a copied annotation?" % (tracked, tracked_key(obj)))
    elif flux_kustomization:
        found("flux", flux_kustomization, labels.get(KUSTOMIZE_NAMESPACE_LABEL) or meta.get("namespace"),
              "label %s=%s" % (KUSTOMIZE_NAME_LABEL, flux_kustomization))
        if labels.get(KUSTOMIZE_NAMESPACE_LABEL):
            evidence.append("label %s=%s" % (KUSTOMIZE_NAMESPACE_LABEL, labels[KUSTOMIZE_NAMESPACE_LABEL]))
    elif flux_helmrelease:
        found("helm", flux_helmrelease, labels.get(HELMRELEASE_NAMESPACE_LABEL) or meta.get("namespace"),
              "label %s=%s" % (HELMRELEASE_NAME_LABEL, flux_helmrelease))
        if labels.get(HELMRELEASE_NAMESPACE_LABEL):
            evidence.append("label %s=%s" % (HELMRELEASE_NAMESPACE_LABEL, labels[HELMRELEASE_NAMESPACE_LABEL]))
    elif instance and argo_hint:
        # label tracking; the label alone is no proof (Helm charts and kustomize bases set it too)
        found("argocd", instance, argocd_namespace, "label %s=%s (Argo CD label tracking)" % (ARGOCD_INSTANCE_LABEL, instance))
    elif helm_release:
        found("helm", helm_release, annotations.get(HELM_RELEASE_NAMESPACE_ANNOTATION) or meta.get("namespace"),
              "annotation %s=%s" % (HELM_RELEASE_NAME_ANNOTATION, helm_release))
        if labels.get(HELM_MANAGED_BY_LABEL):
            evidence.append("label %s=%s" % (HELM_MANAGED_BY_LABEL, labels[HELM_MANAGED_BY_LABEL]))
    if ARGOCD_INSTALLATION_ANNOTATION in annotations:
        evidence.append("annotation %s=%s" % (ARGOCD_INSTALLATION_ANNOTATION, annotations[ARGOCD_INSTALLATION_ANNOTATION]))
    for manager in owner["field_managers"]:
        evidence.append("field manager %s" % manager)
    if owner["kind"] == "none" and owner["field_managers"]:
        # written by an owner's controller, but no marker names the owner object
        owner["kind"] = OWNER_FIELD_MANAGERS[owner["field_managers"][0]]
    return owner


def describe(owner):
    """"Argo CD Application argocd/llm-serving", "Flux Kustomization flux-system/apps", "Helm release models/llm"."""
    kind = owner.get("kind")
    where = "%s/%s" % (owner.get("namespace"), owner.get("name")) if owner.get("name") else "(name unknown)"
    if kind == "argocd":
        return "Argo CD Application %s" % where
    if kind == "flux":
        return "Flux Kustomization %s" % where
    if kind == "helm":
        if any(e.startswith("label " + HELMRELEASE_NAME_LABEL) for e in owner.get("evidence") or []):
            return "Flux HelmRelease %s" % where
        return "Helm release %s" % where
    return "no owner"


def policy_text(owner):
    """"automated, selfHeal, prune" / "automated" / "manual sync" (Argo); "interval 10m" / "suspended" (Flux)."""
    sync = owner.get("sync") or {}
    if owner.get("readable") is False:
        return "policy unknown: %s" % (owner.get("read_error") or "not readable")
    if owner.get("kind") == "helm" and describe(owner).startswith("Helm release"):
        return "no controller: applied at helm install/upgrade"
    if owner.get("readable") is None and owner.get("kind") != "none":
        return "policy unknown"
    if owner.get("kind") == "argocd":
        if not sync.get("automated"):
            return "manual sync"
        return ", ".join(["automated"] + [word for word, on in (("selfHeal", sync.get("self_heal")), ("prune", sync.get("prune"))) if on])
    if sync.get("suspended"):
        return "suspended"
    parts = ["interval %s" % sync["interval"]] if sync.get("interval") else []
    if sync.get("self_heal"):
        parts.append("corrects drift")
    return ", ".join(parts) or "no sync policy"


def source_text(owner):
    """"<repo> <path>@<revision>" of the owner's source, or ""."""
    source = owner.get("source") or {}
    if not source.get("repo_url") and not source.get("path"):
        return ""
    revision = owner.get("synced_revision") or source.get("revision") or "HEAD"
    return "%s %s@%s" % (source.get("repo_url") or source.get("source_kind") or "", source.get("path") or ".", revision)


def summary(owner):
    """One line for verify's summary and the troubleshoot bundle: "owner: Argo CD Application ns/name (automated,
    selfHeal) from <repo> <path>@<rev>" or "owner: none found"."""
    if not owner or owner.get("kind") == "none":
        return "owner: none found"
    text = "owner: %s (%s)" % (describe(owner), policy_text(owner))
    source = source_text(owner)
    return text + (" from " + source if source else "")


def undoes_live_writes(owner):
    """Would the owner put a live edit back on its own: Argo CD automated with selfHeal (or automated: its next sync of a
    new commit applies the manifest again), Flux unless suspended, a HelmRelease with drift detection. Unknown (not
    readable) counts as yes."""
    if owner.get("kind") == "none":
        return False
    if owner.get("readable") is not True:
        return True
    return bool((owner.get("sync") or {}).get("automated")) and not (owner.get("sync") or {}).get("suspended")


def refuse_live_write(owner, gitops_owner, what, field="gitops_owner"):
    """Raise the refusal of a live write of ``what`` ("InferenceService models/llama") when an owner manages it and
    ``gitops_owner`` is refuse; returns None when there is no owner, or a warning text to pass on when it is ignore."""
    if not owner or owner.get("kind") == "none":
        return None
    described = describe(owner)
    policy = policy_text(owner)
    source = source_text(owner)
    reason = "a live patch is undone at its next sync" if undoes_live_writes(owner) else \
        "a live patch lasts only until the owner applies its manifest again"
    if owner.get("kind") == "helm" and described.startswith("Helm release"):
        reason = "a live patch is undone at the next helm upgrade"
    text = "%s (%s) %s %s%s: %s" % (described, policy, "syncs" if owner["kind"] != "helm" else "manages", what,
                                    " from " + source if source else "", reason)
    if gitops_owner == "ignore":
        return "gitops_owner=ignore: %s" % text
    evidence = "; ".join(owner.get("evidence") or [])
    raise ValidationError(
        "%s; nothing was written (found by %s)" % (text, evidence or "its metadata"), field=field,
        hint="change it where the truth is with rollback_mode: git (the flag removed in the owner's repository, then "
             "synced), or rollback_mode: emergency (pause the owner's sync, patch live, commit the same change, resume); "
             "set gitops_owner: ignore only when the owner is gone or does not self-heal")


def check_live_write(api_client, obj, gitops_owner, what, warn=None, argocd_namespace=ARGOCD_NAMESPACE):
    """What every live writer of a serving object calls with the object it has just read, before its write: the owner
    from the object's metadata and, only when there is one, its owner object (for the sync policy the refusal names).
    Raises the refusal (gitops_owner=refuse); returns the owner dict. ``warn(text)`` gets the ignore warning."""
    owner = owner_of(obj, argocd_namespace=argocd_namespace)
    if owner["kind"] == "none":
        return owner
    if api_client is not None:
        owner = read_owner(api_client, obj, owner=owner)
    warning = refuse_live_write(owner, gitops_owner, what)
    if warning and warn is not None:
        warn(warning)
    return owner


# Reading the owner object.

def object_path(res, namespace, name):
    """The API path of an owner object (``res``: APPLICATION, KUSTOMIZATION, GITREPOSITORY, HELMRELEASE)."""
    group, version, plural, _kind = res
    return "/apis/%s/%s/namespaces/%s/%s/%s" % (group, version, namespace, plural, name)


def _get(api_client, res, namespace, name):
    """(object, None) or (None, read_error) for a 403/404 or another API answer; never raises for an API answer."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.pods import api_error_message  # pylint: disable=import-outside-toplevel
    try:
        return request(api_client, "GET", object_path(res, namespace, name)), None
    except Exception as exc:  # pylint: disable=broad-except
        status = getattr(exc, "status", None)
        if status is None:
            raise
        text = api_error_message(exc)
        if status == 403:
            return None, "403 Forbidden: cannot get %s %s/%s: %s (add the RBAC in %s)" % (res[3], namespace, name, text, RBAC_FILE)
        if status == 404:
            return None, ("404 Not Found: %s %s/%s does not exist (the owner is gone, or %s is not installed here; if it is "
                          "gone, gitops_owner: ignore)" % (res[3], namespace, name, res[2] + "." + res[0]))
        return None, "HTTP %s reading %s %s/%s: %s" % (status, res[3], namespace, name, text)


def _condition(obj, kind):
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def _paused(obj):
    raw = (_meta(obj).get("annotations") or {}).get(PAUSED_SYNC_ANNOTATION)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return {"unparsed": raw}
    return value if isinstance(value, dict) else {"unparsed": raw}


def _fill_argocd(owner, app):
    spec = app.get("spec") or {}
    status = app.get("status") or {}
    policy = spec.get("syncPolicy") or {}
    automated = policy.get("automated")
    # automated present (also {}) and not enabled: false = automated sync (Application CRD v3.5.1, syncPolicy.automated.enabled)
    is_automated = isinstance(automated, dict) and automated.get("enabled") is not False
    owner["sync"] = {"automated": is_automated, "self_heal": bool(is_automated and automated.get("selfHeal")),
                     "prune": bool(is_automated and automated.get("prune")), "suspended": False, "interval": None}
    sources = [spec["source"]] if spec.get("source") else list(spec.get("sources") or [])
    index = next((i for i, src in enumerate(sources) if src.get("path") is not None), 0)
    source = sources[index] if sources else {}
    owner["source"] = {"repo_url": source.get("repoURL"), "revision": source.get("targetRevision") or "HEAD",
                       "path": source.get("path") or source.get("chart"), "source_kind": "Application",
                       "source_name": _meta(app).get("name"), "source_namespace": _meta(app).get("namespace")}
    sync = status.get("sync") or {}
    revisions = sync.get("revisions") or []
    fetched = sync.get("revision") or (revisions[index] if index < len(revisions) else None)
    owner["fetched_revision"] = revision_sha(fetched) or fetched
    owner["synced_revision"] = owner["fetched_revision"] if sync.get("status") == "Synced" else None
    operation = status.get("operationState") or {}
    owner["status"] = {"sync_status": sync.get("status"), "revision": fetched, "health": (status.get("health") or {}).get("status"),
                       "operation_phase": operation.get("phase"),
                       "operation_revision": (operation.get("syncResult") or {}).get("revision"),
                       "message": operation.get("message")}


def _fill_flux(owner, api_client, kustomization):
    spec = kustomization.get("spec") or {}
    status = kustomization.get("status") or {}
    suspended = bool(spec.get("suspend"))
    # kustomize-controller applies and corrects drift at every interval unless suspended (Flux docs, "Kustomization")
    owner["sync"] = {"automated": not suspended, "self_heal": not suspended, "prune": bool(spec.get("prune")),
                     "suspended": suspended, "interval": spec.get("interval")}
    ref = spec.get("sourceRef") or {}
    ns = ref.get("namespace") or _meta(kustomization).get("namespace")
    owner["source"] = {"repo_url": None, "revision": None, "path": spec.get("path") or "./", "source_kind": ref.get("kind"),
                       "source_name": ref.get("name"), "source_namespace": ns}
    owner["synced_revision"] = revision_sha(status.get("lastAppliedRevision"))
    ready = _condition(kustomization, "Ready") or {}
    owner["status"] = {"ready": ready.get("status") == "True", "ready_reason": ready.get("reason"), "ready_message": ready.get("message"),
                       "last_applied_revision": status.get("lastAppliedRevision"),
                       "last_attempted_revision": status.get("lastAttemptedRevision"),
                       "observed_generation": status.get("observedGeneration"),
                       "generation": _meta(kustomization).get("generation"), "artifact_revision": None}
    if ref.get("kind") == GITREPOSITORY[3] and ref.get("name"):
        repo, error = _get(api_client, GITREPOSITORY, ns, ref["name"])
        if repo is None:
            owner["read_error"] = error
            return
        repo_spec = repo.get("spec") or {}
        git_ref = repo_spec.get("ref") or {}
        owner["source"].update(repo_url=repo_spec.get("url"),
                               revision=next((git_ref[k] for k in ("branch", "tag", "semver", "name", "commit") if git_ref.get(k)), None))
        artifact = ((repo.get("status") or {}).get("artifact") or {}).get("revision")
        owner["fetched_revision"] = revision_sha(artifact)
        owner["status"]["artifact_revision"] = artifact


def _fill_helmrelease(owner, release):
    spec = release.get("spec") or {}
    status = release.get("status") or {}
    suspended = bool(spec.get("suspend"))
    # helm-controller v2 corrects drift only with spec.driftDetection.mode: enabled (off by default)
    drift = ((spec.get("driftDetection") or {}).get("mode") or "disabled") == "enabled"
    owner["sync"] = {"automated": not suspended, "self_heal": drift and not suspended, "prune": False, "suspended": suspended,
                     "interval": spec.get("interval")}
    chart = ((spec.get("chart") or {}).get("spec")) or {}
    ref = chart.get("sourceRef") or {}
    owner["source"] = {"repo_url": None, "revision": chart.get("version"), "path": chart.get("chart"), "source_kind": ref.get("kind"),
                       "source_name": ref.get("name"), "source_namespace": ref.get("namespace") or _meta(release).get("namespace")}
    ready = _condition(release, "Ready") or {}
    owner["status"] = {"ready": ready.get("status") == "True", "ready_message": ready.get("message"),
                       "last_attempted_revision": status.get("lastAttemptedRevision")}


def read_owner(api_client, obj, owner=None, argocd_namespace=ARGOCD_NAMESPACE):
    """The owner dict of ``obj`` with the owner object read: sync policy, source, revisions, what the collection paused.
    A 403/404 (or any other API answer) sets readable False and read_error with the fix; it never raises for one."""
    owner = dict(owner or owner_of(obj, argocd_namespace=argocd_namespace))
    if owner["kind"] == "none" or not owner.get("name"):
        return owner
    is_helmrelease = owner["kind"] == "helm" and describe(owner).startswith("Flux HelmRelease")
    res = {"argocd": APPLICATION, "flux": KUSTOMIZATION}.get(owner["kind"]) or (HELMRELEASE if is_helmrelease else None)
    if res is None:
        # a plain Helm release lives in Secrets (its values are secret): nothing to read, and no controller syncs it
        owner.update(readable=None, sync=dict(owner["sync"], automated=False))
        return owner
    found, error = _get(api_client, res, owner["namespace"], owner["name"])
    if found is None:
        owner.update(readable=False, read_error=error)
        return owner
    owner.update(readable=True, read_error=None, paused_by_collection=_paused(found))
    if owner["kind"] == "argocd":
        _fill_argocd(owner, found)
    elif owner["kind"] == "flux":
        _fill_flux(owner, api_client, found)
    else:
        _fill_helmrelease(owner, found)
    return owner
