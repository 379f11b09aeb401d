# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One measured side of an A/B run, shared by ``spec_benchmark`` and ``spec_sweep``: the guide's protocol checks,
the progress log, warmup + measured requests (``bench_client.measure_side``) between two ``/metrics`` scrapes,
the summary (``bench_stats.summarize_run``), the prefix-cache window and the candidate's acceptance deltas.

Moved here unchanged from ``plugins/modules/spec_benchmark.py`` so the sweep reuses it instead of copying it.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files as local_files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import plots as bench_plots
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import decision as bench_decision
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job as bench_load_job
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job_merge
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import workloads as bench_workloads
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import prometheus_text
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError


class Progress:
    """Appends one line per event to the progress file (a module cannot stream to the terminal)."""

    def __init__(self, path, name="spec_benchmark"):
        self.path = path
        self.lock = threading.Lock()
        self.started = time.monotonic()
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("%s %s started\n" % (now(), name))

    def line(self, text):
        with self.lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write("%s +%7.1fs %s\n" % (now(), time.monotonic() - self.started, text))

    def request(self, label, done, total, record):
        self.line(bench_client.request_line(label, done, total, record))


class Lines:
    """A progress that keeps its lines (for what runs before the progress file exists)."""

    def __init__(self):
        self.lines = []

    def line(self, text):
        self.lines.append(text)


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_protocol(params):
    """The guide's protocol (5-10 runs per prompt, >= 3 warmups, temperature >= 0, ...); ValidationError naming the field."""
    if not 5 <= params["runs_per_prompt"] <= 10:
        raise ValidationError("must be between 5 and 10, got %d" % params["runs_per_prompt"], field="runs_per_prompt",
                              hint="the guide's protocol runs each prompt 5-10 times and reports medians")
    if params["warmup"] < 3:
        raise ValidationError("must be at least 3, got %d" % params["warmup"], field="warmup",
                              hint="the guide discards at least 3 warmup requests per service")
    if params["max_tokens"] < 1:
        raise ValidationError("must be at least 1", field="max_tokens")
    if params["request_rate"] is not None and params["request_rate"] <= 0:
        raise ValidationError("must be positive", field="request_rate", hint="leave it unset to send all requests at once")
    if params["concurrency"] < 1:
        raise ValidationError("must be at least 1, got %d" % params["concurrency"], field="concurrency",
                              hint="1 measures one request at a time; use the load you serve in production")
    if params["temperature"] < 0:
        raise ValidationError("must not be negative, got %s" % params["temperature"], field="temperature",
                              hint="the guide's protocol uses 0 (greedy) on both sides")
    name = params["report_name"]
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValidationError("must be a plain file name, got %r" % (name,), field="report_name",
                              hint="put the folder in report_dir and give only the base name here, e.g. 'llama-eagle3'")
    bench_decision.check_tolerances(params["tolerances"])


def acceptance(before_text, after_text, model_name):
    """The candidate's speculative-decoding figures from two /metrics scrapes (deltas), or None without counters."""
    if before_text is None or after_text is None or not prometheus_text.HAS_PROMETHEUS_CLIENT:
        return None
    after = spec_metrics.parse_prometheus(after_text)
    name = model_name if model_name in after.all_model_names else None
    after = spec_metrics.parse_prometheus(after_text, model_name=name)
    before = spec_metrics.parse_prometheus(before_text, model_name=name)
    if not after.found:
        return None
    summary = spec_metrics.summarize(after.delta(before))
    return {
        "mean_acceptance_length": summary["mean_acceptance_length"],
        "acceptance_rate": summary["draft_acceptance_rate"],
        "per_position": summary["per_position_acceptance_rate"],
        "num_drafts": summary["num_drafts"],
        "num_draft_tokens": summary["num_draft_tokens"],
        "num_accepted_tokens": summary["num_accepted_tokens"],
        "accepted_tokens_per_position": summary["accepted_tokens_per_position"],
        "diagnosis": summary["diagnosis"]["status"],
        "counter_reset": summary["counter_reset"],
    }


def _r(value):
    return "n/a" if value is None else "%.2f" % value


