# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load and k sweeps for speculative decoding: input checks, the measurement plan, resume, the run (issue #18).

``run_sweep`` is the ``spec_sweep`` module's work (``playbooks/tune.yml``); the rest sends no request:

- ``validate_sweep``: the sweep's inputs (``request_rates``, ``concurrencies``, ``num_speculative_tokens``
  candidates for the method, ``target_qps``), refused with ``ValidationError`` naming the field before any
  request is sent.
- ``plan_units(request_rates, concurrencies)``: the measurements in run order, per load the baseline then the candidate.
- ``resume_state(previous_json, plan)``: which planned measurements a previous run's JSON already holds.

What the measurements say (break-even, the target decision, the k confirmation) is bench/sweep_analysis.py; what each
side runs, checked before the first request, is bench/sweep_sides.py.
"""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files as local_files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import k_schedule as bench_k_schedule
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import k_schedule_confirm
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import plots as bench_plots
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job as bench_load_job
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import workloads as bench_workloads
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench.sweep_analysis import LOAD_EPS, analyse
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench.sweep_sides import (
    ENGINE_FIELDS, check_engine_states, check_spec_states, describe_checks, spec_state_from_command, spec_state_from_engine,
    spec_state_from_metrics,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

SWEEP_SCHEMA = "alauda.spec_decoding/sweep-results/v1"

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
        if target_qps > rates[-1] * (1 + LOAD_EPS):
            raise ValidationError("%g is above every measured request rate (largest %g)" % (target_qps, rates[-1]), field="target_qps",
                                  hint="add a request rate at or above %g to request_rates, or lower target_qps" % target_qps)
    return {"request_rates": rates, "concurrencies": concs, "num_speculative_tokens": ks, "method": method, "k_limit": limit,
            "target_qps": float(target_qps) if target_qps is not None else None}


# -- plan and resume ------------------------------------------------------------------------------------------
def prompts_sha256(prompts):
    """A stable digest of the prompts in order (ids, chat messages, text and, when named, the request class), for the resume
    check. A prompt without a class hashes as before classes existed, so an earlier sweep's JSON still resumes."""
    canon = [dict({"id": p.get("id"), "messages": p.get("messages"), "prompt": p.get("prompt")},
                  **({"class": p["class"]} if p.get("class") else {})) for p in prompts or []]
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


# -- the run ------------------------------------------------------------------------------------------------------
# Protocol parameters recorded in the sweep JSON; a resumed run must match every one of them.
PROTOCOL_KEYS = ("prompts_sha256", "seed", "temperature", "max_tokens", "api", "runs_per_prompt", "warmup", "arrival",
                 "extra_body", "max_concurrency")


def _unit_label(unit):
    load = ("rate %g req/s" % unit["load"]) if unit["kind"] == "request_rate" else ("concurrency %d" % unit["load"])
    side = unit["side"] if unit.get("k") is None else "%s k=%d" % (unit["side"], unit["k"])
    return "%s %s" % (load, side)


def _write_json(path, data):
    local_files.write_whole(path, json.dumps(data, indent=1, sort_keys=True))


def _read_resume(path):
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise ValidationError("cannot read %s (%s)" % (path, exc.strerror or exc), field="resume_from",
                              hint="point it at the JSON an earlier sweep wrote (<report_dir>/<report_name>.json)") from exc


def schedule_units(schedule_ab, sweep, k_block, current_k):
    """The schedule A/B's units (per load: the fixed k, then the schedule) and the loads picked, after the sweep's analysis.

    The schedule is ``schedule`` as given, else the one the sweep derived (``k_schedule``); its num_speculative_tokens is
    the candidate's k (vLLM caps every scheduled k at it)."""
    derived = (k_block.get("schedule") or {}).get("schedule")
    schedule = schedule_ab["schedule"] or derived
    if not schedule:
        raise ValidationError("is needed for the k schedule's A/B: none was given and the sweep derived none (%s)" % (
            "; ".join((k_block.get("schedule") or {}).get("notes") or ["k_schedule is off"])), field="schedule",
            hint="give the schedule schedule_url runs, or set k_schedule to derive it from the sweep")
    kind = "request_rate" if sweep["request_rates"] else "concurrency"
    loads = sweep["request_rates"] or sweep["concurrencies"]
    nst = current_k or max(entry[2] for entry in schedule)
    picked = k_schedule_confirm.pick_loads(kind, loads, k_block.get("per_load"), schedule, nst, schedule_ab["loads"])
    schedule_ab.update(schedule=schedule, num_speculative_tokens=nst)
    units = []
    for pick in picked:
        units += [{"kind": kind, "load": pick["load"], "side": "schedule_fixed", "k": schedule_ab["fixed_k"]},
                  {"kind": kind, "load": pick["load"], "side": "schedule", "k": None}]
    return units, picked


