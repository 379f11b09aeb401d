# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan the InferenceService change for a rollback (strip the speculative flag) or a roll-forward (set it).

Pure data in, data out: the module reads the object, this file decides what changes and builds a JSON
patch (RFC 6902) that carries a ``test`` of every old value it replaces, so a concurrent edit between
read and write fails on the server instead of being overwritten. Plain Python, no Ansible imports.
"""

from __future__ import annotations

import json

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit as vllm_edit
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc.readers import speculative_config_of
# the JSON-pointer helpers live with the one patch writer; imported here for the callers that plan with this module
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.writer import (  # noqa: F401  pylint: disable=unused-import
    apply_patch, escape_pointer, tests_hold,
)

BACKUP_ANNOTATION = "spec-decoding.alauda.io/previous-speculative-config"
# Kubernetes allows 256 KiB for all annotations together; one backup keeps well below that.
MAX_BACKUP_BYTES = 16 * 1024
BACKUP_FORMAT = 1


class Container:
    """One predictor container: where it lives in the object and its command/args."""

    __slots__ = ("path", "name", "command", "args", "env")

    def __init__(self, path, name, command, args, env=None):
        self.path = path  # JSON pointer of the container object
        self.name = name
        self.command = command
        self.args = args
        self.env = env  # the container's env list: the strip resolves variables the pod spec gives


def predictor_containers(isvc):
    """The containers that can run vLLM: spec.predictor.model and spec.predictor.containers[*]."""
    predictor = ((isvc or {}).get("spec") or {}).get("predictor") or {}
    found = []
    model = predictor.get("model")
    if isinstance(model, dict):
        found.append(Container("/spec/predictor/model", "model", model.get("command"), model.get("args"), model.get("env")))
    for i, container in enumerate(predictor.get("containers") or []):
        if isinstance(container, dict):
            found.append(Container("/spec/predictor/containers/%d" % i, container.get("name") or "containers[%d]" % i,
                                   container.get("command"), container.get("args"), container.get("env")))
    return found


class Change:
    """Replace one command/args list."""

    __slots__ = ("path", "old", "new")

    def __init__(self, path, old, new):
        self.path = path
        self.old = old
        self.new = new

    def as_dict(self):
        return {"path": self.path, "before": self.old, "after": self.new}


class Plan:
    """What a run changes: list replacements, the config that was there, and the backup to keep."""

    def __init__(self, changes, previous_config, previous_raw, containers, legacy_flags=None):
        self.changes = changes
        self.changed = bool(changes)
        self.previous_config = previous_config  # dict or None
        self.previous_raw = previous_raw  # the flag text when it could not be parsed (e.g. "$SPEC")
        self.containers = containers  # names of the containers touched
        self.legacy_flags = legacy_flags or {}  # {flag: value} of vLLM's pre-0.10 flags removed (no config dict for them)
        # add_patch's: the guarded JSON patch, the backup document, its annotation value, only the config fitted there
        self.ops = []
        self.backup = None
        self.annotation = None
        self.truncated = False


# An empty list reads the same with any env: read once, here.
_NO_WORDS = vllm_command.read(())


def _command(items, env=None):
    """vLLM's reading of one of a container's lists (vllm/command_line.read: made once per words and env, so the plan, the
    runtime check and the outcome ask the same one; the env as its JSON, vllm_command.env_key's text)."""
    if not items:
        return _NO_WORDS
    return vllm_command.read(tuple(items), json.dumps(env, sort_keys=True) if env else None)


def _commands(container):
    return [_command(container.command, container.env), _command(container.args, container.env)]


def _container_config(container):
    """(config dict or None, raw text or None) of one container's flags."""
    commands = _commands(container)
    try:
        return speculative_config_of(commands), None
    except ValidationError:
        return None, " ".join(raw for command in commands for raw in command.raws)


def current_config(isvc):
    """The speculative config the predictor passes to vLLM (first container that has one), or None."""
    for container in predictor_containers(isvc):
        config, raw = _container_config(container)
        if config is not None or raw:
            return config
    return None


def _named_container(containers, container_name):
    chosen = [c for c in containers if c.name == container_name]
    if not chosen:
        raise ValidationError("no predictor container named %r (found: %s)" % (container_name, ", ".join(c.name for c in containers) or "none"),
                              field="container", hint="use one of the names listed, or omit container")
    return chosen[0]


def plan_strip(isvc, container_name=None):
    """Strip every speculative flag from every predictor container (or only from the one named)."""
    changes = []
    previous = None
    raw = None
    names = []
    legacy = {}
    containers = predictor_containers(isvc)
    if container_name:
        containers = [_named_container(containers, container_name)]
    for container in containers:
        touched = False
        for field in ("command", "args"):
            old = getattr(container, field)
            if not old:
                continue
            _check_list(old, "%s.%s" % (container.name, field))
            command = _command(old, container.env)
            if command.refusal is not None:  # what the strip cannot vouch for (vllm/command_line.py Command)
                message, hint = command.refusal
                raise ValidationError(message, field="%s.%s" % (container.name, field), hint=hint)
            new = list(command.checked)
            if new != old:
                changes.append(Change("%s/%s" % (container.path, field), old, new))
                touched = True
        if touched:
            names.append(container.name)
            if previous is None and raw is None:
                previous, raw = _container_config(container)
            found = {}  # {flag: value} of the legacy flags over command then args, a repeated flag's last value
            for command in _commands(container):
                found.update(command.legacy)
            for flag, value in found.items():
                legacy.setdefault(flag, value)
    return Plan(changes, previous, raw, names, legacy)


def _check_list(items, field):
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ValidationError("must be a list of strings", field=field, hint="fix the InferenceService's container %s" % field)


def _vllm_container(containers):
    """The container to add the flag to: one that already has a flag, else the one that runs vLLM."""
    for container in containers:
        if any(command.occurrences for command in _commands(container)):
            return container
    for container in containers:
        text = " ".join(container.command or []) + " " + " ".join(container.args or [])
        if "vllm" in text:
            return container
    for container in containers:
        if container.command or container.args:
            return container
    return None


def plan_set(isvc, canonical_json, container_name=None):
    """Set ``canonical_json`` as the speculative config of the vLLM container (others are left alone)."""
    containers = predictor_containers(isvc)
    if container_name:
        target = _named_container(containers, container_name)
    else:
        target = _vllm_container(containers)
    if target is None:
        raise ValidationError("the predictor has no container with a command or args to run vLLM", field="spec.predictor",
                              hint="deploy the InferenceService with a vLLM command first (roles/inference_service)")
    for field in ("command", "args"):
        if getattr(target, field):
            _check_list(getattr(target, field), "%s.%s" % (target.name, field))
    previous, raw = _container_config(target)
    new_command, new_args = vllm_edit.set_speculative_config_in(target.command, target.args, canonical_json)
    changes = []
    for field, old, new in (("command", target.command, new_command), ("args", target.args, new_args)):
        if new != old:
            changes.append(Change("%s/%s" % (target.path, field), old, new))
    return Plan(changes, previous, raw, [target.name] if changes else [])


def plan_restore(isvc, backup, canonical_json=None):
    """Roll forward from a backup: the exact old lists when nothing else changed since, else set its config.

    ``canonical_json`` is the backup's config already validated by the caller (None: exact restore only).
    """
    legacy = backup.get("legacy_flags")
    if legacy and not backup.get("config"):
        raise ValidationError(
            "the backup holds vLLM's legacy speculative flags (%s), which vLLM 0.10+ exits on and the deploy refuses; they are "
            "not written back" % ", ".join("%s %s" % (f, "" if v is True else v) for f, v in legacy.items()), field="restore_backup",
            hint="roll forward with state=present and config: %s (check it for the runtime's vLLM release)"
            % vllm_command.legacy_replacement_json(legacy))
    containers = {c.path: c for c in predictor_containers(isvc)}
    saved = backup.get("containers") or {}
    exact = []
    names = []
    usable = bool(saved)
    for path, lists in saved.items():
        container = containers.get(path)
        if container is None or not isinstance(lists, dict):
            usable = False
            break
        for field, old_saved in lists.items():
            now = getattr(container, field, None) if field in ("command", "args") else None
            if now == old_saved:
                continue
            if isinstance(old_saved, list) and vllm_edit.strip_speculative_config(old_saved) == now:
                exact.append(Change("%s/%s" % (path, field), now, old_saved))
                if container.name not in names:
                    names.append(container.name)
            else:
                usable = False
    if usable:
        return Plan(exact, None, None, names)
    if canonical_json is None:
        raise ValidationError("the backup's command no longer matches the InferenceService and holds no config to re-apply",
                              field="restore_backup", hint="pass the config to set with state=present and config")
    return plan_set(isvc, canonical_json)


# --------------------------------------------------------------------------------------------------
# Backup annotation
# --------------------------------------------------------------------------------------------------

def backup_document(isvc, plan):
    """The backup of what a strip removes: the config and the exact old lists of the touched containers."""
    containers = {}
    for change in plan.changes:
        container_path, field = change.path.rsplit("/", 1)
        containers.setdefault(container_path, {})[field] = change.old
    doc = {"format": BACKUP_FORMAT, "config": plan.previous_config, "containers": containers}
    if plan.previous_raw and plan.previous_config is None:
        doc["raw"] = plan.previous_raw
    if plan.legacy_flags:
        doc["legacy_flags"] = dict(plan.legacy_flags)
    meta = (isvc or {}).get("metadata") or {}
    doc["generation"] = meta.get("generation")
    return doc


def backup_annotation_value(doc, limit=MAX_BACKUP_BYTES):
    """Compact JSON for the annotation, at most ``limit`` bytes.

    Too big with the full command lists: they are dropped (``"truncated": true``) and only the config is
    kept, which is enough to roll forward; still too big: refused (use ``backup_file``).
    """
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    if len(text.encode("utf-8")) <= limit:
        return text, False
    slim = {k: v for k, v in doc.items() if k != "containers"}
    slim["truncated"] = True
    text = json.dumps(slim, sort_keys=True, separators=(",", ":"))
    if len(text.encode("utf-8")) <= limit:
        return text, True
    raise ValidationError("the backup is %d bytes, over the %d-byte limit for the %s annotation" % (len(text.encode("utf-8")), limit, BACKUP_ANNOTATION),
                          field="backup", hint="use backup: file with backup_file (a local path), or backup: none")


def read_backup(isvc):
    """The backup document from the annotation, or None when there is none."""
    annotations = (((isvc or {}).get("metadata") or {}).get("annotations")) or {}
    text = annotations.get(BACKUP_ANNOTATION)
    if not text:
        return None
    return parse_backup(text, field="metadata.annotations[%s]" % BACKUP_ANNOTATION)


def parse_backup(text, field="backup"):
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValidationError("is not the JSON this collection writes (%s)" % exc, field=field,
                              hint="remove the annotation and roll forward with state=present and config") from None
    if not isinstance(doc, dict) or doc.get("format") != BACKUP_FORMAT:
        raise ValidationError("has an unknown format", field=field,
                              hint="roll forward with state=present and config instead of restore_backup")
    return doc


# --------------------------------------------------------------------------------------------------
# JSON patch
# --------------------------------------------------------------------------------------------------

def build_patch(isvc, plan, annotation_value=None, guard="value"):
    """JSON patch for ``plan``: ``test`` of each old list, then its replacement.

    ``guard``: ``value`` tests the exact old lists (edits elsewhere in the object don't conflict);
    ``resource_version`` also tests metadata.resourceVersion (any concurrent edit conflicts).
    """
    ops = []
    meta = (isvc or {}).get("metadata") or {}
    if guard == "resource_version" or any(c.old is None for c in plan.changes):
        if meta.get("resourceVersion"):
            ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]})
    for change in plan.changes:
        if change.old is None:
            ops.append({"op": "add", "path": change.path, "value": change.new})
        elif change.new is None:
            ops.append({"op": "test", "path": change.path, "value": change.old})
            ops.append({"op": "remove", "path": change.path})
        else:
            ops.append({"op": "test", "path": change.path, "value": change.old})
            ops.append({"op": "replace", "path": change.path, "value": change.new})
    if annotation_value is not None:
        annotations = meta.get("annotations")
        if annotations is None:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {BACKUP_ANNOTATION: annotation_value}})
        else:
            ops.append({"op": "add", "path": "/metadata/annotations/" + escape_pointer(BACKUP_ANNOTATION), "value": annotation_value})
    return ops