def measure(name, endpoint, prompts, params, request, progress):
    """Warm up, scrape, measure, scrape from here (the controller); returns the side dict (see `side_of`).

    ``params``: ``warmup``, ``runs_per_prompt``, ``concurrency``, ``request_rate``, ``arrival``, ``seed``,
    ``scrape_metrics``; ``request["params"]``: the request body fields (max_tokens, temperature, seed, extra_body).
    """
    progress.line("%s: %s (%s API), %d warmup + %d measured requests" % (
        name, endpoint.url, endpoint.api, params["warmup"], len(prompts) * params["runs_per_prompt"]))
    scrapes = {}

    def before():
        scrapes["before"] = bench_client.scrape(endpoint, params["scrape_metrics"])

    result = bench_client.measure_side(
        endpoint, prompts, request["params"], runs_per_prompt=params["runs_per_prompt"], warmup=params["warmup"],
        concurrency=params["concurrency"], request_rate=params["request_rate"], arrival=params["arrival"], seed=params["seed"],
        progress=progress.request, label=name, before_measure=before)
    return side_of(name, endpoint, dict(result, metrics_before=scrapes.get("before"),
                                        metrics_after=bench_client.scrape(endpoint, params["scrape_metrics"])), progress)


def side_of(name, endpoint, measured, progress):
    """The side dict (summary, prefix-cache window, acceptance deltas, records) of one side's raw measurements, taken
    here or by the in-cluster load Job (``measured``: records, duration_s, warmup, metrics_before, metrics_after, and
    the served model name when the Job resolved it)."""
    model = measured.get("model") or endpoint.model
    before, after = measured.get("metrics_before"), measured.get("metrics_after")
    cache = bench_client.prefix_cache_window(before, after, model)
    summary = bench_stats.summarize_run(measured["records"], measured["duration_s"])
    # whether the client kept up with its schedule, for every side: the load Job's pods said it already (and a run they
    # could not measure cleanly got no decision: load_job.kept_up); a load sent from here is said here, and refused the same way
    client = measured.get("client_summary")
    if client is None:
        client = dict(bench_load_job.client_summary(measured), sent_from="controller")
        progress.line(load_job_merge.describe(name, client))
        refused = load_job_merge.refusal({name: client}, 1)
        if refused is not None:
            raise refused
    progress.line("%s done: %d ok, %d failed, %.1f s, median TTFT %s ms, median TPOT %s ms, %.1f output tok/s" % (
        name, summary["completed"], summary["failed"], summary["duration_s"], _r(summary["ttft_ms"]["median"]),
        _r(summary["tpot_ms"]["median"]), summary["output_throughput"] or 0))
    return {
        "url": endpoint.url,
        "model": model,
        "api": endpoint.api,
        "summary": summary,
        "prefix_cache": cache,
        "warmup": measured["warmup"],
        "acceptance": acceptance(before, after, model),
        "client": client,
        "records": measured["records"],
    }


def cluster_measure(api_client):
    """A ``measure`` with `measure`'s signature whose requests come from a load Job in the cluster (one Job per call)."""
    def measure_from_job(name, endpoint, prompts, params, request, progress):
        measured = bench_load_job.measure(api_client, params, [("side", endpoint)], prompts, request["params"], progress)
        return side_of(name, endpoint, measured["side"], progress)
    return measure_from_job


def cluster_scrape(api_client, params, endpoints, progress):
    """``{side: /metrics text or None}`` of ``endpoints`` read by one load Job (no inference request); the served
    model names it read are set on the endpoints."""
    measured = bench_load_job.measure(api_client, params, list(endpoints.items()), [], {}, progress, scrape_only=True)
    for side, endpoint in endpoints.items():
        endpoint.model = endpoint.model or measured[side].get("model")
    return {side: measured[side].get("metrics_after") for side in endpoints}


