# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The A/B benchmark report and the sweep report: context, Markdown, JSON, PNG plots.

The report refuses to be written without the guide's required context: Hardware (GPU model and count),
Model (identifier and dtype), Runtime (vLLM version, image), Request parameters (temperature, max_tokens,
concurrency, sampling switches, runs per prompt), the baseline command and the speculative-decoding
command. ``missing_fields`` lists what is absent; ``write_report`` raises ``ValidationError`` naming it.

The comparison and the keep/roll_back decision it reports are bench/decision.py; the PNG plots are drawn by
``bench_plots`` (matplotlib).
"""

from __future__ import annotations

import json
import os
import shlex

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files as local_files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job_merge
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import request_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench.decision import LATENCY_ROWS, burst_notes, compare, decide
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench.plots import (
    plot_acceptance, plot_classes, plot_k_curve, plot_k_schedule, plot_latency, plot_sweep_classes, plot_sweep_load,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command

SCHEMA = "alauda.spec_decoding/benchmark-report/v1"

# (path in report["context"], label in the guide's words, the module option that supplies it)
REQUIRED_FIELDS = (
    (("hardware", "gpu_model"), "Hardware: GPU model", "report_context.gpu_model (role: benchmark_gpu_model, or node label nvidia.com/gpu.product)"),
    (("hardware", "gpu_count"), "Hardware: GPU count", "report_context.gpu_count (role: benchmark_gpu_count, or node label nvidia.com/gpu.count)"),
    (("model", "id"), "Model: identifier", "report_context.model (role: benchmark_model_id)"),
    (("model", "dtype"), "Model: dtype", "report_context.dtype (role: benchmark_model_dtype)"),
    (("runtime", "vllm_version"), "Runtime: vLLM version", "report_context.vllm_version (role: read from the engine line, or benchmark_vllm_version)"),
    (("runtime", "image"), "Runtime: image", "report_context.image (role: read from the InferenceService, or benchmark_image)"),
    (("request", "temperature"), "Request parameters: temperature", "temperature"),
    (("request", "max_tokens"), "Request parameters: max_tokens", "max_tokens"),
    (("request", "concurrency"), "Request parameters: concurrency", "concurrency"),
    (("request", "sampling"), "Request parameters: sampling switches", "extra_body / seed"),
    (("request", "runs_per_prompt"), "Request parameters: runs per prompt", "runs_per_prompt"),
    (("commands", "baseline"), "Baseline command", "report_context.baseline_command (role: read from the baseline InferenceService)"),
    (("commands", "candidate"), "Speculative-decoding command", "report_context.candidate_command (role: read from the candidate InferenceService)"),
)


# -- context ------------------------------------------------------------------------------------------------
def _blank(value):
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, tuple)):
        return not value or all(_blank(v) for v in value)
    return False


def missing_fields(context):
    """The required fields absent from ``context`` (the report's ``context`` block), as ``(label, source)``."""
    missing = []
    for path, label, source in REQUIRED_FIELDS:
        node = context if isinstance(context, dict) else {}
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if _blank(node):
            missing.append((label, source))
    return missing


def require_complete(context):
    """Raise ``ValidationError`` naming every missing required field (nothing is written then)."""
    missing = missing_fields(context)
    if missing:
        names = "; ".join("%s (set %s)" % (label, source) for label, source in missing)
        raise ValidationError(
            "refusing to write an incomplete benchmark report, missing %d required field(s): %s" % (len(missing), names),
            field="report_context",
            hint="fill the named fields; the guide requires hardware, model, runtime, request parameters and both commands")


def command_text(command):
    """A command given as an argv list or a string, as one shell line."""
    if isinstance(command, (list, tuple)):
        return " ".join(shlex.quote(str(part)) for part in command)
    return str(command)


def build_context(report_context, request):
    """The report's context block from the user/cluster-supplied values and the module's request parameters.

    Model identifier and dtype, when not given, are read from the candidate's command (``--served-model-name``
    or ``--model``; ``--dtype``) by vllm.command_line, with ``candidate_env`` expanding ``$VARS``.
    """
    ctx = dict(report_context or {})
    command, env = ctx.get("candidate_command"), ctx.get("candidate_env")
    if _blank(ctx.get("model")):
        ctx["model"] = vllm_command.option_value(command, "--served-model-name", env) or vllm_command.option_value(command, "--model", env)
    if _blank(ctx.get("dtype")):
        ctx["dtype"] = vllm_command.option_value(command, "--dtype", env)
    return {
        "hardware": {"gpu_model": ctx.get("gpu_model"), "gpu_count": ctx.get("gpu_count"), "notes": ctx.get("hardware_notes")},
        "model": {"id": ctx.get("model"), "dtype": ctx.get("dtype")},
        "runtime": {"vllm_version": ctx.get("vllm_version"), "image": ctx.get("image")},
        "request": dict(request),
        "commands": {"baseline": ctx.get("baseline_command"), "candidate": ctx.get("candidate_command")},
        "speculative_config": ctx.get("speculative_config"),
        "notes": ctx.get("notes"),
    }


# -- prefix cache notes and the report dict ------------------------------------------------------------------
PREFIX_CACHE_FIX = ("give both InferenceServices the same prefix caching setting (`--enable-prefix-caching` on both, or "
                    "`--no-enable-prefix-caching` on both), then measure again")


def prefix_caching_state(cache):
    """A side's prefix caching setting from its ``prefix_cache`` block: True, False or None (unknown).

    Blocks written before the setting was read (a saved baseline phase) have no ``enabled``: unknown.
    """
    value = (cache or {}).get("enabled")
    return value if isinstance(value, bool) else None


def _state_text(enabled):
    return {True: "on", False: "off"}.get(enabled, "unknown")


def prefix_cache_notes(baseline_cache, candidate_cache):
    """Warnings so cache effects are not mistaken for speculative-decoding gains.

    The setting (``enabled``, from ``vllm:cache_config_info``) decides first: off on both sides is said so;
    on for one side only is named with the fix. A side with caching on, or unknown, keeps the hit-rate notes.
    """
    caches = {"baseline": baseline_cache, "candidate": candidate_cache}
    enabled = {name: prefix_caching_state(cache) for name, cache in caches.items()}
    rates = {name: (cache or {}).get("hit_rate") for name, cache in caches.items()}
    if enabled["baseline"] is False and enabled["candidate"] is False:
        return ["prefix caching is off on both sides (vllm:cache_config_info enable_prefix_caching=False), so cache effects "
                "cannot be mistaken for speculative-decoding gains"]
    notes = []
    if {enabled["baseline"], enabled["candidate"]} == {True, False}:
        on, off = ("baseline", "candidate") if enabled["baseline"] else ("candidate", "baseline")
        notes.append("prefix caching is on for the %s (hit rate %s) and off for the %s (vllm:cache_config_info "
                     "enable_prefix_caching): the comparison mixes cache effects into the difference, so it is not all "
                     "speculative decoding. Fix: %s" % (on, _fmt(rates[on], pct=True), off, PREFIX_CACHE_FIX))
    for name, cache in caches.items():
        if enabled[name] is False:
            continue  # off: no hit rate to know
        if cache is None or cache.get("queries") is None:
            notes.append("prefix cache: the %s exposes no vllm:prefix_cache_* metrics; its hit rate is unknown" % name)
    b_rate, c_rate = rates["baseline"], rates["candidate"]
    if b_rate is not None and c_rate is not None and abs(b_rate - c_rate) > 0.05:
        notes.append("prefix cache hit rates differ (baseline %.1f%%, candidate %.1f%%): part of the difference may be "
                     "cache effects, not speculative decoding" % (100 * b_rate, 100 * c_rate))
    return notes


def build_report(baseline, candidate, context, tolerances=None, acceptance=None, title=None, generated_at=None, notes=None):
    """The complete report dict (JSON-serialisable).

    ``baseline`` / ``candidate``: ``{"url", "model", "summary" (bench_stats.summarize_run), "prefix_cache",
    "warmup", "records"?}``; ``context``: ``build_context(...)``; ``acceptance``: the candidate's /metrics
    deltas (``mean_acceptance_length``, ``acceptance_rate`` 0..1, ``per_position`` list, counts).
    """
    request = context.get("request") or {}
    load = {"concurrency": request.get("concurrency"), "request_rate": request.get("request_rate")}
    b_sum, c_sum = baseline["summary"], candidate["summary"]
    comparison = compare(b_sum, c_sum, acceptance)
    all_notes = list(notes or [])
    all_notes += prefix_cache_notes(baseline.get("prefix_cache"), candidate.get("prefix_cache"))
    all_notes += load_job_merge.client_notes(baseline.get("client"), candidate.get("client"))
    if acceptance is None:
        all_notes.append("no speculative-decoding metrics on the candidate's /metrics: is speculative decoding enabled there?")
    elif not acceptance.get("num_drafts"):
        all_notes.append("the candidate proposed no drafts during the run: speculative decoding did not act on this workload")
    all_notes += burst_notes(b_sum, c_sum)
    # per request class, when the records name classes (bench/request_classes.py); absent otherwise
    classes = request_classes.class_report(baseline, candidate, tolerances, load, acceptance,
                                           vllm_version=(context.get("runtime") or {}).get("vllm_version"))
    all_notes += (classes or {}).get("notes") or []
    sides = {}
    for name, side in (("baseline", baseline), ("candidate", candidate)):
        sides[name] = bench_stats.without_samples({k: v for k, v in side.items() if k != "records"})
    report = {
        "schema": SCHEMA,
        "title": title or "Speculative decoding A/B benchmark",
        "generated_at": generated_at,
        "context": context,
        "baseline": sides["baseline"],
        "candidate": sides["candidate"],
        "comparison": comparison,
        "decision": decide(b_sum, c_sum, tolerances, load),
        "notes": all_notes,
        "plots": {},
    }
    if classes:
        report["classes"] = classes
    return report


# -- Markdown ------------------------------------------------------------------------------------------------
def _fmt(value, digits=2, pct=False, signed=False):
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if pct:
            return ("%+.1f%%" if signed else "%.1f%%") % (100.0 * value)
        if isinstance(value, int):
            return str(value)
        return ("%+." + str(digits) + "f" if signed else "%." + str(digits) + "f") % value
    return str(value)


def _md_cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(report):
    """The human report. Same content as the JSON, laid out the guide's way: context first, then results."""
    ctx = report["context"]
    req = ctx.get("request") or {}
    dec = report["decision"]
    cmp_ = report["comparison"]
    lines = ["# %s" % report["title"], ""]
    if report.get("generated_at"):
        lines += ["Generated: %s" % report["generated_at"], ""]
    lines += ["**Decision: `%s`**" % dec["decision"], ""]
    lines += ["- %s" % reason for reason in dec["reasons"]]
    lines += ["", "Speedup (output tok/s, candidate / baseline): **%s**" % (_fmt(cmp_["speedup"], 3) + "x" if cmp_["speedup"] else "n/a"), ""]

    lines += ["## Context", "", "| Field | Value |", "|---|---|"]
    hw = ctx.get("hardware") or {}
    rows = [
        ("Hardware: GPU model", hw.get("gpu_model")),
        ("Hardware: GPU count", hw.get("gpu_count")),
        ("Model: identifier", (ctx.get("model") or {}).get("id")),
        ("Model: dtype", (ctx.get("model") or {}).get("dtype")),
        ("Runtime: vLLM version", (ctx.get("runtime") or {}).get("vllm_version")),
        ("Runtime: image", (ctx.get("runtime") or {}).get("image")),
    ]
    if hw.get("notes"):
        rows.insert(2, ("Hardware: notes", hw["notes"]))
    if ctx.get("speculative_config"):
        spec = ctx["speculative_config"]
        rows.append(("Speculative config", json.dumps(spec, sort_keys=True) if isinstance(spec, dict) else spec))
    for label, value in rows:
        lines.append("| %s | %s |" % (label, _md_cell(_fmt(value))))
    lines += ["", "### Request parameters", "", "| Parameter | Value |", "|---|---|"]
    for key in ("api", "workload", "num_prompts", "temperature", "max_tokens", "seed", "concurrency", "request_rate", "arrival",
                "runs_per_prompt", "warmup_requests"):
        if key in req:
            value = req[key]
            if key == "request_rate" and value is None:
                value = "inf (all at once, bounded by concurrency)"
            lines.append("| %s | %s |" % (key, _md_cell(_fmt(value, 3))))
    sampling = req.get("sampling")
    lines.append("| sampling switches | %s |" % _md_cell(json.dumps(sampling, sort_keys=True) if isinstance(sampling, dict) else _fmt(sampling)))
    lines += ["", "### Commands", "", "Baseline:", "", "```", command_text(ctx["commands"]["baseline"]), "```", "",
              "Speculative decoding:", "", "```", command_text(ctx["commands"]["candidate"]), "```", ""]

    b_sum, c_sum = report["baseline"]["summary"], report["candidate"]["summary"]
    lines += ["## Results", "", "Medians, with p90 and p99 (`vllm bench serve` definitions; ITL is per streamed chunk).", "",
              "| Metric | Baseline median | Candidate median | Change | Baseline p90 / p99 | Candidate p90 / p99 |",
              "|---|---|---|---|---|---|"]
    for key, label in LATENCY_ROWS:
        b_dist, c_dist = b_sum.get(key) or {}, c_sum.get(key) or {}
        change = cmp_["metrics"][key]["change"]
        lines.append("| %s | %s | %s | %s | %s / %s | %s / %s |" % (
            label, _fmt(b_dist.get("median")), _fmt(c_dist.get("median")), _fmt(change, pct=True, signed=True),
            _fmt(b_dist.get("p90")), _fmt(b_dist.get("p99")), _fmt(c_dist.get("p90")), _fmt(c_dist.get("p99"))))
    lines += ["", "| Throughput | Baseline | Candidate | Change |", "|---|---|---|---|"]
    for key, label in (("output_throughput", "Output tokens/s"), ("request_throughput", "Requests/s"),
                       ("total_token_throughput", "Total tokens/s")):
        row = cmp_["metrics"][key]
        lines.append("| %s | %s | %s | %s |" % (label, _fmt(row["baseline"]), _fmt(row["candidate"]), _fmt(row["change"], pct=True, signed=True)))
    wall = cmp_["wall_time"]
    lines += ["| Wall time (s) | %s | %s | %s (%s s) |" % (
        _fmt(wall["baseline_s"]), _fmt(wall["candidate_s"]), _fmt(wall["change"], pct=True, signed=True), _fmt(wall["delta_s"], signed=True))]
    lines += ["| Requests completed / failed | %d / %d | %d / %d | |" % (
        b_sum.get("completed", 0), b_sum.get("failed", 0), c_sum.get("completed", 0), c_sum.get("failed", 0))]
    lines += ["| Output tokens | %d | %d | |" % (b_sum.get("total_output_tokens", 0), c_sum.get("total_output_tokens", 0)), ""]

    lines += ["## Speculative decoding (candidate /metrics, deltas over the measured run)", ""]
    acc = cmp_.get("acceptance")
    if acc:
        per_pos = acc.get("per_position") or []
        lines += ["| Quantity | Value |", "|---|---|",
                  "| Mean acceptance length | %s |" % _fmt(acc.get("mean_acceptance_length"), 3),
                  "| Acceptance rate | %s |" % _fmt(acc.get("acceptance_rate"), pct=True),
                  "| Per-position acceptance | %s |" % (", ".join("%.3f" % v for v in per_pos) or "n/a"),
                  "| Drafts / draft tokens / accepted | %s / %s / %s |" % (
                      _fmt(acc.get("num_drafts")), _fmt(acc.get("num_draft_tokens")), _fmt(acc.get("num_accepted_tokens"))),
                  "| Ceiling conversion (speedup / mean acceptance length) | %s |" % _fmt(cmp_.get("ceiling_conversion"), 3), ""]
    else:
        lines += ["No speculative-decoding counters were found on the candidate.", ""]

    lines += ["## Prefix cache", "", "| Side | Prefix caching | Hits / queries (tokens) | Hit rate |", "|---|---|---|---|"]
    for name in ("baseline", "candidate"):
        cache = report[name].get("prefix_cache") or {}
        lines.append("| %s | %s | %s / %s | %s |" % (
            name, _state_text(prefix_caching_state(cache)), _fmt(cache.get("hits"), 0), _fmt(cache.get("queries"), 0),
            _fmt(cache.get("hit_rate"), pct=True)))
    lines.append("")
    lines += load_job_merge.markdown_lines(report["baseline"].get("client"), report["candidate"].get("client"))

    lines += ["## Decision checks", "", "| Check | Baseline | Candidate | Change | Tolerance | Not worse | Sure it is better | Noise test |",
              "|---|---|---|---|---|---|---|---|"]
    for check in dec["checks"]:
        gain = check.get("gain_confidence")
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            check["label"], _fmt(check["baseline"]), _fmt(check["candidate"]), _fmt(check["change"], pct=True, signed=True),
            _fmt(check["tolerance"], pct=True), "yes" if check["passed"] else "**no**",
            "" if gain is None else _fmt(gain, pct=True), check.get("noise_test") or "none"))
    if dec.get("untested"):
        lines += ["", "Not noise-tested: %s." % dec["untested"]]
    elif dec.get("confidence") is not None:
        lines += ["", "Keep needs median TPOT or the output rate better at %s sure, and no check worse beyond its tolerance at %s "
                  "sure (bench/noise.py)." % (_fmt(1 - (1 - dec["confidence"]) / 2, pct=True), _fmt(1 - dec["fail_alpha"], pct=True))]
    load = dec.get("load") or {}
    lines += ["", "Target load: concurrency %s, request rate %s." % (
        _fmt(load.get("concurrency")), _fmt(load.get("request_rate"), 3) if load.get("request_rate") else "inf"), ""]

    if report.get("classes"):
        lines += request_classes.render_markdown(report["classes"])
    plots = report.get("plots") or {}
    if plots:
        lines += ["## Plots", ""]
        for key, label in (("acceptance", "Per-position acceptance"), ("latency", "Latency distributions, baseline vs candidate"),
                           ("classes", "Median TPOT per request class")):
            if plots.get(key):
                lines += ["![%s](%s)" % (label, plots[key]), ""]
    if report.get("notes"):
        lines += ["## Notes", ""] + ["- %s" % note for note in report["notes"]] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


