# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The speculative-decoding watchdog (module ``speculative_watchdog``): windows of live traffic on every serving pod of an
InferenceService or LLMInferenceService, compared with a baseline by the analysis engine (``bench/analysis.py``), and
the state that comes of them.

States: ``healthy`` (every window passed), ``degraded`` (a window failed within the failure budget, or a difference
inside the noise: reported), ``collapsed`` (the failure budget is spent: the caller rolls the flag back with the rollback
role and its engine-line proof), ``no_traffic`` (too few requests to measure) and ``unknown`` (/metrics unreadable, no
spec_decode series, no baseline): the last two never act.

Where the baseline is kept: a ConfigMap ``<name>-spec-decoding-baseline`` next to the InferenceService, owned by it
(deleted with it). Not an annotation on the InferenceService: KServe copies the InferenceService's annotations into the
predictor's pod template (all but the inferenceservice-config ``serviceAnnotationDisallowedList``), so writing one would
roll the pods; a ConfigMap is no KServe object and rolls nothing.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import datetime
import json

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import canary_window
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary_steps

HEALTHY, DEGRADED, COLLAPSED, NO_TRAFFIC, UNKNOWN = "healthy", "degraded", "collapsed", "no_traffic", "unknown"
STATES = (HEALTHY, DEGRADED, COLLAPSED, NO_TRAFFIC, UNKNOWN)
BASELINE_SUFFIX = "-spec-decoding-baseline"
BASELINE_KEY = "baseline.json"
INFERENCE_SERVICE, LLM_INFERENCE_SERVICE = "InferenceService", "LLMInferenceService"

# Acceptance that halves (or a mean acceptance length that falls by a third) against the baseline is what a collapse
# looks like; a slower TPOT alone may be the load, so it is reported (dry run) unless the user makes it decide.
DEFAULT_CHECKS = (
    {"name": "acceptance rate", "figure": "acceptance_rate", "better": "higher", "tolerance": 0.5},
    {"name": "mean acceptance length", "figure": "mean_acceptance_length", "better": "higher", "tolerance": 0.3},
    {"name": "median TPOT", "figure": "tpot_median", "better": "lower", "tolerance": 0.5, "dry_run": True},
)
# the figures a baseline keeps (the window's figures without the pod names)
BASELINE_FIELDS = ("requests", "generation_tokens", "window_s", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "output_rate_per_request",
                   "request_rate", "acceptance", "buckets")


def baseline_name(name):
    return name + BASELINE_SUFFIX


def state_of(run, had_baseline=True):
    """The watchdog state of an analysis run (``analysis.run``'s result) and whether it acts."""
    phase, counts = run["phase"], run["counts"]
    if not had_baseline:
        return UNKNOWN
    if phase == analysis.FAILED:
        return COLLAPSED
    if phase == analysis.ERROR:
        return UNKNOWN
    windows = run["windows"]
    if phase == analysis.SUCCESSFUL:
        # a window without traffic says nothing against the others
        unsure = [w for w in windows if w["verdict"] == analysis.INCONCLUSIVE and not w.get("no_traffic")]
        return DEGRADED if counts[analysis.FAIL] or unsure else HEALTHY
    if windows and all(w["verdict"] != analysis.INCONCLUSIVE or w.get("no_traffic") for w in windows if w["verdict"] != analysis.ERROR) \
            and not counts[analysis.PASS] and not counts[analysis.FAIL]:
        return NO_TRAFFIC
    return DEGRADED


# -- the cluster ---------------------------------------------------------------------------------------------------------

def serving_pods(api_client, namespace, name, kind):
    """Names of the pods that serve (and expose /metrics): the predictor pods, or an LLMInferenceService's workload pods
    without the multi-node workers (their leader serves)."""
    if kind == LLM_INFERENCE_SERVICE:
        pods, _skipped = k8s_pods.list_pods(api_client, namespace, llmisvc_model.all_pods_selector(name))
        return [p["name"] for p in pods if "-worker" not in (p["labels"].get("app.kubernetes.io/component") or "")]
    pods, _skipped = k8s_pods.list_predictor_pods(api_client, namespace, name)
    return [p["name"] for p in pods]


