# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollback (strip every speculative flag) and the roll-forward (set it again) of one InferenceService.

What module ``isvc_speculative`` does, as plain Python: ``check_params`` refuses contradicting options, ``run`` reads the
InferenceService through a ``Cluster``, plans the change (``isvc_patch``), writes it in one guarded JSON patch (and the
runtime copy or runtime edit when the flag comes from the ServingRuntime), keeps the backup, waits and removes the
draft's storageUris entry when asked. Errors are SpecDecodingErrors that name the option and the fix.
"""

from __future__ import annotations

import copy
import json
import os

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.releases import refuse_unknown_speculative_fields
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ConflictError, SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner as gitops_owner
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.ssa_conflicts import ROLLBACK_FIELD_MANAGER

GROUP = "serving.kserve.io"
VERSION = "v1beta1"
PLURAL = "inferenceservices"

FIELD_MANAGER = ROLLBACK_FIELD_MANAGER


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


class Cluster:
    """The three API calls the module makes, over kubernetes.core's authenticated ApiClient."""

    def __init__(self, api_client, namespace, name):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import CustomObjectsApi  # pylint: disable=import-outside-toplevel
        self.api_client = api_client
        self.api = CustomObjectsApi(api_client)
        self.namespace = namespace
        self.name = name

    def get(self):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
        return k8s_pods.get_inference_service(self.api_client, self.namespace, self.name)

    def create_runtime(self, body, dry_run):
        """Create (or, when it exists with our labels, keep) the per-service ServingRuntime copy."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import (  # pylint: disable=import-outside-toplevel
            runtime as serving_runtime, runtime_readers,
        )
        meta = body["metadata"]
        kwargs = {"field_manager": FIELD_MANAGER}
        if dry_run:
            kwargs["dry_run"] = "All"
        existing = runtime_readers.ClientReader(self.api_client).get(serving_runtime.SERVING_RUNTIME, meta["namespace"], meta["name"])
        if existing is not None:
            if (existing["metadata"].get("labels") or {}).get(serving_runtime.COPY_FOR_LABEL) != meta["labels"][serving_runtime.COPY_FOR_LABEL]:
                raise ValidationError("ServingRuntime %s/%s exists and was not made by this collection for %s" % (
                    meta["namespace"], meta["name"], self.name), field="runtime_copy",
                    hint="delete or rename that ServingRuntime, or use edit_runtime")
            return existing, False
        return self.api.create_namespaced_custom_object(serving_runtime.GROUP, serving_runtime.RUNTIME_VERSION, meta["namespace"],
                                                        "servingruntimes", body, **kwargs), True

    def patch_runtime(self, kind, name, ops, dry_run):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import (  # pylint: disable=import-outside-toplevel
            runtime as serving_runtime,
        )
        kwargs = {"field_manager": FIELD_MANAGER}
        if dry_run:
            kwargs["dry_run"] = "All"
        group, version = serving_runtime.GROUP, serving_runtime.RUNTIME_VERSION
        if kind == serving_runtime.SERVING_RUNTIME:
            call = self.api.patch_namespaced_custom_object
            args = (group, version, self.namespace, "servingruntimes", name, ops)
        else:
            call = self.api.patch_cluster_custom_object
            args = (group, version, "clusterservingruntimes", name, ops)
        try:
            return call(*args, _content_type="application/json-patch+json", **kwargs)
        except TypeError:
            return call(*args, **kwargs)

    def patch(self, ops, dry_run):
        # A named field manager: a later server-side apply (the deploy) that conflicts with this edit names the rollback.
        kwargs = {"field_manager": FIELD_MANAGER}
        if dry_run:
            kwargs["dry_run"] = "All"
        try:
            return self.api.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name, ops,
                                                           _content_type="application/json-patch+json", **kwargs)
        except TypeError:  # kubernetes < 31 picks the content type from the body (a list: JSON patch)
            return self.api.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name, ops, **kwargs)


def _api_error(exc):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    return k8s_pods.api_error_message(exc)


def _is_conflict(exc, cluster, ops):
    """409, or a 422 whose cause is a failed ``test`` op: the tested values no longer hold on a fresh read.

    (The API server words a failed JSON-patch test differently across versions, e.g. only "the server
    rejected our request due to an error in our request", so the object itself is the judge.)
    """
    status = getattr(exc, "status", None)
    if status == 409:
        return True
    if status != 422 or not any(op.get("op") == "test" for op in ops):
        return False
    try:
        fresh = cluster.get()
    except SpecDecodingError:
        return True  # gone or unreadable since our read: someone else changed it
    return not isvc_patch.tests_hold(fresh, ops)


def _canonical(config, vllm_version, field="config"):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core  # pylint: disable=import-outside-toplevel
    result = core.validate(config, vllm_version=vllm_version, field=field)
    return result.json, result.config, list(result.warnings)


def _backup_path(path, namespace, name):
    if os.path.isdir(path):
        return os.path.join(path, "%s.%s.speculative-backup.json" % (namespace, name))
    return path


def _read_backup(params, isvc):
    if params["backup"] == "file":
        path = _backup_path(params["backup_file"], params["namespace"], params["name"])
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


def plan_once(params, isvc, warnings):
    """(plan, annotation value or None, backup doc or None, truncated, json or None) for the current object."""
    # a rollback that cannot see the flag must not report it gone (kserve/releases.py); nothing is written
    refuse_unknown_speculative_fields(isvc)
    canonical = None
    if params["state"] == "absent":
        plan = isvc_patch.plan_strip(isvc, container_name=params["container"])
    elif params["restore_backup"]:
        doc = _read_backup(params, isvc)
        if doc.get("config"):
            canonical, _normalised, warn = _canonical(doc["config"], params["vllm_version"], field="backup.config")
            warnings.extend(warn)
        plan = isvc_patch.plan_restore(isvc, doc, canonical)
        return plan, None, None, False, canonical
    else:
        canonical, _normalised, warn = _canonical(params["config"], params["vllm_version"])
        warnings.extend(warn)
        plan = isvc_patch.plan_set(isvc, canonical, container_name=params["container"])
    annotation = None
    doc = None
    truncated = False
    if plan.changed and params["backup"] != "none" and (plan.previous_config is not None or plan.previous_raw or plan.legacy_flags):
        doc = isvc_patch.backup_document(isvc, plan)
        if params["backup"] in ("annotation", "both"):
            annotation, truncated = isvc_patch.backup_annotation_value(doc)
            if truncated:
                warnings.append("the command lists are too big for the %s annotation (%d bytes max); only the config was kept there"
                                % (isvc_patch.BACKUP_ANNOTATION, isvc_patch.MAX_BACKUP_BYTES)
                                + ("" if params["backup"] == "both" else "; use backup: both with backup_file to keep them"))
    return plan, annotation, doc, truncated, canonical


def write_backup_file(params, doc):
    path = _backup_path(params["backup_file"], params["namespace"], params["name"])
    payload = dict(doc, namespace=params["namespace"], name=params["name"])
    tmp = path + ".tmp"
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def _config_after(resource):
    try:
        return isvc_patch.current_config(resource)
    except SpecDecodingError:
        return None


def crash_loop_check(params):
    """wait_ready's crash-loop arguments from a module's wait options (doc fragment inference_service.WAIT): a rolled-back
    revision that crash-loops fails the wait at once, with KServe's lastFailureInfo and the container's previous log tail
    (secrets redacted), instead of at wait_timeout (20 minutes by default)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.credentials import redact  # pylint: disable=import-outside-toplevel
    return {"crash_loop_restarts": params["wait_crash_loop_restarts"], "redact": redact}


def run(cluster, params, check_mode=False, diff=False):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel

    warnings = []
    result = dict(changed=False, containers=[], patch=[], backup_truncated=False, attempts=0)
    attempts = 0
    while True:
        isvc = cluster.get()
        plan, annotation, doc, truncated, canonical = plan_once(params, isvc, warnings)
        result.update(previous_config=plan.previous_config if params["state"] == "absent" else _config_after(isvc),
                      containers=plan.containers, backup_truncated=truncated)
        if params["state"] == "absent":
            result["previous_legacy_flags"] = plan.legacy_flags
        if canonical is not None:
            result["json"] = canonical
        runtime_fix = plan_runtime(params, cluster, isvc, plan, result, warnings) if params["state"] == "absent" else None
        if not plan.changed and runtime_fix is None:
            result.update(resource=isvc, config=_config_after(isvc))
            break
        if attempts == 0:  # before the first write: an owner that syncs the object would put the flag back (issue 47)
            gitops_owner.check_live_write(getattr(cluster, "api_client", None), isvc, params.get("gitops_owner", "refuse"),
                                          "InferenceService %s/%s" % (params["namespace"], params["name"]), warn=warnings.append)
            if (runtime_fix or {}).get("fix") == "edit":  # edit_runtime patches the shared runtime: its owner counts too
                gitops_owner.check_live_write(cluster.api_client, runtime_fix["runtime"], params.get("gitops_owner", "refuse"),
                                              "%s %s" % (runtime_fix["kind"], runtime_fix["name"]), warn=warnings.append)
        ops = isvc_patch.build_patch(isvc, plan, annotation_value=annotation, guard=params["guard"]) if plan.changed else []
        if runtime_fix is not None:
            apply_runtime_fix(cluster, runtime_fix, result, check_mode)
            ops += runtime_fix.get("isvc_ops") or []
            if not ops:
                result.update(changed=True, resource=cluster.get() if not check_mode else isvc)
                result["config"] = _config_after(result["resource"])
                break
        if doc is not None and params["backup"] in ("file", "both") and not check_mode:
            result["backup_file"] = write_backup_file(params, doc)
        attempts += 1
        try:
            after = cluster.patch(ops, dry_run=check_mode)
        except Exception as exc:  # pylint: disable=broad-except
            if getattr(exc, "status", None) is None:
                raise
            if _is_conflict(exc, cluster, ops):
                if attempts <= params["retries"]:
                    continue
                raise ConflictError(
                    "InferenceService %s/%s changed between read and write; nothing was overwritten (%s)"
                    % (params["namespace"], params["name"], _api_error(exc)), field="name",
                    hint="re-run to plan on the fresh object, or set retries to re-read and retry automatically") from exc
            raise SpecDecodingError("patching InferenceService %s/%s failed: %s" % (params["namespace"], params["name"], _api_error(exc)),
                                    field="name") from exc
        result.update(changed=True, patch=ops, resource=after, config=_config_after(after))
        if doc is not None:
            result["backup"] = doc
        if diff:
            result["diff"] = {"before": isvc_patch.diff_view(isvc), "after": isvc_patch.diff_view(after)}
        break
    result["attempts"] = attempts
    if check_mode:
        return result, warnings

    if params["wait"]:
        ready, elapsed = isvc_wait.wait_ready(cluster.api_client, params["namespace"], params["name"],
                                              timeout=params["wait_timeout"], interval=params["wait_sleep"],
                                              **crash_loop_check(params))
        result["ready"] = {"ready": True, "generation": ready["metadata"].get("generation"), "elapsed": round(elapsed, 1)}
        result["resource"] = ready
    if params["remove_draft_artifacts"] and params["state"] == "absent":
        result["draft_artifacts"] = remove_draft(params, cluster, result, warnings)
    return result, warnings


def plan_runtime(params, cluster, isvc, plan, result, warnings):
    """After the strip, does the runtime still pass a flag to vLLM? Refuse, or plan the copy or the runtime edit.

    Returns None (nothing to do in the runtime), {"fix": "copy", "body": ..., "isvc_ops": [...]} or
    {"fix": "edit", "kind": ..., "name": ..., "runtime": {...}, "ops": [...]}; raises ValidationError (the refusal) otherwise.
    """
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime as srt  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers  # pylint: disable=import-outside-toplevel

    reader = runtime_readers.ClientReader(cluster.api_client)
    try:
        before = srt.effective_command(isvc, reader)
    except ValidationError as exc:
        if exc.field not in ("spec.predictor.model.runtime", "spec.containers"):
            raise
        # KServe cannot run this predictor either (it says so in the status); the InferenceService's own flags still go
        why = " (servingruntimes/clusterservingruntimes not readable: 403 Forbidden; grant get/list, see docs/rollback.md)" \
            if reader.forbidden else ""
        warnings.append("%s%s: the runtime's command is not checked for --speculative-config" % (exc, why))
        result["runtime"] = None
        return None
    info = {"kind": before.kind, "name": before.runtime_name, "source": before.source(), "fix": "none"}
    result["runtime"] = info
    if before.runtime is None:
        return None
    stripped = isvc_patch.apply_patch(isvc, isvc_patch.build_patch(isvc, plan)) if plan.changed else isvc
    after = srt.effective_command(stripped, reader)
    if after.runtime_source not in after.sources():
        return None
    users = reader.users(after)
    result["runtime_users"] = users
    if result.get("previous_config") is None:
        try:
            result["previous_config"] = before.config()
        except SpecDecodingError:
            pass
    if params["runtime_copy"]:
        body = srt.render_runtime_copy(after)
        info.update(fix="copy", copy=body["metadata"]["name"])
        model_path = "/spec/predictor/model/runtime"
        current = isvc["spec"]["predictor"]["model"].get("runtime")
        if current:
            ops = [{"op": "test", "path": model_path, "value": current},
                   {"op": "replace", "path": model_path, "value": body["metadata"]["name"]}]
        else:
            ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": isvc["metadata"]["resourceVersion"]},
                   {"op": "add", "path": model_path, "value": body["metadata"]["name"]}]
        return {"fix": "copy", "body": body, "isvc_ops": ops}
    if params["edit_runtime"]:
        warnings.append("edit_runtime: stripping --speculative-config from the %s %s; every InferenceService using it loses "
                        "speculative decoding: %s" % (after.kind, after.runtime_name, ", ".join(users) or "none found"))
        info["fix"] = "edit"
        return {"fix": "edit", "kind": after.kind, "name": after.runtime_name, "runtime": after.runtime,
                "ops": srt.runtime_strip_patch(after.runtime, after.runtime_index)}
    raise ValidationError(srt.rollback_refusal(after, users))


