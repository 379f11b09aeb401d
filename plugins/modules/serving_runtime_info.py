#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_runtime_info
short_description: The effective vLLM command of a KServe InferenceService (its ServingRuntime merged in) and where the speculative flag comes from
version_added: 0.1.0
description:
  - Resolves the runtime KServe uses for the InferenceService (C(spec.predictor.model.runtime) as a ServingRuntime
    in its namespace, else a ClusterServingRuntime; without C(runtime) the one KServe auto-selects for the
    C(modelFormat)), takes its C(kserve-container) and lays the predictor's own fields over it the way KServe's
    C(MergeRuntimeContainers) does (the InferenceService's C(command) replaces the runtime's, C(args) are the
    runtime's followed by the InferenceService's, C({{.Name}}) placeholders are filled in).
  - Returns the merged command and args, the speculative config vLLM receives and C(source), where the flag vLLM
    takes comes from (C(inference_service), C(serving_runtime) or C(cluster_serving_runtime)).
  - With O(runtime_flag), fails when the flag would come from the runtime for a deploy (twice, or from the
    runtime alone), naming the runtime and its kind.
author:
  - Alauda Platform Team (@alauda)
options:
  name:
    description: InferenceService name (read from the cluster unless O(inference_service) is given).
    type: str
  namespace:
    description: Namespace of the InferenceService.
    type: str
    required: true
  inference_service:
    description:
      - An InferenceService manifest to resolve instead of the object on the cluster (e.g. the one a deploy is about
        to apply). Its runtimes are still read from the cluster.
    type: dict
  runtime_flag:
    description:
      - Deploy check. V(refuse) fails when C(--speculative-config) would appear both in the runtime and in the
        InferenceService; V(replace) lets the InferenceService's (the last one, the one vLLM takes) win with a warning.
        Either way a flag that only the runtime carries fails (the service would run a config it did not ask for).
      - Omitted - no check, only the report.
    type: str
    choices: [refuse, replace]
  missing_runtime:
    description:
      - V(fail) fails when the runtime cannot be found (as KServe would refuse the InferenceService); V(warn) returns
        C(runtime=null) with a warning (a deploy goes on and KServe reports the runtime in the status).
    type: str
    choices: [fail, warn]
    default: fail
  list_users:
    description: Also list every InferenceService that uses the same runtime (C(list) on inferenceservices).
    type: bool
    default: false
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
notes:
  - Needs C(get)/C(list) on C(servingruntimes) in the namespace and on C(clusterservingruntimes); without the
    cluster-scoped permission only namespaced runtimes are found (the result says so in C(warnings)).
seealso:
  - module: alauda.spec_decoding.isvc_speculative
  - module: alauda.spec_decoding.engine_config_info
"""

EXAMPLES = r"""
- name: Where does the speculative flag of llama come from?
  alauda.spec_decoding.serving_runtime_info:
    name: llama
    namespace: llm-demo
  register: effective

- name: Refuse a deploy whose flag the runtime also sets
  alauda.spec_decoding.serving_runtime_info:
    namespace: llm-demo
    inference_service: "{{ rendered.manifest }}"
    runtime_flag: refuse
"""

RETURN = r"""
runtime:
  description: Kind and name of the runtime (null for a custom predictor).
  returned: always
  type: dict
  sample: {"kind": "ClusterServingRuntime", "name": "vllm-runtime"}
runtime_object:
  description: The runtime as read from the cluster (null for a custom predictor).
  returned: always
  type: dict
command:
  description: The merged command of kserve-container.
  returned: always
  type: list
  elements: str
args:
  description: The merged args of kserve-container (runtime's first).
  returned: always
  type: list
  elements: str
command_from:
  description: Where the command list comes from (inference_service or the runtime's source name).
  returned: always
  type: str
args_reach_engine:
  description: False when the command is a shell script that does not pass its arguments on (then args never reach vLLM).
  returned: always
  type: bool
source:
  description: Where the speculative flag vLLM takes comes from, or null when there is none.
  returned: always
  type: str
  sample: cluster_serving_runtime
sources:
  description: Every source that passes a speculative flag to vLLM, in command-line order.
  returned: always
  type: list
  elements: str
speculative_config:
  description: The speculative config vLLM receives from the merged command (null when none).
  returned: always
  type: dict
speculative_config_error:
  description: Why the config could not be read (a shell expansion, not JSON), else null.
  returned: always
  type: str
ignored_flags:
  description: Flags in the args that a shell-script command never passes to vLLM.
  returned: always
  type: list
  elements: dict
flag_locations:
  description:
    - Where vLLM gets a speculative flag from. With a runtime, each source in command-line order (V(kserve-container)
      for the predictor's own, C(<kind> <name>) for the runtime's). Without one (a custom predictor, or a runtime not
      found), every predictor container whose command or args carry the flag in any form.
  returned: always
  type: list
  elements: str
  sample: ["ClusterServingRuntime vllm-runtime"]
unreadable_scripts:
  description:
    - One line per shell script (C(bash -c) and the like) in the predictor's containers or the runtime's that does not
      parse, naming the container and why (an unterminated quote). No shell runs such a script, so no flag is found in
      it and the pod crash-loops; verify names it instead of reporting a missing flag.
  returned: always
  type: list
  elements: str
flag_source:
  description: RV(source) with a runtime; without one V(inference_service) when a predictor container carries the flag, else null.
  returned: always
  type: str
inference_service:
  description: The InferenceService as read from the cluster (so a caller needs no second read).
  returned: when O(name) is given and O(inference_service) is not
  type: dict
users:
  description: namespace/name of every InferenceService using the runtime.
  returned: when list_users is true and there is a runtime
  type: list
  elements: str
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec


def argument_spec():
    return argspec(
        name=dict(type="str"),
        namespace=dict(type="str", required=True),
        inference_service=dict(type="dict"),
        runtime_flag=dict(type="str", choices=["refuse", "replace"]),
        list_users=dict(type="bool", default=False),
        missing_runtime=dict(type="str", choices=["fail", "warn"], default="fail"),
    )


def execute(module):
    result, warnings, problem = runtime_readers.runtime_info(module.api_client, module.params)
    for warning in warnings:
        module.warn(warning)
    if problem:
        module.fail_json(msg=problem, **result)
    return result


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        required_one_of=[("name", "inference_service")],
    ),
    failure=dict(
        failed={"changed": False},
        unexpected="serving_runtime_info",
    ),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
