# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: fleet_rollback_plan
short_description: Which services a fleet rollback acts on, from one fleet_speculative_info discovery
version_added: 0.1.0
description:
  - Takes the result of M(alauda.spec_decoding.fleet_speculative_info) and returns the services the C(alauda.spec_decoding.rollback)
    role runs its per-service tasks for - those whose speculative flag reaches vLLM first, then those the discovery could not
    decide (a named service not found, a runtime or preset it could not read, an error), whose per-service run reports them.
  - The others are already without speculative decoding and cost no write.
  - In O(mode=git) and O(mode=emergency), and with O(remove_draft), every selected service is a target (their own reads decide).
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The registered result of M(alauda.spec_decoding.fleet_speculative_info) (a skipped task's result selects nothing).
    type: dict
    required: true
  mode:
    description: The rollback mode (C(rollback_mode)).
    type: str
    default: live
  remove_draft:
    description: The draft is removed after the rollback (C(rollback_remove_draft_artifacts)).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Decide what to roll back
  ansible.builtin.set_fact:
    rollback_plan: "{{ fleet | alauda.spec_decoding.fleet_rollback_plan(mode='live') }}"
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    targets:
      description: C({namespace, name, why}) per service to act on, in the order to act.
      type: list
      elements: dict
    without_flag:
      description: C(namespace/name) of each service no speculative flag reaches.
      type: list
      elements: str
    forbidden:
      description: The discovery's refused LISTs.
      type: list
      elements: dict
    records:
      description: The discovery's record per C(namespace/name).
      type: dict
    api_requests:
      description: The API requests the discovery made.
      type: int
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet_rollback
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.plain_data import plain_arguments


@plain_arguments  # plain data, not Ansible's lazy containers (plugin_utils/plain_data.py)
def fleet_rollback_plan(discovery, mode="live", remove_draft=False):
    if not isinstance(discovery, dict):
        raise AnsibleFilterError("fleet_rollback_plan expects the result of fleet_speculative_info (a dictionary), got %s"
                                 % type(discovery).__name__)
    return fleet_rollback.plan(discovery, mode=mode, remove_draft=bool(remove_draft))


class FilterModule:
    """The fleet rollback's targets."""

    def filters(self):
        return {"fleet_rollback_plan": fleet_rollback_plan}
