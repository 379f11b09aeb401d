# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Removing a staged subdirectory (the rollback role's draft-remover Job: ``artifact_sync.pyz remove --config plan.json``).

Separate from the copy engine; it shares the manifest and journal formats, so no manifest claims a removed directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from .cli import failed_item
from .common import (INTERNAL_NAMES, JOURNAL_NAME, MANIFEST_NAME, MANIFEST_SCHEMA, RESULT_KEY, TMP_DIR, SpecDecodingError, ValidationError,
                     atomic_write_json, emit, fsync_dir, human_bytes, read_json, read_manifest, tree_digest)


def _remove_relpath(path, field):
    """A clean relative path below the root: no absolute path, no '..', '.', empty or internal names."""
    if not isinstance(path, str) or not path.strip("/").strip():
        raise ValidationError("is empty (that would be the whole volume)", field=field, hint="give the draft's subdirectory, e.g. draft")
    if path.startswith("/") or "\\" in path or "\0" in path:
        raise ValidationError("%r is not a relative path inside the volume" % path, field=field, hint="give a path such as draft")
    parts = path.rstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValidationError("%r leaves the volume or is not normalised ('..', '.', '//')" % path, field=field,
                              hint="give a plain path such as draft or models/draft")
    if any(p in INTERNAL_NAMES for p in parts):
        raise ValidationError("%r names the sync engine's own files" % path, field=field)
    return "/".join(parts)


def _drop_from_record(path, rel_prefix, fsync=True):
    """Drop the entries under ``rel_prefix`` from the manifest or journal at ``path``; True when it changed."""
    data = read_json(path)
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA or not isinstance(data.get("files"), dict):
        return False
    files = data["files"]
    keep = {p: e for p, e in files.items() if not (p == rel_prefix or p.startswith(rel_prefix + "/"))}
    if len(keep) == len(files):
        return False
    data["files"] = keep
    if os.path.basename(path) == MANIFEST_NAME:
        data["tree_sha256"] = tree_digest(keep)
        data["total_bytes"] = sum(int(e.get("size") or 0) for e in keep.values())
        data["file_count"] = len(keep)
    atomic_write_json(path, data, fsync=fsync)
    return True


