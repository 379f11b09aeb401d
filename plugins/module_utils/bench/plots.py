# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The PNG plots of the benchmark and sweep reports, drawn with matplotlib.

Five plots, each a ``*_figure`` function that returns the matplotlib ``Figure`` (the tests read its titles, axis
labels and lines) and a ``plot_*`` function that saves it as PNG and returns the path (what ``bench_report``'s
writers call):

- ``latency``: empirical CDFs of TTFT, TPOT and ITL, baseline against speculative decoding (``spec_benchmark``);
- ``acceptance``: the speculative side's per-position acceptance rate (``spec_benchmark``);
- ``sweep_load``: speedup and median TPOT against load, with the break-even and the target QPS (``spec_sweep``);
- ``k_curve``: the per-position curve and the expected gain per k, with the predicted k and the measured A/B
  (``spec_sweep``);
- ``k_schedule``: the measured speedup and the best k at each load's batch size, beside the
  ``num_speculative_tokens_per_batch_size`` schedule derived from them (``spec_sweep`` with ``k_schedule``).

matplotlib is imported by ``require_matplotlib``, which every figure calls first, and not at module import: the
modules that do not plot do not pay its import (about half a second), and ansible-test's import check runs without
it. Figures use the Agg canvas directly (``Figure`` + ``FigureCanvasAgg``), never pyplot's global state, so two
reports drawn in one process cannot share a figure. Without matplotlib a report asked for plots is refused with
``SpecDecodingError`` naming the package and the fix; it is never written without the plots it was asked for.
"""

from __future__ import annotations

import sys

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError

MATPLOTLIB_REQUIREMENT = "matplotlib>=3.8"
DPI = 100
# Inches at DPI: one panel 8 x 4.5 (800 x 450 px); two and three panels side by side keep about that panel size, the
# sweep plots half an inch more for their legends under the axes.
FIGSIZE = {"acceptance": (8.0, 4.5), "classes": (8.0, 4.5), "sweep_load": (12.0, 5.0), "k_curve": (12.0, 5.0), "k_schedule": (12.0, 5.0),
           "sweep_classes": (8.0, 4.5),
           "latency": (14.0, 4.5)}

SIDE_LABELS = {"baseline": "baseline", "candidate": "speculative decoding"}
COLORS = {"baseline": "#1f77b4", "candidate": "#d62728"}
SWEEP_COLORS = {"break_even": "#2ca02c", "target": "#9467bd", "unity": "#808080", "predicted": "#ff7f0e"}
LOAD_AXIS = {"request_rate": "request rate (req/s)", "concurrency": "concurrency (requests in flight)"}
LOAD_UNIT = {"request_rate": "req/s", "concurrency": "requests in flight"}
LATENCY_PANELS = (
    ("ttft", "Time to first token (TTFT)", "TTFT (ms)", "fraction of requests"),
    ("tpot", "Time per output token (TPOT)", "TPOT (ms)", "fraction of requests"),
    ("itl", "Inter-token latency (ITL)", "ITL per streamed chunk (ms)", "fraction of chunks"),
)


def require_matplotlib():
    """``(Figure, FigureCanvasAgg)`` from matplotlib, or ``SpecDecodingError`` naming the package and how to install it.

    Modules call it before their first request when ``plots`` is on, so a long benchmark is not refused at its end.
    """
    try:
        from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        raise SpecDecodingError(
            "the report's PNG plots need the Python package matplotlib, which %s cannot import (%s)" % (sys.executable, exc),
            field="plots",
            hint="install it for that interpreter on the host that runs the module (`%s -m pip install '%s'`; it is in the "
                 "collection's requirements.txt, which its execution environment installs), or set plots: false"
                 % (sys.executable, MATPLOTLIB_REQUIREMENT))
    return Figure, FigureCanvasAgg


def _figure(kind, panels=1):
    """A figure of ``FIGSIZE[kind]`` on its own Agg canvas, and its axes (a list, one per panel)."""
    figure_class, canvas_class = require_matplotlib()
    fig = figure_class(figsize=FIGSIZE[kind], dpi=DPI, layout="constrained")
    canvas_class(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for axis in axes:
        axis.grid(True, alpha=0.3)
    return fig, list(axes)


def save(fig, path):
    """Write ``fig`` as a PNG of exactly ``figsize * DPI`` pixels; return ``path``."""
    fig.savefig(path, format="png", dpi=DPI)
    return path


def _num(value):
    """Short number text for labels: 10.949 -> 10.9, 8.0 -> 8, 0.25 -> 0.25."""
    return "%.3g" % value


def _nan(value):
    return float("nan") if value is None else value


def _load_ticks(axis, loads):
    axis.set_xticks(loads)
    axis.set_xticklabels([_num(x) for x in loads], rotation=45 if len(loads) > 8 else 0)


def _legend(axis, below=False, **kwargs):
    """The axis' legend, if anything is labelled; ``below`` puts it under the x label, where it cannot hide a line."""
    if not any(not label.startswith("_") for label in axis.get_legend_handles_labels()[1]):
        return
    if below:
        kwargs = dict(dict(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False), **kwargs)
    axis.legend(fontsize="small", framealpha=0.9, **kwargs)


