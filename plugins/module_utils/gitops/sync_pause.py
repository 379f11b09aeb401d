# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The emergency path's pause and resume of the owner's sync (module gitops_sync).

Pause turns the owner's automation off and records, on the owner object itself, exactly what it was (annotation
``spec-decoding.alauda.io/paused-sync``: JSON {"kind", "previous", "by", "at"}), in one JSON patch; resume puts that back
and removes the annotation, in one JSON patch. The record lives on the owner, not in the run, so a run killed at any
step and run again finds it and resumes; a second pause keeps the FIRST record (the paused state is never recorded as
"previous").

- Argo CD Application: ``previous`` is the exact ``spec.syncPolicy`` (null when absent). Pause removes
  ``spec.syncPolicy.automated`` and leaves the other keys (syncOptions, retry, managedNamespaceMetadata); removing the key,
  rather than writing ``automated.enabled: false``, stops automated sync on every Argo CD release (``enabled`` is a
  late addition that older controllers ignore, so they would still sync). Resume writes the recorded syncPolicy back as
  recorded. The Application CRD has no status subresource: the controller's status writes change resourceVersion all
  the time, so the guard tests the value being changed rather than resourceVersion where it can.
- Flux Kustomization: ``previous`` is ``spec.suspend`` (true, false, or null when absent). Pause sets ``spec.suspend:
  true``; resume writes the recorded value back, or removes the key when it was absent.

The owner is the dict of gitops/owner.py (only ``kind``, ``name`` and ``namespace`` are read here); the annotation's name
and the owner kinds' API paths are owner.py's constants.
"""

from __future__ import annotations

import copy
import datetime
import json

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ConflictError, SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops.owner import (
    APPLICATION, KUSTOMIZATION, PAUSED_SYNC_ANNOTATION, RBAC_FILE, object_path,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.writer import apply_patch, escape_pointer
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.ssa_conflicts import ROLLBACK_FIELD_MANAGER


def _owner_resource(res, field):
    group, version, plural, kind = res
    return {"kind": kind, "group": group, "version": version, "plural": plural, "field": field, "res": res}


# owner["kind"] -> where the owner object lives and what its sync switch is called
OWNERS = {"argocd": _owner_resource(APPLICATION, "syncPolicy"), "flux": _owner_resource(KUSTOMIZATION, "suspend")}

# docs/rbac/gitops-owner-reader.yaml's role for the patch verbs, separate from the reader on purpose
SYNC_PAUSER_ROLE = "spec-decoding-gitops-sync-pauser"

_ABSENT = object()


def owner_ref(owner):
    """The owner's kind (argocd|flux) and its entry of OWNERS; a clear error for Helm, none or an owner without a name."""
    kind = (owner or {}).get("kind")
    if kind not in OWNERS:
        what = {"helm": "a Helm release (Flux helm-controller or plain Helm)", "none": "no GitOps owner"}.get(kind, repr(kind))
        raise ValidationError("the object's owner is %s: there is no sync to pause" % what, field="owner",
                              hint="the emergency path pauses an Argo CD Application or a Flux Kustomization; for a Helm "
                                   "release change the chart's value in Git (rollback_mode: git), for an unmanaged object "
                                   "use the live rollback (rollback_mode: live)")
    if not owner.get("name") or not owner.get("namespace"):
        raise ValidationError("the owner %s has no name or namespace" % kind, field="owner",
                              hint="name the %s and its namespace (owner_name, owner_namespace)" % OWNERS[kind]["kind"])
    return kind, OWNERS[kind]


def owner_path(owner):
    return object_path(owner_ref(owner)[1]["res"], owner["namespace"], owner["name"])


def owner_label(owner):
    ref = owner_ref(owner)[1]
    return "%s %s/%s" % (ref["kind"], owner["namespace"], owner["name"])


def _rbac_role(verb):
    """Where the RBAC file grants ``verb`` on the owner objects."""
    if verb == "patch":
        return "ClusterRole %s, bound in the owner's namespace, in %s" % (SYNC_PAUSER_ROLE, RBAC_FILE)
    return RBAC_FILE


