"""spec_sweep: sweep input checks, break-even search, k model, target decision, resume (issue #18)."""
import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import num_speculative_tokens as k_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep as spec_sweep
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep_analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError


def side(ttft, tpot, tps, itl=None, completed=50, failed=0, bursts=0):
    """A bench_stats.summarize_run-shaped summary with the numbers the keep rule reads."""
    return {"completed": completed, "failed": failed, "burst_delivered": bursts, "output_throughput": tps,
            "ttft_ms": {"median": ttft, "p99": ttft * 2}, "tpot_ms": {"median": tpot, "p99": tpot * 2},
            "itl_ms": {"median": itl if itl is not None else tpot, "p99": (itl or tpot) * 2}}


BASE = side(100.0, 10.0, 100.0)


def point(load, cand, base=None, kind="request_rate"):
    return {"kind": kind, "load": load, "baseline": base or BASE, "candidate": cand}


# Candidate: TPOT 7, 8, 9, 12 ms against 10; TTFT 90, 95, 98, 101 against 100; tok/s always above the baseline.
CROSSING = [
    point(1, side(90.0, 7.0, 130.0)),
    point(2, side(95.0, 8.0, 120.0)),
    point(4, side(98.0, 9.0, 110.0)),
    point(8, side(101.0, 12.0, 105.0)),
]


# -- break_even ------------------------------------------------------------------------------------------------
def test_crossover_interpolated_between_bracketing_points():
    result = sweep_analysis.break_even(CROSSING)
    assert result["status"] == "crossed"
    assert result["last_keep_load"] == 4
    assert result["first_roll_back_load"] == 8
    # TPOT margins: (10 - 9) / 10 = 0.1 at 4, (10 - 12) / 10 = -0.2 at 8 -> 4 + 4 * 0.1 / 0.3
    assert result["crossover_by_metric"]["tpot"] == pytest.approx(4 + 4 * 0.1 / 0.3)
    # TTFT margins: 0.02 at 4, -0.01 at 8 -> 4 + 4 * 0.02 / 0.03 (later than TPOT)
    assert result["crossover_by_metric"]["ttft"] == pytest.approx(4 + 4 * 0.02 / 0.03)
    assert "throughput" not in result["crossover_by_metric"]
    assert result["crossed_first"] == "tpot"
    assert result["crossover_load"] == pytest.approx(16.0 / 3.0)
    assert 4 < result["crossover_load"] < 8
    assert [row["decision"] for row in result["points"]] == ["keep", "keep", "keep", "roll_back"]
    assert [row["speedup"] for row in result["points"]] == pytest.approx([1.3, 1.2, 1.1, 1.05])
    assert result["pays_again_at"] == []


def test_crossover_uses_the_keep_rule_tolerances_and_sorts_points():
    # TPOT tolerance 5%: limit 10.5, margins (10.5 - 9) / 10 = 0.15 and (10.5 - 12) / 10 = -0.15 -> 6.0
    result = sweep_analysis.break_even(list(reversed(CROSSING)), {"tpot": 0.05})
    assert result["crossover_by_metric"]["tpot"] == pytest.approx(6.0)
    assert result["crossed_first"] == "tpot"
    # with 30% TPOT tolerance only TTFT fails at 8: it crosses at 4 + 4 * 2/3
    result = sweep_analysis.break_even(CROSSING, {"tpot": 0.3})
    assert result["crossed_first"] == "ttft"
    assert result["crossover_load"] == pytest.approx(4 + 8.0 / 3.0)


def test_margins_are_relative_to_each_points_baseline():
    # the baseline slows down with load too: TPOT 10 -> 20 ms; the candidate 9 -> 24 ms
    pts = [point(4, side(90.0, 9.0, 130.0), base=side(100.0, 10.0, 100.0)),
           point(8, side(90.0, 24.0, 130.0), base=side(100.0, 20.0, 100.0))]
    # relative margins (10 - 9) / 10 = 0.1 and (20 - 24) / 20 = -0.2 -> 4 + 4 * 0.1 / 0.3 (absolute ms would give 4.8)
    assert sweep_analysis.break_even(pts)["crossover_load"] == pytest.approx(16.0 / 3.0)


