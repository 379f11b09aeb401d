# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: kustomization
short_description: Render a kustomization.yaml that lists manifest files
version_added: 0.1.0
description:
  - Returns deterministic YAML (sorted, de-duplicated resources) so GitOps reruns are byte-identical.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: Manifest file names relative to the kustomization.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Write kustomization.yaml
  ansible.builtin.copy:
    content: "{{ ['models-llama.yaml'] | alauda.spec_decoding.kustomization }}"
    dest: gitops/kustomization.yaml
    mode: "0644"
"""

RETURN = r"""
_value:
  description: kustomization.yaml text.
  type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError


def kustomization(resource_files):
    try:
        return isvc.kustomization(resource_files)
    except SpecDecodingError as exc:
        raise AnsibleFilterError("kustomization: %s" % exc) from exc


class FilterModule:
    """GitOps helpers."""

    def filters(self):
        return {"kustomization": kustomization}
