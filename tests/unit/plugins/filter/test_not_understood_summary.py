"""Filter alauda.spec_decoding.not_understood_summary: the verify role's line, from vllm/not_understood.summary_line."""
from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.filter.not_understood_summary import FilterModule, not_understood_summary


def test_registered_name():
    assert FilterModule().filters()["not_understood_summary"] is not_understood_summary


def test_each_reason_once_in_the_order_first_seen_and_empty_when_nothing_to_say():
    items = [{"source": "engine_line", "name": "a", "reason": "field a is new"},
             {"source": "metrics", "name": "b", "reason": "metric b is new"},
             {"source": "engine_line", "name": "a", "reason": "field a is new", "pod": "p2"}]
    assert not_understood_summary(items) == "not understood: field a is new | metric b is new"
    assert not_understood_summary([]) == ""
