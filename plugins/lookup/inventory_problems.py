# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: inventory_problems
short_description: Check the host's inventory variables against what the collection reads, one line per problem
version_added: 0.1.0
description:
  - The check of the filter C(alauda.spec_decoding.inventory_problems) on the variables the inventory and the extra vars
    set for the current host (C(hostvars[inventory_hostname])), as a lookup.
  - It is a lookup because ansible-core loads every filter file of a collection for the first of its filters a task
    templates (each task's worker again), and a lookup loads its own file only. The role C(alauda.spec_decoding.inventory_check),
    the first task of every playbook, calls it.
  - Returns one dict, C(unknown) and C(invalid), as the filter does.
author:
  - Alauda Platform Team (@alauda)
extends_documentation_fragment:
  - alauda.spec_decoding.inventory_check
"""

EXAMPLES = r"""
- name: Refuse values the roles would refuse, one line each
  ansible.builtin.fail:
    msg: "{{ problems.invalid | join(' | ') }}"
  vars:
    problems: "{{ query('alauda.spec_decoding.inventory_problems', method='eagle3', roles=ansible_play_role_names) | first }}"
  when: problems.invalid | length > 0
"""

RETURN = r"""
_raw:
  description: One dict, C(unknown) and C(invalid), lists of messages (the variable first, C(Fix) last).
  type: list
  elements: dict
"""

from ansible.plugins.lookup import LookupBase

# The first task of every playbook: the collection files it imports are read from their .pyc from here on
# (plugin_utils/bytecode_cache.py), not compiled from source in every run.
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils import bytecode_cache

bytecode_cache.install()

# pylint: disable-next=wrong-import-position
from ansible_collections.alauda.spec_decoding.plugins.filter.inventory_problems import inventory_problems


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        host_vars = variables["hostvars"][variables["inventory_hostname"]]
        return [inventory_problems(host_vars, method=self.get_option("method"), method_source=self.get_option("method_source"),
                                   roles=self.get_option("roles"))]