def test_callable_keep_rule():
    calls = []

    def rule(_baseline, candidate, load):
        calls.append(load)
        ok = candidate["output_throughput"] >= 115.0
        return {"decision": "keep" if ok else "roll_back", "reasons": [] if ok else ["slow"],
                "checks": [{"metric": "throughput", "baseline": 100.0, "candidate": candidate["output_throughput"],
                            "limit": 115.0, "better": "higher"}]}

    result = sweep_analysis.break_even(CROSSING, rule)
    assert calls == [{"request_rate": 1}, {"request_rate": 2}, {"request_rate": 4}, {"request_rate": 8}]
    # margins (120 - 115) / 100 = 0.05 at 2, (110 - 115) / 100 = -0.05 at 4 -> 3.0
    assert (result["last_keep_load"], result["first_roll_back_load"]) == (2, 4)
    assert result["crossover_load"] == pytest.approx(3.0)


def test_pays_everywhere():
    result = sweep_analysis.break_even(CROSSING[:3])
    assert result["status"] == "pays_everywhere"
    assert result["crossover_load"] is None
    assert result["last_keep_load"] == 4 and result["first_roll_back_load"] is None
    assert "every measured load" in result["reason"] and "above the measured range" in result["reason"]


def test_pays_nowhere():
    result = sweep_analysis.break_even([point(1, side(120.0, 9.0, 110.0)), point(2, side(130.0, 11.0, 90.0))])
    assert result["status"] == "pays_nowhere"
    assert result["crossover_load"] is None and result["last_keep_load"] is None
    assert result["first_roll_back_load"] == 1
    assert "lowest measured load" in result["reason"] and "median TTFT got worse" in result["reason"]


def test_non_monotonic_sweep_names_the_loads_that_pay_again():
    pts = [point(1, side(90.0, 7.0, 130.0)), point(2, side(90.0, 11.0, 130.0)), point(3, side(90.0, 8.0, 130.0))]
    result = sweep_analysis.break_even(pts)
    assert (result["last_keep_load"], result["first_roll_back_load"]) == (1, 2)
    # TPOT margins 0.3 and -0.1 -> 1 + 0.3 / 0.4
    assert result["crossover_load"] == pytest.approx(1.75)
    assert result["pays_again_at"] == [3]


def test_failure_without_margin_gives_no_crossover():
    # every metric passes at 8, but the candidate's streams arrived in bursts (more than 10% of its requests)
    pts = CROSSING[:3] + [point(8, side(90.0, 7.0, 130.0, bursts=10))]
    result = sweep_analysis.break_even(pts)
    assert result["status"] == "crossed"
    assert result["first_roll_back_load"] == 8
    assert result["crossover_load"] is None and result["crossed_first"] is None
    assert "no margin to interpolate" in result["reason"] and "bursts" in result["reason"]


def test_side_dicts_with_summary_are_accepted():
    pts = [{"kind": "concurrency", "load": 1, "baseline": {"summary": BASE}, "candidate": {"summary": side(90.0, 7.0, 130.0)}},
           {"kind": "concurrency", "load": 4, "baseline": {"summary": BASE}, "candidate": {"summary": side(90.0, 13.0, 130.0)}}]
    result = sweep_analysis.break_even(pts)
    assert result["kind"] == "concurrency"
    # TPOT margins 0.3 and -0.3 -> 1 + 3 * 0.5
    assert result["crossover_load"] == pytest.approx(2.5)


@pytest.mark.parametrize("points, text", [
    ([], "no sweep points"),
    ([point(1, side(90.0, 7.0, 130.0)), point(1, side(90.0, 7.0, 130.0))], "load 1 is measured twice"),
    ([point(1, side(90.0, 7.0, 130.0)), point(2, side(90.0, 7.0, 130.0), kind="concurrency")], "mix"),
    ([{"kind": "request_rate", "load": 1, "baseline": BASE}], "no candidate measurement"),
    ([point(0, side(90.0, 7.0, 130.0))], "no load greater than 0"),
])
def test_bad_points(points, text):
    with pytest.raises(ValidationError) as err:
        sweep_analysis.break_even(points)
    assert err.value.field == "points" and text in str(err.value)


# -- decision_for_target ---------------------------------------------------------------------------------------
def test_decision_uses_the_point_at_or_above_target():
    result = sweep_analysis.decision_for_target(CROSSING, 5.0)
    assert result["load"] == 8 and result["exact"] is False
    assert result["decision"]["decision"] == "roll_back"
    assert result["speedup"] == pytest.approx(1.05)
    result = sweep_analysis.decision_for_target(CROSSING, 3.0)
    assert result["load"] == 4 and result["decision"]["decision"] == "keep"
    result = sweep_analysis.decision_for_target(CROSSING, 4.0)
    assert result["load"] == 4 and result["exact"] is True
    assert result["decision"]["load"] == {"request_rate": 4}


