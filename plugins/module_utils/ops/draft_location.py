# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a rolled-back InferenceService's draft lives, and what removing it means (``rollback_remove_draft_artifacts``).

``locate`` reads it from the InferenceService and the path the old speculative config gave vLLM (``model``, e.g.
``/mnt/models/draft``; ``draft_path_from``): a ``spec.predictor.storageUris`` entry of its own (``storage_uris``, with
the guarded JSON patch that drops it), a subdirectory of the PVC behind ``storageUri: pvc://<claim>/<prefix>``
(``pvc``) or ``/models/<rel>`` inside the ``oci://`` Modelcar image (``modelcar``). ops/draft_removal.py carries the
removal out.

Nothing is removed that the current (rolled-back) command, args or env still name, nor the directory that
holds them (the target), nor a path outside the volume (``..``, other absolute paths). A PVC subdirectory
another InferenceService or LLMInferenceService of the namespace mounts or names (``other_users``) is kept.

KServe's LLMInferenceService works the same way (``kind: LLMInferenceService``): its one ``spec.model.uri``
(``pvc://claim/path`` mounted at /mnt/models with the path as subPath, or ``oci://`` as a Modelcar at
/mnt/models) holds target and draft (llmisvc_render.render), so the draft is a PVC subdirectory or Modelcar layers;
the paths still named are those of every pool's containers. Plain Python, no Ansible imports.
"""

from __future__ import annotations

import posixpath
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import storage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

DEFAULT_MOUNT = storage.DEFAULT_MOUNT
MODELCAR_ROOT = "models"
FIELD = "remove_draft_artifacts"
_PATH_RE = re.compile(r"(?:^|(?<=[\s'\"=:,(\[{]))(/[^\s'\"=,;:|&<>()\[\]{}`$\\]*)")


# --------------------------------------------------------------------------------------------------
# paths
# --------------------------------------------------------------------------------------------------
def clean_abs_path(path, field="draft_path"):
    """An absolute container path without '..' or '.' components, normalised (trailing slashes removed)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValidationError("%r is not an absolute path" % (path,), field=field, hint="give the container path, e.g. /mnt/models/draft")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValidationError("%r contains '.' or '..'; refusing a path that may leave the volume" % path, field=field,
                              hint="give the normalised path of the draft directory")
    return "/" + "/".join(parts)


def is_under(path, parent):
    """True when ``path`` equals ``parent`` or lies below it (both normalised)."""
    return path == parent or parent == "/" or path.startswith(parent.rstrip("/") + "/")


def is_llmisvc(obj):
    return ((obj or {}).get("kind")) == llmisvc_model.KIND


def _containers(obj):
    """The containers whose command, args and env the rolled-back resource runs: the predictor's, or every pool's."""
    spec = (obj or {}).get("spec") or {}
    if is_llmisvc(obj):
        out = []
        for info in llmisvc_model.POOLS.values():
            node = spec
            for key in info["path"]:
                node = node.get(key) if isinstance(node, dict) else None
            out.extend(c for c in ((node or {}).get("containers") or []) if isinstance(c, dict))
        return out
    predictor = spec.get("predictor") or {}
    out = [predictor["model"]] if isinstance(predictor.get("model"), dict) else []
    return out + [c for c in predictor.get("containers") or [] if isinstance(c, dict)]


def _pvc_paths(obj, claim):
    """[(PVC path the object mounts, [PVC paths its containers name below that mount])] for ``claim``."""
    out = []
    named = referenced_paths(obj)
    for _index, uri, mount in _mounts(obj):
        if not (uri or "").startswith("pvc://"):
            continue
        other_claim, _sep, prefix = uri[len("pvc://"):].partition("/")
        if other_claim != claim:
            continue
        prefix = "/" + "/".join(p for p in prefix.split("/") if p)
        below = [posixpath.normpath(posixpath.join(prefix, posixpath.relpath(p, mount))) for p in named if is_under(p, mount)]
        out.append((prefix, below))
    return out


