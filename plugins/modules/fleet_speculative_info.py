#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_speculative_info
short_description: Which of many KServe InferenceServices and LLMInferenceServices pass a speculative flag to vLLM, read with a LIST per namespace
version_added: 0.1.0
description:
  - Reads every service a selection names (O(names), O(namespaces) or O(all_namespaces), narrowed by O(label_selector))
    with one LIST per namespace and kind instead of a GET per service; with O(all_namespaces) one cluster-wide LIST,
    or, when RBAC refuses it, one LIST per namespace.
  - A namespace that refuses its LIST (403) is reported in RV(forbidden) and C(totals.forbidden_namespaces); the other
    namespaces are read all the same.
  - Resolves for each InferenceService the runtime KServe selects (ServingRuntimes from one LIST per namespace,
    ClusterServingRuntimes from one LIST) and the merged C(kserve-container), as M(alauda.spec_decoding.serving_runtime_info)
    does for one; for each LLMInferenceService every pool and container through the presets KServe merges
    (LLMInferenceServiceConfigs from one LIST per namespace and one in O(llmisvc_system_namespace)).
  - Says per service whether a speculative flag reaches vLLM and from where (the InferenceService's command, args or
    env, the ServingRuntime or ClusterServingRuntime, a preset), and the run's totals, the API requests it made among them.
  - An API server that does not answer (connection refused, reset or timed out) fails the module with one message naming
    it (field C(kubeconfig)).
  - Reads only. Pods are not read; the engine line on the pods (M(alauda.spec_decoding.engine_config_info)) proves what runs.
author:
  - Alauda Platform Team (@alauda)
options:
  names:
    description:
      - Services to read, each as C(namespace/name) (or a mapping with C(namespace) and C(name)), of any kind in O(kinds).
      - Read with one LIST per namespace (a field selector on the name when the namespace has one), whatever O(label_selector) says.
      - A name that is not found is returned with C(found=false).
    type: list
    elements: raw
    default: []
  namespaces:
    description: Namespaces whose services (those matching O(label_selector)) are read, one LIST per namespace and kind.
    type: list
    elements: str
    default: []
  all_namespaces:
    description:
      - Read the services of every namespace (matching O(label_selector)) with one cluster-wide LIST per kind; when RBAC
        refuses it, list the namespaces and read them one by one.
      - Not together with O(namespaces).
    type: bool
    default: false
  label_selector:
    description: A Kubernetes label selector (C(app=llm,tier!=dev)) that the selected namespaces' services must match.
    type: str
  kinds:
    description: The kinds to read.
    type: list
    elements: str
    choices: [InferenceService, LLMInferenceService]
    default: [InferenceService, LLMInferenceService]
  llmisvc_system_namespace:
    description: KServe's namespace, where LLMInferenceServiceConfig presets not found in a service's namespace are looked up.
    type: str
    default: kserve
  llmisvc_config_prefix:
    description:
      - The prefix of KServe's well-known preset names (the controller's C(LLM_INFERENCE_SERVICE_CONFIG_PREFIX)), which
        decides the presets an LLMInferenceService merges.
    type: str
    default: kserve-
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
notes:
  - Needs C(list) on C(inferenceservices), C(llminferenceservices), C(servingruntimes) and C(llminferenceserviceconfigs) in
    the namespaces read and on C(clusterservingruntimes); with O(all_namespaces) C(list) on them cluster-wide, or on
    C(namespaces).
  - A service without the flag costs at most its share of these LISTs; C(totals.api_requests) counts them.
seealso:
  - module: alauda.spec_decoding.serving_runtime_info
  - module: alauda.spec_decoding.isvc_speculative
"""

EXAMPLES = r"""
- name: Which services of the model namespaces run speculative decoding?
  alauda.spec_decoding.fleet_speculative_info:
    namespaces: [llm-team-a, llm-team-b]
    label_selector: app.kubernetes.io/part-of=llm
  register: fleet

- name: Show those with the flag and where it comes from
  ansible.builtin.debug:
    msg: "{{ item.namespace }}/{{ item.name }}: {{ item.sources | join(', ') }}"
  loop: "{{ fleet.services | selectattr('speculative') }}"
  loop_control:
    label: "{{ item.namespace }}/{{ item.name }}"

