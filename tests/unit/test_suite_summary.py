"""hack/test_summary.py: the closing table of `make test` shows each tier's budget and names a tier over it."""
from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _summary():
    spec = importlib.util.spec_from_file_location("test_summary_script", os.path.join(ROOT, "hack", "test_summary.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.integration.test_a" name="test_slow" time="120.5"/>
<testcase classname="tests.integration.test_a" name="test_fails" time="1.0"><failure message="x"/></testcase>
<testcase classname="tests.integration.test_b" name="test_skip" time="0.1"><skipped message="y"/></testcase>
</testsuite></testsuites>"""


def _write(tmp_path, tiers):
    (tmp_path / "tiers.tsv").write_text("".join("%s\t0\t%d\n" % kv for kv in tiers))
    (tmp_path / "integration.xml").write_text(JUNIT)
    # two xdist workers' cost records (tests/conftest.py writes them)
    (tmp_path / "integration-cost-gw0.jsonl").write_text(
        '{"test": "tests/integration/test_a.py::test_slow", "wall": 120.5, "cpu": 200.0, "playbooks": 4, "playbook_cpu": 150.0, '
        '"playbook_wall": 110.0}\n')
    (tmp_path / "integration-cost-gw1.jsonl").write_text(
        '{"test": "tests/integration/test_b.py::test_cheap", "wall": 10.0, "cpu": 50.0, "playbooks": 1, "playbook_cpu": 50.0, '
        '"playbook_wall": 9.0}\n')


def test_table_prints_budgets_and_names_the_tier_over_its_budget(tmp_path, capsys):
    _write(tmp_path, [("prepare", 1), ("lint", 30), ("sanity", 230), ("units", 100), ("integration", 950), ("e2e", 500)])
    assert _summary().main(str(tmp_path)) == 0
    out = capsys.readouterr().out
    table = out[out.index("===== test summary"):].split("\n\n")[0]
    rows = {line.split()[0]: line for line in table.splitlines()[1:] if line.strip()}
    # integration: 3 tests, 1 passed, 1 failed, 1 skipped, 950 s of its 900 s budget, named as over it
    assert rows["integration"].split()[1:8] == ["3", "1", "1", "1", "950", "900", "passed;"], rows["integration"]
    assert "OVER BUDGET (integration)" in rows["integration"]
    # lint and sanity share one budget of 240 s: 260 s in all is over it, and both rows say so
    assert "240 (lint+sanity)" in rows["lint"] and "OVER BUDGET (lint+sanity)" in rows["sanity"]
    assert "OVER" not in rows["units"] and "OVER" not in rows["e2e"] and "180" in rows["units"] and "600" in rows["e2e"]
    assert "over budget: integration took 950 s of its 900 s" in out and "over budget: lint+sanity took 260 s" in out
    assert "over budget: e2e" not in out and "over budget: units" not in out
    # the total against the 30 minutes of a warm machine, and the slowest test first
    assert rows["total"].split()[1:4] == ["3", "1811", "1800"] and "OVER BUDGET" in rows["total"]
    assert out.index("120.5 s") < out.index("1.0 s")


def test_within_budget_names_nothing(tmp_path, capsys):
    _write(tmp_path, [("lint", 20), ("sanity", 100), ("units", 100), ("integration", 800)])
    _summary().main(str(tmp_path))
    out = capsys.readouterr().out
    assert "OVER" not in out and "over budget" not in out
    assert "lint+sanity 120/240 s" in out and "integration 800/900 s" in out


def test_cost_table_sums_the_workers_and_lists_the_most_cpu_first(tmp_path, capsys):
    _write(tmp_path, [("units", 100), ("integration", 800)])
    _summary().main(str(tmp_path))
    out = capsys.readouterr().out
    # 250 CPU s in tests, 5 playbook runs with 200 CPU s (80%), 40 CPU s a run
    line = [row for row in out.splitlines() if row.startswith("integration ") and "CPU in tests" in row][0]
    assert "CPU in tests     250 s" in line and "5 ansible-playbook runs" in line and "200 CPU s (80%)" in line and "40.0 CPU s a run" in line
    most = out[out.index("most CPU"):]
    assert most.index("test_a.py::test_slow") < most.index("test_b.py::test_cheap")
    assert "units " not in out[out.index("cost per tier"):out.index("most CPU")]  # no records: no line


def test_control_planes_are_summed_over_the_workers_with_their_most_frequent_requests(tmp_path, capsys):
    _write(tmp_path, [("integration", 950)])
    (tmp_path / "integration-cost-controlplane-gw0.json").write_text(
        '{"worker": "gw0", "cpu": {"kube-apiserver": 100.0, "etcd": 20.0}, "requests": {"LIST pods": 2000, "GET namespaces": 10}}')
    (tmp_path / "integration-cost-controlplane-gw1.json").write_text(
        '{"worker": "gw1", "cpu": {"kube-apiserver": 50.5, "etcd": 5.0}, "requests": {"LIST pods": 1000, "LIST batch/jobs": 1500}}')
    assert _summary().main(str(tmp_path)) == 0
    out = capsys.readouterr().out
    line = out[out.index("control planes (tests/testbed, one per worker):"):].splitlines()[1]
    assert line.startswith("integration  2 control plane(s): etcd 25, kube-apiserver 150 CPU s; 4510 API requests, most: ")
    assert line.endswith("most: LIST pods 3000, LIST batch/jobs 1500, GET namespaces 10")
