# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verify and watch roles over a fleet (issue 53): which selected services they check, decided from the same one
``fleet_speculative_info`` discovery (a LIST per namespace) and the same selection as the rollback role, and per service
what was found and done, with the run's totals.

* ``plan``: the services a check runs for, from the discovery's records (the rollback's plan gives the records, the
  forbidden namespaces and the request count). verify checks a service whose flag reaches vLLM first, then runs its
  per-service tasks for a named service that is not found or could not be judged too, so that its own message says why,
  as it does for one service. The watchdog measures only the services whose flag reaches vLLM (a window on a
  service without one can only end ``unknown``). The rest are reported, not checked: ``without_flag`` (no speculative
  flag reaches vLLM) and ``not_checked`` (not decided: a runtime or preset the discovery could not read, and for the
  watchdog a named service not found or not judged).
* ``report``: per service the discovery's record and what the check did (verify: ``verified``, ``failed``, ``not_run``;
  watch: the watchdog's state), the totals and the summary lines the roles print.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet_rollback

CHECKS = ("verify", "watch")
# The watchdog's states (ops/watchdog.py), in the order the totals list them.
WATCH_STATES = ("healthy", "degraded", "collapsed", "no_traffic", "unknown")


def _check_name(check):
    if check not in CHECKS:
        raise ValidationError("%r is not a fleet check" % (check,), field="check", hint="use %s" % " or ".join(CHECKS))


def _classify(record, check):
    """``(what, why)``: ``checked``, ``not_checked`` or ``without_flag``, for one record of the discovery."""
    if not record.get("found") or record.get("error"):
        why = record.get("error") or "not found"
        # verify's own tasks say why a named service is missing or unreadable, or why it could not be judged
        return ("checked" if check == "verify" else "not_checked"), why
    if record.get("speculative"):
        return "checked", "a speculative flag reaches vLLM from %s" % ", ".join(record.get("sources") or [])
    if record.get("undecided"):
        return "not_checked", "the discovery could not decide whether a speculative flag reaches vLLM: %s" % record["undecided"]
    return "without_flag", None


def plan(discovery, check="verify"):
    """``{targets: [{namespace, name, why}], not_checked: [{service, why}], without_flag, forbidden, records,
    api_requests, check}`` from fleet_speculative_info's result (a skipped task's result: nothing selected). The
    forbidden namespaces, the records and the request count are the rollback's plan's (``fleet_rollback.plan``); which
    services are checked is decided here, from the records."""
    _check_name(check)
    base = fleet_rollback.plan(discovery)
    flagged, others, not_checked, without = [], [], [], []
    for key, record in sorted(base["records"].items()):
        what, why = _classify(record, check)
        if what == "checked":
            (flagged if record.get("speculative") else others).append({"namespace": record["namespace"], "name": record["name"], "why": why})
        elif what == "not_checked":
            not_checked.append({"service": key, "why": why})
        else:
            without.append(key)
    order = fleet_rollback.target_order
    return {"check": check, "targets": sorted(flagged, key=order) + sorted(others, key=order), "not_checked": not_checked,
            "without_flag": without, "forbidden": base["forbidden"], "records": base["records"], "api_requests": base["api_requests"]}


def _spec_text(spec):
    if not spec:
        return "speculative_config=None"
    return "method=%s model=%s num_spec_tokens=%s" % (spec.get("method"), spec.get("model"), spec.get("num_spec_tokens"))


def _verified_text(result):
    """What one service's verify_result proved: the engine's config on its pods, and the acceptance it read."""
    result = result or {}
    engine = result.get("engine") or {}
    if result.get("kind") == "LLMInferenceService":
        decode = (result.get("pools") or {}).get("decode") or {}
        spec, pods = decode.get("speculative_config"), decode.get("pods") or []
    else:
        spec, pods = engine.get("speculative_config"), engine.get("pods") or []
    text = "engine on %d pod(s): %s" % (len(pods), _spec_text(spec))
    metrics = result.get("metrics") or {}
    if result.get("kind") == "LLMInferenceService":  # kserve/llmisvc/verify.py: the figures per decode pod
        acceptance = "; ".join("%s: %s" % (pod, (figures or {}).get("msg")) for pod, figures in sorted(metrics.items()))
    else:
        acceptance = metrics.get("msg")
    return text + ("; acceptance: %s" % acceptance if acceptance else "")


