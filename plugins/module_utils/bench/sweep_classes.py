# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The load sweep per request class (issue #52): each class's figures at every load, its break-even load, its decision at
the target load, and the guard the routing plan takes from them.

The same statistics as the A/B's per-class report (bench/request_classes.py) and as the sweep's service-wide answers
(bench/sweep_analysis.py), called, not copied:

- ``measured_classes(side, side_name)``: at each measurement, while its records are still in memory (the sweep's JSON
  keeps none), each class's ``request_classes.class_summary`` (the class's own request time, medians with their 95%
  intervals, the per-request samples the keep rule's noise tests rank) and, on the candidate, its
  ``request_classes.per_request_acceptance`` (the responses' own ``metrics.speculative_decoding``; a response without
  one is not reported, nothing is estimated) and the ``request_classes.counters_check`` of the window.
- ``analyse_classes(measurements, sweep, keep_rule)``: per class, the points of the sweep's main load kind (request rate
  when measured, else concurrency) with the class's two summaries as the sides; ``sweep_analysis.break_even`` (the keep
  rule at every load and its margin interpolation) and ``sweep_analysis.decision_for_target`` (the keep rule at the
  sweep point at or above ``target_qps``) on them.
- The guard (``guard``): with ``target_qps``, a class goes to the speculative pool only when it meets keep at the
  target load's sweep point and its break-even is not below the target load; otherwise to the baseline, with the reason.
  A crossing without a margin to interpolate takes its last keep load as the break-even (the lowest load the sweep
  cannot vouch beyond). bench/routing_plan.py reads it; ``decisions_at_target`` gives the block's decisions at the target
  load in the A/B's shape, for a routing plan built from the sweep alone (tune.yml).

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import request_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep_analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

SIDES = ("baseline", "candidate")
POOLS = ("speculative", "baseline")
UNIT = {"request_rate": "req/s", "concurrency": "concurrent requests"}


def _key(name):
    return (name is None, name or "")


# -- at each measurement ------------------------------------------------------------------------------------------------------
def measured_classes(side, side_name):
    """The per-class block one measurement keeps (``side``: bench/run.py's side dict with its ``records``), or None when
    no record names a class. ``[{"class", "summary", "acceptance"?}]`` in class order, the unclassified (``None``) last;
    the candidate's classes carry their per-request acceptance."""
    if not request_classes.has_classes(side):
        return None
    out = []
    for name, records in request_classes.group(request_classes.records_of(side)).items():
        entry = {"class": name, "summary": request_classes.class_summary(records)}
        if side_name == "candidate":
            entry["acceptance"] = request_classes.per_request_acceptance(records)
        out.append(entry)
    return out


def measured_counters_check(side):
    """The candidate's per-request sums against its /metrics deltas of the same window (``request_classes.counters_check``)."""
    return request_classes.counters_check(request_classes.records_of(side), side.get("acceptance"))


# -- over the sweep -----------------------------------------------------------------------------------------------------------
def _load_view(point, row, acceptance):
    """One class at one load: requests, acceptance, latency medians with their intervals, the gain and the decision."""
    b_sum, c_sum = point["baseline"], point["candidate"]
    latency = {}
    for key, _label in request_classes.LATENCIES:
        b_med, c_med = (b_sum.get(key) or {}).get("median"), (c_sum.get(key) or {}).get("median")
        latency[key] = {"baseline": b_med, "candidate": c_med, "baseline_interval": (b_sum.get("intervals") or {}).get(key),
                        "candidate_interval": (c_sum.get("intervals") or {}).get(key), "change": bench_stats.relative_change(b_med, c_med)}
    return {"load": point["load"],
            "requests": {side: {"completed": point[side].get("completed"), "failed": point[side].get("failed")} for side in SIDES},
            "acceptance": acceptance, "latency": latency,
            "output_rate": {side: point[side].get("output_throughput") for side in SIDES},
            "speedup": row["speedup"], "decision": row["decision"], "reasons": row["reasons"]}


