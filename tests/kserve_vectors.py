"""The one way a KServe test case ported as data (tests/fixtures/kserve/<name>, read by tests.paths.kserve_vectors;
each case names the Go test and the KServe tag it comes from) is checked, for the collection's functions and the test
bed's stand-ins alike: both sides are then pinned to KServe, not to each other."""
from __future__ import annotations


def check(case, readers):
    """Run ``case`` through ``readers[case["check"]](input)`` (None: accepted; a string: KServe's error; else the value
    asked for) and compare with what KServe's test expects."""
    got = readers[case["check"]](case["input"])
    want = case["expected"]
    if "accept" in want:
        assert got is None, got
    elif "error" in want:
        assert got and want["error"] in got, got
    else:
        assert got == want, got
