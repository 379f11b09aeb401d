#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_config_info
short_description: Prove which speculative config the running vLLM engine uses, from its engine-config log line
version_added: 0.1.0
description:
  - Finds vLLM's C(Initializing a V1 LLM engine (vX) with config:) line (and the V0 and older forms) in a
    log, wherever a process prefix, a collector timestamp or colour codes put it, and parses the vLLM
    version and C(speculative_config=SpeculativeConfig(method=..., model=..., num_spec_tokens=...)) or C(None).
  - Reads the log from O(log_text), O(log_path), or from every predictor pod of an InferenceService
    through the API server (O(name), O(namespace)); every pod is checked, not just the first.
  - Compares with O(expected) (or, for an InferenceService, with the C(--speculative-config) its predictor
    carries) and fails with both sides printed when they differ. C(*_mtp) aliases compare as C(mtp); a
    method vLLM guessed because the request omitted it is explained.
  - Also returns the speculative-decoding warnings the log carries (async scheduling disabled, min_p and
    logit_bias, deprecated method names) as RV(log_warnings).
  - Logs are streamed line by line (also from the API server), so memory stays bounded on huge logs.
  - A vLLM newer than the collection's tables may print fields or a method they do not know; the line is read as far as
    it can be (an unknown method still means speculative decoding is on), the rest is listed in RV(not_understood) and
    named in one warning.
author:
  - Alauda Platform Team (@alauda)
options:
  log_text:
    description: The log as text.
    type: str
  log_path:
    description: Path of a log file on the host that runs the module.
    type: path
  name:
    description:
      - Name of the InferenceService whose predictor pods' logs are read (label
        C(serving.kserve.io/inferenceservice=<name>)).
    type: str
  namespace:
    description: Namespace of the InferenceService.
    type: str
    default: default
  label_selector:
    description: Extra label selector ANDed with the InferenceService label, e.g. V(component=predictor).
    type: str
  container:
    description: Container whose log holds the vLLM output.
    type: str
    default: kserve-container
  since_seconds:
    description: With O(name), only read log lines newer than this many seconds.
    type: int
  tail_lines:
    description: With O(name), only read the last this many lines of each pod's log.
    type: int
  previous:
    description: With O(name), read the log of the previous (restarted) container instance.
    type: bool
    default: false
  expected:
    description:
      - What the engine must run. Keys left out are not compared.
    type: dict
    suboptions:
      enabled:
        description:
          - V(false) requires C(speculative_config=None) (for example after a rollback); V(true) requires
            speculative decoding without saying which.
        type: bool
      method:
        description: Expected method; C(*_mtp) aliases are normalised to C(mtp) as vLLM prints them.
        type: str
      model:
        description: Expected draft model path as vLLM sees it (for example V(/mnt/models/draft)).
        type: str
      num_speculative_tokens:
        description: Expected number of speculative tokens.
        type: int
  expected_from_inference_service:
    description:
      - When reading an InferenceService and O(expected) is not given, compare with the C(--speculative-config)
        (any form) found in its predictor's command/args; a predictor without the flag means C(enabled=false).
    type: bool
    default: true
  timeout:
    description: Seconds allowed for each API server request.
    type: int
    default: 60
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
  - kubernetes.core.k8s_auth_options
notes:
  - The kube auth options are used only with O(name).
  - Needs get/list on pods and get on pods/log (and get on inferenceservices) with O(name).
  - From vLLM 0.24 only data-parallel rank 0 prints the engine line.
seealso:
  - module: alauda.spec_decoding.speculative_metrics_info
"""

EXAMPLES = r"""
- name: Every predictor pod runs EAGLE-3 with the requested draft
  alauda.spec_decoding.engine_config_info:
    name: llama
    namespace: models
    expected:
      method: eagle3
      model: /mnt/models/draft
      num_speculative_tokens: 3
  register: engine

- name: After a rollback the engine runs without a proposer
  alauda.spec_decoding.engine_config_info:
    name: llama
    namespace: models
    expected:
      enabled: false

- name: Parse a saved log
  alauda.spec_decoding.engine_config_info:
    log_path: /tmp/vllm.log
"""

RETURN = r"""
found:
  description: Whether the engine-config line was found (in every pod, when reading an InferenceService).
  returned: always
  type: bool
vllm_version:
  description: vLLM version from the line (of the first pod that printed it).
  returned: always
  type: str
  sample: "0.32.0"
engine:
  description: V(V1) or V(V0).
  returned: always
  type: str
  sample: V1
speculative_config:
  description:
    - The printed speculative config, or null when the engine runs without one.
    - C(method), C(model), C(num_spec_tokens); any other field the line prints that the vLLM release's table knows, as
      printed. A method no table knows is kept as printed (speculative decoding is on) and listed in RV(not_understood).
  returned: always
  type: dict
  sample: {"method": "eagle3", "model": "/mnt/models/draft", "num_spec_tokens": 3}
