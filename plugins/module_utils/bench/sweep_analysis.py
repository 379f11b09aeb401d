# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a load sweep's measurements say: break-even load, the decision at the target load, the k confirmation.

Pure logic (``spec_sweep`` module, ``playbooks/tune.yml``); nothing here sends a request:

- ``break_even(points, keep_rule)``: the highest measured load at which the candidate still meets
  ``spec_benchmark``'s keep rule (``bench_decision.decide``, called, not copied), the first at which it does not,
  and the interpolated crossover of the metric that crossed first.
- ``confirmation(prediction, ...)``: the measured A/B of the k that bench/num_speculative_tokens.py predicts from
  vLLM's per-position acceptance rates (``recommend_k``, ``predict_k``) against the current k.
- ``decision_for_target(points, target_qps, keep_rule)``: the keep/roll_back decision at the sweep point at or
  above the load the service really runs.
- ``analyse(measurements, sweep, params, current_k)``: all of the above over a run's measurements, as the module
  returns them, with the best k at each load (bench/k_schedule.py) and, with ``k_schedule``, the
  ``num_speculative_tokens_per_batch_size`` schedule derived from them.

A *point* is one load with both sides measured::

    {"kind": "request_rate" | "concurrency", "load": 4.0,
     "baseline": <bench_stats.summarize_run(...)>, "candidate": <bench_stats.summarize_run(...)>}

A side may also be given as ``spec_benchmark``'s side dict (``{"summary": {...}, ...}``). The summaries carry
the medians and p99 of TTFT/TPOT/ITL (``ttft_ms``, ``tpot_ms``, ``itl_ms``), ``output_throughput`` (tok/s),
``completed``, ``failed`` and ``burst_delivered``, which is what the keep rule reads.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import decision as bench_decision
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import k_schedule
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import num_speculative_tokens as k_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

LOAD_KINDS = ("request_rate", "concurrency")
LOAD_FIELDS = {"request_rate": "request_rates", "concurrency": "concurrencies"}
SIDES = ("baseline", "candidate")
# A rate may be this much below target_qps (float noise from YAML) and still count as "at" it.
LOAD_EPS = 1e-9