# -- spec_benchmark: latency distributions and the acceptance curve -------------------------------------------------
def latency_series(records):
    """Per-metric samples in ms from request records: ``{"ttft": [...], "tpot": [...], "itl": [...]}``."""
    ok = [r for r in records if r.get("success")]
    return {
        "ttft": [r["ttft"] * 1000.0 for r in ok],
        "tpot": [t * 1000.0 for t in (bench_stats.tpot_of(r) for r in ok) if t is not None],
        "itl": [g * 1000.0 for r in ok for g in (r.get("itl") or [])],
    }


def _ecdf(values):
    """Steps of the empirical CDF, from 0 at the smallest sample to 1 at the largest (drawn with ``where="post"``)."""
    data = sorted(values)
    count = len(data)
    return [data[0]] + data, [0.0] + [(i + 1) / float(count) for i in range(count)]


def latency_figure(baseline_records, candidate_records):
    """Empirical CDFs of TTFT, TPOT and ITL, baseline against speculative decoding, one panel each."""
    series = {"baseline": latency_series(baseline_records), "candidate": latency_series(candidate_records)}
    fig, axes = _figure("latency", panels=len(LATENCY_PANELS))
    for axis, (key, title, xlabel, ylabel) in zip(axes, LATENCY_PANELS):
        samples = [v for side in series for v in series[side][key]]
        for side in ("baseline", "candidate"):
            values = series[side][key]
            if values:
                xs, ys = _ecdf(values)
                axis.step(xs, ys, where="post", color=COLORS[side], linewidth=1.6,
                          label="%s (median %.2f ms, n=%d)" % (SIDE_LABELS[side], bench_stats.median(values), len(values)))
        if samples and min(samples) > 0 and max(samples) > 10 * min(samples):
            axis.set_xscale("log")  # per-chunk gaps span orders of magnitude (bundled tokens, stalls)
            xlabel += ", log scale"
        if not samples:
            axis.text(0.5, 0.5, "no successful requests", transform=axis.transAxes, ha="center", va="center", color="#606060")
        axis.set_title(title)
        axis.set_xlabel(xlabel)
        axis.set_ylabel(ylabel)
        axis.set_ylim(0, 1.02)
        _legend(axis, loc="lower right")
    fig.suptitle("Latency distributions (empirical CDF): baseline vs speculative decoding")
    return fig


def plot_latency(baseline_records, candidate_records, path):
    """Save ``latency_figure`` to ``path`` (PNG); return ``path``."""
    return save(latency_figure(baseline_records, candidate_records), path)


def acceptance_figure(per_position):
    """The speculative side's acceptance rate per draft position (1..k), each point labelled with its value."""
    positions = list(range(1, len(per_position) + 1))
    fig, (axis,) = _figure("acceptance")
    axis.plot(positions, per_position, marker="o", color=COLORS["candidate"], label="%s: accepted / drafts" % SIDE_LABELS["candidate"])
    for x_val, y_val in zip(positions, per_position):
        axis.annotate("%.3f" % y_val, (x_val, y_val), textcoords="offset points", xytext=(0, 7), ha="center", fontsize="small")
    axis.set_xticks(positions)
    axis.set_xlim(0.5, len(positions) + 0.5)
    axis.set_ylim(0, 1.05)
    axis.set_xlabel("draft position (slot)")
    axis.set_ylabel("acceptance rate (fraction of drafts)")
    axis.set_title("Per-position acceptance rate of the speculative side")
    _legend(axis, loc="upper right")
    return fig


def plot_acceptance(per_position, path):
    """Save ``acceptance_figure`` to ``path`` (PNG); return ``path``."""
    return save(acceptance_figure(per_position), path)


