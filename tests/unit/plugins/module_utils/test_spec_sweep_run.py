"""spec_sweep's run-side logic: each side's speculative state, pooled acceptance, the k prediction over a sweep and
its confirmation by a measured A/B (issue #18). The sweep itself runs in tests/unit/plugins/modules/test_spec_sweep_module.py."""
import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import num_speculative_tokens as k_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep as spec_sweep
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep_analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep_sides
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.paced_server import paced_handler
from tests.paths import read_capture


def side(ttft, tpot, tps, acceptance=None):
    summary = {"completed": 10, "failed": 0, "burst_delivered": 0, "output_throughput": tps,
               "ttft_ms": {"median": ttft, "p99": ttft * 2}, "tpot_ms": {"median": tpot, "p99": tpot * 2},
               "itl_ms": {"median": tpot, "p99": tpot * 2}}
    return {"summary": summary, "acceptance": acceptance}


def acceptance(drafts, per_pos):
    return {"num_drafts": drafts, "num_accepted_tokens": sum(per_pos), "accepted_tokens_per_position": per_pos,
            "per_position": [v / float(drafts) for v in per_pos]}


def test_spec_state_from_a_real_ngram_capture_and_a_baseline_page():
    text = read_capture("ngram", "metrics.txt")
    state = sweep_sides.spec_state_from_metrics(text, "t-ngram")
    assert state == {"speculative": True, "k": 5}
    assert sweep_sides.spec_state_from_metrics(paced_handler("b", 0, 0).metrics_text()) == {"speculative": False, "k": None}
    assert sweep_sides.spec_state_from_metrics(None) == {"speculative": None, "k": None}
    assert sweep_sides.spec_state_from_metrics(paced_handler("c", 0, 0, spec_rates=[0.5, 0.2]).metrics_text())["k"] == 2


@pytest.mark.parametrize("command, expected", [
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"], False),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--speculative-config", "{}"], True),
    ("bash -c 'exec vllm serve /m --speculative-config={\"method\":\"ngram\"}'", True),
    ("vllm serve /m --spec-method ngram --spec-tokens 3", True),
    (None, None),
    # the registry's other forms: dotted keys, and the pre-0.10 flags older images run speculative decoding with
    (["vllm", "serve", "/m", "--speculative-config.method", "ngram"], True),
    (["bash", "-c", "exec vllm serve /m --speculative_model /d --num-speculative-tokens 3"], True),
    # a comment, an echo and a flag without a value do not set it
    ("bash -c 'echo --speculative-config {}; exec vllm serve /m # --spec-method ngram'", False),
    (["vllm", "serve", "/m", "--speculative-config"], False),
])
def test_spec_state_from_command(command, expected):
    assert sweep_sides.spec_state_from_command(command) is expected


@pytest.mark.parametrize("states, commands, field, needle", [
    ({"baseline": {"speculative": True, "k": 3}, "candidate": {"speculative": True, "k": 3}}, None, "baseline_url", "not a baseline"),
    ({"baseline": {"speculative": False}, "candidate": {"speculative": False}}, None, "candidate_url", "no speculative decoding"),
    ({"baseline": {"speculative": False}, "candidate": {"speculative": True, "k": 5},
      "confirm": {"speculative": True, "k": 5, "expected_k": 2}}, None, "confirm_url", "not the k=2"),
    ({"baseline": {"speculative": False}, "candidate": {"speculative": True}}, {"baseline": True}, "report_context.baseline_command", "enables"),
    ({"baseline": {"speculative": False}, "candidate": {"speculative": True}}, {"candidate": False}, "report_context.candidate_command",
     "does not enable"),
])
def test_spec_state_refusals_name_the_field(states, commands, field, needle):
    with pytest.raises(ValidationError) as err:
        sweep_sides.check_spec_states(states, commands)
    assert err.value.field == field and needle in str(err.value)


def test_spec_state_without_metrics_is_a_note_not_a_pass_or_fail():
    notes = sweep_sides.check_spec_states({"baseline": {"speculative": None}, "candidate": {"speculative": True, "k": 2}},
                                          {"baseline": None, "candidate": True})
    assert len(notes) == 1 and "baseline has no /metrics" in notes[0]


def engine_line(capture):
    return next(line for line in read_capture(capture, "startup.log").splitlines() if "Initializing a V1 LLM engine" in line)


def test_spec_state_from_the_engine_lines_vllm_logged():
    """The real captured lines (vLLM 0.32 CPU) and the engine_config_info module's result shape."""
    assert sweep_sides.spec_state_from_engine({"line": engine_line("baseline")}, "f") == {"found": True, "config": None}
    ngram = sweep_sides.spec_state_from_engine({"line": engine_line("ngram")}, "f")
    assert ngram == {"found": True, "config": {"method": "ngram", "model": None, "num_spec_tokens": 5}}
    registered = {"found": False, "speculative_config": None, "changed": False, "item": "x"}
    assert sweep_sides.spec_state_from_engine(registered, "f") == {"found": False, "config": None}
    assert sweep_sides.spec_state_from_engine(None, "f") is None and sweep_sides.spec_state_from_engine({}, "f") is None


