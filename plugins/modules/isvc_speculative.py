#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: isvc_speculative
short_description: Strip (roll back) or set (roll forward) vLLM speculative decoding on a KServe InferenceService
version_added: 0.1.0
description:
  - O(state=absent) removes C(--speculative-config) and its value (every form, also C(-sc), C(--spec-method),
    C(--spec-model), C(--spec-tokens), dotted keys, and the legacy pre-0.10 flags such as C(--speculative-model),
    C(--num-speculative-tokens), C(--ngram-prompt-lookup-max), dash or underscore spelling) from the predictor's containers
    (C(spec.predictor.model) and C(spec.predictor.containers[*]), command and args, also inside C(bash -c)
    scripts). Every other byte of the command stays as it was. KServe then rolls out a revision without a
    proposer.
  - O(state=present) sets or replaces it with the canonical JSON of O(config) (validated like
    M(alauda.spec_decoding.speculative_config)), or with what the backup holds (O(restore_backup=true)).
  - The write is one JSON patch that C(test)s the exact old command/args (and, with O(guard=resource_version),
    C(metadata.resourceVersion)), so a concurrent edit between read and write fails with a clear message
    instead of being overwritten; O(retries) re-reads and plans again on the fresh object.
  - Before stripping, the previous config and the exact old command lists are kept in the annotation
    C(spec-decoding.alauda.io/previous-speculative-config) (at most 16 KiB; larger command lists are left
    out and only the config is kept, and the result says C(backup_truncated)) and/or a local file.
  - Check mode is a server-side dry run (C(dryRun=All)); the API server validates the patch and stores nothing.
  - Idempotent - C(changed=false) when the flag is already absent (or the same config already set).
author:
  - Alauda Platform Team (@alauda)
