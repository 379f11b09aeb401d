"""The noise tests (bench/noise.py) on hand-made evidence: each test's direction and tolerance, the bounds rule, the
per-draft distribution from vLLM's per-position counters, the tail test, and the family's error rate over windows."""

import math

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import noise
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15)   # vLLM 0.32's first TPOT bounds


def _hist(values, bounds=BOUNDS):
    return [[b, float(sum(1 for v in values if v <= b))] for b in bounds] + [["+Inf", float(len(values))]]


def _spread(center, n):
    """n values spread evenly over +-40% around center."""
    return [center * (0.6 + 0.8 * i / (n - 1)) for i in range(n)]


def test_a_slower_candidate_is_worse_and_a_faster_one_within():
    base = _hist(_spread(0.04, 200))
    slow, fast = _hist(_spread(0.06, 200)), _hist(_spread(0.03, 200))
    assert noise.rank_pvalues(base, slow, "lower")["worse"] < 1e-6
    assert noise.rank_pvalues(base, fast, "lower")["within"] < 1e-6
    # the tolerance moves the limit: 50% slower is within a 60% tolerance, not within 20%
    assert noise.rank_pvalues(base, slow, "lower", tolerance=0.6)["within"] < 0.05
    assert noise.rank_pvalues(base, slow, "lower", tolerance=0.2)["worse"] < 0.05
    # the same values as samples give the same directions
    assert noise.rank_pvalues(_spread(0.04, 200), _spread(0.06, 200), "lower", samples=True)["worse"] < 1e-6


def test_histograms_are_compared_on_the_bounds_both_have():
    values = _spread(0.04, 200)
    coarse = _hist(values, BOUNDS[::2])
    base, cand, dropped = noise.common_buckets(_hist(values), coarse)
    assert [u for u, _c in base] == [u for u, _c in cand] == [0.01, 0.05, 0.1, math.inf] and dropped == [0.025, 0.075, 0.15]
    same = noise.rank_pvalues(_hist(values), coarse, "lower")
    assert same["worse"] == pytest.approx(0.5) and same["within"] == pytest.approx(0.5)
    with pytest.raises(noise.BoundsMismatch, match=r"baseline \[0.01, 0.025.*\], candidate \[0.02, 0.2, \+Inf\]"):
        noise.common_buckets(_hist(values), _hist(values, (0.02, 0.2)))


def test_a_check_on_histograms_without_a_common_bound_is_inconclusive_naming_both():
    check = analysis.check_spec({"name": "tpot", "figure": "tpot_median", "better": "lower", "tolerance": 0.0})
    base = {"requests": 200, "tpot_ms": {"median": 40.0}, "buckets": {"tpot": _hist(_spread(0.04, 200))}}
    cand = {"requests": 200, "tpot_ms": {"median": 60.0}, "buckets": {"tpot": _hist(_spread(0.06, 200), (0.02, 0.2))}}
    row = analysis.evaluate_check(check, cand, base)
    assert row["passed"] is None and "share no bucket bound" in row["why"] and "same buckets" in row["why"]


def test_the_per_draft_distribution_comes_from_the_per_position_counters():
    # 10 drafts of k=3: 4 accept nothing, 3 accept one, 2 accept two, 1 accepts three
    acc = {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 3 + 4 + 3, "accepted_tokens_per_position": [6, 3, 1]}
    drafts, mean, var, k = noise.per_draft(acc)
    values = [0] * 4 + [1] * 3 + [2] * 2 + [3]
    assert (drafts, k) == (10.0, 3.0) and mean == pytest.approx(sum(values) / 10)
    assert var == pytest.approx(sum((v - mean) ** 2 for v in values) / 10)


def test_a_certain_drop_in_mean_acceptance_length_is_found_when_k_differs():
    """The issue's case: 2.27 -> 1.96 over 2000 drafts each, k 4 on the baseline and 2 on the candidate (after tuning)."""
    base = {"num_drafts": 2000, "num_draft_tokens": 8000, "num_accepted_tokens": 2540, "accepted_tokens_per_position": [1100, 700, 460, 280]}
    cand = {"num_drafts": 2000, "num_draft_tokens": 4000, "num_accepted_tokens": 1920, "accepted_tokens_per_position": [1150, 770]}
    out = noise.acceptance_pvalues("mean_acceptance_length", base, cand, "higher", 0.0)
    assert out["worse"] < 1e-6


def test_the_design_effect_grows_with_requests_that_share_their_acceptance():
    # position 2 reached by more drafts than a common rate would give (0.5 * 0.5 = 0.25): requests differ
    acc = {"num_drafts": 1000, "num_draft_tokens": 3000, "num_accepted_tokens": 500 + 300 + 200, "accepted_tokens_per_position": [500, 300, 200]}
    assert noise.design_effect(acc, requests=None) == 1.0
    assert noise.design_effect(acc, requests=1000) == pytest.approx(1.0)   # one draft a request: nothing shared
    assert noise.design_effect(acc, requests=20) > 5.0
    same = {"num_drafts": 1000, "num_draft_tokens": 3000, "num_accepted_tokens": 500 + 250 + 125, "accepted_tokens_per_position": [500, 250, 125]}
    assert noise.design_effect(same, requests=20) == 1.0


def test_the_tail_test_counts_exceedances_over_the_baselines_bound():
    base = _spread(0.04, 500)
    tail = base[:485] + [0.2] * 15           # 3% of the requests five times slower
    assert noise.tail_pvalues(_hist(base), _hist(tail), tolerance=0.5)["worse"] < 0.001
    assert noise.tail_pvalues(_hist(base), _hist(base), tolerance=0.5)["worse"] == pytest.approx(1.0)
    assert noise.tail_pvalues(base, tail, tolerance=0.5, samples=True)["worse"] < 0.001


def test_proportions_refuse_more_hits_than_trials():
    with pytest.raises(ValidationError, match="11 hits in 10 trials"):
        analysis.proportion_test(5, 10, 11, 10)


@pytest.mark.parametrize("count, failure_limit", [(1, 0), (3, 0), (3, 1), (5, 2)])
def test_the_windows_share_the_runs_error_rate(count, failure_limit):
    alpha = noise.window_alpha(0.05, count, failure_limit)
    assert 0 < alpha <= 0.05
    assert noise.binomial_tail(count, alpha, failure_limit + 1) <= 0.05 + 1e-9
    assert analysis.Budgets(count=count, failure_limit=failure_limit).window_confidence(0.95) == pytest.approx(1 - alpha)


def test_binomial_tail_matches_the_sum():
    n, p = 20, 0.1
    exact = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(3, n + 1))
    assert noise.binomial_tail(n, p, 3) == pytest.approx(exact)
    assert noise.binomial_tail(n, p, 2, upper=False) == pytest.approx(1 - exact)
