# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Choosing ``num_speculative_tokens`` (k) from vLLM's per-position acceptance curve: expected tokens per verify step
for each k against a verify-cost model (``recommend_k``, ``verify_cost_ratio_from``), and ``predict_k`` on a sweep's
pooled acceptance counts.

Its own file because it is a model, not a measurement: bench/sweep.py measures the loads and
bench/sweep_analysis.py confirms the predicted k with an A/B. Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError


def cumulative_rates(conditional):
    """vLLM-style per-position rates from conditional ones: ``r_i = c_1 * ... * c_i``."""
    out, product = [], 1.0
    for value in conditional:
        product *= float(value)
        out.append(product)
    return out


def conditional_rates(cumulative):
    """Conditional acceptance per slot from vLLM's rates: ``c_1 = r_1``, ``c_i = r_i / r_(i-1)`` (``None`` after a 0)."""
    out, previous = [], 1.0
    for value in cumulative:
        out.append(float(value) / previous if previous else None)
        previous = float(value)
    return out


def verify_cost_ratio_from(baseline_tpot_ms, candidate_tpot_ms, mean_acceptance_length, num_speculative_tokens):
    """``verify_cost_ratio`` of the cost model in ``recommend_k``, from one measured A/B at ``k = num_speculative_tokens``.

    A candidate step emits ``mean_acceptance_length`` tokens (vLLM's 1 + accepted/drafts) and lasts
    ``candidate_tpot * mean_acceptance_length``; in baseline decode steps that is ``cost(k)``, so
    ``verify_cost_ratio = (candidate_tpot * mean_acceptance_length / baseline_tpot - 1) / k``. An approximation:
    TPOT also holds steps without a draft (an ngram with no match) and the prefill share of each request.
    """
    for name, value in (("baseline_tpot_ms", baseline_tpot_ms), ("candidate_tpot_ms", candidate_tpot_ms)):
        if not bench_stats.is_number(value) or value <= 0:
            raise ValidationError("must be a measured TPOT greater than 0, got %r" % (value,), field=name,
                                  hint="take the median TPOT of each side from one A/B at the same load")
    if not bench_stats.is_number(mean_acceptance_length) or mean_acceptance_length < 1:
        raise ValidationError("must be >= 1 (it counts the bonus token), got %r" % (mean_acceptance_length,),
                              field="mean_acceptance_length", hint="use the candidate's /metrics deltas over the run")
    if not isinstance(num_speculative_tokens, int) or isinstance(num_speculative_tokens, bool) or num_speculative_tokens < 1:
        raise ValidationError("must be a whole number >= 1, got %r" % (num_speculative_tokens,), field="num_speculative_tokens",
                              hint="the k the candidate ran with")
    cost = candidate_tpot_ms * mean_acceptance_length / baseline_tpot_ms
    return max(0.0, (cost - 1.0) / num_speculative_tokens)


