# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollback (strip every speculative flag) and the roll-forward (set it again) of one InferenceService.

What module ``isvc_speculative`` does, as plain Python: ``check_params`` refuses contradicting options, ``run`` reads the
InferenceService through a ``Cluster`` (one InferenceService on the cluster service, kube/service.py), builds the plan
from the reads (ops/rollback_plan.py: what to strip, where the flag comes from, who owns the object) and ``act`` writes
it: one guarded JSON patch (and the runtime copy or runtime edit when the flag comes from the ServingRuntime) through the
one patch writer, the backup kept; then it waits (the one waiter) and removes the draft's storageUris entry when asked.
Errors are SpecDecodingErrors that name the option and the fix.
"""

from __future__ import annotations

import copy
import json
import os

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


class Cluster:
    """One InferenceService on the cluster service (kube/service.py): what the rollback reads and writes of it."""

    def __init__(self, api_client, namespace, name, gitops_owner_policy="refuse", warn=None):
        self.service = kube_service.service_of(api_client)
        self.api_client = self.service.api_client
        self.namespace = namespace
        self.name = name
        self.gitops_owner_policy = gitops_owner_policy
        self.warn = warn

    # -- reads (what the plan is built from) -----------------------------------------------------------------------

    def get(self):
        return self.service.inference_service(self.namespace, self.name)

    def runtime_reader(self):
        """The ServingRuntime / ClusterServingRuntime reads, one snapshot per plan (runtime_readers.ClientReader)."""
        return runtime_readers.ClientReader(self.service)

    def owner_of(self, obj, what, policy=None, warn=None):
        """Who owns ``obj`` (gitops/owner.py); raises the refusal of a live write its owner would undo."""
        return gitops_owner.check_live_write(self.api_client, obj, policy or self.gitops_owner_policy, what, warn=warn or self.warn)

    # -- writes (the act) ------------------------------------------------------------------------------------------

    def create_runtime(self, body, dry_run):
        """Create (or, when it exists with our labels, keep) the per-service ServingRuntime copy."""
        meta = body["metadata"]
        existing = runtime_readers.ClientReader(self.service).get(serving_runtime.SERVING_RUNTIME, meta["namespace"], meta["name"])
        if existing is not None:
            if (existing["metadata"].get("labels") or {}).get(serving_runtime.COPY_FOR_LABEL) != meta["labels"][serving_runtime.COPY_FOR_LABEL]:
                raise ValidationError("ServingRuntime %s/%s exists and was not made by this collection for %s" % (
                    meta["namespace"], meta["name"], self.name), field="runtime_copy",
                    hint="delete or rename that ServingRuntime, or use edit_runtime")
            return existing, False
        return self.service.create(kube_service.SERVING_RUNTIME, body, namespace=meta["namespace"], dry_run=dry_run), True

    def patch_runtime(self, kind, name, ops, dry_run):
        res = kube_service.SERVING_RUNTIME if kind == kube_service.SERVING_RUNTIME.kind else kube_service.CLUSTER_SERVING_RUNTIME
        return self.service.json_patch(res, name, ops, namespace=self.namespace, dry_run=dry_run)

    def patch(self, ops, dry_run):
        # A named field manager: a later server-side apply (the deploy) that conflicts with this edit names the rollback.
        return self.service.json_patch(kube_service.INFERENCE_SERVICE, self.name, ops, namespace=self.namespace, dry_run=dry_run,
                                       read=self.get)

    def wait_ready(self, params):
        """The one waiter (kserve/wait.py over kube/wait.py): Ready at the generation, a crash loop failing at once."""
        return isvc_wait.wait_ready(self.api_client, self.namespace, self.name, timeout=params["wait_timeout"],
                                    interval=params["wait_sleep"], **crash_loop_check(params))


def _api_error(exc):
    return kube_service.api_error_message(exc)


def write_backup_file(params, doc):
    path = rollback_plan.backup_path(params["backup_file"], params["namespace"], params["name"])
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


def crash_loop_check(params):
    """wait_ready's crash-loop arguments from a module's wait options (doc fragment inference_service.WAIT): a rolled-back
    revision that crash-loops fails the wait at once, with KServe's lastFailureInfo and the container's previous log tail
    (secrets redacted), instead of at wait_timeout (20 minutes by default)."""
    return {"crash_loop_restarts": params["wait_crash_loop_restarts"], "redact": redact}


def _runtime_reader(cluster):
    """The cluster's runtime reads (a double without them reads through its api_client)."""
    if hasattr(cluster, "runtime_reader"):
        return cluster.runtime_reader()
    return runtime_readers.ClientReader(cluster.api_client)


