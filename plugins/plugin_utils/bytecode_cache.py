# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Compiled bytecode of collection files, kept in ``__pycache__`` as CPython keeps it for any other import.

Why: ansible-core's collection loader compiles every collection file it imports from source, in every process, and
never writes or reads a ``.pyc`` (ansible-core 2.19, ansible/utils/collection_loader/_collection_finder.py,
``_AnsibleCollectionPkgLoaderBase.get_code``: ``compile(source=...)``). A no-op redeploy imports about 150 of them in
ansible-playbook (the deploy's cluster modules, every filter of the collection, kubernetes.core's client): 0.2 CPU s of
compiling, a seventh of the whole run, where unmarshalling the same code objects takes 0.01 s (issue 46, P4).
`install` wraps that ``get_code``: the code object of a file that has a ``.pyc`` written for the same source
(modification time and size in its header, as ``importlib``'s timestamp-based pycs, PEP 552) is read from it; any
other is compiled as before and its ``.pyc`` written when the tree is writable. The code objects are the ones the
compiler gives, so what runs does not change; a file the cache cannot serve (a read-only tree, a synthetic package,
``sys.dont_write_bytecode``, an interpreter without the loader's internals) is compiled from source as before.
"""

from __future__ import annotations

import _imp
import importlib.util
import marshal
import os
import sys

_INSTALLED = []
_fix_co_filename = getattr(_imp, "_fix_co_filename", lambda code, path: None)
# PEP 552 header: magic number, flags (0: timestamp-based), source mtime and source size (both modulo 2**32)
_HEADER = 16


def _stamp(stat):
    return (int(stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little")


def cached_code(path, compile_source):
    """The code object of the file at `path`: from its ``__pycache__`` ``.pyc`` when that was written for this source,
    else ``compile_source()`` (written there for the next process when it can be)."""
    try:
        stat = os.stat(path)
        pyc = importlib.util.cache_from_source(path)
    except (OSError, ValueError, NotImplementedError):
        return compile_source()
    header = importlib.util.MAGIC_NUMBER + b"\0\0\0\0" + _stamp(stat)
    try:
        with open(pyc, "rb") as handle:
            data = handle.read()
        if data[:_HEADER] == header:
            code = marshal.loads(data[_HEADER:])
            # the same file reached by another path (the collection through a symlink): tracebacks name this path, as
            # importlib's SourceFileLoader does for a pyc (importlib/_bootstrap_external.py, _compile_bytecode)
            _fix_co_filename(code, path)
            return code
    except (OSError, ValueError, EOFError, TypeError):
        pass
    code = compile_source()
    if code is not None and not sys.dont_write_bytecode:
        _write(pyc, header + marshal.dumps(code))
    return code


def _write(pyc, data):
    """Write-then-rename, so that a process reading the ``.pyc`` meanwhile sees the old one or the whole new one."""
    partial = "%s.%d.tmp" % (pyc, os.getpid())
    try:
        os.makedirs(os.path.dirname(pyc), exist_ok=True)
        with open(partial, "wb") as handle:
            handle.write(data)
        os.replace(partial, pyc)
    except OSError:  # a read-only tree: compile from source each time, as without the cache
        try:
            os.unlink(partial)
        except OSError:
            pass


def install():
    """Serve ansible-core's collection loader's ``get_code`` from the bytecode cache in this process (once)."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    try:
        # pylint: disable-next=import-outside-toplevel
        from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionPkgLoaderBase
    except ImportError:
        return
    compile_from_source = getattr(_AnsibleCollectionPkgLoaderBase, "get_code", None)
    if compile_from_source is None:
        return

    def get_code(self, fullname):
        # _source_code_path: the loader's file of `fullname` (None for a package without __init__.py); the attributes are
        # the loader's own, read with getattr so that another ansible-core compiles from source as before
        path = getattr(self, "_source_code_path", None)
        if getattr(self, "_compiled_code", None) or not path or not str(path).endswith(".py"):
            return compile_from_source(self, fullname)
        code = cached_code(path, lambda: compile_from_source(self, fullname))
        self._compiled_code = code
        return code

    _AnsibleCollectionPkgLoaderBase.get_code = get_code