@pytest.mark.parametrize("engine, field, needle", [
    ("text", "candidate_engine_config", "must be a dict"),
    ({"line": "INFO 12-01 started"}, "candidate_engine_config.line", "not vLLM's engine-config line"),
    ({"vllm_version": "0.32.0"}, "candidate_engine_config", "neither found"),
    ({"found": True, "speculative_config": "ngram"}, "candidate_engine_config.speculative_config", "dict or null"),
])
def test_malformed_engine_input_names_the_field(engine, field, needle):
    with pytest.raises(ValidationError) as err:
        sweep_sides.spec_state_from_engine(engine, "candidate_engine_config")
    assert err.value.field == field and needle in str(err.value)


def _engines(**sides):
    return {side: sweep_sides.spec_state_from_engine({"line": engine_line(capture)}, sweep_sides.ENGINE_FIELDS[side])
            for side, capture in sides.items()}


@pytest.mark.parametrize("engines, kwargs, field, needle", [
    (dict(baseline="ngram", candidate="ngram"), {}, "baseline_engine_config", "so it is no baseline"),
    (dict(baseline="baseline", candidate="baseline"), {}, "candidate_engine_config", "runs without speculative decoding"),
    (dict(baseline="baseline", candidate="eagle3"), {"method": "ngram"}, "method", "runs method 'eagle3'"),
    (dict(baseline="baseline", candidate="ngram"), {"current_k": 3}, "current_k", "runs num_spec_tokens=5"),
    (dict(baseline="baseline", candidate="ngram", confirm="ngram"), {"confirm_k": 2}, "confirm_k", "runs num_spec_tokens=5"),
    (dict(baseline="baseline", candidate="ngram"), {"metrics_k": 3}, "candidate_engine_config", "different servers"),
])
def test_engine_line_refusals_name_the_field(engines, kwargs, field, needle):
    kwargs = dict(kwargs)
    metrics = {"candidate": {"speculative": True, "k": kwargs.pop("metrics_k", None)}}
    with pytest.raises(ValidationError) as err:
        sweep_sides.check_engine_states(_engines(**engines), metrics, **kwargs)
    assert err.value.field == field and needle in str(err.value), str(err.value)


def test_engine_lines_that_agree_give_the_k_and_a_missing_line_a_note():
    notes, k = sweep_sides.check_engine_states(_engines(baseline="baseline", candidate="ngram"),
                                               {"candidate": {"speculative": True, "k": 5}}, method="ngram", current_k=5)
    assert (notes, k) == ([], 5)
    engines = {"baseline": {"found": False, "config": None}, "candidate": None}
    notes, k = sweep_sides.check_engine_states(engines, {}, method="ngram")
    assert k is None and len(notes) == 1 and "baseline's engine-config line was not found" in notes[0]
    eagle = _engines(candidate="eagle3")
    assert sweep_sides.check_engine_states(eagle, {}, method="eagle3")[1] == 3
    mtp = {"candidate": {"found": True, "config": {"method": "mtp", "model": None, "num_spec_tokens": 1}}}
    assert sweep_sides.check_engine_states(mtp, {}, method="deepseek_mtp")[1] == 1  # vLLM prints every *_mtp alias as mtp
    checks = sweep_sides.describe_checks({"baseline": {"speculative": False}, "candidate": {"speculative": True, "k": 3}},
                                         dict(eagle, baseline=None))
    assert checks == {"baseline": {"engine_line": "not given", "metrics": "no vllm:spec_decode_* counters"},
                      "candidate": {"engine_line": "SpeculativeConfig(method='eagle3', model='/mnt/models/tiny-eagle3', num_spec_tokens=3)",
                                    "metrics": "vllm:spec_decode_* counters, 3 per-position series"}}


def test_pooled_acceptance_sums_counts_before_dividing():
    pooled = k_model.pooled_acceptance([acceptance(100, [50, 20]), acceptance(300, [60, 30]), None, {"num_drafts": 0}])
    assert pooled["num_drafts"] == 400 and pooled["per_position"] == pytest.approx([110 / 400.0, 50 / 400.0])
    assert pooled["mean_acceptance_length"] == pytest.approx(1 + 160 / 400.0)
    assert k_model.pooled_acceptance([None, {"num_drafts": 0}]) is None


def sweep_points(per_pos, drafts=100, base_tpot=10.0, cand_tpot=6.0):
    return [{"kind": "request_rate", "load": load, "baseline": side(50, base_tpot, 100),
             "candidate": side(45, cand_tpot, 150, acceptance(drafts, per_pos))} for load in (1.0, 2.0)]