def break_even_text(be):
    """A class's break-even in words: the interpolated load, ``gains at every load`` or ``never gains``."""
    if be is None:
        return "not measured"
    unit = UNIT[be["kind"]]
    if be["status"] == "pays_everywhere":
        return "gains at every load (up to %g %s)" % (be["last_keep_load"], unit)
    if be["status"] == "pays_nowhere":
        return "never gains (not even at %g %s)" % (be["first_roll_back_load"], unit)
    if be["crossover_load"] is not None:
        return "about %.3g %s (%s crossed first)" % (be["crossover_load"], unit, be["crossed_first"])
    return "between %g and %g %s" % (be["last_keep_load"], be["first_roll_back_load"], unit)


def break_even_load(be):
    """The load up to which the class pays, as a number for the guard: the interpolated crossover, else the last keep load
    (the sweep vouches for nothing above it); None when it pays at every load, 0.0 when at none."""
    if be["status"] == "pays_everywhere":
        return None
    if be["status"] == "pays_nowhere":
        return 0.0
    return be["crossover_load"] if be["crossover_load"] is not None else be["last_keep_load"]


def guard(be, target, target_qps):
    """Where the class goes at ``target_qps``: ``{"pool", "break_even_load", "target_qps", "reason"}`` (see the module doc)."""
    out = {"pool": "baseline", "break_even_load": None, "target_qps": target_qps, "reason": None}
    if be is None or target is None:
        out["reason"] = "the sweep has no figures of this class at or above the target load %g req/s" % target_qps
        return out
    bound = break_even_load(be)
    out["break_even_load"] = bound
    decision = target["decision"]
    if be["status"] == "pays_nowhere":
        out["reason"] = "it %s" % break_even_text(be)
    elif bound is not None and bound < target_qps:
        out["reason"] = "its break-even, %s, is below the target load %g req/s" % (break_even_text(be), target_qps)
    elif decision["decision"] != "keep":
        out["reason"] = "at the target load's sweep point (%g req/s) it does not meet keep: %s" % (
            target["load"], "; ".join(decision["reasons"]))
    else:
        out.update(pool="speculative", reason="it meets keep at the target load's sweep point (%g req/s) and its break-even is "
                                              "not below the target %g req/s: %s" % (target["load"], target_qps, break_even_text(be)))
    return out


def _target_view(target):
    decision = target["decision"]
    return {"target_qps": target["target_qps"], "load": target["load"], "exact": target["exact"], "decision": decision["decision"],
            "outcome": decision.get("outcome"), "confidence": decision.get("confidence"),
            "gain_confidence": request_classes.gain_confidence(decision), "reasons": list(decision.get("reasons") or []),
            "speedup": target["speedup"]}


def _class_entry(name, points, acceptances, kind, target_qps, keep_rule, notes):
    entry = {"class": name, "loads": [], "break_even": None, "break_even_text": "not measured", "target": None, "guard": None}
    if points:
        be = sweep_analysis.break_even(points, keep_rule)
        entry["loads"] = [_load_view(p, row, acceptances.get(p["load"])) for p, row in zip(points, be["points"])]
        entry["break_even"] = {k: v for k, v in be.items() if k != "points"}
        entry["break_even_text"] = break_even_text(be)
    target = None
    if target_qps is not None and kind == "request_rate" and points:
        try:
            target = sweep_analysis.decision_for_target(points, target_qps, keep_rule)
        except ValidationError as exc:  # the class has no figures at or above the target load
            notes.append("class %s: no decision at the target load (%s)" % (request_classes.UNCLASSIFIED if name is None else name, exc))
        entry["target"] = _target_view(target) if target else None
    if target_qps is not None and kind == "request_rate":
        entry["guard"] = guard(entry["break_even"], target, target_qps)
    return entry


