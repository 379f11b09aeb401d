# -*- coding: utf-8 -*-
# Copyright: Alauda
# Apache License 2.0 (see LICENSE)
"""Benchmark: the artifact sync engine (sha256 included) against `cp -r` on the same disk, side by side.

What it does
1. Writes a model-like directory (safetensors shards + json + tokenizer, default 2.5 GiB) on the disk of
   --dir and reads it once so every run starts from a warm page cache (dropping caches needs root and
   would also hurt the rest of a shared machine).
2. Interleaves, --reps times: `cp -r` | engine --no-fsync | `cp -r && sync` | engine (default, fsync per
   file). Each destination is removed and synced (untimed) before the next run. Wall time and the CPU
   seconds of the child are recorded; medians give the ratios:
     page cache ratio = median(cp -r) / median(engine --no-fsync)
     durable ratio    = median(cp -r && sync) / median(engine)
   (throughput ratio: 1.0 means as fast as cp, the target is >= 0.8).
3. Kill midway: starts the engine, SIGKILLs it when about half the bytes are on disk, reruns it and
   prints how many bytes the rerun copied, resumed and skipped; then a rerun with nothing to do.

Usage: python tests/bench/bench_artifact_sync.py [--gib 2.5] [--reps 3] [--dir DIR] [--keep] [--assert-ratio]
(`make bench` runs it). Numbers go to stdout, one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "plugins", "module_utils", "artifact_sync.py")
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "alauda-spec-decoding")
MIB = 1 << 20


def make_model(root, total_bytes):
    """Four equal safetensors shards plus the small files a HF checkpoint carries."""
    os.makedirs(root, exist_ok=True)
    shards = 4
    shard = total_bytes // shards
    block = os.urandom(64 * MIB)
    for i in range(1, shards + 1):
        path = os.path.join(root, "model-%05d-of-%05d.safetensors" % (i, shards))
        with open(path, "wb") as fh:
            left = shard
            n = 0
            while left:
                chunk = block[: min(left, len(block))]
                fh.write(bytes([i, n % 256]) + chunk[2:])
                left -= len(chunk)
                n += 1
    small = {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}),
        "generation_config.json": json.dumps({"do_sample": True}),
        "model.safetensors.index.json": json.dumps({"weight_map": {"w%d" % i: "model-0000%d-of-00004.safetensors" % (i % 4 + 1)
                                                                   for i in range(300)}}),
        "tokenizer_config.json": json.dumps({"chat_template": "x" * 4000}),
        "special_tokens_map.json": "{}",
    }
    for name, text in small.items():
        with open(os.path.join(root, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    with open(os.path.join(root, "tokenizer.json"), "wb") as fh:
        fh.write(os.urandom(9 * MIB))
    subprocess.run(["sync"], check=True)


def dir_bytes(root):
    total = 0
    for dirpath, _dirs, filenames in os.walk(root):
        for name in filenames:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                pass
    return total


def warm(root):
    for dirpath, _dirs, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb", buffering=0) as fh:
                while fh.read(8 * MIB):
                    pass


def clean(path):
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["sync"], check=True)


def timed(cmd):
    """(wall seconds, child CPU seconds, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit("command failed (%d): %s\n%s%s" % (proc.returncode, " ".join(cmd), proc.stdout, proc.stderr))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def engine_cmd(src, dest, *extra):
    return [sys.executable, SCRIPT, "--quiet", "--source", src, "--dest", dest, *extra]


def summary_of(stdout):
    return json.loads(stdout.strip().splitlines()[-1])["spec_decoding_sync"]["items"][0]


def main():  # pylint: disable=too-many-locals,too-many-statements
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gib", type=float, default=float(os.environ.get("BENCH_SYNC_GIB", "2.5")))
    parser.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_SYNC_REPS", "3")))
    parser.add_argument("--dir", default=os.environ.get("BENCH_SYNC_DIR", os.path.join(CACHE, "bench")))
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the generated source between invocations")
    parser.add_argument("--assert-ratio", action="store_true", help="exit 1 when the durable ratio is below 0.8")
    args = parser.parse_args()

    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="artifact-sync-", dir=args.dir)
    src = os.path.join(args.dir, "source-%.2fGiB" % args.gib)
    try:
        want = int(args.gib * (1 << 30))
        if dir_bytes(src) < want:
            shutil.rmtree(src, ignore_errors=True)
            print("generating %.2f GiB of model-like files in %s" % (args.gib, src), flush=True)
            make_model(src, want)
        total = dir_bytes(src)
        warm(src)
        extra = ["--workers", str(args.workers)] if args.workers else []
        print("source: %s, %.2f GiB in %d files; cpus %d; load average %s" % (
            src, total / (1 << 30), sum(len(f) for _d, _s, f in os.walk(src)), os.cpu_count(), " ".join("%.1f" % x for x in os.getloadavg())),
            flush=True)

        runs = {"cp": [], "engine_nofsync": [], "cp_sync": [], "engine": []}
        cpu = {k: [] for k in runs}
        for rep in range(args.reps):
            dest = os.path.join(work, "dest")
            clean(dest)
            w, c, _out = timed(["cp", "-r", src, dest])
            runs["cp"].append(w)
            cpu["cp"].append(c)
            clean(dest)
            w, c, out = timed(engine_cmd(src, dest, "--no-fsync", *extra))
            assert summary_of(out)["copied_bytes"] == total
            runs["engine_nofsync"].append(w)
            cpu["engine_nofsync"].append(c)
            clean(dest)
            w, c, _out = timed(["sh", "-c", 'cp -r "$0" "$1" && sync', src, dest])
            runs["cp_sync"].append(w)
            cpu["cp_sync"].append(c)
            clean(dest)
            w, c, out = timed(engine_cmd(src, dest, *extra))
            assert summary_of(out)["copied_bytes"] == total
            runs["engine"].append(w)
            cpu["engine"].append(c)
            print("rep %d: cp -r %.2f s | engine --no-fsync %.2f s | cp -r && sync %.2f s | engine %.2f s  (load %.1f)" % (
                rep + 1, runs["cp"][-1], runs["engine_nofsync"][-1], runs["cp_sync"][-1], runs["engine"][-1], os.getloadavg()[0]),
                flush=True)
        med = {k: statistics.median(v) for k, v in runs.items()}
        cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
        ratio_cache = med["cp"] / med["engine_nofsync"]
        ratio_durable = med["cp_sync"] / med["engine"]
        gib = total / (1 << 30)
        print()
        print("%-22s %8s %10s %9s %8s" % ("median of %d" % args.reps, "wall s", "MiB/s", "cpu s", "spread"))
        for key, label in (("cp", "cp -r"), ("engine_nofsync", "engine --no-fsync"), ("cp_sync", "cp -r && sync"), ("engine", "engine (fsync)")):
            spread = (max(runs[key]) - min(runs[key])) / med[key] * 100 if med[key] else 0
            print("%-22s %8.2f %10.0f %9.2f %7.0f%%" % (label, med[key], total / MIB / med[key], cpu_med[key], spread))
        print("throughput ratio, page cache (cp -r / engine --no-fsync): %.2f" % ratio_cache)
        print("throughput ratio, durable (cp -r && sync / engine):       %.2f   target >= 0.80: %s" % (
            ratio_durable, "PASS" if ratio_durable >= 0.8 else "MISS"))

        # Kill midway, then resume.
        dest = os.path.join(work, "killed")
        clean(dest)
        proc = subprocess.Popen(engine_cmd(src, dest, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and dir_bytes(dest) < total // 2:
            time.sleep(0.005)
        on_disk = dir_bytes(dest)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = proc.returncode == -signal.SIGKILL
        manifest_after_kill = os.path.exists(os.path.join(dest, ".spec-decoding-manifest.json"))
        w, _cpu, out = timed(engine_cmd(src, dest, *extra))
        resumed = summary_of(out)
        w2, _cpu2, out2 = timed(engine_cmd(src, dest, *extra))
        noop = summary_of(out2)
        w3, _cpu3, out3 = timed(engine_cmd(src, dest, "--verify", "quick", *extra))
        quick = summary_of(out3)
        print()
        print("kill midway: SIGKILL %s with %.0f MiB of %.0f MiB on disk; manifest present after kill: %s" % (
            "delivered" if killed else "too late (run finished)", on_disk / MIB, total / MIB, manifest_after_kill))
        print("rerun: copied %.0f MiB in %d file(s), resumed %.0f MiB of a partial file, skipped %d file(s) (%.0f MiB), %.2f s" % (
            resumed["copied_bytes"] / MIB, resumed["copied_files"], resumed["resumed_bytes"] / MIB, resumed["skipped_files"],
            (total - resumed["copied_bytes"] - resumed["resumed_bytes"]) / MIB, w))
        print("rerun with nothing to do: copied %d bytes, re-hashed %d file(s) in %.2f s (verify auto); --verify quick %.2f s" % (
            noop["copied_bytes"], noop["verified_files"], w2, w3))
        result = {
            "bytes": total, "gib": round(gib, 3), "reps": args.reps, "median_s": {k: round(v, 3) for k, v in med.items()},
            "cpu_s": {k: round(v, 3) for k, v in cpu_med.items()}, "ratio_page_cache": round(ratio_cache, 3),
            "ratio_durable": round(ratio_durable, 3), "kill": {"killed": killed, "on_disk_bytes": on_disk,
                                                               "manifest_after_kill": manifest_after_kill},
            "resume": {k: resumed[k] for k in ("copied_bytes", "copied_files", "resumed_bytes", "skipped_files")},
            "noop": {"copied_bytes": noop["copied_bytes"], "seconds": round(w2, 3), "quick_seconds": round(w3, 3),
                     "quick_copied": quick["copied_bytes"]},
        }
        print(json.dumps({"bench_artifact_sync": result}, sort_keys=True))
        ok = killed and not manifest_after_kill and resumed["copied_bytes"] + resumed["resumed_bytes"] < total and noop["copied_bytes"] == 0
        if not ok:
            print("FAIL: the kill/resume scenario did not behave", file=sys.stderr)
            return 1
        if args.assert_ratio and ratio_durable < 0.8:
            return 1
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(src, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
