"""Print the suite's closing table from the tiers' JUnit reports: per tier the tests run, passed, failed, skipped, the
wall seconds and the tier's time budget, then the slowest tests of the whole run. Called by hack/test.sh at exit (also
when a tier failed).

Usage: python hack/test_summary.py RESULTS_DIR
RESULTS_DIR holds `<tier>.xml` (pytest --junitxml) for pytest tiers and `tiers.tsv` (tier, rc, wall seconds, one line
per tier in run order) written by hack/test.sh.

The budgets are those of the suite-time issue (a warm 2-core machine: 30 minutes in all). A tier over its budget is
named in the table and in a line after it; the run is not failed for time (these machines are noisy), but the note
of the change that went over says why (docs/DEVELOPING.md, "Keeping the suite fast").
"""
from __future__ import annotations

import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

SLOWEST = 10
# Budget groups: (label, tiers whose wall seconds add up, budget seconds). `prepare` is the one-time build on a fresh
# machine (well under a second when warm) and has no budget of its own; the 30 minutes are for a warm machine.
BUDGETS = (
    ("lint+sanity", ("lint", "sanity"), 240),
    ("units", ("units",), 180),
    ("build", ("build",), 60),
    ("integration", ("integration",), 900),
    ("e2e", ("e2e",), 600),
)
TOTAL_BUDGET = 1800


def read_junit(path):
    """(counts, [(seconds, test id)]) of one pytest JUnit report; counts is None when the report is absent."""
    if not os.path.isfile(path):
        return None, []
    counts = {"tests": 0, "passed": 0, "failed": 0, "skipped": 0}
    times = []
    for case in ET.parse(path).getroot().iter("testcase"):
        counts["tests"] += 1
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        counts[outcome] += 1
        name = "%s::%s" % (case.get("classname", "").replace(".", "/") + ".py", case.get("name", ""))
        times.append((float(case.get("time") or 0.0), name))
    return counts, times


def read_costs(results, tier):
    """The per-test cost records of one tier (tests/conftest.py writes <tier>-cost-<worker>.jsonl): a list of dicts with
    test, wall, cpu, playbooks, playbook_cpu, playbook_wall."""
    records = []
    for path in sorted(glob.glob(os.path.join(results, "%s-cost-*.jsonl" % tier))):
        with open(path, encoding="utf-8") as handle:
            records.extend(json.loads(line) for line in handle if line.strip())
    return records


def cost_lines(results, tiers):
    """Per tier: CPU seconds spent in its tests and in their ansible-playbook runs; then the tests that cost the most CPU."""
    lines, every = [], []
    for tier in tiers:
        records = read_costs(results, tier)
        if not records:
            continue
        every.extend((r["cpu"], tier, r) for r in records)
        cpu = sum(r["cpu"] for r in records)
        runs = sum(r["playbooks"] for r in records)
        pb_cpu = sum(r["playbook_cpu"] for r in records)
        lines.append("%-12s CPU in tests %7.0f s; %4d ansible-playbook runs, %6.0f CPU s (%.0f%%), %.1f CPU s a run" % (
            tier, cpu, runs, pb_cpu, 100 * pb_cpu / cpu if cpu else 0, pb_cpu / runs if runs else 0))
    if every:
        lines.append("")
        lines.append("most CPU (CPU s, wall s, ansible-playbook runs; a test whose teardown stops a long-lived helper, such as "
                     "a control plane or a registry, is charged that helper's whole CPU):")
        for cpu, tier, rec in sorted(every, key=lambda e: -e[0])[:SLOWEST]:
            lines.append("%8.1f %7.1f %3d  %-12s %s" % (cpu, rec["wall"], rec["playbooks"], tier, rec["test"]))
    return lines