def recommend_k(per_position_rates, verify_cost_ratio, k_max):
    """Predict the best ``num_speculative_tokens`` from the per-position acceptance curve and a verify-cost model.

    **Per-position rates.** ``per_position_rates`` are vLLM's figures: ``r_i = accepted_per_pos[i-1] / drafts``
    (facts.md section 1, "per-position rate = accepted_per_pos/drafts"; the ``Per-position acceptance rate:`` log
    values are the same numbers). vLLM accepts a draft's tokens left to right and stops at the first rejection,
    so position i is counted only when positions 1..i were all accepted (per-request metrics say the same:
    tokens accepted at position j are the steps that accepted more than j, see
    ``spec_metrics.counters_from_response``). ``r_i`` is therefore **already the cumulative product**
    ``c_1 * ... * c_i`` of the conditional acceptance rates ``c_j`` (the chance that slot j is accepted given
    slots before it were), and never increases with i. It is used as is, not multiplied again;
    ``conditional_rates`` gives the ``c_j`` for display and ``cumulative_rates`` converts the other way.
    A rate that increases along the list is refused (it is not a vLLM curve; conditional rates were passed).

    **Expected tokens per verify step** with k proposals: ``E(k) = 1 + sum_{i<k} prod_{j<=i} c_j = 1 + r_1 + ... + r_k``
    (the bonus token plus each slot's chance to be accepted). The rates measured with a larger k hold for every
    smaller k (a slot's acceptance does not depend on the slots after it), so k runs over
    ``1..min(k_max, len(per_position_rates))``: deeper slots were not measured and are not predicted.

    **Cost model**, relative to one plain decode step of the baseline: ``cost(k) = 1 + verify_cost_ratio * k``
    (proposing and verifying each extra token costs ``verify_cost_ratio`` of a decode step; measure it with
    ``verify_cost_ratio_from``). **Expected gain** ``gain(k) = E(k) / cost(k)``: the predicted decode speedup
    over the baseline (1.0 = break-even). The recommendation is the k with the highest gain (the smaller k on a
    tie); ``pays`` is false when no k beats 1.0. A prediction: confirm it with a measured A/B before using it.

    Returns ``{"recommended_k", "expected_gain", "pays", "k_limit", "cost_model", "per_position_rates",
    "conditional_rates", "table": [{"k", "expected_tokens_per_step", "cost", "expected_gain"}], "notes"}``.
    """
    field = "per_position_rates"
    if not isinstance(per_position_rates, (list, tuple)) or not per_position_rates:
        raise ValidationError("is empty", field=field,
                              hint="use the candidate's measured per-position acceptance rates (spec_metrics per_position_acceptance_rate)")
    rates = []
    for index, value in enumerate(per_position_rates):
        if not bench_stats.is_number(value) or not 0 <= value <= 1:
            raise ValidationError("position %d is %r, not a fraction in [0, 1]" % (index + 1, value), field=field,
                                  hint="write 0.45 for 45%")
        if rates and value > rates[-1] + 1e-9:
            raise ValidationError("position %d (%g) is above position %d (%g): vLLM's per-position rates are cumulative "
                                  "(accepted_per_pos/drafts) and never increase" % (index + 1, value, index, rates[-1]),
                                  field=field, hint="pass vLLM's figures as measured, or convert conditional rates with cumulative_rates()")
        rates.append(float(value))
    if not bench_stats.is_number(verify_cost_ratio) or verify_cost_ratio < 0:
        raise ValidationError("must be a number >= 0, got %r" % (verify_cost_ratio,), field="verify_cost_ratio",
                              hint="the cost of one proposed token as a fraction of a decode step; see verify_cost_ratio_from()")
    if not isinstance(k_max, int) or isinstance(k_max, bool) or k_max < 1:
        raise ValidationError("must be a whole number >= 1, got %r" % (k_max,), field="k_max",
                              hint="the largest num_speculative_tokens the method allows (max_speculative_tokens())")
    limit = min(k_max, len(rates))
    notes = []
    if k_max > len(rates):
        notes.append("k above %d is not predicted: the curve was measured with %d speculative tokens; measure with a larger "
                     "num_speculative_tokens to predict deeper" % (len(rates), len(rates)))
    table = []
    tokens = 1.0
    for k in range(1, limit + 1):
        tokens += rates[k - 1]
        cost = 1.0 + float(verify_cost_ratio) * k
        table.append({"k": k, "expected_tokens_per_step": tokens, "cost": cost, "expected_gain": tokens / cost})
    best = max(table, key=lambda row: (row["expected_gain"], -row["k"]))
    pays = best["expected_gain"] > 1.0
    if not pays:
        notes.append("no k is predicted to beat the baseline (best expected gain %.3f at k=%d): turn speculative decoding off "
                     "for this workload, or lower the verify cost" % (best["expected_gain"], best["k"]))
    notes.append("a prediction from the acceptance curve: confirm k=%d with a measured A/B against the current k" % best["k"])
    return {
        "recommended_k": best["k"],
        "expected_gain": best["expected_gain"],
        "pays": pays,
        "k_limit": limit,
        "cost_model": "cost(k) = 1 + %g * k decode steps; E(k) = 1 + r_1 + ... + r_k (vLLM's cumulative per-position rates)"
                      % float(verify_cost_ratio),
        "per_position_rates": rates,
        "conditional_rates": conditional_rates(rates),
        "table": table,
        "notes": notes,
    }


