# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollback (and the roll-forward) of one InferenceService as a plan: a value built from what was read, before
anything is written.

``build`` reads nothing itself: it is given the InferenceService as read, a runtime reader (the ServingRuntime /
ClusterServingRuntime reads, kserve/isvc/runtime_readers.py) and, for the live write, who owns the object (``owner_of``:
gitops/owner.py's check, which refuses a write Argo CD or Flux would undo). It answers with a ``RollbackPlan``: what to
strip or set (kserve/isvc/patch_plan.py's plan and its guarded JSON patch), the backup, where the flag comes from
(the InferenceService's command/args or env, or the ServingRuntime it runs on) and what the runtime needs (nothing, a
per-service copy, or the shared runtime's strip). ops/rollback.py acts on it through the cluster service; a plan built
from a manifest instead of the live object (no reader, no owner) says the same about the object's own flag.
"""

from __future__ import annotations

import os

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime as srt
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.releases import refuse_unknown_speculative_fields
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config


class RollbackPlan:
    """What one rollback (or roll-forward) will write, and why; built by ``build``.

    ``isvc`` the object as read; ``strip`` patch_plan's plan (``changed``, ``containers``, ``previous_config``,
    ``legacy_flags`` ...); ``canonical`` the config JSON set (roll-forward) or None; ``backup`` the backup document and
    ``annotation`` its annotation value (``truncated`` when only the config fitted); ``ops`` the InferenceService's JSON
    patch (with the switch to a runtime copy); ``runtime`` where the flag comes from (kind, name, source, fix) or None
    when not checked; ``runtime_users`` the InferenceServices sharing that runtime; ``runtime_fix`` None,
    ``{"fix": "copy", "body"}`` or ``{"fix": "edit", "kind", "name", "runtime", "ops"}``; ``owners`` the owner of each
    object the act writes (gitops/owner.py's dicts); ``warnings`` what the caller passes on."""

    def __init__(self, isvc, strip, canonical=None):
        self.isvc = isvc
        self.strip = strip
        self.strip_changed = strip.changed  # read once: patch_plan computes it
        self.canonical = canonical
        self.backup = None
        self.annotation = None
        self.truncated = False
        self.ops = []
        self.runtime = None
        self.runtime_checked = False
        self.runtime_users = None
        self.runtime_fix = None
        self.previous_config = None
        self.owners = []
        self.warnings = []
        self.changed = False  # something to write: the InferenceService's patch or the runtime's fix
        self.result = {}  # the module result's keys the plan decides


def _result(state, plan):
    """The module result's keys the plan decides (before anything is written)."""
    out = {"previous_config": plan.previous_config, "containers": plan.strip.containers, "backup_truncated": plan.truncated}
    if state == "absent":
        out["previous_legacy_flags"] = plan.strip.legacy_flags
    if plan.canonical is not None:
        out["json"] = plan.canonical
    if plan.runtime_checked:
        out["runtime"] = plan.runtime
    if plan.runtime_users is not None:
        out["runtime_users"] = plan.runtime_users
    return out


def config_of(resource):
    """The speculative config an InferenceService runs with, or None (also when it cannot be read)."""
    try:
        return isvc_patch.current_config(resource)
    except SpecDecodingError:
        return None


def backup_path(path, namespace, name):
    """The backup file: ``path`` itself, or in a directory ``<namespace>.<name>.speculative-backup.json``."""
    if os.path.isdir(path):
        return os.path.join(path, "%s.%s.speculative-backup.json" % (namespace, name))
    return path


def _canonical(config, vllm_version, warnings, field="config"):
    result = speculative_config.validate(config, vllm_version=vllm_version, field=field)
    warnings.extend(result.warnings)
    return result.json


def _read_backup(params, isvc):
    if params["backup"] == "file":
        path = backup_path(params["backup_file"], params["namespace"], params["name"])
        if not os.path.exists(path):
            raise ValidationError("no backup file at %s" % path, field="backup_file",
                                  hint="give the file a rollback wrote, or use backup: annotation")
        with open(path, encoding="utf-8") as fh:
            return isvc_patch.parse_backup(fh.read(), field="backup_file")
    doc = isvc_patch.read_backup(isvc)
    if doc is None:
        raise ValidationError("InferenceService %s/%s has no %s annotation to roll forward from" % (
            params["namespace"], params["name"], isvc_patch.BACKUP_ANNOTATION), field="restore_backup",
            hint="roll forward with state=present and config, or use backup: file with the backup_file a rollback wrote")
    return doc


def _strip_or_set(params, isvc, warnings):
    """patch_plan's plan for the state asked, and the canonical config JSON set (None for the rollback)."""
    # a rollback that cannot see the flag must not report it gone (kserve/releases.py); nothing is written
    refuse_unknown_speculative_fields(isvc)
    if params["state"] == "absent":
        return isvc_patch.plan_strip(isvc, container_name=params["container"]), None
    if params["restore_backup"]:
        doc = _read_backup(params, isvc)
        canonical = _canonical(doc["config"], params["vllm_version"], warnings, field="backup.config") if doc.get("config") else None
        return isvc_patch.plan_restore(isvc, doc, canonical), canonical
    canonical = _canonical(params["config"], params["vllm_version"], warnings)
    return isvc_patch.plan_set(isvc, canonical, container_name=params["container"]), canonical


def _patch(params, plan):
    """The InferenceService's guarded JSON patch and the backup (patch_plan.add_patch: kept when the plan changes a flag
    worth keeping; not on a roll-forward from the backup itself)."""
    restoring = params["state"] == "present" and params["restore_backup"]
    strip = isvc_patch.add_patch(plan.isvc, plan.strip, backup="none" if restoring else params["backup"], guard=params["guard"])
    plan.ops, plan.backup, plan.annotation, plan.truncated = strip.ops, strip.backup, strip.annotation, strip.truncated
    if plan.truncated:
        plan.warnings.append("the command lists are too big for the %s annotation (%d bytes max); only the config was kept there"
                             % (isvc_patch.BACKUP_ANNOTATION, isvc_patch.MAX_BACKUP_BYTES)
                             + ("" if params["backup"] == "both" else "; use backup: both with backup_file to keep them"))


def _runtime(params, plan, reader):
    """After the strip, does the runtime still pass a flag to vLLM? Asked once (runtime.rollback_runtime: one selection,
    one merge; the stripped command merged into the same runtime). Refuse (ValidationError), or plan the copy or the
    runtime edit into ``plan.runtime_fix`` (and the InferenceService's switch to the copy into ``plan.ops``)."""
    isvc = plan.isvc
    plan.runtime_checked = True
    stripped = isvc_patch.apply_patch(isvc, plan.ops) if plan.ops else isvc
    # the options are read only when a runtime's flag needs them (callers that never ask may leave them out)
    fix = "copy" if params.get("runtime_copy") else "edit" if params.get("edit_runtime") else None
    try:
        found = srt.rollback_runtime(isvc, stripped, reader, fix=fix)
    except ValidationError as exc:
        if exc.field not in ("spec.predictor.model.runtime", "spec.containers"):
            raise
        # KServe cannot run this predictor either (it says so in the status); the InferenceService's own flags still go
        why = " (servingruntimes/clusterservingruntimes not readable: 403 Forbidden; grant get/list, see docs/rollback.md)" \
            if reader.forbidden else ""
        plan.warnings.append("%s%s: the runtime's command is not checked for --speculative-config" % (exc, why))
        return
    plan.runtime = found["runtime"]
    if found["users"] is None:  # the runtime's flag does not reach vLLM after the strip
        return
    plan.runtime_users = found["users"]
    if plan.previous_config is None:
        plan.previous_config = found["previous_config"]
    plan.runtime_fix = found["fix"]
    if fix == "copy":
        copy_name = plan.runtime_fix["body"]["metadata"]["name"]
        model_path = "/spec/predictor/model/runtime"
        current = isvc["spec"]["predictor"]["model"].get("runtime")
        if current:
            switch = [{"op": "test", "path": model_path, "value": current},
                      {"op": "replace", "path": model_path, "value": copy_name}]
        else:
            switch = [{"op": "test", "path": "/metadata/resourceVersion", "value": isvc["metadata"]["resourceVersion"]},
                      {"op": "add", "path": model_path, "value": copy_name}]
        plan.ops = plan.ops + switch
    else:
        plan.warnings.append("edit_runtime: stripping --speculative-config from the %s %s; every InferenceService using it loses "
                             "speculative decoding: %s" % (plan.runtime_fix["kind"], plan.runtime_fix["name"],
                                                           ", ".join(plan.runtime_users) or "none found"))


def build(params, isvc, reader=None, owner_of=None):
    """The RollbackPlan for ``isvc`` as read (module isvc_speculative's options in ``params``). ``reader``: the runtime
    reads (the rollback checks the runtime's command; None: not checked). ``owner_of(obj, what, warn)``: who owns an object
    the plan writes (raises the refusal of a live write; None: not asked). Raises the refusals (ValidationError); reads
    and writes nothing else."""
    warnings = []
    strip, canonical = _strip_or_set(params, isvc, warnings)
    plan = RollbackPlan(isvc, strip, canonical)
    plan.warnings = warnings
    _patch(params, plan)
    plan.previous_config = strip.previous_config if params["state"] == "absent" else config_of(isvc)
    if params["state"] == "absent" and reader is not None:
        _runtime(params, plan, reader)
    # plain values: the act reads them without coming back here
    plan.changed = bool(plan.ops) or plan.runtime_fix is not None
    plan.result = _result(params["state"], plan)
    if plan.changed and owner_of is not None:
        # an owner that syncs the object would put the flag back (issue 47); edit_runtime also writes the shared runtime
        plan.owners.append(owner_of(isvc, "InferenceService %s/%s" % (params["namespace"], params["name"]), plan.warnings.append))
        fix = plan.runtime_fix or {}
        if fix.get("fix") == "edit":
            plan.owners.append(owner_of(fix["runtime"], "%s %s" % (fix["kind"], fix["name"]), plan.warnings.append))
    return plan
