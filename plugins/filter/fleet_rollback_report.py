# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: fleet_rollback_report
short_description: Per service what a fleet rollback found and did, and the run's totals
version_added: 0.1.0
description:
  - From the plan of P(alauda.spec_decoding.fleet_rollback_plan#filter) and the C(rollback_results) of the
    C(alauda.spec_decoding.rollback) role.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The plan.
    type: dict
    required: true
  results:
    description: The role's C(rollback_results), one per service its per-service tasks ran for.
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Per service and totals
  ansible.builtin.set_fact:
    rollback_fleet: "{{ rollback_plan | alauda.spec_decoding.fleet_rollback_report(rollback_results) }}"
"""

RETURN = r"""
_value:
  description: The report.
  type: dict
  contains:
    services:
      description:
        - C({service, kind, found, speculative, sources, done, why}) per selected service; C(done) is V(rolled_back),
          V(committed_for_review), V(unchanged) (its per-service run found nothing to strip), V(skipped_without_flag) (no
          per-service run) or V(not_run).
      type: list
      elements: dict
    totals:
      description:
        - C(selected), C(with_flag), C(rolled_back), C(committed_for_review), C(unchanged), C(skipped_without_flag),
          C(undecided), C(forbidden_namespaces), C(api_requests_to_find) (the discovery's requests).
      type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet_rollback


def fleet_rollback_report(plan, results):
    if not isinstance(plan, dict) or not isinstance(results, list):
        raise AnsibleFilterError("fleet_rollback_report expects the plan (a dictionary) and rollback_results (a list)")
    return fleet_rollback.report(plan, results)


class FilterModule:
    """The fleet rollback's report."""

    def filters(self):
        return {"fleet_rollback_report": fleet_rollback_report}
