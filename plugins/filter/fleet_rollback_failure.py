# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: fleet_rollback_failure
short_description: What a fleet rollback keeps of one service's failed per-service run
version_added: 0.1.0
description:
  - Takes the failed task's result (C(ansible_failed_result) in a C(rescue)) and returns only the failing task, C(field),
    message (cut at 600 characters) and C(fix) - never the rest of the result, which may carry the object, its env or a token.
  - C(unreachable) says whether the message is one of an API server that did not answer (connection refused, reset, timed out);
    the C(alauda.spec_decoding.rollback) role then leaves the cluster's remaining services for a rerun.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The failed task's result.
    type: dict
    required: true
  service:
    description: The service, C(namespace/name).
    type: str
    required: true
  task:
    description: The failing task's name (C(ansible_failed_task.name)).
    type: str
"""

EXAMPLES = r"""
- name: Record the failure
  ansible.builtin.set_fact:
    rollback_failures: "{{ rollback_failures + [ansible_failed_result | alauda.spec_decoding.fleet_rollback_failure('ns/name', ansible_failed_task.name)] }}"
"""

RETURN = r"""
_value:
  description: C({service, task, field, message, fix, unreachable}).
  type: dict
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet_rollback


def fleet_rollback_failure(result, service, task=None):
    return fleet_rollback.failure(result, service, task)


class FilterModule:
    """One failed service of a fleet rollback."""

    def filters(self):
        return {"fleet_rollback_failure": fleet_rollback_failure}
