# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load and k sweeps for speculative decoding: input checks, break-even load, k confirmation, target decision, resume.

The pure logic under issue #18 (``spec_sweep`` module, ``playbooks/tune.yml``). Nothing here sends a request:

- ``validate_sweep``: the sweep's inputs (``request_rates``, ``concurrencies``, ``num_speculative_tokens``
  candidates for the method, ``target_qps``), refused with ``ValidationError`` naming the field before any
  request is sent.
- ``break_even(points, keep_rule)``: the highest measured load at which the candidate still meets
  ``spec_benchmark``'s keep rule (``bench_decision.decide``, called, not copied), the first at which it does not,
  and the interpolated crossover of the metric that crossed first.
- ``confirmation(prediction, ...)``: the measured A/B of the k that bench/num_speculative_tokens.py predicts from
  vLLM's per-position acceptance rates (``recommend_k``, ``predict_k``) against the current k.
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
import os

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import num_speculative_tokens as k_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import plots as bench_plots
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import decision as bench_decision
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import workloads as bench_workloads
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config
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
        elif not bench_stats.is_number(value):
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
        if not bench_stats.is_number(target_qps) or target_qps <= 0:
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
    chosen = next((p for p in points if p["load"] >= target_qps * (1 - _LOAD_EPS)), None)
    if chosen is None:
        raise ValidationError("%g is above every measured request rate (largest %g)" % (target_qps, points[-1]["load"]),
                              field="target_qps", hint="measure a request rate at or above %g, or lower target_qps" % target_qps)
    decision = _apply_keep_rule(keep_rule, chosen, kind)
    baseline, candidate = bench_stats.side_summary(chosen["baseline"]), bench_stats.side_summary(chosen["candidate"])
    return {"target_qps": float(target_qps), "load": chosen["load"], "exact": abs(chosen["load"] - target_qps) <= _LOAD_EPS * target_qps,
            "decision": decision,
            "speedup": bench_stats.ratio(candidate.get("output_throughput"), baseline.get("output_throughput"))}


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
        if isinstance(item, dict) and isinstance(item.get("summary"), dict) and bench_stats.is_number(item.get("load")):
            measured[_unit_key(item)] = item
    done, todo = [], []
    for unit in units:
        hit = measured.get(_unit_key(unit))
        (done if hit is not None else todo).append(hit if hit is not None else unit)
    return {"done": done, "todo": todo}


# -- spec state of each side, before any request ------------------------------------------------------------------
def spec_state_from_metrics(text, model_name=None):
    """``{"speculative": bool | None, "k": int | None}`` from one ``/metrics`` page.

    vLLM registers the ``vllm:spec_decode_*`` counters only when the engine runs with a speculative config
    (``SpecDecodingProm`` returns early without one), and creates one ``..._per_pos`` series per proposed slot at
    start-up, so the series count is the engine's ``num_speculative_tokens``. ``None`` when there is no page.
    """
    if text is None:
        return {"speculative": None, "k": None}
    counters = spec_metrics.parse_prometheus(text)
    name = model_name if model_name in counters.all_model_names else None
    if name:
        counters = spec_metrics.parse_prometheus(text, model_name=name)
    k = len(counters.accepted_per_pos or []) or None
    return {"speculative": bool(counters.found), "k": k}


def spec_state_from_command(command, env=None):
    """True/False whether a vLLM command line sets speculative decoding, None without a command.

    Any speculative flag with a value counts (vllm_command's registry: ``--speculative-config`` and its dotted keys, the
    0.24+ ``--spec-*`` shorthand, and the pre-0.10 flags with which older images run speculative decoding)."""
    if bench_report._blank(command):  # pylint: disable=protected-access
        return None
    return any(occ.has_value for occ in vllm_command.find_occurrences(vllm_command.command_words(command, env)))


ENGINE_FIELDS = {"baseline": "baseline_engine_config", "candidate": "candidate_engine_config", "confirm": "confirm_engine_config"}