def classes_figure(block):
    """Median TPOT per request class, baseline beside speculative decoding, with their 95% intervals; each class labelled
    with its speedup and decision (the report's ``classes`` block, bench/request_classes.py)."""
    entries = block["classes"]
    names = ["(unclassified)" if e["class"] is None else e["class"] for e in entries]
    fig, (axis,) = _figure("classes")
    width = 0.38
    for offset, side in ((-width / 2, "baseline"), (width / 2, "candidate")):
        medians = [e["latency"]["tpot_ms"][side] for e in entries]
        low_high = [e["latency"]["tpot_ms"][side + "_interval"] for e in entries]
        errors = [[0.0 if not lh or m is None else m - lh[0] for m, lh in zip(medians, low_high)],
                  [0.0 if not lh or m is None else lh[1] - m for m, lh in zip(medians, low_high)]]
        axis.bar([i + offset for i in range(len(entries))], [_nan(m) for m in medians], width, yerr=errors, capsize=4, color=COLORS[side],
                 label="%s median TPOT (95%% interval)" % SIDE_LABELS[side])
    for index, entry in enumerate(entries):
        tpot = entry["latency"]["tpot_ms"]
        tops = [v for v in (tpot["baseline"], tpot["candidate"]) if v is not None]
        tops += [interval[1] for interval in (tpot["baseline_interval"], tpot["candidate_interval"]) if interval]  # above the bars
        text = "%s, %s" % ("n/a" if entry["speedup"] is None else "%.2fx" % entry["speedup"], entry["decision"])
        axis.annotate(text, (index, max(tops) if tops else 0.0), textcoords="offset points", xytext=(0, 6), ha="center",
                      fontsize="small")
    axis.set_xticks(list(range(len(entries))))
    axis.set_xticklabels(names)
    axis.set_ylim(0, axis.get_ylim()[1] * 1.15)
    axis.set_xlabel("request class")
    axis.set_ylabel("median TPOT (ms)")
    axis.set_title("Per request class: median TPOT, speedup and decision")
    _legend(axis, loc="upper right")
    return fig


def plot_classes(block, path):
    """Save ``classes_figure`` to ``path`` (PNG); return ``path``."""
    return save(classes_figure(block), path)


# -- spec_sweep: speedup and TPOT against load, and the k curve ---------------------------------------------------------
def _load_marks(break_even, target_qps, kind):
    """``[(load, color, label)]``: the break-even (or the first roll_back load when nothing crossed) and the target QPS."""
    marks = []
    unit = LOAD_UNIT[kind]
    break_even = break_even or {}
    if break_even.get("crossover_load") is not None:
        marks.append((break_even["crossover_load"], SWEEP_COLORS["break_even"], "break-even about %s %s" % (_num(break_even["crossover_load"]), unit)))
    elif break_even.get("first_roll_back_load") is not None:
        marks.append((break_even["first_roll_back_load"], SWEEP_COLORS["break_even"],
                      "first roll_back at %s %s" % (_num(break_even["first_roll_back_load"]), unit)))
    if target_qps is not None and kind == "request_rate":
        marks.append((target_qps, SWEEP_COLORS["target"], "target %s req/s" % _num(target_qps)))
    return marks


def _vlines(axis, marks):
    for value, color, label in marks:
        axis.axvline(value, color=color, linestyle="--", linewidth=1.2, label=label)


def sweep_load_figure(points, break_even, target_qps, kind="request_rate"):
    """Speedup and median TPOT against load for both sides, with the break-even and the target QPS drawn.

    ``points``: the sweep module's point views (``load``, ``speedup``, ``baseline``/``candidate`` with ``tpot_ms``).
    """
    marks = _load_marks(break_even, target_qps, kind)
    loads = [p["load"] for p in points]
    fig, (speed_axis, tpot_axis) = _figure("sweep_load", panels=2)
    speed_axis.plot(loads, [_nan(p["speedup"]) for p in points], marker="o", color=COLORS["candidate"],
                    label="speculative / baseline output tokens/s")
    speed_axis.axhline(1.0, color=SWEEP_COLORS["unity"], linestyle=":", linewidth=1.2, label="1.0 = as fast as the baseline")
    _vlines(speed_axis, marks)
    speed_axis.set_title("Speedup against load")
    speed_axis.set_ylabel("speedup (\u00d7, output tokens/s ratio)")
    for side in ("baseline", "candidate"):
        tpot_axis.plot(loads, [_nan((p[side].get("tpot_ms") or {}).get("median")) for p in points], marker="o", color=COLORS[side],
                       label=SIDE_LABELS[side])
    _vlines(tpot_axis, marks)
    tpot_axis.set_ylim(bottom=0)  # a latency cannot go below 0; a zero-based axis shows the real ratio of the two lines
    tpot_axis.set_title("Median TPOT against load")
    tpot_axis.set_ylabel("median TPOT (ms)")
    for axis in (speed_axis, tpot_axis):
        axis.set_xlabel(LOAD_AXIS[kind])
        _load_ticks(axis, loads)
        _legend(axis, below=True)
    fig.suptitle("Load sweep: where speculative decoding stops paying")
    return fig


