"""The stager as its Job runs it: the zip application built from the collection's artifacts/artifact_sync package
(what the stage_pvc and rollback roles ship), written once per test process."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync import bundle


@functools.lru_cache(maxsize=None)
def zipapp_path():
    """The path of ``artifact_sync.pyz`` (removed when the process exits)."""
    directory = tempfile.mkdtemp(prefix="alauda-stager-")
    atexit.register(shutil.rmtree, directory, True)
    path = os.path.join(directory, bundle.NAME)
    with open(path, "wb") as handle:
        handle.write(bundle.zipapp())
    return path


def command(*args):
    """``[python, artifact_sync.pyz, *args]``: the stager's command line with this interpreter."""
    return [sys.executable, zipapp_path(), *args]
