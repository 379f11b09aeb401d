# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollback role over a fleet (issue 53): which services its per-service tasks run for, decided from one
``fleet_speculative_info`` discovery (a LIST per namespace) instead of a module run, a wait and a proof per service.

* ``plan``: the targets, in the order the role acts on them - the services whose flag reaches vLLM first, then those the
  discovery could not decide (a named service not found, a runtime or preset it could not read, an error): their
  per-service run reports them as it does for one service. The rest are "already without speculative decoding" and cost
  no write. In git and emergency mode, and when the draft is removed, every selected service is a target (``EVERY``).
* ``report``: per service what was found and done, and the run's totals, from the plan and the role's results.
"""

from __future__ import annotations

# Why a mode acts on every selected service, whatever the live object says.
EVERY = {
    # the flag's truth is the file in Git: a live object without it may still be defined with it there (a live patch the
    # owner will revert), and a review branch's commit is not live yet
    "git": "rollback_mode git: the removal is made in Git, where the flag may still be while the live object has none",
    # a run killed after the live strip left the owner paused and the commit unmade: the live object has no flag, and
    # only the per-service run (its record on the owner) finishes and resumes it
    "emergency": "rollback_mode emergency: a run stopped after the live strip is finished (commit, resume) by the per-service "
                 "run, and the live object no longer has the flag",
    # a run that stripped the flag but failed before the removal has left the draft mounted: the flag is gone, the draft not
    "remove_draft": "rollback_remove_draft_artifacts: the draft may still be mounted after an earlier run stripped the flag",
}


def _key(record):
    return "%s/%s" % (record["namespace"], record["name"])


def _why_undecided(record):
    """Why the discovery could not tell whether a flag reaches vLLM (None: it could)."""
    if not record.get("found"):
        return record.get("error") or "not found"
    if record.get("error"):
        return "could not be judged: %s" % record["error"]
    return record.get("undecided")


def _once_per_namespace(forbidden):
    """The refused LISTs, one per kind and namespace (a namespace read for the selector and for a name refuses both)."""
    out = {}
    for item in forbidden:
        out.setdefault((item.get("kind"), item.get("namespace")), item)
    return list(out.values())


def _order(target):
    return target["namespace"], target["name"]


def plan(discovery, mode="live", remove_draft=False):
    """``{targets: [{namespace, name, why}], without_flag: [ns/name], forbidden: [...], records: {ns/name: record}}`` from
    fleet_speculative_info's result (``discovery``; a skipped task's result: nothing selected)."""
    records = list((discovery or {}).get("services") or [])
    every = EVERY.get(mode) or (EVERY["remove_draft"] if remove_draft else None)
    flagged, undecided, without = [], [], []
    for record in records:
        why = _why_undecided(record)
        if every:
            flagged.append(dict(namespace=record["namespace"], name=record["name"], why=every))
        elif why:
            undecided.append(dict(namespace=record["namespace"], name=record["name"], why=why))
        elif record.get("speculative"):
            flagged.append(dict(namespace=record["namespace"], name=record["name"],
                                why="a speculative flag reaches vLLM from %s" % ", ".join(record.get("sources") or [])))
        else:
            without.append(_key(record))
    return {"targets": sorted(flagged, key=_order) + sorted(undecided, key=_order),
            "without_flag": sorted(without),
            "forbidden": _once_per_namespace((discovery or {}).get("forbidden") or []),
            "records": {_key(r): r for r in records},
            "api_requests": ((discovery or {}).get("totals") or {}).get("api_requests", 0)}


def report(the_plan, results):
    """``{services: [{service, found, speculative, sources, done}], totals}``: per service what the discovery found and what
    the run did (``rolled_back``, ``committed_for_review``, ``unchanged`` - the per-service run found nothing to strip -,
    ``skipped_without_flag`` - no per-service run), from the plan and the role's ``rollback_results``."""
    by_service = {}
    for result in results or []:
        by_service[result.get("isvc")] = result
    services = []
    for target in the_plan.get("targets") or []:
        key = "%s/%s" % (target["namespace"], target["name"])
        result = by_service.get(key)
        done = "not_run"
        if result is not None:
            done = ("committed_for_review" if result.get("review_branch") else "rolled_back") if result.get("changed") else "unchanged"
        services.append(_entry(the_plan, key, done, target["why"]))
    services.extend(_entry(the_plan, key, "skipped_without_flag", "no speculative flag reaches vLLM")
                    for key in the_plan.get("without_flag") or [])
    services.sort(key=lambda s: s["service"])
    records = the_plan.get("records") or {}
    totals = {
        "selected": len(records),
        "with_flag": sum(1 for r in records.values() if r.get("speculative")),
        "rolled_back": sum(1 for s in services if s["done"] == "rolled_back"),
        "committed_for_review": sum(1 for s in services if s["done"] == "committed_for_review"),
        "unchanged": sum(1 for s in services if s["done"] == "unchanged"),
        "skipped_without_flag": sum(1 for s in services if s["done"] == "skipped_without_flag"),
        "undecided": sum(1 for r in records.values() if _why_undecided(r)),
        "forbidden_namespaces": sorted({f.get("namespace") for f in the_plan.get("forbidden") or [] if f.get("namespace")}),
        "api_requests_to_find": the_plan.get("api_requests", 0),
    }
    return {"services": services, "totals": totals}


def _entry(the_plan, key, done, why):
    record = (the_plan.get("records") or {}).get(key) or {}
    return {"service": key, "kind": record.get("kind"), "found": record.get("found"), "speculative": record.get("speculative"),
            "sources": record.get("sources") or [], "done": done, "why": why}
