"""bench_plots: the report plots drawn with matplotlib (issue #29).

The figures are read before they are saved (titles, axis labels, the data of every line, the legend), the PNGs are
read back (a valid PNG of the figure's size with both sides' colours in it), and a missing matplotlib is refused with
the package and the fix, before anything is written.
"""
import math
import importlib.util
import json
import os
import statistics
import subprocess
import sys

import pytest
from PIL import Image

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import num_speculative_tokens as k_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import plots as bench_plots
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep_analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from tests.paths import REPO
from tests.png_file import check_png


def records(ttft, gap, chunks, tokens_per_chunk=1, n=10):
    """Request records (seconds): TTFT grows 2% per request, chunk gaps by up to 6%."""
    out = []
    for i in range(n):
        itl = [gap * (1 + 0.01 * ((i + j) % 7)) for j in range(chunks - 1)]
        t0 = ttft * (1 + 0.02 * i)
        out.append({"success": True, "ttft": t0, "itl": itl, "latency": t0 + sum(itl), "output_tokens": 1 + (chunks - 1) * tokens_per_chunk})
    return out


BASE_REC = records(0.050, 0.020, 40)
CAND_REC = records(0.048, 0.030, 20, tokens_per_chunk=2) + [{"success": False, "ttft": None, "itl": [], "latency": None, "output_tokens": 0}]


def point(load, b_tpot, c_tpot, b_tps, c_tps, kind="request_rate"):
    def view(tpot, tps):
        return {"ttft_ms": {"median": 20.0, "p99": 30.0}, "tpot_ms": {"median": tpot, "p99": tpot * 1.5}, "output_throughput": tps}
    return {"kind": kind, "load": load, "speedup": c_tps / b_tps, "baseline": view(b_tpot, b_tps), "candidate": view(c_tpot, c_tps)}


POINTS = [point(1, 10, 6, 100, 150), point(2, 10, 8, 200, 230), point(4, 10, 12, 380, 360), point(8, 11, 20, 600, 420)]
BREAK_EVEN = {"kind": "request_rate", "crossover_load": 3.0, "first_roll_back_load": 4}
PREDICTION = {"per_position_rates": [0.9, 0.1, 0.05], "predicted_k": 1,
              "table": [{"k": 1, "expected_gain": 1.583}, {"k": 2, "expected_gain": 1.429}, {"k": 3, "expected_gain": 1.281}]}
CONFIRMATION = {"status": "confirmed", "predicted_k": 1, "current_k": 3, "measured_speedup_vs_baseline": 1.4, "measured_speedup_vs_current": 1.1}


PER_LOAD = [{"kind": "concurrency", "load": 1, "batch_size": 1, "best_k": 2, "measured_speedup": 1.8},
            {"kind": "concurrency", "load": 4, "batch_size": 4, "best_k": 1, "measured_speedup": 1.3},
            {"kind": "concurrency", "load": 8, "batch_size": 8, "best_k": 0, "measured_speedup": 0.9}]
SCHEDULE = {"schedule": [[1, 3, 3], [4, 7, 1], [8, 8, 0]], "describe": "1-3: k=3; 4-7: k=1; 8+: k=0",
            "steps": [{"batch_size": 1, "load": 1, "gain_k": 1.75}, {"batch_size": 4, "load": 4, "gain_k": 1.25},
                      {"batch_size": 8, "load": 8, "gain_k": 1.0}]}


def lines(axis):
    """``{label: (xdata, ydata)}`` of the axis' labelled lines."""
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axis.get_lines()
            if not line.get_label().startswith("_")}


def legend_texts(axis):
    return [text.get_text() for text in axis.get_legend().get_texts()]


def hex_rgb(color):
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


def read_png(path):
    """(width, height, {rgb: pixel count}) of a PNG whose chunks all carry a correct CRC (tests/png_file.py)."""
    width, height, _size = check_png(path)
    with Image.open(path) as image:
        image.load()
        colors = {rgb: count for count, rgb in image.convert("RGB").getcolors(maxcolors=width * height)}
    return width, height, colors


def expected_size(kind):
    width, height = bench_plots.FIGSIZE[kind]
    return int(width * bench_plots.DPI), int(height * bench_plots.DPI)