def measure_sides(names, endpoints, prompts, params, request, progress, mode, api_client=None):
    """``{side: side dict}`` for ``names`` in order, measured from where ``mode`` says (bench/load_job.py ``choose``):
    here, or by one Job in the cluster for all of them. ``api_client``: a callable giving the cluster's client."""
    if mode == "controller":
        return {name: measure(name, endpoints[name], prompts, params, request, progress) for name in names}
    measured = bench_load_job.measure(api_client(), params, [(name, endpoints[name]) for name in names], prompts,
                                      request["params"], progress)
    return {name: side_of(name, endpoints[name], measured[name], progress) for name in names}


def protocol_arg_spec(report_name):
    """The options ``spec_benchmark`` and ``spec_sweep`` share: the models, the guide's A/B protocol (prompts, warmups,
    repeats, temperature, seed), the endpoints' TLS and auth, the metrics scrape and the report. One spec for both, as
    kubernetes.core shares AUTH_ARG_SPEC; each module documents them in its own words. A fresh dict on every call."""
    return dict(
        baseline_model=dict(type="str"),
        candidate_model=dict(type="str"),
        api=dict(type="str", choices=list(bench_client.APIS), default="chat"),
        workload=dict(type="str", choices=list(bench_workloads.WORKLOADS), default="code_refactor"),
        prompts_file=dict(type="path"),
        num_prompts=dict(type="int"),
        runs_per_prompt=dict(type="int", default=5),
        warmup=dict(type="int", default=3),
        arrival=dict(type="str", choices=list(bench_client.ARRIVALS), default="poisson"),
        temperature=dict(type="float", default=0.0),
        max_tokens=dict(type="int", default=1024, no_log=False),
        seed=dict(type="int", default=0),
        extra_body=dict(type="dict", default={}),
        bearer_token=dict(type="str", no_log=True),
        headers=dict(type="dict", default={}, no_log=True),
        validate_certs=dict(type="bool", default=True),
        ca_path=dict(type="path"),
        timeout=dict(type="float", default=600.0),
        scrape_metrics=dict(type="bool", default=True),
        report_dir=dict(type="path", required=True),
        report_name=dict(type="str", default=report_name),
        report_context=dict(type="dict", default={}),
        tolerances=dict(type="dict", default={}),
        plots=dict(type="bool", default=True),
        title=dict(type="str"),
        progress_file=dict(type="path"),
    )


# Module spec_benchmark: one A/B measurement, in one run or in two phases around a rollout.

RESULTS_SCHEMA = "alauda.spec_decoding/benchmark-side/v1"


def request_parameters(params, prompts):
    return {
        "api": params["api"],
        "workload": params["prompts_file"] or params["workload"],
        "num_prompts": len(prompts),
        "temperature": params["temperature"],
        "max_tokens": params["max_tokens"],
        "seed": params["seed"],
        "concurrency": params["concurrency"],
        "request_rate": params["request_rate"],
        "arrival": params["arrival"] if params["request_rate"] else None,
        "runs_per_prompt": params["runs_per_prompt"],
        "warmup_requests": params["warmup"],
        "sampling": dict(params["extra_body"] or {}, seed=params["seed"], temperature=params["temperature"]),
    }


def _endpoint(params, side):
    return bench_client.Endpoint(
        params["%s_url" % side], model=params["%s_model" % side], api=params["api"], token=params["bearer_token"],
        headers=params["headers"], timeout=params["timeout"], validate_certs=params["validate_certs"], ca_path=params["ca_path"],
        field="%s_url" % side)


def _write_json(path, data):
    local_files.write_whole(path, json.dumps(data, indent=1, sort_keys=True))


def public_side(side):
    """A side as the module returns it: without the request records and the per-request samples."""
    return bench_stats.without_samples({k: v for k, v in side.items() if k != "records"})