def plot_sweep_load(points, break_even, target_qps, path, kind="request_rate"):
    """Save ``sweep_load_figure`` to ``path`` (PNG); return ``path``."""
    return save(sweep_load_figure(points, break_even, target_qps, kind=kind), path)


def sweep_classes_figure(block):
    """Speedup against load per request class, with each class's break-even and the target QPS (the sweep's ``classes``
    block, bench/sweep_classes.py)."""
    kind = block["kind"]
    fig, (axis,) = _figure("sweep_classes")
    loads = sorted({row["load"] for entry in block["classes"] for row in entry["loads"]})
    cycle = [SWEEP_COLORS["predicted"], COLORS["candidate"], COLORS["baseline"], SWEEP_COLORS["break_even"], SWEEP_COLORS["target"]]
    for index, entry in enumerate(block["classes"]):
        color = cycle[index % len(cycle)]
        name = "(unclassified)" if entry["class"] is None else entry["class"]
        axis.plot([row["load"] for row in entry["loads"]], [_nan(row["speedup"]) for row in entry["loads"]], marker="o", color=color,
                  label="%s: %s" % (name, entry["break_even_text"]))
        crossover = (entry.get("break_even") or {}).get("crossover_load")
        if crossover is not None:
            axis.axvline(crossover, color=color, linestyle="--", linewidth=1.0)
    axis.axhline(1.0, color=SWEEP_COLORS["unity"], linestyle=":", linewidth=1.2, label="1.0 = as fast as the baseline")
    if block.get("target_qps") is not None and kind == "request_rate":
        axis.axvline(block["target_qps"], color=SWEEP_COLORS["target"], linestyle="-.", linewidth=1.2,
                     label="target %s req/s" % _num(block["target_qps"]))
    axis.set_xlabel(LOAD_AXIS[kind])
    axis.set_ylabel("speedup (\u00d7, the class's output tokens/s ratio)")
    axis.set_title("Per request class: speedup against load (dashed: break-even)")
    if loads:
        _load_ticks(axis, loads)
    _legend(axis, below=True)
    return fig


def plot_sweep_classes(block, path):
    """Save ``sweep_classes_figure`` to ``path`` (PNG); return ``path``."""
    return save(sweep_classes_figure(block), path)


def _measured_points(confirmation):
    """``[(k, speedup over the baseline, label)]`` measured by the confirmation A/B: the predicted k and the current k."""
    conf = confirmation or {}
    measured = []
    vs_baseline = conf.get("measured_speedup_vs_baseline")
    if vs_baseline is not None and conf.get("predicted_k") is not None:
        measured.append((conf["predicted_k"], vs_baseline, "predicted"))
    if conf.get("current_k") is not None and vs_baseline and conf.get("measured_speedup_vs_current"):
        measured.append((conf["current_k"], vs_baseline / conf["measured_speedup_vs_current"], "current"))
    return sorted(measured)