def hide_matplotlib(monkeypatch):
    """Make ``import matplotlib...`` fail as on a host without it (restored after the test)."""
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("kind, draw", [
    ("latency", lambda path: bench_plots.plot_latency(BASE_REC, CAND_REC, path)),
    ("acceptance", lambda path: bench_plots.plot_acceptance([0.7, 0.45, 0.25], path)),
    ("sweep_load", lambda path: bench_plots.plot_sweep_load(POINTS, BREAK_EVEN, 4.0, path)),
    ("k_curve", lambda path: bench_plots.plot_k_curve(PREDICTION, CONFIRMATION, path)),
    ("k_schedule", lambda path: bench_plots.plot_k_schedule(PER_LOAD, SCHEDULE, path)),
])
def test_each_plot_is_a_valid_png_of_its_figure_size_with_its_series_drawn(tmp_path, kind, draw):
    path = str(tmp_path / (kind + ".png"))
    assert draw(path) == path
    width, height, colors = read_png(path)
    assert (width, height) == expected_size(kind)
    assert colors.get((255, 255, 255), 0) > width * height // 3  # a white page ...
    # ... with the speculative side's line and markers in it, and the baseline's where the plot has one
    assert colors.get(hex_rgb(bench_plots.COLORS["candidate"]), 0) > 100
    if kind in ("latency", "sweep_load", "k_curve", "k_schedule"):
        assert colors.get(hex_rgb(bench_plots.COLORS["baseline"]), 0) > 100


def test_latency_figure_has_a_labelled_panel_per_metric_with_both_sides_and_their_medians():
    fig = bench_plots.latency_figure(BASE_REC, CAND_REC)
    assert fig.get_suptitle() == "Latency distributions (empirical CDF): baseline vs speculative decoding"
    axes = fig.get_axes()
    assert [a.get_title() for a in axes] == ["Time to first token (TTFT)", "Time per output token (TPOT)", "Inter-token latency (ITL)"]
    assert [a.get_xlabel() for a in axes] == ["TTFT (ms)", "TPOT (ms)", "ITL per streamed chunk (ms)"]
    assert [a.get_ylabel() for a in axes] == ["fraction of requests", "fraction of requests", "fraction of chunks"]
    ok = [r for r in CAND_REC if r["success"]]
    samples = {  # in ms, from the records themselves; the failed request is in no panel
        "baseline": ([r["ttft"] * 1000 for r in BASE_REC], [sum(r["itl"]) / (r["output_tokens"] - 1) * 1000 for r in BASE_REC],
                     [g * 1000 for r in BASE_REC for g in r["itl"]]),
        "speculative decoding": ([r["ttft"] * 1000 for r in ok], [sum(r["itl"]) / (r["output_tokens"] - 1) * 1000 for r in ok],
                                 [g * 1000 for r in ok for g in r["itl"]]),
    }
    for index, axis in enumerate(axes):
        drawn = lines(axis)
        labels = legend_texts(axis)
        for side, per_metric in samples.items():
            values = per_metric[index]
            label = "%s (median %.2f ms, n=%d)" % (side, statistics.median(values), len(values))
            assert label in labels and label in drawn
            xs, ys = drawn[label]
            assert xs[1:] == pytest.approx(sorted(values)) and ys[0] == 0.0 and ys[-1] == pytest.approx(1.0)  # an ECDF from 0 to 1
        assert axis.get_xscale() == "linear"  # gaps within a factor 10 of each other


def test_latency_itl_axis_turns_logarithmic_over_a_decade_and_an_empty_panel_says_why():
    stalled = records(0.050, 0.020, 40)
    stalled[0]["itl"][5] = 0.5  # one 500 ms stall among 20 ms gaps
    fig = bench_plots.latency_figure(stalled, [])
    ttft, _tpot, itl = fig.get_axes()
    assert itl.get_xscale() == "log" and itl.get_xlabel() == "ITL per streamed chunk (ms), log scale"
    assert ttft.get_xscale() == "linear"
    assert [label.split(" (")[0] for label in legend_texts(ttft)] == ["baseline"]  # no speculative requests: one series
    empty = bench_plots.latency_figure([], [])
    assert all("no successful requests" in [t.get_text() for t in axis.texts] and axis.get_legend() is None for axis in empty.get_axes())


