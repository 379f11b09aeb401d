# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: fleet_rollback_verdict
short_description: Whether a fleet rollback fails its cluster's host, once every service it could act on is done
version_added: 0.1.0
description:
  - From the report of P(alauda.spec_decoding.fleet_rollback_report#filter).
  - The host fails when the cluster could not be read (O(cluster_error)), when its API server stopped answering during the
    run, when a namespace the selection lists refused its LIST (unless O(max_fail_percentage=100); with O(all_namespaces) such
    a namespace is only reported), or when the share of failed services among those acted on is greater than
    O(max_fail_percentage).
  - The message names the cluster (its inventory host) and its API server, the failed services with field, message and fix.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The report.
    type: dict
    required: true
  max_fail_percentage:
    description: The failure budget (C(rollback_max_fail_percentage)), a whole number from 0 to 100.
    type: int
    default: 0
  cluster:
    description: The cluster's name in the report (C(inventory_hostname)).
    type: str
  cluster_error:
    description: Why the cluster's services could not be read (the discovery's failure message).
    type: str
  all_namespaces:
    description: The selection was every namespace (C(rollback_all_namespaces)).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Fail when over the failure budget
  ansible.builtin.fail:
    msg: "{{ rollback_verdict.msg }}"
  vars:
    rollback_verdict: "{{ rollback_fleet | alauda.spec_decoding.fleet_rollback_verdict(max_fail_percentage=10, cluster=inventory_hostname) }}"
  when: rollback_verdict.failed
"""

RETURN = r"""
_value:
  description: C({failed, msg, failed_percentage}).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet_rollback


def fleet_rollback_verdict(report, max_fail_percentage=0, cluster=None, cluster_error=None, all_namespaces=False):
    if not isinstance(report, dict):
        raise AnsibleFilterError("fleet_rollback_verdict expects the report of fleet_rollback_report (a dictionary)")
    try:
        return fleet_rollback.verdict(report, max_fail_percentage, cluster=cluster, cluster_error=cluster_error or None,
                                      all_namespaces=bool(all_namespaces))
    except SpecDecodingError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """The fleet rollback's verdict per cluster."""

    def filters(self):
        return {"fleet_rollback_verdict": fleet_rollback_verdict}
