"""artifacts/files.py (a file written whole: beside its path, then renamed over it) and errors.optional_import (a
third-party library, or None and its ImportError): the two helpers every writer and every optional import use."""

import json
import os
import stat

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files as local_files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import optional_import
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import troubleshoot


def test_write_whole_writes_text_and_bytes_and_leaves_no_temporary_file(tmp_path):
    path = str(tmp_path / "report.json")
    assert local_files.write_whole(path, "{\"a\": \"\u00e9\"}\n") == path
    assert json.loads(open(path, encoding="utf-8").read()) == {"a": "\u00e9"}
    local_files.write_whole(path, b"\x00\x01")
    assert open(path, "rb").read() == b"\x00\x01"
    assert os.listdir(str(tmp_path)) == ["report.json"]


def test_write_whole_with_a_mode_and_missing_parents(tmp_path):
    path = str(tmp_path / "backups" / "models" / "llama.json")
    local_files.write_whole(path, "{}\n", mode=0o600, make_parent=True)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and open(path, encoding="utf-8").read() == "{}\n"
    with pytest.raises(FileNotFoundError):  # without make_parent a missing directory is the caller's error
        local_files.write_whole(str(tmp_path / "nowhere" / "x.json"), "{}")


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary_one(tmp_path):
    path = str(tmp_path / "sweep.json")
    local_files.write_whole(path, "old")
    with pytest.raises(RuntimeError, match="killed half-way"):
        with local_files.replacing(path) as tmp:
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write("half of the new")
            raise RuntimeError("killed half-way")
    assert open(path, encoding="utf-8").read() == "old" and os.listdir(str(tmp_path)) == ["sweep.json"]


def test_the_writers_write_through_it(tmp_path, monkeypatch):
    """The troubleshooting archive and the A/B report go through local_files (one write-then-rename)."""
    written = []
    real = local_files.replacing

    def recording(path, **kwargs):
        written.append(os.path.basename(path))
        return real(path, **kwargs)
    monkeypatch.setattr(local_files, "replacing", recording)
    names = troubleshoot.write_archive(str(tmp_path / "bundle.tar.gz"), {"summary.md": "# ok\n"}, root="bundle")
    bench_report._atomic_write(str(tmp_path / "ab.md"), "# A/B\n")  # pylint: disable=protected-access
    assert names == ["bundle/summary.md"] and written == ["bundle.tar.gz", "ab.md"]
    assert sorted(os.listdir(str(tmp_path))) == ["ab.md", "bundle.tar.gz"]


def test_optional_import_gives_the_module_or_the_import_error():
    module, error = optional_import("json")
    assert module is json and error is None
    module, error = optional_import("no_such_library_for_alauda_spec_decoding")
    assert module is None and isinstance(error, ImportError) and "no_such_library_for_alauda_spec_decoding" in str(error)
    assert troubleshoot.HAS_YAML is True and troubleshoot.yaml.safe_load("a: 1") == {"a": 1}


def test_a_private_json_cache_is_trusted_only_when_it_is_the_users_own_mode_0600(tmp_path):
    path = str(tmp_path / "cache" / "kept.json")
    assert local_files.read_private_json(path) == {}  # none yet
    assert local_files.write_private_json(path, {"a": [1, "b"]}) is True
    assert oct(os.stat(path).st_mode & 0o777) == "0o600" and local_files.read_private_json(path) == {"a": [1, "b"]}
    os.chmod(path, 0o644)  # readable (and so perhaps written) by others: not trusted
    assert local_files.read_private_json(path) == {}
    os.chmod(path, 0o600)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("[1, 2]")  # JSON, but not an object
    assert local_files.read_private_json(path) == {}
    # a cache that cannot be written (its folder is a file) is not an error, and nothing is left behind
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    assert local_files.write_private_json(str(blocker / "kept.json"), {"a": 1}) is False
    assert local_files.write_private_json(path, {"a": object()}) is False and local_files.read_private_json(path) == {}
    assert os.listdir(str(tmp_path / "cache")) == ["kept.json"] and sorted(os.listdir(str(tmp_path))) == ["cache", "not-a-folder"]
