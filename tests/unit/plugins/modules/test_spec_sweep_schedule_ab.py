"""``spec_sweep``'s A/B of a k schedule against the best fixed k, in-process against the paced loopback servers of
test_spec_sweep_module.py: the candidate (k=3) is the fixed side, and a server paced as the candidate alone and at 60% of
its chunk gap from two requests in flight on (by construction) stands for the server running the schedule."""
import json

import pytest

from tests.loopback_http import serving
from tests.module_run import run_module
from tests.paced_server import paced_handler
from tests.unit.plugins.modules.test_spec_sweep_module import (  # noqa: F401 pylint: disable=unused-import
    PER_SIDE, args, candidate_slowdown, posts, servers)


@pytest.fixture(scope="module")
def scheduled():
    handler = paced_handler("paced-schedule", 0.010, 0.010, lambda n: candidate_slowdown(n) * (1.0 if n <= 1 else 0.6),
                            spec_rates=[0.9, 0.1, 0.05])
    with serving(handler) as url:
        yield url, handler


def test_schedule_ab_at_the_loads_where_its_k_moves_and_resumed(servers, scheduled, tmp_path):  # pylint: disable=redefined-outer-name
    ab = {"k_schedule": True, "verify_cost_ratio": 0.2, "schedule_url": scheduled[0], "fixed_url": servers["candidate"][0]}
    before, sched_before = posts(servers), scheduled[1].state["posts"]
    out = run_module("spec_sweep", args(servers, tmp_path, **ab))
    assert not out.failed, out.msg
    conf = out["k"]["schedule_confirmation"]
    # the derived schedule drafts k=3 at batch 1 and k=1 from 2 on: the A/B runs at the lowest (1) and highest (6) loads
    assert out["k"]["schedule"]["schedule"] == conf["schedule"]
    assert [(r["load"], r["batch_size"], r["scheduled_k"]) for r in conf["loads"]] == [(1, 1, 3), (6, 6, 1)]
    assert conf["fixed_k"] == 3  # read from the fixed side's /metrics (3 per-position series)
    after = posts(servers)
    assert scheduled[1].state["posts"] - sched_before == 2 * PER_SIDE  # the schedule side, at two loads
    assert after["candidate"] - before["candidate"] == (4 + 2) * PER_SIDE  # the sweep's 4 loads and the fixed side's 2
    saved = json.load(open(out["report_json"], encoding="utf-8"))
    items = [m for m in saved["measurements"] if m["side"] in ("schedule_fixed", "schedule")]
    assert [(m["load"], m["side"], m["k"]) for m in items] == [(1, "schedule_fixed", 3), (1, "schedule", None),
                                                               (6, "schedule_fixed", 3), (6, "schedule", None)]
    for row, (fixed, sched) in zip(conf["loads"], (items[:2], items[2:])):
        assert len(fixed["tpot_samples_ms"]) == len(sched["tpot_samples_ms"]) == 5
        assert row["speedup"] == pytest.approx(fixed["summary"]["tpot_ms"]["median"] / sched["summary"]["tpot_ms"]["median"])
        assert row["schedule"]["itl_ms"] == sched["summary"]["itl_ms"]["median"]
    alone, busy = conf["loads"]
    assert busy["speedup"] > 1.3 and busy["verdict"] == "confirmed", busy  # built 40% faster: beyond 5 paced requests' spread
    assert 0.8 < alone["speedup"] < 1.25, alone  # paced alike where both run k=3
    # where both run k=3 the servers are a control: a difference beyond the noise there leaves the A/B undecided
    assert conf["status"] == ("confirmed" if alone["verdict"] == "inconclusive" else "inconclusive"), conf
    md = open(out["report_markdown"], encoding="utf-8").read()
    assert "## The k schedule against the best fixed k" in md and "**Schedule A/B: %s**" % conf["status"] in md
    assert "| 6 conc. | 6 | 1 | 3 |" in md
    assert out["checks"]["schedule"]["metrics"] == "vllm:spec_decode_* counters, 3 per-position series"

    mark = posts(servers)
    again = run_module("spec_sweep", args(servers, tmp_path, resume_from=out["report_json"], report_dir=str(tmp_path / "again"), **ab))
    assert not again.failed, again.msg
    assert (again["resumed"], again["measured"]) == (12, 0) and posts(servers) == mark and scheduled[1].state["posts"] == sched_before + 2 * PER_SIDE
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
