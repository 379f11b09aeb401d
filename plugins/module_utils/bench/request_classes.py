# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An A/B run per request class: figures, per-request acceptance, a decision per class, the /metrics cross-check.

The gain of speculative decoding depends on the request (the guide's table: a code refactor at 1.84x, chat at 0.99x), so
a run whose prompts name a ``class`` (bench/workloads.py) is also judged class by class:

- The requests of one class on each side (the same prompts on both) are summarised by ``bench_stats.summarize_run`` with
  the class's own request time as its duration (the sum of its requests' E2E latencies): the class's throughput is its
  output tokens per second of request time, the one figure that does not depend on the other classes sharing the run.
- Medians of TTFT, TPOT, ITL and E2E latency get the distribution-free 95% interval of a median
  (``k_schedule_confirm.median_interval``; ITL pools every gap of the class's streams, as ``vllm bench serve`` does).
- The decision per class is ``decision.decide`` on the class's two summaries: the same guards, gain tests, noise tests
  (bench/noise.py, on the class's per-request samples) and confidence as the service-wide decision. Each class is its own
  routing decision, so each is held to the service-wide error rate.
- Acceptance per class comes from the responses' own ``metrics.speculative_decoding`` (vLLM 0.32+ with
  ``--per-request-spec-decode-metrics``; ``bench/client.py`` keeps it as ``spec_decoding``). A response without one
  (an older release, the flag off, ``n > 1``, a stream without usage, a failed request) is counted as not reported;
  nothing is estimated for it.
- ``counters_check``: the per-request sums over the measured window against the candidate's ``/metrics`` counter deltas
  of the same window (``run.acceptance``: the scrapes after the warmup and after the last request). Equal only when
  every request of the window reported its block.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import decision as bench_decision
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench.k_schedule_confirm import median_interval
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import per_request_metrics

UNCLASSIFIED = "(unclassified)"
# the request fields that identify a class's latency figures: summary key, label, per-request values
LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E latency"))
COUNTER_FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
NOT_REPORTED = ("not reported: the responses carried no metrics.speculative_decoding (vLLM before 0.32, the candidate "
                "started without --per-request-spec-decode-metrics, requests with n > 1, or streams without usage)")


def release_note(vllm_version):
    """Why no response can carry a per-request block when the candidate's vLLM release lacks the flag (None when the
    release has it, or is not known or not readable)."""
    if not vllm_version:
        return None
    try:
        has, release = per_request_metrics.release_has_flag(vllm_version)
    except ValidationError:
        return None
    if has:
        return None
    return ("not reported: the candidate runs vLLM %s, which has no %s (it exists from vLLM %d.%d), so no response carries "
            "metrics.speculative_decoding; for a class's acceptance run one benchmark per class (a prompts file of that class "
            "alone) and read the candidate's /metrics" % ((release, per_request_metrics.FLAG) + per_request_metrics.FIRST_RELEASE))


def records_of(side):
    """The per-request records of a side dict (empty when the side kept none)."""
    return list((side or {}).get("records") or [])


def has_classes(*sides):
    """Whether any record of ``sides`` names a request class."""
    return any(r.get("request_class") for side in sides for r in records_of(side))


def group(records):
    """``{class: records}`` in class order, the unclassified (``None``) last."""
    out = {}
    for record in records:
        out.setdefault(record.get("request_class"), []).append(record)
    return {key: out[key] for key in sorted(out, key=lambda k: (k is None, k or ""))}


def _seconds_values(records, key):
    ok = [r for r in records if r.get("success")]
    if key == "ttft_ms":
        return [r["ttft"] for r in ok if r.get("ttft") is not None]
    if key == "tpot_ms":
        return [t for t in (bench_stats.tpot_of(r) for r in ok) if t is not None]
    if key == "itl_ms":
        return [gap for r in ok for gap in (r.get("itl") or [])]
    return [r["latency"] for r in ok if r.get("latency") is not None]


def class_summary(records):
    """``summarize_run`` of one class's records over the class's own request time, with ``intervals``: the 95% interval
    of each latency median in ms (``[low, high]``, None with fewer than 3 values)."""
    request_time = sum(r["latency"] for r in records if r.get("success") and r.get("latency"))
    summary = bench_stats.summarize_run(records, request_time)
    intervals = {}
    for key, _label in LATENCIES:
        interval = median_interval(_seconds_values(records, key))
        intervals[key] = [1000.0 * interval[0], 1000.0 * interval[1]] if interval else None
    summary["intervals"] = intervals
    return summary


def request_counters(record):
    """SpecDecodeCounters of one record's per-request block (found=False when it has none)."""
    block = record.get("spec_decoding")
    return spec_metrics.counters_from_response({"metrics": {"speculative_decoding": block}} if isinstance(block, dict) else {})


def per_request_acceptance(records):
    """Acceptance of ``records`` from their own per-request blocks: ``reported`` / ``requests``, the pooled mean acceptance
    length (1 + accepted / drafts) and rate (accepted / drafted) of the reporting requests, and the median of the
    requests' own values. ``reported == 0``: every figure None and ``note`` says why."""
    ok = [r for r in records if r.get("success")]
    total = spec_metrics.SpecDecodeCounters(source="response")
    lengths, rates = [], []
    reported = 0
    for record in ok:
        counters = request_counters(record)
        if not counters.found:
            continue
        reported += 1
        total = total + counters
        one = spec_metrics.summarize(counters)
        if one["mean_acceptance_length"] is not None:
            lengths.append(one["mean_acceptance_length"])
        if one["draft_acceptance_rate"] is not None:
            rates.append(one["draft_acceptance_rate"])
    out = {"requests": len(ok), "reported": reported, "mean_acceptance_length": None, "acceptance_rate": None,
           "median_request_acceptance_length": None, "median_request_acceptance_rate": None,
           "counters": {field: None for field in COUNTER_FIELDS}, "note": None}
    if not reported:
        out["note"] = NOT_REPORTED
        return out
    pooled = spec_metrics.summarize(total)
    out.update(mean_acceptance_length=pooled["mean_acceptance_length"], acceptance_rate=pooled["draft_acceptance_rate"],
               median_request_acceptance_length=bench_stats.median(lengths) if lengths else None,
               median_request_acceptance_rate=bench_stats.median(rates) if rates else None,
               counters={field: pooled[field] for field in COUNTER_FIELDS})
    if reported < len(ok):
        out["note"] = "%d of %d responses reported it; the figures are theirs alone (%s)" % (reported, len(ok), NOT_REPORTED)
    return out


def counters_check(records, acceptance):
    """The per-request sums of ``records`` (a side's measured requests) against ``acceptance`` (that side's /metrics
    deltas over the same window, ``run.acceptance``).

    ``status``: ``equal`` (every counter the same), ``differ`` (the fields that differ are in ``differ``), or
    ``not_checked`` with the ``reason`` (no /metrics deltas, a counter reset, or requests of the window without a block:
    their drafts are in the deltas but not in any sum)."""
    sums = spec_metrics.SpecDecodeCounters(source="response")
    missing = 0
    for record in records:
        counters = request_counters(record)
        if counters.found:
            sums = sums + counters
        else:
            missing += 1
    per_request = {field: (getattr(sums, field) if sums.found else None) for field in COUNTER_FIELDS}
    metrics = {field: (acceptance or {}).get(field) for field in COUNTER_FIELDS}
    out = {"status": "not_checked", "per_request": per_request, "metrics": metrics, "differ": [], "reason": None,
           "requests": len(records), "reported": len(records) - missing}
    if not acceptance:
        out["reason"] = "the candidate's /metrics had no speculative-decoding counters over the window"
    elif acceptance.get("counter_reset"):
        out["reason"] = "a /metrics counter went down during the window (the server restarted)"
    elif missing:
        out["reason"] = "%d of %d requests of the window carried no per-request block (%s)" % (missing, len(records), NOT_REPORTED)
    else:
        out["differ"] = [field for field in COUNTER_FIELDS if per_request[field] != metrics[field]]
        out["status"] = "differ" if out["differ"] else "equal"
    return out


def _gain_confidence(verdict):
    values = [c["gain_confidence"] for c in verdict["checks"] if c.get("gain_confidence") is not None]
    return max(values) if values else None


# the sweep's per-class decision at the target load reports it too (bench/sweep_classes.py)
gain_confidence = _gain_confidence


def class_entry(name, b_records, c_records, tolerances=None, load=None, confidence=bench_decision.DEFAULT_CONFIDENCE):
    """One class's block: requests, acceptance, latency medians with intervals, gain and decision (see the module doc)."""
    b_sum, c_sum = class_summary(b_records), class_summary(c_records)
    verdict = bench_decision.decide(b_sum, c_sum, tolerances, load, confidence=confidence)
    latency = {}
    for key, _label in LATENCIES:
        b_med, c_med = (b_sum[key] or {}).get("median"), (c_sum[key] or {}).get("median")
        latency[key] = {"baseline": b_med, "candidate": c_med, "baseline_interval": b_sum["intervals"][key],
                        "candidate_interval": c_sum["intervals"][key], "change": bench_stats.relative_change(b_med, c_med)}
    return {
        "class": name,
        "requests": {"baseline": {"completed": b_sum["completed"], "failed": b_sum["failed"]},
                     "candidate": {"completed": c_sum["completed"], "failed": c_sum["failed"]}},
        "acceptance": per_request_acceptance(c_records),
        "latency": latency,
        "output_rate": {"baseline": b_sum["output_throughput"], "candidate": c_sum["output_throughput"]},
        "speedup": bench_stats.ratio(c_sum["output_throughput"], b_sum["output_throughput"]),
        "decision": verdict["decision"],
        "outcome": verdict["outcome"],
        "reasons": verdict["reasons"],
        "confidence": verdict["confidence"],
        "gain_confidence": _gain_confidence(verdict),
        "checks": verdict["checks"],
    }


def class_report(baseline, candidate, tolerances=None, load=None, acceptance=None, confidence=bench_decision.DEFAULT_CONFIDENCE,
                 vllm_version=None):
    """The report's ``classes`` block, or None when no record of either side names a class.

    ``baseline`` / ``candidate``: side dicts with their ``records``; ``acceptance``: the candidate's /metrics deltas;
    ``vllm_version``: the candidate's vLLM release (the report context's), which says when the release lacks the flag."""
    if not has_classes(baseline, candidate):
        return None
    b_groups, c_groups = group(records_of(baseline)), group(records_of(candidate))
    names = sorted(set(b_groups) | set(c_groups), key=lambda k: (k is None, k or ""))
    entries = [class_entry(name, b_groups.get(name, []), c_groups.get(name, []), tolerances, load, confidence) for name in names]
    check = counters_check(records_of(candidate), acceptance)
    notes = []
    lacking = release_note(vllm_version)
    if lacking and not any(e["acceptance"]["reported"] for e in entries):
        for entry in entries:
            entry["acceptance"]["note"] = lacking
        if check["status"] == "not_checked" and acceptance and not acceptance.get("counter_reset") and check["requests"]:
            check["reason"] = lacking
        notes.append("per request class: " + lacking)
    if check["status"] == "differ":
        notes.append("the per-request sums differ from the candidate's /metrics deltas over the same window (%s): another "
                     "client sent requests to the candidate during the run, or the counters are of another model" %
                     ", ".join("%s %s vs %s" % (f, check["per_request"][f], check["metrics"][f]) for f in check["differ"]))
    return {"classes": entries, "counters_check": check, "notes": notes,
            "keep": [e["class"] for e in entries if e["decision"] == "keep" and e["class"] is not None]}


# -- Markdown ----------------------------------------------------------------------------------------------------------------
def _num(value, digits=2):
    return "n/a" if value is None else ("%." + str(digits) + "f") % value


def _pct(value, signed=False):
    return "n/a" if value is None else (("%+.1f%%" if signed else "%.1f%%") % (100.0 * value))


def _median_cell(value, interval):
    if value is None:
        return "n/a"
    return "%s [%s, %s]" % (_num(value), _num(interval[0]), _num(interval[1])) if interval else _num(value)


def _label(name):
    return UNCLASSIFIED if name is None else "`%s`" % name


def render_markdown(block):
    """The report's per-class section (Markdown lines)."""
    lines = ["## Per request class", "",
             "Each class judged on its own requests with the service-wide keep rule (bench/noise.py tests on the class's "
             "per-request samples). Medians in ms with their 95% intervals; the output rate is the class's output tokens "
             "per second of its own request time.", "",
             "| Class | Requests (baseline / candidate) | Decision | Sure it is better | Speedup | Acceptance length | Acceptance rate |",
             "|---|---|---|---|---|---|---|"]
    for entry in block["classes"]:
        req, acc = entry["requests"], entry["acceptance"]
        accept_len = _num(acc["mean_acceptance_length"]) if acc["reported"] else "not reported"
        accept_rate = _pct(acc["acceptance_rate"]) if acc["reported"] else "not reported"
        lines.append("| %s | %d / %d | `%s` (%s) | %s | %s | %s | %s |" % (
            _label(entry["class"]), req["baseline"]["completed"], req["candidate"]["completed"], entry["decision"],
            entry["outcome"], _pct(entry["gain_confidence"]), "n/a" if entry["speedup"] is None else "%.3fx" % entry["speedup"],
            accept_len, accept_rate))
    lines += ["", "| Class | Metric | Baseline median [95%] | Candidate median [95%] | Change |", "|---|---|---|---|---|"]
    for entry in block["classes"]:
        for key, label in LATENCIES:
            row = entry["latency"][key]
            lines.append("| %s | %s | %s | %s | %s |" % (
                _label(entry["class"]), label, _median_cell(row["baseline"], row["baseline_interval"]),
                _median_cell(row["candidate"], row["candidate_interval"]), _pct(row["change"], signed=True)))
    lines += [""]
    for entry in block["classes"]:
        lines.append("- %s: %s" % (_label(entry["class"]), "; ".join(entry["reasons"])))
        if entry["acceptance"]["note"]:
            lines.append("  - acceptance: %s" % entry["acceptance"]["note"])
    check = block["counters_check"]
    lines += ["", "Per-request sums against the candidate's /metrics deltas (same window): **%s**%s" % (
        check["status"], "" if not check["reason"] else " (%s)" % check["reason"])]
    if check["status"] != "not_checked":
        lines += ["", "| Counter | Sum of the responses | /metrics delta |", "|---|---|---|"]
        lines += ["| %s | %s | %s |" % (field, check["per_request"][field], check["metrics"][field]) for field in COUNTER_FIELDS]
    lines += ["", "Classes to route to the speculative pool: %s." % (", ".join("`%s`" % c for c in block["keep"]) or "none"), ""]
    return lines
