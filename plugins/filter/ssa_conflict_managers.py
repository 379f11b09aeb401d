# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: ssa_conflict_managers
short_description: Field managers named in a server-side apply conflict message
version_added: 0.2.0
description:
  - Reads the C(conflict with "<manager>") parts of the API server's HTTP 409 answer to a server-side apply, as
    M(kubernetes.core.k8s) reports it in its failure message (escaped quotes are handled).
  - Returns an empty list when the message is not an apply conflict.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The failure message of the apply task.
    type: str
    required: true
  foreign:
    description: Leave out the collection's own rollback manager (C(alauda-spec-decoding-rollback)), whose fields a deploy takes back.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Take fields back only from the collection's own rollback
  ansible.builtin.debug:
    msg: "{{ apply_result.msg | alauda.spec_decoding.ssa_conflict_managers }}"
"""

RETURN = r"""
_value:
  description: Manager names in the order the message names them, without repeats.
  type: list
  elements: str
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.ssa_conflicts import ROLLBACK_FIELD_MANAGER, conflict_managers


def ssa_conflict_managers(message, foreign=False):
    managers = conflict_managers(message)
    return [m for m in managers if m != ROLLBACK_FIELD_MANAGER] if foreign else managers


class FilterModule:
    """Server-side apply helpers."""

    def filters(self):
        return {"ssa_conflict_managers": ssa_conflict_managers}
