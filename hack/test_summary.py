"""Print the suite's closing table from the tiers' JUnit reports: per tier the tests run, passed, failed, skipped and the
wall seconds, then the slowest tests of the whole run. Called by hack/test.sh at exit (also when a tier failed).

Usage: python hack/test_summary.py RESULTS_DIR
RESULTS_DIR holds `<tier>.xml` (pytest --junitxml) for pytest tiers and `tiers.tsv` (tier, rc, wall seconds, one line
per tier in run order) written by hack/test.sh.
"""
from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET

SLOWEST = 10


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


def main(results):
    rows, times = [], []
    try:
        with open(os.path.join(results, "tiers.tsv"), encoding="utf-8") as handle:
            tiers = [line.rstrip("\n").split("\t") for line in handle if line.strip()]
    except OSError:
        tiers = []
    for tier, rc, seconds in tiers:
        counts, tier_times = read_junit(os.path.join(results, tier + ".xml"))
        times.extend((sec, tier, name) for sec, name in tier_times)
        status = "passed" if rc == "0" else "FAILED (exit %s)" % rc
        if counts is None:
            rows.append((tier, "-", "-", "-", "-", seconds, status))
        else:
            rows.append((tier, counts["tests"], counts["passed"], counts["failed"], counts["skipped"], seconds, status))
    total = sum(int(r[5]) for r in rows)
    print("\n===== test summary =====")
    print("%-12s %7s %7s %7s %8s %8s  %s" % ("tier", "tests", "passed", "failed", "skipped", "wall s", "result"))
    for row in rows:
        print("%-12s %7s %7s %7s %8s %8s  %s" % row)
    tests = sum(r[1] for r in rows if r[1] != "-")
    print("%-12s %7d %7s %7s %8s %8d  (%d min %02d s)" % ("total", tests, "", "", "", total, total // 60, total % 60))
    if times:
        print("\nslowest %d tests:" % SLOWEST)
        for seconds, tier, name in sorted(times, reverse=True)[:SLOWEST]:
            print("%8.1f s  %-12s %s" % (seconds, tier, name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