def _api_failure(owner, verb, exc, check_mode=False):
    """A SpecDecodingError for an API answer that is not a success: 403 names the verb, the resource and the RBAC file."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.pods import api_error_message  # pylint: disable=import-outside-toplevel
    ref = owner_ref(owner)[1]
    status = getattr(exc, "status", None)
    resource = "%s.%s" % (ref["plural"], ref["group"])
    if status == 403:
        return ValidationError("%s of %s denied: the credentials may not %s %s in namespace %s (%s)"
                               % (verb, owner_label(owner), verb, resource, owner["namespace"], api_error_message(exc)),
                               field="owner", hint="grant %s on %s in %s (%s)" % (verb, resource, owner["namespace"], _rbac_role(verb)))
    if status == 404:
        return ValidationError("%s not found (%s)" % (owner_label(owner), api_error_message(exc)), field="owner",
                               hint="check the owner's name and namespace (kubectl get %s -n %s)" % (resource, owner["namespace"]))
    return SpecDecodingError("%s of %s failed%s: %s" % (verb, owner_label(owner), " (server dry run)" if check_mode else "",
                                                        api_error_message(exc)), field="owner")


def read_owner(api_client, owner):
    """The owner object as a dict (GET)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException, request  # pylint: disable=import-outside-toplevel
    try:
        return request(api_client, "GET", owner_path(owner))
    except ApiException as exc:
        raise _api_failure(owner, "get", exc) from exc


# ---------------------------------------------------------------------------------------------------------------
# The record


def record_of(obj, field="annotation"):
    """The parsed paused-sync annotation of an owner object (None when there is none)."""
    text = (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(PAUSED_SYNC_ANNOTATION)
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict) or record.get("kind") not in OWNERS or "previous" not in record:
        raise ValidationError("the annotation %s on the owner is not a record the collection wrote: %r" % (PAUSED_SYNC_ANNOTATION, text[:300]),
                              field=field, hint="restore the owner's sync by hand and remove the annotation "
                                                "(kubectl annotate ... %s-)" % PAUSED_SYNC_ANNOTATION)
    return record


def current_value(obj, kind):
    """spec.syncPolicy (Argo CD) or spec.suspend (Flux) as it is, _ABSENT when the key is not there."""
    return ((obj or {}).get("spec") or {}).get(OWNERS[kind]["field"], _ABSENT)


def sync_is_off(kind, value):
    """Whether automation is off with this syncPolicy / suspend value (None or _ABSENT: the key is absent)."""
    if kind == "flux":
        return value is True
    automated = (value or {}).get("automated") if isinstance(value, dict) else None
    return automated is None or automated.get("enabled") is False


def paused_form(kind, previous):
    """What pause leaves in place of ``previous`` (None: the key absent)."""
    if kind == "flux":
        return True
    if previous is None:
        return None
    return {key: value for key, value in previous.items() if key != "automated"}


def _plain(value):
    return None if value is _ABSENT else value


def _guards(obj, kind, value):
    """The test ops that make a concurrent edit fail the patch: the value being changed and the annotations as read;
    resourceVersion when either is absent (RFC 6902 cannot test for absence)."""
    meta = obj.get("metadata") or {}
    ops = []
    pointer = "/spec/" + OWNERS[kind]["field"]
    if value is not _ABSENT:
        ops.append({"op": "test", "path": pointer, "value": value})
    if meta.get("annotations") is not None:
        ops.append({"op": "test", "path": "/metadata/annotations", "value": meta["annotations"]})
    if (value is _ABSENT or meta.get("annotations") is None) and meta.get("resourceVersion"):
        ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]})
    return ops


def _switch_off_ops(kind, value):
    """The ops that turn the automation off (none when it is off already)."""
    if kind == "flux":
        return [] if value is True else [{"op": "add", "path": "/spec/suspend", "value": True}]
    if isinstance(value, dict) and "automated" in value:
        return [{"op": "remove", "path": "/spec/syncPolicy/automated"}]
    return []


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_pause(obj, owner, run_id, at=None):
    """What pause does to ``obj``: dict(ops, record, already_paused, paused_by_others, warnings). ``ops`` is empty when
    nothing is to change. A record already there is kept as is (the first pause's); only the automation is switched
    off again if someone turned it back on by hand meanwhile."""
    kind = owner_ref(owner)[0]
    value = current_value(obj, kind)
    record = record_of(obj)
    warnings = []
    if record is not None:
        if record["kind"] != kind:
            raise ValidationError("the paused-sync record on %s is for a %s owner" % (owner_label(owner), record["kind"]), field="owner",
                                  hint="remove the annotation %s and restore the sync by hand" % PAUSED_SYNC_ANNOTATION)
        # the same switch as a first pause (an automated block with enabled: false goes too, see the docstring)
        ops = _switch_off_ops(kind, value)
        if ops:
            warnings.append("%s was paused by run %s but its sync switch is back (changed by hand?): switched off again, the "
                            "first record kept" % (owner_label(owner), record.get("by")))
            ops = _guards(obj, kind, value) + ops
        return {"ops": ops, "record": record, "already_paused": True,
                "paused_by_others": sync_is_off(kind, record["previous"]), "warnings": warnings}
    record = {"kind": kind, "previous": _plain(value), "by": run_id, "at": at or now_rfc3339()}
    text = json.dumps(record, separators=(",", ":"))  # insertion order: syncPolicy's keys as the API server gave them
    annotations = (obj.get("metadata") or {}).get("annotations")
    if annotations is None:
        annotate = {"op": "add", "path": "/metadata/annotations", "value": {PAUSED_SYNC_ANNOTATION: text}}
    else:
        annotate = {"op": "add", "path": "/metadata/annotations/" + escape_pointer(PAUSED_SYNC_ANNOTATION), "value": text}
    paused_by_others = sync_is_off(kind, record["previous"])
    if paused_by_others:
        warnings.append("%s's sync was already off before this pause (%s): recorded as it is, and resume leaves it off"
                        % (owner_label(owner), "automated sync not enabled" if kind == "argocd" else "spec.suspend: true"))
    ops = _guards(obj, kind, value) + [annotate] + _switch_off_ops(kind, value)
    return {"ops": ops, "record": record, "already_paused": False, "paused_by_others": paused_by_others, "warnings": warnings}