# -- writing -------------------------------------------------------------------------------------------------
def write_report(report, report_dir, records=None, plots=True, basename="report"):
    """Refuse an incomplete report, else write ``<basename>.md``, ``<basename>.json`` and the plots.

    ``records``: ``{"baseline": [...], "candidate": [...]}`` per-request records for the latency plot.
    Returns ``{"markdown", "json", "plots": {...}}`` (absolute paths).
    """
    require_complete(report.get("context"))
    try:
        os.makedirs(report_dir, exist_ok=True)
    except OSError as exc:
        raise ValidationError("cannot create %s (%s)" % (report_dir, exc.strerror or exc), field="report_dir",
                              hint="give a writable folder")
    paths = {"plots": {}}
    if plots:
        acc = (report["comparison"].get("acceptance") or {}).get("per_position")
        if acc:
            name = basename + "-acceptance.png"
            plot_acceptance(acc, os.path.join(report_dir, name))
            report["plots"]["acceptance"] = name
            paths["plots"]["acceptance"] = os.path.join(report_dir, name)
        if report.get("classes"):
            name = basename + "-classes.png"
            plot_classes(report["classes"], os.path.join(report_dir, name))
            report["plots"]["classes"] = name
            paths["plots"]["classes"] = os.path.join(report_dir, name)
        if records:
            name = basename + "-latency.png"
            plot_latency(records.get("baseline") or [], records.get("candidate") or [], os.path.join(report_dir, name))
            report["plots"]["latency"] = name
            paths["plots"]["latency"] = os.path.join(report_dir, name)
    paths["json"] = os.path.join(report_dir, basename + ".json")
    paths["markdown"] = os.path.join(report_dir, basename + ".md")
    _atomic_write(paths["json"], json.dumps(report, indent=2, sort_keys=True) + "\n")
    _atomic_write(paths["markdown"], render_markdown(report))
    return paths


