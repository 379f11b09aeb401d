# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reproducible Modelcar images: one uncompressed tar layer per model file, built as a stream.

KServe's Modelcar contract (KServe v0.15+): the image holds a non-empty ``/models``, has no
Entrypoint/Cmd, sets ``PATH`` and can run ``sh -c "ln -sf /proc/$$/root/models /mnt/models && sleep infinity"``
and ``[ -d /models ] && [ "$(ls -A /models)" ]``. The default base layer is Debian's static busybox with
the links those two commands need.

The model files are collected here (symlinks followed only inside the model directory), one layer per file
(the smallest share one past ``max_layers``), and the image config and manifest are built once the digests are
known. The layers themselves, their digests and the digest cache are artifacts.oci_blobs; reading a base image
and writing the image as an OCI layout or oci-archive is artifacts.oci_layout.

Plain Python, stdlib only; no Ansible imports.
"""

from __future__ import annotations

import os
import platform
import stat

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.oci_blobs import (
    ANN_FILES, ANN_ROLE, ANN_TITLE, MT_CONFIG, MT_MANIFEST, BytesSource, Entry, TarLayer, canonical_json, sha256_digest,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.oci_layout import LayoutReader, split_layout_ref

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUSYBOX_LINKS = ("sh", "ln", "sleep", "mkdir", "ls", "[", "[[", "test", "echo", "cat", "true", "false", "env", "readlink")
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox", "/usr/lib/initramfs-tools/bin/busybox")

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


def host_architecture():
    return _ARCH.get(platform.machine().lower(), platform.machine().lower())


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


def _parent_dirs(name, seen):
    parts = name.strip("/").split("/")[:-1]
    out = []
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in seen:
            seen.add(d)
            out.append(Entry(d, "dir"))
    return out


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