def other_users(objects, this, claim, subdir):
    """Which other InferenceServices / LLMInferenceServices still use the PVC subdirectory ``subdir`` of ``claim``: those
    mounting it (or a directory inside it), and those mounting a directory above it whose containers name a path in it.
    ``objects``: the namespace's InferenceServices and LLMInferenceServices. Returns ``["Kind ns/name (why)"]``."""
    draft = "/" + subdir.strip("/")
    me = ((this or {}).get("kind"), ((this or {}).get("metadata") or {}).get("name"))
    out = []
    for obj in objects or []:
        meta = obj.get("metadata") or {}
        if (obj.get("kind"), meta.get("name")) == me:
            continue
        for prefix, below in _pvc_paths(obj, claim):
            label = "%s %s/%s" % (obj.get("kind"), meta.get("namespace"), meta.get("name"))
            if is_under(prefix, draft):
                out.append("%s (mounts pvc://%s%s)" % (label, claim, prefix))
                break
            names = [p for p in below if is_under(p, draft)]
            if is_under(draft, prefix) and names:
                out.append("%s (names %s on pvc://%s)" % (label, ", ".join(sorted(set(names))), claim))
                break
    return out


def referenced_paths(isvc):
    """Absolute paths the predictor's containers still name (command, args, env values), normalised."""
    found = set()
    for container in _containers(isvc):
        texts = list(container.get("command") or []) + list(container.get("args") or [])
        texts += [e.get("value") for e in container.get("env") or [] if isinstance(e, dict) and isinstance(e.get("value"), str)]
        for text in texts:
            if not isinstance(text, str):
                continue
            for match in _PATH_RE.finditer(text):
                parts = [p for p in match.group(1).split("/") if p and p != "."]
                norm = posixpath.normpath("/" + "/".join(parts)) if parts else "/"
                found.add(norm)
    return sorted(found)


def draft_path_from(isvc, previous_config=None, draft_path=None):
    """(path or None, where it came from): the option, the rollback's previous config, or the backup annotation."""
    if draft_path:
        return draft_path, "draft_path"
    if isinstance(previous_config, dict) and previous_config.get("model"):
        return previous_config["model"], "previous_config.model"
    backup = isvc_patch.read_backup(isvc) or {}
    model = (backup.get("config") or {}).get("model")
    if model:
        return model, "%s annotation (config.model)" % isvc_patch.BACKUP_ANNOTATION
    return None, None


def _mounts(isvc):
    """[(index or None, uri, mountPath)]: storageUris entries, or the single storageUri at /mnt/models."""
    if is_llmisvc(isvc):
        uri = ((((isvc or {}).get("spec") or {}).get("model")) or {}).get("uri")
        return [(None, uri, DEFAULT_MOUNT)] if uri else []
    predictor = ((isvc or {}).get("spec") or {}).get("predictor") or {}
    uris = predictor.get("storageUris")
    if uris:
        return [(i, (e or {}).get("uri") or "", clean_abs_path((e or {}).get("mountPath") or DEFAULT_MOUNT, "storageUris[%d].mountPath" % i))
                for i, e in enumerate(uris)]
    single = (predictor.get("model") or {}).get("storageUri") if isinstance(predictor.get("model"), dict) else None
    if single:
        return [(None, single, DEFAULT_MOUNT)]
    if predictor.get("storageUri"):
        return [(None, predictor["storageUri"], DEFAULT_MOUNT)]
    return []


def _storage_uri_pointer(isvc):
    if is_llmisvc(isvc):
        return "/spec/model/uri", ((isvc.get("spec") or {}).get("model") or {}).get("uri")
    predictor = ((isvc or {}).get("spec") or {}).get("predictor") or {}
    if isinstance(predictor.get("model"), dict) and predictor["model"].get("storageUri"):
        return "/spec/predictor/model/storageUri", predictor["model"]["storageUri"]
    return "/spec/predictor/storageUri", predictor.get("storageUri")


class Location:
    """Where the draft lives and what removing it means."""

    def __init__(self, mode, draft_path, note, **details):
        self.mode = mode  # storage_uris | pvc | modelcar | none
        self.draft_path = draft_path
        self.note = note
        self.details = details

    def as_dict(self):
        out = {"mode": self.mode, "draft_path": self.draft_path, "note": self.note}
        out.update({k: v for k, v in self.details.items() if k != "ops"})
        return out


