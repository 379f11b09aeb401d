"""One import of vLLM for the tests that run a script against the installed vLLM without a server.

The differential tests (tests/e2e/test_vllm_config_differential.py, test_engine_line_differential.py,
test_strip_differential.py) and the introspection test each ran ``python -c SCRIPT`` in the vLLM venv: four imports of
vLLM and torch, 7-10 s of CPU each on 2 cores, for a few seconds of work. Here one process of the venv imports what
those scripts import, once, and then serves jobs: each job is a ``fork()`` of that process which runs the script as
``python -c`` would (``sys.argv``, ``__name__ == "__main__"``, its environment, its stdin, stdout and stderr from files)
and exits with the script's exit status. A job therefore starts from the state a fresh process has right after the
import, never from another job's: what one script configures (vLLM's logging, ``logging.disable``, the env cache that
EngineCore enables, pydantic or torch state) dies with its fork. The fork happens with one thread alive (checked when
the server starts: torch starts no thread pool at import), so no lock is inherited held.

What differs from ``python -c`` in a process of its own: environment variables read at interpreter start or at import
(PYTHONWARNINGS, PYTHONPATH, HF_HUB_OFFLINE, VLLM_LOGGING_LEVEL's first configuration) come from the server's start
environment (``START_ENV``: the harness's SERVER_ENV, offline, vLLM logging at ERROR), not the job's; the job's
environment is in ``os.environ`` before its script runs, so everything vLLM reads later (``vllm.envs`` reads the
environment on each access until EngineCore caches it; LoggingConfig's defaults, NO_COLOR) sees the job's values.

Use (the ``vllm_preloaded`` fixture in tests/e2e/conftest.py holds one for the modules that need it)::

    preloaded = PreloadedVllm(python).start()    # returns at once; the import runs in the background
    run = preloaded.run(SCRIPT, ["arg"], input="...", env={...}, timeout=300)   # a subprocess.CompletedProcess
    preloaded.stop()
"""
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import textwrap
import threading
import time

from tests.e2e.vllm_harness import SERVER_ENV

# What the scripts import (a module already in sys.modules costs a dict lookup in the fork).
PRELOAD = (
    "vllm",
    "vllm.config",  # ParallelConfig (config differential)
    "vllm.config.logging",  # LoggingConfig (engine line)
    "vllm.config.speculative",  # SpeculativeConfig, SpeculativeMethod, MTPModelTypes (introspection, engine line)
    "vllm.engine.arg_utils",  # EngineArgs (both differentials)
    "vllm.usage.usage_lib",  # UsageContext (engine line)
    "vllm.v1.engine.core",  # EngineCore (engine line)
    "vllm.entrypoints.launchers.cli_args",  # make_arg_parser (strip differential)
    "vllm.utils.argparse_utils",  # FlexibleArgumentParser (strip differential)
)

# The server's own environment: the harness's server environment (offline, one OpenMP thread), vLLM's logging at ERROR
# (a job that wants INFO sets it and configures vLLM's logging itself, as the engine line printer does).
START_ENV = dict(SERVER_ENV, VLLM_LOGGING_LEVEL="ERROR", PYTHONWARNINGS="ignore")

# Runs in the vLLM venv: argv[1] = the fd it reads jobs from, argv[2] = the fd it answers on, argv[3] = modules to import.
SERVER = textwrap.dedent('''
    import importlib, json, os, sys, time, traceback
    started = time.monotonic()
    for name in sys.argv[3].split(","):
        importlib.import_module(name)
    jobs = os.fdopen(int(sys.argv[1]), "r")
    answers = os.fdopen(int(sys.argv[2]), "w")
    threads = len(os.listdir("/proc/self/task"))
    answers.write(json.dumps({"ready": True, "import_seconds": time.monotonic() - started, "threads": threads}) + "\\n")
    answers.flush()

    def child(job):
        jobs.close()
        answers.close()
        os.environ.clear()
        os.environ.update(job["env"])
        for fd, (path, mode) in enumerate(((job["stdin"], os.O_RDONLY), (job["stdout"], os.O_WRONLY), (job["stderr"], os.O_WRONLY))):
            opened = os.open(path, mode)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, "r", closefd=False)  # a fresh reader: nothing buffered from the server's stdin
        sys.argv = ["-c"] + job["argv"]
        code = 0
        try:
            exec(compile(job["script"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:  # what python -c does: the traceback on stderr, exit status 1
            traceback.print_exc()
            code = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

    for line in jobs:
        job = json.loads(line)
        began = time.monotonic()
        pid = os.fork()
        if pid == 0:
            child(job)
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - began}) + "\\n")
        answers.flush()
''')


