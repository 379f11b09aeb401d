# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The A/B comparison and the keep/roll_back decision (spec_benchmark's keep rule).

``decide`` keeps the candidate only if median TPOT or the output rate is better beyond the noise and median TTFT,
median TPOT and the output rate are not worse beyond their tolerances (bench/noise.py's tests), no more requests failed
than on the baseline, and neither side's streams were burst-delivered; the
load sweep (bench/sweep_analysis.py) and the canary's window (bench/canary_window.py) decide with it too. ``compare`` is the
report's comparison block. The report itself (context, Markdown, JSON) is bench/report.py.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import noise
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


DEFAULT_CONFIDENCE = 0.95
# figure names of the noise tests (bench/noise.py) for the keep rule's checks
_FIGURES = {"ttft": "ttft_median", "tpot": "tpot_median", "throughput": "output_rate"}
# the figures on which speculative decoding has to show its gain (per-token latency, or the output rate it buys)
GAIN_METRICS = ("tpot", "throughput")


def evidence(summary):
    """What a side's summary carries for the noise tests: the client's per-request samples (``summarize_run``) or the
    window's histogram buckets (the canary's ``as_bench_summary``)."""
    summary = summary or {}
    return {"samples": summary.get("samples") or {}, "buckets": summary.get("buckets") or {}}


def _sure(pvalue):
    return "n/a" if pvalue is None else "%.1f%%" % (100.0 * (1.0 - pvalue))


def figure_test(figure, b_ev, c_ev, better, tolerance, confidence):
    """``noise.pvalues`` of one figure on two sides' ``evidence``; ``{"error"}`` when their histograms share no bound."""
    try:
        return noise.pvalues(figure, b_ev, c_ev, better, tolerance, confidence)
    except noise.BoundsMismatch as exc:
        return {"error": str(exc)}


def decide(baseline, candidate, tolerances=None, load=None, confidence=DEFAULT_CONFIDENCE, fail_alpha=None):
    """``keep`` only when speculative decoding shows its gain beyond the noise and nothing got worse; else ``roll_back``.

    - The guards: median TTFT, median TPOT and the output rate may be at most their tolerance ``t`` (a fraction) worse:
      latency ``candidate <= baseline * (1 + t)``, rate ``candidate >= baseline * (1 - t)``. A guard fails only when its
      noise test (bench/noise.py: ranks on the per-request samples or the histogram buckets) is sure the candidate is
      beyond that limit: its p-value below ``fail_alpha`` (default: ``1 - confidence`` split over the three guards, so
      an identical pair fails a guard at most ``1 - confidence`` of the time).
    - The gain: median TPOT lower or the output rate higher than the baseline's, sure at ``1 - (1 - confidence) / 2``
      each (either one, so an identical pair is kept at most ``1 - confidence`` of the time).
    - ``keep`` is also refused when the candidate failed more requests, or more than ``BURST_MAX_SHARE`` of either side's
      completed requests were burst-delivered (that side was not timed per token).

    A side without samples or buckets (a saved baseline from before they were kept) is compared by its point figures and
    every check says ``noise_test: none``. ``outcome``: ``keep``, ``worse`` (a guard or a rule refused) or ``no_gain``
    (nothing worse, no gain beyond the noise: the canary's inconclusive).
    """
    tol = check_tolerances(tolerances)
    alpha = 1.0 - confidence
    fail_alpha = alpha / 3.0 if fail_alpha is None else fail_alpha
    b_ev, c_ev = evidence(baseline), evidence(candidate)
    checks, reasons, gains = [], [], []
    spec = (
        ("ttft", "median TTFT", _median(baseline, "ttft_ms"), _median(candidate, "ttft_ms"), "lower", "ms"),
        ("tpot", "median TPOT (per-token latency)", _median(baseline, "tpot_ms"), _median(candidate, "tpot_ms"), "lower", "ms"),
        ("throughput", "output throughput", baseline.get("output_throughput"), candidate.get("output_throughput"), "higher", "tok/s"),
    )
    tested = True
    for key, label, b_val, c_val, better, unit in spec:
        check = {"metric": key, "label": label, "baseline": b_val, "candidate": c_val, "better": better, "tolerance": tol[key],
                 "change": bench_stats.relative_change(b_val, c_val), "confidence": None, "noise_test": "none"}
        checks.append(check)
        if b_val is None or c_val is None:
            check["passed"] = False
            reasons.append("%s was not measured on %s" % (label, "the baseline" if b_val is None else "the candidate"))
            continue
        limit = b_val * (1.0 + tol[key]) if better == "lower" else b_val * (1.0 - tol[key])
        beyond = c_val > limit if better == "lower" else c_val < limit
        check["limit"] = limit
        test = figure_test(_FIGURES[key], b_ev, c_ev, better, tol[key], confidence)
        if test and test.get("error"):
            check["passed"] = False
            reasons.append("%s cannot be compared: %s; scrape both sides with the same buckets" % (label, test["error"]))
            continue
        if test is None:
            tested = False
            check["passed"] = not beyond
            gain_p = None
        else:
            check.update(noise_test=test["test"], confidence=1.0 - test["worse"])
            check["passed"] = not (beyond and test["worse"] < fail_alpha)
            gain_p = test["within"] if not tol[key] else (figure_test(_FIGURES[key], b_ev, c_ev, better, 0.0, confidence) or {}).get("within")
        if key in GAIN_METRICS:
            better_now = c_val < b_val if better == "lower" else c_val > b_val
            shown = better_now if gain_p is None else (better_now and gain_p < alpha / 2.0)
            check["gain_confidence"] = None if gain_p is None else 1.0 - gain_p
            gains.append((label, check["change"], gain_p, shown))
        if not check["passed"]:
            reasons.append("%s %s: candidate %.2f %s vs baseline %.2f %s (%+.1f%%, tolerance %.1f%%%s)" % (
                label, "got worse" if better == "lower" else "dropped", c_val, unit, b_val, unit,
                100.0 * check["change"] if check["change"] is not None else float("nan"), 100.0 * tol[key],
                "" if check["noise_test"] == "none" else "; %s sure it is beyond the limit, by a %s" % (
                    _sure(1.0 - check["confidence"]), check["noise_test"])))
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
    gained = any(shown for _l, _c, _p, shown in gains)
    outcome = "worse" if reasons else ("keep" if gained else "no_gain")
    if outcome == "no_gain":
        reasons = ["no gain beyond the noise: %s; %.1f%% needed for either (more requests narrow the noise)" % (
            ", ".join("%s %s (%s sure it is better)" % (label, "n/a" if change is None else "%+.1f%%" % (100.0 * change), _sure(p))
                      for label, change, p, _shown in gains), 100.0 * (1.0 - alpha / 2.0))]
    elif outcome == "keep":
        reasons = ["%s better beyond the noise, and nothing worse beyond its tolerance, at the target load" % " and ".join(
            label for label, _c, _p, shown in gains if shown)]
    untested = None if tested else ("a side carries no per-request samples or buckets (a baseline saved by an older release): "
                                    "compared by the point figures alone, without a noise test; measure the baseline again")
    return {"decision": "keep" if outcome == "keep" else "roll_back", "outcome": outcome, "reasons": reasons, "checks": checks,
            "tolerances": tol, "load": load, "confidence": confidence, "fail_alpha": fail_alpha, "untested": untested}


def _failure_rate(summary):
    total = (summary.get("completed") or 0) + (summary.get("failed") or 0)
    return (summary.get("failed") or 0) / float(total) if total else None
