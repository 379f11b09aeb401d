# -*- coding: utf-8 -*-
# Copyright: Alauda
# Apache License 2.0 (see LICENSE)
"""The artifact sync engine on real directories, a real subprocess, and real HTTP servers on loopback."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import artifact_sync as sync
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync import reads as sync_reads
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync import sources as sync_sources
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests import stager
from tests.digests import sha256_file

# The CLI runs as the Job runs it: the zip application built from the package.
SCRIPT = stager.zipapp_path()
MIB = 1 << 20


def tree(root):
    """{relpath: sha256} of the regular files under root, the engine's internal files excluded."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != sync.TMP_DIR]
        for name in filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if rel.startswith((sync.MANIFEST_NAME, sync.JOURNAL_NAME)):
                continue
            out[rel] = sha256_file(full)
    return out


def make_model(root, shard_mib=(3, 2, 1), seed=1):
    """A model-like directory: safetensors shards, an index, configs, a tokenizer, a nested file."""
    os.makedirs(os.path.join(root, "original"), exist_ok=True)
    rnd = hashlib.sha256(b"seed%d" % seed).digest()
    for i, mib in enumerate(shard_mib, 1):
        with open(os.path.join(root, "model-%05d-of-%05d.safetensors" % (i, len(shard_mib))), "wb") as fh:
            block = hashlib.sha256(rnd + bytes([i])).digest() * (MIB // 32)
            for j in range(mib):
                fh.write(bytes([j % 251]) + block[1:])
    files = {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "seed": seed}),
        "generation_config.json": "{}",
        "tokenizer.json": json.dumps({"vocab": list(range(500))}),
        "model.safetensors.index.json": json.dumps({"weight_map": {}}),
        "original/params.json": json.dumps({"dim": 16}),
    }
    for rel, text in files.items():
        with open(os.path.join(root, rel), "w", encoding="utf-8") as fh:
            fh.write(text)
    return root


def run(src, dest, **kw):
    kw.setdefault("workers", 2)
    source = kw.pop("source_obj", None) or sync.make_source(src, air_gapped=kw.pop("air_gapped", False), hf_endpoint=kw.pop("hf_endpoint", None))
    return sync.Syncer(source, dest, **kw).run()


def cli(*args, check=True):
    proc = subprocess.run([sys.executable, SCRIPT, "--quiet", *args], capture_output=True, text=True, timeout=300, check=False)
    last = proc.stdout.strip().splitlines()[-1]
    summary = json.loads(last)[sync.RESULT_KEY]
    if check:
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return proc.returncode, summary


@pytest.fixture
def model(tmp_path):
    return make_model(str(tmp_path / "src"))


# --------------------------------------------------------------------------------------------------
# Local directories


