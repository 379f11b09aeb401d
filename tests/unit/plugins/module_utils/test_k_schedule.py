"""A k for each load (bench/k_schedule.py): best k per load from that load's curve and cost, the schedule's
hysteresis, its bounds, and vLLM's rules for the result. Expected values are worked by hand in the comments."""

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import k_schedule as ks
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core


def _point(load, cand_tpot, kind="request_rate", base_tpot=10.0, e2el_mean=500.0, completed=20, duration=10.0):
    """Curve r = 0.8, 0.6, 0.4 (100 drafts at k=3): mean acceptance length 2.8, so
    verify_cost_ratio = (cand_tpot * 2.8 / base_tpot - 1) / 3."""
    acceptance = {"num_drafts": 100, "num_accepted_tokens": 180, "accepted_tokens_per_position": [80, 60, 40]}
    return {"kind": kind, "load": load,
            "baseline": {"tpot_ms": {"median": base_tpot}, "output_throughput": 100.0, "completed": completed, "duration_s": duration},
            "candidate": {"summary": {"tpot_ms": {"median": cand_tpot}, "output_throughput": 150.0, "completed": completed,
                                      "duration_s": duration, "e2el_ms": {"mean": e2el_mean}}, "acceptance": acceptance}}


def test_best_k_falls_as_the_verify_cost_measured_at_each_load_grows():
    # cost 0.2: gains 1.8/1.2=1.5, 2.4/1.4=1.714, 2.8/1.6=1.75 -> k=3
    # cost 0.5: 1.8/1.5=1.2, 2.4/2.0=1.2, 2.8/2.5=1.12 -> k=1 (the smaller k on a tie)
    # cost 1.0: 0.9, 0.8, 0.7, all below the baseline's 1.0 -> k=0 (no drafts)
    points = [_point(1, 1.6 * 10 / 2.8), _point(2, 2.5 * 10 / 2.8), _point(4, 4.0 * 10 / 2.8)]
    rows = ks.best_k_per_load(points, current_k=3)
    assert [r["best_k"] for r in rows] == [3, 1, 0]
    assert [round(r["verify_cost_ratio"], 9) for r in rows] == [0.2, 0.5, 1.0]
    gains = {g["k"]: g["expected_gain"] for g in rows[0]["gains"]}
    assert gains == pytest.approx({0: 1.0, 1: 1.5, 2: 2.4 / 1.4, 3: 1.75})
    assert rows[0]["measured_speedup"] == 1.5


def test_best_k_per_load_keeps_to_the_candidates_and_says_what_is_missing():
    point = _point(1, 1.6 * 10 / 2.8)
    assert ks.best_k_per_load([point], current_k=3, k_candidates=[1, 2])[0]["best_k"] == 2
    bare = dict(point, candidate={"summary": point["candidate"]["summary"]})
    row = ks.best_k_per_load([bare], current_k=3)[0]
    assert row["best_k"] is None and row["reason"] == "not measured: no acceptance counts on the candidate"
    with pytest.raises(ValidationError) as err:
        ks.best_k_per_load([point], current_k=None)
    assert err.value.field == "current_k"


def test_batch_size_is_the_concurrency_or_the_mean_in_flight():
    assert ks.batch_size_of(_point(6, 5.0, kind="concurrency"))[0] == 6
    # 40 requests x 2.0 s mean E2EL over 10 s: 8 in flight on average
    assert ks.batch_size_of(_point(4.0, 5.0, e2el_mean=2000.0, completed=40))[0] == 8
    assert ks.batch_size_of(_point(0.5, 5.0, e2el_mean=100.0, completed=5))[0] == 1  # 0.05 in flight: at least 1
    missing = _point(1, 5.0)
    missing["candidate"]["summary"]["e2el_ms"] = {"mean": None}
    assert ks.batch_size_of(missing)[0] is None


def _row(batch, gains, load=None):
    best = max(sorted(gains), key=lambda k: gains[k])
    return {"kind": "concurrency", "load": load or batch, "batch_size": batch, "best_k": best,
            "gains": [{"k": k, "expected_gain": g} for k, g in sorted(gains.items())], "reason": ""}


HYSTERESIS_ROWS = [
    _row(1, {0: 1.0, 1: 1.5, 2: 1.7, 3: 1.75}),      # best 3 = the deployed k: hold 3
    _row(2, {0: 1.0, 1: 1.5, 2: 1.72, 3: 1.70}),     # best 2, only 1.2% over k=3: hold 3
    _row(4, {0: 1.0, 1: 1.4, 2: 1.6, 3: 1.45}),      # best 2, 10.3% over k=3: change to 2
    _row(8, {0: 1.0, 1: 1.3, 2: 1.4, 3: 1.5}),       # best 3, a rise (7.1%): noted, hold 2
    _row(16, {0: 1.0, 1: 1.02, 2: 0.9, 3: 0.8}),     # best 1, 13.3% over k=2: change to 1
    _row(32, {0: 1.0, 1: 0.97, 2: 0.9, 3: 0.8}),     # best 0, 3.1% over k=1: hold 1
    _row(64, {0: 1.0, 1: 0.9, 2: 0.8, 3: 0.7}),      # best 0, 11.1% over k=1: change to 0
]


