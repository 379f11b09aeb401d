# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Module gitops_owner_info: read a serving object and its owner (gitops/owner.py) and, when asked, wait until the owner has
synced (or only fetched) a commit.

"Synced" is each tool's own word for it: Argo CD's ``status.sync.revision`` is the commit and ``status.sync.status`` is
Synced (Application CRD v3.5.1); Flux's Kustomization ``status.lastAppliedRevision`` (``<ref>@sha1:<sha>``) is the commit
and its Ready condition is True (kustomize-controller v1.9.4). "Fetched" (the emergency path, where the owner is paused
and will not apply): Argo CD compares against the commit (``status.sync.revision``), Flux's GitRepository artifact is the
commit (``status.artifact.revision``, source-controller v1.9.1).
"""

from __future__ import annotations

import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner as gitops_owner
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait

# kind -> (group, default version, plural)
SERVING_KINDS = {
    "InferenceService": ("serving.kserve.io", "v1beta1", "inferenceservices"),
    "LLMInferenceService": ("serving.kserve.io", "v1alpha2", "llminferenceservices"),
    "ServingRuntime": ("serving.kserve.io", "v1alpha1", "servingruntimes"),
}


def get_serving_object(api_client, kind, namespace, name, api_version=None):
    """The serving object as a dict; a ValidationError naming it when it does not exist or cannot be read."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.pods import api_error_message  # pylint: disable=import-outside-toplevel
    group, version, plural = SERVING_KINDS[kind]
    version = (api_version or version).rsplit("/", 1)[-1]
    try:
        return request(api_client, "GET", "/apis/%s/%s/namespaces/%s/%s/%s" % (group, version, namespace, plural, name))
    except Exception as exc:  # pylint: disable=broad-except
        if getattr(exc, "status", None) is None:
            raise
        if exc.status == 404:
            raise ValidationError("%s %s/%s not found" % (kind, namespace, name), field="name",
                                  hint="check name, namespace and kind") from exc
        raise SpecDecodingError("reading %s %s/%s failed: %s" % (kind, namespace, name, api_error_message(exc)), field="name") from exc


def has_revision(owner, sha, fetched=False):
    """Has the owner synced (or, with ``fetched``, seen) commit ``sha``."""
    status = owner.get("status") or {}
    if fetched:
        return gitops_owner.revision_sha(owner.get("fetched_revision")) == sha
    if owner["kind"] == "argocd":
        return gitops_owner.revision_sha(status.get("revision")) == sha and status.get("sync_status") == "Synced"
    if owner["kind"] == "flux":
        return gitops_owner.revision_sha(status.get("last_applied_revision")) == sha and bool(status.get("ready"))
    return False


def last_status(owner):
    """The owner's status in words, for the timeout message."""
    status = owner.get("status") or {}
    if owner.get("readable") is False:
        return "not readable: %s" % owner.get("read_error")
    if owner["kind"] == "argocd":
        return "sync %s at revision %s, health %s, last operation %s%s" % (
            status.get("sync_status"), status.get("revision"), status.get("health"), status.get("operation_phase"),
            (": " + status["message"]) if status.get("message") else "")
    if owner["kind"] == "flux":
        return "Ready=%s (%s: %s), lastAppliedRevision %s, lastAttemptedRevision %s, source artifact %s%s" % (
            status.get("ready"), status.get("ready_reason"), status.get("ready_message"), status.get("last_applied_revision"),
            status.get("last_attempted_revision"), status.get("artifact_revision"), ", suspended" if (owner.get("sync") or {}).get("suspended") else "")
    return "no status"


class _Owner:
    """What kube/wait.wait_for reads for this wait: the owner dict (the Application, or the Kustomization and its
    GitRepository), re-read from the serving object's marks; the first read is the one owner_info already made."""

    def __init__(self, obj, owner, argocd_namespace):
        self.kind = gitops_owner.describe(owner)
        self.obj, self.argocd_namespace, self.first = obj, argocd_namespace, owner

    def get(self, api_client, _namespace, _name):
        owner, self.first = self.first, None
        return owner or gitops_owner.read_owner(api_client, self.obj, argocd_namespace=self.argocd_namespace)