def run_sweep(params, measure=None, api_client=None, check_mode=False):
    """The ``spec_sweep`` module's work; ``params`` are its options. Everything refusable is refused before the first
    request (inputs, protocol, report context, each side's speculative state from its engine line, /metrics and the
    commands).

    ``measure``: ``bench_run.measure`` (tests may pass another with its signature); with the load from the cluster
    (``load_from``, bench/load_job.py) one load Job per measurement, and one that reads every side's /metrics first.
    ``api_client``: a callable giving the cluster's client, called only then.
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
    if params.get("k_schedule"):
        bench_k_schedule.check_min_gain(params.get("k_schedule_min_gain", bench_k_schedule.DEFAULT_MIN_GAIN))
    schedule_ab = k_schedule_confirm.check_params(params)
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
    if schedule_ab:
        sides.update(schedule="schedule", schedule_fixed="fixed")
    endpoints = {}
    for side, option in sides.items():
        endpoints[side] = bench_client.Endpoint(
            params["%s_url" % option], model=params.get("%s_model" % option), api=params["api"], token=params["bearer_token"],
            headers=params["headers"], timeout=params["timeout"], validate_certs=params["validate_certs"], ca_path=params["ca_path"],
            field="%s_url" % option)
    # Spec state of every side before any inference request: /metrics (GET, not an inference) and the commands.
    job_lines = bench_run.Lines()
    if bench_load_job.choose(params["load_from"], [endpoint.url for endpoint in endpoints.values()]) == "cluster":
        bench_load_job.check_options(params["load_job"])
        client = api_client()
        if check_mode:  # nothing is measured, nothing written: the Job goes to the API server as a dry run
            return bench_load_job.dry_run(client, params, list(endpoints.items()), [], {})
        pages = bench_run.cluster_scrape(client, params, endpoints, job_lines)
        measure = bench_run.cluster_measure(client)
    else:
        pages = {side: bench_client.scrape(endpoint) for side, endpoint in endpoints.items()}
    states = {}
    for side, endpoint in endpoints.items():
        states[side] = spec_state_from_metrics(pages[side], endpoint.model)
    if "confirm" in states:
        states["confirm"]["expected_k"] = params["confirm_k"]
    if schedule_ab:
        states["schedule_fixed"]["expected_k"] = schedule_ab["fixed_k"]
        schedule_ab["fixed_k"] = schedule_ab["fixed_k"] or states["schedule_fixed"].get("k")
    ctx = params["report_context"] or {}
    commands = {"baseline": spec_state_from_command(ctx.get("baseline_command")),
                "candidate": spec_state_from_command(ctx.get("candidate_command"), ctx.get("candidate_env"))}
    notes = check_spec_states(states, commands)
    engines = {side: spec_state_from_engine(params.get(ENGINE_FIELDS[side]), ENGINE_FIELDS[side]) for side in endpoints if side in ENGINE_FIELDS}
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
        confirm_load = next((x for x in loads if x >= confirm_load * (1 - LOAD_EPS)), loads[-1])
        units += [{"kind": kind, "load": confirm_load, "side": "confirm_current", "k": current_k},
                  {"kind": kind, "load": confirm_load, "side": "confirm", "k": params["confirm_k"]}]
    state = resume_state(resume_text, {"protocol": protocol, "units": units})
    os.makedirs(report_dir, exist_ok=True)
    progress = bench_run.Progress(params["progress_file"] or os.path.join(report_dir, "%s-progress.log" % name), name="spec_sweep")
    for line in job_lines.lines:
        progress.line(line)
    for note in notes:
        progress.line("note: " + note)
    measurements = [dict(m) for m in state["done"]]
    progress.line("%d measurement(s) resumed from %s, %d to measure" % (len(measurements), params.get("resume_from"), len(state["todo"])) if measurements
                  else "%d measurement(s) to measure" % len(state["todo"]))
    total = len(units)
    data = {"schema": SWEEP_SCHEMA, "protocol": protocol, "measurements": measurements, "complete": False}
    todo = list(state["todo"])

    def run_units(units_todo, total):
        for unit in units_todo:
            endpoint = endpoints[unit["side"] if unit["side"] in endpoints else "candidate"]
            load = {"concurrency": unit["load"], "request_rate": None} if unit["kind"] == "concurrency" else \
                {"concurrency": params["max_concurrency"], "request_rate": unit["load"]}
            label = "[%d/%d] %s" % (len(measurements) + 1, total, _unit_label(unit))
            side = measure(label, endpoint, prompts, dict(params, **load), {"params": request_params}, progress)
            item = {k: v for k, v in side.items() if k != "records"}
            item.update(kind=unit["kind"], load=unit["load"], side=unit["side"], k=unit.get("k"))
            if unit["side"] in k_schedule_confirm.SIDES:  # the A/B's noise bound needs each request's TPOT
                tpots = (bench_stats.tpot_of(r) for r in side.get("records") or [] if r.get("success"))
                item["tpot_samples_ms"] = sorted(1000.0 * t for t in tpots if t is not None)
            classes = sweep_classes.measured_classes(side, unit["side"]) if unit["side"] in sweep_classes.SIDES else None
            if classes:  # per request class, from the records this JSON does not keep (bench/sweep_classes.py)
                item["classes"] = classes
                if unit["side"] == "candidate":
                    item["classes_counters_check"] = sweep_classes.measured_counters_check(side)
            measurements.append(item)
            _write_json(json_path, data)  # after every measurement: an interrupted sweep resumes from here

    run_units(todo, total)
    result = analyse(measurements, sweep, params, current_k)
    if schedule_ab:
        # the loads come from the sweep's analysis (where the schedule's k moves), so its units are planned after it
        ab_units, ab_picked = schedule_units(schedule_ab, sweep, result["k"], current_k)
        ab_state = resume_state(resume_text, {"protocol": protocol, "units": ab_units})
        measurements.extend(dict(m) for m in ab_state["done"])
        state["done"] += ab_state["done"]
        state["todo"] += ab_state["todo"]
        run_units(ab_state["todo"], total + len(ab_units))
        result = analyse(measurements, sweep, params, current_k)
        result["k"]["schedule_confirmation"] = k_schedule_confirm.confirm(
            measurements, ab_units[0]["kind"], ab_picked, schedule_ab["schedule"], schedule_ab["num_speculative_tokens"],
            schedule_ab["fixed_k"], result["k"].get("recommended_k") or (result["k"].get("prediction") or {}).get("predicted_k"))
        result["notes"] += result["k"]["schedule_confirmation"]["notes"]
    classes = sweep_classes.analyse_classes(measurements, sweep, params.get("tolerances") or None)
    if classes:
        result["classes"] = classes
        result["notes"] += classes["notes"]
        progress.line(sweep_classes.summary_line(classes))
    data.update(complete=True, context=context, result=result, notes=notes + result["notes"], checks=checks,
                title=params.get("title") or "Speculative decoding load and k sweep", generated_at=bench_run.now())
    data["resumed"] = len(state["done"])
    paths = bench_report.write_sweep_report(data, report_dir, basename=name, plots=params["plots"])
    progress.line("break-even: %s; target decision: %s; k: %s; report %s" % (
        result["break_even"]["reason"] if result["break_even"] else "n/a",
        (result["target"] or {}).get("decision", {}).get("decision", "n/a"), result["k"].get("reason"), paths["markdown"]))
    out = {"changed": False, "points": result["points"], "break_even": result["break_even"], "break_even_by_kind": result["break_even_by_kind"],
           "decision": result["target"], "k": result["k"], "checks": checks, "notes": data["notes"], "resumed": data["resumed"],
           "measured": len(state["todo"]), "report_markdown": paths["markdown"], "report_json": paths["json"], "plots": paths["plots"],
           "progress_file": progress.path}
    if result.get("classes"):  # only a sweep whose prompts name classes
        out["classes"] = result["classes"]
    return out
