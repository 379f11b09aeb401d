# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: stager_zipapp
short_description: The PVC stager as one zip application, base64-encoded for a ConfigMap's binaryData
version_added: 0.1.0
description:
  - Builds the stager Job's program from the collection's C(plugins/module_utils/artifacts/artifact_sync) package (and
    C(errors.py)), one zip application that the image's C(python3) runs with the standard library only
    (C(python3 artifact_sync.pyz --config plan.json); C(python3 artifact_sync.pyz remove --config plan.json) removes a
    staged subdirectory).
  - The bytes depend only on the sources (fixed timestamps, modes and order), so rendering the ConfigMap again changes
    nothing on the cluster.
  - The C(alauda.spec_decoding.stage_pvc) role ships it as C(binaryData) key C(artifact_sync.pyz) of the ConfigMap
    C(<pvc>-stager); the C(alauda.spec_decoding.rollback) role's draft remover ships the same.
author:
  - Alauda Platform Team (@alauda)
options: {}
"""

EXAMPLES = r"""
- name: Ship the stager in a ConfigMap
  kubernetes.core.k8s:
    state: present
    definition:
      apiVersion: v1
      kind: ConfigMap
      metadata:
        name: models-stager
        namespace: models
      binaryData:
        artifact_sync.pyz: "{{ lookup('alauda.spec_decoding.stager_zipapp') }}"
"""

RETURN = r"""
_raw:
  description: The zip application, base64-encoded (one element).
  type: list
  elements: str
"""

from ansible.plugins.lookup import LookupBase

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync import bundle


class LookupModule(LookupBase):
    """``lookup('alauda.spec_decoding.stager_zipapp')``: the stager's zip application in base64."""

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        return [bundle.zipapp_base64()]
