# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: baseline_twin
short_description: The baseline twin of a speculative-decoding InferenceService, for an A/B benchmark
version_added: 0.1.0
description:
  - Takes an InferenceService as read from the cluster and returns the manifest of its baseline twin, the
    same C(spec) with every speculative flag (C(--speculative-config) in every form, C(--spec-method), ...)
    cut out of the predictor's C(command) and C(args), exactly as the rollback strips it.
  - The twin's metadata keeps the labels and annotations (the deployment mode among them) and adds the label
    C(spec-decoding.alauda.io/baseline-twin=true) and the annotation C(spec-decoding.alauda.io/baseline-twin-of).
    The C(kubectl.kubernetes.io/last-applied-configuration) and rollback-backup annotations are dropped.
  - Fails when the InferenceService runs no speculative decoding (it already is a baseline).
  - A KServe C(LLMInferenceService) (C(kind) V(LLMInferenceService)) gets the same twin with the flag removed from every
    pool (argv, C(bash -c) script, C(VLLM_ADDITIONAL_ARGS)), token-exact as its rollback does. It fails when a C(baseRefs)
    preset supplies the flag (pass O(flags)) or the router names a shared HTTPRoute or InferencePool.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The InferenceService (for example C(resources[0]) of M(kubernetes.core.k8s_info)).
    type: dict
    required: true
  name:
    description: Name of the twin; default the source name plus O(suffix).
    type: str
  suffix:
    description: Suffix added to the source name when O(name) is not given.
    type: str
    default: -baseline
  flags:
    description:
      - LLMInferenceService only; the C(flags) that M(alauda.spec_decoding.llmisvc_speculative) found (with the baseRefs
        presets). Without them only the resource's own flags are seen.
    type: list
    elements: dict
"""

EXAMPLES = r"""
- name: Manifest of the baseline twin of llama-eagle3 (llama-eagle3-baseline)
  ansible.builtin.set_fact:
    twin: "{{ candidate.resources[0] | alauda.spec_decoding.baseline_twin }}"
"""

RETURN = r"""
_value:
  description: The twin's manifest (apiVersion, kind, metadata with name, namespace, labels and annotations, spec).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import baseline_twin as bench_twin
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import twin as llmisvc_twin
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.plain_data import plain_arguments


@plain_arguments  # the twin deep-copies the object: not Ansible's lazy containers (plugin_utils/plain_data.py)
def baseline_twin(isvc, name=None, suffix=bench_twin.DEFAULT_SUFFIX, flags=None):
    """InferenceService dict -> the manifest of its baseline twin."""
    if not isinstance(isvc, dict):
        raise AnsibleFilterError("baseline_twin: expects an InferenceService (a dict), got %s; pass resources[0] of "
                                 "kubernetes.core.k8s_info" % type(isvc).__name__)
    try:
        if isvc.get("kind") == llmisvc_model.KIND:
            return llmisvc_twin.baseline_twin(isvc, name=name or None, suffix=suffix or None, found_flags=flags)
        return bench_twin.baseline_twin(isvc, name=name or None, suffix=suffix or bench_twin.DEFAULT_SUFFIX)
    except SpecDecodingError as exc:
        raise AnsibleFilterError("baseline_twin: %s" % exc) from exc


class FilterModule:
    """Benchmark filters."""

    def filters(self):
        return {"baseline_twin": baseline_twin}