def diff_view(isvc):
    """The parts of the object this module edits, for diff mode."""
    view = {}
    for container in predictor_containers(isvc):
        entry = {}
        if container.command is not None:
            entry["command"] = container.command
        if container.args is not None:
            entry["args"] = container.args
        view[container.path] = entry
    annotations = (((isvc or {}).get("metadata") or {}).get("annotations")) or {}
    if BACKUP_ANNOTATION in annotations:
        view["annotations"] = {BACKUP_ANNOTATION: annotations[BACKUP_ANNOTATION]}
    return view


def add_patch(isvc, plan, backup="none", guard="value"):
    """``plan`` with its write, in one step (the rollback's plan asks once): ``plan.ops`` the guarded JSON patch
    (build_patch), ``plan.backup`` the backup document when the plan removes a flag worth keeping (a config, its
    unparsed text or legacy flags) and ``backup`` is annotation, file or both, ``plan.annotation`` its annotation value
    (backup annotation or both; then in the patch) and ``plan.truncated`` (only the config fitted there). Returns ``plan``."""
    if not plan.changed:
        return plan
    if backup != "none" and (plan.previous_config is not None or plan.previous_raw or plan.legacy_flags):
        plan.backup = backup_document(isvc, plan)
        if backup in ("annotation", "both"):
            plan.annotation, plan.truncated = backup_annotation_value(plan.backup)
    plan.ops = build_patch(isvc, plan, annotation_value=plan.annotation, guard=guard)
    return plan


