# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The load Job's pods put together, and whether the client kept up (issue 53).

With ``load_job.pods`` = N the Job is an Indexed Job of N pods; pod i sends requests i, i + N, ... of the one seeded
schedule at their offsets in it (bench/client.py ``measure_side(shard=...)``) with its share of the concurrency.
``merge_results`` makes one side of their results that ``bench/stats.py`` summarises as it does one pod's: the records
back in schedule order, their start offsets on one clock (the pods' wall clocks at the start of their measured
requests), the duration from the first pod's start to the last pod's end, the warmups added up, the ``/metrics``
scrape of the pod that started first as "before" and of the one that ended last as "after" (counter deltas over the
whole window). The pods start when the kubelet starts them: how far apart (``start_skew_s``) is said, not corrected.

``client_summary`` says, for every run (one pod or many), whether the client kept up: the send lag against the
schedule (p50, p99, max: ``run_requests``' ``send_lag``) and each pod's CPU over its measured requests (the CPU seconds
of the client's event loop thread / wall seconds: bench/client.py ``run_measured``). ``refusal`` is the error a decision
gets instead when either is over its bound (load_job.MAX_SEND_LAG_P99_MS, MAX_CLIENT_CPU): the figures and the fix, more
pods. A load sent from the controller gets the same summary and the same refusal (bench/run.py ``side_of``; the fix there
is the load Job's pods or a lower load); every A/B report shows them (``markdown_lines``: its "Load client" section) and notes a side whose client fell behind
(``client_notes``: a baseline saved before the refusal, say).
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError


def merge_side(parts):
    """One side from the pods' parts (``[{records, duration_s, warmup, metrics_before, metrics_after, epoch, client, model}]``,
    index order)."""
    if len(parts) == 1 and parts[0].get("epoch") is None:
        return dict(parts[0])  # a pod of an older bundle: nothing to align
    first = min(part["epoch"] for part in parts)
    records = []
    for part in parts:
        shift = part["epoch"] - first
        for record in part["records"]:
            records.append(dict(record, start_offset=record["start_offset"] + shift))
    records.sort(key=lambda r: r.get("schedule_index", 0))
    # relative to the first start (not epoch + duration: an epoch's float has 0.1 us steps, a duration finer ones)
    ends = [(part["epoch"] - first) + part["duration_s"] for part in parts]
    starter = min(parts, key=lambda p: p["epoch"])
    finisher = parts[ends.index(max(ends))]
    warmup = {key: sum(part["warmup"].get(key) or 0 for part in parts) for key in ("requests", "failed")}
    warmup["duration_s"] = max(part["warmup"].get("duration_s") or 0 for part in parts)
    return {
        "model": parts[0].get("model"), "records": records, "duration_s": max(ends), "warmup": warmup,
        "metrics_before": starter.get("metrics_before"), "metrics_after": finisher.get("metrics_after"),
        "epoch": first, "start_skew_s": round(max(part["epoch"] for part in parts) - first, 4),
        "clients": [part.get("client") for part in parts],
    }


def merge_results(results):
    """``{"sides": {name: side}}`` of the pods' results (each ``{"sides", "index"}``), in pod index order."""
    ordered = sorted(results, key=lambda r: r.get("index", 0))
    names = list(ordered[0]["sides"])
    return {"schema": ordered[0].get("schema"), "sides": {name: merge_side([r["sides"][name] for r in ordered]) for name in names}}


def client_summary(side, max_lag_ms, max_cpu):
    """``{pods, send_lag_ms: {p50, p99, max}, cpu_ratio_max, start_skew_s, kept_up, why}`` of a merged side."""
    lags = [r["send_lag"] for r in side.get("records") or [] if r.get("send_lag") is not None]
    clients = [c for c in side.get("clients") or [side.get("client")] if c]
    lag = {"p50": None, "p99": None, "max": None}
    if lags:
        lag = {"p50": round(bench_stats.percentile(lags, 50) * 1000.0, 3), "p99": round(bench_stats.percentile(lags, 99) * 1000.0, 3),
               "max": round(max(lags) * 1000.0, 3)}
    ratios = [c["cpu_ratio"] for c in clients if c.get("cpu_ratio") is not None]
    cpu = max(ratios) if ratios else None
    why = []
    if not lags:
        why.append("no send lag was measured (a client older than this collection)")
    elif lag["p99"] > max_lag_ms:
        why.append("the client sent its requests late: send lag p99 %.1f ms (max %.1f ms) over the %.0f ms bound" % (lag["p99"], lag["max"], max_lag_ms))
    if cpu is not None and cpu > max_cpu:
        why.append("a client pod used %.2f of a CPU over its measured requests, over the %.2f bound (a Python client is one core at most)"
                   % (cpu, max_cpu))
    return {"pods": max(1, len(clients)), "send_lag_ms": lag, "cpu_ratio_max": cpu, "start_skew_s": side.get("start_skew_s", 0.0),
            "kept_up": not why, "why": why}


def sent_from(summary):
    """Where a side's load was sent from, in words: the controller, or the load Job's pods (``summary["sent_from"]``)."""
    if summary.get("sent_from") == "controller":
        return "the controller"
    return "load Job, %d pod%s" % (summary["pods"], "" if summary["pods"] == 1 else "s")


def describe(name, summary):
    """One progress line of a side's client figures."""
    lag = summary["send_lag_ms"]
    skew = "" if summary.get("sent_from") == "controller" else "; pods started %.2f s apart" % (summary["start_skew_s"] or 0.0)
    return "%s client (%s): send lag p50 %s ms, p99 %s ms, max %s ms; CPU %s of a core%s: %s" % (
        name, sent_from(summary), lag["p50"], lag["p99"], lag["max"], summary["cpu_ratio_max"], skew,
        "kept up" if summary["kept_up"] else "did NOT keep up")


def refusal(summaries, pods):
    """The ValidationError a run whose client did not keep up gets instead of a decision, or None. A load sent from the
    controller (``sent_from: controller``) is refused the same way, its fix the load Job's pods or a lower load: one
    process is one event loop on one core, and the controller cannot be scaled out."""
    behind = {name: s for name, s in summaries.items() if not s["kept_up"]}
    if not behind:
        return None
    reasons = "; ".join("%s: %s" % (name, ", ".join(s["why"])) for name, s in behind.items())
    message = "no decision: the load was not measured cleanly, the client fell behind its schedule (%s)" % reasons
    if any(s.get("sent_from") == "controller" for s in behind.values()):
        return ValidationError(message + "; the load was sent from the controller, one client process", field="load_from",
                               hint="send it from the cluster, spread over client pods that each send a shard of the same schedule: "
                                    "load_from: cluster with load_job.pods: 2 or more (the benchmark role's benchmark_load_pods); "
                                    "or measure at a lower concurrency or request_rate")
    return ValidationError(message, field="load_job.pods",
                           hint="spread the load over more client pods: set load_job.pods to %d (or more), each sends a shard of the same "
                                "schedule; or give the Job's pod more CPU (load_job.resources)" % (pods * 2))


def _ms(value):
    return "n/a" if value is None else "%.1f" % value


def client_notes(baseline_client, candidate_client):
    """The A/B report's note per side whose client fell behind its schedule (its ``client``, a ``client_summary``): its
    TTFT and ITL then carry the client's own lateness. A load Job's run gets no decision then (``refusal``, load_job.kept_up);
    a load sent from the controller is said in the report."""
    notes = []
    for name, client in (("baseline", baseline_client), ("candidate", candidate_client)):
        if client and not client.get("kept_up"):
            notes.append("the %s's client (%s) did not keep up with its schedule (%s): its TTFT and ITL carry the client's own "
                         "lateness, not only the server's. Fix: send the load from the cluster with more client pods (load_from: "
                         "cluster, load_job.pods), or measure at a lower load" % (name, sent_from(client), "; ".join(client.get("why") or [])))
    return notes


def markdown_lines(baseline_client, candidate_client):
    """The A/B report's "Load client" section: per side where the load was sent from, the send lag, the client's CPU and
    whether it kept up; nothing for sides without the figures (a baseline saved by an older collection)."""
    clients = [(name, client) for name, client in (("baseline", baseline_client), ("candidate", candidate_client)) if client]
    if not clients:
        return []
    lines = ["## Load client", "", "Whether each side's client kept up with its schedule: the send lag (how late a request went out "
             "once a thread was free for it) and the client's CPU over its measured requests (bounds: send lag p99, CPU of a core).", "",
             "| Side | Sent from | Send lag p50 / p99 / max (ms) | Client CPU (of a core) | Kept up |", "|---|---|---|---|---|"]
    for name, client in clients:
        lag = client.get("send_lag_ms") or {}
        cpu = client.get("cpu_ratio_max")
        cells = (name, sent_from(client), _ms(lag.get("p50")), _ms(lag.get("p99")), _ms(lag.get("max")),
                 "n/a" if cpu is None else "%.2f" % cpu, "yes" if client.get("kept_up") else "**no**")
        lines.append("| %s | %s | %s / %s / %s | %s | %s |" % cells)
    return lines + [""]
