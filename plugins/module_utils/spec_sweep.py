# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load and k sweeps for speculative decoding: input checks, break-even load, k model, target decision, resume.

The pure logic under issue #18 (``spec_sweep`` module, ``playbooks/tune.yml``). Nothing here sends a request:

- ``validate_sweep``: the sweep's inputs (``request_rates``, ``concurrencies``, ``num_speculative_tokens``
  candidates for the method, ``target_qps``), refused with ``ValidationError`` naming the field before any
  request is sent.
- ``break_even(points, keep_rule)``: the highest measured load at which the candidate still meets
  ``spec_benchmark``'s keep rule (``bench_report.decide``, called, not copied), the first at which it does not,
  and the interpolated crossover of the metric that crossed first.
- ``recommend_k(per_position_rates, verify_cost_ratio, k_max)``: expected tokens per verify step for each k
  from vLLM's per-position acceptance rates against a documented verify-cost model. A prediction only: the
  caller confirms it with a measured A/B.
- ``decision_for_target(points, target_qps, keep_rule)``: the keep/roll_back decision at the sweep point at or
  above the load the service really runs.
- ``resume_state(previous_json, plan)``: which planned measurements a previous run's JSON already holds.

A *point* is one load with both sides measured::

    {"kind": "request_rate" | "concurrency", "load": 4.0,
     "baseline": <bench_stats.summarize_run(...)>, "candidate": <bench_stats.summarize_run(...)>}

