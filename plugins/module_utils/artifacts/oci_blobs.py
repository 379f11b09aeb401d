# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The blobs of an OCI image: media types, digests, reproducible tar layers read as a stream, the layer digest cache.

Every layer is a plain tar (``application/vnd.oci.image.layer.v1.tar``) whose entries have mtime 0,
uid/gid 0, empty owner names and normalised modes (0644 files, 0755 directories and executables), and
which lists the file's parent directories first. The same file at the same image path therefore always
gives the same layer digest, and an unchanged file reuses its blob in the registry. Layers are never
materialised: ``Layer.chunks()`` yields the tar stream (headers from memory, file content read in 1 MiB
blocks), so peak memory stays flat whatever the model size. A stat cache maps
(path, size, mtime_ns, ctime_ns, inode) to the layer digest so an unchanged rerun reads no file.

The Modelcar image made of them is artifacts.modelcar_image; OCI layout directories and oci-archives are
artifacts.oci_layout.

Plain Python, stdlib only; no Ansible imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError

FORMAT_VERSION = 1
CHUNK = 1 << 20
BLOCK = 512

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
MT_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MT_DOCKER_LAYER_TAR = "application/vnd.docker.image.rootfs.diff.tar"
UNCOMPRESSED_LAYER_TYPES = (MT_LAYER_TAR, MT_DOCKER_LAYER_TAR)

ANN_TITLE = "org.opencontainers.image.title"
ANN_REF_NAME = "org.opencontainers.image.ref.name"
ANN_FILES = "io.alauda.spec-decoding.files"
ANN_ROLE = "io.alauda.spec-decoding.layer"

DEFAULT_CACHE_DIR = os.path.join(files.CACHE_DIR, "modelcar")