def wait_revision(api_client, obj, owner, sha, params, clock=time.monotonic, sleep=time.sleep):
    """Read the owner every ``wait_sleep`` seconds until it has synced (or seen, with ``fetched``) ``sha``; returns
    (owner, seconds waited). The collection's one wait loop (kube/wait.wait_for) as a short poll: the owner objects are
    two, and Argo CD's Application has no status subresource to watch apart from its spec. Fails at once when the owner
    cannot be read (an HTTP 5xx is read again), at wait_timeout with its last status."""
    what = "seen" if params["fetched"] else "synced"

    def check(current):
        if current.get("readable") is False:
            if (current.get("read_error") or "").startswith("HTTP 5"):
                return params["wait_sleep"]
            text = "cannot wait for %s to have %s commit %s: %s" % (gitops_owner.describe(current), what, sha, current["read_error"])
            raise SpecDecodingError(text, field="revision", hint="grant the read RBAC of %s, or check the owner exists" % gitops_owner.RBAC_FILE)
        return has_revision(current, sha, fetched=params["fetched"]) or params["wait_sleep"]

    def on_timeout(current, elapsed):
        text = "%s has not %s commit %s after %ds; its last status: %s" % (
            gitops_owner.describe(current), what, sha, int(elapsed), last_status(current))
        raise SpecDecodingError(
            text, field="wait_timeout",
            hint="check the owner's sync (Argo CD: the Application's sync and operation message; Flux: the Kustomization's "
                 "Ready condition and its GitRepository), or raise wait_timeout")

    return kube_wait.wait_for(api_client, owner.get("namespace"), owner.get("name"), _Owner(obj, owner, params["argocd_namespace"]),
                              check, on_timeout, params["wait_timeout"], params["wait_sleep"], clock, sleep, watch=False)


def check_params(params):
    if params["wait"] and not params.get("revision"):
        raise ValidationError("wait needs the commit to wait for", field="revision", hint="give revision: <commit sha>")
    if params.get("revision") and not gitops_owner.is_sha(params["revision"]):
        raise ValidationError("must be a full commit sha (40 hex digits), got %r" % params["revision"], field="revision",
                              hint="pass the sha the push returned (git rev-parse HEAD)")
    if params["wait_sleep"] <= 0 or params["wait_timeout"] < 0:
        raise ValidationError("wait_sleep must be above 0 and wait_timeout 0 or more", field="wait_sleep/wait_timeout")


def owner_info(api_client, params, clock=time.monotonic, sleep=time.sleep):
    """Module gitops_owner_info's result: owner, managed, resource_generation (and revision_synced / elapsed with revision)."""
    check_params(params)
    obj = get_serving_object(api_client, params["kind"], params["namespace"], params["name"], params.get("api_version"))
    owner = gitops_owner.read_owner(api_client, obj, argocd_namespace=params["argocd_namespace"])
    result = {"changed": False, "owner": owner, "managed": owner["kind"] != "none",
              "resource_generation": (obj.get("metadata") or {}).get("generation"), "summary": gitops_owner.summary(owner)}
    sha = (params.get("revision") or "").strip().lower() or None
    if sha is None:
        return result
    if owner["kind"] not in ("argocd", "flux"):
        raise ValidationError("%s %s/%s has %s: there is no Git sync to wait for" % (
            params["kind"], params["namespace"], params["name"], gitops_owner.describe(owner)), field="revision",
            hint="drop revision (and wait) for an object no Argo CD Application or Flux Kustomization syncs")
    if params["wait"]:
        owner, elapsed = wait_revision(api_client, obj, owner, sha, params, clock=clock, sleep=sleep)
        # the generation the synced commit made (the caller waits for the serving object to observe it next)
        obj = get_serving_object(api_client, params["kind"], params["namespace"], params["name"], params.get("api_version"))
        result.update(owner=owner, elapsed=round(elapsed, 1), summary=gitops_owner.summary(owner),
                      resource_generation=(obj.get("metadata") or {}).get("generation"))
    result["revision_synced"] = has_revision(owner, sha, fetched=params["fetched"])
    return result