def _atomic_write(path, text):
    local_files.write_whole(path, text)


# -- the sweep report -----------------------------------------------------------------------------------------------
SWEEP_LATENCY = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"))


def render_sweep_markdown(data):
    """The sweep report: context (the guide's required fields), break-even, target decision, k, points, plots."""
    ctx, result = data["context"], data["result"]
    lines = ["# %s" % data.get("title", "Speculative decoding sweep"), ""]
    if data.get("generated_at"):
        lines += ["Generated: %s" % data["generated_at"], ""]
    target = result.get("target")
    if target:
        lines += ["**Decision at the target load %s req/s (sweep point %s req/s%s): `%s`**" % (
            _fmt(target["target_qps"], 3), _fmt(target["load"], 3), "" if target["exact"] else ", the next measured above",
            target["decision"]["decision"]), ""]
        lines += ["- %s" % reason for reason in target["decision"]["reasons"]] + [""]
    for kind, be in sorted((result.get("break_even_by_kind") or {}).items()):
        unit = "req/s" if kind == "request_rate" else "concurrent requests"
        lines += ["## Break-even (%s)" % kind.replace("_", " "), "", "| Field | Value |", "|---|---|",
                  "| Status | %s |" % be["status"], "| Highest load that meets keep | %s %s |" % (_fmt(be["last_keep_load"], 3), unit),
                  "| First load that does not | %s %s |" % (_fmt(be["first_roll_back_load"], 3), unit),
                  "| Interpolated crossover | %s %s |" % (_fmt(be["crossover_load"], 3), unit),
                  "| Crossed first | %s |" % _fmt(be["crossed_first"]), "", be["reason"], ""]
        if be.get("pays_again_at"):
            lines += ["Keep holds again at %s after the first roll_back: the curve is not monotonic, re-measure." % ", ".join(
                _fmt(x, 3) for x in be["pays_again_at"]), ""]
    if result.get("classes"):  # per request class (bench/sweep_classes.py)
        lines += sweep_classes.render_markdown(result["classes"])
    lines += ["## Points", "",
              "Medians (p99) per side; speedup = candidate output tok/s / baseline output tok/s.", "",
              "| Load | Side | TTFT ms | TPOT ms | ITL ms | Output tok/s | Speedup | Mean acceptance length | Decision |",
              "|---|---|---|---|---|---|---|---|---|"]
    for point in result["points"]:
        for side in ("baseline", "candidate"):
            view = point[side]
            acc = view.get("acceptance") or {}
            cells = ["%s (%s)" % (_fmt(view[key]["median"]), _fmt(view[key]["p99"])) for key, _label in SWEEP_LATENCY]
            lines.append("| %s %s | %s | %s | %s | %s | %s | %s |" % (
                _fmt(point["load"], 3), "req/s" if point["kind"] == "request_rate" else "conc.", side, " | ".join(cells),
                _fmt(view.get("output_throughput")), _fmt(point["speedup"], 3) if side == "candidate" else "",
                _fmt(acc.get("mean_acceptance_length"), 3) if side == "candidate" else "", point["decision"] if side == "candidate" else ""))
    lines.append("")
    k_block = result.get("k") or {}
    pred = k_block.get("prediction")
    lines += ["## num_speculative_tokens (k)", ""]
    if pred:
        curve = ", ".join("%.3f" % v for v in pred["per_position_rates"])
        lines += ["Per-position acceptance over the sweep (vLLM's accepted_per_pos / drafts, cumulative): %s." % curve, "",
                  "Cost model: %s; verify cost ratio %.4f (%s)." % (pred["cost_model"], pred["verify_cost_ratio"], pred["cost_source"]), "",
                  "| k | Expected tokens per step | Cost (decode steps) | Expected gain |", "|---|---|---|---|"]
        for row in pred["table"]:
            mark = " (predicted)" if row["k"] == pred["predicted_k"] else ""
            mark += " (current)" if row["k"] == k_block.get("current_k") else ""
            lines.append("| %d%s | %.3f | %.3f | %.3f |" % (row["k"], mark, row["expected_tokens_per_step"], row["cost"], row["expected_gain"]))
        lines.append("")
    conf = k_block.get("confirmation") or {}
    lines += ["**Recommended k: %s** (current k %s). %s" % (
        _fmt(k_block.get("recommended_k")), _fmt(k_block.get("current_k")), k_block.get("reason") or ""), ""]
    if conf.get("status") in ("confirmed", "rejected"):
        lines += ["| Confirmation | Value |", "|---|---|", "| Status | %s |" % conf["status"],
                  "| Load | %s |" % _fmt(conf.get("load"), 3),
                  "| Predicted gain (vs baseline) | %s |" % _fmt(conf.get("expected_gain"), 3),
                  "| Predicted speedup vs current k | %s |" % _fmt(conf.get("predicted_speedup_vs_current"), 3),
                  "| Measured speedup vs current k | %s |" % _fmt(conf.get("measured_speedup_vs_current"), 3),
                  "| Measured speedup vs baseline | %s |" % _fmt(conf.get("measured_speedup_vs_baseline"), 3), ""]
    lines += _k_schedule_lines(k_block)
    lines += _schedule_ab_lines(k_block.get("schedule_confirmation"))
    checks = data.get("checks") or {}
    if checks:
        lines += ["## What each side runs", "", "Checked before the first request: the engine-config line each engine logged at "
                  "start-up, and its /metrics.", "", "| Side | Engine line | /metrics |", "|---|---|---|"]
        lines += ["| %s | %s | %s |" % (side, _md_cell(row["engine_line"]), _md_cell(row["metrics"])) for side, row in checks.items()]
        lines.append("")
    lines += ["## Context", "", "| Field | Value |", "|---|---|"]
    hw = ctx.get("hardware") or {}
    for label, value in (("Hardware: GPU model", hw.get("gpu_model")), ("Hardware: GPU count", hw.get("gpu_count")),
                         ("Hardware: notes", hw.get("notes")), ("Model: identifier", (ctx.get("model") or {}).get("id")),
                         ("Model: dtype", (ctx.get("model") or {}).get("dtype")),
                         ("Runtime: vLLM version", (ctx.get("runtime") or {}).get("vllm_version")),
                         ("Runtime: image", (ctx.get("runtime") or {}).get("image"))):
        if value is not None or not label.endswith("notes"):
            lines.append("| %s | %s |" % (label, _md_cell(_fmt(value))))
    lines += ["", "### Request parameters", "", "| Parameter | Value |", "|---|---|"]
    for key, value in sorted((ctx.get("request") or {}).items()):
        lines.append("| %s | %s |" % (key, _md_cell(json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else _fmt(value, 3))))
    lines += ["", "### Commands", "", "Baseline:", "", "```", command_text(ctx["commands"]["baseline"]), "```", "",
              "Speculative decoding:", "", "```", command_text(ctx["commands"]["candidate"]), "```", ""]
    plots = data.get("plots") or {}
    if plots:
        lines += ["## Plots", ""]
        for key, label in (("load", "Speedup and TPOT against load"), ("k", "Per-position acceptance and expected gain per k"),
                           ("k_schedule", "The k schedule beside the measured curve"),
                           ("classes", "Speedup per request class against load")):
            if plots.get(key):
                lines += ["![%s](%s)" % (label, plots[key]), ""]
    if data.get("notes"):
        lines += ["## Notes", ""] + ["- %s" % note for note in data["notes"]] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _k_schedule_lines(k_block):
    """The best k at each load and, when asked for, the num_speculative_tokens_per_batch_size schedule."""
    per_load, sched = k_block.get("per_load") or [], k_block.get("schedule")
    if not per_load:
        return []
    steps = {(s["batch_size"], s["load"]): s for s in (sched or {}).get("steps") or []}
    lines = ["## A k for each load", "",
             "At each load, the candidate's own per-position curve and the verify cost measured there (median TPOT of both "
             "sides, vLLM's `median_tpot_ms`; mean acceptance length, its `spec_decode_acceptance_length`) give the expected "
             "gain of every k; k=0 (no drafts) is the baseline, gain 1.0. Batch size: the concurrency (vLLM's "
             "`max_concurrency`), or for a `request_rate` the mean requests in flight (completed x mean E2EL / duration).", "",
             "| Load | Batch size | Measured speedup (deployed k) | Best k | Its expected gain | Schedule k | Why |",
             "|---|---|---|---|---|---|---|"]
    for row in per_load:
        step = steps.get((row["batch_size"], row["load"])) or {}
        gain = next((g["expected_gain"] for g in row["gains"] if g["k"] == row["best_k"]), None)
        lines.append("| %s %s | %s | %s | %s | %s | %s | %s |" % (
            _fmt(row["load"], 3), "req/s" if row["kind"] == "request_rate" else "conc.", _fmt(row["batch_size"]),
            _fmt(row.get("measured_speedup"), 3), _fmt(row["best_k"]), _fmt(gain, 3), _fmt(step.get("k")),
            _md_cell(step.get("why") or row.get("reason") or "")))
    lines.append("")
    if sched is None:
        return lines
    if sched.get("schedule"):
        lines += ["**num_speculative_tokens_per_batch_size: `%s`** (%s; num_speculative_tokens %d, hysteresis %.1f%%). vLLM 0.24 "
                  "and newer; a prediction from the curves: confirm it with an A/B against the best fixed k before keeping it." % (
                      json.dumps(sched["schedule"]), sched["describe"], sched["num_speculative_tokens"], 100.0 * sched["min_gain"]), ""]
    else:
        lines += ["No schedule: %s" % "; ".join(sched.get("notes") or ["no load was measured"]), ""]
    return lines


