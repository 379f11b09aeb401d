# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""OCI image layouts: read a layout directory or an oci-archive (a base image, an archive to push later), and write
an image plan as either.

A blob is written by streaming it once, its digest checked on the way; a layout directory keeps the blobs it
already holds, and an oci-archive that already holds exactly this manifest is not written again.

Plain Python, stdlib only; no Ansible imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files as local_files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.oci_blobs import (
    ANN_REF_NAME, BLOCK, MT_INDEX, MT_MANIFEST, BytesSource, DigestCache, FileBlobSource, canonical_json, resolve_digests, sha256_digest,
    tar_header, tar_padding,
)


# --------------------------------------------------------------------------------------------------
# reading OCI layouts / oci-archives (for a base image or for pushing an archive later)
# --------------------------------------------------------------------------------------------------
class LayoutReader:
    """Read-only access to an OCI image layout directory or an oci-archive tar file."""

    def __init__(self, path, field):
        self.field = field
        self.path = os.path.abspath(os.path.expanduser(path))
        self.members = None
        if os.path.isdir(self.path):
            if not os.path.isfile(os.path.join(self.path, "index.json")):
                raise ValidationError("%s has no index.json, so it is not an OCI image layout" % self.path, field=field,
                                      hint="give a directory written by this module, skopeo (oci:DIR) or buildah")
        elif os.path.isfile(self.path):
            self.members = {}
            try:
                with tarfile.open(self.path, "r:") as tf:
                    for m in tf:
                        if m.isfile():
                            self.members[m.name.lstrip("./")] = (m.offset_data, m.size)
            except (tarfile.TarError, OSError) as exc:
                raise ValidationError("%s is not a readable oci-archive (%s)" % (self.path, exc), field=field,
                                      hint="give an OCI layout directory or an uncompressed tar of one") from exc
            if "index.json" not in self.members:
                raise ValidationError("%s has no index.json, so it is not an oci-archive" % self.path, field=field,
                                      hint="give a tar of an OCI image layout")
        else:
            raise ValidationError("%s does not exist" % self.path, field=field, hint="give an existing OCI layout or oci-archive")

    def read(self, name):
        if self.members is None:
            with open(os.path.join(self.path, name), "rb") as fh:
                return fh.read()
        offset, size = self.members[name]
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            return fh.read(size)

    def blob(self, desc):
        algo, hexd = desc["digest"].split(":", 1)
        name = "blobs/%s/%s" % (algo, hexd)
        ann = desc.get("annotations")
        if self.members is None:
            full = os.path.join(self.path, name)
            if not os.path.isfile(full):
                raise ValidationError("%s: blob %s is missing" % (self.path, desc["digest"]), field=self.field,
                                      hint="the layout is incomplete; rebuild it")
            return FileBlobSource(full, desc["digest"], desc["size"], desc["mediaType"], ann)
        if name not in self.members:
            raise ValidationError("%s: blob %s is missing" % (self.path, desc["digest"]), field=self.field,
                                  hint="the archive is incomplete; rebuild it")
        offset, size = self.members[name]
        if size != desc["size"]:
            raise ValidationError("%s: blob %s has %d bytes, the manifest says %d" % (self.path, desc["digest"], size, desc["size"]),
                                  field=self.field, hint="the archive is corrupt; rebuild it")
        return FileBlobSource(self.path, desc["digest"], desc["size"], desc["mediaType"], ann, offset=offset)

    def _json_blob(self, desc):
        src = self.blob(desc)
        data = b"".join(bytes(c) for c in src.chunks())
        if sha256_digest(data) != desc["digest"]:
            raise ValidationError("%s: blob %s does not match its digest" % (self.path, desc["digest"]), field=self.field,
                                  hint="the layout is corrupt; rebuild it")
        return data

    def image(self, ref_name=None):
        """Return ``(manifest_bytes, manifest_dict, config_dict, ref_name)`` of the chosen image."""
        index = json.loads(self.read("index.json"))
        manifests = index.get("manifests") or []
        if ref_name:
            chosen = [m for m in manifests if (m.get("annotations") or {}).get(ANN_REF_NAME) == ref_name]
        else:
            chosen = manifests
        if len(chosen) != 1:
            names = sorted((m.get("annotations") or {}).get(ANN_REF_NAME, m.get("digest")) for m in manifests)
            raise ValidationError(
                "%s: %s (images: %s)" % (self.path, "no image named %r" % ref_name if ref_name and not chosen else
                                         "holds %d images, say which one" % len(chosen), ", ".join(names) or "none"),
                field=self.field, hint="append :NAME to the path (e.g. /path/layout:v1)")
        desc = chosen[0]
        if desc.get("mediaType") == MT_INDEX:
            raise ValidationError("%s: multi-platform indexes are not supported" % self.path, field=self.field,
                                  hint="give a single-platform image")
        manifest_bytes = self._json_blob(desc)
        manifest = json.loads(manifest_bytes)
        config = json.loads(self._json_blob(manifest["config"]))
        return manifest_bytes, manifest, config, (desc.get("annotations") or {}).get(ANN_REF_NAME)


def split_layout_ref(value):
    """``oci:/path:tag`` / ``/path:tag`` / ``/path`` -> (path, tag or None)."""
    if value.startswith("oci-archive:"):
        value = value[len("oci-archive:"):]
    elif value.startswith("oci:"):
        value = value[len("oci:"):]
    path, tag = value, None
    if not os.path.exists(os.path.expanduser(value)) and ":" in os.path.basename(value):
        path, tag = value.rsplit(":", 1)
    return path, tag