def canonical_json(obj):
    """Bytes of ``obj`` as sorted, compact JSON: the same input always gives the same digest."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------------
# tar entries
# --------------------------------------------------------------------------------------------------
def tar_header(name, kind, size=0, mode=0o644, linkname=""):
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = mode
    if kind == "dir":
        info.type = tarfile.DIRTYPE
        info.size = 0
    elif kind == "symlink":
        info.type = tarfile.SYMTYPE
        info.linkname = linkname
        info.size = 0
    elif kind == "hardlink":
        info.type = tarfile.LNKTYPE
        info.linkname = linkname
        info.size = 0
    else:
        info.type = tarfile.REGTYPE
        info.size = size
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def tar_padding(size):
    rest = size % BLOCK
    return (BLOCK - rest) if rest else 0


class Entry:
    """One tar entry: a directory, a symlink, or a regular file read from ``src`` (or ``data``)."""

    __slots__ = ("name", "kind", "src", "data", "size", "mode", "linkname", "stat_key", "header")

    def __init__(self, name, kind, src=None, data=None, size=0, mode=None, linkname="", stat_key=None):
        self.name = name.strip("/")
        self.kind = kind
        self.src = src
        self.data = data
        self.size = len(data) if data is not None else size
        self.mode = mode if mode is not None else (0o755 if kind == "dir" else 0o777 if kind == "symlink" else 0o644)
        self.linkname = linkname
        self.stat_key = stat_key
        tar_name = self.name + "/" if kind == "dir" else self.name
        self.header = tar_header(tar_name, kind, self.size, self.mode, linkname)

    @property
    def tar_size(self):
        if self.kind != "file":
            return len(self.header)
        return len(self.header) + self.size + tar_padding(self.size)

    def cache_part(self):
        if self.kind == "file" and self.data is None:
            return [self.name, self.mode] + list(self.stat_key)
        if self.kind == "file":
            return [self.name, self.mode, hashlib.sha256(self.data).hexdigest()]
        return [self.name, self.kind, self.mode, self.linkname]


class Source:
    """A blob to put into the image: size and media type known, digest known or computed by streaming."""

    media_type = MT_LAYER_TAR
    digest = None
    size = 0
    annotations = None
    cache_key = None

    def chunks(self):  # pragma: no cover - interface
        raise NotImplementedError

    def descriptor(self):
        if not self.digest:
            raise SpecDecodingError("internal error: descriptor requested before the digest was computed")
        desc = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.annotations:
            desc["annotations"] = dict(self.annotations)
        return desc

    def compute_digest(self, progress=None):
        """Read the whole stream once to learn the digest (used when the stat cache has no entry)."""
        h = hashlib.sha256()
        n = 0
        for chunk in self.chunks():
            h.update(chunk)
            n += len(chunk)
            if progress:
                progress(len(chunk))
        self._check_size(n)
        self.digest = "sha256:" + h.hexdigest()
        return self.digest

    def _check_size(self, n):
        if n != self.size:
            raise SpecDecodingError(
                "%s: read %d bytes, expected %d" % (self.title(), n, self.size),
                hint="a file changed while the image was being built; rerun when the model directory is stable")

    def title(self):
        return (self.annotations or {}).get(ANN_TITLE) or self.digest or "blob"


class BytesSource(Source):
    """A small in-memory blob (config, manifest)."""

    def __init__(self, data, media_type, annotations=None):
        self.data = data
        self.media_type = media_type
        self.size = len(data)
        self.digest = sha256_digest(data)
        self.annotations = annotations

    def chunks(self):
        yield memoryview(self.data)


class FileBlobSource(Source):
    """An existing blob: a byte range of a file (an OCI layout blob or a member of an oci-archive)."""

    def __init__(self, path, digest, size, media_type, annotations=None, offset=0):
        self.path = path
        self.digest = digest
        self.size = size
        self.media_type = media_type
        self.annotations = annotations
        self.offset = offset

    def chunks(self):
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        left = self.size
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            while left > 0:
                n = fh.readinto(view[:min(CHUNK, left)])
                if not n:
                    raise SpecDecodingError("%s: blob %s is truncated" % (self.path, self.digest),
                                            hint="rebuild the archive")
                left -= n
                yield view[:n]


class TarLayer(Source):
    """A layer generated from entries; its bytes are produced on demand and never held whole."""

    media_type = MT_LAYER_TAR

    def __init__(self, entries, annotations=None):
        self.entries = entries
        self.annotations = annotations or {}
        self.size = sum(e.tar_size for e in entries) + 2 * BLOCK
        self.cache_key = hashlib.sha256(canonical_json([FORMAT_VERSION] + [e.cache_part() for e in entries])).hexdigest()
        self.digest = None

    @property
    def content_bytes(self):
        return sum(e.size for e in self.entries if e.kind == "file")

    def chunks(self):
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        for entry in self.entries:
            yield memoryview(entry.header)
            if entry.kind != "file":
                continue
            if entry.data is not None:
                yield memoryview(entry.data)
            else:
                left = entry.size
                with open(entry.src, "rb") as fh:
                    while left > 0:
                        n = fh.readinto(view[:min(CHUNK, left)])
                        if not n:
                            raise SpecDecodingError(
                                "%s shrank while the image was being built (expected %d bytes)" % (entry.src, entry.size),
                                hint="rerun when the model directory is stable")
                        left -= n
                        yield view[:n]
                    if fh.read(1):
                        raise SpecDecodingError("%s grew while the image was being built" % entry.src,
                                                hint="rerun when the model directory is stable")
            pad = tar_padding(entry.size)
            if pad:
                yield memoryview(bytes(pad))
        yield memoryview(bytes(2 * BLOCK))


# --------------------------------------------------------------------------------------------------
# stat cache
# --------------------------------------------------------------------------------------------------
class DigestCache:
    """Layer digests keyed by the stat data of the files they hold; one JSON file, written atomically."""

    MAX_ENTRIES = 20000

    def __init__(self, cache_dir=None, enabled=True):
        self.enabled = enabled
        self.path = os.path.join(os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR), "layer-digests.json")
        self.data = {}
        self.dirty = False
        if enabled:
            try:
                with open(self.path, "r", encoding="utf-8") as fh:
                    loaded = json.load(fh)
                if isinstance(loaded, dict) and loaded.get("version") == FORMAT_VERSION:
                    self.data = loaded.get("layers", {})
            except (OSError, ValueError):
                self.data = {}

    def lookup(self, layer):
        if not self.enabled or not layer.cache_key:
            return False
        hit = self.data.get(layer.cache_key)
        if hit and hit[1] == layer.size:
            layer.digest = hit[0]
            return True
        return False

    def store(self, layer):
        if self.enabled and layer.cache_key and layer.digest:
            if self.data.get(layer.cache_key) != [layer.digest, layer.size]:
                self.data[layer.cache_key] = [layer.digest, layer.size]
                self.dirty = True

    def save(self):
        if not (self.enabled and self.dirty):
            return
        if len(self.data) > self.MAX_ENTRIES:
            keys = list(self.data)[-self.MAX_ENTRIES:]
            self.data = {k: self.data[k] for k in keys}
        directory = os.path.dirname(self.path)
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".layer-digests.")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": FORMAT_VERSION, "layers": self.data}, fh)
            os.replace(tmp, self.path)
            self.dirty = False
        except OSError:
            # A cache that cannot be written only costs speed on the next run.
            pass


def resolve_digests(plan, cache, progress=None, only=None):
    """Fill in missing layer digests: from the stat cache, else by reading the files (counted via ``progress``).

    ``only`` limits hashing to those layers; returns the list of layers hashed now.
    """
    hashed = []
    for layer in plan.layers:
        if layer.digest:
            continue
        if cache.lookup(layer):
            continue
        if only is not None and layer not in only:
            continue
        layer.compute_digest(progress)
        cache.store(layer)
        hashed.append(layer)
    return hashed
