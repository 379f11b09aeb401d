# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: routing_plan
short_description: Route each request class to the pool that serves it best, from a benchmark report
version_added: 0.1.0
description:
  - Takes the JSON report of M(alauda.spec_decoding.spec_benchmark) (its C(report_json) file, parsed) or its C(classes)
    block. The classes whose per-class decision is C(keep) go to the speculative pool's Service; the other classes, and
    every request that names no class or a class the benchmark did not measure, go to the baseline pool's Service (the
    route's default rule), so an unclassified request is served as it is without speculative decoding.
  - A report without request classes (no prompt named a C(class)) gives a route with the default rule alone.
  - O(guard), the load sweep's per-class guard at its target load (M(alauda.spec_decoding.spec_sweep)'s C(classes), as
    C(tune.yml) produces it), holds back a class the A/B keeps when its break-even load is below the sweep's target load or
    it does not meet keep at the target's sweep point; that class goes to the baseline, with the guard's reason in the plan.
  - The input may also be the sweep itself (its JSON file parsed, its result, or its C(classes)) - the classes' decisions at
    the sweep's target load, guarded by the same sweep.
  - O(render=httproute) returns a Gateway API v1 C(HTTPRoute), one rule per class matching the header O(class_header)
    (and, for a class in O(model_aliases), the header O(model_header) a body-based router sets from the OpenAI C(model)),
    checked against the x-kubernetes-validations rules of Gateway API v1.6.1's HTTPRoute CRD (or the CRDs in
    O(gateway_api_crds)). O(render=llmisvc_route) returns the same rules as a KServe LLMInferenceService's
    C(spec.router.route). O(render=llmisvc) returns the part of the LLMInferenceService O(llmisvc_name) that carries
    them (C(apiVersion), C(kind), C(metadata), C(spec.router.route)), checked against KServe v0.20's CRD rules - what a
    server-side apply of the route sends; KServe's controller writes the HTTPRoute C(<name>-kserve-route) from it, the
    rules replacing its C(config-llm-router-route) preset's, the preset's default Gateway as the parent unless
    O(parent_refs) are given. O(render=plan) returns the plan itself.
  - Fails naming the option and the fix on a Service name or port that is not one, a header name that is not one, an
    alias of a class the report does not hold, or more than 15 classes.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description:
      - The benchmark report (a dict with C(classes), possibly null) or its C(classes) block.
      - Or a load sweep with a target load (its JSON file parsed, the spec_sweep result, or its C(classes) block).
    type: dict
    required: true
  speculative_service:
    description: "The speculative pool's Service: C(name), C(port), and C(namespace) when it is not the route's."
    type: dict
    required: true
  baseline_service:
    description: "The baseline pool's Service: C(name), C(port), and C(namespace) when it is not the route's."
    type: dict
    required: true
  render:
    description: What to return.
    type: str
    choices: [httproute, llmisvc_route, llmisvc, plan]
    default: httproute
  name:
    description: The HTTPRoute's name (O(render=httproute)).
    type: str
    default: spec-decoding-classes
  namespace:
    description: The HTTPRoute's namespace (O(render=httproute)); omitted when not given.
    type: str
  parent_refs:
    description: The Gateways the route attaches to, each with C(name) and optionally C(namespace) and C(sectionName).
    type: list
    elements: dict
  class_header:
    description: The request header the clients name their class in.
    type: str
    default: x-request-class
  model_aliases:
    description: A model name per class (C(class) to C(model)) the clients may send instead of the header.
    type: dict
  model_header:
    description: The header a body-based router puts the request's C(model) in.
    type: str
    default: X-Gateway-Model-Name
  gateway_api_crds:
    description: A Gateway API CRD file or directory (the cluster's own) to check the HTTPRoute against instead of v1.6.1's.
    type: path
  llmisvc_name:
    description: The LLMInferenceService whose router carries the rules (O(render=llmisvc)), the speculative one.
    type: str
  api_version:
    description: The LLMInferenceService's API version (O(render=llmisvc)).
    type: str
    default: v1alpha2
  model_routing:
    description:
      - Whether model-based routing is on for the LLMInferenceService (O(render=llmisvc)); without it KServe's controller
        drops every match on its model-routing header (C(X-Gateway-Model-Name)), so O(model_aliases) on that header are refused.
    type: bool
    default: false
  guard:
    description:
      - The load sweep's per-class guard, measured with a target load (C(target_qps)) - the sweep's JSON file parsed, the
        M(alauda.spec_decoding.spec_sweep) result (C(tune_result)) or its C(classes) block.
      - A class whose break-even load is below the target load, or that does not meet keep at the target's sweep point, is
        routed to the baseline even when the A/B keeps it; a class the sweep did not measure keeps the A/B's pool.
      - Omitted, null or an empty dict - no guard. Fails naming O(guard) when the sweep had no target load or measured no class.
    type: dict
"""

EXAMPLES = r"""
- name: The classes that gain, in the speculative LLMInferenceService's own router
  ansible.builtin.set_fact:
    llmisvc_route: >-
      {{ lookup('ansible.builtin.file', bench.report_json) | from_json
         | alauda.spec_decoding.routing_plan(render='llmisvc', llmisvc_name='llama-ngram', namespace='models',
                                             speculative_service={'name': 'llama-ngram-kserve-workload-svc', 'port': 8000},
                                             baseline_service={'name': 'llama-ngram-baseline-kserve-workload-svc', 'port': 8000}) }}

- name: The HTTPRoute of the classes that gain
  ansible.builtin.set_fact:
    class_route: >-
      {{ lookup('ansible.builtin.file', bench.report_json) | from_json
         | alauda.spec_decoding.routing_plan(speculative_service={'name': 'llama-eagle3-predictor', 'port': 80},
                                             baseline_service={'name': 'llama-predictor', 'port': 80},
                                             namespace='models', parent_refs=[{'name': 'inference-gateway'}]) }}

- name: The same, each class kept only where the load sweep's break-even is not below its target load
  ansible.builtin.set_fact:
    class_route: >-
      {{ lookup('ansible.builtin.file', bench.report_json) | from_json
         | alauda.spec_decoding.routing_plan(speculative_service={'name': 'llama-eagle3-predictor', 'port': 80},
                                             baseline_service={'name': 'llama-predictor', 'port': 80},
                                             guard=lookup('ansible.builtin.file', tune_result.report_json) | from_json) }}
"""

RETURN = r"""
_value:
  description:
    - O(render=httproute) the HTTPRoute manifest.
    - O(render=llmisvc_route) the LLMInferenceService C(spec.router.route) (C(http.spec) with C(parentRefs) and C(rules)).
    - O(render=llmisvc) the LLMInferenceService's part with that route, annotated with the plan's summary.
    - O(render=plan) the plan (C(class_header), C(model_header), C(pools), C(classes), C(default_pool), C(speculative_classes)).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_plan as plans
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.plain_data import plain_arguments

RENDERS = ("httproute", "llmisvc_route", "llmisvc", "plan")


@plain_arguments  # plain data, not Ansible's lazy containers (plugin_utils/plain_data.py)
def routing_plan(report, speculative_service=None, baseline_service=None, render="httproute", name="spec-decoding-classes",
                 namespace=None, parent_refs=None, class_header=plans.DEFAULT_CLASS_HEADER, model_aliases=None,
                 model_header=plans.DEFAULT_MODEL_HEADER, gateway_api_crds=None, guard=None, llmisvc_name=None,
                 api_version=None, model_routing=False):
    """Benchmark report (or its classes block, or a sweep) -> HTTPRoute, LLMInferenceService route or the plan."""
    if not isinstance(report, dict):
        raise AnsibleFilterError("routing_plan: expects the benchmark report (a dict), got %s; parse the report_json file "
                                 "with from_json" % type(report).__name__)
    if render not in RENDERS:
        raise AnsibleFilterError("routing_plan: render must be one of %s, got %r" % (", ".join(RENDERS), render))
    if isinstance(report.get("result"), dict) and "measurements" in report:  # the sweep's JSON file
        classes = report["result"].get("classes")
    else:
        classes = report.get("classes") if "schema" in report or "decision" in report else report
    try:
        plan = plans.build_plan(classes, speculative_service, baseline_service, class_header=class_header,
                                model_aliases=model_aliases, model_header=model_header, guard=guard)
        if render == "plan":
            return plan
        if render == "llmisvc_route":
            return plans.llmisvc_route(plan, parent_refs)
        if render == "llmisvc":
            return plans.llmisvc_router(plan, llmisvc_name, namespace, parent_refs, api_version, bool(model_routing))
        route = plans.httproute(plan, name, namespace, parent_refs)
        plans.check_httproute(route, gateway_api_crds)
        return route
    except SpecDecodingError as exc:
        raise AnsibleFilterError("routing_plan: %s" % exc) from exc


class FilterModule:
    """Routing plan filters."""

    def filters(self):
        return {"routing_plan": routing_plan}
