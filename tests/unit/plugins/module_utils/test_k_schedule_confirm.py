"""bench/k_schedule_confirm.py on hand-made measured points: which loads, the median interval, the verdicts."""
import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import k_schedule_confirm as kc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

SCHEDULE = [[1, 1, 4], [2, 3, 2], [4, 64, 1]]


def side(tpots, itl=5.0, load=1, name="schedule", kind="concurrency"):
    ordered = sorted(tpots)
    return {"side": name, "kind": kind, "load": load, "tpot_samples_ms": ordered,
            "summary": {"tpot_ms": {"median": ordered[len(ordered) // 2] if len(ordered) % 2 else
                                    (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2.0},
                        "itl_ms": {"median": itl}}}


def test_default_loads_are_the_lowest_and_the_highest_whose_scheduled_k_differs():
    picked = kc.pick_loads("concurrency", [1, 2, 4, 8], None, SCHEDULE, 4)
    assert [(p["load"], p["batch_size"], p["scheduled_k"]) for p in picked] == [(1, 1, 4), (8, 8, 1)]
    # the highest load whose k differs from the lowest's, not merely the highest load
    picked = kc.pick_loads("concurrency", [2, 5, 8], None, [[1, 3, 2], [4, 7, 1], [8, 8, 2]], 4)
    assert [(p["load"], p["scheduled_k"]) for p in picked] == [(2, 2), (5, 1)]


def test_request_rate_loads_read_the_batch_size_the_sweep_measured():
    per_load = [{"kind": "request_rate", "load": 2.0, "batch_size": 1}, {"kind": "request_rate", "load": 8.0, "batch_size": 5}]
    picked = kc.pick_loads("request_rate", [2.0, 8.0], per_load, SCHEDULE, 4)
    assert [(p["load"], p["batch_size"], p["scheduled_k"]) for p in picked] == [(2.0, 1, 4), (8.0, 5, 1)]


def test_named_loads_must_be_swept_and_a_flat_schedule_is_refused():
    picked = kc.pick_loads("concurrency", [1, 2, 4], None, SCHEDULE, 4, named=[2.0, 4.0])
    assert [(p["load"], p["scheduled_k"]) for p in picked] == [(2, 2), (4, 1)]
    with pytest.raises(ValidationError) as err:
        kc.pick_loads("concurrency", [1, 2, 4], None, SCHEDULE, 4, named=[1.0, 16.0])
    assert err.value.field == "schedule_loads" and "16 is not a swept concurrency" in str(err.value)
    with pytest.raises(ValidationError) as err:
        kc.pick_loads("concurrency", [1, 2], None, [[1, 64, 2]], 4)
    assert err.value.field == "schedule" and "it is a fixed k" in str(err.value)


@pytest.mark.parametrize("params, field", [
    ({"schedule_url": "http://s"}, "fixed_url"),
    ({"fixed_url": "http://f"}, "schedule_url"),
    ({"schedule_url": "http://s", "fixed_url": "http://f", "schedule": [[2, 8, 1]]}, "schedule"),
    ({"schedule_url": "http://s", "fixed_url": "http://f", "fixed_k": 0}, "fixed_k"),
    ({"schedule_url": "http://s", "fixed_url": "http://f", "schedule_loads": [4.0]}, "schedule_loads"),
])
def test_bad_inputs_name_their_field(params, field):
    with pytest.raises(ValidationError) as err:
        kc.check_params(params)
    assert err.value.field == field


def test_no_schedule_ab_without_urls():
    assert kc.check_params({}) is None
    assert kc.check_params({"schedule_url": "http://s", "fixed_url": "http://f", "schedule_loads": [8, 1]})["loads"] == [1.0, 8.0]


def test_median_interval_is_the_order_statistic_interval():
    # n=20: j = floor(20/2 - 1.96*sqrt(20)/2) = 5, the interval is the j-th and (n - j + 1)-th values: 5 and 16 of 1..20
    assert kc.median_interval(range(1, 21)) == (5.0, 16.0)
    assert kc.median_interval([1, 2]) is None
    low, high = kc.median_interval([10.0] * 9)
    assert low == high == 10.0 and kc.relative_half_width([10.0] * 9) == 0.0


def test_verdicts_follow_the_noise_bound():
    steady_fixed = [20.0 + 0.1 * i for i in range(10)]     # about 20.45 ms, spread 1 ms
    faster = [10.0 + 0.1 * i for i in range(10)]           # about 10.45 ms: 1.96x
    same = [20.05 + 0.1 * i for i in range(10)]
    slower = [30.0 + 0.1 * i for i in range(10)]
    row = kc.compare_load(side(steady_fixed, name="schedule_fixed"), side(faster), 1, "concurrency", 1, 4, 2)
    assert row["verdict"] == "confirmed" and row["speedup"] == pytest.approx(20.45 / 10.45) and 0 < row["noise"] < 0.1
    assert row["schedule"] == {"tpot_ms": pytest.approx(10.45), "itl_ms": 5.0} and row["samples"] == [10, 10]
    assert kc.compare_load(side(steady_fixed, name="schedule_fixed"), side(slower), 1, "concurrency", 1, 4, 2)["verdict"] == "not_confirmed"
    tie = kc.compare_load(side(steady_fixed, name="schedule_fixed"), side(same), 8, "concurrency", 8, 2, 2)
    assert tie["verdict"] == "inconclusive" and "a tie is expected" in tie["reason"]
    # a 5% gain inside a wide spread is not a confirmation
    noisy_fixed = [10.0, 14.0, 18.0, 21.0, 22.0, 24.0, 26.0, 30.0, 34.0, 40.0]
    noisy = [v / 1.05 for v in noisy_fixed]
    row = kc.compare_load(side(noisy_fixed, name="schedule_fixed"), side(noisy), 1, "concurrency", 1, 4, 2)
    assert row["speedup"] == pytest.approx(1.05) and row["noise"] > 0.05 and row["verdict"] == "inconclusive"
    # without per-request samples there is no bound: never confirmed
    bare = kc.compare_load({"summary": {"tpot_ms": {"median": 20.0}}}, {"summary": {"tpot_ms": {"median": 10.0}}}, 1, "concurrency", 1, 4, 2)
    assert bare["verdict"] == "inconclusive" and bare["noise"] is None


def test_overall_status_and_the_best_fixed_k_note():
    fixed = [20.0 + 0.1 * i for i in range(10)]
    measured = [side(fixed, load=1, name="schedule_fixed"), side([v / 2 for v in fixed], load=1),
                side(fixed, load=8, name="schedule_fixed"), side([v + 0.01 for v in fixed], load=8)]
    picked = [{"load": 1, "batch_size": 1, "scheduled_k": 4}, {"load": 8, "batch_size": 8, "scheduled_k": 1}]
    out = kc.confirm(measured, "concurrency", picked, SCHEDULE, 4, 2, best_fixed_k=2)
    assert out["status"] == "confirmed" and [r["verdict"] for r in out["loads"]] == ["confirmed", "inconclusive"]
    assert out["describe"] == "1: k=4; 2-3: k=2; 4+: k=1" and out["notes"] == []
    measured[3] = side([v * 1.5 for v in fixed], load=8)
    out = kc.confirm(measured, "concurrency", picked, SCHEDULE, 4, 2, best_fixed_k=3)
    assert out["status"] == "not_confirmed" and out["reason"].startswith("keep fixed k=2")
    assert "not against the best fixed k" in out["notes"][0]
    out = kc.confirm(measured[:2], "concurrency", picked, SCHEDULE, 4, 2)
    assert out["loads"][1]["reason"] == "not measured on both sides" and out["status"] == "confirmed"


@pytest.mark.parametrize("parallelism, warned", [({"data": 2, "dataLocal": 2}, "data-parallel size 4"), ({"tensor": 1}, None)])
def test_an_llmisvc_schedule_with_data_parallelism_warns_that_vllm_drops_it(parallelism, warned):
    """vLLM 0.32 (vllm/config/vllm.py, _maybe_disable_dynamic_sd_for_data_parallel) drops the schedule for a data-parallel
    size above 1: an LLMInferenceService's parallelism.data x dataLocal."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import render as llmisvc_render
    from tests.unit.plugins.module_utils.test_llmisvc import params
    out = llmisvc_render.render(params(llmisvc={"parallelism": parallelism}, speculative={"num_speculative_tokens_per_batch_size": SCHEDULE}))
    notes = [w for w in out["warnings"] if "data-parallel size" in w]
    assert notes == ([] if warned is None else [notes[0]]) and (warned is None or warned in notes[0]), out["warnings"]


def test_a_difference_where_both_run_the_same_k_makes_the_ab_inconclusive():
    """At a load where the schedule runs the fixed k the two servers run the same engine: a difference beyond the noise
    there is the servers' (the e2e's second run on a shared machine: 23% at k=4 against k=4), not the schedule's."""
    fixed = [5.0 + 0.01 * i for i in range(15)]
    measured = [side(fixed, load=1, name="schedule_fixed"), side([v * 1.3 for v in fixed], load=1),
                side(fixed, load=4, name="schedule_fixed"), side([v * 1.4 for v in fixed], load=4)]
    picked = [{"load": 1, "batch_size": 1, "scheduled_k": 4}, {"load": 4, "batch_size": 4, "scheduled_k": 1}]
    out = kc.confirm(measured, "concurrency", picked, [[1, 1, 4], [2, 64, 1]], 4, 4)
    assert [r["verdict"] for r in out["loads"]] == ["not_confirmed", "not_confirmed"]
    assert out["status"] == "inconclusive" and "both servers run k=4" in out["notes"][0] and "servers differ" in out["reason"]