def test_fresh_copy_copies_everything_and_writes_a_manifest(model, tmp_path):
    dest = str(tmp_path / "pvc" / "Meta-Llama-3.1-8B-Instruct")
    rc, summary = cli("--source", model, "--dest", dest, "--name", "meta-llama/Llama-3.1-8B-Instruct")
    assert rc == 0 and summary["ok"]
    item = summary["items"][0]
    assert tree(dest) == tree(model)
    manifest = json.load(open(os.path.join(dest, sync.MANIFEST_NAME), encoding="utf-8"))
    assert manifest["name"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert {p: f["sha256"] for p, f in manifest["files"].items()} == tree(model)
    assert {p: f["size"] for p, f in manifest["files"].items()} == {
        p: os.path.getsize(os.path.join(model, p)) for p in tree(model)}
    assert item["copied_files"] == len(tree(model)) == item["files"]
    assert item["copied_bytes"] == sum(os.path.getsize(os.path.join(model, p)) for p in tree(model))
    # Nothing internal is left behind.
    assert sorted(os.listdir(dest)) == sorted([sync.MANIFEST_NAME, "original"] + [p for p in tree(model) if "/" not in p])
    assert sync.check_dest(dest, name="meta-llama/Llama-3.1-8B-Instruct")["files"] == len(tree(model))


def test_rerun_has_nothing_to_do_and_touches_nothing(model, tmp_path):
    dest = str(tmp_path / "d")
    run(model, dest)
    before = {p: os.stat(os.path.join(dest, p)) for p in tree(dest)}
    manifest_stat = os.stat(os.path.join(dest, sync.MANIFEST_NAME))
    rc, summary = cli("--source", model, "--dest", dest)
    item = summary["items"][0]
    assert rc == 0 and item["changed"] is False
    assert item["copied_files"] == 0 and item["copied_bytes"] == 0
    assert item["skipped_files"] == len(before)
    # auto verify re-hashed every skipped file
    assert item["verified_files"] == len(before)
    after = {p: os.stat(os.path.join(dest, p)) for p in tree(dest)}
    assert {p: (s.st_ino, s.st_mtime_ns) for p, s in after.items()} == {p: (s.st_ino, s.st_mtime_ns) for p, s in before.items()}
    assert os.stat(os.path.join(dest, sync.MANIFEST_NAME)).st_mtime_ns == manifest_stat.st_mtime_ns


def test_quick_verify_trusts_size_and_mtime(model, tmp_path):
    dest = str(tmp_path / "d")
    run(model, dest)
    item = run(model, dest, verify="quick")
    assert item["verified_files"] == 0 and item["copied_files"] == 0


def test_kill_midway_then_resume_copies_only_what_is_missing(tmp_path):
    src = make_model(str(tmp_path / "src"), shard_mib=(24, 24, 24, 24))
    dest = str(tmp_path / "d")
    total = sum(os.path.getsize(os.path.join(src, p)) for p in tree(src))
    # One worker and a rate cap make the kill land in the middle on any machine.
    proc = subprocess.Popen([sys.executable, SCRIPT, "--quiet", "--source", src, "--dest", dest, "--workers", "1",
                             "--max-rate", "40", "--buffer-size", str(256 * 1024)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    deadline = time.monotonic() + 120
    complete = []
    while time.monotonic() < deadline:
        complete = [f for f in os.listdir(dest) if f.endswith(".safetensors")] if os.path.isdir(dest) else []
        tmp_dir = os.path.join(dest, sync.TMP_DIR)
        partial = [f for f in os.listdir(tmp_dir) if f.endswith(".part")] if os.path.isdir(tmp_dir) else []
        if len(complete) >= 2 and partial and os.path.getsize(os.path.join(tmp_dir, partial[0])) > 4 * MIB:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert len(complete) >= 2, "the copy did not get far enough before the deadline"
    # A killed run never looks complete.
    assert not os.path.exists(os.path.join(dest, sync.MANIFEST_NAME))
    assert os.path.exists(os.path.join(dest, sync.JOURNAL_NAME))
    done_inodes = {f: os.stat(os.path.join(dest, f)).st_ino for f in complete}

    rc, summary = cli("--source", src, "--dest", dest)
    item = summary["items"][0]
    assert rc == 0
    assert tree(dest) == tree(src)
    # Complete files were not copied again; the partial one resumed where it stopped.
    assert {f: os.stat(os.path.join(dest, f)).st_ino for f in complete} == done_inodes
    assert item["resumed_bytes"] > 4 * MIB
    assert item["copied_bytes"] + item["resumed_bytes"] + sum(os.path.getsize(os.path.join(src, f)) for f in complete) == total
    assert item["copied_bytes"] < total - 2 * 24 * MIB
    assert not os.path.exists(os.path.join(dest, sync.TMP_DIR))
    assert not os.path.exists(os.path.join(dest, sync.JOURNAL_NAME))


def test_partial_copy_after_reboot_is_trusted_only_up_to_the_checkpoint(tmp_path, monkeypatch):
    src = make_model(str(tmp_path / "src"), shard_mib=(8,))
    dest = str(tmp_path / "d")
    entry = [f for f in sync.LocalSource(src).list_files() if f.path.endswith(".safetensors")][0]
    syncer = sync.Syncer(sync.LocalSource(src), dest)
    tmp, ckpt = syncer._tmp_paths(entry.path)  # pylint: disable=protected-access
    os.makedirs(os.path.dirname(tmp))
    with open(entry.local, "rb") as fh:
        good = fh.read(5 * MIB)
    with open(tmp, "wb") as fh:
        fh.write(good[: 3 * MIB] + b"\0" * (2 * MIB))  # the last 2 MiB never reached the disk
    sync.atomic_write_json(ckpt, {"source": entry.fingerprint, "boot_id": "another-boot", "synced": 3 * MIB})
    os.makedirs(dest, exist_ok=True)
    sync.atomic_write_json(os.path.join(dest, sync.JOURNAL_NAME), {"schema": sync.MANIFEST_SCHEMA, "name": "src", "files": {}})
    item = syncer.run()
    assert item["resumed_bytes"] == 3 * MIB
    assert tree(dest) == tree(src)


def test_copies_never_truncate_a_file_to_zero(tmp_path, monkeypatch):
    """ext4 flushes a file truncated to zero synchronously when it is closed (auto_da_alloc): that stalled every
    shard for a third of a second and kept the copy under 0.8x `cp -r`. Fresh copies and restarts of an untrusted
    partial file both start from a new file instead."""
    src = make_model(str(tmp_path / "src"), shard_mib=(4, 2))
    dest = str(tmp_path / "d")
    entry = [f for f in sync.LocalSource(src).list_files() if f.path.endswith("00001-of-00002.safetensors")][0]
    syncer = sync.Syncer(sync.LocalSource(src), dest)
    tmp, ckpt = syncer._tmp_paths(entry.path)  # pylint: disable=protected-access
    os.makedirs(os.path.dirname(tmp))
    with open(tmp, "wb") as fh:
        fh.write(b"\0" * MIB)  # a partial file from another source version: not trusted, copied again from byte 0
    sync.atomic_write_json(ckpt, {"source": "local:0:0", "boot_id": sync.boot_id(), "synced": MIB})
    os.makedirs(dest, exist_ok=True)
    sync.atomic_write_json(os.path.join(dest, sync.JOURNAL_NAME), {"schema": sync.MANIFEST_SCHEMA, "name": "src", "files": {}})
    lengths = []
    real_ftruncate = os.ftruncate

    def recording_ftruncate(fd, length):
        lengths.append(length)
        return real_ftruncate(fd, length)

    monkeypatch.setattr(os, "ftruncate", recording_ftruncate)
    item = syncer.run()
    assert item["copied_files"] == len(tree(src)) and item["resumed_bytes"] == 0
    assert tree(dest) == tree(src)
    assert 0 not in lengths, lengths


def test_corrupted_file_is_detected_and_recopied(model, tmp_path):
    dest = str(tmp_path / "d")
    run(model, dest)
    victim = os.path.join(dest, "model-00002-of-00003.safetensors")
    st = os.stat(victim)
    with open(victim, "r+b") as fh:
        fh.seek(12345)
        byte = fh.read(1)
        fh.seek(12345)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only a re-hash sees it
    assert sha256_file(victim) != sha256_file(os.path.join(model, "model-00002-of-00003.safetensors"))
    with pytest.raises(sync.SyncError, match="does not match its manifest"):
        sync.check_dest(dest)
    rc, summary = cli("--source", model, "--dest", dest)
    item = summary["items"][0]
    assert rc == 0 and item["recopied"] == ["model-00002-of-00003.safetensors"]
    assert item["copied_files"] == 1
    assert tree(dest) == tree(model)
    sync.check_dest(dest)


def test_changed_source_file_is_recopied_and_removed_file_pruned(model, tmp_path):
    dest = str(tmp_path / "d")
    run(model, dest)
    with open(os.path.join(model, "config.json"), "w", encoding="utf-8") as fh:
        fh.write('{"changed": true}')
    os.unlink(os.path.join(model, "original", "params.json"))
    item = run(model, dest)
    assert item["copied_files"] == 1 and item["deleted"] == ["original/params.json"]
    assert tree(dest) == tree(model)


MANIFEST_EVENTS = []


def _audit(event, args):
    if MANIFEST_EVENTS and MANIFEST_EVENTS[0] == "on" and event in ("os.rename", "os.remove", "open"):
        MANIFEST_EVENTS.append((event, args[0] if event == "os.remove" else args[:2]))


sys.addaudithook(_audit)


def _record(fn):
    MANIFEST_EVENTS[:] = ["on"]
    try:
        fn()
    finally:
        MANIFEST_EVENTS[0] = "off"
    return MANIFEST_EVENTS[1:]


def test_manifest_is_written_last_and_removed_first(model, tmp_path):
    dest = str(tmp_path / "d")
    manifest = os.path.join(dest, sync.MANIFEST_NAME)
    complete_when_manifest_appeared = []

    def watch(event, args):
        if MANIFEST_EVENTS and MANIFEST_EVENTS[0] == "on" and event == "os.rename" and str(args[1]) == manifest:
            complete_when_manifest_appeared.append(tree(dest) == tree(model))

    sys.addaudithook(watch)
    events = _record(lambda: run(model, dest))
    renames = [a for e, a in events if e == "os.rename"]
    data_renames = [i for i, (s, d) in enumerate(renames) if str(s).endswith(".part")]
    manifest_rename = [i for i, (s, d) in enumerate(renames) if str(d) == manifest]
    assert len(data_renames) == len(tree(model))
    assert len(manifest_rename) == 1 and manifest_rename[0] > max(data_renames)
    assert complete_when_manifest_appeared == [True]
    # No later rename touches a data file.
    assert all(not str(d).startswith(dest) or d == manifest or str(d).endswith((".tmp", sync.JOURNAL_NAME)) or sync.JOURNAL_NAME in str(d)
               for s, d in renames[manifest_rename[0]:])

    # A run that changes something removes the manifest before the first byte of data is written.
    with open(os.path.join(model, "tokenizer.json"), "w", encoding="utf-8") as fh:
        fh.write('{"vocab": []}')
    events = _record(lambda: run(model, dest))
    removed = [i for i, (e, a) in enumerate(events) if e == "os.remove" and str(a) == manifest]
    first_part = [i for i, (e, a) in enumerate(events) if e == "open" and str(a[0]).endswith(".part")]
    assert removed and first_part and removed[0] < first_part[0]
    assert tree(dest) == tree(model)


def test_kill_at_any_point_never_leaves_a_manifest_over_incomplete_data(tmp_path):
    src = make_model(str(tmp_path / "src"), shard_mib=(6, 6))
    dest = str(tmp_path / "d")
    run(src, dest)
    # Change the source so the next run must rewrite, then kill it at several points.
    for rel in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        with open(os.path.join(src, rel), "r+b") as fh:
            fh.write(b"changed!")
    for delay in (0.05, 0.15, 0.3, 0.6):
        proc = subprocess.Popen([sys.executable, SCRIPT, "--quiet", "--source", src, "--dest", dest, "--workers", "1", "--max-rate", "30"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        manifest = sync.read_manifest(dest)
        if manifest is not None:
            # Killed before it invalidated the old manifest, or after it wrote the new one: either way the
            # data on disk is exactly what the manifest lists.
            assert {p: f["sha256"] for p, f in manifest["files"].items()} == tree(dest)
            sync.check_dest(dest)
    run(src, dest)
    assert tree(dest) == tree(src)


def test_different_model_in_subdirectory_is_refused_without_force(tmp_path):
    a = make_model(str(tmp_path / "a"), seed=1)
    b = make_model(str(tmp_path / "b"), shard_mib=(1,), seed=2)
    dest = str(tmp_path / "d")
    run(a, dest, name="org/model-a")
    before = tree(dest)
    rc, summary = cli("--source", b, "--dest", dest, "--name", "org/model-b", check=False)
    assert rc == 2 and summary["ok"] is False
    assert "holds the model 'org/model-a', not 'org/model-b'" in summary["items"][0]["error"]
    assert "--force" in summary["items"][0]["error"]
    assert tree(dest) == before and os.path.exists(os.path.join(dest, sync.MANIFEST_NAME))
    item = run(b, dest, name="org/model-b", force=True)
    assert tree(dest) == tree(b)
    assert "model-00002-of-00003.safetensors" in item["deleted"]
    assert sync.read_manifest(dest)["name"] == "org/model-b"


def test_foreign_files_are_refused_without_force(model, tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "weights.bin").write_bytes(b"someone else's")
    with pytest.raises(ValidationError, match="did not write"):
        run(model, str(dest))
    assert (dest / "weights.bin").read_bytes() == b"someone else's"
    run(model, str(dest), force=True)
    assert tree(str(dest)) == tree(model)


def test_missing_source_and_empty_filters_are_validation_errors(tmp_path, model):
    rc, summary = cli("--source", str(tmp_path / "nope"), "--dest", str(tmp_path / "d"), check=False)
    assert rc == 2 and "does not exist" in summary["items"][0]["error"]
    assert not (tmp_path / "d").exists()
    with pytest.raises(ValidationError, match="no files to stage"):
        run(model, str(tmp_path / "d"), include=["*.gguf"])


def test_include_exclude_filters(model, tmp_path):
    dest = str(tmp_path / "d")
    run(model, dest, exclude=["original/*"])
    assert "original/params.json" not in tree(dest)
    assert set(tree(dest)) == set(tree(model)) - {"original/params.json"}


def test_not_enough_space_fails_before_writing(model, tmp_path, monkeypatch):
    real = os.statvfs

    class Tiny:
        f_bavail = 10
        f_frsize = 4096

    monkeypatch.setattr(os, "statvfs", lambda p: Tiny() if str(p).startswith(str(tmp_path / "d")) else real(p))
    with pytest.raises(ValidationError, match="needs .* more but only 40.0 KiB is free"):
        run(model, str(tmp_path / "d"))
    assert tree(str(tmp_path / "d")) == {}


def test_config_file_stages_several_models_and_check_mode(tmp_path):
    target = make_model(str(tmp_path / "target"), seed=1)
    draft = make_model(str(tmp_path / "draft"), shard_mib=(1,), seed=2)
    pvc = tmp_path / "pvc"
    cfg = tmp_path / "plan.json"
    cfg.write_text(json.dumps({"workers": 2, "items": [
        {"name": "meta-llama/Llama-3.1-8B-Instruct", "source": target, "dest": str(pvc / "Meta-Llama-3.1-8B-Instruct")},
        {"name": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "source": draft, "dest": str(pvc / "EAGLE3-LLaMA3.1-Instruct-8B")},
    ]}))
    rc, summary = cli("--config", str(cfg))
    assert rc == 0 and [i["name"] for i in summary["items"]] == ["meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"]
    assert sorted(os.listdir(pvc)) == ["EAGLE3-LLaMA3.1-Instruct-8B", "Meta-Llama-3.1-8B-Instruct"]
    rc, summary = cli("--config", str(cfg), "--check")
    assert rc == 0 and summary["mode"] == "check" and [i["files"] for i in summary["items"]] == [len(tree(target)), len(tree(draft))]
    os.unlink(pvc / "EAGLE3-LLaMA3.1-Instruct-8B" / "config.json")
    rc, summary = cli("--config", str(cfg), "--check", check=False)
    assert rc == 1 and "config.json missing" in summary["items"][-1]["error"]


def test_plan_mode_lists_without_writing(model, tmp_path):
    rc, summary = cli("--source", model, "--dest", str(tmp_path / "d"), "--plan")
    item = summary["items"][0]
    assert rc == 0 and item["files"] == len(tree(model))
    assert item["bytes"] == sum(os.path.getsize(os.path.join(model, p)) for p in tree(model))
    assert not (tmp_path / "d").exists()


# --------------------------------------------------------------------------------------------------
# HTTP mirrors on loopback


class _Server:
    def __init__(self, handler):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve_dir():
    servers = []

    def start(root, requests=None):
        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=root, **kw)

            def log_message(self, *a):
                if requests is not None:
                    requests.append(self.command + " " + self.path)

        srv = _Server(Handler)
        servers.append(srv)
        return srv.url + "/"

    yield start
    for srv in servers:
        srv.close()


def test_http_mirror_with_directory_listing(model, tmp_path, serve_dir):
    requests = []
    url = serve_dir(model, requests)
    dest = str(tmp_path / "d")
    rc, summary = cli("--source", url, "--dest", dest, "--name", "m")
    assert rc == 0 and tree(dest) == tree(model)
    assert any(r.startswith("GET /original/params.json") for r in requests)
    requests.clear()
    rc, summary = cli("--source", url, "--dest", dest, "--name", "m")
    assert summary["items"][0]["copied_files"] == 0
    assert not [r for r in requests if r.startswith("GET /model-")]


def test_http_mirror_serving_a_manifest_checks_sha256(model, tmp_path, serve_dir):
    staged = str(tmp_path / "mirror")
    run(model, staged)  # a staged directory (with its manifest) is a valid mirror
    url = serve_dir(staged)
    dest = str(tmp_path / "d")
    item = run(url, dest, name="m")
    assert tree(dest) == tree(model) and item["copied_files"] == len(tree(model))
    # The mirror now serves bytes its manifest does not vouch for: refused, not staged.
    with open(os.path.join(staged, "config.json"), "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"architectures": ["LlamaForCausalLM"], "seed": 9}))  # same size, other bytes
    with pytest.raises(sync.SyncError, match="config.json: sha256 .* does not match the source"):
        run(url, str(tmp_path / "d2"), name="m")
    assert not os.path.exists(os.path.join(str(tmp_path / "d2"), sync.MANIFEST_NAME))


def test_http_resume_uses_range_requests(tmp_path, serve_dir):
    src = make_model(str(tmp_path / "src"), shard_mib=(8,))
    shard = "model-00001-of-00001.safetensors"
    requests = []
    url = serve_dir(src, requests)
    source = sync.make_source(url)
    entries = {e.path: e for e in source.list_files()}
    syncer = sync.Syncer(source, str(tmp_path / "d"), name="m")
    tmp, ckpt = syncer._tmp_paths(shard)  # pylint: disable=protected-access
    os.makedirs(os.path.dirname(tmp))
    with open(os.path.join(src, shard), "rb") as fh, open(tmp, "wb") as out:
        out.write(fh.read(3 * MIB))
    sync.atomic_write_json(ckpt, {"source": entries[shard].fingerprint, "boot_id": sync.boot_id(), "synced": 0})
    sync.atomic_write_json(str(tmp_path / "d" / sync.JOURNAL_NAME), {"schema": sync.MANIFEST_SCHEMA, "name": "m", "files": {}})

    class RangeHandler(http.server.SimpleHTTPRequestHandler):
        """SimpleHTTPRequestHandler ignores Range; this one honours it."""

        def __init__(self, *a, **kw):
            super().__init__(*a, directory=src, **kw)

        def log_message(self, *a):
            requests.append(self.command + " " + self.path + " " + (self.headers.get("Range") or ""))

        def do_GET(self):
            rng = self.headers.get("Range")
            path = self.translate_path(self.path)
            if not rng or not os.path.isfile(path):
                return super().do_GET()
            start = int(rng.split("=")[1].split("-")[0])
            size = os.path.getsize(path)
            self.send_response(206)
            self.send_header("Content-Length", str(size - start))
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, size - 1, size))
            self.end_headers()
            with open(path, "rb") as fh:
                fh.seek(start)
                shutil.copyfileobj(fh, self.wfile)
            return None

    srv = _Server(RangeHandler)
    try:
        source = sync.make_source(srv.url + "/")
        item = sync.Syncer(source, str(tmp_path / "d"), name="m").run()
    finally:
        srv.close()
    assert item["resumed_bytes"] == 3 * MIB
    assert any(("/%s" % shard) in r and "bytes=%d-" % (3 * MIB) in r for r in requests)
    assert tree(str(tmp_path / "d")) == tree(src)


def _hf_handler(root, commit, calls, redirect_to=None):
    files = sorted(tree(root))

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            calls.append(self.path)

        def do_GET(self):  # pylint: disable=invalid-name
            path = urllib.parse.urlsplit(self.path).path
            if path == "/api/models/org/tiny/revision/main":
                body = json.dumps({"id": "org/tiny", "sha": commit, "siblings": [
                    dict({"rfilename": f, "size": os.path.getsize(os.path.join(root, f))},
                         **({"lfs": {"sha256": sha256_file(os.path.join(root, f)), "size": os.path.getsize(os.path.join(root, f))}}
                            if f.endswith(".safetensors") else {}))
                    for f in files] + [{"rfilename": ".gitattributes", "size": 10}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            prefix = "/org/tiny/resolve/%s/" % commit
            if path.startswith(prefix):
                rel = urllib.parse.unquote(path[len(prefix):])
                if redirect_to and rel.endswith(".safetensors"):
                    self.send_response(302)
                    self.send_header("Location", redirect_to + rel)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with open(os.path.join(root, rel), "rb") as fh:
                    data = fh.read()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_error(404)

    return Handler


def test_hf_mirror_api_shape(model, tmp_path, monkeypatch):
    calls = []
    srv = _Server(_hf_handler(model, "a" * 40, calls))
    try:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        rc, summary = cli("--source", "hf://org/tiny", "--dest", str(tmp_path / "d"), "--air-gapped")
    finally:
        srv.close()
    item = summary["items"][0]
    assert rc == 0 and item["name"] == "org/tiny" and item["source"] == "hf://org/tiny@" + "a" * 40
    assert tree(str(tmp_path / "d")) == tree(model)
    assert "/api/models/org/tiny/revision/main?blobs=true" in calls
    assert any(c.startswith("/org/tiny/resolve/%s/" % ("a" * 40)) for c in calls)


def test_air_gapped_refuses_public_hubs(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    rc, summary = cli("--source", "hf://meta-llama/Llama-3.1-8B-Instruct", "--dest", str(tmp_path / "d"), "--air-gapped", check=False)
    assert rc == 2
    assert "air-gapped mode refuses the public hub https://huggingface.co" in summary["items"][0]["error"]
    assert "HF_ENDPOINT" in summary["items"][0]["error"]
    for url in ("https://huggingface.co/meta-llama/x/resolve/main/", "https://cdn-lfs.hf.co/repos/x/", "https://www.modelscope.cn/models/x/"):
        with pytest.raises(ValidationError, match="air-gapped mode refuses the public hub host"):
            sync.make_source(url, air_gapped=True)
    monkeypatch.setenv("SPEC_DECODING_AIR_GAPPED", "true")
    rc, summary = cli("--source", "https://huggingface.co/org/m/", "--dest", str(tmp_path / "d"), check=False)
    assert rc == 2 and "refuses the public hub host 'huggingface.co'" in summary["items"][0]["error"]
    assert not (tmp_path / "d").exists()


def test_air_gapped_refuses_a_mirror_redirect_to_a_public_hub(model, tmp_path, monkeypatch):
    calls = []
    srv = _Server(_hf_handler(model, "b" * 40, calls, redirect_to="https://cdn-lfs.huggingface.co/repos/org/tiny/"))
    try:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        rc, summary = cli("--source", "hf://org/tiny", "--dest", str(tmp_path / "d"), "--air-gapped", check=False)
    finally:
        srv.close()
    assert rc == 2
    assert "refuses the public hub host 'cdn-lfs.huggingface.co'" in summary["items"][0]["error"]
    assert "redirect" in summary["items"][0]["error"]
    assert not os.path.exists(os.path.join(str(tmp_path / "d"), sync.MANIFEST_NAME))


def test_serve_mode_feeds_a_stager(model, tmp_path):
    proc = subprocess.Popen([sys.executable, SCRIPT, "--serve", model, "--bind", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        rc, summary = cli("--source", info["url"], "--dest", str(tmp_path / "d"), "--name", "m")
        assert rc == 0 and tree(str(tmp_path / "d")) == tree(model)
        assert summary["items"][0]["source"] == info["url"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_unsafe_paths_in_an_index_are_rejected():
    with pytest.raises(ValidationError, match="unsafe file path"):
        sync_sources._files_from_index({"files": [{"path": "../../etc/passwd", "size": 1}]}, "http://127.0.0.1/", "index")  # pylint: disable=protected-access
    with pytest.raises(ValidationError, match="unsafe file path"):
        sync_sources._files_from_index({"files": ["/abs"]}, "http://127.0.0.1/", "index")  # pylint: disable=protected-access


def test_public_hub_host_matching():
    assert sync.is_public_hub("huggingface.co") and sync.is_public_hub("cdn-lfs-us-1.hf.co") and sync.is_public_hub("HF-Mirror.com.")
    assert not sync.is_public_hub("hf.internal.example") and not sync.is_public_hub("myhuggingface.co")


def test_s3_compatible_bucket_anonymous(model, tmp_path, monkeypatch):
    """ListObjectsV2 (paged) + GET on a loopback stand-in of an S3-compatible endpoint (path-style, anonymous)."""
    keys = sorted(tree(model))
    calls = []

    class S3(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            calls.append(self.path)

        def do_GET(self):  # pylint: disable=invalid-name
            split = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(split.query)
            if split.path == "/models" and query.get("list-type") == ["2"]:
                prefix = query["prefix"][0]
                start = int(query.get("continuation-token", ["0"])[0])
                page = keys[start:start + 3]
                more = start + 3 < len(keys)
                body = ['<?xml version="1.0" encoding="UTF-8"?>',
                        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>models</Name>',
                        "<IsTruncated>%s</IsTruncated>" % ("true" if more else "false")]
                if more:
                    body.append("<NextContinuationToken>%d</NextContinuationToken>" % (start + 3))
                for key in page:
                    body.append("<Contents><Key>%s%s</Key><Size>%d</Size><ETag>&quot;%s&quot;</ETag></Contents>" % (
                        prefix, key, os.path.getsize(os.path.join(model, key)), "e" * 32))
                body.append("</ListBucketResult>")
                data = "".join(body).encode()
            elif split.path.startswith("/models/llama/"):
                with open(os.path.join(model, urllib.parse.unquote(split.path[len("/models/llama/"):])), "rb") as fh:
                    data = fh.read()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = _Server(S3)
    try:
        rc, summary = cli("--source", "s3://models/llama", "--s3-endpoint", srv.url, "--dest", str(tmp_path / "d"), "--air-gapped")
    finally:
        srv.close()
    assert rc == 0 and summary["items"][0]["name"] == "llama"
    assert tree(str(tmp_path / "d")) == tree(model)
    assert sum(1 for c in calls if "list-type=2" in c) == -(-len(keys) // 3)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    with pytest.raises(ValidationError, match="s3_endpoint: s3 sources need an endpoint"):
        sync.make_source("s3://models/llama", s3_endpoint=None)


# --------------------------------------------------------------------------------------------------
# Speed paths: several workers, the read-ahead thread


def flip_byte(path, offset):
    """Corrupt one byte in place, keeping size and mtime (only a re-hash can notice)."""
    st = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("read_ahead", [0, 3])
def test_concurrent_copy_detects_and_recopies_several_corrupted_files(tmp_path, read_ahead):
    src = make_model(str(tmp_path / "src"), shard_mib=(3, 2, 4, 1))
    dest = str(tmp_path / "d")
    first = run(src, dest, workers=4, read_ahead=read_ahead, buffer_size=64 * 1024)
    assert first["copied_files"] == len(tree(src)) and tree(dest) == tree(src)
    # The manifest's hashes are those of the bytes on disk, whichever thread read them.
    manifest = sync.read_manifest(dest)
    assert {p: f["sha256"] for p, f in manifest["files"].items()} == tree(dest)
    flip_byte(os.path.join(dest, "model-00001-of-00004.safetensors"), 2 * MIB + 7)
    flip_byte(os.path.join(dest, "model-00003-of-00004.safetensors"), 0)
    flip_byte(os.path.join(dest, "original", "params.json"), 3)
    second = run(src, dest, workers=4, read_ahead=read_ahead)
    assert second["recopied"] == ["model-00001-of-00004.safetensors", "model-00003-of-00004.safetensors", "original/params.json"]
    assert second["copied_files"] == 3
    assert tree(dest) == tree(src)
    sync.check_dest(dest, workers=4)


def test_read_ahead_errors_reach_the_copying_thread_and_the_reader_stops():
    calls = []

    def failing_readinto(view):
        calls.append(len(view))
        if len(calls) == 3:
            raise OSError(5, "Input/output error")
        view[:4] = b"abcd"
        return 4

    chunks = sync_reads._read_ahead(failing_readinto, 16, 2)  # pylint: disable=protected-access
    got = []
    with pytest.raises(OSError, match="Input/output error"):
        for chunk in chunks:
            got.append(bytes(chunk))
    assert got == [b"abcd", b"abcd"]
    assert not [t for t in threading.enumerate() if t.name == "artifact-sync-reader"]

    # A consumer that stops early (an exception while writing) closes the generator: the reader is joined.
    endless = sync_reads._read_ahead(len, 8, 3)  # pylint: disable=protected-access
    assert len(next(endless)) == 8
    endless.close()
    assert not [t for t in threading.enumerate() if t.name == "artifact-sync-reader"]


def test_http_copy_uses_the_read_ahead_thread_and_matches_the_source(model, tmp_path, serve_dir):
    base = serve_dir(model)
    dest = str(tmp_path / "d")
    source = sync.make_source(base)
    syncer = sync.Syncer(source, dest, workers=3)
    assert syncer.read_ahead == sync.PIPELINE_DEPTH
    assert sync.Syncer(sync.make_source(model), str(tmp_path / "other")).read_ahead == 0
    item = syncer.run()
    assert item["copied_files"] == len(tree(model)) and tree(dest) == tree(model)
    assert item["peak_rss_mib"] is None or item["peak_rss_mib"] < 512


def test_kill_with_several_workers_then_resume_copies_only_what_is_missing(tmp_path):
    src = make_model(str(tmp_path / "src"), shard_mib=(6, 6, 24, 24, 24))
    dest = str(tmp_path / "d")
    sizes = {p: os.path.getsize(os.path.join(src, p)) for p in tree(src)}
    # Four workers share a 40 MiB/s cap: the small files finish first while the big ones are still partial.
    proc = subprocess.Popen([sys.executable, SCRIPT, "--quiet", "--source", src, "--dest", dest, "--workers", "4",
                             "--max-rate", "40", "--buffer-size", str(256 * 1024)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tmp_dir = os.path.join(dest, sync.TMP_DIR)
    deadline = time.monotonic() + 120
    partial = {}
    while time.monotonic() < deadline:
        partial = {f: os.path.getsize(os.path.join(tmp_dir, f)) for f in os.listdir(tmp_dir) if f.endswith(".part")} if os.path.isdir(tmp_dir) else {}
        if len([n for n in partial.values() if n > 2 * MIB]) >= 2:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert len([n for n in partial.values() if n > 2 * MIB]) >= 2, "the copy did not get far enough before the deadline"
    assert not os.path.exists(os.path.join(dest, sync.MANIFEST_NAME))
    complete = [p for p in sizes if os.path.exists(os.path.join(dest, p))]
    done_inodes = {p: os.stat(os.path.join(dest, p)).st_ino for p in complete}

    rc, summary = cli("--source", src, "--dest", dest, "--workers", "4")
    item = summary["items"][0]
    assert rc == 0
    assert tree(dest) == tree(src)
    assert {p: os.stat(os.path.join(dest, p)).st_ino for p in complete} == done_inodes
    # Every byte is accounted for exactly once: files finished before the kill are skipped, partial files
    # resume at their length, the rest is copied.
    assert item["resumed_bytes"] >= 4 * MIB
    assert item["copied_bytes"] + item["resumed_bytes"] + sum(sizes[p] for p in complete) == sum(sizes.values())
    assert item["skipped_files"] == len(complete)
    sync.check_dest(dest)


def test_every_file_is_fsynced_before_its_rename_and_the_manifest(tmp_path, monkeypatch):
    # The flusher thread does the fsyncs now; spy on the real calls (they still run) to check the order.
    src = make_model(str(tmp_path / "src"), shard_mib=(9, 5, 3))
    dest = str(tmp_path / "d")
    order = []
    real_fsync, real_replace = os.fsync, os.replace

    def spy_fsync(fd):
        real_fsync(fd)
        order.append(("fsync", os.readlink("/proc/self/fd/%d" % fd)))

    def spy_replace(a, b, **kw):
        real_replace(a, b, **kw)
        order.append(("replace", str(a), str(b)))

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    run(src, dest, workers=3, checkpoint_bytes=2 * MIB, buffer_size=64 * 1024)
    data = set(tree(src))
    synced_at = {}
    for i, step in enumerate(order):
        if step[0] == "fsync" and step[1].endswith(".part"):
            synced_at.setdefault(os.path.relpath(step[1][: -len(".part")], os.path.join(dest, sync.TMP_DIR)), i)
    assert set(synced_at) == data
    for i, step in enumerate(order):
        if step[0] == "replace" and step[1].endswith(".part"):
            rel = os.path.relpath(step[2], dest)
            assert synced_at[rel] < i, "%s moved into place before its fsync" % rel
    manifest_at = [i for i, step in enumerate(order) if step[0] == "replace" and step[2] == os.path.join(dest, sync.MANIFEST_NAME)]
    assert len(manifest_at) == 1 and manifest_at[0] > max(synced_at.values())
    assert tree(dest) == tree(src)


def test_a_failed_fsync_fails_the_run_without_a_manifest_or_leaked_descriptors(model, tmp_path, monkeypatch):
    dest = str(tmp_path / "d")
    real_fsync = os.fsync

    def failing_fsync(fd):
        if os.readlink("/proc/self/fd/%d" % fd).endswith("model-00002-of-00003.safetensors.part"):
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    before = set(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        run(model, dest, workers=3)
    assert set(os.listdir("/proc/self/fd")) <= before
    assert not os.path.exists(os.path.join(dest, sync.MANIFEST_NAME))
    monkeypatch.setattr(os, "fsync", real_fsync)
    item = run(model, dest, workers=3)
    assert item["copied_files"] >= 1 and tree(dest) == tree(model)


# --------------------------------------------------------------------------------------------------
# Direct reads of cold local files (O_DIRECT), and every way they fall back to the page cache

def write_cold(path, size, seed=7):
    """A file of ``size`` bytes whose pages are evicted from the page cache (written, fsynced, dropped)."""
    block = hashlib.sha256(b"cold%d" % seed).digest() * (MIB // 32)
    with open(path, "wb") as fh:
        left, n = size, 0
        while left:
            chunk = (bytes([n % 251]) + block[1:])[:left]
            fh.write(chunk)
            left -= len(chunk)
            n += 1
        fh.flush()
        os.fsync(fh.fileno())
    evict(path)
    return path


def resident_bytes(path):
    """Bytes of `path` in the page cache, as util-linux's fincore (mincore(2)) reports them: independent of the
    RWF_NOWAIT probe under test. None without fincore."""
    if shutil.which("fincore") is None:
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path], capture_output=True, text=True,
                         check=True).stdout.strip()
    return int(out or 0)


def evict(path):
    """Drop the file's pages from the page cache, and check they are gone (fincore) before the test relies on it.

    One POSIX_FADV_DONTNEED usually does it; on a busy machine a page can still be locked or in flight when it runs
    (seen with the unit tier on two workers: the file stayed resident and the test read a warm file as cold), so it is
    repeated, briefly, until fincore reports nothing resident."""
    deadline = time.monotonic() + 5
    while True:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        left = resident_bytes(path)
        if not left:
            return
        assert time.monotonic() < deadline, "%s: %d bytes still in the page cache after 5 s of POSIX_FADV_DONTNEED" % (path, left)
        time.sleep(0.05)


def direct_io_works(path):
    """Whether this file system takes O_DIRECT reads at all (the test machine's disk does; tmpfs may not)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        import mmap  # pylint: disable=import-outside-toplevel
        buf = mmap.mmap(-1, sync.DIRECT_ALIGN)
        os.preadv(fd, [buf], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@pytest.fixture
def cold_model(tmp_path):
    """Two shards bigger than DIRECT_MIN_BYTES with sizes that are not block multiples, one small file, all cold."""
    root = tmp_path / "cold-src"
    root.mkdir()
    write_cold(str(root / "model-00001-of-00002.safetensors"), sync.DIRECT_MIN_BYTES + 3 * sync.DIRECT_BUFFER + 12345, seed=1)
    write_cold(str(root / "model-00002-of-00002.safetensors"), sync.DIRECT_MIN_BYTES + sync.DIRECT_ALIGN, seed=2)
    (root / "config.json").write_text("{}", encoding="utf-8")
    if not direct_io_works(str(root / "model-00002-of-00002.safetensors")):
        pytest.fail("the test directory's file system refuses O_DIRECT reads: run the tests on a disk-backed TMPDIR")
    return str(root)


def test_page_cache_probe_tells_a_cold_file_from_a_warm_one(tmp_path, monkeypatch):
    """mincore(2) answers without reading: the cold file is still cold after the probe (fincore agrees), and no
    RWF_NOWAIT read was tried (that probe starts readahead, and a fast disk can make a cold file pass for warm)."""
    path = write_cold(str(tmp_path / "f"), 4 * MIB)
    nowait = []
    real_preadv = os.preadv

    def preadv(fd, buffers, offset, *flags):
        nowait.append(offset)
        return real_preadv(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "preadv", preadv)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert sync_reads._page_cached(fd, 0, 4 * MIB) is False  # pylint: disable=protected-access
        assert resident_bytes(path) in (0, None) and nowait == []
        while os.read(fd, MIB):
            pass
        assert sync_reads._page_cached(fd, 0, 4 * MIB) is True  # pylint: disable=protected-access
        os.posix_fadvise(fd, 2 * MIB, 0, os.POSIX_FADV_DONTNEED)  # the second half cold again: the end page says so
        assert sync_reads._page_cached(fd, 0, 4 * MIB) is False  # pylint: disable=protected-access
    finally:
        os.close(fd)


def test_without_mincore_a_warm_file_is_found_by_a_nowait_read(tmp_path, monkeypatch):
    """Where ctypes cannot call mincore, the RWF_NOWAIT read answers (a warm file: the read succeeds at once)."""
    monkeypatch.setattr(sync_reads, "_libc", lambda: None)
    path = str(tmp_path / "f")
    with open(path, "wb") as fh:
        fh.write(b"x" * MIB)
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.read(fd, MIB):
            pass
        assert sync_reads._page_cached(fd, 0, MIB) is True  # pylint: disable=protected-access
    finally:
        os.close(fd)


def test_cold_local_files_are_read_direct_and_copied_byte_exact(cold_model, tmp_path):
    dest = str(tmp_path / "d")
    summary = run(cold_model, dest, fsync=False)
    assert tree(dest) == tree(cold_model)
    big = sum(os.path.getsize(os.path.join(cold_model, n)) for n in os.listdir(cold_model) if n.endswith(".safetensors"))
    # Every byte of the two shards came in direct, the partial last block too (an aligned read may end at the
    # end of the file); the small config went through the page cache.
    assert summary["direct_read_bytes"] == big, summary
    manifest = sync.read_manifest(dest)
    for rel, entry in manifest["files"].items():
        assert entry["sha256"] == sha256_file(os.path.join(cold_model, rel))


def test_warm_files_and_the_no_direct_io_switch_read_through_the_page_cache(cold_model, tmp_path):
    summary = run(cold_model, str(tmp_path / "off"), fsync=False, direct_io=False)
    assert summary["direct_read_bytes"] == 0
    # That copy left the source in the page cache: the next copy does not re-read it from the device.
    summary = run(cold_model, str(tmp_path / "warm"), fsync=False)
    assert summary["direct_read_bytes"] == 0
    assert tree(str(tmp_path / "warm")) == tree(cold_model)


def test_resume_at_an_unaligned_offset_reads_through_the_page_cache_and_hashes_right(cold_model, tmp_path):
    dest = str(tmp_path / "d")
    syncer = sync.Syncer(sync.LocalSource(cold_model), dest, workers=1, fsync=False)
    entry = next(f for f in syncer.listing() if f.path == "model-00001-of-00002.safetensors")
    tmp, ckpt = syncer._tmp_paths(entry.path)  # pylint: disable=protected-access
    os.makedirs(os.path.dirname(tmp))
    with open(entry.local, "rb") as src, open(tmp, "wb") as part:
        part.write(src.read(5 * MIB + 1))  # a kill mid-buffer leaves any length
    sync.atomic_write_json(ckpt, {"source": entry.fingerprint, "boot_id": syncer.boot, "synced": 0})
    sync.atomic_write_json(os.path.join(dest, sync.JOURNAL_NAME), {"schema": sync.MANIFEST_SCHEMA, "name": "cold-src", "files": {}})
    evict(entry.local)
    syncer.run()
    assert tree(dest) == tree(cold_model)
    assert syncer.stats["resumed_bytes"] == 5 * MIB + 1
    # The resumed shard went through the page cache; only the other shard was read direct.
    assert syncer.stats["direct_read_bytes"] == os.path.getsize(os.path.join(cold_model, "model-00002-of-00002.safetensors"))


@pytest.mark.parametrize("refused_at", ["open", "read"])
def test_a_file_system_that_refuses_o_direct_falls_back_to_the_page_cache(cold_model, tmp_path, monkeypatch, refused_at):
    real_open, real_preadv = os.open, os.preadv
    refused = []

    def fake_open(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT and refused_at == "open":
            refused.append(path)
            raise OSError(22, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    def fake_preadv(fd, buffers, offset, *flags):
        if refused_at == "read" and fcntl_flags(fd) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(22, "Invalid argument")
        return real_preadv(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "preadv", fake_preadv)
    dest = str(tmp_path / "d")
    summary = run(cold_model, dest, fsync=False)
    assert len(refused) == 2  # once per shard, then the page cache for the rest of that file
    assert summary["direct_read_bytes"] == 0
    assert tree(dest) == tree(cold_model)


def fcntl_flags(fd):
    import fcntl  # pylint: disable=import-outside-toplevel
    return fcntl.fcntl(fd, fcntl.F_GETFL)


def test_a_read_error_on_the_direct_path_fails_the_file_and_the_rerun_completes(cold_model, tmp_path, monkeypatch):
    real_preadv = os.preadv
    calls = {"n": 0}

    def failing_preadv(fd, buffers, offset, *flags):
        if fcntl_flags(fd) & os.O_DIRECT:
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError(5, "Input/output error")
        return real_preadv(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "preadv", failing_preadv)
    dest = str(tmp_path / "d")
    with pytest.raises(OSError, match="Input/output error"):
        run(cold_model, dest, fsync=False, workers=1)
    assert not os.path.exists(os.path.join(dest, sync.MANIFEST_NAME))
    monkeypatch.setattr(os, "preadv", real_preadv)
    run(cold_model, dest, fsync=False)
    assert tree(dest) == tree(cold_model)