def _schedule_ab_lines(conf):
    """The measured A/B of the schedule against the best fixed k, per load."""
    if not conf:
        return []
    lines = ["## The k schedule against the best fixed k", "",
             "**Schedule A/B: %s** (`%s`: %s; fixed num_speculative_tokens %s). %s" % (
                 conf["status"], json.dumps(conf["schedule"]), conf["describe"], _fmt(conf["fixed_k"]), conf["reason"]), "",
             "Both servers measured at each load, fixed k first, with the sweep's protocol. Speedup = fixed median TPOT / schedule "
             "median TPOT (above 1: the schedule decodes faster); noise: the distribution-free 95% intervals of both medians "
             "(from each request's TPOT), combined. Within the noise the verdict is inconclusive.", "",
             "| Load | Batch size | Schedule k | Fixed k | Schedule TPOT ms | Fixed TPOT ms | Schedule ITL ms | Fixed ITL ms | Speedup "
             "| Noise +- | Verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in conf["loads"]:
        sched, fixed = row.get("schedule") or {}, row.get("fixed") or {}
        lines.append("| %s %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            _fmt(row["load"], 3), "req/s" if row["kind"] == "request_rate" else "conc.", _fmt(row["batch_size"]), _fmt(row["scheduled_k"]),
            _fmt(row["fixed_k"]), _fmt(sched.get("tpot_ms")), _fmt(fixed.get("tpot_ms")), _fmt(sched.get("itl_ms")),
            _fmt(fixed.get("itl_ms")), _fmt(row.get("speedup"), 3), _fmt(row.get("noise"), 1, pct=True), row["verdict"]))
    lines.append("")
    return lines