A side may also be given as ``spec_benchmark``'s side dict (``{"summary": {...}, ...}``). The summaries carry
the medians and p99 of TTFT/TPOT/ITL (``ttft_ms``, ``tpot_ms``, ``itl_ms``), ``output_throughput`` (tok/s),
``completed``, ``failed`` and ``burst_delivered``, which is what the keep rule reads.
"""

from __future__ import annotations

import hashlib
import json
import math

from ansible_collections.alauda.spec_decoding.plugins.module_utils import bench_report, bench_stats, speculative_config
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

SWEEP_SCHEMA = "alauda.spec_decoding/sweep-results/v1"
LOAD_KINDS = ("request_rate", "concurrency")
LOAD_FIELDS = {"request_rate": "request_rates", "concurrency": "concurrencies"}
SIDES = ("baseline", "candidate")

# Upper bound of the num_speculative_tokens candidates a sweep accepts, per method (the name vLLM prints, so
# every ``*_mtp`` alias counts as ``mtp``). vLLM itself only requires ``num_speculative_tokens > 0`` ("Expected
# num_speculative_tokens to be greater than zero"); it has no upper bound for these methods, so the caps are
# this collection's:
# - ngram, ngram_gpu, draft_model, eagle, eagle3: 10. Each slot costs verify work on every step, and the
#   per-position acceptance of these methods is far below the verify cost beyond a handful of slots.
# - suffix: 24, vLLM's default ``suffix_decoding_max_tree_depth``; for suffix decoding vLLM treats
#   num_speculative_tokens as an upper limit and defaults it to that depth.
# - mtp: 5. An MTP head predicts ``num_nextn_predict_layers`` tokens (usually 1); a larger k runs the head
#   again on its own output (vLLM then requires k to be a multiple of n_predict), and acceptance drops fast.
MAX_SPECULATIVE_TOKENS = {
    "ngram": 10,
    "ngram_gpu": 10,
    "suffix": 24,
    "draft_model": 10,
    "eagle": 10,
    "eagle3": 10,
    "mtp": 5,
}
# Protocol parameters a resumed sweep must share with the run it continues (more may be given in the plan).
REQUIRED_PROTOCOL_KEYS = ("prompts_sha256", "seed", "temperature")
# A rate may be this much below target_qps (float noise from YAML) and still count as "at" it.
_LOAD_EPS = 1e-9


# -- input validation -----------------------------------------------------------------------------------------
def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_load_list(values, field, integer):
    if not isinstance(values, (list, tuple)):
        raise ValidationError("must be a list, got %r" % (values,), field=field,
                              hint="give the loads in increasing order, e.g. [1, 2, 4, 8]")
    if not values:
        raise ValidationError("is empty", field=field, hint="give at least one load, in increasing order, e.g. [1, 2, 4, 8], or leave it unset")
    out = []
    for index, value in enumerate(values):
        if integer:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValidationError("item %d is %r, not a whole number" % (index, value), field=field,
                                      hint="concurrencies count parallel requests, e.g. [1, 4, 16]")
        elif not _is_number(value):
            raise ValidationError("item %d is %r, not a finite number" % (index, value), field=field,
                                  hint="request rates are requests per second, e.g. [0.5, 1, 2, 4]")
        if value <= 0:
            raise ValidationError("item %d is %r; every value must be greater than 0" % (index, value), field=field,
                                  hint="remove %r; a load of 0 or below sends nothing" % (value,))
        if out and value <= out[-1]:
            raise ValidationError("is not strictly increasing: item %d (%r) follows %r" % (index, value, out[-1]), field=field,
                                  hint="sort the list and remove duplicates, e.g. %s" % (sorted(set(values)),))
        out.append(int(value) if integer else float(value))
    return out


def max_speculative_tokens(method):
    """The largest num_speculative_tokens a sweep may try for ``method`` (``MAX_SPECULATIVE_TOKENS``)."""
    if not isinstance(method, str) or not method:
        raise ValidationError("is required with num_speculative_tokens candidates", field="method",
                              hint="set the speculative method, one of %s" % ", ".join(sorted(MAX_SPECULATIVE_TOKENS)))
    printed = speculative_config.printed_method(method)
    if printed in MAX_SPECULATIVE_TOKENS:
        return MAX_SPECULATIVE_TOKENS[printed]
    known = "vLLM knows it, but" if method in speculative_config.METHOD_NAMES else "unknown method;"
    raise ValidationError("%r: %s a k sweep supports only %s" % (method, known, ", ".join(sorted(MAX_SPECULATIVE_TOKENS))),
                          field="method", hint="sweep num_speculative_tokens for one of the supported methods")


def validate_sweep(request_rates=None, concurrencies=None, num_speculative_tokens=None, method=None, target_qps=None):
    """Check a sweep's inputs; return them normalised, or raise ``ValidationError`` naming the field.

    - ``request_rates`` (requests/s, numbers) and/or ``concurrencies`` (whole numbers): at least one given;
      each given list non-empty, strictly increasing, every value > 0.
    - ``num_speculative_tokens``: optional list of k candidates for a k sweep, whole numbers in
      1..``max_speculative_tokens(method)``, no duplicates (returned sorted); needs ``method``.
    - ``target_qps``: optional, > 0; it needs ``request_rates`` and must not exceed the largest of them (the
      decision uses the sweep point at or above it).

    Returns ``{"request_rates", "concurrencies", "num_speculative_tokens", "method", "k_limit", "target_qps"}``.
    """
    if request_rates is None and concurrencies is None:
        raise ValidationError("neither request_rates nor concurrencies is given", field="request_rates",
                              hint="give request_rates (e.g. [1, 2, 4, 8]) and/or concurrencies (e.g. [1, 4, 16])")
    rates = _check_load_list(request_rates, "request_rates", integer=False) if request_rates is not None else None
    concs = _check_load_list(concurrencies, "concurrencies", integer=True) if concurrencies is not None else None
    ks, limit = None, None
    if num_speculative_tokens is not None:
        limit = max_speculative_tokens(method)
        if not isinstance(num_speculative_tokens, (list, tuple)) or not num_speculative_tokens:
            raise ValidationError("must be a non-empty list of k candidates, got %r" % (num_speculative_tokens,),
                                  field="num_speculative_tokens", hint="e.g. [1, 2, 3, 4, 5]")
        for value in num_speculative_tokens:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValidationError("%r is not a whole number" % (value,), field="num_speculative_tokens", hint="e.g. [1, 2, 3, 4, 5]")
            if not 1 <= value <= limit:
                raise ValidationError("%d is outside 1..%d, the range allowed for method %s" % (value, limit, method),
                                      field="num_speculative_tokens", hint="keep every candidate within 1..%d" % limit)
        if len(set(num_speculative_tokens)) != len(num_speculative_tokens):
            raise ValidationError("has duplicates: %r" % (list(num_speculative_tokens),), field="num_speculative_tokens",
                                  hint="list each k once")
        ks = sorted(num_speculative_tokens)
    if target_qps is not None:
        if not _is_number(target_qps) or target_qps <= 0:
            raise ValidationError("must be a number greater than 0, got %r" % (target_qps,), field="target_qps",
                                  hint="the request rate (requests/s) the service really runs")
        if rates is None:
            raise ValidationError("needs request_rates: the decision uses the sweep point at or above target_qps", field="target_qps",
                                  hint="add request_rates that reach %g, or drop target_qps" % target_qps)
        if target_qps > rates[-1] * (1 + _LOAD_EPS):
            raise ValidationError("%g is above every measured request rate (largest %g)" % (target_qps, rates[-1]), field="target_qps",
                                  hint="add a request rate at or above %g to request_rates, or lower target_qps" % target_qps)
    return {"request_rates": rates, "concurrencies": concs, "num_speculative_tokens": ks, "method": method, "k_limit": limit,
            "target_qps": float(target_qps) if target_qps is not None else None}


# -- points and the keep rule ---------------------------------------------------------------------------------
def _summary(side):
    side = side or {}
    return side["summary"] if isinstance(side.get("summary"), dict) else side


def _check_points(points, field="points"):
    """Points sorted by load, one kind, unique positive loads, both sides present."""
    if not isinstance(points, (list, tuple)) or not points:
        raise ValidationError("no sweep points", field=field, hint="measure at least one load on both sides")
    kinds = set()
    out = []
    for index, point in enumerate(points):
        if not isinstance(point, dict) or not _is_number(point.get("load")) or point["load"] <= 0:
            raise ValidationError("point %d has no load greater than 0" % index, field=field,
                                  hint="each point is {'kind', 'load', 'baseline', 'candidate'}")
        for side in SIDES:
            if not isinstance(point.get(side), dict):
                raise ValidationError("point %d (load %g) has no %s measurement" % (index, point["load"], side), field=field,
                                      hint="measure both sides at every load")
        kinds.add(point.get("kind", "request_rate"))
        out.append(point)
    if len(kinds) != 1 or not kinds <= set(LOAD_KINDS):
        raise ValidationError("points mix or misname load kinds (%s)" % ", ".join(sorted(str(k) for k in kinds)), field=field,
                              hint="analyse request_rate and concurrency points separately")
    out.sort(key=lambda p: p["load"])
    for before, after in zip(out, out[1:]):
        if after["load"] == before["load"]:
            raise ValidationError("load %g is measured twice" % after["load"], field=field, hint="keep one point per load")
    return kinds.pop(), out


def _apply_keep_rule(keep_rule, point, kind):
    """``bench_report.decide`` (spec_benchmark's keep rule) on one point; ``keep_rule`` is its tolerances or a callable."""
    baseline, candidate = _summary(point["baseline"]), _summary(point["candidate"])
    load = {kind: point["load"]}
    if callable(keep_rule):
        return keep_rule(baseline, candidate, load)
    return bench_report.decide(baseline, candidate, keep_rule, load)


def _margin(check):
    """How far one decide() check is from failing, as a fraction of the baseline (>= 0 passes, < 0 fails)."""
    base, cand, limit = check.get("baseline"), check.get("candidate"), check.get("limit")
    if base in (None, 0) or cand is None or limit is None:
        return None
    if check.get("better") == "lower":
        return (limit - cand) / float(base)
    return (cand - limit) / float(base)


def _evaluate(points, keep_rule, kind):
    rows = []
    for point in points:
        decision = _apply_keep_rule(keep_rule, point, kind)
        baseline, candidate = _summary(point["baseline"]), _summary(point["candidate"])
        rows.append({
            "load": point["load"],
            "decision": decision["decision"],
            "reasons": list(decision.get("reasons") or []),
            "margins": {c["metric"]: _margin(c) for c in decision.get("checks") or []},
            "speedup": bench_stats.ratio(candidate.get("output_throughput"), baseline.get("output_throughput")),
        })
    return rows


def break_even(points, keep_rule=None):
    """Where the candidate stops paying, by ``spec_benchmark``'s keep rule, over the measured loads.

    ``keep_rule``: ``None`` or a tolerances dict for ``bench_report.decide`` (the rule ``spec_benchmark`` decides
    with: keep only if median TTFT, median TPOT and output throughput all pass, no extra failed requests, no
    burst-delivered side), or a callable ``(baseline_summary, candidate_summary, load) -> decide()-shaped dict``.

    Each metric's *margin* is how far it is from its limit, as a fraction of that point's baseline
    (``(limit - candidate) / baseline`` for latencies, ``(candidate - limit) / baseline`` for throughput; keep needs
    every margin >= 0). The crossover between the last keep load ``x1`` (margin ``m1 >= 0``) and the next load
    ``x2`` (margin ``m2 < 0``) is the linear interpolation ``x1 + (x2 - x1) * m1 / (m1 - m2)``, per metric that
    failed at ``x2``; ``crossed_first`` is the metric with the lowest crossover.

    Returns ``{"kind", "status", "last_keep_load", "first_roll_back_load", "crossover_load", "crossed_first",
    "crossover_by_metric", "reason", "pays_again_at", "points"}``; ``status`` is ``crossed``, ``pays_everywhere``
    or ``pays_nowhere`` (then ``crossover_load`` is ``None`` and ``reason`` says why). ``pays_again_at`` lists
    keep loads above the first roll_back (a non-monotonic sweep: worth re-measuring).
    """
    kind, points = _check_points(points)
    rows = _evaluate(points, keep_rule, kind)
    unit = "req/s" if kind == "request_rate" else "concurrent requests"
    out = {"kind": kind, "status": None, "last_keep_load": None, "first_roll_back_load": None, "crossover_load": None,
           "crossed_first": None, "crossover_by_metric": {}, "reason": "", "pays_again_at": [], "points": rows}
    first_bad = next((i for i, row in enumerate(rows) if row["decision"] != "keep"), None)
    if first_bad is None:
        out.update(status="pays_everywhere", last_keep_load=rows[-1]["load"],
                   reason="the candidate meets keep at every measured load (%g to %g %s): the break-even lies above the "
                          "measured range; add higher loads to find it" % (rows[0]["load"], rows[-1]["load"], unit))
        return out
    bad = rows[first_bad]
    out["first_roll_back_load"] = bad["load"]
    out["pays_again_at"] = [row["load"] for row in rows[first_bad + 1:] if row["decision"] == "keep"]
    if first_bad == 0:
        out.update(status="pays_nowhere",
                   reason="the candidate does not meet keep even at the lowest measured load (%g %s): %s" % (
                       bad["load"], unit, "; ".join(bad["reasons"])))
        return out
    good = rows[first_bad - 1]
    out.update(status="crossed", last_keep_load=good["load"])
    x1, x2 = good["load"], bad["load"]
    for metric, m2 in bad["margins"].items():
        m1 = good["margins"].get(metric)
        if m1 is None or m2 is None or m2 >= 0 or m1 < 0:
            continue
        out["crossover_by_metric"][metric] = x1 + (x2 - x1) * m1 / (m1 - m2)
    if out["crossover_by_metric"]:
        order = list(bad["margins"])
        metric = min(out["crossover_by_metric"], key=lambda m: (out["crossover_by_metric"][m], order.index(m)))
        crossover = out["crossover_by_metric"][metric]
        out["crossed_first"] = metric
        out["crossover_load"] = crossover
        out["reason"] = "keep holds at %g and fails at %g %s; %s crossed first, at about %.3g (linear interpolation of its margin): %s" % (
            x1, x2, unit, metric, crossover, "; ".join(bad["reasons"]))
    else:
        out["reason"] = ("keep holds at %g and fails at %g %s for a reason with no margin to interpolate, so there is no crossover "
                         "estimate: %s" % (x1, x2, unit, "; ".join(bad["reasons"])))
    return out


def decision_for_target(points, target_qps, keep_rule=None):
    """The keep/roll_back decision for the load the service really runs: the request-rate point at or above ``target_qps``.

    Returns ``{"target_qps", "load", "exact", "decision" (bench_report.decide's dict), "speedup"}``. Raises
    ``ValidationError`` (field ``target_qps``) when it is not > 0, the points are concurrencies, or it is above
    every measured rate.
    """
    if not _is_number(target_qps) or target_qps <= 0:
        raise ValidationError("must be a number greater than 0, got %r" % (target_qps,), field="target_qps",
                              hint="the request rate (requests/s) the service really runs")
    kind, points = _check_points(points)
    if kind != "request_rate":
        raise ValidationError("needs request-rate points, the sweep measured %s" % kind, field="target_qps",
                              hint="sweep request_rates up to at least %g" % target_qps)
    chosen = next((p for p in points if p["load"] >= target_qps * (1 - _LOAD_EPS)), None)
    if chosen is None:
        raise ValidationError("%g is above every measured request rate (largest %g)" % (target_qps, points[-1]["load"]),
                              field="target_qps", hint="measure a request rate at or above %g, or lower target_qps" % target_qps)
    decision = _apply_keep_rule(keep_rule, chosen, kind)
    baseline, candidate = _summary(chosen["baseline"]), _summary(chosen["candidate"])
    return {"target_qps": float(target_qps), "load": chosen["load"], "exact": abs(chosen["load"] - target_qps) <= _LOAD_EPS * target_qps,
            "decision": decision,
            "speedup": bench_stats.ratio(candidate.get("output_throughput"), baseline.get("output_throughput"))}


# -- the k model ----------------------------------------------------------------------------------------------
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
        if not _is_number(value) or value <= 0:
            raise ValidationError("must be a measured TPOT greater than 0, got %r" % (value,), field=name,
                                  hint="take the median TPOT of each side from one A/B at the same load")
    if not _is_number(mean_acceptance_length) or mean_acceptance_length < 1:
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
        if not _is_number(value) or not 0 <= value <= 1:
            raise ValidationError("position %d is %r, not a fraction in [0, 1]" % (index + 1, value), field=field,
                                  hint="write 0.45 for 45%")
        if rates and value > rates[-1] + 1e-9:
            raise ValidationError("position %d (%g) is above position %d (%g): vLLM's per-position rates are cumulative "
                                  "(accepted_per_pos/drafts) and never increase" % (index + 1, value, index, rates[-1]),
                                  field=field, hint="pass vLLM's figures as measured, or convert conditional rates with cumulative_rates()")
        rates.append(float(value))
    if not _is_number(verify_cost_ratio) or verify_cost_ratio < 0:
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


# -- plan and resume ------------------------------------------------------------------------------------------
def prompts_sha256(prompts):
    """A stable digest of the prompts in order (ids, chat messages and text), for the resume check."""
    canon = [{"id": p.get("id"), "messages": p.get("messages"), "prompt": p.get("prompt")} for p in prompts or []]
    return hashlib.sha256(json.dumps(canon, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def _unit_key(unit):
    k = unit.get("k")
    return (unit.get("kind"), round(float(unit.get("load")), 9), unit.get("side"), int(k) if k is not None else None)


def plan_units(request_rates=None, concurrencies=None, candidate_ks=(None,)):
    """The measurements of a sweep in run order: per load, the baseline then each candidate k (interleaved sides).

    ``candidate_ks``: the k of each candidate configuration (``None`` for the deployed candidate's own k).
    """
    units = []
    for kind, loads in (("request_rate", request_rates), ("concurrency", concurrencies)):
        for load in loads or ():
            units.append({"kind": kind, "load": load, "side": "baseline", "k": None})
            for k in candidate_ks:
                units.append({"kind": kind, "load": load, "side": "candidate", "k": k})
    return units


def resume_state(previous_json, plan):
    """What a rerun can skip: the planned measurements a previous sweep's JSON output already holds.

    ``previous_json``: the earlier run's output (dict, JSON text, or ``None`` for a fresh run), shaped
    ``{"schema": SWEEP_SCHEMA, "protocol": {...}, "measurements": [{"kind", "load", "side", "k", "summary", ...}]}``.
    ``plan``: ``{"protocol": {...}, "units": plan_units(...)}``; the protocol must hold at least
    ``REQUIRED_PROTOCOL_KEYS`` (prompts hash, seed, temperature). Every protocol key of the plan must equal the
    previous run's, else ``ValidationError`` (field ``resume_from``): mixing measurements of two protocols would
    make the comparison meaningless. A measurement counts as done when its kind, load, side and k match a planned
    unit and it has a summary (a later duplicate wins); only the missing side of a half-measured load is redone.

    Returns ``{"done": [previous measurements, in plan order], "todo": [planned units still to measure]}``.
    """
    if not isinstance(plan, dict) or not isinstance(plan.get("protocol"), dict) or not isinstance(plan.get("units"), (list, tuple)):
        raise ValidationError("must be {'protocol': {...}, 'units': [...]}", field="plan")
    protocol = plan["protocol"]
    absent = [key for key in REQUIRED_PROTOCOL_KEYS if protocol.get(key) is None]
    if absent:
        raise ValidationError("the sweep protocol lacks %s" % ", ".join(absent), field="plan.protocol",
                              hint="record the prompts hash (prompts_sha256()), seed and temperature of the run")
    units = list(plan["units"])
    if previous_json is None:
        return {"done": [], "todo": units}
    previous = previous_json
    if isinstance(previous, (str, bytes)):
        try:
            previous = json.loads(previous)
        except ValueError as exc:
            raise ValidationError("is not JSON (%s)" % exc, field="resume_from", hint="point it at the sweep's JSON output") from exc
    if not isinstance(previous, dict) or previous.get("schema") != SWEEP_SCHEMA:
        raise ValidationError("is not a sweep result (schema %s expected)" % SWEEP_SCHEMA, field="resume_from",
                              hint="point it at the JSON file an earlier sweep wrote")
    before = previous.get("protocol") or {}
    differ = sorted(key for key in protocol if protocol[key] != before.get(key))
    if differ:
        details = ", ".join("%s: previous %r, now %r" % (key, before.get(key), protocol[key]) for key in differ)
        raise ValidationError("was measured with other protocol parameters (%s); its points cannot be mixed with this run" % details,
                              field="resume_from", hint="rerun with the same prompts, seed and temperature, or start a fresh sweep without resume_from")
    measured = {}
    for item in previous.get("measurements") or []:
        if isinstance(item, dict) and isinstance(item.get("summary"), dict) and _is_number(item.get("load")):
            measured[_unit_key(item)] = item
    done, todo = [], []
    for unit in units:
        hit = measured.get(_unit_key(unit))
        (done if hit is not None else todo).append(hit if hit is not None else unit)
    return {"done": done, "todo": todo}
