# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A k for each load: the best ``num_speculative_tokens`` at each swept load, and the
``num_speculative_tokens_per_batch_size`` schedule vLLM (0.24+) can run from them.

- ``best_k_per_load(points, current_k, k_candidates)``: at each load, the per-position acceptance curve and the
  verify cost measured **at that load** (bench/num_speculative_tokens.py ``verify_cost_ratio_from`` on that load's
  baseline and candidate TPOT, ``recommend_k`` on that load's curve), so the best k can fall as the batch grows
  and verifying gets dearer. k=0 (no drafts, vLLM's schedule allows it) counts as the baseline: gain 1.0.
- ``batch_size_of(point)``: the batch size a load ran at (vLLM's schedule is by batch size, a sweep by load):
  the concurrency itself, or for a request rate the candidate's mean number of requests in flight (Little's law:
  completed x mean E2EL / duration), which counts queued and prefilling requests too: an estimate from above.
- ``derive_schedule(per_load, num_speculative_tokens, min_gain)``: the schedule, with hysteresis.

**Hysteresis** (decided here, documented in docs/when-it-pays.md): walking the loads by growing batch size, the
schedule *holds* a k, starting at the deployed ``num_speculative_tokens``. At each load it moves to that load's
best k only when that k's expected gain beats the held k's gain at the same load by more than ``min_gain``
(relative; default 5%, the spread of two back-to-back runs on a busy machine): a neighbouring batch size whose
best k differs by noise does not flip the schedule. k never rises with batch size (the verify step's cost grows
with the batch, so a rise is noise or a workload change): a load whose best k is above the held one by more than
``min_gain`` is named in ``notes`` (measured otherwise: re-measure it) but not adopted. Every k is bounded by the
deployed ``num_speculative_tokens`` (vLLM would cap it anyway) and the result passes vLLM's own rules
(vllm/speculative_schedule.py).

A prediction from measured curves: confirm it with an A/B against the best fixed k before keeping it.
Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import num_speculative_tokens as k_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_schedule

DEFAULT_MIN_GAIN = 0.05


def batch_size_of(point):
    """``(batch_size, source)`` of one measured load: an int >= 1, or ``(None, why)``."""
    if point.get("kind") == "concurrency":
        return max(1, int(point["load"])), "concurrency"
    summary = bench_stats.side_summary(point.get("candidate"))
    mean_e2el = (summary.get("e2el_ms") or {}).get("mean")
    completed, duration = summary.get("completed"), summary.get("duration_s")
    if not bench_stats.is_number(mean_e2el) or not completed or not bench_stats.is_number(duration) or duration <= 0:
        return None, "no E2E latency or duration on the candidate at this load"
    in_flight = completed * mean_e2el / 1000.0 / duration
    return max(1, int(round(in_flight))), "mean requests in flight %.2f (completed x mean E2EL / duration)" % in_flight


def _median(point, side, key):
    return (bench_stats.side_summary(point.get(side)).get(key) or {}).get("median")


def best_k_per_load(points, current_k, k_candidates=None):
    """Per load: ``{"kind", "load", "batch_size", "batch_size_source", "best_k", "gains": [{"k", "expected_gain"}],
    "verify_cost_ratio", "per_position", "measured_speedup", "reason"}`` (``best_k`` None when the load lacks
    acceptance counts or TPOT; ``reason`` says which)."""
    if not isinstance(current_k, int) or isinstance(current_k, bool) or current_k < 1:
        raise ValidationError("is needed for a k per load, got %r" % (current_k,), field="current_k",
                              hint="the num_speculative_tokens the candidate runs (read from its engine line or /metrics)")
    allowed = set(k_candidates or range(1, current_k + 1)) | {0}
    rows = []
    for point in points:
        batch, source = batch_size_of(point)
        row = {"kind": point["kind"], "load": point["load"], "batch_size": batch, "batch_size_source": source, "best_k": None,
               "gains": [], "verify_cost_ratio": None, "per_position": None, "reason": ""}
        b_sum, c_sum = bench_stats.side_summary(point.get("baseline")), bench_stats.side_summary(point.get("candidate"))
        row["measured_speedup"] = bench_stats.ratio(c_sum.get("output_throughput"), b_sum.get("output_throughput"))
        pooled = k_model.pooled_acceptance([(point.get("candidate") or {}).get("acceptance")])
        b_tpot, c_tpot = _median(point, "baseline", "tpot_ms"), _median(point, "candidate", "tpot_ms")
        if pooled is None or not pooled["per_position"] or not b_tpot or not c_tpot or batch is None:
            row["reason"] = "not measured: %s" % (
                "no acceptance counts on the candidate" if pooled is None or not pooled["per_position"] else
                "no TPOT on one side" if not b_tpot or not c_tpot else source)
            rows.append(row)
            continue
        cost = k_model.verify_cost_ratio_from(b_tpot, c_tpot, pooled["mean_acceptance_length"], current_k)
        table = k_model.recommend_k(pooled["per_position"], cost, current_k)["table"]
        gains = {0: 1.0}
        gains.update({r["k"]: r["expected_gain"] for r in table if r["k"] in allowed})
        best = max(sorted(gains), key=lambda k: gains[k])  # sorted first: the smaller k wins a tie
        row.update(best_k=best, gains=[{"k": k, "expected_gain": gains[k]} for k in sorted(gains)], verify_cost_ratio=cost,
                   per_position=pooled["per_position"],
                   reason="best of k=%s at this load's curve and verify cost" % "/".join(str(k) for k in sorted(gains)))
        rows.append(row)
    return rows


def check_min_gain(min_gain):
    """The hysteresis threshold, refused before any request when it is not a fraction in [0, 1)."""
    if not bench_stats.is_number(min_gain) or not 0 <= min_gain < 1:
        raise ValidationError("must be a fraction in [0, 1), got %r" % (min_gain,), field="k_schedule_min_gain",
                              hint="0.05: a k changes only where it is predicted 5% faster than the held k")
    return float(min_gain)


def _ranges(chosen):
    """``[(batch_size, k)]`` (growing batch size) -> vLLM's ``[[start, end, k]]``: the first range from 1, a change at
    the batch size where it was measured, the last range to the largest measured batch size (vLLM keeps its k beyond)."""
    by_batch = {}
    for batch, k in chosen:
        by_batch[batch] = k  # two loads at one batch size: the later (busier) one's k
    steps = []
    for batch in sorted(by_batch):
        if not steps or steps[-1][1] != by_batch[batch]:
            steps.append([batch, by_batch[batch]])
    steps[0][0] = 1
    top = max(by_batch)
    return [[start, (steps[i + 1][0] - 1) if i + 1 < len(steps) else max(top, start), k] for i, (start, k) in enumerate(steps)]


def derive_schedule(per_load, num_speculative_tokens, min_gain=DEFAULT_MIN_GAIN):
    """The ``num_speculative_tokens_per_batch_size`` schedule from ``best_k_per_load``'s rows, with hysteresis.

    Returns ``{"schedule": [[start, end, k], ...] | None, "describe", "num_speculative_tokens", "min_gain",
    "steps": [{"load", "batch_size", "best_k", "held_k", "k", "gain_best", "gain_held", "changed", "why"}],
    "notes"}``.
    """
    if not isinstance(num_speculative_tokens, int) or isinstance(num_speculative_tokens, bool) or num_speculative_tokens < 1:
        raise ValidationError("must be the deployed k (a whole number >= 1), got %r" % (num_speculative_tokens,),
                              field="num_speculative_tokens", hint="the candidate's num_speculative_tokens: a schedule's k never exceeds it")
    check_min_gain(min_gain)
    rows = sorted((r for r in per_load if r.get("best_k") is not None), key=lambda r: (r["batch_size"], r["load"]))
    out = {"schedule": None, "describe": None, "num_speculative_tokens": num_speculative_tokens, "min_gain": float(min_gain),
           "steps": [], "notes": []}
    skipped = [r for r in per_load if r.get("best_k") is None]
    for row in skipped:
        out["notes"].append("load %g is left out of the schedule: %s" % (row["load"], row["reason"]))
    if not rows:
        out["notes"].append("no load has a measured curve and TPOT on both sides: no schedule")
        return out
    held = num_speculative_tokens
    chosen = []
    for row in rows:
        every = {g["k"]: g["expected_gain"] for g in row["gains"]}
        gains = {k: g for k, g in every.items() if k <= num_speculative_tokens}
        base = held if held in gains else max(k for k in gains if k <= held)
        below = {k: g for k, g in gains.items() if k <= base}
        best = max(sorted(below), key=lambda k: below[k])
        changed = best != base and below[best] > below[base] * (1.0 + min_gain)
        k = best if changed else base
        top = max(sorted(gains), key=lambda k: gains[k])
        if top > base and gains[top] > gains[base] * (1.0 + min_gain):
            out["notes"].append("at load %g (batch size %d) k=%d is predicted %.1f%% faster than the held k=%d: k rising with "
                                "the batch is not adopted (re-measure this load, or keep a fixed k)" % (
                                    row["load"], row["batch_size"], top, 100.0 * (gains[top] / gains[base] - 1.0), base))
        faster = 100.0 * (below[best] / below[base] - 1.0)
        if changed:
            why = "k=%d predicted %.1f%% faster than k=%d here (> %.1f%%)" % (best, faster, base, 100.0 * min_gain)
        else:
            why = "hold k=%d: %s" % (base, "it is the best here" if best == base else
                                     "k=%d is only %.1f%% faster (<= %.1f%%)" % (best, faster, 100.0 * min_gain))
        out["steps"].append({"kind": row["kind"], "load": row["load"], "batch_size": row["batch_size"], "best_k": row["best_k"],
                             "held_k": base, "k": k, "gain_best": every[row["best_k"]], "gain_held": gains[base],
                             "gain_k": gains[k], "changed": changed, "why": why})
        chosen.append((row["batch_size"], k))
        held = k
    schedule = speculative_schedule.normalise(_ranges(chosen))
    out.update(schedule=schedule, describe=speculative_schedule.describe(schedule))
    if len(schedule) == 1:
        out["notes"].append("one k at every measured batch size (k=%d): a fixed num_speculative_tokens does the same" % schedule[0][2])
    return out