def _verify_entry(result):
    if result is None:
        return "not_run", None, "not run (the run stopped before it)"
    if result.get("ok"):
        return "verified", None, "verified - %s" % _verified_text(result.get("result"))
    message = result.get("msg") or "failed"
    return "failed", message, "FAILED at '%s': %s" % (result.get("task") or "?", message)


def _watch_entry(result):
    if result is None:
        return "not_run", None, "not watched (the run stopped before it)"
    state = result.get("state") or "unknown"
    return state, None, "%s - %s" % (state, result.get("msg") or "")


def report(the_plan, results, rolled_back=None):
    """``{services, totals, lines}``: per selected service (``service``, ``kind``, ``found``, ``speculative``, ``sources``,
    ``done``, ``why``, ``error``), the run's totals and the summary lines, from the plan and the per-service results
    (verify: ``{service, ok, task, msg, result}``; watch: ``{service or namespace and name, state, action, msg}``, the
    watch role's ``watch_result.services``). ``rolled_back``: the services the watchdog's rollback rolled back."""
    check = the_plan.get("check") or "verify"
    _check_name(check)
    verb = "verified" if check == "verify" else "watched"
    by_service = {r.get("service") or fleet_rollback.service_key(r): r for r in results or []}
    records = the_plan.get("records") or {}
    services, lines = [], []

    def add(key, done, why, error=None):
        record = records.get(key) or {}
        services.append({"service": key, "kind": record.get("kind"), "found": record.get("found"),
                         "speculative": record.get("speculative"), "sources": record.get("sources") or [],
                         "done": done, "why": why, "error": error})

    for target in the_plan.get("targets") or []:
        key = fleet_rollback.service_key(target)
        done, error, text = (_verify_entry if check == "verify" else _watch_entry)(by_service.get(key))
        add(key, done, target["why"], error)
        sources = (records.get(key) or {}).get("sources") or []
        lines.append("%s: %s%s" % (key, text, " [flag from %s]" % ", ".join(sources) if sources else ""))
    for item in the_plan.get("not_checked") or []:
        add(item["service"], "not_checked", item["why"])
        lines.append("%s: not %s: %s" % (item["service"], verb, item["why"]))
    for key in the_plan.get("without_flag") or []:
        add(key, "skipped_without_flag", "no speculative flag reaches vLLM")
        lines.append("%s: without speculative decoding, not %s" % (key, verb))
    services.sort(key=lambda s: s["service"])
    forbidden = sorted({f.get("namespace") for f in the_plan.get("forbidden") or [] if f.get("namespace")})
    done = [s["done"] for s in services]
    totals = {
        "selected": len(records),
        "with_flag": sum(1 for r in records.values() if r.get("speculative")),
        "without_flag": done.count("skipped_without_flag"),
        "not_checked": done.count("not_checked"),
        "forbidden_namespaces": forbidden,
        "api_requests_to_find": the_plan.get("api_requests", 0),
    }
    if check == "verify":
        totals.update(verified_ok=done.count("verified"), failed=done.count("failed"), not_run=done.count("not_run"))
        head = "%(selected)d selected, %(with_flag)d with a flag, %(verified_ok)d verified ok, %(failed)d failed" % totals
    else:
        totals.update(watched=sum(1 for d in done if d in WATCH_STATES), not_run=done.count("not_run"),
                      rolled_back=len(rolled_back or []), **{state: done.count(state) for state in WATCH_STATES})
        head = "%(selected)d selected, %(with_flag)d with a flag, %(watched)d watched (" % totals \
            + ", ".join("%d %s" % (totals[state], state) for state in WATCH_STATES) + "), %(rolled_back)d rolled back" % totals
    head += ", %d without a flag, %d %s, %d forbidden namespace(s)%s, %d API request(s) to find them" % (
        totals["without_flag"], totals["not_checked"], "not decided" if check == "verify" else "not found or not decided",
        len(forbidden), (": " + ", ".join(forbidden)) if forbidden else "", totals["api_requests_to_find"])
    lines.sort()
    lines.insert(0, "totals: " + head)
    lines += ["%s: not read, its services were not %s (%s)" % (f.get("namespace") or "all namespaces", verb, f.get("message"))
              for f in the_plan.get("forbidden") or []]
    return {"services": services, "totals": totals, "lines": lines}