- name: Every namespace, or those the caller may read
  alauda.spec_decoding.fleet_speculative_info:
    all_namespaces: true
    kinds: [InferenceService]
"""

RETURN = r"""
services:
  description:
    - One record per service read (and per named service not found), sorted by kind, namespace and name.
    - C(speculative) - a speculative flag reaches vLLM (null for a service not found).
    - C(sources) - where the flags that reach vLLM come from, in command-line order (V(inference_service),
      V(serving_runtime), V(cluster_serving_runtime); for an LLMInferenceService V(resource) or C(LLMInferenceServiceConfig/<name>)).
    - C(where) - each occurrence - C(source), C(field) (V(command), V(args), V(env), V(command/args)), C(flag), C(form), and
      C(reaches_engine) (false for args a C(bash -c) command never passes on); for an LLMInferenceService also C(pool) and C(container).
    - C(runtime) - kind and name of the runtime KServe selects (InferenceService). C(speculative_config) - what vLLM receives.
    - C(ready), C(up_to_date) - the InferenceService's Ready condition and whether it is at its generation; C(generation),
      C(observed_generation) - C(metadata.generation) and C(status.observedGeneration) (a rollout in progress when the second
      is lower); C(stripped_by_rollback) - it carries the backup annotation of an earlier rollback.
    - C(error) - why the service could not be judged (the others are judged all the same); C(warnings) - what was not checked.
    - C(undecided) - why C(speculative) may be wrong although the service was read (its runtime could not be found or read,
      an LLMInferenceService preset could not be listed, a flag hidden where the reader cannot see), else null. The
      C(alauda.spec_decoding.rollback) role acts on such a service as on one with the flag.
  returned: always
  type: list
  elements: dict
  sample:
    - {kind: InferenceService, namespace: llm-a, name: llama, found: true, speculative: true, sources: [cluster_serving_runtime],
       where: [{source: cluster_serving_runtime, field: args, flag: "--speculative-config", form: argv, reaches_engine: true}],
       runtime: {kind: ClusterServingRuntime, name: vllm}, speculative_config: {method: ngram, num_speculative_tokens: 3},
       ready: true, up_to_date: true, error: null, warnings: [], undecided: null}
api_server:
  description: The URL of the API server that was read (from the kubeconfig and context).
  returned: always
  type: str
  sample: https://api.cluster-a.example.com:6443
forbidden:
  description: Each LIST the API server refused, with the kind, the namespace (null for a cluster-wide LIST), the status and its message.
  returned: always
  type: list
  elements: dict
totals:
  description:
    - The run's figures - C(services) read, C(with_flag), C(without_flag), C(errors), C(not_found), C(forbidden_namespaces),
      C(kinds_not_served) (kinds whose CRD the API server does not serve), C(api_requests) (every request the run made),
      C(api_requests_by) (by verb and resource) and C(api_requests_per_service).
  returned: always
  type: dict
  sample: {services: 12, with_flag: 4, without_flag: 8, errors: 0, not_found: 0, forbidden_namespaces: [llm-c],
           kinds_not_served: [], api_requests: 9, api_requests_by: {"LIST inferenceservices": 3}, api_requests_per_service: 0.75}
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet


def argument_spec():
    return argspec(
        names=dict(type="list", elements="raw", default=[]),
        namespaces=dict(type="list", elements="str", default=[]),
        all_namespaces=dict(type="bool", default=False),
        label_selector=dict(type="str"),
        kinds=dict(type="list", elements="str", choices=list(fleet.KINDS), default=list(fleet.KINDS)),
        llmisvc_system_namespace=dict(type="str", default="kserve"),
        llmisvc_config_prefix=dict(type="str", default="kserve-"),
    )


def execute(module):
    fleet.check_params(module.params)  # before the client is built: a selection of nothing needs no cluster
    result = fleet.run(lambda: module.api_client, module.params)  # built inside: a cluster that is down is named
    result["changed"] = False
    return result


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        mutually_exclusive=[("namespaces", "all_namespaces")],
    ),
    failure=dict(
        failed={"changed": False},
        unexpected="fleet_speculative_info",
    ),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
