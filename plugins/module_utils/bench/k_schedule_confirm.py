# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The k schedule confirmed by a measured A/B: ``num_speculative_tokens_per_batch_size`` against the best fixed k.

bench/k_schedule.py predicts a schedule from the curves; before it is kept, a server running it (the *schedule*
side) is measured against a server running the best fixed ``num_speculative_tokens`` (the *fixed* side) at two
loads, interleaved, with the sweep's protocol (bench/sweep.py measures, resumes and writes; this file decides):

- ``pick_loads(kind, loads, per_load, schedule, num_speculative_tokens, named)``: the loads of the A/B. By default
  the lowest swept load and the highest swept load whose scheduled k differs from the lowest's (a schedule is only
  worth keeping where its k moves); or the loads the user names (swept ones: their batch size is known).
- ``median_interval(samples)``: the distribution-free 95% interval of a median (order statistics: the ranks
  ``n/2 -+ 1.96 sqrt(n)/2``), from the per-request TPOTs of one side.
- ``compare_load(fixed, schedule, ...)``: one load's TPOT and ITL medians of both sides, the speedup (fixed median
  TPOT / schedule median TPOT: above 1 the schedule decodes faster) and the verdict. The *noise* is the relative
  half-widths of both medians' intervals combined (root of the sum of squares); the schedule is ``confirmed``
  when the speedup exceeds 1 + noise, ``not_confirmed`` when it is under 1 - noise, else ``inconclusive``
  (within noise: more requests per side narrow the intervals).
- ``confirm(...)``: per load and overall: ``not_confirmed`` when a load is, ``confirmed`` when a load is and none
  is not, else ``inconclusive``. A load where the schedule runs the fixed k itself is a control: the two servers run
  the same engine there, so a difference beyond the noise is the servers' (their cores, their neighbours), not the
  schedule's, and the whole A/B is ``inconclusive`` (seen on the e2e's shared 2-core machine: 23% at k=4 against k=4).