def test_acceptance_figure_draws_each_position_with_its_value():
    fig = bench_plots.acceptance_figure([0.7, 0.45, 0.25])
    (axis,) = fig.get_axes()
    assert axis.get_title() == "Per-position acceptance rate of the speculative side"
    assert axis.get_xlabel() == "draft position (slot)" and axis.get_ylabel() == "acceptance rate (fraction of drafts)"
    assert lines(axis) == {"speculative decoding: accepted / drafts": ([1, 2, 3], [0.7, 0.45, 0.25])}
    assert list(axis.get_xticks()) == [1, 2, 3] and axis.get_ylim() == (0, 1.05)
    assert [t.get_text() for t in axis.texts] == ["0.700", "0.450", "0.250"]


def test_load_figure_draws_speedup_and_tpot_against_load_with_break_even_and_target():
    fig = bench_plots.sweep_load_figure(POINTS, BREAK_EVEN, 4.0)
    speed, tpot = fig.get_axes()
    assert (speed.get_title(), tpot.get_title()) == ("Speedup against load", "Median TPOT against load")
    assert speed.get_xlabel() == tpot.get_xlabel() == "request rate (req/s)"
    assert speed.get_ylabel() == "speedup (\u00d7, output tokens/s ratio)" and tpot.get_ylabel() == "median TPOT (ms)"
    loads = [1, 2, 4, 8]
    assert lines(speed)["speculative / baseline output tokens/s"] == (loads, pytest.approx([1.5, 1.15, 360 / 380.0, 0.7]))
    assert lines(speed)["1.0 = as fast as the baseline"][1] == [1.0, 1.0]
    assert lines(tpot)["baseline"] == (loads, [10, 10, 10, 11]) and lines(tpot)["speculative decoding"] == (loads, [6, 8, 12, 20])
    for axis in (speed, tpot):  # both panels mark the break-even and the target, at their loads, in the legend
        assert lines(axis)["break-even about 3 req/s"][0] == [3.0, 3.0] and lines(axis)["target 4 req/s"][0] == [4.0, 4.0]
        assert "break-even about 3 req/s" in legend_texts(axis) and "target 4 req/s" in legend_texts(axis)
        assert list(axis.get_xticks()) == loads
    assert tpot.get_ylim()[0] == 0  # latency axis from zero


def test_load_figure_without_a_crossover_marks_the_first_roll_back_and_concurrency_has_its_units():
    be = dict(BREAK_EVEN, crossover_load=None)
    points = [dict(p, kind="concurrency") for p in POINTS]
    fig = bench_plots.sweep_load_figure(points, be, 4.0, kind="concurrency")
    speed, tpot = fig.get_axes()
    assert speed.get_xlabel() == "concurrency (requests in flight)"
    # the target QPS is a request rate: not drawn on a concurrency axis
    assert set(lines(speed)) == {"speculative / baseline output tokens/s", "1.0 = as fast as the baseline", "first roll_back at 4 requests in flight"}
    assert "first roll_back at 4 requests in flight" in lines(tpot)
    gap = dict(POINTS[1], speedup=None)  # a point without a speedup leaves a gap, not a crash
    fig = bench_plots.sweep_load_figure([POINTS[0], gap, POINTS[2]], {}, None)
    assert [math.isnan(y) for y in lines(fig.get_axes()[0])["speculative / baseline output tokens/s"][1]] == [False, True, False]