class PreloadedVllmError(RuntimeError):
    """The preloaded vLLM process failed to start or died; the message carries its log tail."""


class PreloadedVllm:
    """A process of the vLLM venv that has imported PRELOAD and runs scripts in forks of itself, one job at a time."""

    def __init__(self, python, log_path=None):
        self.python = python
        self.log_path = log_path or os.path.join(tempfile.mkdtemp(prefix="vllm-preload-"), "server.log")
        self.proc = None
        self.import_seconds = None
        self.threads = None
        self._jobs = self._answers = None
        self._lock = threading.Lock()
        self.ready_seconds = None
        self._started = None

    def start(self):
        """Start the server; returns at once (the import runs while the caller does other work)."""
        jobs_read, jobs_write = os.pipe()
        answers_read, answers_write = os.pipe()
        env = dict(os.environ, **START_ENV)
        env.pop("PYTHONPATH", None)  # the project's collection path must not leak into the vLLM venv
        self._started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [self.python, "-c", SERVER, str(jobs_read), str(answers_write), ",".join(PRELOAD)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, pass_fds=(jobs_read, answers_write),
                start_new_session=True)
        os.close(jobs_read)
        os.close(answers_write)
        self._jobs = os.fdopen(jobs_write, "w")
        self._answers = os.fdopen(answers_read, "r")
        return self

    def _answer(self, timeout):
        """The server's next answer line, within ``timeout`` seconds (then the server and its job are killed)."""
        if not select.select([self._answers], [], [], timeout)[0]:
            self.stop(kill=True)
            raise PreloadedVllmError("no answer from the preloaded vLLM process within %s s: it and its job were killed; "
                                     "its log %s ends:\n%s" % (timeout, self.log_path, self._tail()))
        line = self._answers.readline()
        if not line:
            returncode = self.proc.wait(timeout=30)
            self.stop()
            raise PreloadedVllmError("the preloaded vLLM process exited (status %s); its log %s ends:\n%s" % (
                returncode, self.log_path, self._tail()))
        return json.loads(line)

    def _tail(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return "\n".join(handle.read().splitlines()[-40:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout=300):
        """Wait for the import to finish; returns the seconds from start to ready."""
        with self._lock:
            if self.ready_seconds is None:
                ready = self._answer(timeout)
                self.import_seconds, self.threads = ready["import_seconds"], ready["threads"]
                # fork() copies only the calling thread: with another thread alive a job could inherit a lock it holds.
                if self.threads != 1:
                    self.stop(kill=True)
                    raise PreloadedVllmError("the preloaded vLLM process has %d threads after the import; forking it is "
                                             "not safe (run the scripts in processes of their own)" % self.threads)
                self.ready_seconds = time.monotonic() - self._started
        return self.ready_seconds

    def run(self, script, argv=(), input=None, env=None, timeout=300):  # pylint: disable=redefined-builtin
        """Run ``script`` as ``python -c script *argv`` would, in a fork of the preloaded process, with ``env`` (default:
        this process's environment) and ``input`` on its stdin. Returns a subprocess.CompletedProcess with text output."""
        self.wait_ready()
        work = tempfile.mkdtemp(prefix="vllm-job-")
        paths = {name: os.path.join(work, name) for name in ("stdin", "stdout", "stderr")}
        with open(paths["stdin"], "w", encoding="utf-8") as handle:
            handle.write(input or "")
        for name in ("stdout", "stderr"):
            open(paths[name], "w", encoding="utf-8").close()  # pylint: disable=consider-using-with
        job = dict(paths, script=script, argv=[str(a) for a in argv], env=dict(os.environ if env is None else env))
        with self._lock:
            self._jobs.write(json.dumps(job) + "\n")
            self._jobs.flush()
            answer = self._answer(timeout)
        try:
            with open(paths["stdout"], encoding="utf-8", errors="replace") as out, \
                    open(paths["stderr"], encoding="utf-8", errors="replace") as err:
                return subprocess.CompletedProcess(["<preloaded vllm>", "-c", "..."] + job["argv"], answer["returncode"], out.read(),
                                                   err.read())
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def stop(self, kill=False):
        """Stop the server (idempotent). It holds nothing to save, so it gets SIGTERM once its job pipe is closed (an
        orderly exit of a process with vLLM and torch imported takes about 2 s); ``kill`` ends it and a running job's
        fork (its process group: it runs in a session of its own) with SIGKILL."""
        if self.proc is None:
            return
        for stream in (self._jobs, self._answers):
            try:
                stream.close()
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None
