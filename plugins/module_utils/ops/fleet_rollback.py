# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollback role over a fleet (issue 53): which services its per-service tasks run for, decided from one
``fleet_speculative_info`` discovery (a LIST per namespace) instead of a module run, a wait and a proof per service.

* ``plan``: the targets, in the order the role acts on them - the services whose flag reaches vLLM first, then those the
  discovery could not decide (a named service not found, a runtime or preset it could not read, an error): their
  per-service run reports them as it does for one service. The rest are "already without speculative decoding" and cost
  no write. In git and emergency mode, and when the draft is removed, every selected service is a target (``EVERY``).
* ``report``: per service what was found and done, and the run's totals, from the plan and the role's results: a service
  whose per-service tasks failed is recorded (``failure``: the failing task, field, message and fix, nothing else of the
  result) and the run goes on with the next; once one finds the API server unreachable the cluster's remaining services
  are left for a rerun (``not_run``).
* ``verdict``: whether the cluster's host fails at the end of the run - the failure budget
  (``rollback_max_fail_percentage``), a cluster that could not be read, an API server that stopped answering, a namespace
  the selection lists that refused its LIST.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

BUDGET_FIELD = "rollback_max_fail_percentage"
# A failed message longer than this is cut: a report line per service, not a log.
MESSAGE_CHARS = 600
# What a failure says when the API server did not answer at all (kube/wait.transient_error's "cannot reach the API
# server", urllib3's and the kubernetes client's words for a refused, reset or timed-out connection): further requests to
# the same API server would fail the same way, so the cluster's remaining services are left for a rerun.
UNREACHABLE_WORDS = ("cannot reach the api server", "max retries exceeded", "connection refused", "newconnectionerror",
                     "connection reset", "remotedisconnected", "connecttimeout", "timed out", "name or service not known",
                     "no route to host", "network is unreachable")

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


def service_key(record):
    """``namespace/name`` of a discovery record, a plan's target or a per-service result (the fleet roles' key)."""
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


def target_order(target):
    """The order the per-service tasks run in: by namespace, then name."""
    return target["namespace"], target["name"]


def _rollout(record):
    """A rollout in progress when the discovery read the service (``metadata.generation`` > ``status.observedGeneration``),
    else None. KServe's InferenceService reconciler works on the object as it is when it runs, not on each generation in
    turn (pkg/controller/v1beta1/inferenceservice/controller.go, ``InferenceServiceReconciler.Reconcile``: ``r.Get`` of the
    current object, then its components reconciled from that spec), so the strip is written as for any service - it makes a
    newer generation, which supersedes the one in rollout - and the wait and the proof are for that newer generation
    (kserve/wait.py: Ready with observedGeneration == generation), never for the one that was rolling out. A service never
    reconciled (no observedGeneration) is not called mid-rollout."""
    generation, observed = record.get("generation"), record.get("observed_generation")
    if not record.get("found") or record.get("kind") != "InferenceService" or generation is None or observed is None:
        return None
    if int(observed) >= int(generation):
        return None
    return {"generation": generation, "observed_generation": observed,
            "note": "a rollout was in progress (generation %s, observedGeneration %s): the strip makes a newer generation, which "
                    "KServe reconciles instead; the wait and the proof are for that one" % (generation, observed)}


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
        elif record.get("stripped_by_rollback") and not (record.get("ready") and record.get("up_to_date")):
            # an earlier run stripped it (its backup annotation) and stopped before the new generation was Ready and proven
            # (the API server went away during its wait, a timeout): the per-service run finds nothing to strip and waits and
            # proves it, so a rerun finishes it
            flagged.append(dict(namespace=record["namespace"], name=record["name"],
                                why="stripped by an earlier rollback and not Ready at its generation yet: waited for and proven again"))
        else:
            without.append(service_key(record))
    return {"targets": sorted(flagged, key=target_order) + sorted(undecided, key=target_order),
            "without_flag": sorted(without),
            "forbidden": _once_per_namespace((discovery or {}).get("forbidden") or []),
            "records": {service_key(r): r for r in records},
            "api_requests": ((discovery or {}).get("totals") or {}).get("api_requests", 0),
            "api_server": (discovery or {}).get("api_server")}


def unreachable(message):
    """True when a failure's message says the API server did not answer (refused, reset, timed out, no route)."""
    text = str(message or "").lower()
    return any(word in text for word in UNREACHABLE_WORDS)


def failure(result, service, task=None):
    """What the report keeps of one failed per-service run: ``{service, task, field, message, fix, unreachable}`` from the
    failed task's result (``ansible_failed_result``). Only these: a module's result may carry the object, its env or a
    token (a no_log task's result is already censored by Ansible, and its message says so)."""
    result = result if isinstance(result, dict) else {}
    message = result.get("msg")
    if not message and result.get("censored"):
        message = result["censored"]
    message = str(message or "failed without a message")
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + "..."
    return {"service": service, "task": task, "field": result.get("field"), "message": message, "fix": result.get("fix"),
            "unreachable": unreachable(message)}


