"""Make `ansible_collections.alauda.spec_decoding` importable when pytest runs from the checkout.

`make setup` links the checkout into .build/collections; this falls back to creating that link so a
plain `pytest tests/unit` works too.
"""
import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_COLLECTIONS = os.path.join(_ROOT, ".build", "collections")
_LINK = os.path.join(_COLLECTIONS, "ansible_collections", "alauda", "spec_decoding")

if not os.path.exists(_LINK):
    os.makedirs(os.path.dirname(_LINK), exist_ok=True)
    os.symlink(_ROOT, _LINK)
if _COLLECTIONS not in sys.path:
    sys.path.insert(0, _COLLECTIONS)


# ------------------------------------------------------------------------------------------------------------------
# No silent skips: a skip whose reason is not in tests/allowed_skips.yml (the skips that are by design, each with its
# reason) fails the session, with the skipped tests and reasons listed. A skip for a missing file, library or tool is
# how a regression hides on one machine while another one is green.

_ALLOWED_SKIPS_FILE = os.path.join(_ROOT, "tests", "allowed_skips.yml")
_UNEXPECTED_SKIPS = []
_ALLOWED = []


def _allowed_skips():
    """[(compiled reason pattern, why)] from tests/allowed_skips.yml, read once."""
    if not _ALLOWED:
        import re  # pylint: disable=import-outside-toplevel
        import yaml  # pylint: disable=import-outside-toplevel
        with open(_ALLOWED_SKIPS_FILE, encoding="utf-8") as handle:
            entries = yaml.safe_load(handle) or []
        _ALLOWED.extend((re.compile(entry["reason"]), entry["why"]) for entry in entries)
    return _ALLOWED


def _skip_reason(report):
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = longrepr[2]
    else:
        reason = str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def _note_skip(report):
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if not any(pattern.search(reason) for pattern, _why in _allowed_skips()):
        _UNEXPECTED_SKIPS.append((report.nodeid, reason))


def pytest_runtest_logreport(report):
    _note_skip(report)


def pytest_collectreport(report):
    _note_skip(report)


def pytest_sessionfinish(session, exitstatus):
    if _UNEXPECTED_SKIPS and exitstatus in (0, 5):  # 0: all passed, 5: nothing ran (every test skipped)
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if not _UNEXPECTED_SKIPS:
        return
    terminalreporter.section("skips not allowed by tests/allowed_skips.yml", red=True)
    for nodeid, reason in _UNEXPECTED_SKIPS:
        terminalreporter.line("%s: %s" % (nodeid, reason))
    terminalreporter.line("%d test(s) skipped for a reason that is not by design: the session fails. Provide what is missing, "
                          "or, if the skip is by design, add its reason to tests/allowed_skips.yml with why." % len(_UNEXPECTED_SKIPS))


# ------------------------------------------------------------------------------------------------------------------
# Cost per test: wall seconds, CPU seconds (this process's threads, e.g. the test bed's stand-ins, plus its waited-for
# children: ansible-playbook runs, module and tool processes) and the ansible-playbook runs it made. hack/test.sh sets
# ALAUDA_TEST_COST to a path prefix; each pytest process (each xdist worker) appends one JSON line per test to
# `<prefix>-<worker>.jsonl`, and hack/test_summary.py prints the tests that cost the most CPU. On 2 busy cores CPU is
# what a test really costs the tier (docs/DEVELOPING.md, "Keeping the suite fast"). A child's CPU is counted when it is
# waited for: the test whose teardown stops a long-lived helper (a control plane, a registry) is charged all of it.

def _cpu_now():
    import resource  # pylint: disable=import-outside-toplevel
    from tests.ansible_run import children_cpu  # pylint: disable=import-outside-toplevel
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + children_cpu()


def _write_cost(item, wall, cpu, runs):
    import json  # pylint: disable=import-outside-toplevel
    prefix = os.environ.get("ALAUDA_TEST_COST")
    if not prefix:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    record = {"test": item.nodeid, "wall": round(wall, 2), "cpu": round(cpu, 2), "playbooks": len(runs),
              "playbook_cpu": round(sum(r[2] for r in runs), 2), "playbook_wall": round(sum(r[1] for r in runs), 2)}
    with open("%s-%s.jsonl" % (prefix, worker), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
    import time  # pylint: disable=import-outside-toplevel
    from tests.ansible_run import PLAYBOOK_RUNS  # pylint: disable=import-outside-toplevel
    wall0, cpu0, runs0 = time.monotonic(), _cpu_now(), len(PLAYBOOK_RUNS)
    yield
    _write_cost(item, time.monotonic() - wall0, _cpu_now() - cpu0, PLAYBOOK_RUNS[runs0:])