def read_baseline(api_client, namespace, name, configmap=None, key=BASELINE_KEY):
    """The recorded baseline (``{"figures", "recorded_at", "source"}``) or None when there is none; ``configmap`` and
    ``key``: another baseline's ConfigMap and data key than the service-wide one's (the per-class one, ops/watchdog_classes.py)."""
    configmap = configmap or baseline_name(name)
    try:
        cm = kube_client.request(api_client, "GET", "/api/v1/namespaces/%s/configmaps/%s" % (namespace, configmap))
    except kube_client.ApiException as exc:
        if getattr(exc, "status", None) == 404:
            return None
        raise k8s_pods.PodAccessError("reading ConfigMap %s/%s failed: %s" % (namespace, configmap, k8s_pods.api_error_message(exc)),
                                      field="name", hint="the identity needs get on configmaps in that namespace") from exc
    try:
        return json.loads(((cm or {}).get("data") or {}).get(key) or "null")
    except ValueError as exc:
        raise ValidationError("ConfigMap %s/%s holds no JSON baseline: %s" % (namespace, configmap, exc), field="record_baseline",
                              hint="record it again (record_baseline: true)") from exc


def baseline_configmap(owner, kind, figures, source, now=None):
    """The ConfigMap that keeps the baseline, owned by the InferenceService (deleted with it)."""
    meta = owner["metadata"]
    doc = {"figures": {k: figures.get(k) for k in BASELINE_FIELDS}, "source": source, "kind": kind,
           "recorded_at": (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": baseline_name(meta["name"]), "namespace": meta["namespace"],
                         "labels": {"app.kubernetes.io/managed-by": "alauda.spec_decoding",
                                    "app.kubernetes.io/component": "speculative-decoding-baseline"},
                         "ownerReferences": [{"apiVersion": owner.get("apiVersion") or "serving.kserve.io/v1beta1", "kind": kind,
                                              "name": meta["name"], "uid": meta["uid"]}]},
            "data": {BASELINE_KEY: json.dumps(doc, sort_keys=True)}}


def write_baseline(api_client, body, dry_run=False):
    """Create or replace the baseline ConfigMap (server-side dry run in check mode)."""
    meta = body["metadata"]
    query = {"dryRun": "All"} if dry_run else None
    base = "/api/v1/namespaces/%s/configmaps" % meta["namespace"]
    try:
        try:
            return kube_client.request(api_client, "POST", base, query=query, body=body)
        except kube_client.ApiException as exc:
            if getattr(exc, "status", None) != 409:
                raise
            return kube_client.request(api_client, "PUT", "%s/%s" % (base, meta["name"]), query=query, body=body)
    except kube_client.ApiException as exc:
        raise k8s_pods.PodAccessError("writing ConfigMap %s/%s failed: %s" % (meta["namespace"], meta["name"], k8s_pods.api_error_message(exc)),
                                      field="record_baseline", hint="the identity needs create and update on configmaps") from exc


def get_owner(api_client, namespace, name, kind, api_version="v1alpha2"):
    if kind == LLM_INFERENCE_SERVICE:
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import (  # pylint: disable=import-outside-toplevel
            cluster as llmisvc_cluster)
        return llmisvc_cluster.get(api_client, namespace, name, version=api_version)
    return k8s_pods.get_inference_service(api_client, namespace, name)


# -- windows ---------------------------------------------------------------------------------------------------------------

def window_start(api_client, namespace, name, params, clock, carry):
    """The start of one window over a service's serving pods: ``(start, error)``. ``start`` holds the pods' targets and
    first pages and when they were read; error says why the window cannot be measured.

    ``carry`` (a dict the caller keeps across consecutive windows) holds the last window's end: when the same pods serve,
    their end pages and targets are this window's start, so each pod's /metrics is read once per window and its port
    looked up once per run (issue 53: a watch over N services costs N pods' reads per window, not twice that). A changed
    pod set, or a window that could not be measured, starts afresh with its own first read."""
    pods = serving_pods(api_client, namespace, name, params["resource_kind"])
    if not pods:
        carry.clear()
        return None, "no serving pod of %s %s/%s is running" % (params["resource_kind"], namespace, name)
    names = sorted(pods)
    if carry.get("pods") == names:
        start = {"pods": names, "targets": carry["targets"], "pages": carry["pages"], "lost": [], "at": carry["at"]}
    else:
        targets = canary.pod_targets(api_client, namespace, pods, params["container"], params.get("port"), params.get("scheme"))
        first, lost = canary.scrape_pods(api_client, namespace, targets, params.get("model_name"), params["timeout"])
        start = {"pods": names, "targets": targets, "pages": first, "lost": lost, "at": clock()}
    carry.clear()
    return start, None


