# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: fleet_check_report
short_description: Per service what verify or the watchdog found and did over a fleet, and the run's totals
version_added: 0.1.0
description:
  - From the plan of P(alauda.spec_decoding.fleet_check_plan#filter) and the per-service results of the
    C(alauda.spec_decoding.verify) or C(alauda.spec_decoding.watch) role.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The plan.
    type: dict
    required: true
  results:
    description:
      - One per service the per-service tasks ran for - verify C({service, ok, task, msg, result}) (C(result) its
        C(verify_result)); watch C({service, state, action, msg}).
    type: list
    elements: dict
    required: true
  rolled_back:
    description: C(namespace/name) of each service the watchdog's rollback rolled back.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Per service and totals
  ansible.builtin.set_fact:
    verify_fleet: "{{ verify_plan | alauda.spec_decoding.fleet_check_report(verify_results) }}"
"""

RETURN = r"""
_value:
  description: The report.
  type: dict
  contains:
    services:
      description:
        - C({service, kind, found, speculative, sources, done, why, error}) per selected service; C(done) is V(verified),
          V(failed) or V(not_run) (verify), the watchdog's state (V(healthy), V(degraded), V(collapsed), V(no_traffic),
          V(unknown)) or V(not_run) (watch), V(skipped_without_flag) or V(not_checked) (not decided by the discovery).
      type: list
      elements: dict
    totals:
      description:
        - C(selected), C(with_flag), C(without_flag), C(not_checked), C(forbidden_namespaces), C(api_requests_to_find) (the
          discovery's requests); verify C(verified_ok), C(failed), C(not_run); watch C(watched), one count per state,
          C(rolled_back), C(not_run).
      type: dict
    lines:
      description: The summary - the totals, one line per service, one per namespace that refused its LIST.
      type: list
      elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet_checks


def fleet_check_report(plan, results, rolled_back=None):
    if not isinstance(plan, dict) or not isinstance(results, list):
        raise AnsibleFilterError("fleet_check_report expects the plan (a dictionary) and the per-service results (a list)")
    try:
        return fleet_checks.report(plan, results, rolled_back=list(rolled_back or []))
    except SpecDecodingError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """The fleet verify's and watchdog's report."""

    def filters(self):
        return {"fleet_check_report": fleet_check_report}