def benchmark(params, api_client=None, check_mode=False):
    """Module spec_benchmark: measure the baseline and/or the candidate with the guide's protocol and, with both, write
    the report and decide; returns the module's result. ``api_client``: a callable giving the cluster's client, called
    only when the load runs in the cluster (``load_from``)."""
    # Everything that can be refused is checked before the first file is written.
    check_protocol(params)
    phase = params["phase"]
    sides = {"both": ("baseline", "candidate"), "baseline": ("baseline",)}.get(phase, ("candidate",))
    endpoints = {side: _endpoint(params, side) for side in sides}
    prompts = bench_workloads.load_workload(params["workload"], params["prompts_file"], params["num_prompts"])
    request = request_parameters(params, prompts)
    request["params"] = {"max_tokens": params["max_tokens"], "temperature": params["temperature"], "seed": params["seed"],
                         "extra_body": dict(params["extra_body"] or {})}
    public_request = {k: v for k, v in request.items() if k != "params"}
    report_dir = params["report_dir"]
    name = params["report_name"]
    baseline_results = params["baseline_results"] or os.path.join(report_dir, "baseline-results.json")
    context = None
    if phase != "baseline":
        context = bench_report.build_context(params["report_context"], public_request)
        bench_report.require_complete(context)  # refuse before spending time on requests
        if params["plots"]:
            bench_plots.require_matplotlib()  # the plots are drawn last: a missing matplotlib is refused before the requests
    mode = bench_load_job.choose(params["load_from"], [e.url for e in endpoints.values()])
    if mode == "cluster":
        bench_load_job.check_options(params["load_job"])
        if check_mode:  # nothing is measured, nothing written: the Job goes to the API server as a dry run
            return bench_load_job.dry_run(api_client(), params, [(side, endpoints[side]) for side in sides], prompts, request["params"])
    os.makedirs(report_dir, exist_ok=True)
    progress = Progress(params["progress_file"] or os.path.join(report_dir, "%s-progress.log" % name))
    out = {"changed": False, "progress_file": progress.path}

    if phase == "candidate":
        baseline = load_baseline(baseline_results, public_request, prompts)  # refused before any request is sent
    measured = measure_sides(sides, endpoints, prompts, params, request, progress, mode, api_client=api_client)
    if phase != "candidate":
        baseline = measured["baseline"]
    if phase == "baseline":
        _write_json(baseline_results, {"schema": RESULTS_SCHEMA, "request": public_request,
                                       "prompt_ids": [p["id"] for p in prompts], "side": baseline})
        out.update(baseline=public_side(baseline), baseline_results=baseline_results, requests_file=baseline_results)
        progress.line("baseline saved to %s" % baseline_results)
        return out

    candidate = measured["candidate"]
    candidate_acceptance = candidate.get("acceptance")
    # the sides with their per-request samples (the keep rule's noise tests rank them); the report drops them itself
    report = bench_report.build_report(
        baseline, candidate, context, tolerances=params["tolerances"], acceptance=candidate_acceptance, title=params["title"],
        generated_at=now())
    paths = bench_report.write_report(report, report_dir, records={"baseline": baseline["records"], "candidate": candidate["records"]},
                                      plots=params["plots"], basename=name)
    requests_file = os.path.join(report_dir, "%s-requests.json" % name)
    _write_json(requests_file, {"baseline": baseline["records"], "candidate": candidate["records"]})
    progress.line("decision %s; report %s" % (report["decision"]["decision"], paths["markdown"]))
    out.update(
        decision=report["decision"]["decision"], reasons=report["decision"]["reasons"], speedup=report["comparison"]["speedup"],
        comparison=report["comparison"], acceptance=candidate_acceptance, baseline=public_side(baseline), candidate=public_side(candidate),
        report_markdown=paths["markdown"], report_json=paths["json"], plots=paths["plots"], requests_file=requests_file,
        notes=report["notes"])
    return out


def load_baseline(path, request, prompts):
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ValidationError("cannot read the baseline measurements %s (%s)" % (path, exc), field="baseline_results",
                              hint="run the module with phase=baseline first (same report_dir), or point baseline_results at its file")
    if data.get("schema") != RESULTS_SCHEMA:
        raise ValidationError("%s is not a spec_benchmark baseline file" % path, field="baseline_results")
    differ = sorted(k for k in set(request) | set(data.get("request") or {}) if request.get(k) != (data.get("request") or {}).get(k))
    if differ or data.get("prompt_ids") != [p["id"] for p in prompts]:
        raise ValidationError("request parameters differ from the baseline phase (%s)" % (", ".join(differ) or "prompts"),
                              field="baseline_results", hint="both phases must use identical parameters and prompts")
    return data["side"]
