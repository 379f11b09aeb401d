# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: llmisvc_verify_summary
short_description: The verify role's record and summary of a KServe LLMInferenceService
version_added: 0.2.0
description:
  - Takes the registered result of M(alauda.spec_decoding.llmisvc_engine_config_info) and of the loop of
    M(alauda.spec_decoding.speculative_metrics_info) over the decode pods, and returns the acceptance figures per decode
    pod and the summary lines the C(alauda.spec_decoding.verify) role prints.
  - One line for the resource (Ready at which generation), one per pool (its Deployment or LeaderWorkerSet, pods,
    groups and their leaders, the pod whose engine line counts, and the speculative config the engine runs), one per
    decode pod measured (the acceptance message).
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The registered result of M(alauda.spec_decoding.llmisvc_engine_config_info) (its C(pools) are read).
    type: dict
    required: true
  namespace:
    description: Namespace of the LLMInferenceService.
    type: str
    required: true
  name:
    description: Name of the LLMInferenceService.
    type: str
    required: true
  acceptance:
    description:
      - The registered result of the loop of M(alauda.spec_decoding.speculative_metrics_info) over the decode pods (its
        C(results); skipped items are left out; each item names its pod by the loop variable). Omit when no metrics were read.
    type: dict
  generation:
    description: The generation M(alauda.spec_decoding.isvc_wait) found Ready; shown as C(?) when omitted.
    type: int
"""

EXAMPLES = r"""
- name: Register the full verification data
  ansible.builtin.set_fact:
    verify_metrics_per_pod: "{{ summary.metrics }}"
    verify_summary_lines: "{{ summary.lines }}"
  vars:
    summary: >-
      {{ engine | alauda.spec_decoding.llmisvc_verify_summary(namespace='models', name='llama-eagle3',
                                                              acceptance=acceptance, generation=ready.generation) }}

# For a single-node decode pool the lines read like
# - "LLMInferenceService models/llama-eagle3: Ready at generation 2"
# - "pool decode (Deployment llama-eagle3-kserve, 2 pod(s), engine line from llama-eagle3-kserve-5d9c-abcde): method=eagle3
#    model=/mnt/models/draft num_spec_tokens=3"
# - "acceptance on llama-eagle3-kserve-5d9c-abcde: source=prometheus; mean acceptance length 2.41; draft acceptance 47.0%; ..."
"""

RETURN = r"""
_value:
  description: The acceptance figures of every decode pod measured, and the summary lines.
  type: dict
  contains:
    metrics:
      description: Per decode pod, C(mean_acceptance_length), C(draft_acceptance_rate), C(diagnosis) and C(msg) of its result.
      type: dict
    lines:
      description: The summary, one line for the resource, one per pool, one per decode pod measured.
      type: list
      elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import verify as llmisvc_verify
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.plain_data import plain_arguments


@plain_arguments  # plain data, not Ansible's lazy containers (plugin_utils/plain_data.py)
def llmisvc_verify_summary(engine, namespace, name, acceptance=None, generation=None):
    if not isinstance(engine, dict) or "pools" not in engine:
        raise AnsibleFilterError("llmisvc_verify_summary expects the registered result of llmisvc_engine_config_info (with pools), "
                                 "got %s" % (type(engine).__name__ if not isinstance(engine, dict) else "a dictionary without pools"))
    try:
        return llmisvc_verify.verify_summary(namespace, name, engine["pools"], acceptance=acceptance, generation=generation)
    except SpecDecodingError as exc:
        raise AnsibleFilterError("llmisvc_verify_summary: %s" % exc) from exc


class FilterModule:
    """The verify role's LLMInferenceService summary."""

    def filters(self):
        return {"llmisvc_verify_summary": llmisvc_verify_summary}
