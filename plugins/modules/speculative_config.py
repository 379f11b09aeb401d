#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: speculative_config
short_description: Validate a vLLM speculative-decoding config and render it as canonical JSON
version_added: 0.1.0
description:
  - Checks a value for vLLM's C(--speculative-config) against what the given vLLM release accepts
    (methods, keys, value ranges, method-specific requirements), for vLLM 0.10 to 0.34, one table per release
    read from that release's own source. A newer release is validated against the newest table, with a warning.
  - Returns the config as compact JSON with a stable key order (C(method), C(model),
    C(num_speculative_tokens), then the rest sorted), so the same config always renders to the same bytes.
  - Returns advice that does not stop a rollout (for example that ngram turns async scheduling off) as
    O(ignore:warnings) and also shows it as Ansible warnings.
  - Without O(vllm_version) the config is validated against the newest vLLM release the collection knows,
    and a warning says so.
author:
  - Alauda Platform Team (@alauda)
options:
  config:
    description:
      - The speculative config, as a mapping or a JSON string (what follows C(--speculative-config)).
      - Hyphens in keys are read as underscores, as vLLM does.
    type: raw
  preset:
    description:
      - Start from one of the guide's conservative presets instead of O(config).
      - V(ngram) is C({"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}).
      - V(eagle3) is C({"method":"eagle3","num_speculative_tokens":3}) and needs C(model) in O(overrides).
      - V(draft_model) is C({"method":"draft_model","num_speculative_tokens":3}) and needs C(model) in O(overrides).
      - V(mtp) is C({"method":"mtp","num_speculative_tokens":1}).
    type: str
    choices: [ngram, eagle3, draft_model, mtp]
  overrides:
    description:
      - Keys merged over the O(preset), for example the draft C(model) path.
    type: dict
  vllm_version:
    description:
      - vLLM release of the runtime image, for example V(0.32.0). Methods and keys are checked for it.
    type: str
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
notes:
  - Pure computation on the controller; nothing is contacted or written.
seealso:
  - name: vLLM speculative decoding
    description: Upstream documentation of the config keys.
    link: https://docs.vllm.ai/en/latest/features/spec_decode.html
"""

EXAMPLES = r"""
- name: Canonical JSON for the guide's EAGLE-3 starting point
  alauda.spec_decoding.speculative_config:
    preset: eagle3
    overrides:
      model: /mnt/models/draft
    vllm_version: "0.32.0"
  register: spec

- name: Validate a hand-written ngram config
  alauda.spec_decoding.speculative_config:
    config: '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
    vllm_version: "0.24.1"

- name: Use the canonical string in a command
  ansible.builtin.debug:
    msg: "--speculative-config '{{ spec.json }}'"
"""

RETURN = r"""
json:
  description: The config as compact JSON with a stable key order.
  returned: success
  type: str
  sample: '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'
config:
  description:
    - The normalised config (hyphens in keys turned into underscores, as vLLM 0.26 and newer do).
    - For an older O(vllm_version), which reads the keys as written, a hyphenated key is refused.
  returned: success
  type: dict
  sample: {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
warnings:
  description: Advice that does not block the rollout; also shown as Ansible warnings.
  returned: success
  type: list
  elements: str
  sample: ["draft weights are not counted in --gpu-memory-utilization: leave headroom for the draft model"]
vllm_version:
  description: The vLLM release the config was validated against.
  returned: success
  type: str
  sample: "0.32.0"
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract


def argument_spec():
    return dict(
        config=dict(type="raw"),
        preset=dict(type="str", choices=sorted(core.PRESETS)),
        overrides=dict(type="dict"),
        vllm_version=dict(type="str"),
    )


def execute(module):
    params = module.params
    if params["preset"]:
        result = core.from_preset(params["preset"], params["overrides"], params["vllm_version"])
    else:
        result = core.validate(params["config"], vllm_version=params["vllm_version"])
    for warning in result.warnings:
        module.warn(warning)
    # module.warn() also puts them in the result's `warnings` list (the documented return).
    returned = result.as_dict()
    del returned["warnings"]
    return dict(changed=False, **returned)


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        mutually_exclusive=[("config", "preset"), ("config", "overrides")],
        required_one_of=[("config", "preset")],
    ),
    cluster=False,
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
