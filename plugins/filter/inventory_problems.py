# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: inventory_problems
short_description: Check a host's inventory variables against what the collection reads, one line per problem
version_added: 0.1.0
description:
  - Reads the variables the inventory and the extra vars set for a host (C(hostvars[inventory_hostname])) whose names carry
    one of the collection's prefixes (C(spec_decoding_) and each role's name, such as C(canary_), C(tune_),
    C(benchmark_), C(watch_), C(verify_), C(rollback_)).
  - C(unknown) lists the names nothing in the collection reads (a misspelt variable changes nothing), each with the
    nearest known variable.
  - C(invalid) lists the values a role's argument spec refuses, in one line each naming the inventory variable (for
    example C(spec_decoding_method), not the role's C(inference_service_method)), the value, what is allowed and the
    nearest choice, and a draft method with a target URI but no draft, with an example in the target's scheme.
  - The role C(alauda.spec_decoding.inventory_check) runs the same check first in every playbook, through the lookup of the
    same name (C(alauda.spec_decoding.inventory_problems), which loads one file where a collection filter loads them all).
author:
  - Alauda Platform Team (@alauda)
extends_documentation_fragment:
  - alauda.spec_decoding.inventory_check
options:
  _input:
    description: The host's variables, C(hostvars[inventory_hostname]).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Refuse values the roles would refuse, one line each
  ansible.builtin.fail:
    msg: "{{ problems.invalid | join(' | ') }}"
  vars:
    problems: "{{ hostvars[inventory_hostname] | alauda.spec_decoding.inventory_problems }}"
  when: problems.invalid | length > 0
"""

RETURN = r"""
_value:
  description: C(unknown) and C(invalid), lists of messages (the variable first, C(Fix) last); both empty when all is well.
  type: dict
"""

import os

from ansible.errors import AnsibleFilterError, AnsibleUndefinedVariable

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import inventory_variables, role_arguments

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _get(host_vars, name, default=None):
    try:
        return host_vars[name] if name in host_vars else default
    except AnsibleUndefinedVariable:
        return default


def inventory_problems(host_vars, method="", method_source="", roles=None):
    if not hasattr(host_vars, "keys"):
        raise AnsibleFilterError("inventory_problems expects hostvars[inventory_hostname], got %s" % type(host_vars).__name__)
    cat = inventory_variables.catalog(COLLECTION_ROOT)
    names = [name for name in host_vars.keys() if cat.governed(str(name))]
    invalid = []
    for name, option in inventory_variables.option_checks(names, cat, roles):
        try:
            value = host_vars[name]
        except AnsibleUndefinedVariable as exc:
            invalid.append(str(ValidationError("cannot be templated (%s)" % str(exc).splitlines()[0], field=name,
                                               hint="define what it refers to, or give a plain value")))
            continue
        problem = role_arguments.value_problem(name, option, cat.options[option][1], value)
        if problem is not None and str(problem) not in invalid:
            invalid.append(str(problem))
    method = method or _get(host_vars, "spec_decoding_method") or ""
    drafted = inventory_variables.draft_problem(
        str(method), method_source or "spec_decoding_method", _get(host_vars, "spec_decoding_artifacts", {}),
        artifact_mode=str(_get(host_vars, "spec_decoding_artifact_mode", "auto")),
        staged=str(_get(host_vars, "spec_decoding_stage_pvc", False)).lower() in ("true", "1", "yes"),
        built=bool(_get(host_vars, "spec_decoding_modelcar_build")),
        resource_kind=str(_get(host_vars, "spec_decoding_resource_kind", "InferenceService")))
    if drafted is not None:
        invalid.append(str(drafted))
    unknown = [name for name in names if name not in cat.known]
    values = {name: _get(host_vars, name) for name in unknown}
    return {"unknown": [str(p) for p in inventory_variables.unknown_variables(unknown, cat, values)], "invalid": invalid}


class FilterModule:
    """Inventory checks."""

    def filters(self):
        return {"inventory_problems": inventory_problems}
