#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: object_state
short_description: Create, patch, apply or delete Kubernetes objects with kubernetes.core's own k8s code, in the task's process
version_added: 0.2.0
description:
  - Does what M(kubernetes.core.k8s) does for the options below, through its code (kubernetes.core's
    C(get_definitions) and C(perform_action)), so the requests, the result (RV(result), RV(method), RV(diff),
    C(changed)) and the failure keys (C(msg), C(reason), C(status)) are that module's for the same options; every other
    option of M(kubernetes.core.k8s) is at its default. Check mode is a server-side dry run, as there.
  - Over a local connection it runs in the task's own process (the collection's action plugin), without a module
    process (a Python start and the kubernetes library's import, about 0.9 CPU s a task); that is why the collection's
    roles write with it. With another connection, C(become), a task C(environment) or C(async) it runs as a module, with
    the same answer.
  - For templates, source files, label selectors, server-side apply or validation use M(kubernetes.core.k8s) (or
    M(alauda.spec_decoding.server_side_apply)).
author:
  - Alauda Platform Team (@alauda)
options:
  state:
    description:
      - V(present) creates the object or, when it exists, merge-patches it (with O(apply), a client-side apply);
        V(patched) patches an existing object only; V(absent) deletes it (M(kubernetes.core.k8s)'s C(state)).
    type: str
    choices: [present, absent, patched]
    default: present
  definition:
    description: The object (or a list of objects); O(api_version), O(kind), O(name) and O(namespace) fill what it leaves out.
    type: raw
  api_version:
    description: The API version of O(kind) (C(group/version), or C(v1) for the core API).
    type: str
    default: v1
  kind:
    description: The kind of the object, without O(definition) (for example to delete by name).
    type: str
  name:
    description: The object's name, without O(definition) or to complete it.
    type: str
  namespace:
    description: The object's namespace, without O(definition) or to complete it.
    type: str
  apply:
    description: Client-side apply with the last-applied-configuration annotation (M(kubernetes.core.k8s)'s C(apply)).
    type: bool
    default: false
  merge_type:
    description: The patch type of an existing object (M(kubernetes.core.k8s)'s C(merge_type)).
    type: list
    elements: str
    choices: [json, merge, strategic-merge]
  delete_options:
    description: The body of a delete (M(kubernetes.core.k8s)'s C(delete_options)).
    type: dict
    suboptions:
      propagationPolicy:
        description: Whether and how the object's dependents are deleted.
        type: str
        choices: [Foreground, Background, Orphan]
      gracePeriodSeconds:
        description: Seconds before the object is deleted.
        type: int
      preconditions:
        description: Delete only the object of this C(uid) / C(resourceVersion).
        type: dict
        suboptions:
          resourceVersion:
            description: The resourceVersion the object must have.
            type: str
          uid:
            description: The uid the object must have.
            type: str
  wait:
    description: Wait until the object exists (V(present)) or is gone (V(absent)), as M(kubernetes.core.k8s) waits.
    type: bool
    default: false
  wait_sleep:
    description: Seconds between checks while waiting.
    type: int
    default: 5
  wait_timeout:
    description: Seconds to wait.
    type: int
    default: 120
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
notes:
  - Check mode sends the same requests as a server-side dry run (C(dryRun=All)); admission and validation run, nothing is stored.
seealso:
  - module: kubernetes.core.k8s
  - module: alauda.spec_decoding.object_info
"""

EXAMPLES = r"""
- name: Ship the stager and its plan in a ConfigMap
  alauda.spec_decoding.object_state:
    state: present
    apply: true
    definition:
      apiVersion: v1
      kind: ConfigMap
      metadata:
        name: models-stager
        namespace: llm-demo
      data:
        plan.json: "{}"

- name: Remove a Job and its pods
  alauda.spec_decoding.object_state:
    state: absent
    api_version: batch/v1
    kind: Job
    name: models-stage-3f2a
    namespace: llm-demo
    delete_options:
      propagationPolicy: Background
    wait: true
"""

RETURN = r"""
result:
  description: The object as the API server answered (M(kubernetes.core.k8s)'s C(result)); C(results) for several definitions.
  returned: success
  type: dict
method:
  description: What was done (C(create), C(update), C(patch), C(apply), C(delete)), as M(kubernetes.core.k8s) says it.
  returned: when something was done
  type: str
diff:
  description: The change, with diff mode.
  returned: when diff mode is on and something changed
  type: dict
"""


import copy

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.apply import object_state
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import DELETE_OPTS_ARG_SPEC


def argument_spec():
    delete_options = copy.deepcopy(DELETE_OPTS_ARG_SPEC)
    delete_options["propagationPolicy"]["type"] = "str"
    delete_options["preconditions"]["options"] = {"resourceVersion": {"type": "str"}, "uid": {"type": "str"}}
    return argspec(
        state=dict(type="str", default="present", choices=["present", "absent", "patched"]),
        definition=dict(type="raw"),
        api_version=dict(type="str", default="v1"),
        kind=dict(type="str"),
        name=dict(type="str"),
        namespace=dict(type="str"),
        apply=dict(type="bool", default=False),
        merge_type=dict(type="list", elements="str", choices=["json", "merge", "strategic-merge"]),
        delete_options=dict(type="dict", options=delete_options),
        wait=dict(type="bool", default=False),
        wait_sleep=dict(type="int", default=5),
        wait_timeout=dict(type="int", default=120),
    )


def execute(module):
    return object_state(module)


CONTRACT = ModuleContract(argument_spec, execute, constraints=dict(
    mutually_exclusive=[("merge_type", "apply")],
    required_one_of=[("definition", "kind")],
))


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
