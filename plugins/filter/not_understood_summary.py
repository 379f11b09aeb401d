# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: not_understood_summary
short_description: The verify summary's line for what a newer vLLM printed that the collection does not know
version_added: 0.2.0
description:
  - Takes the C(not_understood) lists of M(alauda.spec_decoding.engine_config_info) and
    M(alauda.spec_decoding.speculative_metrics_info) (joined) and returns the line the C(alauda.spec_decoding.verify) role
    prints - C(not understood) then the reasons, joined by C( | ), each once in the order first seen - or an empty
    string when there is nothing to say.
  - The LLMInferenceService summary (M(alauda.spec_decoding.llmisvc_engine_config_info)) writes the same line with the
    same code.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The C(not_understood) items, each a dict with a C(reason).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Print what the engine line and /metrics held that this collection does not know
  ansible.builtin.debug:
    msg: "{{ (engine.not_understood + acceptance.not_understood) | alauda.spec_decoding.not_understood_summary }}"
"""

RETURN = r"""
_value:
  description: The summary line, or an empty string when no item has a reason.
  type: str
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood


def not_understood_summary(items):
    return not_understood.summary_line(items) or ""


class FilterModule:
    """The verify summary's "not understood" line."""

    def filters(self):
        return {"not_understood_summary": not_understood_summary}