options:
  name:
    description: InferenceService name.
    type: str
    required: true
  namespace:
    description: Namespace of the InferenceService.
    type: str
    required: true
  state:
    description:
      - V(absent) strips the speculative flags (the rollback), V(present) sets them (the roll-forward).
    type: str
    choices: [absent, present]
    default: absent
  config:
    description:
      - The speculative config for O(state=present), a mapping or a JSON string. Validated and rendered as
        canonical JSON by the collection's speculative-config core.
    type: raw
  vllm_version:
    description: vLLM release of the runtime, to validate O(config) against (newest known when omitted).
    type: str
  restore_backup:
    description:
      - With O(state=present) and no O(config), roll forward from the backup (the annotation, or
        O(backup_file) when O(backup=file)). When the command has not changed since the rollback the exact
        old command lists come back byte for byte; otherwise the backed-up config is set again.
    type: bool
    default: false
  container:
    description:
      - The predictor container to set the flag in (O(state=present)) or to strip it from (O(state=absent)) -
        C(model) for C(spec.predictor.model), else a container name. An unknown name fails before anything is patched.
      - Default - O(state=present) sets it in the container that already has a flag, else the one running vLLM;
        O(state=absent) strips it from every predictor container.
    type: str
  backup:
    description:
      - Where to keep what a change removes. V(annotation) writes the previous config and command lists to the
        C(spec-decoding.alauda.io/previous-speculative-config) annotation in the same patch; V(file) writes them
        to O(backup_file); V(both) does both; V(none) keeps nothing.
    type: str
    choices: [annotation, file, both, none]
    default: annotation
  backup_file:
    description:
      - Local path (on the controller) for the backup with O(backup=file) or O(backup=both). An existing
        directory gets C(<namespace>.<name>.speculative-backup.json) inside it.
    type: path
  guard:
    description:
      - V(value) tests the exact old command/args in the patch (edits to other fields do not conflict);
        V(resource_version) also tests C(metadata.resourceVersion) (any concurrent edit conflicts).
    type: str
    choices: [value, resource_version]
    default: value
  retries:
    description:
      - On a conflict (the patch's C(test) failed, HTTP 422, or HTTP 409), re-read the InferenceService and plan
        again this many times. V(0) fails on the first conflict.
    type: int
    default: 0
  runtime_copy:
    description:
      - With O(state=absent), when the flag vLLM runs with comes from the InferenceService's ServingRuntime or
        ClusterServingRuntime (KServe merges the runtime's args before the InferenceService's), create the namespaced
        ServingRuntime C(<name>-<runtime>-nospec) - the runtime without the speculative flags, C(autoSelect) off - and
        point C(spec.predictor.model.runtime) at it in the same guarded patch as the strip. Other services keep the
        shared runtime.
      - Without O(runtime_copy) or O(edit_runtime) such a rollback is refused (nothing is written) with the runtime named.
    type: bool
    default: false
  edit_runtime:
    description:
      - With O(state=absent), strip the flag from the shared runtime itself (a guarded JSON patch of its
        C(kserve-container)). Every InferenceService using that runtime is listed first (C(runtime_users), and a
        warning) since all of them lose speculative decoding.
    type: bool
    default: false
  remove_draft_artifacts:
    description:
      - After a rollback (O(state=absent)), once the rolled-back revision is Ready at its generation, remove the
        draft's C(spec.predictor.storageUris) entry. Draft weights on a PVC subdirectory or inside a Modelcar
        image are not touched by this option; M(alauda.spec_decoding.draft_artifacts) removes those (the rollback
        role runs it after the engine line proves C(speculative_config=None)).
      - Draft artifacts stay mounted by default, as the guide says, so a roll-forward needs no new download.
    type: bool
    default: false
  wait:
    description:
      - Wait until the InferenceService is Ready with C(status.observedGeneration == metadata.generation) after a change.
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait. A cold start with a draft model takes about 5 minutes.
    type: int
    default: 1200
  wait_sleep:
    description:
      - Seconds between readiness reads when the API server refuses to watch the InferenceService (no C(watch) verb);
        with C(watch) allowed the wait ends as soon as the Ready status is written.
    type: int
    default: 5
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
notes:
  - Needs C(get) and C(patch) on C(inferenceservices) (and C(get)/C(list) on pods for O(wait)).
  - The backup annotation is written in the same patch as the change, so it cannot be lost between two writes.
seealso:
  - module: alauda.spec_decoding.speculative_config
  - module: alauda.spec_decoding.engine_config_info
  - module: alauda.spec_decoding.draft_artifacts
"""

EXAMPLES = r"""
- name: Roll back speculative decoding (keep a backup in the annotation)
  alauda.spec_decoding.isvc_speculative:
    name: llama31-8b-eagle3
    namespace: llm-demo
    state: absent
    wait: true

- name: Roll forward from the backup annotation
  alauda.spec_decoding.isvc_speculative:
    name: llama31-8b-eagle3
    namespace: llm-demo
    state: present
    restore_backup: true

- name: Set an ngram config (replaces any existing one), retry once if someone edits at the same time
  alauda.spec_decoding.isvc_speculative:
    name: qwen25-7b
    namespace: llm-demo
    state: present
    config: {method: ngram, num_speculative_tokens: 5, prompt_lookup_max: 4, prompt_lookup_min: 2}
    vllm_version: "0.11.2"
    retries: 1

- name: Roll back, keep the backup as a local file too, and drop the draft's storageUris entry once Ready
  alauda.spec_decoding.isvc_speculative:
    name: llama31-8b-eagle3
    namespace: llm-demo
    state: absent
    backup: both
    backup_file: /var/backups/spec-decoding/
    wait: true
    remove_draft_artifacts: true
"""

RETURN = r"""
previous_config:
  description: The speculative config the predictor had before this run (null when it had none).
  returned: always
  type: dict
  sample: {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
previous_legacy_flags:
  description:
    - vLLM's legacy (pre-0.10) speculative flags the rollback removed, flag to value (V(true) for a flag without a
      value), e.g. C(--speculative-model) and C(--num-speculative-tokens). They are kept in the backup as C(legacy_flags);
      O(restore_backup) refuses to write them back and names the C(--speculative-config) to set instead.
  returned: when state is absent
  type: dict
  sample: {"--speculative-model": "[ngram]", "--num-speculative-tokens": "5", "--ngram-prompt-lookup-max": "4"}
config:
  description: The speculative config after this run (null after a rollback).
  returned: always
  type: dict
json:
  description: Canonical JSON that was set (O(state=present)).
  returned: when state is present
  type: str
containers:
  description: Names of the predictor containers whose command or args changed.
  returned: always
  type: list
  elements: str
patch:
  description: The JSON patch sent (empty when nothing changed).
  returned: always
  type: list
  elements: dict
backup:
  description: The backup document kept (annotation and/or file).
  returned: when a backup was kept
  type: dict
backup_truncated:
  description: True when the command lists were too big for the annotation and only the config was kept.
  returned: always
  type: bool
backup_file:
  description: Path of the backup file written.
  returned: when a backup file was written
  type: str
attempts:
  description: Patch attempts made (more than 1 after conflicts with O(retries)).
  returned: always
  type: int
runtime:
  description:
    - The runtime the predictor's command is merged with, C(source) of the flag vLLM ran with before this run
      (C(inference_service), C(serving_runtime), C(cluster_serving_runtime)), and what was done to the runtime
      (C(fix) - V(none), V(copy) with C(copy) the ServingRuntime created, or V(edit)).
  returned: when state is absent
  type: dict
  sample: {"kind": "ClusterServingRuntime", "name": "vllm-runtime", "source": "cluster_serving_runtime", "fix": "copy"}
runtime_users:
  description: namespace/name of every InferenceService using the runtime (listed before O(edit_runtime) or a refusal).
  returned: when the flag came from the runtime
  type: list
  elements: str
draft_artifacts:
  description: What O(remove_draft_artifacts) did or why it left things in place.
  returned: when remove_draft_artifacts is true
  type: dict
  sample: {"removed": {"uri": "pvc://models/draft", "mountPath": "/mnt/models/draft"}, "note": "removed the storageUris entry ..."}
ready:
  description: Readiness at the current generation after O(wait).
  returned: when wait is true
  type: dict
resource:
  description: The InferenceService after the change (as the server returned it; a dry-run result in check mode).
  returned: always
  type: dict
"""

import json
import os

from ansible.module_utils.common.text.converters import to_text
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ConflictError, SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.ssa_conflicts import ROLLBACK_FIELD_MANAGER

GROUP = "serving.kserve.io"
VERSION = "v1beta1"
PLURAL = "inferenceservices"


def argument_spec():
    spec = dict(
        name=dict(type="str", required=True),
        namespace=dict(type="str", required=True),
        state=dict(type="str", choices=["absent", "present"], default="absent"),
        config=dict(type="raw"),
        vllm_version=dict(type="str"),
        restore_backup=dict(type="bool", default=False),
        container=dict(type="str"),
        backup=dict(type="str", choices=["annotation", "file", "both", "none"], default="annotation"),
        backup_file=dict(type="path"),
        guard=dict(type="str", choices=["value", "resource_version"], default="value"),
        retries=dict(type="int", default=0),
        runtime_copy=dict(type="bool", default=False),
        edit_runtime=dict(type="bool", default=False),
        remove_draft_artifacts=dict(type="bool", default=False),
        wait=dict(type="bool", default=False),
        wait_timeout=dict(type="int", default=1200),
        wait_sleep=dict(type="int", default=5),
    )
    spec.update(AUTH_ARG_SPEC)
    return spec


FIELD_MANAGER = ROLLBACK_FIELD_MANAGER


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
            runtime as serving_runtime,
        )
        meta = body["metadata"]
        kwargs = {"field_manager": FIELD_MANAGER}
        if dry_run:
            kwargs["dry_run"] = "All"
        existing = serving_runtime.ClientReader(self.api_client).get(serving_runtime.SERVING_RUNTIME, meta["namespace"], meta["name"])
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


def _read_backup(module, isvc):
    params = module.params
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


def plan_once(module, isvc, warnings):
    """(plan, annotation value or None, backup doc or None, truncated, json or None) for the current object."""
    params = module.params
    canonical = None
    if params["state"] == "absent":
        plan = isvc_patch.plan_strip(isvc, container_name=params["container"])
    elif params["restore_backup"]:
        doc = _read_backup(module, isvc)
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


def write_backup_file(module, doc):
    params = module.params
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


def run(module, cluster):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel

    params = module.params
    warnings = []
    result = dict(changed=False, containers=[], patch=[], backup_truncated=False, attempts=0)
    attempts = 0
    while True:
        isvc = cluster.get()
        plan, annotation, doc, truncated, canonical = plan_once(module, isvc, warnings)
        result.update(previous_config=plan.previous_config if params["state"] == "absent" else _config_after(isvc),
                      containers=plan.containers, backup_truncated=truncated)
        if params["state"] == "absent":
            result["previous_legacy_flags"] = plan.legacy_flags
        if canonical is not None:
            result["json"] = canonical
        runtime_fix = plan_runtime(module, cluster, isvc, plan, result, warnings) if params["state"] == "absent" else None
        if not plan.changed and runtime_fix is None:
            result.update(resource=isvc, config=_config_after(isvc))
            break
        ops = isvc_patch.build_patch(isvc, plan, annotation_value=annotation, guard=params["guard"]) if plan.changed else []
        if runtime_fix is not None:
            apply_runtime_fix(module, cluster, runtime_fix, result)
            ops += runtime_fix.get("isvc_ops") or []
            if not ops:
                result.update(changed=True, resource=cluster.get() if not module.check_mode else isvc)
                result["config"] = _config_after(result["resource"])
                break
        if doc is not None and params["backup"] in ("file", "both") and not module.check_mode:
            result["backup_file"] = write_backup_file(module, doc)
        attempts += 1
        try:
            after = cluster.patch(ops, dry_run=module.check_mode)
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
        if module._diff:
            result["diff"] = {"before": isvc_patch.diff_view(isvc), "after": isvc_patch.diff_view(after)}
        break
    result["attempts"] = attempts
    if module.check_mode:
        return result, warnings

    if params["wait"]:
        ready, elapsed = isvc_wait.wait_ready(cluster.api_client, params["namespace"], params["name"],
                                              timeout=params["wait_timeout"], interval=params["wait_sleep"])
        result["ready"] = {"ready": True, "generation": ready["metadata"].get("generation"), "elapsed": round(elapsed, 1)}
        result["resource"] = ready
    if params["remove_draft_artifacts"] and params["state"] == "absent":
        result["draft_artifacts"] = remove_draft(module, cluster, result, warnings)
    return result, warnings


def plan_runtime(module, cluster, isvc, plan, result, warnings):
    """After the strip, does the runtime still pass a flag to vLLM? Refuse, or plan the copy or the runtime edit.

    Returns None (nothing to do in the runtime), {"fix": "copy", "body": ..., "isvc_ops": [...]} or
    {"fix": "edit", "kind": ..., "name": ..., "ops": [...]}; raises ValidationError (the refusal) otherwise.
    """
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime as srt  # pylint: disable=import-outside-toplevel

    params = module.params
    reader = srt.ClientReader(cluster.api_client)
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
        return {"fix": "edit", "kind": after.kind, "name": after.runtime_name,
                "ops": srt.runtime_strip_patch(after.runtime, after.runtime_index)}
    raise ValidationError(srt.rollback_refusal(after, users))


def apply_runtime_fix(module, cluster, fix, result):
    """Create the per-service copy or patch the shared runtime (a server dry run in check mode)."""
    try:
        if fix["fix"] == "copy":
            created, new = cluster.create_runtime(fix["body"], dry_run=module.check_mode)
            result["runtime"]["copy_created"] = new
            result["runtime_copy"] = created
        elif fix["ops"]:
            cluster.patch_runtime(fix["kind"], fix["name"], fix["ops"], dry_run=module.check_mode)
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


def remove_draft(module, cluster, result, warnings):
    """Drop the draft's storageUris entry once the rolled-back revision is Ready at its generation."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers  # pylint: disable=import-outside-toplevel

    params = module.params
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
                                               timeout=params["wait_timeout"], interval=params["wait_sleep"])
        result["resource"] = ready
    return {"removed": removed, "note": note}