def controlplane_lines(results, tiers):
    """Per tier: what its workers' control planes cost (tests/testbed/fixtures.py writes <tier>-cost-controlplane-<worker>.json
    with ALAUDA_TEST_COST): CPU seconds per process over the session and the API requests served, the most frequent first.
    The tests are charged this CPU only when a control plane stops; these lines say which requests caused it."""
    lines = []
    for tier in tiers:
        records = []
        for path in sorted(glob.glob(os.path.join(results, "%s-cost-controlplane-*.json" % tier))):
            with open(path, encoding="utf-8") as handle:
                records.append(json.load(handle))
        if not records:
            continue
        cpu, requests = {}, {}
        for record in records:
            for name, seconds in record.get("cpu", {}).items():
                cpu[name] = cpu.get(name, 0.0) + seconds
            for key, count in record.get("requests", {}).items():
                requests[key] = requests.get(key, 0.0) + count
        lines.append("%-12s %d control plane(s): %s CPU s; %d API requests, most: %s" % (
            tier, len(records), ", ".join("%s %.0f" % kv for kv in sorted(cpu.items())), sum(requests.values()),
            ", ".join("%s %d" % kv for kv in sorted(requests.items(), key=lambda kv: -kv[1])[:6])))
    return lines


def budget_rows(walls):
    """[(label, seconds, budget, over)] for every budget group with at least one tier that ran."""
    rows = []
    for label, tiers, budget in BUDGETS:
        ran = [walls[t] for t in tiers if t in walls]
        if ran:
            seconds = sum(ran)
            rows.append((label, seconds, budget, seconds > budget))
    return rows


def budget_of(tier):
    """The budget text of a tier's own row: its seconds, or the group it shares a budget with."""
    for label, tiers, budget in BUDGETS:
        if tier in tiers:
            return "%d" % budget if len(tiers) == 1 else "%d (%s)" % (budget, label)
    return "-"


def main(results):
    rows, times, walls = [], [], {}
    try:
        with open(os.path.join(results, "tiers.tsv"), encoding="utf-8") as handle:
            tiers = [line.rstrip("\n").split("\t") for line in handle if line.strip()]
    except OSError:
        tiers = []
    for tier, rc, seconds in tiers:
        walls[tier] = int(seconds)
        counts, tier_times = read_junit(os.path.join(results, tier + ".xml"))
        times.extend((sec, tier, name) for sec, name in tier_times)
        status = "passed" if rc == "0" else "FAILED (exit %s)" % rc
        if counts is None:
            rows.append((tier, "-", "-", "-", "-", seconds, budget_of(tier), status))
        else:
            rows.append((tier, counts["tests"], counts["passed"], counts["failed"], counts["skipped"], seconds, budget_of(tier), status))
    groups = budget_rows(walls)
    over = {label for label, _s, _b, is_over in groups if is_over}
    total = sum(walls.values())
    print("\n===== test summary =====")
    fmt = "%-12s %7s %7s %7s %8s %8s %20s  %s"
    print(fmt % ("tier", "tests", "passed", "failed", "skipped", "wall s", "budget s", "result"))
    for row in rows:
        tier = row[0]
        late = [label for label, tiers, _b in BUDGETS if tier in tiers and label in over]
        print(fmt % (row[:7] + (row[7] + ("; OVER BUDGET (%s)" % late[0] if late else ""),)))
    tests = sum(r[1] for r in rows if r[1] != "-")
    print(fmt % ("total", tests, "", "", "", total, TOTAL_BUDGET, "(%d min %02d s)%s" % (
        total // 60, total % 60, "; OVER BUDGET" if total > TOTAL_BUDGET else "")))
    if groups:
        print("\nbudgets (warm 2-core machine): " + ", ".join(
            "%s %d/%d s%s" % (label, seconds, budget, " OVER" if is_over else "") for label, seconds, budget, is_over in groups))
    for label, seconds, budget, is_over in groups:
        if is_over:
            print("over budget: %s took %d s of its %d s; say why in the change's note (docs/DEVELOPING.md)" % (label, seconds, budget))
    costs = cost_lines(results, [t for t, _rc, _s in tiers])
    if costs:
        print("\ncost per tier (CPU seconds: this machine has two cores, so every CPU second of a test is wall time of its tier):")
        print("\n".join(costs))
    planes = controlplane_lines(results, [t for t, _rc, _s in tiers])
    if planes:
        print("\ncontrol planes (tests/testbed, one per worker):")
        print("\n".join(planes))
    if times:
        print("\nslowest %d tests:" % SLOWEST)
        for seconds, tier, name in sorted(times, reverse=True)[:SLOWEST]:
            print("%8.1f s  %-12s %s" % (seconds, tier, name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