def apply_runtime_fix(cluster, fix, result, check_mode):
    """Create the per-service copy or patch the shared runtime (a server dry run in check mode)."""
    try:
        if fix["fix"] == "copy":
            created, new = cluster.create_runtime(fix["body"], dry_run=check_mode)
            result["runtime"]["copy_created"] = new
            result["runtime_copy"] = created
        elif fix["ops"]:
            cluster.patch_runtime(fix["kind"], fix["name"], fix["ops"], dry_run=check_mode)
    except SpecDecodingError:
        raise
    except Exception as exc:  # pylint: disable=broad-except
        if getattr(exc, "status", None) is None:
            raise
        what = "creating ServingRuntime %s" % fix["body"]["metadata"]["name"] if fix["fix"] == "copy" else \
            "stripping the flag from %s %s" % (fix["kind"], fix["name"])
        field = "runtime_copy" if fix["fix"] == "copy" else "edit_runtime"
        raise ConflictError("%s failed, nothing else was changed: %s" % (what, _api_error(exc)), field=field,
                            hint="re-run the rollback (it plans again on the fresh objects)") from exc
    result["changed"] = True


def remove_draft(params, cluster, result, warnings):
    """Drop the draft's storageUris entry once the rolled-back revision is Ready at its generation."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers  # pylint: disable=import-outside-toplevel

    isvc = cluster.get()
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
        gitops_owner.check_live_write(cluster.api_client, isvc, params.get("gitops_owner", "refuse"),
                                      "InferenceService %s/%s" % (params["namespace"], params["name"]), warn=warnings.append)
    try:
        cluster.patch(ops, dry_run=False)
    except Exception as exc:  # pylint: disable=broad-except
        if getattr(exc, "status", None) is None:
            raise
        raise SpecDecodingError("removing the draft's storageUris entry failed: %s" % _api_error(exc), field="remove_draft_artifacts") from exc
    result["changed"] = True
    if params["wait"]:
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
        ready, _elapsed = isvc_wait.wait_ready(cluster.api_client, params["namespace"], params["name"],
                                               timeout=params["wait_timeout"], interval=params["wait_sleep"],
                                               **crash_loop_check(params))
        result["resource"] = ready
    return {"removed": removed, "note": note}


# Module llmisvc_speculative: the rollback of a KServe LLMInferenceService (read the flags of every pool, strip them).

def _patch_llmisvc(api_client, params, ops, dry_run):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import (  # pylint: disable=import-outside-toplevel
        cluster as llmisvc_cluster,
    )
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model  # pylint: disable=import-outside-toplevel
    kwargs = {"field_manager": ROLLBACK_FIELD_MANAGER}
    if dry_run:
        kwargs["dry_run"] = "All"
    api = llmisvc_cluster._custom_api(api_client)
    args = (llmisvc_model.GROUP, params["api_version"], params["namespace"], llmisvc_model.PLURAL, params["name"], ops)
    try:
        return api.patch_namespaced_custom_object(*args, _content_type="application/json-patch+json", **kwargs)
    except TypeError:  # kubernetes < 31 picks the content type from the body (a list: JSON patch)
        return api.patch_namespaced_custom_object(*args, **kwargs)


def strip_llmisvc(api_client, params, check_mode=False, diff=False, warn=None):
    """Module llmisvc_speculative: (changed, result) - every speculative flag of an LLMInferenceService's pools (also those
    its presets and env sources set) and, with state=absent, one guarded JSON patch that strips them. `warn(text)` passes
    warnings on."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import (  # pylint: disable=import-outside-toplevel
        cluster as llmisvc_cluster,
    )
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import status as llmisvc_status  # pylint: disable=import-outside-toplevel

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
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
    try:
        after = _patch_llmisvc(api_client, params, ops, check_mode)
    except ApiException as exc:
        if exc.status == 422 and "test" in str(exc.body or ""):
            raise SpecDecodingError("LLMInferenceService %s/%s changed while the rollback read it (a JSON patch test failed)"
                                    % (params["namespace"], params["name"]), field="name", hint="rerun the rollback") from exc
        raise llmisvc_cluster.api_error("patching LLMInferenceService %s/%s" % (params["namespace"], params["name"]), exc,
                                        "name") from exc
    result.update(resource=after, generation=after["metadata"].get("generation"))
    if diff:
        result["diff"] = {"before": {"spec": copy.deepcopy(obj.get("spec"))}, "after": {"spec": after.get("spec")}}
    return True, result
