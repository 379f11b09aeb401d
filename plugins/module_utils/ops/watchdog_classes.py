# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog per request class (issue #52, module ``speculative_watchdog`` with ``request_classes``): acceptance per
class on the speculative pool, and a class whose acceptance collapsed routed back to the baseline by a route edit (its
rule removed from the routing plan's HTTPRoute, or from the LLMInferenceService's own router), the other classes left on.

Where per-class acceptance comes from on a live service. vLLM's /metrics counters (``vllm:spec_decode_*``) carry no class
label: they are the server's sums over every request. The per-request block (``metrics.speculative_decoding``, vLLM 0.32+
with ``--per-request-spec-decode-metrics``, which the render turns on for the speculative side) is written into each
response, so only the client that sent a request sees it; the gateway logs no acceptance and the serving pods keep no
per-class counter. So the watchdog is that client: per class it sends its own probe requests (the class's prompts,
``temperature`` 0, ``n`` 1, not streamed, so every response carries the block) to the speculative pool's serving pods
through the API server's pod proxy - the way it reads /metrics - and pools the blocks' counters
(``vllm.metrics.counters_from_response``, ``summarize``). A response without the block (an older release, the flag off)
is counted and said, never estimated.

Judging: per class, the probes' acceptance against the class's baseline (recorded the same way when the routes were
verified, in the ConfigMap ``<name>-spec-decoding-class-baseline``, or given) with the watchdog's own acceptance checks
and the analysis engine's noise test (``bench/analysis.window_verdict``): a class whose window fails is ``collapsed``.