def remove_staged(root, subdir, keep=(), name=None, fsync=True, log=None):
    """Remove ``root/subdir`` (a staged model directory) so that no manifest claims it any more.

    Order: the subdirectory's own manifest goes first (fsynced), then its journal and files; manifests and
    journals of enclosing directories (a tree staged as one item) lose the entries below it. Refuses paths
    outside ``root``, symlinked components, a directory holding (or equal to) one of ``keep`` (what the
    serving command still uses), and, with ``name``, a directory whose manifest names another model.
    Idempotent: an absent directory is reported with ``removed: false``.
    """
    rel = _remove_relpath(subdir, "subdir")
    root_real = os.path.realpath(root)
    if not os.path.isdir(root_real):
        raise ValidationError("%s is not a directory (is the volume mounted?)" % root, field="root")
    for kept in keep or ():
        kept_rel = _remove_relpath(kept, "keep")
        if kept_rel == rel or kept_rel.startswith(rel + "/"):
            raise ValidationError("%s holds %s, which the serving command still uses" % (rel, kept_rel), field="subdir",
                                  hint="remove only the draft's own directory")
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        if os.path.islink(os.path.join(root_real, *parts[:i])):
            raise ValidationError("%s is a symlink; refusing to follow it out of the draft's directory" % "/".join(parts[:i]),
                                  field="subdir", hint="remove the link by hand after checking where it points")
    dest = os.path.join(root_real, *parts)
    if not os.path.realpath(dest).startswith(root_real.rstrip(os.sep) + os.sep):
        raise ValidationError("%s resolves outside %s" % (rel, root), field="subdir")
    result = {"ok": True, "dest": dest, "subdir": rel, "removed": False, "files": 0, "bytes": 0, "records_updated": []}
    if os.path.lexists(dest) and not os.path.isdir(dest):
        raise ValidationError("%s is not a directory" % dest, field="subdir", hint="remove it by hand if it is the draft")
    if os.path.isdir(dest):
        manifest = read_manifest(dest)
        if name and manifest is not None and manifest.get("name") and manifest.get("name") != name:
            raise ValidationError("%s holds %r, not the draft %r" % (dest, manifest.get("name"), name), field="subdir",
                                  hint="check which model the directory holds before removing it")
        result["name"] = (manifest or {}).get("name")
        for dirpath, _dirs, filenames in os.walk(dest):
            for fname in filenames:
                if fname.startswith((MANIFEST_NAME, JOURNAL_NAME)) or TMP_DIR in dirpath:
                    continue
                try:
                    result["bytes"] += os.lstat(os.path.join(dirpath, fname)).st_size
                except OSError:
                    pass
                result["files"] += 1
        for internal in (MANIFEST_NAME, JOURNAL_NAME):
            path = os.path.join(dest, internal)
            if os.path.lexists(path):
                os.unlink(path)
                if fsync:
                    fsync_dir(dest)
        shutil.rmtree(dest)
        if fsync:
            fsync_dir(os.path.dirname(dest))
        result["removed"] = True
    for i in range(len(parts)):
        ancestor = os.path.join(root_real, *parts[:i]) if i else root_real
        prefix = "/".join(parts[i:])
        for record in (MANIFEST_NAME, JOURNAL_NAME):
            path = os.path.join(ancestor, record)
            if os.path.isfile(path) and _drop_from_record(path, prefix, fsync=fsync):
                result["records_updated"].append(path)
    if log is not None:
        emit(log, "[artifact-sync] %s: %s, %d file(s) %s; %d manifest/journal record(s) updated" % (
            dest, "removed" if result["removed"] else "already absent", result["files"], human_bytes(result["bytes"]),
            len(result["records_updated"])))
    return result


def remove_subdir_main(argv=None):
    """CLI of the remover: ``--config plan.json`` ({root, remove: [{subdir, name, keep}]}) or ``--root/--subdir``."""
    parser = argparse.ArgumentParser(prog="artifact_sync.pyz remove", description="Remove staged subdirectories of a volume.")
    parser.add_argument("--config", help="JSON file with {'root': DIR, 'remove': [{'subdir': ..., 'name': ..., 'keep': [...]}]}")
    parser.add_argument("--root", help="the volume's mount point")
    parser.add_argument("--subdir", action="append", default=[], help="subdirectory to remove (repeatable)")
    parser.add_argument("--keep", action="append", default=[], help="subdirectory that must survive (repeatable)")
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    log = None if args.quiet else sys.stderr
    results = []
    code = 0
    root = args.root
    try:
        if args.config:
            data = read_json(args.config)
            if not isinstance(data, dict) or not isinstance(data.get("remove"), list) or not data["remove"]:
                raise ValidationError("%s is not a JSON object with a non-empty 'remove' list" % args.config, field="config")
            root = data.get("root") or root
            todo = [dict(item) for item in data["remove"] if isinstance(item, dict)]
        else:
            todo = [{"subdir": s, "keep": args.keep} for s in args.subdir]
        if not root or not todo:
            raise ValidationError("--root and --subdir are required (or --config)", field="root")
        for item in todo:
            results.append(remove_staged(root, item.get("subdir"), keep=item.get("keep") or (), name=item.get("name"),
                                         fsync=not args.no_fsync, log=log))
    except (SpecDecodingError, OSError) as exc:
        code, item = failed_item(exc)
        results.append(item)
    if code and log is not None:
        emit(log, "[artifact-sync] ERROR: %s" % results[-1]["error"])
    summary = {"ok": code == 0, "mode": "remove", "items": results}
    if root and os.path.isdir(root):
        summary["layout"] = sorted(n for n in os.listdir(root) if not n.startswith("."))
    emit(sys.stdout, json.dumps({RESULT_KEY: summary}, sort_keys=True))
    return code
