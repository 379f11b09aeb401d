# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The A/B comparison and the keep/roll_back decision (spec_benchmark's keep rule).

``decide`` keeps the candidate only if median TTFT, median TPOT and the output rate all pass (each within its
tolerance), no more requests failed than on the baseline, and neither side's streams were burst-delivered; the
load sweep (bench/sweep_analysis.py) and the canary's window (bench/canary_window.py) decide with it too. ``compare`` is the
report's comparison block. The report itself (context, Markdown, JSON) is bench/report.py.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

DECISIONS = ("keep", "roll_back")
DEFAULT_TOLERANCES = {"ttft": 0.0, "tpot": 0.0, "throughput": 0.0}
# More than this share of a side's completed requests burst-delivered (bench_stats.burst_delivered) and the
# decision cannot be keep: that side's TTFT, ITL and TPOT are buffer timings, not per-token ones. A few such
# requests (a scheduling hiccup of the client) only get a note; their effect on the medians is small.
BURST_MAX_SHARE = 0.10

LATENCY_ROWS = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "ITL (ms)"), ("e2el_ms", "E2E latency (ms)"))


def _median(summary, key):
    return ((summary or {}).get(key) or {}).get("median")


def compare(baseline, candidate, acceptance=None):
    """Comparison block: speedup (output tok/s ratio), wall-time delta, medians, acceptance, ceiling conversion."""
    speedup = bench_stats.ratio(candidate.get("output_throughput"), baseline.get("output_throughput"))
    metrics = {}
    for key, _label in LATENCY_ROWS:
        b_val, c_val = _median(baseline, key), _median(candidate, key)
        metrics[key] = {"baseline": b_val, "candidate": c_val, "change": bench_stats.relative_change(b_val, c_val)}
    for key in ("output_throughput", "request_throughput", "total_token_throughput"):
        b_val, c_val = baseline.get(key), candidate.get(key)
        metrics[key] = {"baseline": b_val, "candidate": c_val, "change": bench_stats.relative_change(b_val, c_val)}
    b_wall, c_wall = baseline.get("duration_s"), candidate.get("duration_s")
    wall = {"baseline_s": b_wall, "candidate_s": c_wall,
            "delta_s": (c_wall - b_wall) if b_wall is not None and c_wall is not None else None,
            "change": bench_stats.relative_change(b_wall, c_wall)}
    mal = (acceptance or {}).get("mean_acceptance_length")
    return {
        "speedup": speedup,
        "wall_time": wall,
        "metrics": metrics,
        "acceptance": acceptance,
        # Of the ceiling speculative decoding offers (each verify step emits `mean acceptance length` tokens),
        # the share that became end-to-end throughput.
        "ceiling_conversion": bench_stats.ratio(speedup, mal) if mal else None,
    }


def check_tolerances(tolerances):
    """The tolerances to decide with (defaults filled in); a ValidationError for an unknown key or a value outside [0, 1)."""
    tol = dict(DEFAULT_TOLERANCES)
    for key, value in (tolerances or {}).items():
        if key not in DEFAULT_TOLERANCES:
            raise ValidationError("unknown tolerance %r" % (key,), field="tolerances", hint="use ttft, tpot and throughput")
        if value is None:
            continue
        try:
            value = float(value)
        except (TypeError, ValueError):
            value = -1.0
        if value < 0 or value >= 1:
            raise ValidationError("%s must be a fraction in [0, 1), got %r" % (key, tolerances[key]), field="tolerances",
                                  hint="e.g. 0.05 allows 5% worse")
        tol[key] = value
    return tol


def burst_counts(summary):
    """``(burst-delivered, completed, median chunk gap in ms or None)`` of one side's summary.

    Summaries written before the count existed (a saved baseline phase) have no ``burst_delivered``: 0.
    """
    summary = summary or {}
    return int(summary.get("burst_delivered") or 0), int(summary.get("completed") or 0), summary.get("burst_delivered_median_gap_ms")


def too_many_bursts(summary):
    """Whether more than ``BURST_MAX_SHARE`` of the side's completed requests were burst-delivered."""
    bursts, completed, _gap = burst_counts(summary)
    return bool(completed) and bursts > BURST_MAX_SHARE * completed


def _gap_text(gap_ms):
    return "n/a" if gap_ms is None else "%.3f ms" % gap_ms


BURST_FIX = ("turn off response buffering on that path (e.g. nginx `proxy_buffering off`, or the response header "
             "`X-Accel-Buffering: no`), or run the benchmark closer to the server or on its own cores, then measure again")