The route edit (``route_back``): the classes' rules named ``class-<class>`` (bench/routing_plan.py) are removed, so their
requests fall to the default rule, the baseline; the plan's annotation says the class is on the baseline. The manifest
comes from where the routes live - the file in Git (the role reads it from the GitOps directory and writes it back with
the benchmark role's write modes), or the live object - and the caller writes it: nothing here writes a route.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import copy
import datetime
import json

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import router as llmisvc_router
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import watchdog
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics

OPTION = "request_classes"
BASELINE_SUFFIX = "-spec-decoding-class-baseline"
BASELINE_KEY = "classes.json"
HTTPROUTE_PATH = "/apis/gateway.networking.k8s.io/v1/namespaces/%s/httproutes/%s"
RULE_PREFIX = "class-"
# the watchdog's deciding acceptance checks (ops/watchdog.py DEFAULT_CHECKS without the service-wide TPOT, which probes
# sent one at a time do not measure)
CLASS_CHECKS = tuple(c for c in watchdog.DEFAULT_CHECKS if c["figure"] in ("acceptance_rate", "mean_acceptance_length"))
ROUTE_BACK = "route_back"


def baseline_name(name):
    return name + BASELINE_SUFFIX


# -- the route ------------------------------------------------------------------------------------------------------------

def _rules_holder(route):
    """The dict holding the route's ``rules``: an HTTPRoute's ``spec``, an LLMInferenceService's ``spec.router.route.http.spec``."""
    if not isinstance(route, dict):
        return None
    if route.get("kind") == "HTTPRoute":
        return route.get("spec")
    if route.get("kind") == llmisvc_router.KIND:
        return (((route.get("spec") or {}).get("router") or {}).get("route") or {}).get("http", {}).get("spec")
    return None


def plan_pools(route):
    """``{class: pool}`` the routing plan's annotation on ``route`` records (bench/routing_plan.py)."""
    holder = _rules_holder(route)
    if holder is None or not isinstance(holder.get("rules"), list):
        raise ValidationError("is not the routing plan's HTTPRoute or an LLMInferenceService with its router's rules", field=OPTION + ".route",
                              hint="give the route the benchmark role wrote (benchmark_routing_plan), or its name (route_name)")
    text = ((route.get("metadata") or {}).get("annotations") or {}).get(llmisvc_router.PLAN_ANNOTATION)
    if not text:
        raise ValidationError("carries no routing plan (annotation %s)" % llmisvc_router.PLAN_ANNOTATION, field=OPTION + ".route",
                              hint="route the classes with the benchmark role (benchmark_routing_plan) first; the watchdog edits only its routes")
    try:
        return dict(json.loads(text).get("classes") or {})
    except (ValueError, AttributeError) as exc:
        raise ValidationError("annotation %s is not the plan's JSON: %s" % (llmisvc_router.PLAN_ANNOTATION, exc), field=OPTION + ".route",
                              hint="render the route again with the benchmark role") from exc


def speculative_classes(route):
    """The classes the route sends to the speculative pool: in the plan and with their rule still there."""
    pools = plan_pools(route)  # refuses a route that is not the plan's, naming the option
    names = {r.get("name") for r in _rules_holder(route)["rules"]}
    return sorted(c for c, pool in pools.items() if pool == "speculative" and RULE_PREFIX + c in names)


def route_back(route, classes):
    """``route`` without the rules of ``classes``: their requests fall to the default rule (the baseline). The plan's
    annotation records them on the baseline. A copy; the other rules and every other field as they were."""
    out = copy.deepcopy(route)
    holder = _rules_holder(out)
    pools = plan_pools(out)
    gone = {RULE_PREFIX + c for c in classes}
    holder["rules"] = [r for r in holder["rules"] if r.get("name") not in gone]
    for klass in classes:
        pools[klass] = "baseline"
    annotations = out["metadata"]["annotations"]
    summary = json.loads(annotations[llmisvc_router.PLAN_ANNOTATION])
    summary["classes"] = pools
    annotations[llmisvc_router.PLAN_ANNOTATION] = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    return out


def applied_part(obj, kind, api_version=None):
    """The manifest part of a live route (no status, managedFields, resourceVersion): what a rerun would apply."""
    meta = obj.get("metadata") or {}
    keep = {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if meta.get(k)}
    if kind == "HTTPRoute":
        return {"apiVersion": obj.get("apiVersion"), "kind": "HTTPRoute", "metadata": keep, "spec": copy.deepcopy(obj.get("spec") or {})}
    route = ((obj.get("spec") or {}).get("router") or {}).get("route") or {}
    out = llmisvc_router.route_object(meta.get("name"), meta.get("namespace"), route, api_version or obj.get("apiVersion"))
    if keep.get("annotations", {}).get(llmisvc_router.PLAN_ANNOTATION):
        out["metadata"]["annotations"] = {llmisvc_router.PLAN_ANNOTATION: keep["annotations"][llmisvc_router.PLAN_ANNOTATION]}
    return out


def read_route(api_client, params):
    """The route the plan is in: the given manifest (from Git), else the live HTTPRoute ``route_name`` or, for an
    LLMInferenceService, the service's own router."""
    spec = params[OPTION]
    if spec.get("route"):
        return spec["route"]
    ns = params["namespace"]
    if params["resource_kind"] == watchdog.LLM_INFERENCE_SERVICE and not spec.get("route_name"):
        owner = watchdog.get_owner(api_client, ns, params["name"], params["resource_kind"], params.get("api_version") or "v1alpha2")
        return applied_part(owner, llmisvc_router.KIND, params.get("api_version"))
    if not spec.get("route_name"):
        raise ValidationError("names no route", field=OPTION + ".route_name",
                              hint="give the routing plan's HTTPRoute (route_name, e.g. <report>-classes) or its manifest (route)")
    try:
        live = kube_client.request(api_client, "GET", HTTPROUTE_PATH % (ns, spec["route_name"]))
    except kube_client.ApiException as exc:
        raise k8s_pods.PodAccessError("reading HTTPRoute %s/%s failed: %s" % (ns, spec["route_name"], k8s_pods.api_error_message(exc)),
                                      field=OPTION + ".route_name", hint="check the name; the identity needs get on httproutes") from exc
    return applied_part(live, "HTTPRoute")


# -- the probes -----------------------------------------------------------------------------------------------------------

def probe_body(spec, prompt, model):
    """One probe: a completion of the class's prompt, greedy, one choice, not streamed (the per-request block is in every
    such response; a stream carries it only with usage, n > 1 not at all)."""
    return {"model": model, "prompt": prompt, "max_tokens": int(spec.get("max_tokens") or 64), "temperature": 0, "n": 1, "stream": False}


def pod_proxy_sender(api_client, namespace, targets, timeout):
    """``send(klass, body) -> response dict``: POST /v1/completions to the pool's pods in turn, through the API server's pod
    proxy (kube/pods.py proxy_get's target form: ``pod:port``, ``https:pod:port``)."""
    order = sorted(targets)
    state = {"next": 0}

    def send(_klass, body):
        pod = order[state["next"] % len(order)]
        state["next"] += 1
        target = targets[pod]
        where = "%s:%s" % (pod, target["port"]) if target["scheme"] == "http" else "%s:%s:%s" % (target["scheme"], pod, target["port"])
        try:
            return kube_client.request(api_client, "POST", "/api/v1/namespaces/%s/pods/%s/proxy/v1/completions" % (namespace, where),
                                       body=body, timeout=timeout)
        except kube_client.ApiException as exc:
            raise k8s_pods.PodAccessError("POST /v1/completions on pod %s/%s failed: %s" % (namespace, pod, k8s_pods.api_error_message(exc)),
                                          field=OPTION, hint="the pod must serve the model named in request_classes.model; the identity "
                                                             "needs create on pods/proxy") from exc
        except (k8s_pods.TransportError, OSError, ValueError) as exc:  # no answer in time, or one that is not JSON
            raise k8s_pods.PodAccessError("POST /v1/completions on pod %s/%s failed: %s" % (namespace, pod, exc), field="timeout",
                                          hint="the pod did not answer a probe in time; raise timeout or lower request_classes.max_tokens") from exc
    return send


def class_figures(responses):
    """A class's window from its probe responses: ``requests`` (those that carried the block), ``sent``, ``acceptance``
    (vLLM's counters summed, ``vllm.metrics.summarize``) and a note when some carried none."""
    total, reported = spec_metrics.SpecDecodeCounters(source="response"), 0
    for body in responses:
        counters = spec_metrics.counters_from_response(body)
        if counters.found:
            reported += 1
            total = total + counters
    out = {"sent": len(responses), "requests": reported, "acceptance": spec_metrics.summarize(total) if reported else None, "note": None}
    if reported < len(responses):
        out["note"] = "%d of %d probe responses carried no metrics.speculative_decoding (vLLM before 0.32, or the pool runs without " \
                      "--per-request-spec-decode-metrics): not counted" % (len(responses) - reported, len(responses))
    return out


def probe_classes(spec, classes, model, send):
    """``{class: class_figures}`` of the probes of each class."""
    out = {}
    for klass in classes:
        prompts = list((spec.get("probes") or {}).get(klass) or [])
        responses = []
        for prompt in prompts:
            responses.append(send(klass, probe_body(spec, prompt, model)))
        out[klass] = class_figures(responses)
    return out


# -- the baseline per class -----------------------------------------------------------------------------------------------

def read_baseline(api_client, namespace, name):
    """The per-class baseline recorded for ``name`` (its own ConfigMap, read as the service-wide one is), or None."""
    return watchdog.read_baseline(api_client, namespace, name, configmap=baseline_name(name), key=BASELINE_KEY)


def baseline_configmap(owner, kind, figures, now=None):
    """The per-class baseline's ConfigMap, owned by the service as the service-wide one is (ops/watchdog.py)."""
    body = watchdog.baseline_configmap(owner, kind, {}, "probes", now)
    body["metadata"]["name"] = baseline_name(owner["metadata"]["name"])
    doc = {"classes": {k: {"requests": f["requests"], "acceptance": f["acceptance"]} for k, f in figures.items()}, "kind": kind,
           "recorded_at": (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    body["data"] = {BASELINE_KEY: json.dumps(doc, sort_keys=True)}
    return body


# -- judging --------------------------------------------------------------------------------------------------------------

def baseline_figures(given):
    """A class's baseline as the checks read it: its acceptance summarised again from its counters (``num_drafts``,
    ``num_draft_tokens``, ``num_accepted_tokens``, ``accepted_tokens_per_position``), so a baseline given by its counters
    alone (the A/B report's per-class ``acceptance.counters``) judges the same as a recorded one."""
    if not isinstance(given, dict):
        return None
    acc = given.get("acceptance") or given.get("counters") or {}
    counters = acc.get("counters") if isinstance(acc.get("counters"), dict) else acc
    if not counters.get("num_drafts") or counters.get("num_accepted_tokens") is None:
        return dict(given)
    total = spec_metrics.SpecDecodeCounters(num_drafts=counters["num_drafts"], num_draft_tokens=counters.get("num_draft_tokens"),
                                            num_accepted_tokens=counters["num_accepted_tokens"],
                                            accepted_per_pos=list(counters.get("accepted_tokens_per_position") or []), found=True,
                                            source="response")
    return dict(given, acceptance=spec_metrics.summarize(total))


def judge(figures, baseline, params):
    """One class's state from its window against its baseline: ``collapsed`` when the engine fails the window."""
    checks = [analysis.check_spec(c) for c in CLASS_CHECKS]
    if baseline is None:
        return {"state": watchdog.UNKNOWN, "verdict": None, "reasons": ["no baseline recorded for this class (record_baseline: true)"]}
    if not figures["requests"]:
        return {"state": watchdog.UNKNOWN, "verdict": None, "reasons": [figures["note"] or "no probe of this class was sent"]}
    out = analysis.window_verdict(checks, figures, baseline, min_requests=params["min_requests"], confidence=params["confidence"])
    state = {analysis.FAIL: watchdog.COLLAPSED, analysis.PASS: watchdog.HEALTHY, analysis.ERROR: watchdog.UNKNOWN}.get(out["verdict"])
    if state is None:
        state = watchdog.NO_TRAFFIC if any(r.startswith("too little traffic") for r in out["reasons"]) else watchdog.DEGRADED
    return {"state": state, "verdict": out["verdict"], "reasons": out["reasons"] + ([figures["note"]] if figures["note"] else [])}


def check_params(params):
    spec = params.get(OPTION)
    if not isinstance(spec, dict) or not isinstance(spec.get("probes"), dict) or not spec["probes"]:
        raise ValidationError("needs probes: the prompts the watchdog sends per class", field=OPTION + ".probes",
                              hint="e.g. {code: ['def fib(n):'], chat: ['Hello, how are you?']} - a few prompts each, like the class's traffic")
    for klass, prompts in spec["probes"].items():
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
            raise ValidationError("class %s has no prompts" % klass, field="%s.probes.%s" % (OPTION, klass),
                                  hint="give a list of prompt strings (at least min_requests of them to judge)")
    if params["min_requests"] < 1:
        raise ValidationError("must be at least 1", field="min_requests", hint="e.g. 8 probes per class")
    return spec


def watch_classes(api_client, params, check_mode=False, send=None):
    """The module's result with ``request_classes``: per class its state; ``route`` (the edited manifest) and ``action``
    ``route_back`` when a class collapsed, with ``routed_back`` the classes. With ``record_baseline`` the probes'
    figures are kept as each class's baseline instead."""
    spec = check_params(params)
    ns, name, kind = params["namespace"], params["name"], params["resource_kind"]
    route = read_route(api_client, params)
    classes = [c for c in speculative_classes(route) if c in spec["probes"]]
    unprobed = [c for c in speculative_classes(route) if c not in spec["probes"]]
    if send is None:
        pods = watchdog.serving_pods(api_client, ns, name, kind)
        if not pods:
            raise SpecDecodingError("no serving pod of %s %s/%s is running" % (kind, ns, name), field="name",
                                    hint="watch the speculative pool's service while it serves")
        targets = canary.pod_targets(api_client, ns, pods, params["container"], params.get("port"), params.get("scheme"))
        send = pod_proxy_sender(api_client, ns, targets, params["timeout"])
    model = spec.get("model") or params.get("model_name") or name
    windows = probe_classes(spec, classes, model, send)
    if params.get("record_baseline"):
        owner = watchdog.get_owner(api_client, ns, name, kind, params.get("api_version") or "v1alpha2")
        short = [c for c, f in windows.items() if f["requests"] < params["min_requests"]]
        if short:
            raise ValidationError("cannot record the class baseline: class %s had %d probe responses with acceptance, fewer than "
                                  "min_requests %d" % (short[0], windows[short[0]]["requests"], params["min_requests"]),
                                  field=OPTION + ".probes", hint="give more prompts for that class, or lower min_requests")
        body = baseline_configmap(owner, kind, windows)
        watchdog.write_baseline(api_client, body, dry_run=check_mode)
        return dict(changed=True, state="recorded", action="none", classes=[{"class": c, "requests": f["requests"]} for c, f in windows.items()],
                    configmap=body["metadata"]["name"], route=None, routed_back=[], reasons=[],
                    msg="class baseline recorded in ConfigMap %s/%s for %s" % (ns, body["metadata"]["name"], ", ".join(windows) or "no class"))
    recorded = spec.get("baseline") or (read_baseline(api_client, ns, name) or {}).get("classes") or {}
    rows = []
    for klass in classes:
        row = judge(windows[klass], baseline_figures(recorded.get(klass)), params)
        figures = {key: windows[klass][key] for key in ("requests", "sent", "acceptance")}
        rows.append(dict(row, **{"class": klass, "figures": figures}))
    collapsed = [r["class"] for r in rows if r["state"] == watchdog.COLLAPSED]
    kept = [r["class"] for r in rows if r["state"] != watchdog.COLLAPSED]
    reasons = ["class %s: %s: %s" % (r["class"], r["state"], "; ".join(r["reasons"])) for r in rows]
    reasons += ["class %s is on the speculative pool but has no probes: not watched" % c for c in unprobed]
    if collapsed:
        msg = "collapsed: class %s routed back to the baseline%s; still on the speculative pool: %s" % (
            ", ".join(collapsed), " (check mode: would be)" if check_mode else "", ", ".join(kept) or "no class")
    else:
        msg = "per class: %s" % (", ".join("%s %s" % (r["class"], r["state"]) for r in rows) or "no class on the speculative pool")
    return dict(changed=False, state=watchdog.COLLAPSED if collapsed else _overall(rows), action=ROUTE_BACK if collapsed else "none",
                classes=rows, routed_back=collapsed, route=route_back(route, collapsed) if collapsed else None,
                would_route_back=bool(collapsed) and check_mode, reasons=reasons, msg=msg)


def _overall(rows):
    states = {r["state"] for r in rows}
    for state in (watchdog.DEGRADED, watchdog.UNKNOWN, watchdog.NO_TRAFFIC):
        if state in states:
            return state
    return watchdog.HEALTHY if rows else watchdog.NO_TRAFFIC
