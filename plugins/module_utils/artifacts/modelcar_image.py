# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reproducible Modelcar images: one uncompressed tar layer per model file, built as a stream.

KServe's Modelcar contract (KServe v0.15+): the image holds a non-empty ``/models``, has no
Entrypoint/Cmd, sets ``PATH`` and can run ``sh -c "ln -sf /proc/$$/root/models /mnt/models && sleep infinity"``
and ``[ -d /models ] && [ "$(ls -A /models)" ]``. The default base layer is Debian's static busybox with
the links those two commands need.

Every layer is a plain tar (``application/vnd.oci.image.layer.v1.tar``) whose entries have mtime 0,
uid/gid 0, empty owner names and normalised modes (0644 files, 0755 directories and executables), and
which lists the file's parent directories first. The same file at the same image path therefore always
gives the same layer digest, and an unchanged file reuses its blob in the registry. Layers are never
materialised: ``Layer.chunks()`` yields the tar stream (headers from memory, file content read in 1 MiB
blocks), so peak memory stays flat whatever the model size. A stat cache maps
(path, size, mtime_ns, ctime_ns, inode) to the layer digest so an unchanged rerun reads no file.

Plain Python, stdlib only; no Ansible imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
import tarfile
import tempfile

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

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

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUSYBOX_LINKS = ("sh", "ln", "sleep", "mkdir", "ls", "[", "[[", "test", "echo", "cat", "true", "false", "env", "readlink")
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox", "/usr/lib/initramfs-tools/bin/busybox")
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "alauda-spec-decoding", "modelcar")

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