def test_decision_for_target_errors():
    with pytest.raises(ValidationError) as err:
        sweep_analysis.decision_for_target(CROSSING, 9.0)
    assert err.value.field == "target_qps" and "above every measured request rate (largest 8)" in str(err.value)
    with pytest.raises(ValidationError) as err:
        sweep_analysis.decision_for_target(CROSSING, 0)
    assert err.value.field == "target_qps"
    with pytest.raises(ValidationError) as err:
        sweep_analysis.decision_for_target([point(1, BASE, kind="concurrency")], 1.0)
    assert err.value.field == "target_qps" and "request-rate points" in str(err.value)


# -- recommend_k -----------------------------------------------------------------------------------------------
def _table(result):
    return [(row["k"], row["expected_tokens_per_step"], row["cost"], row["expected_gain"]) for row in result["table"]]


def test_collapse_at_slot_2_recommends_k1():
    result = k_model.recommend_k([0.6, 0.02, 0.01], 0.1, 3)
    # E = 1.6, 1.62, 1.63; cost = 1.1, 1.2, 1.3
    expected = [(1, 1.6, 1.1, 1.6 / 1.1), (2, 1.62, 1.2, 1.62 / 1.2), (3, 1.63, 1.3, 1.63 / 1.3)]
    for got, want in zip(_table(result), expected):
        assert got == pytest.approx(want)
    assert result["recommended_k"] == 1
    assert result["expected_gain"] == pytest.approx(1.6 / 1.1)
    assert result["pays"] is True
    assert result["conditional_rates"] == pytest.approx([0.6, 0.02 / 0.6, 0.5])


def test_flat_high_curve_recommends_largest_allowed_k():
    # vLLM's cumulative rates flat at 0.9: E(k) = 1 + 0.9 k against 1 + 0.1 k, rising with k
    result = k_model.recommend_k([0.9] * 5, 0.1, 5)
    assert result["recommended_k"] == 5
    assert result["expected_gain"] == pytest.approx(5.5 / 1.5)
    # capped by k_max
    assert k_model.recommend_k([0.9] * 5, 0.1, 3)["recommended_k"] == 3
    # a conditional 0.9 per slot (cumulative 0.9, 0.81, 0.729, ...) is also high enough for k=5
    result = k_model.recommend_k(k_model.cumulative_rates([0.9] * 5), 0.1, 5)
    assert result["recommended_k"] == 5
    assert result["expected_gain"] == pytest.approx((1 + 0.9 + 0.81 + 0.729 + 0.6561 + 0.59049) / 1.5)


def test_rates_are_used_as_cumulative_not_multiplied_again():
    # E(2) with vLLM rates [0.8, 0.6] is 1 + 0.8 + 0.6 = 2.4 (multiplying again would give 1 + 0.8 + 0.48)
    result = k_model.recommend_k([0.8, 0.6, 0.3, 0.1], 0.2, 4)
    gains = [row["expected_gain"] for row in result["table"]]
    assert gains == pytest.approx([1.8 / 1.2, 2.4 / 1.4, 2.7 / 1.6, 2.8 / 1.8])
    assert result["recommended_k"] == 2


def test_k_beyond_the_measured_depth_is_not_predicted():
    result = k_model.recommend_k([0.7, 0.5], 0.05, 10)
    assert result["k_limit"] == 2 and [row["k"] for row in result["table"]] == [1, 2]
    assert any("k above 2 is not predicted" in note for note in result["notes"])


def test_no_k_pays():
    result = k_model.recommend_k([0.05, 0.01], 0.5, 2)
    assert result["pays"] is False and result["recommended_k"] == 1
    assert result["expected_gain"] == pytest.approx(1.05 / 1.5)
    assert any("turn speculative decoding off" in note for note in result["notes"])


def test_zero_cost_ties_pick_the_smaller_k():
    assert k_model.recommend_k([0.5, 0.0, 0.0], 0.0, 3)["recommended_k"] == 1


@pytest.mark.parametrize("args, field, text", [
    (([], 0.1, 3), "per_position_rates", "is empty"),
    (([0.5, 0.7], 0.1, 3), "per_position_rates", "cumulative"),
    (([1.2], 0.1, 3), "per_position_rates", "not a fraction"),
    (([0.5], -0.1, 3), "verify_cost_ratio", ">= 0"),
    (([0.5], "x", 3), "verify_cost_ratio", ">= 0"),
    (([0.5], 0.1, 0), "k_max", ">= 1"),
    (([0.5], 0.1, 2.0), "k_max", ">= 1"),
])
def test_recommend_k_bad_input(args, field, text):
    with pytest.raises(ValidationError) as err:
        k_model.recommend_k(*args)
    assert err.value.field == field and text in str(err.value)