def plan_resume(obj, owner):
    """What resume does to ``obj``: dict(ops, record, restored, edited_while_paused, warnings); ``ops`` is empty and
    ``record`` None when there is no record (nothing the collection paused)."""
    kind = owner_ref(owner)[0]
    record = record_of(obj)
    if record is None:
        return {"ops": [], "record": None, "restored": None, "edited_while_paused": False, "warnings": []}
    if record["kind"] != kind:
        raise ValidationError("the paused-sync record on %s is for a %s owner" % (owner_label(owner), record["kind"]), field="owner",
                              hint="remove the annotation %s and restore the sync by hand" % PAUSED_SYNC_ANNOTATION)
    value = current_value(obj, kind)
    previous = record["previous"]
    pointer = "/spec/" + OWNERS[kind]["field"]
    text = obj["metadata"]["annotations"][PAUSED_SYNC_ANNOTATION]
    warnings = []
    edited = _plain(value) != paused_form(kind, previous)
    if not edited:
        target = previous
    elif kind == "argocd":
        # Someone changed the syncPolicy while it was paused: keep their keys, put back only the automation recorded
        # (an automated block they added themselves wins).
        target = copy.deepcopy(_plain(value)) or {}
        if isinstance(previous, dict) and "automated" in previous and "automated" not in target:
            target["automated"] = previous["automated"]
        warnings.append("%s's syncPolicy was changed while paused (now %s, paused form %s): kept, with the recorded automated "
                        "sync put back" % (owner_label(owner), json.dumps(_plain(value)), json.dumps(paused_form(kind, previous))))
    else:
        target = _plain(value)  # someone set spec.suspend by hand while paused: theirs stands
        warnings.append("%s's spec.suspend was changed while paused (now %s): left as it is" % (owner_label(owner), json.dumps(target)))
    ops = [{"op": "test", "path": "/metadata/annotations/" + escape_pointer(PAUSED_SYNC_ANNOTATION), "value": text}]
    if value is not _ABSENT:
        ops.append({"op": "test", "path": pointer, "value": value})
    if target is None:
        if value is not _ABSENT:
            ops.append({"op": "remove", "path": pointer})
    elif value is _ABSENT or target != value:
        ops.append({"op": "add", "path": pointer, "value": target})
    ops.append({"op": "remove", "path": "/metadata/annotations/" + escape_pointer(PAUSED_SYNC_ANNOTATION)})
    return {"ops": ops, "record": record, "restored": target, "edited_while_paused": edited, "warnings": warnings}


# ---------------------------------------------------------------------------------------------------------------
# The calls


def _patch(api_client, owner, ops, check_mode):
    """The one patch writer (kube/writer.py) under the rollback's field manager; a test op that no longer holds on a fresh
    read of the owner is its PatchConflict."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import writer  # pylint: disable=import-outside-toplevel
    return writer.json_patch(api_client, owner_path(owner), ops, field_manager=ROLLBACK_FIELD_MANAGER, dry_run=check_mode,
                             read=lambda: read_owner(api_client, owner))


def _send(api_client, owner, ops, check_mode, verb):
    """The patch; a concurrent edit (a test op that no longer holds) is a ConflictError: the patch is all or nothing, so
    nothing was written. Returns the object as the API server answered."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.writer import PatchConflict  # pylint: disable=import-outside-toplevel
    try:
        return _patch(api_client, owner, ops, check_mode)
    except PatchConflict as exc:
        raise ConflictError("%s changed between this run's read and its %s (nothing was written)" % (owner_label(owner), verb),
                            field="owner", hint="run the task again: it reads the owner afresh") from exc
    except ApiException as exc:
        raise _api_failure(owner, "patch", exc, check_mode) from exc