# -- points and the keep rule ---------------------------------------------------------------------------------
def _check_points(points, field="points"):
    """Points sorted by load, one kind, unique positive loads, both sides present."""
    if not isinstance(points, (list, tuple)) or not points:
        raise ValidationError("no sweep points", field=field, hint="measure at least one load on both sides")
    kinds = set()
    out = []
    for index, point in enumerate(points):
        if not isinstance(point, dict) or not bench_stats.is_number(point.get("load")) or point["load"] <= 0:
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
    """``bench_decision.decide`` (spec_benchmark's keep rule) on one point; ``keep_rule`` is its tolerances or a callable."""
    baseline, candidate = bench_stats.side_summary(point["baseline"]), bench_stats.side_summary(point["candidate"])
    load = {kind: point["load"]}
    if callable(keep_rule):
        return keep_rule(baseline, candidate, load)
    return bench_decision.decide(baseline, candidate, keep_rule, load)


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
        baseline, candidate = bench_stats.side_summary(point["baseline"]), bench_stats.side_summary(point["candidate"])
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

    ``keep_rule``: ``None`` or a tolerances dict for ``bench_decision.decide`` (the rule ``spec_benchmark`` decides
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

    Returns ``{"target_qps", "load", "exact", "decision" (bench_decision.decide's dict), "speedup"}``. Raises
    ``ValidationError`` (field ``target_qps``) when it is not > 0, the points are concurrencies, or it is above
    every measured rate.
    """
    if not bench_stats.is_number(target_qps) or target_qps <= 0:
        raise ValidationError("must be a number greater than 0, got %r" % (target_qps,), field="target_qps",
                              hint="the request rate (requests/s) the service really runs")
    kind, points = _check_points(points)
    if kind != "request_rate":
        raise ValidationError("needs request-rate points, the sweep measured %s" % kind, field="target_qps",
                              hint="sweep request_rates up to at least %g" % target_qps)
    chosen = next((p for p in points if p["load"] >= target_qps * (1 - LOAD_EPS)), None)
    if chosen is None:
        raise ValidationError("%g is above every measured request rate (largest %g)" % (target_qps, points[-1]["load"]),
                              field="target_qps", hint="measure a request rate at or above %g, or lower target_qps" % target_qps)
    decision = _apply_keep_rule(keep_rule, chosen, kind)
    baseline, candidate = bench_stats.side_summary(chosen["baseline"]), bench_stats.side_summary(chosen["candidate"])
    return {"target_qps": float(target_qps), "load": chosen["load"], "exact": abs(chosen["load"] - target_qps) <= LOAD_EPS * target_qps,
            "decision": decision,
            "speedup": bench_stats.ratio(candidate.get("output_throughput"), baseline.get("output_throughput"))}


# -- the k confirmation: the measured A/B of the predicted k --------------------------------------------------
def confirmation(prediction, confirm_units, sweep_point, keep_rule=None):
    """The measured A/B of the predicted k against the current k, beside the prediction.

    ``confirm_units``: ``{"current": side, "recommended": side}`` measured fresh at the same load (or ``None``);
    ``sweep_point``: the sweep's point at that load (baseline vs current k). When the predicted k is the current k,
    the sweep's own A/B is the measurement. Returns ``{"status": confirmed | rejected | not_measured, ...}``.
    """
    if prediction is None:
        return {"status": "not_measured", "reason": "no acceptance counts were measured on the candidate, so there is no k prediction"}
    pred, cur = prediction["predicted_k"], prediction["current_k"]
    out = {"predicted_k": pred, "current_k": cur, "expected_gain": prediction["expected_gain"],
           "expected_gain_current": prediction.get("expected_gain_current"),
           "load": sweep_point["load"] if sweep_point else None, "kind": (sweep_point or {}).get("kind")}
    if pred == cur:
        summary_b, summary_c = bench_stats.side_summary(sweep_point["baseline"]), bench_stats.side_summary(sweep_point["candidate"])
        speedup = bench_stats.ratio(summary_c.get("output_throughput"), summary_b.get("output_throughput"))
        dec = _apply_keep_rule(keep_rule, sweep_point, sweep_point.get("kind", "request_rate"))
        out.update(status="confirmed" if dec["decision"] == "keep" else "rejected", recommended_k=cur if dec["decision"] == "keep" else None,
                   measured_speedup_vs_current=1.0, measured_speedup_vs_baseline=speedup, decision=dec,
                   reason="the predicted k is the deployed k=%d; the sweep's A/B at this load measured it against the baseline: "
                          "speedup %s, %s" % (cur, _fmt3(speedup), dec["decision"]))
        return out
    if not confirm_units:
        out.update(status="not_measured", recommended_k=None,
                   reason="predicted k=%d (expected gain %.3f vs %s at the current k=%s) is not confirmed: serve k=%d on confirm_url "
                          "(or deploy it) and rerun with resume_from; never adopt a k from the curve alone" % (
                              pred, prediction["expected_gain"], _fmt3(prediction.get("expected_gain_current")), cur, pred))
        return out
    cur_sum, rec_sum = bench_stats.side_summary(confirm_units["current"]), bench_stats.side_summary(confirm_units["recommended"])
    dec = bench_decision.decide(cur_sum, rec_sum, keep_rule if isinstance(keep_rule, dict) else None,
                                {out["kind"] or "request_rate": out["load"]})
    speedup = bench_stats.ratio(rec_sum.get("output_throughput"), cur_sum.get("output_throughput"))
    base = bench_stats.side_summary(sweep_point["baseline"]) if sweep_point else {}
    vs_base = bench_stats.ratio(rec_sum.get("output_throughput"), base.get("output_throughput"))
    predicted_ratio = bench_stats.ratio(prediction["expected_gain"], prediction.get("expected_gain_current"))
    keep = dec["decision"] == "keep"
    out.update(status="confirmed" if keep else "rejected", recommended_k=pred if keep else cur, decision=dec,
               measured_speedup_vs_current=speedup, measured_speedup_vs_baseline=vs_base, predicted_speedup_vs_current=predicted_ratio,
               reason=("k=%d measured against k=%d at load %g: speedup %s (predicted %s); %s" % (
                   pred, cur, out["load"], _fmt3(speedup), _fmt3(predicted_ratio),
                   "keep k=%d" % pred if keep else "keep the current k=%d: %s" % (cur, "; ".join(dec["reasons"])))))
    return out


def _fmt3(value):
    return "n/a" if value is None else "%.3f" % value


# -- a run's measurements, analysed ---------------------------------------------------------------------------
def _point_view(point, decision_row):
    """A point as the module returns it: medians and p99 of TTFT/TPOT/ITL, tok/s, speedup, acceptance, decision."""
    out = {"kind": point["kind"], "load": point["load"], "speedup": decision_row["speedup"], "decision": decision_row["decision"],
           "reasons": decision_row["reasons"]}
    for side in SIDES:
        summary = bench_stats.side_summary(point[side])
        view = {key: {"median": (summary.get(key) or {}).get("median"), "p99": (summary.get(key) or {}).get("p99")}
                for key in ("ttft_ms", "tpot_ms", "itl_ms")}
        view.update(output_throughput=summary.get("output_throughput"), completed=summary.get("completed"), failed=summary.get("failed"))
        if side == "candidate":
            view["acceptance"] = point[side].get("acceptance")
        out[side] = view
    return out


def analyse(measurements, sweep, params, current_k):
    """Points, break-even per load kind, the target decision, the k prediction and its confirmation."""
    by_key = {}
    for item in measurements:
        by_key[(item["kind"], round(float(item["load"]), 9), item["side"])] = item
    points = {kind: [] for kind in LOAD_KINDS}
    for kind in LOAD_KINDS:
        for load in sweep[LOAD_FIELDS[kind]] or ():
            base = by_key.get((kind, round(float(load), 9), "baseline"))
            cand = by_key.get((kind, round(float(load), 9), "candidate"))
            if base and cand:
                points[kind].append({"kind": kind, "load": load, "baseline": base, "candidate": cand})
    keep_rule = params.get("tolerances") or None
    tables, views, notes = {}, [], []
    for kind in LOAD_KINDS:
        if points[kind]:
            tables[kind] = break_even(points[kind], keep_rule)
            views += [_point_view(p, row) for p, row in zip(points[kind], tables[kind]["points"])]
    main_kind = "request_rate" if tables.get("request_rate") else "concurrency"
    target = decision_for_target(points["request_rate"], sweep["target_qps"], keep_rule) if sweep["target_qps"] and points["request_rate"] else None
    all_points = points["request_rate"] + points["concurrency"]
    ks = sweep["num_speculative_tokens"] or ([current_k] if current_k else None)
    prediction = k_model.predict_k(points[main_kind], current_k, ks, params.get("verify_cost_ratio")) if ks and points[main_kind] else None
    confirm = None
    if prediction:
        ck = [m for m in measurements if m["side"] in ("confirm_current", "confirm")]
        units = None
        if ck:
            cur = next((m for m in ck if m["side"] == "confirm_current"), None)
            rec = next((m for m in ck if m["side"] == "confirm"), None)
            if cur and rec:
                units = {"current": cur, "recommended": rec}
                if rec.get("k") != prediction["predicted_k"]:
                    notes.append("confirm_k=%s is not the predicted k=%d: the A/B measured k=%s against k=%s" % (
                        rec.get("k"), prediction["predicted_k"], rec.get("k"), current_k))
        load = (ck[0]["load"] if ck else (target or {}).get("load")) or (points[main_kind][0]["load"])
        kind = ck[0]["kind"] if ck else main_kind
        sweep_point = next((p for p in all_points if p["kind"] == kind and abs(p["load"] - load) <= LOAD_EPS * max(load, 1)), None)
        confirm = confirmation(dict(prediction, predicted_k=(units["recommended"]["k"] if units else prediction["predicted_k"])), units,
                               sweep_point, keep_rule)
    k_block = {"prediction": prediction, "confirmation": confirm,
               "recommended_k": (confirm or {}).get("recommended_k"), "current_k": current_k,
               "reason": (confirm or {}).get("reason") or (
                   "no acceptance counts on the candidate: no k prediction" if ks else
                   "the candidate's k is unknown (no per-position series on /metrics); set current_k")}
    if current_k and points[main_kind]:
        k_block["per_load"] = k_schedule.best_k_per_load(points[main_kind], current_k, ks)
        if params.get("k_schedule"):
            k_block["schedule"] = k_schedule.derive_schedule(k_block["per_load"], current_k,
                                                             params.get("k_schedule_min_gain", k_schedule.DEFAULT_MIN_GAIN))
            notes += k_block["schedule"]["notes"]
    elif params.get("k_schedule"):
        notes.append("no k schedule: the candidate's k is unknown (set current_k)")
    if not all_points:
        raise ValidationError("no load has both sides measured", field="request_rates", hint="rerun the sweep")
    return {"points": views, "break_even": tables.get(main_kind), "break_even_by_kind": tables, "target": target, "k": k_block,
            "notes": notes}