def spec_state_from_engine(engine, field):
    """``{"found": bool, "config": dict | None}`` from what a side's engine printed at start-up, ``None`` when not given.

    ``engine``: the result of ``alauda.spec_decoding.engine_config_info`` or ``llmisvc_engine_config`` (``found`` and
    ``speculative_config``, the parsed ``speculative_config=...`` of the "Initializing a V1 LLM engine" line), or
    ``{"line": "<the engine-config line>"}``. The engine line is what the engine really runs: a flag lost on
    the way (a ServingRuntime that drops args, a config the engine rejected and replaced) shows there first.
    """
    if engine is None or engine == {}:
        return None
    if not isinstance(engine, dict):
        raise ValidationError("must be a dict, got %s" % type(engine).__name__, field=field,
                              hint="register the result of alauda.spec_decoding.engine_config_info and pass it")
    if engine.get("line") and "found" not in engine:
        parsed = engine_log.parse_engine_line(engine["line"])
        if parsed is None:
            raise ValidationError("line is not vLLM's engine-config line (\"Initializing a V1 LLM engine (v...) with config: ...\")",
                                  field=field + ".line", hint="give the line as the engine logged it, or the engine_config_info module's result")
        return {"found": True, "config": parsed["speculative_config"]}
    if "found" not in engine:
        raise ValidationError("has neither found/speculative_config nor line", field=field,
                              hint="register the result of alauda.spec_decoding.engine_config_info (found, speculative_config) and pass it")
    config = engine.get("speculative_config")
    if config is not None and not isinstance(config, dict):
        raise ValidationError("speculative_config must be a dict or null, got %r" % (config,), field=field + ".speculative_config",
                              hint="pass the engine_config_info module's result unchanged")
    return {"found": bool(engine["found"]), "config": config}


def check_engine_states(engines, metrics_states, method=None, current_k=None, confirm_k=None):
    """Refuse, from each side's engine line, a baseline that runs speculative decoding, a candidate or confirm server
    that does not, and an engine whose method or k contradicts the sweep's inputs or the same side's /metrics.

    ``engines``: ``{side: spec_state_from_engine(...)}`` (``None`` values: not given). Returns
    ``(notes, engine_k)``: what could not be checked, and the candidate's k as its engine printed it.
    """
    notes, engine_k = [], None
    wants = {"baseline": False, "candidate": True, "confirm": True}
    for side, state in engines.items():
        field = ENGINE_FIELDS[side]
        if state is None:
            continue
        if not state["found"]:
            notes.append("the %s's engine-config line was not found (%s.found is false), so its speculative config was "
                         "checked on /metrics only" % (side, field))
            continue
        config = state["config"]
        printed = engine_log.format_config(config)
        if not wants[side]:
            if config is not None:
                raise ValidationError("shows %s: the baseline's engine runs speculative decoding, so it is no baseline" % printed,
                                      field=field, hint="give the engine line of the same model served without --speculative-config")
            continue
        if config is None:
            raise ValidationError("shows speculative_config=None: the %s's engine runs without speculative decoding" % side, field=field,
                                  hint="check that --speculative-config reached vLLM (alauda.spec_decoding.engine_config_info with "
                                       "expected) and point %s_url at that server" % side)
        got_method = engine_log.normalize_method(config.get("method"))
        want_method = engine_log.normalize_method(speculative_config.printed_method(method))
        if want_method and got_method and got_method != want_method:
            raise ValidationError("is %s, but the %s's engine runs method %r (%s)" % (method, side, got_method, printed), field="method",
                                  hint="set method to %s, the method the k candidates are checked against" % got_method)
        k = config.get("num_spec_tokens")
        seen = (metrics_states.get(side) or {}).get("k")
        if isinstance(k, int) and seen is not None and seen != k:
            raise ValidationError("shows num_spec_tokens=%d, but %s_url's /metrics has %d per-position series: the log and the URL "
                                  "are of different servers" % (k, side, seen), field=field,
                                  hint="give the engine line of the server %s_url serves" % side)
        if side == "candidate" and isinstance(k, int):
            engine_k = k
            if current_k is not None and current_k != k:
                raise ValidationError("is %d, but the candidate's engine runs num_spec_tokens=%d" % (current_k, k), field="current_k",
                                      hint="leave current_k unset (it is read from the engine line) or set it to %d" % k)
        if side == "confirm" and isinstance(k, int) and confirm_k is not None and confirm_k != k:
            raise ValidationError("is %d, but the confirm server's engine runs num_spec_tokens=%d" % (confirm_k, k), field="confirm_k",
                                  hint="deploy the predicted k there, or set confirm_k to %d" % k)
    return notes, engine_k