def _view(obj, kind):
    """The part of the owner this module changes, for diff mode."""
    value = current_value(obj, kind)
    view = {OWNERS[kind]["field"]: _plain(value)} if value is not _ABSENT else {}
    annotation = (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(PAUSED_SYNC_ANNOTATION)
    if annotation is not None:
        view["annotations"] = {PAUSED_SYNC_ANNOTATION: annotation}
    return view


def _result(owner, obj, ops, changed, check_mode, answer):
    kind, ref = owner_ref(owner)
    after = answer if answer is not None and not check_mode else (apply_patch(obj, [op for op in ops if op["op"] != "test"]) if ops else obj)
    return {"changed": changed,
            "owner": copy.deepcopy(owner),
            "owner_object": {"api_version": "%s/%s" % (ref["group"], ref["version"]), "kind": ref["kind"],
                             "name": owner["name"], "namespace": owner["namespace"]},
            "patch": ops,
            "diff": {"before": _view(obj, kind), "after": _view(after, kind)}}


# How often a pause plans again on a fresh read when only the owner's resourceVersion moved (see pause).
STATUS_ONLY_REPLANS = 2


def _guarded(obj, kind):
    """What a pause's guards hold on ``obj``: the sync switch's value and the annotations."""
    return json.dumps([_plain(current_value(obj, kind)), ((obj or {}).get("metadata") or {}).get("annotations")], sort_keys=True)


def pause(api_client, owner, run_id, check_mode=False):
    """Pause the owner's sync and record what it was (see the module docstring). Returns the module's result: changed,
    owner, previous (the record's), record, paused (True), resumed (False), already_paused, paused_by_others, patch,
    diff, warnings. Check mode sends the patch as a server dry run."""
    if not run_id:
        raise ValidationError("a run id is required to pause", field="run_id", hint="pass the run's id (e.g. the rollback's run id)")
    obj = read_owner(api_client, owner)
    kind = owner_ref(owner)[0]
    for attempt in range(STATUS_ONLY_REPLANS + 1):
        plan = plan_pause(obj, owner, run_id)
        try:
            answer = _send(api_client, owner, plan["ops"], check_mode, "pause") if plan["ops"] else None
            break
        except ConflictError:
            # Where the pause guards with resourceVersion (spec.suspend or the annotations absent: RFC 6902 cannot test
            # for absence), a controller's status write fails the patch too: Flux's kustomize-controller and Argo CD's
            # application controller write status on every reconcile. When what the pause changes and guards is as it was
            # read, plan again on the fresh object; a real edit of it stays a conflict, with nothing written.
            fresh = read_owner(api_client, owner)
            if attempt == STATUS_ONLY_REPLANS or _guarded(fresh, kind) != _guarded(obj, kind):
                raise
            obj = fresh
    result = _result(owner, obj, plan["ops"], bool(plan["ops"]), check_mode, answer)
    result.update(previous=plan["record"]["previous"], record=plan["record"], paused=True, resumed=False,
                  already_paused=plan["already_paused"], paused_by_others=plan["paused_by_others"], warnings=plan["warnings"])
    return result


def resume(api_client, owner, check_mode=False):
    """Put back what the record on the owner says and remove the record; without a record a no-op (changed false).
    Returns the module's result: changed, owner, previous, restored, paused (False), resumed, paused_by_others,
    edited_while_paused, patch, diff, warnings."""
    obj = read_owner(api_client, owner)
    plan = plan_resume(obj, owner)
    warnings = list(plan["warnings"])
    answer = None
    if plan["ops"]:
        try:
            answer = _send(api_client, owner, plan["ops"], check_mode, "resume")
        except ConflictError:
            # Another run resumed it between our read and our patch: the record is gone, which is what resume is for.
            if record_of(read_owner(api_client, owner)) is not None:
                raise
            warnings.append("%s was resumed by another run meanwhile" % owner_label(owner))
            plan = dict(plan, ops=[])
    kind = owner_ref(owner)[0]
    record = plan["record"]
    result = _result(owner, obj, plan["ops"], bool(plan["ops"]), check_mode, answer)
    if record is None and not warnings:
        warnings.append("%s has no %s record: nothing the collection paused, nothing resumed" % (owner_label(owner), PAUSED_SYNC_ANNOTATION))
    result.update(previous=record["previous"] if record else None, record=record, restored=plan["restored"], paused=False,
                  resumed=bool(plan["ops"]), paused_by_others=bool(record) and sync_is_off(kind, record["previous"]),
                  edited_while_paused=plan["edited_while_paused"], warnings=warnings)
    return result
