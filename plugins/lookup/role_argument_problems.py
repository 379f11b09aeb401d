# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: role_argument_problems
short_description: What a role's argument check would refuse in the variables in scope, one line per problem
version_added: 0.1.0
description:
  - Reads the variables of the role named by the term (a role of C(alauda.spec_decoding), short name) as that role reads
    them where the lookup runs (its defaults, which read the inventory's C(spec_decoding_*) names, the play's and the
    include's vars, the role's params), and checks each against the role's C(meta/argument_specs.yml) (entry point
    C(main)) with Ansible's own validator.
  - Returns one line per problem, naming the variable, the value, what is allowed and the nearest choice. A value the
    role's default takes from an inventory variable is named by that variable (C(spec_decoding_method), with the role's
    C(inference_service_method) beside it). A C(no_log) option's value is not shown.
  - The role C(alauda.spec_decoding.argument_check) runs it as the first dependency of every other role, before Ansible's
    own argument check, which prints the role's whole argument spec.
author:
  - Alauda Platform Team (@alauda)
options:
  _terms:
    description: The role's short name (for example V(rollback)); a fully qualified name is accepted.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Refuse what the rollback role's argument check would refuse, one line each
  ansible.builtin.fail:
    msg: "{{ problems | join(' | ') }}"
  vars:
    problems: "{{ query('alauda.spec_decoding.role_argument_problems', 'rollback') }}"
  when: problems | length > 0
"""

RETURN = r"""
_raw:
  description: One message per problem (the variable first, C(Fix) last); empty when the role would accept its variables.
  type: list
  elements: str
"""

import os

from ansible.errors import AnsibleError, AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import role_arguments

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        problems = []
        for term in terms:
            role = str(term).rsplit(".", 1)[-1]
            options, sources = role_arguments.role_spec(COLLECTION_ROOT, role)
            if not options:
                raise AnsibleLookupError("%r is not a role of alauda.spec_decoding with an argument spec (roles/%s/meta/argument_specs.yml)"
                                         % (term, role))
            values, untemplated = {}, {}
            for name in sorted(set(options) | {sources[o] for o in options if o in sources}):
                if name not in variables:
                    continue
                # Templated as Ansible's argument check templates them, in a dict (validate_argument_spec.get_args_from_task_vars):
                # a default of `omit` drops the variable, as if unset.
                try:
                    values.update(self._templar.template({name: variables[name]}))
                except AnsibleError as exc:
                    untemplated[name] = str(exc).splitlines()[0]
            problems.extend(str(p) for p in role_arguments.role_problems(role, values, options, sources, untemplated))
        return problems
