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
  - O(render=httproute) returns a Gateway API v1 C(HTTPRoute), one rule per class matching the header O(class_header)
    (and, for a class in O(model_aliases), the header O(model_header) a body-based router sets from the OpenAI C(model)),
    checked against the x-kubernetes-validations rules of Gateway API v1.6.1's HTTPRoute CRD (or the CRDs in
    O(gateway_api_crds)). O(render=llmisvc_route) returns the same rules as a KServe LLMInferenceService's
    C(spec.router.route). O(render=plan) returns the plan itself.
  - Fails naming the option and the fix on a Service name or port that is not one, a header name that is not one, an
    alias of a class the report does not hold, or more than 15 classes.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The benchmark report (a dict with C(classes), possibly null) or its C(classes) block.
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
    choices: [httproute, llmisvc_route, plan]
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
"""

EXAMPLES = r"""
- name: The HTTPRoute of the classes that gain
  ansible.builtin.set_fact:
    class_route: >-
      {{ lookup('ansible.builtin.file', bench.report_json) | from_json
         | alauda.spec_decoding.routing_plan(speculative_service={'name': 'llama-eagle3-predictor', 'port': 80},
                                             baseline_service={'name': 'llama-predictor', 'port': 80},
                                             namespace='models', parent_refs=[{'name': 'inference-gateway'}]) }}
"""

RETURN = r"""
_value:
  description:
    - O(render=httproute) the HTTPRoute manifest.
    - O(render=llmisvc_route) the LLMInferenceService C(spec.router.route) (C(http.spec) with C(parentRefs) and C(rules)).
    - O(render=plan) the plan (C(class_header), C(model_header), C(pools), C(classes), C(default_pool), C(speculative_classes)).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_plan as plans
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError

RENDERS = ("httproute", "llmisvc_route", "plan")


def routing_plan(report, speculative_service=None, baseline_service=None, render="httproute", name="spec-decoding-classes",
                 namespace=None, parent_refs=None, class_header=plans.DEFAULT_CLASS_HEADER, model_aliases=None,
                 model_header=plans.DEFAULT_MODEL_HEADER, gateway_api_crds=None):
    """Benchmark report (or its classes block) -> HTTPRoute, LLMInferenceService route or the plan."""
    if not isinstance(report, dict):
        raise AnsibleFilterError("routing_plan: expects the benchmark report (a dict), got %s; parse the report_json file "
                                 "with from_json" % type(report).__name__)
    if render not in RENDERS:
        raise AnsibleFilterError("routing_plan: render must be one of %s, got %r" % (", ".join(RENDERS), render))
    classes = report.get("classes") if "schema" in report or "decision" in report else report
    try:
        plan = plans.build_plan(classes, speculative_service, baseline_service, class_header=class_header,
                                model_aliases=model_aliases, model_header=model_header)
        if render == "plan":
            return plan
        if render == "llmisvc_route":
            return plans.llmisvc_route(plan, parent_refs)
        route = plans.httproute(plan, name, namespace, parent_refs)
        plans.check_httproute(route, gateway_api_crds)
        return route
    except SpecDecodingError as exc:
        raise AnsibleFilterError("routing_plan: %s" % exc) from exc


class FilterModule:
    """Routing plan filters."""

    def filters(self):
        return {"routing_plan": routing_plan}
