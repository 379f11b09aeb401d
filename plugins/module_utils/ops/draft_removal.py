# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Remove a rolled-back InferenceService's draft artifacts (``rollback_remove_draft_artifacts: true``).

The guide keeps the draft mounted after a rollback, so a roll-forward needs no download. When asked to
remove it, this file decides where the draft lives and what removing it means, from the InferenceService
and the path the old speculative config gave vLLM (``model``, e.g. ``/mnt/models/draft``):

- ``storage_uris``: a ``spec.predictor.storageUris`` entry of its own -> drop the entry (a guarded JSON patch).
- ``pvc``: a subdirectory of the PVC behind ``storageUri: pvc://<claim>/<prefix>`` -> the rollback role runs a
  short Job (the stager's image and script, ``artifact_sync.remove_subdir_main``) that removes the
  subdirectory and every manifest's claim on it; the PVC's ``spec-decoding.alauda.io/staged`` record loses it.
- ``modelcar``: ``/models/<rel>`` inside the ``oci://`` image -> a new manifest from the same blobs minus the
  draft's layers (layers are per file, named by ``org.opencontainers.image.title`` /
  ``io.alauda.spec-decoding.files``; a layer mixing draft and other files is rewritten without the
  draft's entries), pushed under ``<tag>-nodraft`` (manifest last), and ``storageUri`` moves to its digest.
  Layers without those annotations (images built by skopeo, buildah, docker ...) are read as a stream for
  their tar member index, of any size, plain or gzip (``layer_stream``); a rewritten layer is streamed from
  the registry into the upload, never held whole, and every blob read is checked against its digest.

Nothing is removed that the current (rolled-back) command, args or env still name, nor the directory that
holds them (the target), nor a path outside the volume (``..``, other absolute paths). A PVC subdirectory
another InferenceService or LLMInferenceService of the namespace mounts or names (``other_users``) is kept.

KServe's LLMInferenceService works the same way (``kind: LLMInferenceService``): its one ``spec.model.uri``
(``pvc://claim/path`` mounted at /mnt/models with the path as subPath, or ``oci://`` as a Modelcar at
/mnt/models) holds target and draft (llmisvc_render.render), so the draft is a PVC subdirectory or Modelcar layers;
the paths still named are those of every pool's containers. Plain Python, no Ansible imports.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import artifact_sync
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import storage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import layers as layer_stream
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import status as llmisvc_status
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import pvc_plan as pvc_stage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.ssa_conflicts import ROLLBACK_FIELD_MANAGER
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.modelcar_image import (
    ANN_FILES, ANN_ROLE, ANN_TITLE, MT_CONFIG, MT_DOCKER_LAYER_TAR, MT_DOCKER_MANIFEST, MT_LAYER_TAR, BytesSource, canonical_json, sha256_digest,
)

DEFAULT_MOUNT = storage.DEFAULT_MOUNT
MODELCAR_ROOT = "models"
PVC_JOB_ROOT = "/mnt/pvc"
SCRIPT_DIR = "/opt/spec-decoding"
STAGED_ANNOTATION = "spec-decoding.alauda.io/staged"
REMOVED_FROM_ANNOTATION = "io.alauda.spec-decoding.draft-removed-from"
DRAFT_NAME_KEY = "io.alauda.spec-decoding.draft-name"
RESULT_KEY = "spec_decoding_sync"
FIELD = "remove_draft_artifacts"
MAX_CONFIG_BYTES = 8 << 20
MAX_FILES_ANNOTATION = 64 << 10
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


def _under(path, parent):
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
        below = [posixpath.normpath(posixpath.join(prefix, posixpath.relpath(p, mount))) for p in named if _under(p, mount)]
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
            if _under(prefix, draft):
                out.append("%s (mounts pvc://%s%s)" % (label, claim, prefix))
                break
            names = [p for p in below if _under(p, draft)]
            if _under(draft, prefix) and names:
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
    users = [p for p in referenced if _under(p, draft)]
    if users:
        raise ValidationError("the rolled-back predictor still refers to %s (%s); refusing to remove it" % (draft, ", ".join(users)),
                              field=FIELD, hint="remove those references first, or keep the draft (the default)")
    covering = [m for m in _mounts(isvc) if _under(draft, m[2])]
    if not covering:
        return Location("none", draft, "nothing mounts %s (already removed, or it is not a mounted artifact); nothing to remove" % draft)
    index, uri, mount = max(covering, key=lambda m: len(m[2]))
    rel = posixpath.relpath(draft, mount) if draft != mount else ""
    others_in_mount = [p for p in referenced if _under(p, mount)]
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


# --------------------------------------------------------------------------------------------------
# PVC: the remover Job's plan, its log, the PVC record
# --------------------------------------------------------------------------------------------------
def staged_records(pvc):
    """The PVC's subdir -> {name, ...} staging record (written by the stage_pvc role)."""
    return pvc_stage.staged_annotation(pvc)


def pvc_job(location, pvc=None, script_sha256="", job_root=PVC_JOB_ROOT):
    """The remover's plan (JSON for its ConfigMap) and the Job / ConfigMap names (stable for the same plan)."""
    subdir = location.details["subdir"]
    record = staged_records(pvc).get(subdir) or {}
    item = {"subdir": subdir, "keep": location.details.get("keep") or []}
    if record.get("name"):
        item["name"] = record["name"]
    plan = {"root": job_root, "items": [], "remove": [item]}
    plan_json = json.dumps(plan, sort_keys=True, indent=1)
    digest = hashlib.sha256(plan_json.encode("utf-8") + json.dumps(record, sort_keys=True).encode("utf-8")
                            + (script_sha256 or "").encode("utf-8")).hexdigest()
    claim = location.details["pvc"]
    stem = claim[:40].rstrip("-.")
    return {"pvc": claim, "subdir": subdir, "keep": item["keep"], "plan": plan, "plan_json": plan_json, "plan_sha256": digest,
            "job": "%s-rmdraft-%s" % (stem, digest[:10]), "configmap": "%s-rmdraft" % stem, "staged_record": record or None,
            "command": ["python3", "-c", artifact_sync.REMOVE_LAUNCHER, "%s/artifact_sync.py" % SCRIPT_DIR, "--config", "%s/plan.json" % SCRIPT_DIR]}


def parse_remover_log(text, subdir):
    """The remover's summary item for ``subdir`` from its last JSON line; raise when it failed or is missing."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip().startswith("{") and RESULT_KEY in ln]
    try:
        summary = json.loads(lines[-1])[RESULT_KEY] if lines else None
    except (ValueError, KeyError, TypeError):
        summary = None
    if not isinstance(summary, dict) or summary.get("mode") != "remove":
        raise ValidationError("the remover's log has no summary line", field="remover log",
                              hint="the Job did not run the remover to the end; read its pod log")
    if not summary.get("ok"):
        errors = [it.get("error") for it in summary.get("items") or [] if it.get("error")]
        raise ValidationError("the remover failed: %s" % "; ".join(errors or ["unknown error"]), field="remover log")
    for item in summary.get("items") or []:
        if item.get("subdir") == subdir:
            if subdir.split("/")[0] in (summary.get("layout") or []) and "/" not in subdir:
                raise ValidationError("the PVC root still lists %s after the removal" % subdir, field="remover log")
            return item
    raise ValidationError("the remover's summary lacks %s" % subdir, field="remover log")


def staged_without(pvc, subdir):
    """(new annotation JSON, changed) for the PVC's staged record without ``subdir`` (and anything below it)."""
    staged = staged_records(pvc)
    keep = {k: v for k, v in staged.items() if not _under("/" + k.strip("/"), "/" + subdir)}
    return json.dumps(keep, sort_keys=True), len(keep) != len(staged)


# --------------------------------------------------------------------------------------------------
# Modelcar: a manifest without the draft's layers
# --------------------------------------------------------------------------------------------------
def layer_paths(desc):
    """Paths a layer holds, from its annotations: None when the layer does not say (or is the base)."""
    ann = (desc or {}).get("annotations") or {}
    if ann.get(ANN_ROLE) == "base":
        return []
    if ann.get(ANN_FILES):
        return [p.strip().strip("/") for p in ann[ANN_FILES].split(",") if p.strip()]
    title = ann.get(ANN_TITLE)
    if title and " (" not in title:
        return [title.strip("/")]
    return None


def classify_layers(manifest, image_path, listings=None):
    """Split the manifest's layers: 'keep', 'drop' (only draft files) or 'rewrite' (draft and other files).

    ``listings``: index -> paths read from the layer itself, for layers whose annotations do not say.
    Returns a list of (action, paths) per layer; raises when a layer's content is unknown.
    """
    prefix = image_path.strip("/")
    out = []
    for i, desc in enumerate(manifest.get("layers") or []):
        paths = (listings or {}).get(i)
        if paths is None:
            paths = layer_paths(desc)
        if paths is None:
            out.append(("unknown", None))
            continue
        files = [p.strip("/") for p in paths if p.strip("/")]
        draft = [p for p in files if _under("/" + p, "/" + prefix)]
        if not draft:
            out.append(("keep", files))
        elif len(draft) == len(files):
            out.append(("drop", files))
        else:
            out.append(("rewrite", files))
    return out


def _history_for_layers(history, count):
    """Indices into ``history`` of the entries that made a layer, or None when they do not line up."""
    idx = [i for i, h in enumerate(history or []) if not (h or {}).get("empty_layer")]
    return idx if len(idx) == count else None


def rewrite_manifest(manifest, config, actions, replacements, old_digest):
    """New (manifest bytes, config bytes) without the dropped layers and with the rewritten ones.

    ``actions``: per layer 'keep' / 'drop' / 'rewrite'; ``replacements``: index -> (descriptor, diff_id).
    Pure: no I/O. The draft-name label/annotation goes, ``io.alauda.spec-decoding.draft-removed-from`` names
    the image this one was made from.
    """
    layers = manifest.get("layers") or []
    diff_ids = list(((config.get("rootfs") or {}).get("diff_ids")) or [])
    if len(diff_ids) != len(layers):
        raise SpecDecodingError("the image config lists %d diff_ids for %d layers" % (len(diff_ids), len(layers)), field="storageUri",
                                hint="rebuild the image with alauda.spec_decoding.modelcar_image")
    history = list(config.get("history") or [])
    hist_idx = _history_for_layers(history, len(layers))
    new_layers, new_diff, drop_hist = [], [], set()
    for i, (desc, action) in enumerate(zip(layers, actions)):
        if action == "drop":
            if hist_idx is not None:
                drop_hist.add(hist_idx[i])
            continue
        if action == "rewrite":
            desc, diff_id = replacements[i]
            new_layers.append(desc)
            new_diff.append(diff_id)
        else:
            new_layers.append(desc)
            new_diff.append(diff_ids[i])
    if not any(a != "keep" for a in actions):
        raise SpecDecodingError("internal error: nothing to remove from the image")
    new_config = json.loads(json.dumps(config))
    new_config.setdefault("rootfs", {"type": "layers"})["diff_ids"] = new_diff
    if history:
        new_config["history"] = [h for j, h in enumerate(history) if j not in drop_hist] if hist_idx is not None else history
    labels = (new_config.get("config") or {}).get("Labels") or {}
    if DRAFT_NAME_KEY in labels:
        del labels[DRAFT_NAME_KEY]
        if not labels:
            del new_config["config"]["Labels"]
    config_bytes = canonical_json(new_config)
    new_manifest = {k: v for k, v in manifest.items() if k not in ("layers", "config", "annotations")}
    new_manifest["config"] = {"mediaType": (manifest.get("config") or {}).get("mediaType") or MT_CONFIG,
                              "digest": sha256_digest(config_bytes), "size": len(config_bytes)}
    new_manifest["layers"] = new_layers
    annotations = {k: v for k, v in (manifest.get("annotations") or {}).items() if k != DRAFT_NAME_KEY}
    annotations[REMOVED_FROM_ANNOTATION] = old_digest
    new_manifest["annotations"] = annotations
    return canonical_json(new_manifest), config_bytes


def rewritten_annotations(desc, kept):
    """The rewritten layer's annotations: its title and (when short enough) the files it holds."""
    ann = {k: v for k, v in (desc.get("annotations") or {}).items() if k not in (ANN_TITLE, ANN_FILES)}
    if len(kept) == 1:
        ann[ANN_TITLE] = kept[0]
        return ann
    ann[ANN_TITLE] = "%s (%d files)" % (posixpath.commonpath(["/" + k for k in kept]).lstrip("/") or "/", len(kept))
    files = ",".join(kept)
    if len(files) <= MAX_FILES_ANNOTATION and not any("," in k for k in kept):
        ann[ANN_FILES] = files  # a later removal need not read the layer again
    return ann


def _opener(reader, digest):
    return lambda: reader.open_blob(digest)


def nodraft_tag(ref, tag=None):
    """The tag for the image without the draft: the configured one, ``<tag>-nodraft``, or ``nodraft-<digest12>``."""
    if tag:
        return tag
    if ref.tag:
        return (ref.tag[:120] + "-nodraft")
    return "nodraft-" + (ref.digest or "").split(":")[-1][:12]


class RemoteImage:
    """The registry side: read the image, push the one without the draft. ``client`` is an oci_registry.RegistryClient."""

    def __init__(self, client):
        self.client = client

    def get_blob(self, digest, limit=MAX_CONFIG_BYTES):
        """A small blob (the image config), read whole and checked against its digest."""
        path = "/v2/%s/blobs/%s" % (self.client.ref.repository, digest)
        status, headers, data = self.client.request("GET", path, what="reading blob %s" % digest)
        for _hop in range(3):
            if status not in (301, 302, 303, 307, 308):
                break
            # a redirect to blob storage: fetch without the registry's credentials
            status, headers, data = self.client._raw("GET", headers.get("location"))  # pylint: disable=protected-access
        if status != 200:
            raise SpecDecodingError("registry %s: reading blob %s answered HTTP %s" % (self.client.registry, digest, status),
                                    field="storageUri", hint="check the image still exists and the credentials may pull it")
        if len(data) > limit:
            raise SpecDecodingError("blob %s is %d bytes, too big for an image config" % (digest, len(data)), field="storageUri")
        if sha256_digest(data) != digest:
            raise SpecDecodingError("blob %s does not match its digest" % digest, field="storageUri")
        return data

    def open_blob(self, digest):
        """A layer blob as a stream (its own connection); layer_stream reads it in pieces and checks the digest."""
        return self.client.open_blob(digest)

    def mount_or_check(self, digest, size, from_repo):
        """Make ``digest`` present in the target repository: HEAD, else a cross-repository mount (no upload)."""
        if self.client.blob_exists(digest, size):
            return "present"
        if from_repo and from_repo != self.client.ref.repository:
            status, _headers, data = self.client.request(
                "POST", "/v2/%s/blobs/uploads/?mount=%s&from=%s" % (self.client.ref.repository, digest, from_repo),
                what="mounting blob %s" % digest)
            if status == 201:
                return "mounted"
            if status == 202:  # the registry opened an upload instead: give it back
                raise SpecDecodingError("registry %s could not mount %s from %s (%s)" % (self.client.registry, digest, from_repo, data[:200]),
                                        field="modelcar_image", hint="push the new image to the same repository (the default)")
        raise SpecDecodingError("blob %s is missing from %s" % (digest, self.client.ref.repository), field="storageUri",
                                hint="the image is incomplete in the registry; push it again with alauda.spec_decoding.modelcar_image")


def plan_image(reader, manifest_bytes, image_path, old_digest):
    """Everything for the image without the draft, no writes: (actions, replacements, new manifest, new config, uploads)."""
    manifest = json.loads(manifest_bytes)
    if manifest.get("mediaType") and "index" in manifest.get("mediaType", "") or "manifests" in manifest:
        raise ValidationError("the image is a multi-platform index", field="storageUri",
                              hint="point storageUri at a single-platform manifest digest")
    if int((manifest.get("config") or {}).get("size") or 0) > MAX_CONFIG_BYTES:
        raise ValidationError("the image config is %s bytes, too big for an image config" % manifest["config"]["size"], field="storageUri")
    config = json.loads(reader.get_blob(manifest["config"]["digest"]))
    layers = manifest.get("layers") or []
    diff_ids = list(((config.get("rootfs") or {}).get("diff_ids")) or [])
    if len(diff_ids) != len(layers):
        diff_ids = [None] * len(layers)  # rewrite_manifest refuses the image if anything is to change
    scans = {}

    def scan_of(i):
        if i not in scans:
            desc = layers[i]
            scans[i] = layer_stream.scan(_opener(reader, desc["digest"]), desc, image_path, diff_ids[i])
        return scans[i]

    listings = {i: scan_of(i).paths for i, desc in enumerate(layers) if layer_paths(desc) is None}
    actions_paths = classify_layers(manifest, image_path, listings)
    actions = [a for a, _p in actions_paths]
    if all(a == "keep" for a in actions):
        return actions, {}, None, None, []
    replacements, uploads = {}, []
    layer_type = MT_DOCKER_LAYER_TAR if manifest.get("mediaType") == MT_DOCKER_MANIFEST else MT_LAYER_TAR
    for i, action in enumerate(actions):
        if action == "rewrite":
            desc = layers[i]
            found = scan_of(i)
            source = layer_stream.FilteredLayer(_opener(reader, desc["digest"]), desc, image_path, found, layer_type,
                                                rewritten_annotations(desc, found.kept))
            replacements[i] = (source.descriptor(), source.digest)
            uploads.append(source)
    new_manifest, new_config = rewrite_manifest(manifest, config, actions, replacements, old_digest)
    uploads.append(BytesSource(new_config, (manifest.get("config") or {}).get("mediaType") or MT_CONFIG))
    return actions, replacements, new_manifest, new_config, uploads


def manifest_files(manifest_bytes):
    """The image paths a manifest's layers hold, from their annotations (for results)."""
    out = []
    for desc in json.loads(manifest_bytes).get("layers") or []:
        out.extend(layer_paths(desc) or [])
    return out


# --------------------------------------------------------------------------------------------------
# the whole step, over a small cluster interface (the module supplies it; tests can too)
# --------------------------------------------------------------------------------------------------
DRAFT_REMOVED_ANNOTATION = "spec-decoding.alauda.io/draft-removed"
REMOVED_PVC_ANNOTATION = "spec-decoding.alauda.io/draft-removed"


def _annotation_op(obj, key, value):
    annotations = ((obj or {}).get("metadata") or {}).get("annotations")
    if annotations is None:
        return {"op": "add", "path": "/metadata/annotations", "value": {key: value}}
    return {"op": "add", "path": "/metadata/annotations/" + isvc_patch.escape_pointer(key), "value": value}


def removed_records(pvc):
    ann = ((pvc or {}).get("metadata") or {}).get("annotations") or {}
    try:
        data = json.loads(ann.get(REMOVED_PVC_ANNOTATION) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def execute(params, cluster, open_registry=None, check_mode=False):
    """Plan and (outside check mode) carry out the removal; returns the module result.

    ``cluster``: get_isvc(), patch_isvc(ops, dry_run), wait_ready(), get_pvc(name), patch_pvc_annotations(name, dict), and
    optionally list_users() -> (the namespace's InferenceServices and LLMInferenceServices, [kinds it could not list]):
    with it a PVC subdirectory another of them still uses (other_users), or that it could not check, is kept.
    ``open_registry(image_ref, repository=None)`` returns an oci_registry.RegistryClient (modelcar mode only).
    """
    isvc = cluster.get_isvc()
    state = readiness_of(isvc)
    if not (state["ready"] and state["up_to_date"]):
        raise ValidationError("the rolled-back revision is not Ready at generation %s yet (observedGeneration %s); the draft stays"
                              % (state["generation"], state["observed_generation"]), field=FIELD,
                              hint="wait for the rollback to be Ready (and proven) first")
    path, source = draft_path_from(isvc, params.get("previous_config"), params.get("draft_path"))
    loc = locate(isvc, path, source or "draft_path")
    result = {"changed": False, "source": source}
    result.update(loc.as_dict())
    if loc.mode == "storage_uris":
        ops = list(loc.details["ops"]) + [_annotation_op(isvc, DRAFT_REMOVED_ANNOTATION, json.dumps(
            {"mode": "storage_uris", "draft_path": loc.draft_path, "entry": loc.details["removed"]}, sort_keys=True))]
        after = cluster.patch_isvc(ops, dry_run=check_mode)
        result.update(changed=True, removed=loc.details["removed"], patch=ops)
        if not check_mode and params.get("wait"):
            after = cluster.wait_ready()
        result["resource"] = after
    elif loc.mode == "pvc":
        pvc = cluster.get_pvc(loc.details["pvc"])
        if pvc is None:
            raise ValidationError("PVC %s (from %s) does not exist" % (loc.details["pvc"], loc.details["storage_uri"]), field="storageUri")
        job = pvc_job(loc, pvc, params.get("script_sha256") or "")
        result["pvc_job"] = job
        subdir = loc.details["subdir"]
        lister = getattr(cluster, "list_users", None)
        if params.get("remover_log") is None and lister is not None:
            objects, unchecked = lister()
            users = other_users(objects, isvc, loc.details["pvc"], subdir) + unchecked
            if users:
                result.update(run_job=False, kept=True, still_used_by=users,
                              note="the subdirectory %s of PVC %s is kept: still used by %s" % (subdir, loc.details["pvc"], "; ".join(users)))
                result["warnings"] = [result["note"]]
                return result
        staged = staged_records(pvc)
        done = removed_records(pvc).get(subdir)
        if params.get("remover_log") is None:
            result["run_job"] = bool(subdir in staged or not done)
            if not result["run_job"]:
                result["note"] = "the subdirectory %s of PVC %s was removed earlier (Job %s); nothing to do" % (subdir, loc.details["pvc"], done)
            return result
        item = parse_remover_log(params["remover_log"], subdir)
        new_staged, dropped = staged_without(pvc, subdir)
        removed = dict(removed_records(pvc))
        removed[subdir] = params.get("remover_job") or job["job"]
        annotations = {REMOVED_PVC_ANNOTATION: json.dumps(removed, sort_keys=True)}
        if dropped:
            annotations[STAGED_ANNOTATION] = new_staged
        if not check_mode:
            cluster.patch_pvc_annotations(loc.details["pvc"], annotations)
        result.update(changed=bool(item.get("removed") or dropped or item.get("records_updated")), removed=item, run_job=False,
                      staged_annotation=new_staged)
    elif loc.mode == "modelcar":
        result.update(modelcar_remove(params, cluster, isvc, loc, open_registry, check_mode))
    return result


def readiness_of(isvc):
    """Ready / up-to-date of an InferenceService (isvc_readers.readiness) or an LLMInferenceService (llmisvc_status.readiness)."""
    if is_llmisvc(isvc):
        return llmisvc_status.readiness(isvc)
    # imported here: k8s_pods loads the kubernetes client (40+ MiB), which the image rewrite does not need
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers  # pylint: disable=import-outside-toplevel
    return isvc_readers.readiness(isvc)


def modelcar_remove(params, cluster, isvc, loc, open_registry, check_mode):
    """Push the image without the draft (blobs reused, manifest last) and move storageUri to its digest."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.registry import ImageRef  # pylint: disable=import-outside-toplevel

    ref = ImageRef.parse(loc.details["image"], field="storageUri")
    src = open_registry(ref)
    try:
        src.ping()
        got = src.get_manifest(ref.reference)
        if got is None:
            raise ValidationError("the image %s is not in the registry" % ref, field="storageUri",
                                  hint="check the InferenceService's storageUri and the registry credentials")
        old_digest, manifest_bytes, _ctype = got
        if ref.digest and old_digest != ref.digest:
            raise SpecDecodingError("registry %s returned manifest %s for %s" % (ref.registry, old_digest, ref.digest), field="storageUri")
        media_type = json.loads(manifest_bytes).get("mediaType") or _ctype or "application/vnd.oci.image.manifest.v1+json"
        actions, _repl, new_manifest, _new_config, uploads = plan_image(RemoteImage(src), manifest_bytes, loc.details["image_path"], old_digest)
    finally:
        src.close()
    out = {"image": {"from": str(ref), "layers_dropped": actions.count("drop"), "layers_rewritten": actions.count("rewrite"),
                     "layers_kept": actions.count("keep")}}
    if new_manifest is None:
        out["note"] = "the image %s holds no /%s; nothing to remove" % (ref, loc.details["image_path"])
        out["removed"] = None
        return out
    new_ref = ImageRef(ref.registry, params.get("repository") or ref.repository, nodraft_tag(ref, params.get("tag")))
    new_digest = sha256_digest(new_manifest)
    new_uri = loc.details.get("scheme", "oci://") + new_ref.with_digest(new_digest)
    out["image"].update(to="%s/%s:%s" % (new_ref.registry, new_ref.repository, new_ref.tag), digest=new_digest, storage_uri=new_uri)
    ops = [{"op": "test", "path": loc.details["pointer"], "value": loc.details["storage_uri"]},
           {"op": "replace", "path": loc.details["pointer"], "value": new_uri},
           _annotation_op(isvc, DRAFT_REMOVED_ANNOTATION, json.dumps(
               {"mode": "modelcar", "draft_path": loc.draft_path, "previous_storage_uri": loc.details["storage_uri"]}, sort_keys=True))]
    out.update(changed=True, removed={"image_path": "/" + loc.details["image_path"], "previous_storage_uri": loc.details["storage_uri"]},
               patch=ops)
    if check_mode:
        out["resource"] = cluster.patch_isvc(ops, dry_run=True)
        return out
    dst = open_registry(new_ref)
    try:
        dst.ping()
        remote = RemoteImage(dst)
        manifest = json.loads(new_manifest)
        fresh = {u.digest for u in uploads}
        stats = {"present": 0, "mounted": 0, "uploaded": 0}
        for desc in manifest["layers"]:
            if desc["digest"] in fresh:
                continue
            stats[remote.mount_or_check(desc["digest"], desc["size"], ref.repository)] += 1
        for source in uploads:
            if not dst.blob_exists(source.digest, source.size):
                dst.upload_blob(source)
                stats["uploaded"] += 1
            else:
                stats["present"] += 1
        stored = dst.put_manifest(new_ref.tag, new_manifest, media_type)
        if stored != new_digest:
            raise SpecDecodingError("registry %s stored the manifest as %s, expected %s" % (new_ref.registry, stored, new_digest),
                                    field="storageUri", hint="use a registry that stores OCI manifests as given")
    finally:
        dst.close()
    out["image"]["blobs"] = stats
    after = cluster.patch_isvc(ops, dry_run=False)
    if params.get("wait"):
        after = cluster.wait_ready()
    out["resource"] = after
    return out


# The API calls execute makes, for module draft_artifacts.

class Cluster:
    """The API calls draft_removal.execute makes, over kubernetes.core's authenticated ApiClient."""

    def __init__(self, api_client, params):
        self.api_client = api_client
        self.params = params

    def _error(self, what, exc):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
        return SpecDecodingError("%s failed: %s" % (what, k8s_pods.api_error_message(exc)), field="name")

    def _llm(self):
        return self.params.get("kind") == "LLMInferenceService"

    def get_isvc(self):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import (  # pylint: disable=import-outside-toplevel
            cluster as llmisvc_cluster,
        )
        if self._llm():
            return llmisvc_cluster.get(self.api_client, self.params["namespace"], self.params["name"], self.params["api_version"])
        return k8s_pods.get_inference_service(self.api_client, self.params["namespace"], self.params["name"])

    def list_users(self):
        """The namespace's InferenceServices and LLMInferenceServices (other users of a PVC), and the kinds that could
        not be listed (a kind whose CRD is not installed has no objects)."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import CustomObjectsApi  # pylint: disable=import-outside-toplevel
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
        objects, unchecked = [], []
        for kind, version, plural in (("InferenceService", "v1beta1", "inferenceservices"),
                                      ("LLMInferenceService", self.params["api_version"], "llminferenceservices")):
            try:
                items = CustomObjectsApi(self.api_client).list_namespaced_custom_object(
                    "serving.kserve.io", version, self.params["namespace"], plural).get("items") or []
            except Exception as exc:  # pylint: disable=broad-except
                if getattr(exc, "status", None) is None:
                    raise
                if exc.status == 404:
                    continue
                unchecked.append("%ss (listing them failed, so it is unknown whether one uses it: %s)" % (kind, k8s_pods.api_error_message(exc)))
                continue
            objects += [dict(item, kind=kind) for item in items]
        return objects, unchecked

    def patch_isvc(self, ops, dry_run=False):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import CustomObjectsApi  # pylint: disable=import-outside-toplevel
        api = CustomObjectsApi(self.api_client)
        # The rollback's field manager: a later deploy takes these fields back instead of refusing a foreign edit.
        kwargs = {"field_manager": ROLLBACK_FIELD_MANAGER}
        if dry_run:
            kwargs["dry_run"] = "All"
        version, plural = (self.params["api_version"], "llminferenceservices") if self._llm() else ("v1beta1", "inferenceservices")
        try:
            return api.patch_namespaced_custom_object("serving.kserve.io", version, self.params["namespace"], plural,
                                                      self.params["name"], ops, _content_type="application/json-patch+json", **kwargs)
        except Exception as exc:  # pylint: disable=broad-except
            if getattr(exc, "status", None) is None:
                raise
            raise self._error("patching InferenceService %s/%s" % (self.params["namespace"], self.params["name"]), exc) from exc

    def wait_ready(self):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
        isvc, _elapsed = isvc_wait.wait_ready(self.api_client, self.params["namespace"], self.params["name"],
                                              timeout=self.params["wait_timeout"], interval=self.params["wait_sleep"],
                                              kind=self.params["kind"], api_version=self.params["api_version"] if self._llm() else None)
        return isvc

    def get_pvc(self, name):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
        try:
            return request(self.api_client, "GET", "/api/v1/namespaces/%s/persistentvolumeclaims/%s" % (self.params["namespace"], name))
        except Exception as exc:  # pylint: disable=broad-except
            if getattr(exc, "status", None) == 404:
                return None
            if getattr(exc, "status", None) is None:
                raise
            raise self._error("reading PVC %s" % name, exc) from exc

    def patch_pvc_annotations(self, name, annotations):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
        try:
            request(self.api_client, "PATCH", "/api/v1/namespaces/%s/persistentvolumeclaims/%s" % (self.params["namespace"], name),
                    body={"metadata": {"annotations": annotations}}, content_type="application/merge-patch+json")
        except Exception as exc:  # pylint: disable=broad-except
            if getattr(exc, "status", None) is None:
                raise
            raise self._error("recording the removal on PVC %s" % name, exc) from exc


def registry_opener(params, hide=None):
    """open_registry(ref) for execute: a registry client with draft_artifacts' credentials (username/password or
    auth_file), TLS and timeout options; `hide` as for oci_registry.open_client."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as oci_registry  # pylint: disable=import-outside-toplevel

    def open_registry(ref):
        return oci_registry.open_client(ref, params["username"], params["password"], params["auth_file"], hide=hide,
                                        tls_verify=params["tls_verify"], ca_file=params["ca_file"], timeout=params["registry_timeout"])
    return open_registry
