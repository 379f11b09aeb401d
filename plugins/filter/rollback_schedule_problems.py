# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: rollback_schedule_problems
short_description: List every wrong setting of a scheduled rollback before anything is rendered
version_added: 0.2.0
description:
  - Checks the settings of the C(alauda.spec_decoding.rollback_schedule) role and returns one message per problem, each
    naming the role variable (C(rollback_schedule_<key>)) and the fix. An empty list means the schedule can be rendered.
  - Something to roll back (names and/or a label selector), at least one target namespace, and somewhere for the
    manifests to go (an output directory and/or apply).
  - The CronJob, ServiceAccount and namespace names, every target namespace and, for an LLMInferenceService with the
    presets Role, KServe's namespace are DNS-1123 labels; every name to roll back is C(name) or C(namespace/name).
  - The cron expression has the five fields of a Kubernetes CronJob schedule (minute 0-59, hour 0-23, day of month 1-31,
    month 1-12 or JAN-DEC, day of week 0-6 or SUN-SAT), each a value, C(*), a list, a range or a step.
  - The role calls it first, so a wrong setting fails the run before anything is written or applied.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description:
      - The role's settings, keyed by the variable name without its C(rollback_schedule_) prefix - C(name), C(namespace),
        C(target_namespaces) (list), C(names) (list), C(label_selector), C(cron), C(output_dir), C(apply) (bool),
        C(resource_kind), C(kserve_namespace), C(kserve_presets_role) (bool). A key left out counts as empty.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Check the schedule settings before anything is written or applied
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "{{ problems | join('; ') }}"
    quiet: true
  vars:
    problems: >-
      {{ {'name': 'nightly-rollback', 'namespace': 'models', 'target_namespaces': ['models'], 'names': ['llama-eagle3'],
          'cron': '0 3 * * *', 'output_dir': 'gitops/rollback'} | alauda.spec_decoding.rollback_schedule_problems }}

# {'names': ['Bad_Name'], 'cron': '61 3 * * *', ...} gives
# - "rollback_schedule_names[0]: Bad_Name is not an InferenceService name or namespace/name. Fix: use lowercase DNS-1123 names, ..."
# - "rollback_schedule_cron: minute field 61 is outside 0-59. Fix: write a standard 5-field cron expression, e.g. \"0 3 * * *\""
"""

RETURN = r"""
_value:
  description: One message per wrong setting, the role variable first and C(Fix) last; empty when the schedule can be rendered.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback_schedule

_LISTS = ("target_namespaces", "names")


def rollback_schedule_problems(settings):
    if not isinstance(settings, dict):
        raise AnsibleFilterError("rollback_schedule_problems expects a dictionary of the rollback_schedule settings (name, namespace, "
                                 "target_namespaces, names, cron, ...), got %s" % type(settings).__name__)
    for key in _LISTS:
        if settings.get(key) is not None and not isinstance(settings[key], (list, tuple)):
            raise AnsibleFilterError("rollback_schedule_problems: %s must be a list, got %s" % (key, type(settings[key]).__name__))
    return rollback_schedule.messages(settings)


class FilterModule:
    """Scheduled-rollback checks."""

    def filters(self):
        return {"rollback_schedule_problems": rollback_schedule_problems}
