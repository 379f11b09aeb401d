#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: object_info
short_description: Read Kubernetes objects with kubernetes.core's own k8s_info code, in the task's process
version_added: 0.2.0
description:
  - Reads the objects of O(kind) - one by O(name), or those matching O(label_selectors) - through the code
    M(kubernetes.core.k8s_info) runs (kubernetes.core's C(K8sService.find)), so discovery, the request and the result
    (RV(resources), RV(api_found)) are that module's for the same options.
  - Over a local connection it runs in the task's own process (the collection's action plugin), without a module
    process (a Python start and the kubernetes library's import, about 0.9 CPU s a read); that is why the collection's
    roles read with it. With another connection, C(become), a task C(environment) or C(async) it runs as a module, with
    the same answer.
  - Only the options below; for waits or hidden fields use M(kubernetes.core.k8s_info).
author:
  - Alauda Platform Team (@alauda)
options:
  kind:
    description: The kind of the objects (as M(kubernetes.core.k8s_info)'s C(kind)).
    type: str
    required: true
  api_version:
    description: The API version of O(kind) (C(group/version), or C(v1) for the core API).
    type: str
    default: v1
  name:
    description: The object's name. Omitted - every object of O(kind) in O(namespace) that matches O(label_selectors).
    type: str
  namespace:
    description: The namespace of a namespaced kind. Omitted - all namespaces.
    type: str
  label_selectors:
    description: Label selectors the objects must match (C(key=value), C(key!=value), C(key in (a,b)) ...), all of them.
    type: list
    elements: str
    default: []
  field_selectors:
    description: Field selectors the objects must match (C(status.phase=Running), C(spec.nodeName=n1) ...), all of them.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
seealso:
  - module: kubernetes.core.k8s_info
"""

EXAMPLES = r"""
- name: Read the PVC
  alauda.spec_decoding.object_info:
    kind: PersistentVolumeClaim
    name: models
    namespace: llm-demo
  register: pvc

- name: The stager Jobs of the PVC
  alauda.spec_decoding.object_info:
    api_version: batch/v1
    kind: Job
    namespace: llm-demo
    label_selectors:
      - app.kubernetes.io/component=model-stager
      - app.kubernetes.io/part-of=models
  register: stagers
"""

RETURN = r"""
resources:
  description: The objects found (none when the object does not exist), as M(kubernetes.core.k8s_info) returns them.
  returned: always
  type: list
  elements: dict
api_found:
  description: Whether the API server serves O(kind) at O(api_version) (false - an unknown kind, no resources).
  returned: always
  type: bool
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.apply import find_objects
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec


def argument_spec():
    return argspec(
        kind=dict(type="str", required=True),
        api_version=dict(type="str", default="v1"),
        name=dict(type="str"),
        namespace=dict(type="str"),
        label_selectors=dict(type="list", elements="str", default=[]),
        field_selectors=dict(type="list", elements="str", default=[]),
    )


def execute(module):
    return dict(find_objects(module), changed=False)


CONTRACT = ModuleContract(argument_spec, execute)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
