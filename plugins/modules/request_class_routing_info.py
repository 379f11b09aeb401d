#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: request_class_routing_info
short_description: Show, from the serving pods' answers, that each request class reaches the pool the routing plan says
version_added: 0.1.0
description:
  - Sends requests of each class of the routing plan (issue 52, the benchmark role's C(benchmark_routing_plan)) through the
    gateway with the plan's class header, and one request without it, and tells from each answer which pool served it.
  - The speculative pool's vLLM (0.32 or later, with C(--per-request-spec-decode-metrics), which the deploy renders)
    writes C(metrics.speculative_decoding) into every answer to a completion that is not streamed and has C(n=1); the
    baseline pool cannot run that flag, so its answers carry no such block. Nothing the gateway says is read.
  - Fails naming the first class that reached another pool than the plan says, the pool expected and the pool seen.
author:
  - Alauda Platform Team (@alauda)
options:
  gateway_url:
    description: The gateway's address as this host reaches it (an OpenAI-compatible base URL; a trailing C(/v1) is optional).
    type: str
    required: true
  route:
    description:
      - The routing plan's HTTPRoute (the benchmark role's C(<benchmark_report_name>-httproute.yaml)), the
        LLMInferenceService part that carries the plan's rules in its router, or the plan itself (filter
        C(alauda.spec_decoding.routing_plan) with C(render=plan)).
      - The pool each class is meant for is the plan's annotation C(spec-decoding.alauda.io/routing-plan).
    type: raw
  route_name:
    description: The plan's HTTPRoute, read live from O(namespace) (instead of O(route)).
    type: str
  namespace:
    description: The namespace of O(route_name).
    type: str
  class_header:
    description: The header that carries the class; default the one the plan's rules match on.
    type: str
  prompts:
    description: Per class, the prompts to send (a list of strings per class name); a class not named gets O(default_prompt).
    type: dict
  default_prompt:
    description: The prompt of a class without O(prompts), and of the request without a class.
    type: str
    default: "Say hello in one short sentence."
  requests_per_class:
    description: How many times O(default_prompt) is sent for a class without O(prompts).
    type: int
    default: 1
  unclassified:
    description: Also send one request without the class header; the plan's default rule must send it to its default pool.
    type: bool
    default: true
  model:
    description: The served model name; default the first of C(GET /v1/models) through the gateway.
    type: str
  max_tokens:
    description: Tokens per answer.
    type: int
    default: 16
  timeout:
    description: Seconds per request.
    type: float
    default: 120
  gateway_token:
    description: A bearer token for the gateway.
    type: str
  gateway_validate_certs:
    description: Verify the gateway's TLS certificate (O(validate_certs) is the API server's, for O(route_name)).
    type: bool
    default: true
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0 (with O(route_name) only)
"""

EXAMPLES = r"""
- name: Show that each class reaches its pool
  alauda.spec_decoding.request_class_routing_info:
    gateway_url: http://inference-gateway.gateways.svc
    route: "{{ lookup('ansible.builtin.file', '/tmp/spec-decoding-report/report-httproute.yaml') | from_yaml }}"
    prompts:
      code: ["Repeat this list: alpha, beta, gamma, alpha, beta, gamma"]
  register: routed

- name: The same, with the live HTTPRoute
  alauda.spec_decoding.request_class_routing_info:
    gateway_url: https://gateway.example.com
    route_name: llama-classes
    namespace: models
"""

RETURN = r"""
classes:
  description:
    - Per class (and C((unclassified)) for the request without the header) C(expected_pool), C(seen_pool) (null when the
      answers came from both pools or none), C(seen_pools), C(requests), C(answered), C(errors), C(evidence), C(ok), and
      C(acceptance) (vLLM's counters summed over the speculative pool's blocks, or null).
    - Also in the failed result.
  returned: always
  type: list
  elements: dict
class_header:
  description: The header the requests carried.
  returned: success
  type: str
model:
  description: The model name the requests named.
  returned: success
  type: str
speculative_classes:
  description: The classes the plan sends to the speculative pool.
  returned: success
  type: list
  elements: str
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import verify_classes


def argument_spec():
    return argspec(
        gateway_url=dict(type="str", required=True),
        route=dict(type="raw"),
        route_name=dict(type="str"),
        namespace=dict(type="str"),
        class_header=dict(type="str"),
        prompts=dict(type="dict"),
        default_prompt=dict(type="str", default="Say hello in one short sentence."),
        requests_per_class=dict(type="int", default=1),
        unclassified=dict(type="bool", default=True),
        model=dict(type="str"),
        max_tokens=dict(type="int", default=16, no_log=False),
        timeout=dict(type="float", default=120),
        gateway_token=dict(type="str", no_log=True),
        gateway_validate_certs=dict(type="bool", default=True),
    )


def execute(module):
    return verify_classes.run(module.api_client if module.params.get("route_name") and not module.params.get("route") else None,
                              module.params)


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(mutually_exclusive=[("route", "route_name")], required_one_of=[("route", "route_name")],
                     required_by={"route_name": ("namespace",)}),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