def test_hysteresis_changes_k_only_beyond_the_threshold_and_never_upwards():
    out = ks.derive_schedule(HYSTERESIS_ROWS, num_speculative_tokens=3, min_gain=0.05)
    assert [s["k"] for s in out["steps"]] == [3, 3, 2, 2, 1, 1, 0]
    assert [s["changed"] for s in out["steps"]] == [False, False, True, False, True, False, True]
    assert out["schedule"] == [[1, 3, 3], [4, 15, 2], [16, 63, 1], [64, 64, 0]]
    assert out["describe"] == "1-3: k=3; 4-15: k=2; 16-63: k=1; 64+: k=0"
    rises = [n for n in out["notes"] if "rising" in n]
    assert len(rises) == 1 and "batch size 8" in rises[0] and "k=3 is predicted 7.1% faster than the held k=2" in rises[0]


def test_without_a_threshold_the_schedule_follows_every_fall():
    out = ks.derive_schedule(HYSTERESIS_ROWS, num_speculative_tokens=3, min_gain=0.0)
    assert [s["k"] for s in out["steps"]] == [3, 2, 2, 2, 1, 0, 0]
    assert out["schedule"] == [[1, 1, 3], [2, 15, 2], [16, 31, 1], [32, 64, 0]]


def test_neighbouring_noise_does_not_flip_the_schedule():
    # the best k alternates 2, 3, 2, 3 by 1-2%: one k throughout
    rows = [_row(b, {0: 1.0, 1: 1.4, 2: 1.6 + (0.02 if i % 2 == 0 else 0.0), 3: 1.6 + (0.0 if i % 2 == 0 else 0.02)})
            for i, b in enumerate((1, 2, 4, 8))]
    assert [r["best_k"] for r in rows] == [2, 3, 2, 3]
    out = ks.derive_schedule(rows, num_speculative_tokens=3)
    assert out["schedule"] == [[1, 8, 3]]
    assert any("a fixed num_speculative_tokens does the same" in n for n in out["notes"])


def test_schedule_is_bounded_by_the_deployed_k():
    rows = [_row(1, {0: 1.0, 1: 1.2, 2: 1.5, 3: 1.9}), _row(8, {0: 1.0, 1: 1.3, 2: 1.2, 3: 1.1})]
    out = ks.derive_schedule(rows, num_speculative_tokens=2)
    assert out["schedule"] == [[1, 7, 2], [8, 8, 1]]
    assert max(entry[2] for entry in out["schedule"]) <= 2


def test_two_loads_at_one_batch_size_take_the_busier_ones_k():
    rows = [_row(1, {0: 1.0, 1: 1.2, 2: 1.5}, load=0.5), _row(1, {0: 1.0, 1: 1.4, 2: 1.1}, load=1.0), _row(4, {0: 1.0, 1: 1.3, 2: 1.0})]
    assert ks.derive_schedule(rows, num_speculative_tokens=2)["schedule"] == [[1, 4, 1]]


def test_unmeasured_loads_are_named_and_none_measured_gives_no_schedule():
    missing = {"kind": "request_rate", "load": 2.0, "batch_size": None, "best_k": None, "gains": [], "reason": "not measured: no TPOT on one side"}
    out = ks.derive_schedule([missing], num_speculative_tokens=3)
    assert out["schedule"] is None
    assert out["notes"][0] == "load 2 is left out of the schedule: not measured: no TPOT on one side"


@pytest.mark.parametrize("kwargs, field", [({"num_speculative_tokens": 0}, "num_speculative_tokens"),
                                           ({"num_speculative_tokens": 3, "min_gain": 1.5}, "k_schedule_min_gain")])
def test_derive_schedule_refuses_bad_bounds(kwargs, field):
    with pytest.raises(ValidationError) as err:
        ks.derive_schedule(HYSTERESIS_ROWS, **kwargs)
    assert err.value.field == field


def test_the_derived_schedule_is_a_valid_speculative_config_from_0_24_only():
    schedule = ks.derive_schedule(HYSTERESIS_ROWS, num_speculative_tokens=3)["schedule"]
    config = {"method": "draft_model", "model": "/mnt/models/draft", "num_speculative_tokens": 3,
              "num_speculative_tokens_per_batch_size": schedule}
    assert core.validate(config, vllm_version="0.32.0").config["num_speculative_tokens_per_batch_size"] == schedule
    with pytest.raises(ValidationError) as err:
        core.validate(config, vllm_version="0.23.0")
    assert err.value.field == "config.num_speculative_tokens_per_batch_size"