def test_k_figure_draws_the_curve_the_predicted_gains_the_predicted_k_and_the_measured_ab():
    fig = bench_plots.k_curve_figure(PREDICTION, CONFIRMATION)
    curve, gain = fig.get_axes()
    assert curve.get_title() == "Per-position acceptance (cumulative)" and gain.get_title() == "Expected gain per k, and measured"
    assert curve.get_xlabel() == "draft position (slot)" and curve.get_ylabel() == "acceptance rate (fraction of drafts)"
    assert gain.get_xlabel() == "num_speculative_tokens (k)" and gain.get_ylabel() == "speedup over the baseline (\u00d7)"
    assert lines(curve) == {"accepted / drafts, per slot": ([1, 2, 3], [0.9, 0.1, 0.05])}
    drawn = lines(gain)
    assert drawn["predicted gain E(k) / cost(k)"] == ([1, 2, 3], [1.583, 1.429, 1.281])
    # k=1 measured 1.4 over the baseline and 1.1 over the current k=3, so k=3 is 1.4 / 1.1 over the baseline
    assert drawn["measured speedup over the baseline"] == ([1, 3], pytest.approx([1.4, 1.4 / 1.1]))
    assert drawn["predicted k=1"][0] == [1, 1] and drawn["1.0 = as fast as the baseline"][1] == [1.0, 1.0]
    assert [t.get_text() for t in gain.texts] == ["1.400 (predicted k)", "1.273 (current k)"]
    assert set(legend_texts(gain)) == set(drawn)
    bare = bench_plots.k_curve_figure(PREDICTION, {"status": "not_measured"})
    assert "measured speedup over the baseline" not in lines(bare.get_axes()[1]) and not bare.get_axes()[1].texts


def test_without_matplotlib_a_plot_is_refused_with_the_package_and_the_fix(tmp_path, monkeypatch):
    hide_matplotlib(monkeypatch)
    path = tmp_path / "lat.png"
    with pytest.raises(SpecDecodingError) as err:
        bench_plots.plot_latency(BASE_REC, CAND_REC, str(path))
    assert err.value.field == "plots"
    message = str(err.value)
    assert message.startswith("plots: the report's PNG plots need the Python package matplotlib, which %s cannot import" % sys.executable)
    assert "Fix: install it for that interpreter" in message and "-m pip install 'matplotlib>=3.8'" in message
    assert "or set plots: false" in message
    assert not path.exists()


CONTEXT = bench_report.build_context(
    {"gpu_model": "none (CPU)", "gpu_count": 0, "model": "m", "dtype": "bfloat16", "vllm_version": "0.32.0", "image": "img",
     "baseline_command": "vllm serve m", "candidate_command": "vllm serve m --speculative-config {}"},
    {"temperature": 0.0, "max_tokens": 32, "concurrency": 4, "sampling": {"seed": 0}, "runs_per_prompt": 5, "request_rate": [1, 2, 4, 8]})


def sweep_data():
    views = [dict(p, decision="keep", reasons=[]) for p in POINTS]
    for view in views:
        for side in ("baseline", "candidate"):
            view[side] = dict(view[side], itl_ms={"median": 1.0, "p99": 2.0})
    return {"title": "T", "context": CONTEXT, "result": {"points": views, "break_even": None, "target": None, "k": {}}}


def test_a_report_asked_for_plots_without_matplotlib_writes_nothing_and_one_without_plots_is_written(tmp_path, monkeypatch):
    hide_matplotlib(monkeypatch)
    with pytest.raises(SpecDecodingError, match="matplotlib"):
        bench_report.write_sweep_report(sweep_data(), str(tmp_path / "r"), basename="s")
    assert sorted(os.listdir(str(tmp_path / "r"))) == []  # no Markdown or JSON without the plots they name
    paths = bench_report.write_sweep_report(sweep_data(), str(tmp_path / "r"), basename="s", plots=False)
    assert paths["plots"] == {} and sorted(os.listdir(str(tmp_path / "r"))) == ["s.json", "s.md"]


