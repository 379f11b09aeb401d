# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: speculative_config_json
short_description: Render a vLLM speculative config as canonical JSON
version_added: 0.1.0
description:
  - Validates the config like M(alauda.spec_decoding.speculative_config) and returns compact JSON with a
    stable key order (C(method), C(model), C(num_speculative_tokens), then the rest sorted).
  - Fails with the same messages as the module on invalid input.
author:
  - Alauda Platform Team (@alauda)
positional: vllm_version
options:
  _input:
    description: The config, a mapping or a JSON string.
    type: raw
    required: true
  vllm_version:
    description: vLLM release to validate against; the newest known release when omitted.
    type: str
"""

EXAMPLES = r"""
- name: Render the flag
  ansible.builtin.debug:
    msg: "--speculative-config '{{ {'method': 'eagle3', 'model': '/mnt/models/draft', 'num_speculative_tokens': 3}
      | alauda.spec_decoding.speculative_config_json('0.32.0') }}'"
"""

RETURN = r"""
_value:
  description: Canonical JSON string.
  type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core


def speculative_config_json(config, vllm_version=None):
    """dict or JSON string -> canonical JSON string."""
    try:
        return core.validate(config, vllm_version=vllm_version).json
    except SpecDecodingError as exc:
        raise AnsibleFilterError("speculative_config_json: %s" % exc) from exc


class FilterModule:
    """Speculative-config filters."""

    def filters(self):
        return {"speculative_config_json": speculative_config_json}
