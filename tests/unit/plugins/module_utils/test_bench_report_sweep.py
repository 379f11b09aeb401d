"""bench_report's sweep report: the bitmap font, labelled panels, the load and k plots, Markdown and the refusal (issue #18)."""
import json
import os
import struct
import zlib

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

INK = (0x20, 0x20, 0x20)


def pixels(path):
    """(width, height, rows of RGB bytes) of a PNG written by _Canvas (filter 0 on every row)."""
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        if data[pos + 4:pos + 8] == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * 3 + 1
    return width, height, [raw[y * stride + 1:(y + 1) * stride] for y in range(height)]


def count(rows, color, box=None):
    left, top, right, bottom = box or (0, 0, len(rows[0]) // 3, len(rows))
    target = bytes(color)
    return sum(1 for y in range(top, bottom) for x in range(left, right) if rows[y][3 * x:3 * x + 3] == target)


def test_every_glyph_is_5x7_and_unknown_characters_draw_a_question_mark():
    for char, glyph in bench_report.FONT.items():
        assert len(glyph) == 7 and all(len(row) == 5 for row in glyph), char
    assert bench_report._glyph("~") == bench_report.FONT["?"]
    assert bench_report._glyph("a") == bench_report.FONT["A"]
    assert bench_report.text_width("TPOT (ms)") == 9 * 6


def test_text_draws_the_glyph_bits_horizontally_and_vertically(tmp_path):
    canvas = bench_report._Canvas(40, 40)
    bench_report._canvas_text(canvas, 2, 2, "1", INK)
    lit = {(x, y) for y in range(40) for x in range(40) if canvas.pixels[(y * 40 + x) * 3:(y * 40 + x) * 3 + 3] == bytes(INK)}
    expected = {(2 + c, 2 + r) for r, row in enumerate(bench_report.FONT["1"]) for c, bit in enumerate(row) if bit}
    assert lit == expected
    vertical = bench_report._Canvas(40, 40)
    bench_report._canvas_text(vertical, 2, 30, "1", INK, vertical=True)
    lit = {(x, y) for y in range(40) for x in range(40) if vertical.pixels[(y * 40 + x) * 3:(y * 40 + x) * 3 + 3] == bytes(INK)}
    assert lit == {(2 + r, 30 - c) for r, row in enumerate(bench_report.FONT["1"]) for c, bit in enumerate(row) if bit}


def test_nice_range_pads_and_starts_non_negative_quantities_at_zero():
    low, high = bench_report._nice_range([5.0, 15.0], include=(0.0,))
    assert low == 0.0 and high == pytest.approx(15 + 15 * 0.08)
    low, high = bench_report._nice_range([5.0, 15.0])
    assert (low, high) == (pytest.approx(4.2), pytest.approx(15.8))
    assert bench_report._nice_range([]) == (0.0, 1.0)
    assert bench_report._nice_range([2.0]) == (pytest.approx(1.8), pytest.approx(2.2))
    assert [bench_report._tick_text(v) for v in (0, 0.25, 1.0, 12.5, 250.4)] == ["0", "0.25", "1", "12.5", "250"]


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


def test_load_plot_marks_break_even_and_target_and_labels_the_axes(tmp_path):
    path = bench_report.plot_sweep_load(POINTS, BREAK_EVEN, 4.0, str(tmp_path / "load.png"))
    width, height, rows = pixels(path)
    assert (width, height) == (1000, 400)
    assert count(rows, bench_report.SWEEP_COLORS["break_even"]) > 100  # dashed line in both panels + its label
    assert count(rows, bench_report.SWEEP_COLORS["target"]) > 100
    assert count(rows, bench_report.COLORS["baseline"]) > 50 and count(rows, bench_report.COLORS["candidate"]) > 50
    # axis labels: ink below the plot area (x label, ticks) and left of it (y label, ticks), in both panels
    assert count(rows, (0x40, 0x40, 0x40), (80, 335, 470, 370)) > 100 and count(rows, (0x40, 0x40, 0x40), (20, 40, 78, 330)) > 100
    assert count(rows, (0x40, 0x40, 0x40), (580, 335, 970, 370)) > 100


def test_load_plot_without_crossover_marks_the_first_roll_back(tmp_path):
    be = dict(BREAK_EVEN, crossover_load=None)
    path = bench_report.plot_sweep_load(POINTS, be, None, str(tmp_path / "load.png"))
    _w, _h, rows = pixels(path)
    assert count(rows, bench_report.SWEEP_COLORS["break_even"]) > 100 and count(rows, bench_report.SWEEP_COLORS["target"]) == 0


def test_k_plot_draws_the_curve_the_prediction_and_the_measurement(tmp_path):
    confirmation = {"status": "confirmed", "predicted_k": 1, "current_k": 3, "measured_speedup_vs_baseline": 1.4,
                    "measured_speedup_vs_current": 1.1}
    path = bench_report.plot_k_curve(PREDICTION, confirmation, str(tmp_path / "k.png"))
    _w, _h, rows = pixels(path)
    assert count(rows, bench_report.SWEEP_COLORS["predicted"]) > 100
    assert count(rows, bench_report.COLORS["baseline"]) > 30  # the measured points
    bare = bench_report.plot_k_curve(PREDICTION, None, str(tmp_path / "k2.png"))
    assert count(pixels(bare)[2], bench_report.COLORS["baseline"]) == 0


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


def test_text_at_a_fractional_position_keeps_every_glyph_row():
    whole, half = bench_report._Canvas(20, 20), bench_report._Canvas(20, 20)
    bench_report._canvas_text(whole, 2, 2, "8", INK)
    bench_report._canvas_text(half, 2.4, 2.4, "8", INK)
    assert whole.pixels == half.pixels
