# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: isvc_readiness
short_description: Whether a KServe InferenceService object is Ready at its current generation
version_added: 0.2.0
description:
  - Reads an InferenceService object (as returned by M(kubernetes.core.k8s) or M(kubernetes.core.k8s_info)) the way
    M(alauda.spec_decoding.isvc_wait) does, without a module run or an API call.
  - The C(alauda.spec_decoding.inference_service) role uses it after a server-side apply that changed nothing; when the
    object it got back is already Ready at its generation, waiting would return at once, so no wait is run.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The InferenceService object (a dict with C(metadata) and C(status)).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Skip the wait when the apply changed nothing and the InferenceService is Ready at its generation
  alauda.spec_decoding.isvc_wait:
    name: llama-eagle3
    namespace: models
  when: applied.changed or not ((applied.result | alauda.spec_decoding.isvc_readiness).ready_at_generation)
"""

RETURN = r"""
_value:
  description: The readiness the wait checks.
  type: dict
  contains:
    ready:
      description: The Ready condition is True.
      type: bool
    generation:
      description: C(metadata.generation).
      type: int
    observed_generation:
      description: C(status.observedGeneration) (or the Ready condition's).
      type: int
    up_to_date:
      description: The controller has observed the current generation.
      type: bool
    ready_at_generation:
      description: C(ready) and C(up_to_date) - what M(alauda.spec_decoding.isvc_wait) waits for.
      type: bool
    reason:
      description: The Ready condition's reason.
      type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers


def isvc_readiness(obj):
    if not isinstance(obj, dict):
        raise AnsibleFilterError("isvc_readiness expects an InferenceService object (a dictionary), got %s" % type(obj).__name__)
    state = isvc_readers.readiness(obj)
    return dict(state, ready_at_generation=bool(state["ready"] and state["up_to_date"]))


class FilterModule:
    """Readiness of an InferenceService object, as isvc_wait reads it."""

    def filters(self):
        return {"isvc_readiness": isvc_readiness}