Plain Python, no Ansible imports; nothing here sends a request.
"""

from __future__ import annotations

import math

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_schedule

SIDES = ("schedule_fixed", "schedule")
Z95 = 1.96


def check_params(params):
    """``None`` when no schedule A/B is asked (no ``schedule_url``), else its inputs, refused before any request."""
    url, fixed_url = params.get("schedule_url"), params.get("fixed_url")
    if not url and not fixed_url:
        return None
    if not url or not fixed_url:
        missing = "schedule_url" if not url else "fixed_url"
        raise ValidationError("is required for the k schedule's A/B", field=missing,
                              hint="give both: schedule_url (a server running the schedule) and fixed_url (one running the best fixed k)")
    schedule = params.get("schedule")
    if schedule is not None:
        schedule = speculative_schedule.normalise(schedule, field="schedule")
    fixed_k = params.get("fixed_k")
    if fixed_k is not None and (not isinstance(fixed_k, int) or isinstance(fixed_k, bool) or fixed_k < 1):
        raise ValidationError("must be a whole number >= 1, got %r" % (fixed_k,), field="fixed_k",
                              hint="the num_speculative_tokens fixed_url serves (default: its /metrics per-position series)")
    loads = params.get("schedule_loads")
    if loads is not None and (not isinstance(loads, (list, tuple)) or len(loads) != 2 or
                              not all(bench_stats.is_number(x) and x > 0 for x in loads) or loads[0] == loads[1]):
        raise ValidationError("must be two different swept loads, got %r" % (loads,), field="schedule_loads",
                              hint="e.g. [1, 8]: a low load and a high one, each in request_rates or concurrencies")
    return {"schedule": schedule, "fixed_k": fixed_k, "loads": sorted(float(x) for x in loads) if loads else None}


def _batch_of(per_load, load, kind):
    if kind == "concurrency":
        return max(1, int(load))
    row = next((r for r in per_load or [] if r.get("kind") == kind and abs(float(r["load"]) - float(load)) <= 1e-9 * max(load, 1)), None)
    return (row or {}).get("batch_size")


def pick_loads(kind, loads, per_load, schedule, num_speculative_tokens, named=None):
    """``[{"load", "batch_size", "scheduled_k"}]`` (two loads, low then high), or a ValidationError naming the fix."""
    field = "schedule_loads" if named else "schedule"
    rows = []
    for load in loads:
        batch = _batch_of(per_load, load, kind)
        rows.append({"load": load, "batch_size": batch,
                     "scheduled_k": speculative_schedule.k_at(schedule, batch, num_speculative_tokens) if batch else None})
    if named:
        chosen = []
        for load in named:
            row = next((r for r in rows if abs(float(r["load"]) - load) <= 1e-9 * max(load, 1)), None)
            if row is None:
                raise ValidationError("%g is not a swept %s (%s)" % (load, kind.replace("_", " "), ", ".join("%g" % x for x in loads)),
                                      field="schedule_loads", hint="name two of the swept loads: their batch size is measured there")
            if row["batch_size"] is None:
                raise ValidationError("load %g has no batch size (no E2E latency measured there)" % load, field="schedule_loads",
                                      hint="name a load the sweep measured on the candidate")
            chosen.append(row)
        return chosen
    known = [r for r in rows if r["scheduled_k"] is not None]
    if not known:
        raise ValidationError("no swept load has a batch size to read the schedule at", field=field, hint="name the loads in schedule_loads")
    low = known[0]
    high = next((r for r in reversed(known) if r["scheduled_k"] != low["scheduled_k"]), None)
    if high is None:
        raise ValidationError("runs k=%d at every swept load (%s): it is a fixed k, nothing to confirm against one" % (
            low["scheduled_k"], ", ".join("%g" % r["load"] for r in known)), field=field,
            hint="keep a fixed num_speculative_tokens, or name two loads in schedule_loads")
    return [low, high]


def median_interval(samples):
    """``(low, high)``: the distribution-free 95% interval of the median of ``samples``; ``None`` with fewer than 3."""
    data = sorted(float(v) for v in samples or () if bench_stats.is_number(v))
    n = len(data)
    if n < 3:
        return None
    rank = max(1, int(math.floor(n / 2.0 - Z95 * math.sqrt(n) / 2.0)))  # the j-th and (n - j + 1)-th values
    return data[rank - 1], data[n - rank]


def relative_half_width(samples):
    """Half the median interval's width over the median: the measurement's own noise, ``None`` without samples."""
    interval = median_interval(samples)
    mid = bench_stats.median(sorted(float(v) for v in samples)) if interval else None
    if not interval or not mid:
        return None
    return (interval[1] - interval[0]) / 2.0 / mid


def _medians(item):
    summary = bench_stats.side_summary(item)
    return {key: (summary.get(key) or {}).get("median") for key in ("tpot_ms", "itl_ms")}


def compare_load(fixed, schedule, load, kind, batch_size, scheduled_k, fixed_k):
    """One load of the A/B: both sides' TPOT/ITL medians, speedup, noise and verdict."""
    f, s = _medians(fixed), _medians(schedule)
    speedup = bench_stats.ratio(f["tpot_ms"], s["tpot_ms"])
    widths = [relative_half_width((side or {}).get("tpot_samples_ms")) for side in (fixed, schedule)]
    noise = math.sqrt(sum(w * w for w in widths)) if all(w is not None for w in widths) else None
    row = {"kind": kind, "load": load, "batch_size": batch_size, "scheduled_k": scheduled_k, "fixed_k": fixed_k,
           "schedule": {"tpot_ms": s["tpot_ms"], "itl_ms": s["itl_ms"]}, "fixed": {"tpot_ms": f["tpot_ms"], "itl_ms": f["itl_ms"]},
           "speedup": speedup, "noise": noise, "samples": [len((side or {}).get("tpot_samples_ms") or ()) for side in (fixed, schedule)]}
    if speedup is None:
        row.update(verdict="inconclusive", reason="no TPOT median on one side")
    elif noise is None:
        row.update(verdict="inconclusive", reason="speedup %.3f, but fewer than 3 per-request TPOTs on a side: no noise bound" % speedup)
    elif speedup > 1.0 + noise:
        row.update(verdict="confirmed", reason="the schedule (k=%s here) decodes %.1f%% faster than fixed k=%s, beyond the noise +-%.1f%%" % (
            scheduled_k, 100.0 * (speedup - 1.0), fixed_k, 100.0 * noise))
    elif speedup < 1.0 - noise:
        row.update(verdict="not_confirmed", reason="the schedule (k=%s here) decodes %.1f%% slower than fixed k=%s, beyond the noise +-%.1f%%" % (
            scheduled_k, 100.0 * (1.0 - speedup), fixed_k, 100.0 * noise))
    else:
        row.update(verdict="inconclusive", reason="speedup %.3f is within the noise +-%.1f%%%s" % (
            speedup, 100.0 * noise, " (the schedule runs the fixed k here: a tie is expected)" if scheduled_k == fixed_k else
            ": measure more requests per side"))
    return row