def describe_checks(states, engines):
    """What the report says each side was found to run, before the first request."""
    out = {}
    for side, state in states.items():
        engine = engines.get(side)
        seen = state.get("speculative")
        out[side] = {
            "engine_line": (engine_log.format_config(engine["config"]) if engine and engine["found"] else
                            "not found in the log" if engine else "not given"),
            "metrics": ("no /metrics page" if seen is None else
                        "vllm:spec_decode_* counters, %s per-position series" % state.get("k") if seen else
                        "no vllm:spec_decode_* counters"),
        }
    return out


def check_spec_states(states, commands=None):
    """Refuse a candidate that does not run speculative decoding and a baseline that does (``ValidationError``).

    ``states``: ``{side: spec_state_from_metrics(...)}`` for ``baseline``, ``candidate`` and optionally ``confirm``
    (with ``"expected_k"``); ``commands``: ``{side: True/False/None}`` from ``spec_state_from_command``.
    Returns notes for what could not be checked.
    """
    notes = []
    wants = {"baseline": False, "candidate": True, "confirm": True}
    fields = {"baseline": "baseline_url", "candidate": "candidate_url", "confirm": "confirm_url"}
    for side, state in states.items():
        seen = state.get("speculative")
        if seen is None:
            notes.append("the %s has no /metrics page, so whether it runs speculative decoding was not checked" % side)
        elif seen != wants[side]:
            if wants[side]:
                raise ValidationError("shows no speculative decoding: its /metrics has no vllm:spec_decode_* counters, which vLLM "
                                      "registers whenever a speculative config is set", field=fields[side],
                                      hint="point %s at the server started with --speculative-config" % fields[side])
            raise ValidationError("shows speculative decoding (vllm:spec_decode_* counters on its /metrics, k=%s): it is not a "
                                  "baseline" % state.get("k"), field=fields[side],
                                  hint="point baseline_url at the same model served without --speculative-config")
        expected = state.get("expected_k")
        if seen and expected is not None and state.get("k") is not None and state["k"] != expected:
            raise ValidationError("serves num_speculative_tokens=%d (per-position series on /metrics), not the k=%d to confirm" % (
                state["k"], expected), field=fields[side], hint="deploy the recommended k there, or set confirm_k to what it serves")
    for side, flagged in (commands or {}).items():
        if flagged is None or flagged == wants[side]:
            continue
        field = "report_context.%s_command" % side
        if wants[side]:
            raise ValidationError("has no --speculative-config: the candidate's command does not enable speculative decoding",
                                  field=field, hint="give the command the candidate really runs")
        raise ValidationError("sets --speculative-config: the baseline's command enables speculative decoding",
                              field=field, hint="the baseline is the same command without --speculative-config")
    return notes


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


# -- the run ------------------------------------------------------------------------------------------------------
# Protocol parameters recorded in the sweep JSON; a resumed run must match every one of them.
PROTOCOL_KEYS = ("prompts_sha256", "seed", "temperature", "max_tokens", "api", "runs_per_prompt", "warmup", "arrival",
                 "extra_body", "max_concurrency")


def _unit_label(unit):
    load = ("rate %g req/s" % unit["load"]) if unit["kind"] == "request_rate" else ("concurrency %d" % unit["load"])
    side = unit["side"] if unit.get("k") is None else "%s k=%d" % (unit["side"], unit["k"])
    return "%s %s" % (load, side)


def _write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _read_resume(path):
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise ValidationError("cannot read %s (%s)" % (path, exc.strerror or exc), field="resume_from",
                              hint="point it at the JSON an earlier sweep wrote (<report_dir>/<report_name>.json)") from exc


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


