# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""LLMInferenceService's own router: HTTPRoute rules in ``spec.router.route.http.spec`` (the routing plan's render for an
LLMInferenceService, bench/routing_plan.py builds the rules).

What KServe does with them, read in its source at v0.20.0 (``pkg/controller/v1alpha2/llmisvc/``):

* The CRD (../shared/kserve-crds): ``spec.router.route`` has ``http`` (``refs``: HTTPRoutes the user owns; ``spec``: an
  embedded Gateway API ``HTTPRouteSpec`` with ``parentRefs``, ``hostnames``, ``rules``, ``useDefaultGateways``), ``group``
  and ``weight``.
* ``router.go`` ``reconcileHTTPRoutes`` / ``expectedHTTPRoute``: with ``http.spec`` the controller writes one HTTPRoute,
  ``kmeta.ChildName(<name>, "-kserve-route")``, owned by the LLMInferenceService, whose spec is a copy of ``http.spec``
  after the presets' merge; with ``http.refs`` it deletes that route and serves the ones named (the plan's rules would then
  go nowhere, so :func:`with_route` refuses refs).
* ``config_merge.go``: whenever ``route`` is set without refs the well-known preset ``config-llm-router-route`` is merged
  under the resource (the resource wins: its ``rules`` list replaces the preset's, a ``parentRefs`` it leaves out is the
  preset's default Gateway; ``router.gateway.refs`` replace the parentRefs). A backendRef that is the default InferencePool
  (``isDefaultBackendRef``) is rewritten to the workload Service; the plan's Services are left as they are.
* ``expectedHTTPRoute`` then calls ``stripModelBasedRoutingRules`` (``config_merge.go``) unless model-based routing is on for
  the service (``isModelBasedRoutingEnabled``: the ingress config's ``modelBasedRoutingHeaderName``, the annotation
  ``serving.kserve.io/model-based-routing-enabled: "true"``, ``modelBasedRoutingMode`` not ``disabled``): every match with a
  header named like the model-routing header (``X-Gateway-Model-Name`` by default, ``v1beta1/configmap.go``
  ``DefaultModelBasedRoutingHeaderName``) is dropped, and a rule left without a match with it. :func:`controller_rules` is
  that function, so a plan's model-alias matches on that header are said to be dropped, not silently lost.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import copy

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc.model import DEFAULT_API_VERSION, GROUP, KIND, check_api_version

ROUTE_SUFFIX = "-kserve-route"
MODEL_ROUTING_HEADER = "X-Gateway-Model-Name"
MODEL_ROUTING_ANNOTATION = "serving.kserve.io/model-based-routing-enabled"
# the routing plan's summary on the object that carries its rules (bench/routing_plan.py)
PLAN_ANNOTATION = "spec-decoding.alauda.io/routing-plan"
# knative.dev/pkg/kmeta ChildName: parent + suffix while it fits a 63-character name, else a hashed name
_NAME_MAX = 63


def route_name(name):
    """The HTTPRoute the controller writes for ``name`` (``kmeta.ChildName``); None when the name is long enough for
    ChildName to hash it (then read it from the LLMInferenceService's status)."""
    return name + ROUTE_SUFFIX if len(name) + len(ROUTE_SUFFIX) <= _NAME_MAX else None


def _checked_route(route):
    spec = ((route or {}).get("http") or {}).get("spec") if isinstance(route, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("rules"), list):
        raise ValidationError("is not an LLMInferenceService router route with rules (http.spec.rules)", field="route",
                              hint="pass what the routing_plan filter returns with render=llmisvc_route")
    return spec


def strip_model_routing_matches(rules, header=MODEL_ROUTING_HEADER):
    """KServe v0.20 ``stripModelBasedRoutingRules``: each rule without its matches on ``header`` (Gateway API header names
    compare as written here, as the Go code compares them); a rule left without a match is dropped."""
    if not header:
        return copy.deepcopy(rules)
    out = []
    for rule in rules:
        kept = [m for m in rule.get("matches") or [] if not any(h.get("name") == header for h in m.get("headers") or [])]
        if kept:
            out.append(dict(copy.deepcopy(rule), matches=copy.deepcopy(kept)))
    return out


def controller_rules(rules, model_routing=False, header=MODEL_ROUTING_HEADER):
    """The rules of the HTTPRoute the controller writes from ``rules`` (``expectedHTTPRoute``): as given with model-based
    routing on (LoRA adapters aside), else without the model-routing header's matches."""
    return copy.deepcopy(rules) if model_routing else strip_model_routing_matches(rules, header)


def dropped_matches(route, model_routing=False, header=MODEL_ROUTING_HEADER):
    """Notes naming the rules whose matches KServe drops (the model-routing header's, model-based routing off)."""
    spec = _checked_route(route)
    kept = {r.get("name"): r for r in controller_rules(spec["rules"], model_routing, header)}
    notes = []
    for rule in spec["rules"]:
        lost = len(rule.get("matches") or []) - len((kept.get(rule.get("name")) or {}).get("matches") or [])
        if lost:
            notes.append("rule %s: KServe drops its %d match(es) on %s unless model-based routing is on for the service (annotation "
                         "%s: \"true\" and the ingress config's modelBasedRoutingMode); clients of that route name their class in "
                         "the class header" % (rule.get("name"), lost, header, MODEL_ROUTING_ANNOTATION))
    return notes


def with_route(manifest, route):
    """``manifest`` (an LLMInferenceService) with ``spec.router.route`` set to ``route`` (the router's gateway and scheduler
    kept). Refuses a router that names its HTTPRoutes (``http.refs``): KServe serves those and the rules go nowhere."""
    _checked_route(route)
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND or not isinstance(manifest.get("spec"), dict):
        raise ValidationError("is not an LLMInferenceService manifest", field="llmisvc",
                              hint="pass the LLMInferenceService the deploy rendered (its GitOps file) or read from the cluster")
    current = ((manifest["spec"].get("router") or {}).get("route") or {}).get("http") or {}
    if current.get("refs"):
        raise ValidationError("the router names its own HTTPRoutes (%s): KServe serves those and would not write a route from "
                              "the plan's rules" % ", ".join(str(r.get("name")) for r in current["refs"]),
                              field="spec.router.route.http.refs",
                              hint="route with the plan's HTTPRoute (benchmark_routing_plan on the InferenceService path: "
                                   "render httproute) or drop the refs from the LLMInferenceService")
    out = copy.deepcopy(manifest)
    router = out["spec"].setdefault("router", {})
    router["route"] = copy.deepcopy(route)
    return out


def route_object(name, namespace, route, api_version=None):
    """The part of LLMInferenceService ``namespace/name`` that carries the route: what a server-side apply of the route
    sends (the fields this manager owns), and the file written next to the report."""
    _checked_route(route)
    version = check_api_version(api_version or DEFAULT_API_VERSION)
    if not isinstance(name, str) or not name:
        raise ValidationError("names no LLMInferenceService", field="llmisvc_name",
                              hint="give the speculative LLMInferenceService's name (benchmark_candidate_name)")
    metadata = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "%s/%s" % (GROUP, version), "kind": KIND, "metadata": metadata,
            "spec": {"router": {"route": copy.deepcopy(route)}}}


def without_plan(obj):
    """``obj`` (an LLMInferenceService spec's copy, edited in place) without the routing plan's rules: a router route that
    carries them (the plan's annotation on ``metadata``) becomes ``{}``, the route KServe manages from its preset. The
    baseline twin must not copy them: its own HTTPRoute would send the speculative classes to the candidate's pool."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    route = ((obj.get("spec") or {}).get("router") or {}).get("route")
    if PLAN_ANNOTATION in annotations and isinstance(route, dict) and (route.get("http") or {}).get("spec"):
        obj["spec"]["router"]["route"] = {}
        del annotations[PLAN_ANNOTATION]
    return obj