def burst_notes(baseline, candidate):
    """One note per side whose summary counts burst-delivered requests (``bench_stats.burst_delivered``)."""
    notes = []
    for name, summary in (("baseline", baseline), ("candidate", candidate)):
        bursts, completed, gap_ms = burst_counts(summary)
        if not bursts:
            continue
        notes.append(
            "burst delivery on the %s: %d of %d requests' streams arrived in bursts (median gap between their chunks %s, "
            "under %.1f ms), so their TTFT is about the whole request's latency and their ITL and TPOT are near zero, not "
            "per-token timings. Something between the server and the benchmark buffers the stream: an ingress, proxy or "
            "service mesh with response buffering, or the benchmark client was starved of CPU on a machine it shares with "
            "the server. Fix: %s. %s" % (
                name, bursts, completed, _gap_text(gap_ms), bench_stats.BURST_MAX_MEDIAN_GAP_S * 1000.0, BURST_FIX,
                ("More than %d%% of the side's requests, so the decision is roll_back." if too_many_bursts(summary)
                 else "At most %d%% of the side's requests, so the decision is not refused for it.") % round(100 * BURST_MAX_SHARE)))
    return notes


def decide(baseline, candidate, tolerances=None, load=None):
    """``keep`` only if TTFT, per-token latency (TPOT) and output throughput all improve; else ``roll_back``.

    A tolerance ``t`` lets a metric be at most ``t`` (a fraction) worse and still count: latency passes when
    ``candidate <= baseline * (1 + t)``, throughput when ``candidate >= baseline * (1 - t)``.

    ``keep`` is also refused when more than ``BURST_MAX_SHARE`` of either side's completed requests were
    burst-delivered (``burst_delivered`` in the summary, missing counts as 0): that side was not timed per token.
    """
    tol = check_tolerances(tolerances)
    checks = []
    spec = (
        ("ttft", "median TTFT", _median(baseline, "ttft_ms"), _median(candidate, "ttft_ms"), "lower", "ms"),
        ("tpot", "median TPOT (per-token latency)", _median(baseline, "tpot_ms"), _median(candidate, "tpot_ms"), "lower", "ms"),
        ("throughput", "output throughput", baseline.get("output_throughput"), candidate.get("output_throughput"), "higher", "tok/s"),
    )
    reasons = []
    for key, label, b_val, c_val, better, unit in spec:
        check = {"metric": key, "label": label, "baseline": b_val, "candidate": c_val, "better": better, "tolerance": tol[key],
                 "change": bench_stats.relative_change(b_val, c_val)}
        if b_val is None or c_val is None:
            check["passed"] = False
            reasons.append("%s was not measured on %s" % (label, "the baseline" if b_val is None else "the candidate"))
        else:
            if better == "lower":
                limit = b_val * (1.0 + tol[key])
                check["passed"] = c_val <= limit
            else:
                limit = b_val * (1.0 - tol[key])
                check["passed"] = c_val >= limit
            check["limit"] = limit
            if not check["passed"]:
                reasons.append("%s %s: candidate %.2f %s vs baseline %.2f %s (%+.1f%%, tolerance %.1f%%)" % (
                    label, "got worse" if better == "lower" else "dropped", c_val, unit, b_val, unit,
                    100.0 * check["change"] if check["change"] is not None else float("nan"), 100.0 * tol[key]))
        checks.append(check)
    b_fail = _failure_rate(baseline)
    c_fail = _failure_rate(candidate)
    if c_fail is not None and c_fail > (b_fail or 0.0):
        reasons.append("the candidate failed %d of %d requests (baseline %d)" % (
            candidate.get("failed", 0), candidate.get("failed", 0) + candidate.get("completed", 0), baseline.get("failed", 0)))
    burst_reasons = []
    for name, summary in (("baseline", baseline), ("candidate", candidate)):
        if too_many_bursts(summary):
            bursts, completed, gap_ms = burst_counts(summary)
            burst_reasons.append(
                "TTFT, ITL and TPOT were not measured per token on the %s: %d of %d streams arrived in bursts (median gap "
                "between their chunks %s; more than %d%% of the completed requests); something between the server and the benchmark "
                "buffers the stream (an ingress, proxy or service mesh, or a CPU-starved benchmark client): %s" % (
                    name, bursts, completed, _gap_text(gap_ms), round(100 * BURST_MAX_SHARE), BURST_FIX))
    reasons = burst_reasons + reasons  # first: they make the comparisons above meaningless
    decision = "keep" if not reasons else "roll_back"
    if decision == "keep":
        reasons = ["TTFT, per-token latency and throughput all improved (within tolerances) at the target load"]
    return {"decision": decision, "reasons": reasons, "checks": checks, "tolerances": tol, "load": load}


def _failure_rate(summary):
    total = (summary.get("completed") or 0) + (summary.get("failed") or 0)
    return (summary.get("failed") or 0) / float(total) if total else None