def test_the_report_and_sweep_code_do_not_import_matplotlib_until_a_plot_is_drawn():
    """A module that does not plot (canary_observe through bench_report, spec_benchmark with plots off) does not pay matplotlib's import."""
    code = ("import sys\n"
            "from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import plots as bench_plots\n"
            "from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report, sweep as spec_sweep\n"
            "print(any(n == 'matplotlib' or n.startswith('matplotlib.') for n in sys.modules))\n"
            "bench_plots.require_matplotlib()\n"
            "print('matplotlib.backends.backend_agg' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=dict(os.environ))
    assert out.stdout.split() == ["False", "True"], out.stderr


def test_the_docs_plot_data_is_the_published_run_and_draws_both_plots(tmp_path):
    """docs/when-it-pays/tune-sweep.json holds the numbers docs/when-it-pays.md prints; hack/docs_plots.py draws them."""
    with open(os.path.join(REPO, "docs", "when-it-pays", "tune-sweep.json"), encoding="utf-8") as handle:
        data = json.load(handle)
    result = data["result"]
    doc = open(os.path.join(REPO, "docs", "when-it-pays.md"), encoding="utf-8").read()
    for view in result["points"]:  # each table row of the doc, from the data
        for side, name in (("baseline", "baseline"), ("candidate", "ngram k=5")):
            row = "| %g req/s | %s | %.2f (%.2f) | %.2f (%.2f) | %.2f |" % (
                view["load"], name, view[side]["ttft_ms"]["median"], view[side]["ttft_ms"]["p99"], view[side]["tpot_ms"]["median"],
                view[side]["tpot_ms"]["p99"], view[side]["output_throughput"])
            assert row in doc, row
    # the break-even and the k table, recomputed from the data with the run's tolerances, are the doc's
    points = [{"kind": v["kind"], "load": v["load"], "baseline": v["baseline"], "candidate": v["candidate"]} for v in result["points"]]
    be = sweep_analysis.break_even(points, data["tolerances"])
    assert (be["last_keep_load"], be["first_roll_back_load"], be["crossed_first"]) == (8, 16, "tpot")
    assert "%.3g" % be["crossover_load"] == "10.9" and "TPOT crossed first, at about 10.9 req/s" in doc
    assert be["crossover_load"] == pytest.approx(result["break_even"]["crossover_load"])
    pred = result["k"]["prediction"]
    gains = ["%.3f" % row["expected_gain"] for row in k_model.recommend_k(pred["per_position_rates"], pred["verify_cost_ratio"], 5)["table"]]
    assert gains == ["1.516", "1.687", "1.732", "1.697", "1.639"] and pred["predicted_k"] == 3
    assert "0.867, 0.600, 0.467, 0.333, 0.267" in doc and "measured speedup of k=3 over k=5 was 0.919" in doc
    spec = importlib.util.spec_from_file_location("docs_plots", os.path.join(REPO, "hack", "docs_plots.py"))
    docs_plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_plots)
    prefix = str(tmp_path / "tune")
    assert docs_plots.draw(os.path.join(REPO, "docs", "when-it-pays", "tune-sweep.json"), prefix) == [prefix + "-load.png", prefix + "-k.png"]
    assert read_png(prefix + "-load.png")[:2] == expected_size("sweep_load") and read_png(prefix + "-k.png")[:2] == expected_size("k_curve")
    for name, kind in (("tune-load.png", "sweep_load"), ("tune-k.png", "k_curve")):  # the committed plots are this code's size
        assert read_png(os.path.join(REPO, "docs", "when-it-pays", name))[:2] == expected_size(kind)


def test_k_schedule_figure_draws_the_schedule_beside_the_measured_curve():
    fig = bench_plots.k_schedule_figure(PER_LOAD, SCHEDULE)
    speed, k_axis = fig.get_axes()
    assert speed.get_title() == "Speedup against batch size" and k_axis.get_title() == "num_speculative_tokens_per_batch_size"
    assert speed.get_xlabel() == k_axis.get_xlabel() == "batch size (requests in flight)"
    drawn = lines(speed)
    assert drawn["measured speedup (deployed k)"] == ([1, 4, 8], [1.8, 1.3, 0.9])
    assert drawn["predicted gain, schedule's k"] == ([1, 4, 8], [1.75, 1.25, 1.0])
    k_lines = lines(k_axis)
    assert k_lines["best k at this load"] == ([1, 4, 8], [2, 1, 0])
    # the k vLLM drafts at each batch size 1..8 under the schedule
    assert k_lines["schedule: 1-3: k=3; 4-7: k=1; 8+: k=0"] == ([1, 2, 3, 4, 5, 6, 7, 8], [3, 3, 3, 1, 1, 1, 1, 0])
    assert set(legend_texts(k_axis)) == set(k_lines)
