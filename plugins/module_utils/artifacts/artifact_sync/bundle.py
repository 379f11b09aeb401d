# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stager as the Job receives it: one zip application (``artifact_sync.pyz``) built from this package.

The zip holds the package and ``errors.py`` at their paths under ``module_utils/`` (the package's relative imports
then resolve as they do in the collection), empty ``__init__.py`` files for ``module_utils`` (a namespace package
in the collection) and a ``__main__.py`` that runs the package's own ``__main__``. This file is not in the zip:
only the controller builds it (the ``alauda.spec_decoding.stager_zipapp`` lookup, the tests).

The bytes depend only on the sources: fixed timestamps and modes, a fixed order, so rendering the ConfigMap again
gives the same ``binaryData`` and changes nothing on the cluster.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import io
import zipfile

NAME = "artifact_sync.pyz"
# The shipped modules, relative to module_utils, in import order. tests/unit/.../test_artifact_sync_bundle.py checks
# that every file of the package but this one is listed.
SHIPPED = ("errors", "artifacts", "artifacts.artifact_sync", "artifacts.artifact_sync.common", "artifacts.artifact_sync.sources",
           "artifacts.artifact_sync.reads", "artifacts.artifact_sync.syncer", "artifacts.artifact_sync.check",
           "artifacts.artifact_sync.serve", "artifacts.artifact_sync.cli", "artifacts.artifact_sync.remove",
           "artifacts.artifact_sync.__main__")
PACKAGES = ("artifacts", "artifacts.artifact_sync")
_MAIN = ('import runpy\n'
         'runpy.run_module("module_utils.artifacts.artifact_sync", run_name="__main__", alter_sys=True)\n')
# zip's earliest date (1980) is as good as any fixed one; the stager never reads it.
_DATE = (2020, 1, 1, 0, 0, 0)


def _entry(path):
    info = zipfile.ZipInfo(path, date_time=_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def _module_utils():
    """This collection's module_utils package name (``ansible_collections.<ns>.<name>.plugins.module_utils``, or
    ``module_utils`` when run from ``plugins/``)."""
    return __name__.rsplit(".", 3)[0]


def zipapp():
    """The zip application's bytes. Sources are read through each module's loader, so this works from a file tree
    and from Ansible's collection loader alike."""
    root = _module_utils()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compresslevel=9) as archive:
        archive.writestr(_entry("__main__.py"), _MAIN)
        archive.writestr(_entry("module_utils/__init__.py"), "")
        for rel in SHIPPED:
            name = "%s.%s" % (root, rel)
            module = importlib.import_module(name)
            path = "module_utils/" + rel.replace(".", "/") + ("/__init__.py" if rel in PACKAGES else ".py")
            archive.writestr(_entry(path), module.__spec__.loader.get_source(name))
    return buf.getvalue()


def zipapp_base64():
    """The zip application as a ConfigMap's ``binaryData`` value."""
    return base64.b64encode(zipapp()).decode("ascii")


def zipapp_sha256():
    """sha256 of the zip application's bytes (hex)."""
    return hashlib.sha256(zipapp()).hexdigest()
