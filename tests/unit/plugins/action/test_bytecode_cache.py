"""plugin_utils/bytecode_cache.py: a collection file's code object is compiled once and read from its .pyc afterwards, by
ansible-core's own collection loader; a changed source, a read-only tree and sys.dont_write_bytecode compile from source
as before."""
import importlib.util
import marshal
import os
import sys

from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionLoader  # pylint: disable=import-error

from ansible_collections.alauda.spec_decoding.plugins.plugin_utils import bytecode_cache


def _source(tmp_path, text="ANSWER = 41 + 1\n"):
    path = tmp_path / "thing.py"
    path.write_text(text)
    return str(path)


def _compiler(path, calls):
    def compile_source():
        calls.append(path)
        with open(path, "rb") as handle:
            return compile(handle.read(), path, "exec", dont_inherit=True)
    return compile_source


def _run(code):
    namespace = {}
    exec(code, namespace)  # pylint: disable=exec-used
    return namespace["ANSWER"]


def test_the_second_read_comes_from_the_pyc_without_compiling(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path, calls = _source(tmp_path), []
    first = bytecode_cache.cached_code(path, _compiler(path, calls))
    pyc = importlib.util.cache_from_source(path)
    assert calls == [path] and os.path.isfile(pyc) and _run(first) == 42
    # the header CPython's own timestamp-based pycs carry (PEP 552), so importlib and compileall agree with it
    with open(pyc, "rb") as handle:
        assert handle.read(8) == importlib.util.MAGIC_NUMBER + b"\0\0\0\0"
    second = bytecode_cache.cached_code(path, _compiler(path, calls))
    assert calls == [path] and _run(second) == 42 and second.co_filename == path


def test_a_pyc_read_through_another_path_names_that_path(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path, calls = _source(tmp_path), []
    bytecode_cache.cached_code(path, _compiler(path, calls))
    os.symlink(str(tmp_path), str(tmp_path / "link"))  # as .build/collections links the checkout
    other = str(tmp_path / "link" / "thing.py")
    code = bytecode_cache.cached_code(other, _compiler(other, calls))
    assert calls == [path] and code.co_filename == other


def test_a_changed_source_is_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path, calls = _source(tmp_path), []
    bytecode_cache.cached_code(path, _compiler(path, calls))
    _source(tmp_path, "ANSWER = 'changed'\n")  # another size (and mtime): the pyc is stale
    assert _run(bytecode_cache.cached_code(path, _compiler(path, calls))) == "changed" and len(calls) == 2
    assert _run(bytecode_cache.cached_code(path, _compiler(path, calls))) == "changed" and len(calls) == 2


def test_dont_write_bytecode_and_a_read_only_tree_compile_from_source(tmp_path, monkeypatch):
    path, calls = _source(tmp_path), []
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert _run(bytecode_cache.cached_code(path, _compiler(path, calls))) == 42
    assert not os.path.exists(os.path.dirname(importlib.util.cache_from_source(path)))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    # a tree where no __pycache__ can be made (a file of that name: unwritable even for root, unlike a chmod)
    (tmp_path / "__pycache__").write_text("")
    assert _run(bytecode_cache.cached_code(path, _compiler(path, calls))) == 42
    assert _run(bytecode_cache.cached_code(path, _compiler(path, calls))) == 42 and len(calls) == 3
    assert sorted(os.listdir(tmp_path)) == ["__pycache__", "thing.py"]  # no partial file left behind


def test_ansible_cores_collection_loader_reads_the_pyc_once_installed(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    (tmp_path / "bytecode_cache_probe.py").write_text("ANSWER = 41 + 1\n")
    bytecode_cache.install()
    name = "ansible_collections.alauda.spec_decoding.plugins.module_utils.bytecode_cache_probe"

    def load():
        # ansible-core's loader of one collection file, with the state its constructor leaves once it found the file (the
        # constructor itself needs the collection finder installed, which this process has not)
        loader = object.__new__(_AnsibleCollectionLoader)
        loader.__dict__.update(_fullname=name, _source_code_path=str(tmp_path / "bytecode_cache_probe.py"), _decoded_source=None,
                               _compiled_code=None, _subpackage_search_paths=None, _redirect_module=None)
        return loader.get_code(name)

    assert _run(load()) == 42
    pyc = importlib.util.cache_from_source(str(tmp_path / "bytecode_cache_probe.py"))
    assert os.path.isfile(pyc)
    # The pyc now holds other code under the same header: a loader that returns it has read the pyc, not the source.
    with open(pyc, "rb") as handle:
        header = handle.read(16)
    with open(pyc, "wb") as handle:
        handle.write(header + marshal.dumps(compile("ANSWER = 'from the pyc'\n", "x", "exec")))
    assert _run(load()) == "from the pyc"
