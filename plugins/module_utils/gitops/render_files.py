# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files of a GitOps render written into their directory at once (the gitops_files module): the manifests the roles
rendered (the InferenceService, its alert rules, the routes, the schedule's CronJob and RBAC, the canary's steps, the
credentials' ServiceAccount) and a kustomization.yaml that lists them.

Why one call: the roles wrote each file with its own ``ansible.builtin.copy`` task (a stat module and a copy module
process per file, about 0.5 s each) and listed the directory with ``find`` (one more) before writing the
kustomization; a deploy's GitOps default paid four module processes for two files.

What stays as ``copy`` did it: each file is written whole beside its path and renamed over it (artifacts/files.py), with
permission bits 0644; a file whose bytes and mode are already those is not touched (``changed`` only when a byte or the
mode changed); check mode writes nothing and says what would change; the diff is one entry per changed file, as copy's.
The kustomization is kserve/isvc/render.kustomization's (the ``alauda.spec_decoding.kustomization`` filter's), over
either every manifest of the directory (``*.yaml`` but kustomization.yaml and hidden files, as the roles' ``find`` listed
them) and the files written, or only the files written and ``resources``.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import os
import stat

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files as whole_files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc_render

FILE_MODE = 0o644
DIR_MODE = 0o755
KUSTOMIZATION = "kustomization.yaml"
# how the kustomization's resources are found: every manifest of the directory, only the files written (and
# `resources`), or no kustomization.yaml at all
KUSTOMIZATION_MODES = ("directory", "files", "none")
HIDDEN = "(content hidden: %s may carry a secret)"


def _file_name(name, field):
    name = str(name or "")
    if not name or "/" in name or name in (".", "..") or name.startswith("."):
        raise ValidationError("%r is not a file name of the GitOps directory" % name, field=field,
                              hint="give a plain file name such as models-llama.yaml (no directory, not hidden)")
    return name


def _checked(params):
    """The files to write as (name, bytes, secret), in order; refuses a bad or repeated name."""
    files, seen = [], set()
    with_kustomization = params.get("kustomization", "directory") != "none"
    for i, entry in enumerate(params.get("files") or []):
        name = _file_name(entry.get("name"), "files[%d].name" % i)
        if name in seen:
            raise ValidationError("%s is given twice" % name, field="files[%d].name" % i,
                                  hint="give each file once; the later content would overwrite the earlier")
        if with_kustomization and name == KUSTOMIZATION:
            raise ValidationError("kustomization.yaml is written by the module", field="files[%d].name" % i,
                                  hint="leave it out of files, or set kustomization: none to write your own")
        seen.add(name)
        content = entry.get("content")
        files.append((name, (content or "").encode("utf-8"), bool(entry.get("secret"))))
    for i, name in enumerate(params.get("resources") or []):
        _file_name(name, "resources[%d]" % i)
    return files


def directory_manifests(path):
    """The manifests the directory holds now: regular, not hidden ``*.yaml`` files but kustomization.yaml (what the
    roles' ``ansible.builtin.find`` with ``patterns: "*.yaml"`` and ``excludes: kustomization.yaml`` listed)."""
    if not os.path.isdir(path):
        return []
    return sorted(entry.name for entry in os.scandir(path)
                  if entry.name.endswith(".yaml") and not entry.name.startswith(".") and entry.name != KUSTOMIZATION
                  and entry.is_file())


def kustomization_resources(path, names, mode, resources=()):
    """What kustomization.yaml lists: None for mode ``none``."""
    if mode == "none":
        return None
    listed = list(names) + list(resources or [])
    if mode == "directory":
        listed = directory_manifests(path) + listed
    return sorted(set(listed))


def _current(dest):
    """(bytes, permission bits) of the file now, (None, None) when there is none."""
    try:
        with open(dest, "rb") as handle:
            return handle.read(), stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
    except FileNotFoundError:
        return None, None


def _diff_entry(dest, before, after, secret, name):
    if secret:
        hidden = HIDDEN % name
        return {"before_header": dest, "after_header": dest, "before": "" if before is None else hidden + "\n", "after": hidden + "\n"}
    return {"before_header": dest, "after_header": dest, "before": (before or b"").decode("utf-8", "replace"),
            "after": after.decode("utf-8", "replace")}


def write(params, check_mode=False, diff=False):
    """Write ``params['files']`` (and kustomization.yaml) into ``params['path']``; the module's result."""
    path = params["path"]
    if not path:
        raise ValidationError("path is empty", field="path", hint="name the GitOps directory the files go into")
    files = _checked(params)
    mode = params.get("kustomization") or "directory"
    if mode not in KUSTOMIZATION_MODES:
        raise ValidationError("kustomization is %r" % mode, field="kustomization", hint="use one of %s" % ", ".join(KUSTOMIZATION_MODES))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValidationError("%s exists and is not a directory" % path, field="path",
                              hint="point it at a directory (created when missing), or remove the file")
    resources = kustomization_resources(path, [name for name, _c, _s in files], mode, params.get("resources"))
    if resources is not None:
        files.append((KUSTOMIZATION, isvc_render.kustomization(resources).encode("utf-8"), False))

    created = not os.path.isdir(path)
    if created and not check_mode:
        os.makedirs(path, exist_ok=True)
        os.chmod(path, DIR_MODE)  # the mode as `file: state=directory mode=0755` set it, whatever the umask
    out, diffs = [], []
    for name, content, secret in files:
        dest = os.path.join(path, name)
        before, bits = _current(dest)
        changed = before != content or bits != FILE_MODE
        if changed and not check_mode:
            if before == content:
                os.chmod(dest, FILE_MODE)
            else:
                whole_files.write_whole(dest, content, mode=FILE_MODE)
        out.append({"name": name, "path": dest, "changed": changed})
        if changed and diff and before != content:
            diffs.append(_diff_entry(dest, before, content, secret, name))
    result = {"changed": created or any(f["changed"] for f in out), "path": path, "files": out,
              "written": [f["name"] for f in out if f["changed"]], "resources": resources}
    if diff:
        result["diff"] = diffs
    return result