def run_sweep(params, measure=None):
    """The ``spec_sweep`` module's work; ``params`` are its options. Everything refusable is refused before the first
    request (inputs, protocol, report context, each side's speculative state from its engine line, /metrics and the
    commands).

    ``measure``: ``bench_run.measure`` (tests may pass another with its signature).
    """
    measure = measure or bench_run.measure
    sweep = validate_sweep(params["request_rates"], params["concurrencies"], params.get("k_candidates"), params.get("method"),
                           params.get("target_qps"))
    bench_run.check_protocol(dict(params, concurrency=params["max_concurrency"], request_rate=None))
    if params.get("confirm_url") and not params.get("confirm_k"):
        raise ValidationError("is required with confirm_url", field="confirm_k", hint="the num_speculative_tokens confirm_url serves")
    if params.get("confirm_k") is not None and sweep["k_limit"] and not 1 <= params["confirm_k"] <= sweep["k_limit"]:
        raise ValidationError("%d is outside 1..%d, the range allowed for method %s" % (params["confirm_k"], sweep["k_limit"], params["method"]),
                              field="confirm_k", hint="confirm a k within the sweep's candidates")
    prompts = bench_workloads.load_workload(params["workload"], params["prompts_file"], params["num_prompts"])
    request_params = {"max_tokens": params["max_tokens"], "temperature": params["temperature"], "seed": params["seed"],
                      "extra_body": dict(params["extra_body"] or {})}
    protocol = {"prompts_sha256": prompts_sha256(prompts), "seed": params["seed"], "temperature": params["temperature"],
                "max_tokens": params["max_tokens"], "api": params["api"], "runs_per_prompt": params["runs_per_prompt"],
                "warmup": params["warmup"], "arrival": params["arrival"], "extra_body": dict(params["extra_body"] or {}),
                "max_concurrency": params["max_concurrency"]}
    public_request = {"api": params["api"], "workload": params["prompts_file"] or params["workload"], "num_prompts": len(prompts),
                      "temperature": params["temperature"], "max_tokens": params["max_tokens"], "seed": params["seed"],
                      "concurrency": sweep["concurrencies"] or params["max_concurrency"],
                      "request_rate": sweep["request_rates"], "arrival": params["arrival"] if sweep["request_rates"] else None,
                      "runs_per_prompt": params["runs_per_prompt"], "warmup_requests": params["warmup"],
                      "sampling": dict(params["extra_body"] or {}, seed=params["seed"], temperature=params["temperature"])}
    context = bench_report.build_context(params["report_context"], public_request)
    bench_report.require_complete(context)
    if params["plots"]:
        bench_plots.require_matplotlib()  # the plots are drawn last: a missing matplotlib is refused before the requests
    report_dir, name = params["report_dir"], params["report_name"]
    json_path = os.path.join(report_dir, name + ".json")
    resume_text = _read_resume(params.get("resume_from"))

    sides = {"baseline": "baseline", "candidate": "candidate"}
    if params.get("confirm_url"):
        sides["confirm"] = "confirm"
    endpoints = {}
    for side in sides:
        endpoints[side] = bench_client.Endpoint(
            params["%s_url" % side], model=params.get("%s_model" % side), api=params["api"], token=params["bearer_token"],
            headers=params["headers"], timeout=params["timeout"], validate_certs=params["validate_certs"], ca_path=params["ca_path"],
            field="%s_url" % side)
    # Spec state of every side before any inference request: /metrics (GET, not an inference) and the commands.
    states = {}
    for side, endpoint in endpoints.items():
        states[side] = spec_state_from_metrics(bench_run.scrape(endpoint, True), endpoint.model)
    if "confirm" in states:
        states["confirm"]["expected_k"] = params["confirm_k"]
    ctx = params["report_context"] or {}
    commands = {"baseline": spec_state_from_command(ctx.get("baseline_command")),
                "candidate": spec_state_from_command(ctx.get("candidate_command"), ctx.get("candidate_env"))}
    notes = check_spec_states(states, commands)
    engines = {side: spec_state_from_engine(params.get(ENGINE_FIELDS[side]), ENGINE_FIELDS[side]) for side in endpoints}
    engine_notes, engine_k = check_engine_states(engines, states, params.get("method"), params.get("current_k"), params.get("confirm_k"))
    notes += engine_notes
    if all(engine is None for engine in engines.values()):
        notes.append("no engine line was given (baseline_engine_config, candidate_engine_config), so what each side runs was "
                     "checked on /metrics and the commands only")
    checks = describe_checks(states, engines)
    current_k = params.get("current_k") or engine_k or states["candidate"].get("k")
    if sweep["num_speculative_tokens"] and current_k:
        deeper = [k for k in sweep["num_speculative_tokens"] if k > current_k]
        if len(deeper) == len(sweep["num_speculative_tokens"]):
            raise ValidationError("every candidate (%s) is above the candidate's k=%d: its slots beyond %d are never measured" % (
                deeper, current_k, current_k), field="k_candidates",
                hint="run the candidate with num_speculative_tokens=%d (the largest candidate), or pick candidates up to %d" % (
                    max(deeper), current_k))
        if deeper:
            notes.append("k_candidates %s are not predicted: the candidate runs k=%d, so slots beyond %d are not measured; run it "
                         "with the largest candidate" % (deeper, current_k, current_k))

    units = plan_units(sweep["request_rates"], sweep["concurrencies"])
    confirm_load = None
    if params.get("confirm_url"):
        kind = "request_rate" if sweep["request_rates"] else "concurrency"
        loads = sweep["request_rates"] or sweep["concurrencies"]
        confirm_load = params.get("confirm_load") or (sweep["target_qps"] if kind == "request_rate" and sweep["target_qps"] else loads[0])
        confirm_load = next((x for x in loads if x >= confirm_load * (1 - _LOAD_EPS)), loads[-1])
        units += [{"kind": kind, "load": confirm_load, "side": "confirm_current", "k": current_k},
                  {"kind": kind, "load": confirm_load, "side": "confirm", "k": params["confirm_k"]}]
    state = resume_state(resume_text, {"protocol": protocol, "units": units})
    os.makedirs(report_dir, exist_ok=True)
    progress = bench_run.Progress(params["progress_file"] or os.path.join(report_dir, "%s-progress.log" % name), name="spec_sweep")
    for note in notes:
        progress.line("note: " + note)
    measurements = [dict(m) for m in state["done"]]
    progress.line("%d measurement(s) resumed from %s, %d to measure" % (len(measurements), params.get("resume_from"), len(state["todo"])) if measurements
                  else "%d measurement(s) to measure" % len(state["todo"]))
    total = len(units)
    data = {"schema": SWEEP_SCHEMA, "protocol": protocol, "measurements": measurements, "complete": False}
    for unit in state["todo"]:
        endpoint = endpoints["baseline" if unit["side"] == "baseline" else "confirm" if unit["side"] == "confirm" else "candidate"]
        load = {"concurrency": unit["load"], "request_rate": None} if unit["kind"] == "concurrency" else \
            {"concurrency": params["max_concurrency"], "request_rate": unit["load"]}
        label = "[%d/%d] %s" % (len(measurements) + 1, total, _unit_label(unit))
        side = measure(label, endpoint, prompts, dict(params, **load), {"params": request_params}, progress)
        item = {k: v for k, v in side.items() if k != "records"}
        item.update(kind=unit["kind"], load=unit["load"], side=unit["side"], k=unit.get("k"))
        measurements.append(item)
        _write_json(json_path, data)  # after every measurement: an interrupted sweep resumes from here
    result = analyse(measurements, sweep, params, current_k)
    data.update(complete=True, context=context, result=result, notes=notes + result["notes"], checks=checks,
                title=params.get("title") or "Speculative decoding load and k sweep", generated_at=bench_run.now())
    data["resumed"] = len(state["done"])
    paths = bench_report.write_sweep_report(data, report_dir, basename=name, plots=params["plots"])
    progress.line("break-even: %s; target decision: %s; k: %s; report %s" % (
        result["break_even"]["reason"] if result["break_even"] else "n/a",
        (result["target"] or {}).get("decision", {}).get("decision", "n/a"), result["k"].get("reason"), paths["markdown"]))
    return {"changed": False, "points": result["points"], "break_even": result["break_even"], "break_even_by_kind": result["break_even_by_kind"],
            "decision": result["target"], "k": result["k"], "checks": checks, "notes": data["notes"], "resumed": data["resumed"],
            "measured": len(state["todo"]), "report_markdown": paths["markdown"], "report_json": paths["json"], "plots": paths["plots"],
            "progress_file": progress.path}


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
        sweep_point = next((p for p in all_points if p["kind"] == kind and abs(p["load"] - load) <= _LOAD_EPS * max(load, 1)), None)
        confirm = confirmation(dict(prediction, predicted_k=(units["recommended"]["k"] if units else prediction["predicted_k"])), units,
                               sweep_point, keep_rule)
    k_block = {"prediction": prediction, "confirmation": confirm,
               "recommended_k": (confirm or {}).get("recommended_k"), "current_k": current_k,
               "reason": (confirm or {}).get("reason") or (
                   "no acceptance counts on the candidate: no k prediction" if ks else
                   "the candidate's k is unknown (no per-position series on /metrics); set current_k")}
    if not all_points:
        raise ValidationError("no load has both sides measured", field="request_rates", hint="rerun the sweep")
    return {"points": views, "break_even": tables.get(main_kind), "break_even_by_kind": tables, "target": target, "k": k_block,
            "notes": notes}
