# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``check_dest``: a staged directory against its manifest (every file there, sizes, and the hashes again)."""

from __future__ import annotations

import os

from .common import MANIFEST_NAME, SyncError, read_manifest
from .sources import LocalSource
from .syncer import Syncer


def check_dest(dest, name=None, rehash=True, workers=None):
    """Verify a staged directory against its manifest: every file present, sizes and (optionally) hashes."""
    manifest = read_manifest(dest)
    if manifest is None:
        raise SyncError("%s has no complete manifest (%s): the staging did not finish" % (dest, MANIFEST_NAME), field="dest",
                        hint="run the stager again; it resumes where it stopped")
    if name and manifest.get("name") != name:
        raise SyncError("%s holds %r, expected %r" % (dest, manifest.get("name"), name), field="dest")
    files = manifest["files"]
    problems = []
    for rel, rec in sorted(files.items()):
        try:
            st = os.stat(os.path.join(dest, rel))
        except OSError:
            problems.append("%s missing" % rel)
            continue
        if st.st_size != rec.get("size"):
            problems.append("%s has %d bytes, manifest says %d" % (rel, st.st_size, rec.get("size")))
    if not problems and rehash:
        syncer = Syncer(LocalSource(dest), dest, workers=workers)
        rels = sorted(files)
        for rel, sha in zip(rels, syncer._parallel(syncer.hash_file, rels)):  # pylint: disable=protected-access
            if sha != files[rel].get("sha256"):
                problems.append("%s sha256 %s, manifest says %s" % (rel, sha, files[rel].get("sha256")))
    if problems:
        raise SyncError("%s does not match its manifest: %s" % (dest, "; ".join(problems[:10])), field="dest",
                        hint="run the stager again; it recopies what differs")
    return {"ok": True, "dest": os.path.abspath(dest), "name": manifest.get("name"), "files": len(files),
            "bytes": manifest.get("total_bytes"), "tree_sha256": manifest.get("tree_sha256"), "rehashed": bool(rehash)}