not_understood:
  description:
    - What the engine line holds that the collection's tables do not know (a vLLM newer than them), such as an unknown
      SpeculativeConfig field, an unknown method, a speculative_config printed in another form or not at all.
    - Items have C(source) (V(engine_line)), C(name), C(reason), C(count), C(value) as printed where there is one, and
      C(pod) with O(name). Empty when everything was understood.
  returned: always
  type: list
  elements: dict
  sample: [{"source": "engine_line", "name": "my_proposer", "count": 1, "pod": "llama-predictor-7d9f-abcde",
            "reason": "method 'my_proposer' is unknown to the tables (vLLM 0.10 to 0.34): speculative decoding is on with it"}]
model:
  description: The model the engine serves (C(model=) at the start of the line); with a speculators-format checkpoint this
    is its verifier, not the path the command serves.
  returned: always
  type: str
  sample: /mnt/models/target
speculative_source:
  description:
    - Where speculative decoding comes from when the engine runs a proposer that no flag on the InferenceService (or, after
      a rollback, on the pod) explains, else null. V(speculators_checkpoint) names the C(checkpoint) served as the model and
      its C(verifier) (vLLM turns speculative decoding on from a C(speculators_config) in the checkpoint, with no flag);
      V(unexplained) when the pod's command has no flag and no speculator is served. C(message) and C(fix) say what to do.
      Always null with O(log_text) or O(log_path) (no pod spec to read).
  returned: always
  type: dict
  sample: {"kind": "speculators_checkpoint", "checkpoint": "/mnt/models/llama-eagle3-speculator", "verifier": "/mnt/models/llama",
           "message": "speculative decoding comes from the speculators-format checkpoint ...", "fix": "serve the target model ..."}
line:
  description: The engine-config line, colour codes removed.
  returned: when found
  type: str
pods:
  description: Per predictor pod (with O(name)).
  returned: with name
  type: list
  elements: dict
  sample: [{"name": "llama-predictor-7d9f-abcde", "found": true, "vllm_version": "0.32.0", "engine": "V1",
            "speculative_config": {"method": "ngram", "model": null, "num_spec_tokens": 5}, "differences": []}]
skipped_pods:
  description: Pods left out (being deleted, or finished), with the reason.
  returned: with name
  type: list
  elements: dict
engine_lines_seen:
  description: How many engine-config lines the log holds (a restarted engine prints another; the last one is reported).
  returned: with log_text or log_path
  type: int
configs_seen:
  description: The distinct configs of those lines when they differ (empty otherwise).
  returned: with log_text or log_path
  type: list
  elements: dict
log_warnings:
  description: Speculative-decoding warnings in the log, deduplicated, with a count (and the pod).
  returned: always
  type: list
  elements: dict
  sample: [{"kind": "async_scheduling_disabled", "level": "WARNING", "count": 1,
            "message": "Async scheduling not supported with ngram-based speculative decoding and will be disabled."}]
expected:
  description: What was compared against (from O(expected) or the InferenceService's flag), null when nothing was.
  returned: always
  type: dict
differences:
  description: Human-readable differences between RV(expected) and the engine (empty on success).
  returned: always
  type: list
  elements: str
notes:
  description: Explanations that are not failures (method aliases, a method vLLM guessed).
  returned: always
  type: list
  elements: str
inference_service:
  description:
    - Ready/generation state and the speculative flag found in each predictor container (with O(name)).
    - C(flags) items have C(container), C(present), C(forms), C(config), C(error).
  returned: with name
  type: dict
  sample: {"ready": true, "generation": 2, "observed_generation": 2, "up_to_date": true,
           "speculative_flag_present": true, "flags": [{"container": "kserve-container", "present": true, "forms": ["argv"],
           "config": {"method": "ngram", "num_speculative_tokens": 5}, "error": null}]}
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import engine_config_info
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood


def argument_spec():
    return argspec(
        log_text=dict(type="str"),
        log_path=dict(type="path"),
        name=dict(type="str"),
        namespace=dict(type="str", default="default"),
        label_selector=dict(type="str"),
        container=dict(type="str", default="kserve-container"),
        since_seconds=dict(type="int"),
        tail_lines=dict(type="int"),
        previous=dict(type="bool", default=False),
        expected=dict(type="dict", options=dict(
            enabled=dict(type="bool"),
            method=dict(type="str"),
            model=dict(type="str"),
            num_speculative_tokens=dict(type="int", no_log=False),
        )),
        expected_from_inference_service=dict(type="bool", default=True),
        timeout=dict(type="int", default=60),
    )


def execute(module):
    result, problem = engine_config_info.engine_config(module.params, connect=lambda: module.api_client, warn=module.warn)
    if result["not_understood"]:
        module.warn(not_understood.warning(result["not_understood"]))
    if problem:
        module.fail_json(msg=problem, **result)
    return result


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        mutually_exclusive=[("log_text", "log_path", "name")],
        required_one_of=[("log_text", "log_path", "name")],
    ),
    module_options=dict(check_k8s=False, check_pyyaml=False),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
