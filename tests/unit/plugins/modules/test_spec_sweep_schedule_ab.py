"""``spec_sweep``'s A/B of a k schedule against the best fixed k, in-process against the paced loopback servers of
test_spec_sweep_module.py: the candidate (k=3) is the fixed side, and the k=1 server (60% of the candidate's chunk gap
at every load, by construction) stands for the server running the schedule."""
import json

import pytest

from tests.module_run import run_module
from tests.unit.plugins.modules.test_spec_sweep_module import PER_SIDE, args, posts, servers  # noqa: F401 pylint: disable=unused-import


def test_schedule_ab_at_the_loads_where_its_k_moves_and_resumed(servers, tmp_path):  # pylint: disable=redefined-outer-name
    ab = {"k_schedule": True, "verify_cost_ratio": 0.2, "schedule_url": servers["confirm"][0], "fixed_url": servers["candidate"][0]}
    before = posts(servers)
    out = run_module("spec_sweep", args(servers, tmp_path, **ab))
    assert not out.failed, out.msg
    conf = out["k"]["schedule_confirmation"]
    # the derived schedule drafts k=3 at batch 1 and k=1 from 2 on: the A/B runs at the lowest (1) and highest (6) loads
    assert out["k"]["schedule"]["schedule"] == conf["schedule"]
    assert [(r["load"], r["batch_size"], r["scheduled_k"]) for r in conf["loads"]] == [(1, 1, 3), (6, 6, 1)]
    assert conf["fixed_k"] == 3  # read from the fixed side's /metrics (3 per-position series)
    after = posts(servers)
    assert after["confirm"] - before["confirm"] == 2 * PER_SIDE  # the schedule side, at two loads
    assert after["candidate"] - before["candidate"] == (4 + 2) * PER_SIDE  # the sweep's 4 loads and the fixed side's 2
    saved = json.load(open(out["report_json"], encoding="utf-8"))
    items = [m for m in saved["measurements"] if m["side"] in ("schedule_fixed", "schedule")]
    assert [(m["load"], m["side"], m["k"]) for m in items] == [(1, "schedule_fixed", 3), (1, "schedule", None),
                                                               (6, "schedule_fixed", 3), (6, "schedule", None)]
    for row, (fixed, sched) in zip(conf["loads"], (items[:2], items[2:])):
        assert len(fixed["tpot_samples_ms"]) == len(sched["tpot_samples_ms"]) == 5
        assert row["speedup"] == pytest.approx(fixed["summary"]["tpot_ms"]["median"] / sched["summary"]["tpot_ms"]["median"])
        assert row["schedule"]["itl_ms"] == sched["summary"]["itl_ms"]["median"]
        # built 40% faster at every load: well beyond the spread of 5 paced requests
        assert row["speedup"] > 1.3 and row["verdict"] == "confirmed", row
    assert conf["status"] == "confirmed"
    md = open(out["report_markdown"], encoding="utf-8").read()
    assert "## The k schedule against the best fixed k" in md and "**Schedule A/B: confirmed**" in md
    assert "| 6 conc. | 6 | 1 | 3 |" in md
    assert out["checks"]["schedule"]["metrics"] == "vllm:spec_decode_* counters, 1 per-position series"

    mark = posts(servers)
    again = run_module("spec_sweep", args(servers, tmp_path, resume_from=out["report_json"], report_dir=str(tmp_path / "again"), **ab))
    assert not again.failed, again.msg
    assert (again["resumed"], again["measured"]) == (12, 0) and posts(servers) == mark
    assert again["k"]["schedule_confirmation"]["loads"] == conf["loads"]


def test_schedule_ab_refusals_before_any_request(servers, tmp_path):  # pylint: disable=redefined-outer-name
    mark = posts(servers)
    lone = run_module("spec_sweep", args(servers, tmp_path, schedule_url=servers["confirm"][0]))
    assert lone.failed and "fixed_url" in lone.msg
    wrong_k = run_module("spec_sweep", args(servers, tmp_path, schedule_url=servers["confirm"][0], fixed_url=servers["candidate"][0], fixed_k=2))
    assert wrong_k.failed and wrong_k["field"] == "fixed_url" and "not the k=2" in wrong_k.msg
    assert posts(servers) == mark
    # named loads that were not swept are refused after the sweep, before the A/B's first request
    out = run_module("spec_sweep", args(servers, tmp_path, concurrencies=[1, 2], schedule_url=servers["confirm"][0],
                                        fixed_url=servers["candidate"][0], schedule=[[1, 1, 3], [2, 64, 1]], schedule_loads=[1, 8]))
    assert out.failed and out["field"] == "schedule_loads" and "8 is not a swept concurrency" in out.msg
    assert posts(servers)["confirm"] == mark["confirm"]