def canonical_json(obj):
    """Bytes of ``obj`` as sorted, compact JSON: the same input always gives the same digest."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def host_architecture():
    return _ARCH.get(platform.machine().lower(), platform.machine().lower())


# --------------------------------------------------------------------------------------------------
# tar entries
# --------------------------------------------------------------------------------------------------
def _tar_header(name, kind, size=0, mode=0o644, linkname=""):
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


def _padding(size):
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
        self.header = _tar_header(tar_name, kind, self.size, self.mode, linkname)

    @property
    def tar_size(self):
        if self.kind != "file":
            return len(self.header)
        return len(self.header) + self.size + _padding(self.size)

    def cache_part(self):
        if self.kind == "file" and self.data is None:
            return [self.name, self.mode] + list(self.stat_key)
        if self.kind == "file":
            return [self.name, self.mode, hashlib.sha256(self.data).hexdigest()]
        return [self.name, self.kind, self.mode, self.linkname]


def _parent_dirs(name, seen):
    parts = name.strip("/").split("/")[:-1]
    out = []
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in seen:
            seen.add(d)
            out.append(Entry(d, "dir"))
    return out


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
            pad = _padding(entry.size)
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


# --------------------------------------------------------------------------------------------------
# collecting model files
# --------------------------------------------------------------------------------------------------
def _inside(path, root):
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def collect_files(model_dir, prefix, field, follow_external_symlinks=False):
    """List ``(image_path, real_path, stat)`` for every regular file under ``model_dir``.

    Symlinks are followed only while they stay inside ``model_dir``; one pointing outside is refused
    (or, with ``follow_external_symlinks``, its target's content is copied in). Special files are refused.
    """
    if not model_dir:
        raise ValidationError("is empty", field=field, hint="give the directory holding the model files")
    root_given = os.path.abspath(os.path.expanduser(model_dir))
    if not os.path.exists(root_given):
        raise ValidationError("%s does not exist" % root_given, field=field, hint="give an existing model directory")
    if not os.path.isdir(root_given):
        raise ValidationError("%s is not a directory" % root_given, field=field, hint="give the directory, not a file")
    root = os.path.realpath(root_given)
    files = []
    visited_dirs = set()

    def walk(real_dir, rel_dir):
        st = os.stat(real_dir)
        key = (st.st_dev, st.st_ino)
        if key in visited_dirs:
            raise ValidationError("%s: symlink loop" % os.path.join(root_given, rel_dir), field=field,
                                  hint="remove the looping symlink")
        visited_dirs.add(key)
        try:
            names = sorted(os.listdir(real_dir))
        except OSError as exc:
            raise ValidationError("cannot read %s: %s" % (real_dir, exc.strerror), field=field,
                                  hint="make the directory readable by the user running the module") from exc
        for name in names:
            path = os.path.join(real_dir, name)
            rel = os.path.join(rel_dir, name) if rel_dir else name
            shown = os.path.join(root_given, rel)
            if os.path.islink(path):
                target = os.path.realpath(path)
                if not os.path.exists(target):
                    raise ValidationError("%s is a dangling symlink" % shown, field=field,
                                          hint="remove it or fix its target")
                if not _inside(target, root) and not follow_external_symlinks:
                    raise ValidationError(
                        "%s is a symlink to %s, outside the model directory %s" % (shown, target, root_given), field=field,
                        hint="copy the file into the model directory (e.g. a Hugging Face snapshot: download with --local-dir), "
                             "or set follow_external_symlinks=true to copy the target's content")
                path = target
            st = os.stat(path)
            if stat.S_ISDIR(st.st_mode):
                walk(path, rel)
            elif stat.S_ISREG(st.st_mode):
                files.append((prefix + "/" + rel.replace(os.sep, "/"), path, st))
            else:
                raise ValidationError("%s is not a regular file or directory" % shown, field=field,
                                      hint="remove sockets, devices and FIFOs from the model directory")
        visited_dirs.discard(key)

    walk(root, "")
    if not files:
        raise ValidationError("%s holds no files" % root_given, field=field,
                              hint="KServe's Modelcar init check needs a non-empty /models; point it at the downloaded model")
    return files


def _stat_key(real_path, st):
    return [real_path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _file_entry(image_path, real_path, st, mode=None):
    if mode is None:
        mode = 0o755 if st.st_mode & 0o111 else 0o644
    return Entry(image_path, "file", src=real_path, size=st.st_size, mode=mode, stat_key=_stat_key(real_path, st))


def model_layers(files, max_layers=100):
    """One layer per file; if there are more than ``max_layers`` files, the smallest share one layer."""
    if max_layers < 2:
        raise ValidationError("must be at least 2", field="max_layers", hint="use the default (100)")
    files = sorted(files, key=lambda f: f[0])
    groups = [[f] for f in files]
    if len(files) > max_layers:
        by_size = sorted(files, key=lambda f: (f[2].st_size, f[0]))
        small = set(f[0] for f in by_size[:len(files) - max_layers + 1])
        groups = [[f] for f in files if f[0] not in small] + [[f for f in files if f[0] in small]]
    layers = []
    for group in groups:
        seen = set()
        entries = []
        for image_path, real_path, st in group:
            entries.extend(_parent_dirs(image_path, seen))
            entries.append(_file_entry(image_path, real_path, st))
        if len(group) == 1:
            ann = {ANN_TITLE: group[0][0]}
        else:
            ann = {ANN_TITLE: "%s (%d small files)" % (os.path.commonpath([g[0] for g in group]) or "/", len(group)),
                   ANN_FILES: ",".join(g[0] for g in group)}
        layers.append(TarLayer(entries, ann))
    return layers


def find_busybox(path=None):
    candidates = [path] if path else list(BUSYBOX_CANDIDATES)
    for cand in candidates:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.realpath(cand)
    raise ValidationError(
        "no static busybox found (looked at %s)" % ", ".join(c for c in candidates if c), field="base",
        hint="install Debian's busybox-static (apt-get install busybox-static) or give base as an OCI layout")


def busybox_layer(busybox_path=None):
    """The default base: ``bin/busybox`` with the links KServe's commands use, plus /mnt, /proc, /tmp."""
    real = find_busybox(busybox_path)
    st = os.stat(real)
    entries = [Entry("bin", "dir"), _file_entry("bin/busybox", real, st, mode=0o755)]
    for link in BUSYBOX_LINKS:
        entries.append(Entry("bin/" + link, "symlink", linkname="busybox"))
    entries += [Entry("mnt", "dir"), Entry("proc", "dir"), Entry("tmp", "dir", mode=0o1777), Entry("models", "dir")]
    return TarLayer(entries, {ANN_TITLE: "busybox-static (bin/busybox, GPL-2.0)", ANN_ROLE: "base"})


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
# the image plan
# --------------------------------------------------------------------------------------------------
class ImagePlan:
    """Base layers + model layers + the config and manifest built from them once digests are known."""

    def __init__(self, base_layers, model_layers_, base_config=None, labels=None, annotations=None, architecture=None):
        self.base_layers = base_layers
        self.model_layers = model_layers_
        self.layers = list(base_layers) + list(model_layers_)
        self.base_config = base_config or {}
        self.labels = dict(labels or {})
        self.annotations = dict(annotations or {})
        self.architecture = architecture or self.base_config.get("architecture") or host_architecture()
        self.warnings = []
        self._config = None
        self._manifest = None

    @property
    def total_size(self):
        return sum(layer.size for layer in self.layers)

    def config_source(self):
        if self._config is None:
            base = self.base_config
            cfg = dict(base.get("config") or {})
            for key in ("Entrypoint", "Cmd"):
                if cfg.pop(key, None):
                    self.warnings.append("removed %s from the base image config: KServe's Modelcar sidecar runs its own "
                                         "`sh -c` command, which an Entrypoint would swallow" % key)
            env = [e for e in (cfg.get("Env") or []) if not e.startswith("PATH=")]
            path = [e for e in (cfg.get("Env") or []) if e.startswith("PATH=")]
            cfg["Env"] = (path or ["PATH=" + DEFAULT_PATH]) + env
            labels = dict(cfg.get("Labels") or {})
            labels.update(self.labels)
            if labels:
                cfg["Labels"] = labels
            else:
                cfg.pop("Labels", None)
            cfg.setdefault("WorkingDir", "/")
            history = list(base.get("history") or [])
            if not self.base_config:
                history.append({"created": "1970-01-01T00:00:00Z", "created_by": "busybox-static base layer (KServe Modelcar commands)"})
            for layer in self.model_layers:
                history.append({"created": "1970-01-01T00:00:00Z", "created_by": "alauda.spec_decoding.modelcar_image: %s" % layer.title()})
            config = {
                "architecture": self.architecture,
                "os": base.get("os", "linux"),
                "config": cfg,
                "rootfs": {"type": "layers", "diff_ids": list((base.get("rootfs") or {}).get("diff_ids") or [])
                           + [layer.digest for layer in self.model_layers]},
                "history": history,
            }
            if base.get("variant"):
                config["variant"] = base["variant"]
            if not self.base_config:
                config["rootfs"]["diff_ids"] = [layer.digest for layer in self.layers]
            self._config = BytesSource(canonical_json(config), MT_CONFIG)
        return self._config

    def manifest_bytes(self):
        if self._manifest is None:
            manifest = {
                "schemaVersion": 2,
                "mediaType": MT_MANIFEST,
                "config": self.config_source().descriptor(),
                "layers": [layer.descriptor() for layer in self.layers],
            }
            if self.annotations:
                manifest["annotations"] = dict(self.annotations)
            self._manifest = canonical_json(manifest)
        return self._manifest

    def manifest_digest(self):
        return sha256_digest(self.manifest_bytes())


def build_plan(target_dir, draft_dir=None, layout=None, base=None, labels=None, annotations=None,
               max_layers=100, follow_external_symlinks=False, busybox_path=None):
    """Collect the model files and describe the image (no file content is read here)."""
    layout = dict(layout or {})
    root = (layout.get("root") or "models").strip("/")
    target_name = (layout.get("target") or "target").strip("/")
    draft_name = (layout.get("draft") or "draft").strip("/")
    if root != "models":
        raise ValidationError("must be 'models'", field="layout.root",
                              hint="KServe's Modelcar sidecar links /proc/PID/root/models, so the files must live under /models")
    for key, name in (("target", target_name), ("draft", draft_name)):
        if not name or ".." in name.split("/") or name.startswith("."):
            raise ValidationError("%r is not a usable directory name" % name, field="layout." + key,
                                  hint="use a plain relative name such as 'target' or 'draft'")
    if draft_dir and target_name == draft_name:
        raise ValidationError("target and draft both map to /models/%s" % target_name, field="layout",
                              hint="give them different names (default target and draft)")
    files = collect_files(target_dir, root + "/" + target_name, "target_dir", follow_external_symlinks)
    if draft_dir:
        files += collect_files(draft_dir, root + "/" + draft_name, "draft_dir", follow_external_symlinks)
    base_config = None
    base_kind = (base or "busybox")
    if base_kind == "busybox":
        base_layers = [busybox_layer(busybox_path)]
        max_model = max_layers - 1
    else:
        path, tag = split_layout_ref(base_kind)
        reader = LayoutReader(path, "base")
        _mb, manifest, base_config, _ref = reader.image(tag)
        base_layers = [reader.blob(d) for d in manifest.get("layers", [])]
        max_model = max(2, max_layers - len(base_layers))
    return ImagePlan(base_layers, model_layers(files, max_model), base_config, labels, annotations)


def plan_from_layout(path, field="from_archive"):
    """An ``ImagePlan``-like object for an existing layout / archive: all digests known, nothing built."""
    path, tag = split_layout_ref(path)
    reader = LayoutReader(path, field)
    manifest_bytes, manifest, _config, ref = reader.image(tag)
    return ArchivePlan(reader, manifest_bytes, manifest, ref)


class ArchivePlan:
    def __init__(self, reader, manifest_bytes, manifest, ref):
        self.reader = reader
        self._manifest = manifest_bytes
        self.manifest = manifest
        self.ref = ref
        self.layers = [reader.blob(d) for d in manifest.get("layers", [])]
        self.model_layers = self.layers
        self._config = reader.blob(manifest["config"])
        self.warnings = []
        self.media_type = manifest.get("mediaType") or MT_MANIFEST

    @property
    def total_size(self):
        return sum(layer.size for layer in self.layers)

    def config_source(self):
        return self._config

    def manifest_bytes(self):
        return self._manifest

    def manifest_digest(self):
        return sha256_digest(self._manifest)


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
        with open(path + ".tmp", "wb") as fh:
            fh.write(data)
        os.replace(path + ".tmp", path)
        written += len(data)
    return written


def _archive_header(name, size, kind="file"):
    return _tar_header(name, kind, size, 0o755 if kind == "dir" else 0o644)


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
                fh.write(bytes(_padding(len(data))))
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
                fh.write(bytes(_padding(src.size)))
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


__all__ = [
    "BytesSource", "DigestCache", "Entry", "FileBlobSource", "ImagePlan", "LayoutReader", "TarLayer",
    "build_plan", "busybox_layer", "canonical_json", "collect_files", "model_layers", "plan_from_layout",
    "resolve_digests", "sha256_digest", "write_archive", "write_layout_dir", "write_oci_archive",
]
