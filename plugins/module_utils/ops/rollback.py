# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollback (strip every speculative flag) and the roll-forward (set it again) of one InferenceService.

What module ``isvc_speculative`` does, as plain Python: ``check_params`` refuses contradicting options, ``run`` reads the
InferenceService and its runtime through the cluster service (kube/service.py: the module's, built once per task),
builds the plan from the reads (ops/rollback_plan.py: what to strip, where the flag comes from, the runtime's fix, who
owns the object) and ``act`` writes it through the same service: one guarded JSON patch (and the runtime copy or runtime
edit when the flag comes from the ServingRuntime), the backup kept; then it waits (the one waiter) and removes the
draft's storageUris entry when asked. Errors are SpecDecodingErrors that name the option and the fix.
"""

from __future__ import annotations

import copy
import json

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files as local_files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.credentials import redact
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ConflictError, SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner as gitops_owner
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime as serving_runtime
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import cluster as llmisvc_cluster
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import status as llmisvc_status
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import writer as kube_writer
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback_plan


def check_params(params):
    """Refuse options that contradict each other, before the InferenceService is read."""
    if params["state"] == "present" and params["config"] is None and not params["restore_backup"]:
        raise ValidationError("state=present needs config (a mapping or JSON string)", field="config",
                              hint="pass config, or restore_backup: true to roll forward from the backup")
    if params["state"] == "absent" and (params["config"] is not None or params["restore_backup"]):
        raise ValidationError("only apply to state=present", field="config/restore_backup", hint="drop them, or use state: present")
    if params["retries"] < 0:
        raise ValidationError("must be 0 or more", field="retries")
    if params["runtime_copy"] and params["edit_runtime"]:
        raise ValidationError("choose one - a per-service runtime copy without the flag, or the flag stripped from the shared runtime",
                              field="runtime_copy/edit_runtime")
    if params["state"] == "present" and (params["runtime_copy"] or params["edit_runtime"]):
        raise ValidationError("only apply to state=absent (the rollback)", field="runtime_copy/edit_runtime", hint="drop them")


def _api_error(exc):
    return kube_service.api_error_message(exc)


def write_backup_file(params, doc):
    """The backup document (with the object's namespace and name) at backup_file, readable by its owner only; written
    whole (artifacts/files.py): a rerun after a kill finds the old backup or the new one."""
    path = rollback_plan.backup_path(params["backup_file"], params["namespace"], params["name"])
    payload = dict(doc, namespace=params["namespace"], name=params["name"])
    return local_files.write_whole(path, json.dumps(payload, indent=2, sort_keys=True) + "\n", mode=0o600, make_parent=True)


def crash_loop_check(params):
    """wait_ready's crash-loop arguments from a module's wait options (doc fragment inference_service.WAIT): a rolled-back
    revision that crash-loops fails the wait at once, with KServe's lastFailureInfo and the container's previous log tail
    (secrets redacted), instead of at wait_timeout (20 minutes by default)."""
    return {"crash_loop_restarts": params["wait_crash_loop_restarts"], "redact": redact}


# -- the reads and writes of one InferenceService on the cluster service --------------------------------------------

def _read(service, params):
    return service.inference_service(params["namespace"], params["name"])


def _patch(service, params, ops, dry_run):
    # A named field manager (the writer's default, the rollback's): a later server-side apply (the deploy) that conflicts
    # with this edit names the rollback. A failed ``test`` is judged on a fresh read of the object.
    return service.json_patch(kube_service.INFERENCE_SERVICE, params["name"], ops, namespace=params["namespace"], dry_run=dry_run,
                              read=lambda: _read(service, params))


def _wait_ready(service, params):
    """The one waiter (kserve/wait.py over kube/wait.py): Ready at the generation, a crash loop failing at once."""
    return isvc_wait.wait_ready(service.api_client, params["namespace"], params["name"], timeout=params["wait_timeout"],
                                interval=params["wait_sleep"], **crash_loop_check(params))


def _owner_check(service, params):
    """The plan's owner question, ``owner_of(obj, what, warn)``: gitops/owner.py's check with the module's gitops_owner
    policy (it reads the owner object through the service's client only when the object's marks name one)."""
    policy = params.get("gitops_owner", "refuse")
    return lambda obj, what, warn: gitops_owner.check_live_write(service.api_client, obj, policy, what, warn=warn)


def run(service, params, check_mode=False, diff=False):
    """Module isvc_speculative: (result, warnings). ``service``: the task's cluster service (kube/service.ClusterService).
    Each attempt reads the InferenceService, builds the plan from the reads (rollback_plan.build, the runtime read
    through runtime_readers.ClientReader on the service) and acts on it (``act``); a patch refused because the object
    changed meanwhile plans again on a fresh read, up to ``retries`` times."""
    warnings = []
    result = dict(changed=False, containers=[], patch=[], backup_truncated=False, attempts=0)
    attempts = 0
    while True:
        isvc = _read(service, params)
        reader = runtime_readers.ClientReader(service) if params["state"] == "absent" else None
        # the owner is asked before the first write only: a retry writes the same objects
        plan = rollback_plan.build(params, isvc, reader=reader, owner_of=_owner_check(service, params) if attempts == 0 else None)
        warnings.extend(plan.warnings)
        result.update(plan.result)
        if not plan.changed:
            result.update(resource=isvc, config=rollback_plan.config_of(isvc))
            break
        attempts += 1
        try:
            act(service, params, plan, result, check_mode=check_mode, diff=diff)
        except kube_writer.PatchConflict as exc:
            if attempts <= params["retries"]:
                continue
            raise ConflictError(
                "InferenceService %s/%s changed between read and write; nothing was overwritten (%s)"
                % (params["namespace"], params["name"], _api_error(exc.api_error)), field="name",
                hint="re-run to plan on the fresh object, or set retries to re-read and retry automatically") from exc
        break
    result["attempts"] = attempts
    if check_mode:
        return result, warnings

    if params["wait"]:
        ready, elapsed = _wait_ready(service, params)
        result["ready"] = {"ready": True, "generation": ready["metadata"].get("generation"), "elapsed": round(elapsed, 1)}
        result["resource"] = ready
    if params["remove_draft_artifacts"] and params["state"] == "absent":
        result["draft_artifacts"] = remove_draft(params, service, result, warnings)
    return result, warnings


def act(service, params, plan, result, check_mode=False, diff=False):
    """Write ``plan`` through the cluster service: the runtime's fix first (a copy to switch to, or the shared runtime's
    strip), the backup file, then the InferenceService's one guarded JSON patch (a server dry run in check mode). A
    PatchConflict (the InferenceService changed since it was read) passes through: the caller plans again."""
    if plan.runtime_fix is not None:
        apply_runtime_fix(service, params, plan.runtime_fix, result, check_mode)
        if not plan.ops:
            resource = _read(service, params) if not check_mode else plan.isvc
            result.update(isvc_patch.outcome(resource), changed=True, resource=resource)
            return
    if plan.backup is not None and params["backup"] in ("file", "both") and not check_mode:
        result["backup_file"] = write_backup_file(params, plan.backup)
    try:
        after = _patch(service, params, plan.ops, dry_run=check_mode)
    except kube_writer.PatchConflict:
        raise
    except Exception as exc:  # pylint: disable=broad-except
        if getattr(exc, "status", None) is None:
            raise
        raise SpecDecodingError("patching InferenceService %s/%s failed: %s" % (params["namespace"], params["name"], _api_error(exc)),
                                field="name") from exc
    # the config it runs with now and, in diff mode, the diff: one question to patch_plan
    result.update(isvc_patch.outcome(after, plan.isvc if diff else None), changed=True, patch=plan.ops, resource=after)
    if plan.backup is not None:
        result["backup"] = plan.backup


def _existing_copy(service, meta):
    """The ServingRuntime named as the copy, or None (also when not readable: the create then says whether it may be
    written); another refusal says what was read."""
    try:
        return service.get(kube_service.SERVING_RUNTIME, meta["name"], meta["namespace"], missing="none")
    except ApiException as exc:
        if getattr(exc, "status", None) == 403:
            return None
        raise SpecDecodingError("reading %ss failed: %s" % (serving_runtime.SERVING_RUNTIME, _api_error(exc)), field="runtime") from exc


def _create_runtime_copy(service, params, body, dry_run):
    """Create (or, when it exists with our labels, keep) the per-service ServingRuntime copy: (object, created)."""
    meta = body["metadata"]
    existing = _existing_copy(service, meta)
    if existing is not None:
        if (existing["metadata"].get("labels") or {}).get(serving_runtime.COPY_FOR_LABEL) != meta["labels"][serving_runtime.COPY_FOR_LABEL]:
            raise ValidationError("ServingRuntime %s/%s exists and was not made by this collection for %s" % (
                meta["namespace"], meta["name"], params["name"]), field="runtime_copy",
                hint="delete or rename that ServingRuntime, or use edit_runtime")
        return existing, False
    return service.create(kube_service.SERVING_RUNTIME, body, namespace=meta["namespace"], dry_run=dry_run), True


def apply_runtime_fix(service, params, fix, result, check_mode):
    """Create the per-service copy or patch the shared runtime (a server dry run in check mode)."""
    try:
        if fix["fix"] == "copy":
            created, new = _create_runtime_copy(service, params, fix["body"], dry_run=check_mode)
            result["runtime"]["copy_created"] = new
            result["runtime_copy"] = created
        elif fix["ops"]:
            res = kube_service.SERVING_RUNTIME if fix["kind"] == kube_service.SERVING_RUNTIME.kind else kube_service.CLUSTER_SERVING_RUNTIME
            service.json_patch(res, fix["name"], fix["ops"], namespace=params["namespace"], dry_run=check_mode)
    except Exception as exc:  # pylint: disable=broad-except
        # a PatchConflict (the runtime changed since it was read) is said as the API server said it
        cause = exc.api_error if isinstance(exc, kube_writer.PatchConflict) else exc
        if cause is exc and (isinstance(exc, SpecDecodingError) or getattr(exc, "status", None) is None):
            raise
        what = "creating ServingRuntime %s" % fix["body"]["metadata"]["name"] if fix["fix"] == "copy" else \
            "stripping the flag from %s %s" % (fix["kind"], fix["name"])
        field = "runtime_copy" if fix["fix"] == "copy" else "edit_runtime"
        raise ConflictError("%s failed, nothing else was changed: %s" % (what, _api_error(cause)), field=field,
                            hint="re-run the rollback (it plans again on the fresh objects)") from exc
    result["changed"] = True


def remove_draft(params, service, result, warnings):
    """Drop the draft's storageUris entry once the rolled-back revision is Ready at its generation."""
    isvc = _read(service, params)
    state = isvc_readers.readiness(isvc)
    if not (state["ready"] and state["up_to_date"]):
        raise ValidationError("the rolled-back revision is not Ready at generation %s yet (observedGeneration %s); the draft stays"
                              % (state["generation"], state["observed_generation"]), field="remove_draft_artifacts",
                              hint="set wait: true so the module waits for it")
    previous = result.get("previous_config")
    if previous is None:
        backup = isvc_patch.read_backup(isvc)
        previous = (backup or {}).get("config")
    draft_path = (previous or {}).get("model")
    ops, removed, note = isvc_patch.plan_remove_draft_storage(isvc, draft_path)
    if not ops:
        if removed is None and draft_path and "storageUris" not in note:
            warnings.append(note)
        return {"removed": None, "note": note}
    if not result["changed"]:  # the rollback's own write checked the owner already
        _owner_check(service, params)(isvc, "InferenceService %s/%s" % (params["namespace"], params["name"]), warnings.append)
    try:
        _patch(service, params, ops, dry_run=False)
    except Exception as exc:  # pylint: disable=broad-except
        cause = exc.api_error if isinstance(exc, kube_writer.PatchConflict) else exc
        if getattr(cause, "status", None) is None:
            raise
        raise SpecDecodingError("removing the draft's storageUris entry failed: %s" % _api_error(cause), field="remove_draft_artifacts") from exc
    result["changed"] = True
    if params["wait"]:
        result["resource"], _elapsed = _wait_ready(service, params)
    return {"removed": removed, "note": note}


# Module llmisvc_speculative: the rollback of a KServe LLMInferenceService (read the flags of every pool, strip them).

def _patch_llmisvc(api_client, params, ops, dry_run):
    """The strip through the one patch writer; a failed ``test`` is judged on a fresh read of the object."""
    service = kube_service.service_of(api_client)
    return service.json_patch(kube_service.LLM_INFERENCE_SERVICE.at(params["api_version"]), params["name"], ops,
                              namespace=params["namespace"], dry_run=dry_run,
                              read=lambda: llmisvc_cluster.get(service.api_client, params["namespace"], params["name"], params["api_version"]))


def strip_llmisvc(api_client, params, check_mode=False, diff=False, warn=None):
    """Module llmisvc_speculative: (changed, result) - every speculative flag of an LLMInferenceService's pools (also those
    its presets and env sources set) and, with state=absent, one guarded JSON patch that strips them. `warn(text)` passes
    warnings on."""

    obj = llmisvc_cluster.get(api_client, params["namespace"], params["name"], params["api_version"])
    prefix = params["config_prefix"]
    unreadable = []
    presets = llmisvc_cluster.read_presets(api_client, obj, params["config_namespace"], params["api_version"], config_prefix=prefix,
                                           unreadable=unreadable)
    for preset in unreadable:
        if warn is not None:
            warn("could not read KServe's well-known preset %s (forbidden): a flag it sets is not seen here; the engine "
                 "line on the pods still shows what runs" % preset)
    env_sources = llmisvc_cluster.read_env_sources(api_client, obj, presets, config_prefix=prefix)
    found = llmisvc.flags(obj, presets, env_sources, config_prefix=prefix)
    previous = {pool: None for pool in llmisvc_status.pools_of(obj)}
    for entry in found:
        if previous.get(entry["pool"]) is None:
            previous[entry["pool"]] = entry["config"]
    for entry in found:
        entry.pop("unstrippable", None)
    result = {"flags": found, "previous_config": previous, "changes": [], "patch": [], "resource": obj,
              "generation": obj["metadata"].get("generation")}
    if params["state"] == "query":
        return False, result
    ops, changes = llmisvc.strip(obj, presets, env_sources, secret_env_has_no_flag=params["secret_env_has_no_flag"], config_prefix=prefix)
    result.update(changes=changes, patch=ops)
    if not ops:
        return False, result
    gitops_owner.check_live_write(api_client, obj, params.get("gitops_owner", "refuse"),
                                  "LLMInferenceService %s/%s" % (params["namespace"], params["name"]), warn=warn)
    try:
        after = _patch_llmisvc(api_client, params, ops, check_mode)
    except kube_writer.PatchConflict as exc:
        raise SpecDecodingError("LLMInferenceService %s/%s changed while the rollback read it (a JSON patch test failed)"
                                % (params["namespace"], params["name"]), field="name", hint="rerun the rollback") from exc
    except ApiException as exc:
        raise llmisvc_cluster.api_error("patching LLMInferenceService %s/%s" % (params["namespace"], params["name"]), exc,
                                        "name") from exc
    result.update(resource=after, generation=after["metadata"].get("generation"))
    if diff:
        result["diff"] = {"before": {"spec": copy.deepcopy(obj.get("spec"))}, "after": {"spec": after.get("spec")}}
    return True, result