def pooled_acceptance(acceptances):
    """Per-position rates and mean acceptance length over several /metrics windows (counts summed, then divided)."""
    drafts, accepted, per_pos = 0.0, 0.0, []
    for acc in acceptances:
        if not acc or not acc.get("num_drafts"):
            continue
        drafts += acc["num_drafts"]
        accepted += acc.get("num_accepted_tokens") or 0
        for index, value in enumerate(acc.get("accepted_tokens_per_position") or []):
            if index >= len(per_pos):
                per_pos.append(0.0)
            per_pos[index] += value or 0
    if not drafts:
        return None
    rates = [value / drafts for value in per_pos]
    for index in range(1, len(rates)):  # counter rounding cannot make a deeper slot exceed the one before
        rates[index] = min(rates[index], rates[index - 1])
    return {"num_drafts": drafts, "num_accepted_tokens": accepted, "per_position": rates,
            "mean_acceptance_length": 1.0 + accepted / drafts}


def predict_k(points, current_k, k_candidates, verify_cost_ratio=None):
    """``recommend_k`` on the candidate's acceptance pooled over the sweep, restricted to ``k_candidates``.

    ``verify_cost_ratio`` defaults to ``verify_cost_ratio_from`` at the lowest load (least queueing), with the
    candidate's k. Returns ``recommend_k``'s dict plus ``predicted_k``, ``current_k``, ``pooled``, ``cost_source``;
    ``None`` with no acceptance counts.
    """
    pooled = pooled_acceptance([_side(p, "candidate").get("acceptance") for p in points])
    if pooled is None or not pooled["per_position"]:
        return None
    source = "given"
    if verify_cost_ratio is None:
        first = points[0]
        b_tpot = ((bench_stats.side_summary(first["baseline"]).get("tpot_ms") or {}).get("median"))
        c_tpot = ((bench_stats.side_summary(first["candidate"]).get("tpot_ms") or {}).get("median"))
        own = pooled_acceptance([_side(first, "candidate").get("acceptance")]) or pooled
        if not b_tpot or not c_tpot:
            return None
        verify_cost_ratio = verify_cost_ratio_from(b_tpot, c_tpot, own["mean_acceptance_length"], current_k or len(pooled["per_position"]))
        source = "measured at load %g: baseline TPOT %.3f ms, candidate TPOT %.3f ms, mean acceptance length %.3f, k=%s" % (
            first["load"], b_tpot, c_tpot, own["mean_acceptance_length"], current_k)
    k_max = max(list(k_candidates) + ([current_k] if current_k else []))  # the current k's row too, for the comparison
    out = recommend_k(pooled["per_position"], verify_cost_ratio, k_max)
    rows = [row for row in out["table"] if row["k"] in k_candidates]
    if not rows:
        raise ValidationError("no candidate in %s was measured: the candidate proposes %d slot(s)" % (list(k_candidates), len(pooled["per_position"])),
                              field="k_candidates", hint="run the candidate with num_speculative_tokens at least as large as the largest candidate")
    best = max(rows, key=lambda row: (row["expected_gain"], -row["k"]))
    out.update(predicted_k=best["k"], recommended_k=best["k"], expected_gain=best["expected_gain"], pays=best["expected_gain"] > 1.0,
               current_k=current_k, pooled=pooled, verify_cost_ratio=verify_cost_ratio, cost_source=source, k_candidates=list(k_candidates))
    current_row = next((row for row in out["table"] if row["k"] == current_k), None)
    out["expected_gain_current"] = current_row["expected_gain"] if current_row else None
    return out


def _side(point, side):
    return point.get(side) or {}