def locate(isvc, draft_path, source="draft_path"):
    """Classify the draft's location; raise ValidationError for anything unsafe to remove."""
    if not draft_path:
        return Location("none", None, "the previous speculative config names no draft model path (ngram and similar need none); nothing to remove")
    if not isinstance(draft_path, str) or not draft_path.startswith("/"):
        return Location("none", draft_path, "the draft %r is not a path in the container (a hub id?); nothing mounted to remove" % (draft_path,))
    draft = clean_abs_path(draft_path, source)
    if llmisvc.flags(isvc) if is_llmisvc(isvc) else isvc_patch.current_config(isvc) is not None:
        raise ValidationError("the predictor still runs speculative decoding; refusing to remove the draft", field=FIELD,
                              hint="roll back first (isvc_speculative state=absent), then remove the draft")
    referenced = referenced_paths(isvc)
    users = [p for p in referenced if is_under(p, draft)]
    if users:
        raise ValidationError("the rolled-back predictor still refers to %s (%s); refusing to remove it" % (draft, ", ".join(users)),
                              field=FIELD, hint="remove those references first, or keep the draft (the default)")
    covering = [m for m in _mounts(isvc) if is_under(draft, m[2])]
    if not covering:
        return Location("none", draft, "nothing mounts %s (already removed, or it is not a mounted artifact); nothing to remove" % draft)
    index, uri, mount = max(covering, key=lambda m: len(m[2]))
    rel = posixpath.relpath(draft, mount) if draft != mount else ""
    others_in_mount = [p for p in referenced if is_under(p, mount)]
    mounts = _mounts(isvc)
    if index is not None and not others_in_mount and len(mounts) > 1:
        entry = ((isvc.get("spec") or {}).get("predictor") or {}).get("storageUris")[index]
        ops = [{"op": "test", "path": "/spec/predictor/storageUris/%d" % index, "value": entry},
               {"op": "remove", "path": "/spec/predictor/storageUris/%d" % index}]
        return Location("storage_uris", draft, "the draft has its own storageUris entry (%s at %s); removing the entry" % (uri, mount),
                        ops=ops, removed=entry)
    if not rel:
        raise ValidationError("the draft %s is the whole volume mounted from %s, which the target shares; refusing" % (draft, uri),
                              field=FIELD, hint="keep the draft, or stage target and draft in separate subdirectories")
    if uri.startswith("pvc://"):
        claim, _sep, prefix = uri[len("pvc://"):].partition("/")
        prefix = prefix.strip("/")
        if any(p in (".", "..") for p in prefix.split("/") if p):
            raise ValidationError("the storage URI %s has '.' or '..' in its path" % uri, field=FIELD)
        subdir = posixpath.join(prefix, rel) if prefix else rel
        keep = sorted({posixpath.join(prefix, posixpath.relpath(p, mount)) if p != mount else prefix
                       for p in others_in_mount} - {""})
        return Location("pvc", draft, "the draft is the subdirectory %s of PVC %s; a Job removes it" % (subdir, claim),
                        pvc=claim, subdir=subdir, keep=keep, storage_uri=uri, mount_path=mount)
    _mode, normalised, is_oci = storage.parse_oci_scheme(uri)
    if is_oci:
        # oci+native:// (an ImageVolume, subPath models) reads the same /models layout as a Modelcar; the scheme is kept
        pointer, current = _storage_uri_pointer(isvc) if index is None else ("/spec/predictor/storageUris/%d/uri" % index, uri)
        image = normalised[len("oci://"):]
        return Location("modelcar", draft, "the draft is /%s/%s inside the Modelcar image %s; rebuilding the image without it"
                        % (MODELCAR_ROOT, rel, image), image=image, image_path="%s/%s" % (MODELCAR_ROOT, rel),
                        pointer=pointer, storage_uri=current, scheme=uri.split("://", 1)[0] + "://")
    return Location("none", draft, "the draft is part of %s, which this collection does not edit; remove it at the source" % uri)
