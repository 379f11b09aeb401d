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
  failures:
    description: The role's C(rollback_failures), one per service whose per-service tasks failed (P(alauda.spec_decoding.fleet_rollback_failure#filter)).
    type: list
    elements: dict
  cluster_down:
    description: The message of the failure that found the API server unreachable; the services not run then are left for a rerun.
    type: str
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
        - C({service, kind, found, speculative, sources, done, why, error, rollout}) per selected service; C(done) is
          V(rolled_back), V(committed_for_review), V(unchanged) (its per-service run found nothing to strip), V(failed)
          (C(error) - C(task), C(field), C(message), C(fix), C(unreachable)), V(skipped_without_flag) (no per-service run)
          or V(not_run) (left for a rerun after the API server stopped answering).
        - C(rollout) - C(generation), C(observed_generation) and a C(note) when a rollout was in progress at the discovery.
      type: list
      elements: dict
    totals:
      description:
        - C(selected), C(with_flag), C(rolled_back), C(committed_for_review), C(unchanged), C(skipped_without_flag),
          C(failed), C(not_run), C(acted_on) (the services the per-service tasks were for), C(mid_rollout), C(undecided),
          C(forbidden_namespaces), C(api_requests_to_find) (the discovery's requests).
      type: dict
    cluster_down:
      description: The failure's message when the API server stopped answering during the run, else null.
      type: str
    api_server:
      description: The API server the discovery read.
      type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet_rollback


def fleet_rollback_report(plan, results, failures=None, cluster_down=None):
    if not isinstance(plan, dict) or not isinstance(results, list) or not isinstance(failures or [], list):
        raise AnsibleFilterError("fleet_rollback_report expects the plan (a dictionary), rollback_results and failures (lists)")
    return fleet_rollback.report(plan, results, failures or [], cluster_down or None)


class FilterModule:
    """The fleet rollback's report."""

    def filters(self):
        return {"fleet_rollback_report": fleet_rollback_report}