def write_sweep_report(data, report_dir, basename="sweep", plots=True):
    """Write ``<basename>.json`` (also the resume file), ``<basename>.md`` and the PNGs; refuses an incomplete context."""
    require_complete(data.get("context"))
    os.makedirs(report_dir, exist_ok=True)
    result = data["result"]
    paths = {"plots": {}}
    data["plots"] = {}
    if plots and result["points"]:
        be_kind = (result.get("break_even") or {}).get("kind") or result["points"][0]["kind"]
        name = basename + "-load.png"
        plot_sweep_load([p for p in result["points"] if p["kind"] == be_kind], result.get("break_even"),
                        (result.get("target") or {}).get("target_qps"), os.path.join(report_dir, name), kind=be_kind)
        data["plots"]["load"] = name
        paths["plots"]["load"] = os.path.join(report_dir, name)
        pred = (result.get("k") or {}).get("prediction")
        if pred:
            name = basename + "-k.png"
            plot_k_curve(pred, (result.get("k") or {}).get("confirmation"), os.path.join(report_dir, name))
            data["plots"]["k"] = name
            paths["plots"]["k"] = os.path.join(report_dir, name)
        sched = (result.get("k") or {}).get("schedule")
        if sched and sched.get("schedule"):
            name = basename + "-k-schedule.png"
            plot_k_schedule(result["k"].get("per_load") or [], sched, os.path.join(report_dir, name))
            data["plots"]["k_schedule"] = name
            paths["plots"]["k_schedule"] = os.path.join(report_dir, name)
        if result.get("classes"):
            name = basename + "-classes.png"
            plot_sweep_classes(result["classes"], os.path.join(report_dir, name))
            data["plots"]["classes"] = name
            paths["plots"]["classes"] = os.path.join(report_dir, name)
    paths["json"] = os.path.join(report_dir, basename + ".json")
    paths["markdown"] = os.path.join(report_dir, basename + ".md")
    _atomic_write(paths["json"], json.dumps(data, indent=1, sort_keys=True) + "\n")
    _atomic_write(paths["markdown"], render_sweep_markdown(data))
    return paths