def confirm(measurements, kind, picked, schedule, num_speculative_tokens, fixed_k, best_fixed_k=None):
    """The A/B's result: ``{"status", "schedule", "describe", "fixed_k", "loads": [compare_load rows], "reason", "notes"}``."""
    by_key = {(m.get("side"), round(float(m["load"]), 9)): m for m in measurements if m.get("side") in SIDES and m.get("kind") == kind}
    rows, notes = [], []
    for pick in picked:
        fixed, sched = (by_key.get((side, round(float(pick["load"]), 9))) for side in SIDES)
        if not fixed or not sched:
            rows.append({"kind": kind, "load": pick["load"], "batch_size": pick["batch_size"], "scheduled_k": pick["scheduled_k"],
                         "fixed_k": fixed_k, "verdict": "inconclusive", "reason": "not measured on both sides", "speedup": None, "noise": None})
            continue
        rows.append(compare_load(fixed, sched, pick["load"], kind, pick["batch_size"], pick["scheduled_k"], fixed_k))
    verdicts = [r["verdict"] for r in rows]
    status = "not_confirmed" if "not_confirmed" in verdicts else "confirmed" if "confirmed" in verdicts else "inconclusive"
    biased = [r for r in rows if r["scheduled_k"] == fixed_k and r["verdict"] != "inconclusive"]
    bias = []
    for row in biased:
        status = "inconclusive"
        bias.append("at load %g both servers run k=%s, yet their median TPOT differs by %.1f%%, beyond the noise +-%.1f%%: the "
                    "servers differ (cores, neighbours), so this A/B cannot credit or blame the schedule; rerun with both on "
                    "equal hardware" % (row["load"], fixed_k, 100.0 * abs(row["speedup"] - 1.0), 100.0 * row["noise"]))
    if best_fixed_k is not None and fixed_k is not None and best_fixed_k != fixed_k:
        notes.append("the fixed side runs k=%d, the sweep's best fixed k is %d: this A/B is not against the best fixed k" % (fixed_k, best_fixed_k))
    unit = "req/s" if kind == "request_rate" else "concurrent requests"
    reason = "; ".join(["at %g %s: %s" % (r["load"], unit, r["reason"]) for r in rows] + bias)
    notes = bias + notes
    return {"status": status, "schedule": schedule, "describe": speculative_schedule.describe(schedule),
            "num_speculative_tokens": num_speculative_tokens, "fixed_k": fixed_k, "kind": kind, "loads": rows,
            "reason": "%s: %s" % ({"confirmed": "keep the schedule", "not_confirmed": "keep fixed k=%s" % fixed_k,
                                   "inconclusive": "not decided within the noise"}[status], reason), "notes": notes}
