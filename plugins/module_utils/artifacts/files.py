# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A file the collection writes whole (a report, a run's records, a backup, an archive, an OCI layout's index): written
beside its final path and renamed over it, so a reader (or a rerun after a kill) finds the old file or the new one,
never half of one. The one write-then-rename of module_utils; in the artifacts district, the lowest that every writer
(artifacts, bench, ops) stands on.

Not here: the stager Job's own (artifacts/artifact_sync/common.atomic_write_json, with an fsync: that package runs as a
zip application outside the collection and imports only itself and errors.py), and the streamed writes that check a
digest before the rename (oci_layout's blobs, the stager's ``.part`` files that a rerun resumes).

Plain Python, standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os


@contextlib.contextmanager
def replacing(path, mode=None, make_parent=False):
    """The temporary path to write ``path``'s new content to: when the block ends it replaces ``path`` in one rename
    (with permission bits ``mode`` when given); when the block raises, it is removed and ``path`` stays as it was.
    ``make_parent``: create the missing directories above ``path`` first."""
    if make_parent:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())  # the pid: two processes writing one path do not share a temporary file
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_whole(path, data, mode=None, make_parent=False):
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` through ``replacing``; returns ``path``. With ``mode`` the
    temporary file has those permission bits from its creation (a backup of 0o600 is never readable by others)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with replacing(path, mode=mode, make_parent=make_parent) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
    return path


# The user's own cache folder: the Modelcar layer digests (artifacts/oci_blobs.DEFAULT_CACHE_DIR), the KServe release
# verdicts (kserve/facts.RELEASE_CACHE) and the inventory check's catalog (ops/inventory_variables.CATALOG_CACHE).
CACHE_DIR = os.path.join("~", ".cache", "alauda-spec-decoding")


def read_private_json(path):
    """The JSON object kept at ``path`` by ``write_private_json``; {} when there is none, it is not JSON, or the file is not
    the user's own with mode 0600 (another user could have put it there: a cache is trusted only when it is ours)."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as handle:
            info = os.fstat(handle.fileno())
            if info.st_uid != os.getuid() or info.st_mode & 0o077:
                return {}
            kept = json.load(handle)
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def write_private_json(path, data):
    """Keep ``data`` (a JSON object) at ``path``, mode 0600, its folder made. Best effort: a cache that cannot be written
    (a read-only home) costs its reader the work next time, nothing else; returns whether it was written."""
    try:
        write_whole(os.path.expanduser(path), json.dumps(data), mode=0o600, make_parent=True)
    except (OSError, TypeError, ValueError):
        return False
    return True