def test_predict_k_collapse_at_slot_2_gives_k1_and_flat_gives_the_largest_candidate():
    collapse = k_model.predict_k(sweep_points([90, 5, 2, 1, 0]), 5, [1, 2, 3, 4, 5], verify_cost_ratio=0.1)
    assert collapse["predicted_k"] == 1 and collapse["current_k"] == 5
    flat = k_model.predict_k(sweep_points([95, 95, 95, 95, 95]), 5, [1, 2, 3, 4, 5], verify_cost_ratio=0.1)
    assert flat["predicted_k"] == 5
    only = k_model.predict_k(sweep_points([95, 95, 95, 95, 95]), 5, [1, 3], verify_cost_ratio=0.1)
    assert only["predicted_k"] == 3 and only["expected_gain_current"] == pytest.approx(flat["table"][4]["expected_gain"])


def test_predict_k_measures_the_verify_cost_at_the_lowest_load():
    # baseline TPOT 10 ms, candidate 6 ms, mean acceptance length 1 + 1.5 = 2.5 at k=3: cost = 6 * 2.5 / 10 = 1.5
    pred = k_model.predict_k(sweep_points([80, 50, 20]), 3, [1, 2, 3])
    assert pred["verify_cost_ratio"] == pytest.approx((1.5 - 1) / 3)
    assert "measured at load 1" in pred["cost_source"]
    assert k_model.predict_k([{"kind": "request_rate", "load": 1.0, "baseline": side(1, 1, 1), "candidate": side(1, 1, 1)}],
                             3, [1, 2, 3]) is None


def test_confirmation_needs_a_measured_ab_when_the_prediction_differs():
    pts = sweep_points([90, 5, 2, 1, 0])
    pred = k_model.predict_k(pts, 5, [1, 2, 3, 4, 5], verify_cost_ratio=0.1)
    out = sweep_analysis.confirmation(pred, None, pts[0])
    assert out["status"] == "not_measured" and out["recommended_k"] is None and "never adopt" in out["reason"]
    better = sweep_analysis.confirmation(pred, {"current": side(45, 6.0, 150), "recommended": side(44, 5.0, 170)}, pts[0])
    assert better["status"] == "confirmed" and better["recommended_k"] == 1
    assert better["measured_speedup_vs_current"] == pytest.approx(170 / 150.0)
    assert better["measured_speedup_vs_baseline"] == pytest.approx(1.7)
    worse = sweep_analysis.confirmation(pred, {"current": side(45, 6.0, 150), "recommended": side(44, 7.0, 140)}, pts[0])
    assert worse["status"] == "rejected" and worse["recommended_k"] == 5 and "keep the current k=5" in worse["reason"]


def test_confirmation_of_the_deployed_k_is_the_sweeps_own_ab():
    pts = sweep_points([95, 95, 95])
    pred = k_model.predict_k(pts, 3, [1, 2, 3], verify_cost_ratio=0.05)
    out = sweep_analysis.confirmation(pred, None, pts[0])
    assert out["status"] == "confirmed" and out["recommended_k"] == 3 and out["measured_speedup_vs_baseline"] == pytest.approx(1.5)
    losing = [{"kind": "request_rate", "load": 1.0, "baseline": side(50, 10.0, 100),
               "candidate": side(45, 12.0, 90, acceptance(100, [95, 95, 95]))}]
    pred = k_model.predict_k(losing, 3, [1, 2, 3], verify_cost_ratio=0.05)
    assert sweep_analysis.confirmation(pred, None, losing[0])["status"] == "rejected"
    assert sweep_analysis.confirmation(None, None, None)["status"] == "not_measured"


def test_analyse_builds_points_break_even_target_and_k_from_measurements():
    sweep = spec_sweep.validate_sweep([1.0, 2.0, 4.0], None, [1, 2, 3], "ngram", 2.0)
    measurements = []
    for load, tpot in ((1.0, 6.0), (2.0, 8.0), (4.0, 12.0)):
        measurements.append(dict(side(50, 10.0, 100), kind="request_rate", load=load, side="baseline", k=None))
        measurements.append(dict(side(45, tpot, 100, acceptance(100, [80, 40, 10])), kind="request_rate", load=load, side="candidate", k=None))
    out = sweep_analysis.analyse(measurements, sweep, {"tolerances": {}, "verify_cost_ratio": 0.1}, 3)
    assert out["break_even"]["status"] == "crossed" and out["break_even"]["last_keep_load"] == 2.0
    assert out["break_even"]["crossover_load"] == pytest.approx(2.0 + 2.0 * 0.2 / (0.2 + 0.2))
    assert out["target"]["load"] == 2.0 and out["target"]["decision"]["decision"] == "keep"
    assert [p["speedup"] for p in out["points"]] == [1.0, 1.0, 1.0]
    assert out["k"]["prediction"]["predicted_k"] in (1, 2, 3) and out["k"]["current_k"] == 3