def test_verify_cost_ratio_from_an_ab():
    # candidate step = 6 ms * 2.5 tokens = 15 ms = 1.5 baseline steps of 10 ms -> (1.5 - 1) / 4
    assert k_model.verify_cost_ratio_from(10.0, 6.0, 2.5, 4) == pytest.approx(0.125)
    with pytest.raises(ValidationError) as err:
        k_model.verify_cost_ratio_from(10.0, 6.0, 0.5, 4)
    assert err.value.field == "mean_acceptance_length"
    with pytest.raises(ValidationError) as err:
        k_model.verify_cost_ratio_from(0, 6.0, 2.5, 4)
    assert err.value.field == "baseline_tpot_ms"


# -- validate_sweep --------------------------------------------------------------------------------------------
def test_valid_sweep_normalised():
    out = spec_sweep.validate_sweep(request_rates=[0.5, 1, 2, 4], concurrencies=[1, 4], num_speculative_tokens=[3, 1, 2],
                                    method="ngram", target_qps=3)
    assert out["request_rates"] == [0.5, 1.0, 2.0, 4.0] and out["concurrencies"] == [1, 4]
    assert out["num_speculative_tokens"] == [1, 2, 3] and out["k_limit"] == 10 and out["target_qps"] == 3.0
    # *_mtp aliases take mtp's cap (5)
    assert spec_sweep.validate_sweep(concurrencies=[1], num_speculative_tokens=[5], method="deepseek_mtp")["k_limit"] == 5
    assert spec_sweep.validate_sweep(request_rates=[1], num_speculative_tokens=[24], method="suffix")["k_limit"] == 24


@pytest.mark.parametrize("kwargs, field, text", [
    ({}, "request_rates", "neither request_rates nor concurrencies"),
    ({"request_rates": []}, "request_rates", "is empty"),
    ({"request_rates": [1, 4, 2]}, "request_rates", "not strictly increasing"),
    ({"request_rates": [1, 1]}, "request_rates", "not strictly increasing"),
    ({"request_rates": [0, 1]}, "request_rates", "greater than 0"),
    ({"request_rates": [-1.0]}, "request_rates", "greater than 0"),
    ({"request_rates": [1, float("nan")]}, "request_rates", "not a finite number"),
    ({"request_rates": "1,2"}, "request_rates", "must be a list"),
    ({"concurrencies": []}, "concurrencies", "is empty"),
    ({"concurrencies": [1, 2.5]}, "concurrencies", "not a whole number"),
    ({"concurrencies": [4, 2]}, "concurrencies", "not strictly increasing"),
    ({"concurrencies": [0]}, "concurrencies", "greater than 0"),
    ({"request_rates": [1], "num_speculative_tokens": [0, 1], "method": "ngram"}, "num_speculative_tokens", "outside 1..10"),
    ({"request_rates": [1], "num_speculative_tokens": [11], "method": "eagle3"}, "num_speculative_tokens", "outside 1..10"),
    ({"request_rates": [1], "num_speculative_tokens": [6], "method": "mtp"}, "num_speculative_tokens", "outside 1..5"),
    ({"request_rates": [1], "num_speculative_tokens": [25], "method": "suffix"}, "num_speculative_tokens", "outside 1..24"),
    ({"request_rates": [1], "num_speculative_tokens": [2, 2], "method": "ngram"}, "num_speculative_tokens", "duplicates"),
    ({"request_rates": [1], "num_speculative_tokens": [], "method": "ngram"}, "num_speculative_tokens", "non-empty"),
    ({"request_rates": [1], "num_speculative_tokens": [2]}, "method", "is required"),
    ({"request_rates": [1], "num_speculative_tokens": [2], "method": "medusa"}, "method", "supports only"),
    ({"request_rates": [1], "num_speculative_tokens": [2], "method": "nope"}, "method", "unknown method"),
    ({"request_rates": [1, 2], "target_qps": 0}, "target_qps", "greater than 0"),
    ({"request_rates": [1, 2], "target_qps": -3}, "target_qps", "greater than 0"),
    ({"request_rates": [1, 2], "target_qps": 2.5}, "target_qps", "above every measured request rate"),
    ({"concurrencies": [1, 2], "target_qps": 1}, "target_qps", "needs request_rates"),
])
def test_bad_sweep_input_names_its_field(kwargs, field, text):
    with pytest.raises(ValidationError) as err:
        spec_sweep.validate_sweep(**kwargs)
    assert err.value.field == field
    message = str(err.value)
    assert message.startswith(field + ":") and text in message and "Fix:" in message