def report(the_plan, results, failures=None, cluster_down=None):
    """``{services: [{service, found, speculative, sources, done, why, error, rollout}], totals}``: per service what the
    discovery found and what the run did (``rolled_back``, ``committed_for_review``, ``unchanged`` - the per-service run
    found nothing to strip -, ``failed`` - its ``error`` says the task, field, message and fix -, ``not_run`` - left for a
    rerun, after the API server stopped answering (``cluster_down``, that failure's message) -, ``skipped_without_flag`` -
    no per-service run), from the plan, the role's ``rollback_results`` and its ``failure`` records."""
    by_service = {}
    for result in results or []:
        by_service[result.get("isvc")] = result
    failed = {item.get("service"): item for item in failures or []}
    services = []
    for target in the_plan.get("targets") or []:
        key = service_key(target)
        result = by_service.get(key)
        done, why, error = "not_run", target["why"], None
        if key in failed:
            done, error = "failed", {k: v for k, v in failed[key].items() if k != "service"}
        elif result is not None:
            done = ("committed_for_review" if result.get("review_branch") else "rolled_back") if result.get("changed") else "unchanged"
        elif cluster_down:
            why = "not tried, left for a rerun: the API server stopped answering (%s)" % cluster_down
        services.append(_entry(the_plan, key, done, why, error))
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
        "failed": sum(1 for s in services if s["done"] == "failed"),
        "not_run": sum(1 for s in services if s["done"] == "not_run"),
        "acted_on": len(the_plan.get("targets") or []),
        "mid_rollout": sum(1 for s in services if s["rollout"]),
        "undecided": sum(1 for r in records.values() if _why_undecided(r)),
        "forbidden_namespaces": sorted({f.get("namespace") for f in the_plan.get("forbidden") or [] if f.get("namespace")}),
        "api_requests_to_find": the_plan.get("api_requests", 0),
    }
    return {"services": services, "totals": totals, "cluster_down": cluster_down, "api_server": the_plan.get("api_server")}


def _entry(the_plan, key, done, why, error=None):
    record = (the_plan.get("records") or {}).get(key) or {}
    return {"service": key, "kind": record.get("kind"), "found": record.get("found"), "speculative": record.get("speculative"),
            "sources": record.get("sources") or [], "done": done, "why": why, "error": error, "rollout": _rollout(record)}


def check_budget(value, field=BUDGET_FIELD):
    """The failure budget as an int from 0 to 100; ValidationError naming ``field`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit() or int(value) > 100:
        raise ValidationError("%r is not a percentage" % (value,), field=field,
                              hint="set a whole number from 0 (any failed service fails the run, after the others are done) "
                                   "to 100 (failed services never fail the run)")
    return int(value)


def verdict(the_report, max_fail_percentage=0, cluster=None, cluster_error=None, all_namespaces=False):
    """``{failed, msg, failed_percentage}``: whether the cluster's host fails at the end of the run, which every service
    the run could act on has had by then.

    * ``cluster_error`` (the discovery's failure: the API server did not answer, the credentials were refused): the host
      fails, naming the cluster (``cluster``: its inventory host) and the error; nothing was written there.
    * the API server stopped answering during the run (``the_report["cluster_down"]``): the host fails, naming the
      cluster, its API server and the services left; a rerun finishes them.
    * a namespace the selection lists that refused its LIST: its services are unknown, so no share of them can be
      judged - it fails the run under any budget below 100. With ``all_namespaces`` the selection is every namespace
      the account may list, and one that refuses is only reported.
    * otherwise the share of failed services among those the run acted on, against ``max_fail_percentage`` (Ansible's
      ``max_fail_percentage`` rule: the run fails when the share is greater than the budget; 0 fails on any failure)."""
    budget = check_budget(max_fail_percentage)
    where = "cluster %s" % cluster if cluster else "the cluster"
    server = the_report.get("api_server")
    if server:
        where += " (API server %s)" % server
    if cluster_error:
        return {"failed": True, "failed_percentage": None,
                "msg": "%s: not rolled back, its services could not be read: %s%s" % (
                    where, cluster_error, "" if "Fix:" in str(cluster_error) else ". Fix: run again once the cluster answers these "
                    "credentials (spec_decoding_kubeconfig / spec_decoding_context); nothing was written there")}
    totals = the_report.get("totals") or {}
    acted, failed = totals.get("acted_on", 0), totals.get("failed", 0)
    share = round(100.0 * failed / acted, 1) if acted else 0.0
    if the_report.get("cluster_down"):
        left = [s["service"] for s in the_report.get("services") or [] if s["done"] in ("failed", "not_run")]
        return {"failed": True, "failed_percentage": share,
                "msg": "%s stopped answering during the run (%s): %d rolled back, %d left (%s). Fix: run again once it answers; "
                       "the services already rolled back are found without the flag and not written"
                       % (where, the_report["cluster_down"], totals.get("rolled_back", 0), len(left), ", ".join(left))}
    forbidden = [] if all_namespaces else totals.get("forbidden_namespaces") or []
    problems = []
    if forbidden and budget < 100:
        problems.append("namespace(s) %s refused the LIST: their services were not read (grant list on inferenceservices "
                        "there, or drop them from rollback_namespaces)" % ", ".join(forbidden))
    if share > budget:
        failed_services = ["%s (%s)" % (s["service"], _said(s["error"])) for s in the_report.get("services") or [] if s["done"] == "failed"]
        problems.append("%d of %d service(s) failed (%s%%, over %s %d%%): %s"
                        % (failed, acted, share, BUDGET_FIELD, budget, "; ".join(failed_services)))
    if problems:
        return {"failed": True, "failed_percentage": share,
                "msg": "%s: %s; every other service was done. A rerun finishes what is left" % (where, "; ".join(problems))}
    return {"failed": False, "failed_percentage": share, "msg": "%s: %d of %d service(s) failed (%s%%), within %s %d%%"
            % (where, failed, acted, share, BUDGET_FIELD, budget)}


def _said(error):
    error = error or {}
    field = error.get("field")
    return "%s%s%s" % ("%s: " % field if field else "", error.get("message"), "; fix: %s" % error["fix"] if error.get("fix") else "")
