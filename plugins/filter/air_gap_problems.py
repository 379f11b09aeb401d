# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: air_gap_problems
short_description: List every source an air-gapped deploy could not reach
version_added: 0.1.0
description:
  - Walks the artifacts, predictor environment, extra vLLM arguments and PVC staging items of a deploy and returns one
    message per source on the internet (public model hubs such as huggingface.co, C(hf://) and C(gs://) URIs, public
    container registries such as docker.io, quay.io or ghcr.io, image references without a registry host, public
    object stores). Each message names the field and the fix. An empty list means nothing needs the internet.
  - The role C(alauda.spec_decoding.inference_service) calls it first when C(spec_decoding_air_gapped) is true, so the run
    fails before anything is written.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description:
      - Dictionary with the optional keys C(artifacts) (dict), C(env) (dict), C(extra_args) (list),
        C(stage_items) (list of C({name, subdir, source}) ), C(stage_hf_endpoint) and C(stage_s3_endpoint).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Refuse internet sources in an air-gapped inventory
  ansible.builtin.fail:
    msg: "{{ problems | join(' | ') }}"
  vars:
    problems: "{{ {'artifacts': spec_decoding_artifacts} | alauda.spec_decoding.air_gap_problems }}"
  when: problems | length > 0
"""

RETURN = r"""
_value:
  description: One message per refused source, C(<field>) first and C(Fix) last; empty when everything is internal.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import air_gap


def air_gap_problems(spec):
    if not isinstance(spec, dict):
        raise AnsibleFilterError("air_gap_problems expects a dictionary (artifacts, env, extra_args, stage_items), got %s"
                                 % type(spec).__name__)
    return air_gap.messages(spec)


class FilterModule:
    """Air-gap checks."""

    def filters(self):
        return {"air_gap_problems": air_gap_problems}