def outcome(after, before=None):
    """What a write reports of the object the API server answered: ``config``, the speculative config it runs with (None
    also when it cannot be read) and, given the object as it was read (``before``), ``diff`` (diff_view of both)."""
    try:
        config = current_config(after)
    except SpecDecodingError:
        config = None
    out = {"config": config}
    if before is not None:
        out["diff"] = {"before": diff_view(before), "after": diff_view(after)}
    return out


# --------------------------------------------------------------------------------------------------
# Draft artifacts
# --------------------------------------------------------------------------------------------------

def plan_remove_draft_storage(isvc, draft_path):
    """Ops that remove the spec.predictor.storageUris entry mounting ``draft_path``, if any.

    Returns (ops, removed_entry or None, note). Refuses when the remaining command still reads the path.
    """
    predictor = ((isvc or {}).get("spec") or {}).get("predictor") or {}
    uris = predictor.get("storageUris") or []
    if not draft_path:
        return [], None, "the previous config names no draft model path; nothing to remove"
    for container in predictor_containers(isvc):
        text = " ".join((container.command or []) + (container.args or []))
        if draft_path in text:
            raise ValidationError("the predictor command still refers to %s" % draft_path, field="remove_draft_artifacts",
                                  hint="strip the speculative config first (state=absent), then remove the draft")
    for i, entry in enumerate(uris):
        mount = (entry or {}).get("mountPath") or "/mnt/models"
        if draft_path == mount or draft_path.startswith(mount.rstrip("/") + "/"):
            if len(uris) == 1:
                return [], None, "the draft shares the only storageUris entry with the target; left in place"
            ops = [{"op": "test", "path": "/spec/predictor/storageUris/%d" % i, "value": entry},
                   {"op": "remove", "path": "/spec/predictor/storageUris/%d" % i}]
            return ops, entry, "removed the storageUris entry %s mounted at %s" % (entry.get("uri"), mount)
    if predictor.get("storageUri", "").startswith("oci://") or (predictor.get("model") or {}).get("storageUri", "").startswith("oci://"):
        return [], None, ("the draft lives inside the Modelcar image; rebuild the image without it "
                          "(alauda.spec_decoding.modelcar_image) and update storageUri")
    return [], None, ("the draft at %s is not a separate storageUris entry (a PVC subdirectory or the same volume); "
                      "remove the files from the volume yourself" % draft_path)