def window_end(api_client, namespace, params, clock, carry, start):
    """The end of the window ``window_start`` began: each pod's /metrics read again, ``(figures, error)``; the end is kept
    in ``carry`` as the next window's start."""
    later, lost_later = canary.scrape_pods(api_client, namespace, start["targets"], params.get("model_name"), params["timeout"])
    end = clock()
    missing = sorted(set(start["lost"]) | set(lost_later))
    if missing:
        return None, "no vLLM /metrics from the pods %s" % ", ".join(missing)
    carry.update(pods=start["pods"], targets=start["targets"], pages=later, at=end)
    deltas = [canary_window.window_delta(page, start["pages"].get(pod)) for pod, page in sorted(later.items())]
    figures = analysis.window_figures(deltas, end - start["at"])
    figures["pod_names"] = sorted(later)
    figures["spec_found"] = any(d["spec"].found for d in deltas)
    return figures, None


def measure_windows(api_client, services, interval, sleep, clock):
    """One window over every serving pod of several services at once (issue 53): each service's start, one wait of
    ``interval`` seconds for all of them, each service's end - so a watch over N services takes count x interval, not
    N x that. ``services``: ``[{namespace, name, params, carry}]``; per service ``(figures, error)`` in their order. A
    service whose reads fail gets the error (a window that could not be measured); the others are measured."""
    started = []
    for svc in services:
        try:
            started.append(window_start(api_client, svc["namespace"], svc["name"], svc["params"], clock, svc["carry"]))
        except SpecDecodingError as exc:
            svc["carry"].clear()
            started.append((None, str(exc)))
    sleep(interval)
    out = []
    for svc, (start, error) in zip(services, started):
        if error is not None:
            out.append((None, error))
            continue
        try:
            out.append(window_end(api_client, svc["namespace"], svc["params"], clock, svc["carry"], start))
        except SpecDecodingError as exc:
            svc["carry"].clear()
            out.append((None, str(exc)))
    return out


def judge_window(figures, error, checks, baseline, params, confidence=None):
    """The engine's verdict on one window, with ``no_traffic`` marked and no spec_decode series an error."""
    if error is None and not figures.get("spec_found"):
        error = "no spec_decode series on the serving pods: they do not run speculative decoding"
    if error is None and not (figures["acceptance"] or {}).get("has_data") and (figures.get("requests") or 0) >= params["min_requests"]:
        # requests finished, but no draft was made: the proposer is off (or every prompt skipped it)
        figures["acceptance"] = dict(figures["acceptance"], draft_acceptance_rate=0.0, mean_acceptance_length=1.0)
    out = analysis.window_verdict(checks, figures, baseline, min_requests=params["min_requests"], error=error,
                                  confidence=params["confidence"] if confidence is None else confidence)
    out["no_traffic"] = out["verdict"] == analysis.INCONCLUSIVE and any(r.startswith("too little traffic: the window") for r in out["reasons"])
    out["figures"] = {k: (figures or {}).get(k) for k in ("requests", "tpot_ms", "ttft_ms", "acceptance")} if figures else None
    return out


def check_params(params):
    """Checks and budgets, validated before anything is read."""
    if params["interval"] <= 0:
        raise ValidationError("must be more than 0 seconds", field="interval", hint="measure windows of a few minutes of live traffic")
    if params["min_requests"] < 1:
        raise ValidationError("must be at least 1", field="min_requests", hint="e.g. 20 finished requests per window")
    checks = [analysis.check_spec(c) for c in (params.get("checks") or DEFAULT_CHECKS)]
    budgets = analysis.Budgets.from_params(params)
    canary_steps.check_confidence(params.get("confidence"))
    return checks, budgets