def main():
    module = AnsibleK8SModule(
        argument_spec=argument_spec(),
        supports_check_mode=True,
        mutually_exclusive=[("config", "restore_backup")],
        required_if=[
            ("backup", "file", ("backup_file",)),
            ("backup", "both", ("backup_file",)),
        ],
    )
    params = module.params
    if params["state"] == "present" and params["config"] is None and not params["restore_backup"]:
        module.fail_json(msg="config: state=present needs config (a mapping or JSON string). "
                             "Fix: pass config, or restore_backup: true to roll forward from the backup")
    if params["state"] == "absent" and (params["config"] is not None or params["restore_backup"]):
        module.fail_json(msg="config/restore_backup: only apply to state=present. Fix: drop them, or use state: present")
    if params["retries"] < 0:
        module.fail_json(msg="retries: must be 0 or more")
    if params["runtime_copy"] and params["edit_runtime"]:
        module.fail_json(msg="runtime_copy/edit_runtime: choose one - a per-service runtime copy without the flag, or the flag "
                             "stripped from the shared runtime")
    if params["state"] == "present" and (params["runtime_copy"] or params["edit_runtime"]):
        module.fail_json(msg="runtime_copy/edit_runtime: only apply to state=absent (the rollback). Fix: drop them")

    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel

    try:
        cluster = Cluster(get_api_client(module=module).client.client, params["namespace"], params["name"])
        result, warnings = run(module, cluster)
    except isvc_wait.WaitTimeout as exc:
        module.fail_json(msg=str(exc), changed=True, resource=exc.isvc, pods=exc.pods)
    except SpecDecodingError as exc:
        module.fail_json(msg=str(exc))
    except Exception as exc:  # pylint: disable=broad-except
        module.fail_json(msg="isvc_speculative: %s" % to_text(exc))
    for warning in warnings:
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
