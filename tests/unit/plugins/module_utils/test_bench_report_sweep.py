"""bench_report's sweep report: Markdown, JSON, the plot files and the refusal (issue #18; the plots themselves: test_bench_plots.py)."""
import json
import os

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError


def point(load, b_tpot, c_tpot, b_tps, c_tps, decision):
    def view(tpot, tps):
        return {"ttft_ms": {"median": 20.0, "p99": 30.0}, "tpot_ms": {"median": tpot, "p99": tpot * 1.5},
                "itl_ms": {"median": tpot, "p99": tpot * 2}, "output_throughput": tps, "completed": 10, "failed": 0}
    cand = view(c_tpot, c_tps)
    cand["acceptance"] = {"mean_acceptance_length": 2.1}
    return {"kind": "request_rate", "load": load, "speedup": c_tps / b_tps, "decision": decision, "reasons": [],
            "baseline": view(b_tpot, b_tps), "candidate": cand}


POINTS = [point(1, 10, 6, 100, 150, "keep"), point(2, 10, 8, 200, 230, "keep"), point(4, 10, 12, 380, 360, "roll_back"),
          point(8, 11, 20, 600, 420, "roll_back")]
BREAK_EVEN = {"kind": "request_rate", "status": "crossed", "last_keep_load": 2, "first_roll_back_load": 4, "crossover_load": 3.0,
              "crossed_first": "tpot", "reason": "keep holds at 2 and fails at 4", "pays_again_at": [], "crossover_by_metric": {"tpot": 3.0}}
PREDICTION = {"per_position_rates": [0.9, 0.1, 0.05], "predicted_k": 1, "recommended_k": 1, "verify_cost_ratio": 0.2,
              "cost_model": "cost(k) = 1 + 0.2 * k", "cost_source": "given", "expected_gain": 1.583,
              "table": [{"k": 1, "expected_tokens_per_step": 1.9, "cost": 1.2, "expected_gain": 1.583},
                        {"k": 2, "expected_tokens_per_step": 2.0, "cost": 1.4, "expected_gain": 1.429},
                        {"k": 3, "expected_tokens_per_step": 2.05, "cost": 1.6, "expected_gain": 1.281}]}


CONTEXT = bench_report.build_context(
    {"gpu_model": "none (CPU)", "gpu_count": 0, "model": "m", "dtype": "bfloat16", "vllm_version": "0.32.0", "image": "img",
     "baseline_command": "vllm serve m", "candidate_command": "vllm serve m --speculative-config {}"},
    {"temperature": 0.0, "max_tokens": 32, "concurrency": 64, "sampling": {"seed": 0}, "runs_per_prompt": 5, "request_rate": [1, 2, 4, 8]})


def data(**over):
    result = {"points": POINTS, "break_even": BREAK_EVEN, "break_even_by_kind": {"request_rate": BREAK_EVEN},
              "target": {"target_qps": 3.0, "load": 4, "exact": False, "speedup": 0.95,
                         "decision": {"decision": "roll_back", "reasons": ["median TPOT got worse"]}},
              "k": {"prediction": PREDICTION, "confirmation": {"status": "not_measured"}, "recommended_k": None, "current_k": 3,
                    "reason": "predicted k=1 is not confirmed"}}
    out = {"schema": "alauda.spec_decoding/sweep-results/v1", "title": "T", "context": CONTEXT, "result": result, "notes": ["a note"],
           "measurements": [], "protocol": {}}
    out.update(over)
    return out


def test_markdown_and_json_hold_the_five_fields_break_even_target_and_k(tmp_path):
    paths = bench_report.write_sweep_report(data(), str(tmp_path), basename="s")
    md = open(paths["markdown"], encoding="utf-8").read()
    for needle in ("Decision at the target load 3.000 req/s (sweep point 4 req/s, the next measured above): `roll_back`",
                   "| Interpolated crossover | 3.000 req/s |", "| Crossed first | tpot |", "| 1 (predicted) | 1.900 | 1.200 | 1.583 |",
                   "| 3 (current) |", "**Recommended k: n/a** (current k 3)", "Hardware: GPU model", "Hardware: GPU count",
                   "Model: identifier", "Model: dtype", "Runtime: vLLM version", "Runtime: image", "### Request parameters",
                   "Baseline:", "Speculative decoding:", "![Speedup and TPOT against load](s-load.png)", "- a note"):
        assert needle in md, needle
    assert "| 4 req/s | candidate | 20.00 (30.00) | 12 (18.00) |" in md
    saved = json.load(open(paths["json"], encoding="utf-8"))
    assert saved["plots"] == {"load": "s-load.png", "k": "s-k.png"} and saved["schema"].endswith("sweep-results/v1")
    assert os.path.exists(paths["plots"]["load"]) and os.path.exists(paths["plots"]["k"])


def test_markdown_shows_a_measured_confirmation():
    d = data()
    d["result"]["k"] = {"prediction": PREDICTION, "recommended_k": 1, "current_k": 3, "reason": "k=1 measured against k=3",
                        "confirmation": {"status": "confirmed", "load": 4, "expected_gain": 1.583, "predicted_speedup_vs_current": 1.24,
                                         "measured_speedup_vs_current": 1.1, "measured_speedup_vs_baseline": 1.4}}
    md = bench_report.render_sweep_markdown(d)
    assert "**Recommended k: 1**" in md and "| Measured speedup vs current k | 1.100 |" in md
    assert "| Predicted speedup vs current k | 1.240 |" in md


def test_an_incomplete_context_is_refused_before_anything_is_written(tmp_path):
    ctx = json.loads(json.dumps(CONTEXT))
    ctx["hardware"]["gpu_model"] = None
    with pytest.raises(ValidationError) as err:
        bench_report.write_sweep_report(data(context=ctx), str(tmp_path / "r"))
    assert err.value.field == "report_context" and "Hardware: GPU model" in str(err.value)
    assert not os.path.exists(str(tmp_path / "r"))


def test_no_plots_when_turned_off(tmp_path):
    paths = bench_report.write_sweep_report(data(), str(tmp_path), plots=False)
    assert paths["plots"] == {} and "## Plots" not in open(paths["markdown"], encoding="utf-8").read()