def analyse_classes(measurements, sweep, keep_rule=None):
    """The sweep's ``classes`` block, or None when no measurement kept per-class figures (a sweep without classes).

    ``{"kind", "target_qps", "classes": [{"class", "loads": [...], "break_even", "break_even_text", "target", "guard"}],
    "counters_check": [{"load", ...counters_check}], "speculative_classes", "notes"}``."""
    if not any(m.get("classes") for m in measurements if m.get("side") in SIDES):
        return None
    kind = "request_rate" if sweep.get("request_rates") else "concurrency"
    by_key = {}
    for item in measurements:
        if item.get("kind") == kind and item.get("side") in SIDES:
            by_key[(round(float(item["load"]), 9), item["side"])] = item
    per_class, acceptances, checks, notes = {}, {}, [], []
    for load in sweep[sweep_analysis.LOAD_FIELDS[kind]] or ():
        sides = {side: by_key.get((round(float(load), 9), side)) for side in SIDES}
        if not all(sides.values()):
            continue
        missing = [side for side in SIDES if not sides[side].get("classes")]
        if missing:
            notes.append("per class: load %g has no per-class figures on the %s (measured by a release that kept none, "
                         "resumed from its JSON); the classes' figures leave it out" % (load, " and the ".join(missing)))
            continue
        if sides["candidate"].get("classes_counters_check"):
            checks.append(dict(sides["candidate"]["classes_counters_check"], load=load))
        groups = {side: {e["class"]: e for e in sides[side]["classes"]} for side in SIDES}
        for name in set(groups["baseline"]) | set(groups["candidate"]):
            b_entry, c_entry = groups["baseline"].get(name), groups["candidate"].get(name)
            if not b_entry or not c_entry:
                notes.append("per class: class %s has requests on only one side at load %g; that load is left out of its figures" % (
                    request_classes.UNCLASSIFIED if name is None else name, load))
                continue
            per_class.setdefault(name, []).append({"kind": kind, "load": load, "baseline": b_entry["summary"],
                                                   "candidate": c_entry["summary"]})
            acceptances.setdefault(name, {})[load] = c_entry.get("acceptance")
    entries = [_class_entry(name, per_class[name], acceptances.get(name, {}), kind, sweep.get("target_qps"), keep_rule, notes)
               for name in sorted(per_class, key=_key)]
    for check in checks:
        if check["status"] == "differ":
            notes.append("per class: at load %g the per-request sums differ from the candidate's /metrics deltas (%s): another client "
                         "sent requests to the candidate, or the counters are of another model" % (check["load"], ", ".join(check["differ"])))
    return {"kind": kind, "target_qps": sweep.get("target_qps"), "classes": entries, "counters_check": checks,
            "speculative_classes": [e["class"] for e in entries if e["class"] is not None and (e["guard"] or {}).get("pool") == "speculative"],
            "notes": notes}


def is_block(value):
    """Whether ``value`` is this module's ``classes`` block (what ``analyse_classes`` returns)."""
    return isinstance(value, dict) and value.get("kind") in UNIT and isinstance(value.get("classes"), list)


def decisions_at_target(block):
    """The block's decisions at the target load in the shape of the A/B's ``classes`` block (bench/request_classes.py
    ``class_report``), so the routing plan can be built from a sweep alone: per class ``decision``, ``outcome``,
    ``gain_confidence``, ``speedup`` and ``reasons`` of its target's sweep point; a class without figures at the target has
    no decision (the plan sends it to the baseline)."""
    out = []
    for entry in block["classes"]:
        target = entry.get("target") or {}
        out.append({"class": entry["class"], "decision": target.get("decision"), "outcome": target.get("outcome"),
                    "gain_confidence": target.get("gain_confidence"), "speedup": target.get("speedup"),
                    "reasons": list(target.get("reasons") or ["the sweep has no figures of this class at the target load"])})
    return {"classes": out}


def summary_line(block):
    """One progress line: each class's break-even and, with a target, its pool."""
    parts = []
    for entry in block["classes"]:
        name = request_classes.UNCLASSIFIED if entry["class"] is None else entry["class"]
        pool = (entry["guard"] or {}).get("pool")
        parts.append("%s %s%s" % (name, entry["break_even_text"], ", %s pool at the target" % pool if pool else ""))
    return "per class: " + "; ".join(parts)


# -- Markdown -----------------------------------------------------------------------------------------------------------------
def _num(value, digits=2):
    return "n/a" if value is None else ("%." + str(digits) + "f") % value


def _pct(value):
    return "n/a" if value is None else "%.1f%%" % (100.0 * value)


def _median_cell(value, interval):
    if value is None:
        return "n/a"
    return "%s [%s, %s]" % (_num(value), _num(interval[0]), _num(interval[1])) if interval else _num(value)