def k_curve_figure(prediction, confirmation):
    """The per-position acceptance curve and the expected gain per k, with the predicted k and the measured A/B marked."""
    rates = prediction.get("per_position_rates") or []
    table = prediction.get("table") or []
    positions = list(range(1, len(rates) + 1))
    fig, (curve_axis, gain_axis) = _figure("k_curve", panels=2)
    curve_axis.plot(positions, rates, marker="o", color=COLORS["candidate"], label="accepted / drafts, per slot")
    for x_val, y_val in zip(positions, rates):
        curve_axis.annotate("%.3f" % y_val, (x_val, y_val), textcoords="offset points", xytext=(0, 7), ha="center", fontsize="small")
    curve_axis.set_xticks(positions)
    curve_axis.set_xlim(0.5, len(rates) + 0.5)
    curve_axis.set_ylim(0, 1.05)
    curve_axis.set_title("Per-position acceptance (cumulative)")
    curve_axis.set_xlabel("draft position (slot)")
    curve_axis.set_ylabel("acceptance rate (fraction of drafts)")
    _legend(curve_axis, below=True)

    ks = [row["k"] for row in table]
    gain_axis.plot(ks, [row["expected_gain"] for row in table], marker="o", color=SWEEP_COLORS["predicted"],
                   label="predicted gain E(k) / cost(k)")
    measured = _measured_points(confirmation)
    if measured:
        gain_axis.plot([k for k, _v, _w in measured], [v for _k, v, _w in measured], marker="s", linestyle="-", linewidth=1,
                       color=COLORS["baseline"], label="measured speedup over the baseline")
        for k_val, value, which in measured:
            gain_axis.annotate("%.3f (%s k)" % (value, which), (k_val, value), textcoords="offset points",
                               xytext=(-7, 7 if value >= 1.0 else -14), ha="right", fontsize="small", color=COLORS["baseline"])
    if prediction.get("predicted_k") is not None:
        gain_axis.axvline(prediction["predicted_k"], color=SWEEP_COLORS["predicted"], linestyle="--", linewidth=1.2,
                          label="predicted k=%d" % prediction["predicted_k"])
    gain_axis.axhline(1.0, color=SWEEP_COLORS["unity"], linestyle=":", linewidth=1.2, label="1.0 = as fast as the baseline")
    gain_axis.set_xticks(ks)
    gain_axis.set_xlim(0.5, max(ks + [1]) + 0.5)
    gain_axis.margins(y=0.15)
    gain_axis.set_title("Expected gain per k, and measured")
    gain_axis.set_xlabel("num_speculative_tokens (k)")
    gain_axis.set_ylabel("speedup over the baseline (\u00d7)")
    _legend(gain_axis, below=True)
    fig.suptitle("num_speculative_tokens: the acceptance curve and the predicted k")
    return fig


def plot_k_curve(prediction, confirmation, path):
    """Save ``k_curve_figure`` to ``path`` (PNG); return ``path``."""
    return save(k_curve_figure(prediction, confirmation), path)


def k_schedule_figure(per_load, schedule):
    """Left: the measured speedup at the deployed k and the predicted gain at the schedule's k, per batch size.
    Right: the best k measured at each load and the schedule's k (a step line: what vLLM drafts at each batch size)."""
    rows = sorted((r for r in per_load if r.get("batch_size") is not None), key=lambda r: (r["batch_size"], r["load"]))
    steps = {(s["batch_size"], s["load"]): s for s in (schedule or {}).get("steps") or []}
    sizes = [r["batch_size"] for r in rows]
    fig, (speed_axis, k_axis) = _figure("k_schedule", panels=2)
    speed_axis.plot(sizes, [_nan(r.get("measured_speedup")) for r in rows], marker="o", color=COLORS["candidate"],
                    label="measured speedup (deployed k)")
    predicted = [(r["batch_size"], steps[(r["batch_size"], r["load"])]["gain_k"]) for r in rows if (r["batch_size"], r["load"]) in steps]
    if predicted:
        speed_axis.plot([x for x, _y in predicted], [y for _x, y in predicted], marker="^", linestyle="--",
                        color=SWEEP_COLORS["predicted"], label="predicted gain, schedule's k")
    speed_axis.axhline(1.0, color=SWEEP_COLORS["unity"], linestyle=":", linewidth=1.2, label="1.0 = baseline")
    speed_axis.set_title("Speedup against batch size")
    speed_axis.set_ylabel("speedup (\u00d7)")
    k_axis.plot(sizes, [_nan(r.get("best_k")) for r in rows], marker="o", linestyle="none", color=COLORS["baseline"],
                label="best k at this load")
    entries = (schedule or {}).get("schedule") or []
    if entries:
        top = max(sizes + [entries[-1][1]])
        xs = list(range(1, top + 1))
        ks = [next(k for start, _end, k in reversed(entries) if start <= x) for x in xs]
        k_axis.step(xs, ks, where="post", color=SWEEP_COLORS["predicted"], linewidth=2,
                    label="schedule: %s" % schedule.get("describe"))
    k_axis.set_ylim(-0.3, max([r.get("best_k") or 0 for r in rows] + [e[2] for e in entries] + [1]) + 0.5)
    k_axis.yaxis.get_major_locator().set_params(integer=True)
    k_axis.set_title("num_speculative_tokens_per_batch_size")
    k_axis.set_ylabel("num_speculative_tokens (k)")
    for axis in (speed_axis, k_axis):
        axis.set_xlabel("batch size (requests in flight)")
        if sizes:
            _load_ticks(axis, sorted(set(sizes)))
        _legend(axis, below=True, ncol=1)
    fig.suptitle("A k for each load: the schedule beside the measured curve")
    return fig


def plot_k_schedule(per_load, schedule, path):
    """Save ``k_schedule_figure`` to ``path`` (PNG); return ``path``."""
    return save(k_schedule_figure(per_load, schedule), path)
