# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A window of live traffic, measured from vLLM's own /metrics: histogram deltas between two scrapes, quantiles from
the buckets, each revision's figures (median and p99 TTFT/TPOT/ITL/E2EL, requests, output rate, acceptance), and the
verdict on them (the benchmark's keep rule plus a p99 tail guard). The canary (``ops/canary.py``) scrapes the pods and
acts on the verdict.

Plain Python, no Ansible imports, no API calls.
"""

from __future__ import annotations

import copy
import math

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import decision as bench_decision
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import prometheus_text
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics

# The server-side latency histograms vLLM exposes (0.10 to 0.33), by the benchmark's metric keys.
HISTOGRAMS = {
    "ttft": "time_to_first_token_seconds",
    "tpot": "request_time_per_output_token_seconds",
    "itl": "inter_token_latency_seconds",
    "e2el": "e2e_request_latency_seconds",
}
COUNTERS = {"generation_tokens": "generation_tokens_total", "request_success": "request_success_total"}
PREFIXES = tuple(HISTOGRAMS.values()) + ("generation_tokens", "request_success")


# -- histograms from /metrics -----------------------------------------------------------------------------------------

def scrape(text, model_name=None, field="metrics"):
    """One /metrics page: ``{"histograms": {key: {"buckets": [[le, cumulative]...], "count", "sum"}}, "counters": {...},
    "spec": SpecDecodeCounters}``, summed over ``engine`` (and model names unless ``model_name``)."""
    hists = {key: {"buckets": {}, "count": 0.0, "sum": 0.0, "found": False} for key in HISTOGRAMS}
    by_name = {"vllm:" + base: key for key, base in HISTOGRAMS.items()}
    counters = {key: None for key in COUNTERS}
    counter_names = {"vllm:" + base: key for key, base in COUNTERS.items()}
    for sample in prometheus_text.parse_samples(text, PREFIXES, field=field):
        labels = sample.labels or {}
        if model_name is not None and labels.get("model_name") != model_name:
            continue
        if sample.name in counter_names:
            key = counter_names[sample.name]
            counters[key] = (counters[key] or 0.0) + sample.value
            continue
        for suffix in ("_bucket", "_count", "_sum"):
            base = sample.name[:-len(suffix)] if sample.name.endswith(suffix) else None
            if base in by_name:
                hist = hists[by_name[base]]
                hist["found"] = True
                if suffix == "_bucket":
                    upper = float(labels.get("le", "+Inf"))
                    hist["buckets"][upper] = hist["buckets"].get(upper, 0.0) + sample.value
                else:
                    hist[suffix[1:]] += sample.value
                break
    for hist in hists.values():
        hist["buckets"] = sorted(hist["buckets"].items())
    return {"histograms": hists, "counters": counters, "spec": spec_metrics.parse_prometheus(text, model_name=model_name)}


def histogram_delta(later, earlier):
    """Bucket-wise ``later - earlier``; a count that went down (server restart) gives ``later`` itself, ``reset`` True."""
    if earlier is None or not earlier.get("found"):
        return dict(later, reset=False)
    if later["count"] < earlier["count"]:
        return dict(later, reset=True)
    before = dict(earlier["buckets"])
    buckets = [(upper, cum - before.get(upper, 0.0)) for upper, cum in later["buckets"]]
    return {"buckets": buckets, "count": later["count"] - earlier["count"], "sum": later["sum"] - earlier["sum"],
            "found": later["found"], "reset": False}


def add_histograms(first, second):
    if first is None:
        return copy.deepcopy(second)
    # Pods scraped with other bucket bounds (custom_histogram_buckets) add up on the bounds they share: a cumulative count
    # is exact there, and a bound only one pod has would count the others' requests as not yet below it.
    ones, twos = dict(first["buckets"]), dict(second["buckets"])
    shared = set(ones) & set(twos) if ones and twos else set(ones) | set(twos)
    merged = {upper: ones.get(upper, 0.0) + twos.get(upper, 0.0) for upper in shared}
    return {"buckets": sorted(merged.items()), "count": first["count"] + second["count"], "sum": first["sum"] + second["sum"],
            "found": first["found"] or second["found"], "reset": first.get("reset") or second.get("reset")}


def histogram_quantile(q, buckets):
    """Prometheus' ``histogram_quantile`` over cumulative ``[(upper, count)...]`` (sorted, ending with +Inf).

    Rank ``q * total``; linear interpolation inside the first bucket whose cumulative count reaches the rank (lower
    bound 0 for the first bucket when its upper bound is positive); a rank in the +Inf bucket gives the highest finite
    bound. None when the histogram is empty.
    """
    if not buckets or not 0 <= q <= 1:
        return None
    total = buckets[-1][1]
    if total <= 0 or not math.isinf(buckets[-1][0]):
        return None
    rank = q * total
    prev_upper, prev_count = 0.0, 0.0
    for i, (upper, count) in enumerate(buckets):
        if count >= rank:
            if math.isinf(upper):
                return buckets[i - 1][0] if i else None
            lower = prev_upper if i else (0.0 if upper > 0 else upper)
            in_bucket = count - prev_count
            if in_bucket <= 0:
                return upper
            return lower + (upper - lower) * ((rank - prev_count) / in_bucket)
        prev_upper, prev_count = upper, count
    return None


def _counter_delta(later, earlier):
    if later is None:
        return None
    if earlier is None or later < earlier:
        return later
    return later - earlier


def window_delta(later, earlier):
    """The figures of one pod over the window between two ``scrape`` results."""
    return {
        "histograms": {key: histogram_delta(later["histograms"][key], (earlier or {}).get("histograms", {}).get(key))
                       for key in HISTOGRAMS},
        "counters": {key: _counter_delta(later["counters"][key], (earlier or {}).get("counters", {}).get(key)) for key in COUNTERS},
        "spec": later["spec"].delta(earlier["spec"] if earlier else None),
    }


def revision_figures(pod_deltas, window_s, percentiles=(50, 99)):
    """One revision's figures from its pods' window deltas (summed): requests, latency quantiles in ms, acceptance."""
    hists = {key: None for key in HISTOGRAMS}
    gen_tokens, spec = 0.0, None
    for delta in pod_deltas:
        for key in HISTOGRAMS:
            hists[key] = add_histograms(hists[key], delta["histograms"][key])
        gen_tokens += delta["counters"]["generation_tokens"] or 0.0
        spec = delta["spec"] if spec is None else spec + delta["spec"]
    figures = {"pods": len(pod_deltas), "window_s": window_s}
    e2e = hists["e2el"] or {"count": 0.0, "sum": 0.0}
    figures["requests"] = int(round(e2e["count"]))
    figures["generation_tokens"] = int(round(gen_tokens))
    for key in HISTOGRAMS:
        hist = hists[key]
        row = {"count": int(round(hist["count"])) if hist else 0, "mean": None}
        for pct in percentiles:
            value = histogram_quantile(pct / 100.0, hist["buckets"]) if hist else None
            row["median" if pct == 50 else "p%d" % pct] = None if value is None else value * 1000.0
        if hist and hist["count"]:
            row["mean"] = hist["sum"] / hist["count"] * 1000.0
        figures["%s_ms" % key] = row
    # The window's bucket counts (cumulative, bounds in seconds, "+Inf" last): what the analysis' rank test compares.
    figures["buckets"] = {key: [["+Inf" if math.isinf(upper) else upper, count] for upper, count in (hists[key] or {}).get("buckets") or []]
                          for key in HISTOGRAMS}
    # Per-request output rate: tokens per second of request time. The two sides carry different shares of the traffic,
    # so a throughput per revision would compare the split, not the engines.
    figures["output_rate_per_request"] = gen_tokens / e2e["sum"] if e2e["sum"] else None
    figures["request_rate"] = e2e["count"] / window_s if window_s else None
    figures["counter_reset"] = any(h and h.get("reset") for h in hists.values())
    figures["acceptance"] = spec_metrics.summarize(spec) if spec is not None else None
    return figures


def as_bench_summary(figures):
    """A revision's figures in the shape bench_decision.decide reads (medians in ms, output throughput, completed)."""
    return {"ttft_ms": figures["ttft_ms"], "tpot_ms": figures["tpot_ms"], "output_throughput": figures["output_rate_per_request"],
            "completed": figures["requests"], "failed": 0, "buckets": figures.get("buckets") or {}}


DEFAULT_P99_TOLERANCE = 0.5
# Below 100 requests a side's p99 is its slowest request or two: one cold or stalled request would decide. The tails
# are then reported, not decided on.
P99_MIN_REQUESTS = 100
P99_CHECKS = (("ttft", "p99 TTFT"), ("tpot", "p99 TPOT (per-token latency)"))


def check_p99_tolerance(value, field="p99_tolerance"):
    """The p99 tolerance as a float >= 0, or None (tails not checked); ValidationError otherwise."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = -1.0
    if value < 0:
        raise ValidationError("must be a fraction >= 0, got %r" % (value,), field=field,
                              hint="e.g. 0.5 lets the canary's p99 TTFT and TPOT be at most 50% worse; null leaves the tails out")
    return value


def _p99_checks(stable, canary, tolerance, fail_alpha, confidence):
    """The tail checks: the canary's p99 TTFT and p99 TPOT at most ``tolerance`` worse than the stable revision's, failed
    only when the exceedance test (bench/noise.py: the canary's requests above the stable p99's bound) is sure of it. A p99
    that one side's histogram cannot give (no requests in the window) is not a check: the medians already refuse that."""
    checks, reasons = [], []
    for key, label in P99_CHECKS:
        s_val, c_val = (stable.get("%s_ms" % key) or {}).get("p99"), (canary.get("%s_ms" % key) or {}).get("p99")
        if s_val is None or c_val is None:
            continue
        limit = s_val * (1.0 + tolerance)
        test = bench_decision.figure_test("%s_p99" % key, bench_decision.evidence(stable), bench_decision.evidence(canary), "lower",
                                          tolerance, confidence) or {}
        sure = None if "worse" not in test else 1.0 - test["worse"]
        if test.get("error"):
            passed = False
        else:
            passed = c_val <= limit if sure is None else not (c_val > limit and test["worse"] < fail_alpha)
        check = {"metric": "%s_p99" % key, "label": label, "baseline": s_val, "candidate": c_val, "better": "lower",
                 "tolerance": tolerance, "limit": limit, "passed": passed, "confidence": sure,
                 "noise_test": test.get("test") or "none", "change": (c_val - s_val) / s_val if s_val else None}
        checks.append(check)
        if not check["passed"]:
            reasons.append("%s got worse: canary %.2f ms vs stable %.2f ms (%s, tail tolerance %.0f%%%s)" % (
                label, c_val, s_val, "%+.1f%%" % (100.0 * check["change"]) if check["change"] is not None else "from 0",
                100.0 * tolerance, "; " + test["error"] if test.get("error") else
                "" if sure is None else "; %.1f%% sure by %s" % (100.0 * sure, check["noise_test"])))
    return checks, reasons


def decide(stable, canary, min_requests=20, tolerances=None, missing=None, p99_tolerance=DEFAULT_P99_TOLERANCE,
           confidence=bench_decision.DEFAULT_CONFIDENCE, extra_checks=0):
    """``promote`` | ``roll_back`` | ``none`` (not enough evidence), with the reasons.

    The keep rule is the benchmark's (``bench_decision.decide``: median TPOT or the output rate better beyond the noise,
    median TTFT, median TPOT and the output rate not worse beyond their tolerances), on the window's histogram buckets.
    Live traffic adds a tail guard: the canary's p99 TTFT and p99 TPOT may be at most ``p99_tolerance`` worse (None:
    tails not checked), since a median win can hide a tail that users feel. ``confidence`` is the window's: a guard,
    tail or one of ``extra_checks`` more checks the caller decides with fails an identical pair at most ``1 -
    confidence`` of the time together (Bonferroni). No decision when a side's pods had no metrics (``missing``: ``{side:
    [pod, ...]}``), fewer than ``min_requests`` requests finished on either side, or nothing is worse and no gain shows
    beyond the noise (``checks`` then say how close).
    """
    missing = {side: pods for side, pods in (missing or {}).items() if pods}
    if missing:
        return {"decision": "none", "reasons": ["no /metrics from the %s pods %s" % (side, ", ".join(pods)) for side, pods in sorted(missing.items())],
                "checks": []}
    short = ["the %s revision finished %d requests in the window, fewer than min_requests %d" % (side, fig["requests"], min_requests)
             for side, fig in (("stable", stable), ("canary", canary)) if fig["requests"] < min_requests]
    if short:
        return {"decision": "none", "reasons": short, "checks": []}
    tolerance = check_p99_tolerance(p99_tolerance)
    fewest = min(stable["requests"], canary["requests"])
    tails_decide = tolerance is not None and fewest >= P99_MIN_REQUESTS
    fail_alpha = (1.0 - confidence) / (3 + (len(P99_CHECKS) if tails_decide else 0) + extra_checks)
    verdict = bench_decision.decide(as_bench_summary(stable), as_bench_summary(canary), tolerances=tolerances, confidence=confidence,
                                    fail_alpha=fail_alpha)
    tail_checks, tail_reasons = _p99_checks(stable, canary, tolerance, fail_alpha, confidence) if tolerance is not None else ([], [])
    if tail_checks and not tails_decide:
        for check in tail_checks:
            check.update(passed=None, decided=False)
        tail_reasons = []
        verdict["reasons"] = verdict["reasons"] + ["p99 TTFT/TPOT reported, not decided on: a side finished %d requests in the window, "
                                                   "fewer than the %d a p99 needs (lengthen the window)" % (fewest, P99_MIN_REQUESTS)]
    out = {"checks": verdict["checks"] + tail_checks, "tolerances": dict(verdict["tolerances"], p99=tolerance), "fail_alpha": fail_alpha,
           "confidence": confidence}
    if verdict["outcome"] == "keep" and not tail_reasons:
        return dict(out, decision="promote", reasons=verdict["reasons"])
    if verdict["outcome"] == "no_gain" and not tail_reasons:
        return dict(out, decision="none", reasons=verdict["reasons"])
    reasons = (verdict["reasons"] if verdict["outcome"] == "worse" else []) + tail_reasons
    return dict(out, decision="roll_back", reasons=reasons)