def watch(api_client, params, check_mode=False, sleep=None, clock=None):
    """The module's result for one service: ``state``, ``action`` (``roll_back`` when collapsed, else ``none``), the
    windows and why. With ``record_baseline`` one window is measured and kept as the baseline instead."""
    one = watch_services(api_client, params, [{"namespace": params["namespace"], "name": params["name"]}], check_mode, sleep, clock)
    return {k: v for k, v in one["services"][0].items() if k not in ("namespace", "name")}


def service_list(services):
    """The ``services`` option as ``[{namespace, name}]``, each entry checked and each service once."""
    out = []
    for index, svc in enumerate(services or []):
        if not isinstance(svc, dict) or not all(isinstance(svc.get(k), str) and svc.get(k) for k in ("namespace", "name")):
            raise ValidationError("entry %d is not {namespace, name}: %r" % (index, svc), field="services",
                                  hint="give each service as {namespace: models, name: llama}")
        key = {"namespace": svc["namespace"], "name": svc["name"]}
        if key not in out:
            out.append(key)
    return out


def watch_services(api_client, params, services, check_mode=False, sleep=None, clock=None):
    """The watch over several services (the watch role's fleet form, issue 53): their windows are measured together
    (``measure_windows``: one wait per window for all of them, each pod's /metrics read once per window), so the run takes
    about ``count`` x ``interval`` whatever the number of services; each service keeps its own baseline, analysis run,
    budgets, state and action. ``services``: ``[{namespace, name}]`` (the options' name and namespace are not read).
    Returns ``{services: [one service's result with its namespace and name], state, action, changed, msg}``."""
    import time  # pylint: disable=import-outside-toplevel
    sleep, clock = sleep or time.sleep, clock or time.monotonic
    checks, budgets = check_params(params)
    kind = params["resource_kind"]
    watched, unread = [], []
    for svc in services:
        own = dict(params, namespace=svc["namespace"], name=svc["name"])
        try:
            owner = get_owner(api_client, svc["namespace"], svc["name"], kind, params.get("api_version") or "v1alpha2")
        except SpecDecodingError as exc:
            # one service: its run fails, as it always did; a recording writes every baseline or none
            if len(services) == 1 or params.get("record_baseline"):
                raise
            # several: the one that cannot be read (gone since it was found, forbidden) is reported, the others are watched
            unread.append(dict(changed=False, state=UNKNOWN, action="none", analysis=None, baseline=None, reasons=[str(exc)],
                               msg="unknown: %s; nothing done" % exc, namespace=svc["namespace"], name=svc["name"]))
            continue
        watched.append({"namespace": svc["namespace"], "name": svc["name"], "params": own, "owner": owner, "carry": {}})
    if not watched:
        results = []
    elif params.get("record_baseline"):
        results = _record_services(api_client, watched, params, check_mode, sleep, clock)
    else:
        results = _watch_windows(api_client, watched, params, checks, budgets, check_mode, sleep, clock)
    order = {(s["namespace"], s["name"]): i for i, s in enumerate(services)}
    rows = sorted([dict(result, namespace=w["namespace"], name=w["name"]) for w, result in zip(watched, results)] + unread,
                  key=lambda r: order[(r["namespace"], r["name"])])
    states = [r["state"] for r in rows]
    state = next((s for s in (COLLAPSED, DEGRADED, UNKNOWN, NO_TRAFFIC, HEALTHY, "recorded") if s in states), NO_TRAFFIC)
    action = "roll_back" if COLLAPSED in states else "none"
    counts = ", ".join("%d %s" % (states.count(s), s) for s in STATES + ("recorded",) if s in states)
    return dict(changed=any(r["changed"] for r in rows), state=state, action=action, would_roll_back=check_mode and action == "roll_back",
                services=rows, msg="%d service(s): %s" % (len(rows), counts or "none watched"))