def _label(name):
    return request_classes.UNCLASSIFIED if name is None else "`%s`" % name


def _acceptance_cells(acc):
    if not acc or not acc.get("reported"):
        return "not reported", "not reported"
    return _num(acc["mean_acceptance_length"]), _pct(acc["acceptance_rate"])


def render_markdown(block):
    """The sweep report's per-class section (Markdown lines)."""
    unit = UNIT[block["kind"]]
    lines = ["## Per request class", "",
             "Each class judged on its own requests at every load of the sweep (%s) with the service-wide keep rule (bench/noise.py "
             "tests on the class's per-request samples); break-even by the same margin interpolation as the service-wide one. Gain: "
             "the class's output tokens per second of its own request time, speculative over baseline." % block["kind"].replace("_", " "), ""]
    target_qps = block.get("target_qps")
    if target_qps is not None:
        lines += ["| Class | Break-even | Decision at the target %g req/s (sweep point) | Sure it is better | Gain at the target | Pool |" % target_qps,
                  "|---|---|---|---|---|---|"]
        for entry in block["classes"]:
            target, pool = entry["target"], entry["guard"]
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                _label(entry["class"]), entry["break_even_text"],
                "`%s` (%s) at %g" % (target["decision"], target["outcome"], target["load"]) if target else "not measured",
                _pct((target or {}).get("gain_confidence")),
                "n/a" if not target or target["speedup"] is None else "%.3fx" % target["speedup"], pool["pool"]))
    else:
        lines += ["| Class | Break-even |", "|---|---|"]
        lines += ["| %s | %s |" % (_label(e["class"]), e["break_even_text"]) for e in block["classes"]]
    lines += ["", "| Class | Load (%s) | Requests (baseline / candidate) | Acceptance length | Acceptance rate | Gain | Decision |" % unit,
              "|---|---|---|---|---|---|---|"]
    for entry in block["classes"]:
        for row in entry["loads"]:
            length, rate = _acceptance_cells(row["acceptance"])
            lines.append("| %s | %g | %s / %s | %s | %s | %s | `%s` |" % (
                _label(entry["class"]), row["load"], row["requests"]["baseline"]["completed"], row["requests"]["candidate"]["completed"],
                length, rate, "n/a" if row["speedup"] is None else "%.3fx" % row["speedup"], row["decision"]))
    lines += ["", "Medians in ms with their 95% intervals, baseline -> speculative decoding:", "",
              "| Class | Load | " + " | ".join(label for _key_, label in request_classes.LATENCIES) + " |",
              "|---|---|" + "---|" * len(request_classes.LATENCIES)]
    for entry in block["classes"]:
        for row in entry["loads"]:
            cells = ["%s -> %s" % (_median_cell(row["latency"][key]["baseline"], row["latency"][key]["baseline_interval"]),
                                   _median_cell(row["latency"][key]["candidate"], row["latency"][key]["candidate_interval"]))
                     for key, _label_ in request_classes.LATENCIES]
            lines.append("| %s | %g | %s |" % (_label(entry["class"]), row["load"], " | ".join(cells)))
    lines.append("")
    for entry in block["classes"]:
        if entry["break_even"]:
            lines.append("- %s: %s" % (_label(entry["class"]), entry["break_even"]["reason"]))
        if entry["guard"]:
            lines.append("  - pool at the target: %s, because %s" % (entry["guard"]["pool"], entry["guard"]["reason"]))
        notes = sorted({row["acceptance"]["note"] for row in entry["loads"] if (row["acceptance"] or {}).get("note")})
        lines += ["  - acceptance: %s" % note for note in notes]
    checks = block.get("counters_check") or []
    if checks:
        lines += ["", "Per-request sums against the candidate's /metrics deltas (same window), per load: %s." % ", ".join(
            "%g %s" % (c["load"], c["status"]) for c in checks)]
    if target_qps is not None:
        lines += ["", "Classes to route to the speculative pool at the target load: %s." % (
            ", ".join("`%s`" % c for c in block["speculative_classes"]) or "none")]
    return lines + [""]