def _owner_check(cluster, params):
    """The plan's owner question, ``owner_of(obj, what, warn)``, with the module's gitops_owner policy; a double without
    ``owner_of`` answers from the object's own marks (gitops/owner.py reads no owner object without a client)."""
    policy = params.get("gitops_owner", "refuse")
    if hasattr(cluster, "owner_of"):
        return lambda obj, what, warn: cluster.owner_of(obj, what, policy=policy, warn=warn)
    return lambda obj, what, warn: gitops_owner.check_live_write(getattr(cluster, "api_client", None), obj, policy, what, warn=warn)


def run(cluster, params, check_mode=False, diff=False):
    """Module isvc_speculative: (result, warnings). Each attempt reads the InferenceService, builds the plan from the reads
    (rollback_plan.build) and acts on it (``act``); a patch refused because the object changed meanwhile plans again on a
    fresh read, up to ``retries`` times."""
    warnings = []
    result = dict(changed=False, containers=[], patch=[], backup_truncated=False, attempts=0)
    attempts = 0
    while True:
        isvc = cluster.get()
        reader = _runtime_reader(cluster) if params["state"] == "absent" else None
        # the owner is asked before the first write only: a retry writes the same objects
        plan = rollback_plan.build(params, isvc, reader=reader, owner_of=_owner_check(cluster, params) if attempts == 0 else None)
        warnings.extend(plan.warnings)
        result.update(plan.result)
        if not plan.changed:
            result.update(resource=isvc, config=rollback_plan.config_of(isvc))
            break
        attempts += 1
        try:
            act(cluster, params, plan, result, check_mode=check_mode, diff=diff)
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
        ready, elapsed = cluster.wait_ready(params)
        result["ready"] = {"ready": True, "generation": ready["metadata"].get("generation"), "elapsed": round(elapsed, 1)}
        result["resource"] = ready
    if params["remove_draft_artifacts"] and params["state"] == "absent":
        result["draft_artifacts"] = remove_draft(params, cluster, result, warnings)
    return result, warnings


def act(cluster, params, plan, result, check_mode=False, diff=False):
    """Write ``plan`` through the cluster: the runtime's fix first (a copy to switch to, or the shared runtime's strip),
    the backup file, then the InferenceService's one guarded JSON patch (a server dry run in check mode). A
    PatchConflict (the InferenceService changed since it was read) passes through: the caller plans again."""
    if plan.runtime_fix is not None:
        apply_runtime_fix(cluster, plan.runtime_fix, result, check_mode)
        if not plan.ops:
            result.update(changed=True, resource=cluster.get() if not check_mode else plan.isvc)
            result["config"] = rollback_plan.config_of(result["resource"])
            return
    if plan.backup is not None and params["backup"] in ("file", "both") and not check_mode:
        result["backup_file"] = write_backup_file(params, plan.backup)
    try:
        after = cluster.patch(plan.ops, dry_run=check_mode)
    except kube_writer.PatchConflict:
        raise
    except Exception as exc:  # pylint: disable=broad-except
        if getattr(exc, "status", None) is None:
            raise
        raise SpecDecodingError("patching InferenceService %s/%s failed: %s" % (params["namespace"], params["name"], _api_error(exc)),
                                field="name") from exc
    result.update(changed=True, patch=plan.ops, resource=after, config=rollback_plan.config_of(after))
    if plan.backup is not None:
        result["backup"] = plan.backup
    if diff:
        result["diff"] = {"before": isvc_patch.diff_view(plan.isvc), "after": isvc_patch.diff_view(after)}


def apply_runtime_fix(cluster, fix, result, check_mode):
    """Create the per-service copy or patch the shared runtime (a server dry run in check mode)."""
    try:
        if fix["fix"] == "copy":
            created, new = cluster.create_runtime(fix["body"], dry_run=check_mode)
            result["runtime"]["copy_created"] = new
            result["runtime_copy"] = created
        elif fix["ops"]:
            cluster.patch_runtime(fix["kind"], fix["name"], fix["ops"], dry_run=check_mode)
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


def remove_draft(params, cluster, result, warnings):
    """Drop the draft's storageUris entry once the rolled-back revision is Ready at its generation."""
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
        _owner_check(cluster, params)(isvc, "InferenceService %s/%s" % (params["namespace"], params["name"]), warnings.append)
    try:
        cluster.patch(ops, dry_run=False)
    except Exception as exc:  # pylint: disable=broad-except
        cause = exc.api_error if isinstance(exc, kube_writer.PatchConflict) else exc
        if getattr(cause, "status", None) is None:
            raise
        raise SpecDecodingError("removing the draft's storageUris entry failed: %s" % _api_error(cause), field="remove_draft_artifacts") from exc
    result["changed"] = True
    if params["wait"]:
        result["resource"], _elapsed = cluster.wait_ready(params)
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