# -- resume ----------------------------------------------------------------------------------------------------
PROTOCOL = {"prompts_sha256": "ab" * 32, "seed": 0, "temperature": 0.0, "max_tokens": 128}


def _plan():
    return {"protocol": dict(PROTOCOL), "units": spec_sweep.plan_units(request_rates=[1.0, 2.0], candidate_ks=[1, 3])}


def test_plan_interleaves_sides_per_load():
    units = spec_sweep.plan_units(request_rates=[1.0, 2.0], candidate_ks=[1, 3])
    assert [(u["load"], u["side"], u["k"]) for u in units] == [
        (1.0, "baseline", None), (1.0, "candidate", 1), (1.0, "candidate", 3),
        (2.0, "baseline", None), (2.0, "candidate", 1), (2.0, "candidate", 3)]


def test_resume_skips_finished_measurements():
    previous = {"schema": spec_sweep.SWEEP_SCHEMA, "protocol": dict(PROTOCOL), "measurements": [
        {"kind": "request_rate", "load": 1, "side": "baseline", "k": None, "summary": BASE},
        {"kind": "request_rate", "load": 1.0, "side": "candidate", "k": 1, "summary": {"n": "old"}},
        {"kind": "request_rate", "load": 1.0, "side": "candidate", "k": 1, "summary": {"n": "new"}},
        {"kind": "request_rate", "load": 1.0, "side": "candidate", "k": 3},              # interrupted: no summary
        {"kind": "request_rate", "load": 2.0, "side": "candidate", "k": 2, "summary": BASE},  # k not planned
        {"kind": "concurrency", "load": 2, "side": "baseline", "k": None, "summary": BASE},   # other kind
    ]}
    state = spec_sweep.resume_state(json.dumps(previous), _plan())
    assert [(m["load"], m["side"], m["k"]) for m in state["done"]] == [(1, "baseline", None), (1.0, "candidate", 1)]
    assert state["done"][1]["summary"] == {"n": "new"}
    assert [(u["load"], u["side"], u["k"]) for u in state["todo"]] == [
        (1.0, "candidate", 3), (2.0, "baseline", None), (2.0, "candidate", 1), (2.0, "candidate", 3)]


def test_fresh_run_measures_everything():
    state = spec_sweep.resume_state(None, _plan())
    assert state["done"] == [] and len(state["todo"]) == 6


@pytest.mark.parametrize("key, value", [("prompts_sha256", "cd" * 32), ("seed", 1), ("temperature", 0.7), ("max_tokens", 256)])
def test_resume_refuses_other_protocol(key, value):
    previous = {"schema": spec_sweep.SWEEP_SCHEMA, "protocol": dict(PROTOCOL, **{key: value}), "measurements": []}
    with pytest.raises(ValidationError) as err:
        spec_sweep.resume_state(previous, _plan())
    assert err.value.field == "resume_from"
    assert "%s: previous %r, now %r" % (key, value, PROTOCOL[key]) in str(err.value)


def test_resume_bad_inputs():
    with pytest.raises(ValidationError) as err:
        spec_sweep.resume_state("{not json", _plan())
    assert err.value.field == "resume_from" and "is not JSON" in str(err.value)
    with pytest.raises(ValidationError) as err:
        spec_sweep.resume_state({"schema": "other"}, _plan())
    assert err.value.field == "resume_from" and "not a sweep result" in str(err.value)
    plan = _plan()
    del plan["protocol"]["seed"]
    with pytest.raises(ValidationError) as err:
        spec_sweep.resume_state(None, plan)
    assert err.value.field == "plan.protocol" and "seed" in str(err.value)


def test_prompts_hash_follows_content_and_order():
    one = {"id": "a", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}
    two = {"id": "b", "prompt": "y", "messages": [{"role": "user", "content": "y"}]}
    digest = spec_sweep.prompts_sha256([one, two])
    assert len(digest) == 64
    assert digest != spec_sweep.prompts_sha256([two, one])
    assert digest != spec_sweep.prompts_sha256([one, dict(two, prompt="z")])
    assert digest == spec_sweep.prompts_sha256([dict(one), dict(two)])
