# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: fleet_check_plan
short_description: Which services verify or the watchdog checks over a fleet, from one fleet_speculative_info discovery
version_added: 0.1.0
description:
  - Takes the result of M(alauda.spec_decoding.fleet_speculative_info) and returns the services the C(alauda.spec_decoding.verify)
    or C(alauda.spec_decoding.watch) role runs its per-service tasks for.
  - O(check=verify) - the services whose speculative flag reaches vLLM, and the named services not found or not judged (their
    own verify says why). O(check=watch) - the services whose speculative flag reaches vLLM.
  - The others are reported, not checked - without a flag, or not decided (a runtime or preset the discovery could not read).
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The registered result of M(alauda.spec_decoding.fleet_speculative_info) (a skipped task's result selects nothing).
    type: dict
    required: true
  check:
    description: The role that checks them.
    type: str
    choices: [verify, watch]
    default: verify
"""

EXAMPLES = r"""
- name: Decide what to verify
  ansible.builtin.set_fact:
    verify_plan: "{{ fleet | alauda.spec_decoding.fleet_check_plan(check='verify') }}"
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    targets:
      description: C({namespace, name, why}) per service to check, in the order to check.
      type: list
      elements: dict
    not_checked:
      description: C({service, why}) per service the discovery could not decide and the check does not run for.
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
    check:
      description: O(check).
      type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet_checks
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.plain_data import plain_arguments


@plain_arguments  # plain data, not Ansible's lazy containers (plugin_utils/plain_data.py)
def fleet_check_plan(discovery, check="verify"):
    if not isinstance(discovery, dict):
        raise AnsibleFilterError("fleet_check_plan expects the result of fleet_speculative_info (a dictionary), got %s"
                                 % type(discovery).__name__)
    try:
        return fleet_checks.plan(discovery, check=check)
    except SpecDecodingError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """The fleet verify's and watchdog's targets."""

    def filters(self):
        return {"fleet_check_plan": fleet_check_plan}