def _watch_windows(api_client, watched, params, checks, budgets, check_mode, sleep, clock):
    """Each service's analysis run, their windows measured together until every run has ended (a run that ends early,
    such as a collapse at the first window, leaves the others to go on)."""
    results = [None] * len(watched)
    judged = []
    for index, w in enumerate(watched):
        ns, name = w["namespace"], w["name"]
        recorded = params.get("baseline") and {"figures": params["baseline"], "source": "given"} or read_baseline(api_client, ns, name)
        base = (recorded or {}).get("figures")
        if not base:
            why = "no baseline recorded for %s %s/%s (ConfigMap %s)" % (params["resource_kind"], ns, name, baseline_name(name))
            results[index] = dict(changed=False, state=UNKNOWN, action="none", baseline=None, analysis=None, reasons=[why],
                                  msg="unknown: no baseline; record one when the rollout is verified (record_baseline: true) - nothing done")
            continue
        judged.append((index, w, recorded, base, analysis.AnalysisRun(budgets)))
    if judged and budgets.initial_delay:
        sleep(budgets.initial_delay)
    confidence = budgets.window_confidence(params["confidence"])
    while True:
        running = [j for j in judged if j[4].phase == analysis.RUNNING]
        if not running:
            break
        measured = measure_windows(api_client, [j[1] for j in running], params["interval"], sleep, clock)
        for (_index, w, _recorded, base, run), (figures, error) in zip(running, measured):
            run.add(judge_window(figures, error, checks, base, w["params"], confidence))
    for index, _w, recorded, base, run in judged:
        results[index] = _verdict(run.result(), recorded, base, check_mode)
    return results


def _verdict(run, recorded, base, check_mode):
    state = state_of(run)
    last = run["windows"][-1]
    reasons = ["%s: %s" % (state, run["message"])] + last["reasons"]
    action = "roll_back" if state == COLLAPSED else "none"
    msg = {COLLAPSED: "collapsed: %s; the flag is rolled back%s" % (run["message"], " (check mode: would be)" if check_mode else ""),
           DEGRADED: "degraded: %s; reported, nothing done" % run["message"],
           HEALTHY: "healthy: %s" % run["message"], NO_TRAFFIC: "no_traffic: too few requests to judge; nothing done",
           UNKNOWN: "unknown: %s; nothing done" % run["message"]}[state]
    return dict(changed=False, state=state, action=action, would_roll_back=check_mode and action == "roll_back", analysis=run,
                reasons=reasons, baseline={"source": recorded.get("source"), "recorded_at": recorded.get("recorded_at"),
                                           "requests": base.get("requests")}, msg=msg)


def _record_services(api_client, watched, params, check_mode, sleep, clock):
    """One window over every service, kept as each one's baseline. Every window is checked before anything is written:
    when one cannot be a baseline, none is written and the error names that service (with more than one)."""
    measured = measure_windows(api_client, watched, params["interval"], sleep, clock)
    bodies = []
    for w, (figures, error) in zip(watched, measured):
        who = "" if len(watched) == 1 else "%s/%s: " % (w["namespace"], w["name"])
        bodies.append(_baseline_body(w["params"], w["owner"], figures, error, who))
    results = []
    for w, (figures, _error), body in zip(watched, measured, bodies):
        write_baseline(api_client, body, dry_run=check_mode)
        acc = figures.get("acceptance") or {}
        results.append(dict(changed=True, state="recorded", action="none", baseline=json.loads(body["data"][BASELINE_KEY]),
                            configmap=body["metadata"]["name"], reasons=[],
                            msg="baseline recorded in ConfigMap %s/%s: acceptance rate %s, mean acceptance length %s, %d requests" % (
                                w["namespace"], body["metadata"]["name"], _fmt(acc.get("draft_acceptance_rate")),
                                _fmt(acc.get("mean_acceptance_length")), figures["requests"])))
    return results


def _baseline_body(params, owner, figures, error, who=""):
    """The baseline's ConfigMap from one measured window (refused on an unmeasured window, too little traffic or no
    acceptance data); ``who`` names the service in the refusal when several are recorded."""
    if error:
        raise SpecDecodingError("%scannot record a baseline: %s" % (who, error), field="record_baseline",
                                hint="record it while every serving pod is Ready and /metrics is readable")
    acc = figures.get("acceptance") or {}
    if (figures.get("requests") or 0) < params["min_requests"] or not acc.get("has_data"):
        raise ValidationError("%scannot record a baseline: %d requests and %s drafted tokens in %.0f s (min_requests %d)" % (
            who, figures.get("requests") or 0, acc.get("num_draft_tokens"), figures["window_s"], params["min_requests"]), field="record_baseline",
            hint="record it under representative traffic, with a longer interval")
    return baseline_configmap(owner, params["resource_kind"], figures, params.get("baseline_source") or "verify")


def _fmt(value):
    return "n/a" if value is None else "%.3f" % value
