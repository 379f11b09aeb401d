# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read an image layer as a stream: its tar member index, and the same layer without some paths.

For Modelcar images this collection did not build (skopeo, buildah, docker, olot ...): one layer may hold the
target and the draft together and be gigabytes long, plain or gzip-compressed. Nothing here holds a whole layer:

- ``BlobStream`` reads a blob in 1 MiB pieces from any file-like ``read(n)`` (the registry's HTTP response),
  gunzips it when it starts with the gzip magic (bounded output per call, concatenated gzip members too), and
  at the end checks the blob's length and digest, and the uncompressed tar's digest against the image
  config's ``diff_id``. A layer that does not match is never used: the index is trusted only after the whole
  pass, and an upload whose bytes differ from that pass's is not committed (``RegistryClient.upload_blob``).
- ``filtered_layer`` walks the tar headers in stream mode (``tarfile`` ``r|``: GNU long names, PAX headers),
  records every path it passes, skips the data of entries at or below the removed path and re-emits the rest
  the way the builder writes them (mtime 0, uid/gid 0, normalised modes). A directory is emitted just before
  the first kept entry below it, so directories that only held removed files go too.
- ``scan`` is the first pass (index + the new layer's size and digest); ``FilteredLayer`` is the upload
  source, which runs the same pass again from a fresh stream without hashing the source again: the upload
  checks the digest of what it sends against the first pass's, which covers any change in between.

Plain Python, stdlib only; no Ansible imports.
"""

from __future__ import annotations

import hashlib
import http.client
import tarfile
import zlib

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.oci_blobs import BLOCK, CHUNK, MT_LAYER_TAR, Entry, Source

FIELD = "storageUri"
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
REBUILD_HINT = "rebuild the image with alauda.spec_decoding.modelcar_image"


def check_media_type(desc):
    """Refuse layers that are not tar streams (or are zstd, which Python's tarfile cannot read) by media type."""
    media_type = (desc or {}).get("mediaType") or ""
    if "zstd" in media_type:
        raise ValidationError("layer %s is zstd-compressed (%s), which this collection cannot read" % (desc.get("digest"), media_type),
                              field=FIELD, hint="push the image with gzip or uncompressed layers (skopeo copy --dest-compress-format gzip)")
    if media_type and "tar" not in media_type:
        raise ValidationError("layer %s has media type %s, not a tar layer" % (desc.get("digest"), media_type), field=FIELD,
                              hint=REBUILD_HINT)


def member_name(name):
    """A tar member's path as the image sees it: no leading './' or '/', no trailing '/'."""
    while name.startswith("./"):
        name = name[2:]
    return name.strip("/")


def _under(path, parent):
    return path == parent or path.startswith(parent.rstrip("/") + "/")


class BlobStream:
    """A file-like ``read(n)`` over one layer blob: tar bytes out (gunzipped when needed), digests checked by ``finish``."""

    def __init__(self, raw, digest, size, diff_id=None, verify=True):
        self._raw = raw
        self.verify = verify
        self.digest = digest
        self.size = size
        self.diff_id = diff_id
        self.compression = None
        self.read_bytes = 0
        self.tar_bytes = 0
        self._hash = hashlib.sha256()
        self._diff = hashlib.sha256()
        self._out = b""
        self._tail = b""
        self._z = None
        self._started = False
        self._raw_eof = False

    def _next_raw(self):
        if self._raw_eof:
            return b""
        try:
            data = self._raw.read(CHUNK)
        except (OSError, http.client.HTTPException) as exc:
            raise SpecDecodingError("reading layer %s broke off after %d bytes: %s" % (self.digest, self.read_bytes, exc), field=FIELD,
                                    hint="check the registry is up, then rerun") from exc
        if not data:
            self._raw_eof = True
            return b""
        self.read_bytes += len(data)
        if self.size is not None and self.read_bytes > self.size:
            raise SpecDecodingError("layer %s is longer than the %d bytes its descriptor says" % (self.digest, self.size), field=FIELD,
                                    hint=REBUILD_HINT)
        if self.verify:
            self._hash.update(data)
        return data

    def _emit(self, data):
        if self.verify:
            self._diff.update(data)
        self.tar_bytes += len(data)
        return data

    def _more(self):
        """The next piece of tar bytes (at most about 1 MiB), b'' at the end of the blob."""
        if not self._started:
            self._started = True
            first = self._next_raw()
            if first.startswith(ZSTD_MAGIC):
                raise ValidationError("layer %s is zstd-compressed, which this collection cannot read" % self.digest, field=FIELD,
                                      hint="push the image with gzip or uncompressed layers (skopeo copy --dest-compress-format gzip)")
            if not first.startswith(GZIP_MAGIC):
                return self._emit(first)
            self.compression = "gzip"
            self._z = zlib.decompressobj(31)
            self._tail = first
        if self._z is None:
            return self._emit(self._next_raw())
        try:
            while True:
                if self._z.eof:
                    rest = self._tail.lstrip(b"\0")  # zero padding after a member is allowed
                    while not rest:
                        rest = self._next_raw()
                        if not rest:
                            self._tail = b""
                            return b""
                        rest = rest.lstrip(b"\0")
                    self._z = zlib.decompressobj(31)  # a concatenated gzip member
                    self._tail = rest
                elif not self._tail:
                    self._tail = self._next_raw()
                    if not self._tail:
                        raise SpecDecodingError("layer %s: the gzip stream ends early" % self.digest, field=FIELD, hint=REBUILD_HINT)
                out = self._z.decompress(self._tail, CHUNK)
                self._tail = self._z.unused_data if self._z.eof else self._z.unconsumed_tail
                if out:
                    return self._emit(out)
        except zlib.error as exc:
            raise SpecDecodingError("layer %s is not a valid gzip stream (%s)" % (self.digest, exc), field=FIELD, hint=REBUILD_HINT) from exc

    def read(self, n=-1):
        if n is None or n < 0:
            n = CHUNK
        if not self._out:
            self._out = self._more()
        data, self._out = self._out[:n], self._out[n:]
        return data

    def finish(self):
        """Read to the end and check length and digests; returns the uncompressed tar's digest (the diff_id)."""
        while self._out or self._more():
            self._out = b""
        if self.size is not None and self.read_bytes != self.size:
            raise SpecDecodingError("layer %s has %d bytes, its descriptor says %d" % (self.digest, self.read_bytes, self.size), field=FIELD,
                                    hint=REBUILD_HINT)
        if not self.verify:
            return None
        got = "sha256:" + self._hash.hexdigest()
        if self.digest and got != self.digest:
            raise SpecDecodingError("layer %s does not match its digest (the content hashes to %s)" % (self.digest, got), field=FIELD,
                                    hint="the blob in the registry is corrupt; push the image again")
        diff_id = "sha256:" + self._diff.hexdigest()
        if self.diff_id and diff_id != self.diff_id:
            raise SpecDecodingError("layer %s unpacks to %s, the image config's diff_id says %s" % (self.digest, diff_id, self.diff_id),
                                    field=FIELD, hint="the image config does not describe its layers; rebuild the image")
        return diff_id


class LayerScan:
    """What one pass over a layer found: every non-directory path, the kept ones, the filtered tar's size and digest."""

    def __init__(self):
        self.paths = []
        self.kept = []
        self.removed = 0
        self.size = 0
        self.digest = None
        self.diff_id = None
        self.compression = None
        self.read_bytes = 0


def _ancestors(name):
    parts = name.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def filtered_layer(stream, image_path, found):
    """Yield the layer's tar without the entries at or below ``image_path``, filling ``found`` (a LayerScan) as members go by.

    ``stream`` is a BlobStream; its ``finish()`` runs before the last block is yielded, so a consumer that
    commits only after the generator ends never commits bytes of a blob that failed its digest check.
    """
    prefix = "/" + image_path.strip("/")
    pending, needed = {}, set()
    digest = stream.digest
    try:
        tar = tarfile.open(fileobj=stream, mode="r|", bufsize=CHUNK)  # pylint: disable=consider-using-with
    except tarfile.TarError as exc:
        raise SpecDecodingError("layer %s is not a tar archive (%s)" % (digest, exc), field=FIELD, hint=REBUILD_HINT) from exc
    try:
        for member in tar:
            name = member_name(member.name)
            if not name:
                continue
            inside = _under("/" + name, prefix)
            if member.isdir():
                if not inside:
                    entry = Entry(name, "dir", mode=member.mode & 0o7777)
                    if name in needed:  # its contents came first: emit it now
                        yield entry.header
                    else:
                        pending[name] = entry
                continue
            found.paths.append(name)
            if inside:
                found.removed += 1
                continue
            for parent in _ancestors(name):
                needed.add(parent)
                if parent in pending:
                    yield pending.pop(parent).header
            if member.issym():
                yield Entry(name, "symlink", linkname=member.linkname).header
            elif member.islnk():
                target = member_name(member.linkname)
                if _under("/" + target, prefix):
                    raise ValidationError("%s in layer %s is a hard link to %s, which is removed with %s" % (name, digest, target, prefix),
                                          field=FIELD, hint="rebuild the image without hard links between the target and the draft")
                yield Entry(name, "hardlink", linkname=target).header
            elif member.isreg():
                entry = Entry(name, "file", size=member.size, mode=0o755 if member.mode & 0o111 else 0o644)
                yield entry.header
                src = tar.extractfile(member)
                left = member.size
                while left > 0:
                    data = src.read(min(CHUNK, left))
                    if not data:
                        raise SpecDecodingError("layer %s ends inside %s" % (digest, name), field=FIELD, hint=REBUILD_HINT)
                    left -= len(data)
                    yield data
                if member.size % BLOCK:
                    yield bytes(BLOCK - member.size % BLOCK)
            else:
                raise ValidationError("layer %s holds %s, a special file (tar type %r)" % (digest, name, member.type), field=FIELD,
                                      hint=REBUILD_HINT)
            found.kept.append(name)
    except tarfile.TarError as exc:
        raise SpecDecodingError("layer %s is not a readable tar archive (%s)" % (digest, exc), field=FIELD, hint=REBUILD_HINT) from exc
    finally:
        tar.close()
    found.diff_id = stream.finish()
    found.compression = stream.compression
    found.read_bytes = stream.read_bytes
    yield bytes(2 * BLOCK)


def scan(open_raw, desc, image_path, diff_id=None):
    """One pass over the layer ``desc``: its paths, the kept ones, and the size and digest of the layer without ``image_path``.

    ``open_raw()`` returns a fresh file-like over the blob's bytes (closed here).
    """
    check_media_type(desc)
    result = LayerScan()
    h = hashlib.sha256()
    raw = open_raw()
    try:
        for chunk in filtered_layer(BlobStream(raw, desc.get("digest"), desc.get("size"), diff_id), image_path, result):
            h.update(chunk)
            result.size += len(chunk)
    finally:
        raw.close()
    result.digest = "sha256:" + h.hexdigest()
    return result


class FilteredLayer(Source):
    """The upload source of a layer without ``image_path``: the same pass as ``scan``, from a fresh stream each time."""

    def __init__(self, open_raw, desc, image_path, layer_scan, media_type=MT_LAYER_TAR, annotations=None):
        self.open_raw = open_raw
        self.desc = desc
        self.image_path = image_path
        self.scan = layer_scan
        self.media_type = media_type
        self.annotations = annotations
        self.size = layer_scan.size
        self.digest = layer_scan.digest

    def chunks(self):
        raw = self.open_raw()
        try:
            again = LayerScan()
            stream = BlobStream(raw, self.desc.get("digest"), self.desc.get("size"), verify=False)
            yield from filtered_layer(stream, self.image_path, again)
        finally:
            raw.close()
