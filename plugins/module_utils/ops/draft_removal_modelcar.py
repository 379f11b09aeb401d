# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Modelcar image without the draft: a new manifest from the same blobs minus the draft's layers.

Layers are per file, named by ``org.opencontainers.image.title`` / ``io.alauda.spec-decoding.files``; a layer
mixing draft and other files is rewritten without the draft's entries. Layers without those annotations (images
built by skopeo, buildah, docker ...) are read as a stream for their tar member index, of any size, plain or gzip
(``layer_stream``); a rewritten layer is streamed from the registry into the upload, never held whole, and every
blob read is checked against its digest. ``plan_image`` plans it all without a write; ops/draft_removal.py pushes
the result under ``<tag>-nodraft`` (manifest last) and moves ``storageUri`` to its digest.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import json
import posixpath

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import layers as layer_stream
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.oci_blobs import (
    ANN_FILES, ANN_ROLE, ANN_TITLE, MT_CONFIG, MT_DOCKER_LAYER_TAR, MT_DOCKER_MANIFEST, MT_LAYER_TAR, BytesSource, canonical_json, sha256_digest,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.draft_location import is_under

REMOVED_FROM_ANNOTATION = "io.alauda.spec-decoding.draft-removed-from"
DRAFT_NAME_KEY = "io.alauda.spec-decoding.draft-name"
MAX_CONFIG_BYTES = 8 << 20
MAX_FILES_ANNOTATION = 64 << 10


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
        draft = [p for p in files if is_under("/" + p, "/" + prefix)]
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