# --------------------------------------------------------------------------------------------------
# writing an OCI layout directory or oci-archive
# --------------------------------------------------------------------------------------------------
def _write_blob_file(directory, source, cache):
    """Write one blob under ``blobs/sha256``; skip it when a file of that digest and size is there."""
    blobs = os.path.join(directory, "blobs", "sha256")
    if source.digest:
        final = os.path.join(blobs, source.digest.split(":", 1)[1])
        if os.path.isfile(final) and os.path.getsize(final) == source.size:
            return 0
    fd, tmp = tempfile.mkstemp(dir=blobs, prefix=".tmp-")
    h = hashlib.sha256()
    n = 0
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in source.chunks():
                h.update(chunk)
                fh.write(chunk)
                n += len(chunk)
        source._check_size(n)  # pylint: disable=protected-access
        digest = "sha256:" + h.hexdigest()
        if source.digest and source.digest != digest:
            raise SpecDecodingError("%s: content digest %s differs from the expected %s" % (source.title(), digest, source.digest),
                                    hint="the source changed while it was read; rerun")
        source.digest = digest
        if cache is not None:
            cache.store(source)
        final = os.path.join(blobs, digest.split(":", 1)[1])
        if os.path.isfile(final) and os.path.getsize(final) == source.size:
            os.unlink(tmp)
            return 0
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
        return n
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _index_bytes(manifest_digest, manifest_size, ref_name):
    desc = {"mediaType": MT_MANIFEST, "digest": manifest_digest, "size": manifest_size}
    if ref_name:
        desc["annotations"] = {ANN_REF_NAME: ref_name}
    return canonical_json({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": [desc]})


def write_layout_dir(plan, directory, ref_name, cache=None):
    """Write (or update) an OCI image layout directory. Returns bytes written (0: already up to date)."""
    directory = os.path.abspath(os.path.expanduser(directory))
    os.makedirs(os.path.join(directory, "blobs", "sha256"), exist_ok=True)
    written = 0
    for layer in plan.layers:
        written += _write_blob_file(directory, layer, cache)
    config = plan.config_source()
    written += _write_blob_file(directory, config, None)
    manifest = BytesSource(plan.manifest_bytes(), MT_MANIFEST)
    written += _write_blob_file(directory, manifest, None)
    files = {"oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"}),
             "index.json": _index_bytes(manifest.digest, manifest.size, ref_name)}
    for name, data in files.items():
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as fh:
                if fh.read() == data:
                    continue
        except OSError:
            pass
        local_files.write_whole(path, data)
        written += len(data)
    return written


def _archive_header(name, size, kind="file"):
    return tar_header(name, kind, size, 0o755 if kind == "dir" else 0o644)


def write_oci_archive(plan, path, ref_name, cache=None):
    """Write an oci-archive (a tar of an OCI layout) by streaming every blob once.

    Layers whose digest is unknown are hashed first (stat cache), because a tar member's name is its digest.
    Returns bytes written; 0 when the archive on disk already holds exactly this manifest.
    """
    path = os.path.abspath(os.path.expanduser(path))
    resolve_digests(plan, cache or DigestCache(enabled=False))
    manifest = BytesSource(plan.manifest_bytes(), MT_MANIFEST)
    index = _index_bytes(manifest.digest, manifest.size, ref_name)
    if os.path.isfile(path):
        try:
            if LayoutReader(path, "archive").read("index.json") == index:
                return 0
        except (ValidationError, KeyError, OSError):
            pass
    blobs = []
    seen = set()
    for src in list(plan.layers) + [plan.config_source(), manifest]:
        if src.digest not in seen:
            seen.add(src.digest)
            blobs.append(src)
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".oci-archive-")
    written = 0
    try:
        with os.fdopen(fd, "wb") as fh:
            for name, kind, data in (("blobs", "dir", b""), ("blobs/sha256", "dir", b""),
                                     ("oci-layout", "file", canonical_json({"imageLayoutVersion": "1.0.0"})),
                                     ("index.json", "file", index)):
                fh.write(_archive_header(name + ("/" if kind == "dir" else ""), len(data), kind))
                fh.write(data)
                fh.write(bytes(tar_padding(len(data))))
            for src in blobs:
                fh.write(_archive_header("blobs/sha256/" + src.digest.split(":", 1)[1], src.size))
                h = hashlib.sha256()
                n = 0
                for chunk in src.chunks():
                    h.update(chunk)
                    fh.write(chunk)
                    n += len(chunk)
                src._check_size(n)  # pylint: disable=protected-access
                if "sha256:" + h.hexdigest() != src.digest:
                    raise SpecDecodingError("%s changed while the archive was written" % src.title(), hint="rerun")
                fh.write(bytes(tar_padding(src.size)))
            fh.write(bytes(2 * BLOCK))
            written = fh.tell()
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return written


def write_archive(plan, path, ref_name, cache=None):
    """``path`` ending in .tar -> oci-archive, anything else -> OCI layout directory."""
    if path.endswith(".tar"):
        return write_oci_archive(plan, path, ref_name, cache)
    return write_layout_dir(plan, path, ref_name, cache)
