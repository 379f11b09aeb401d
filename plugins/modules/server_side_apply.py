#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_side_apply
short_description: Server-side apply of one Kubernetes object under a field manager, with kubernetes.core's own apply
version_added: 0.2.0
description:
  - Applies O(definition) with Kubernetes server-side apply as field manager O(field_manager), through the code
    M(kubernetes.core.k8s) runs with C(state=present), C(apply=true) and C(server_side_apply) (kubernetes.core's
    C(perform_action)), so it makes the same requests and gives the same result (RV(result), RV(method), RV(diff), RV(changed)) and the same
    failure keys (C(msg), C(reason), C(status)). A conflict with another field manager fails unless O(force_conflicts).
  - Over a local connection it runs in the task's own process (the collection's action plugin), without a module
    process; that is why the deploy uses it instead of M(kubernetes.core.k8s). With another connection, C(become), a
    task C(environment) or C(async) it runs as a module, with the same answer.
author:
  - Alauda Platform Team (@alauda)
options:
  definition:
    description:
      - The object to apply (C(apiVersion), C(kind), C(metadata.name), and C(metadata.namespace) for a namespaced kind).
    type: dict
    required: true
  field_manager:
    description: The field manager the apply writes as (C(metadata.managedFields)).
    type: str
    required: true
  force_conflicts:
    description: Take over fields another field manager owns (server-side apply's C(force)); otherwise such a conflict fails.
    type: bool
    default: false
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
notes:
  - Needs C(get) and C(patch) on the kind (and C(create) when the object does not exist yet).
  - Check mode sends the apply as a server-side dry run (C(dryRun=All)); admission and validation run, nothing is stored.
seealso:
  - module: kubernetes.core.k8s
"""

EXAMPLES = r"""
- name: Apply the rendered InferenceService as the deploy's field manager
  alauda.spec_decoding.server_side_apply:
    definition: "{{ rendered.manifest }}"
    field_manager: alauda-spec-decoding
  register: applied

- name: Take back the fields the collection's rollback changed
  alauda.spec_decoding.server_side_apply:
    definition: "{{ rendered.manifest }}"
    field_manager: alauda-spec-decoding
    force_conflicts: true
"""

RETURN = r"""
changed:
  description: Whether the live object differs after the apply (kubernetes.core's comparison, metadata churn ignored).
  returned: always
  type: bool
method:
  description: V(apply).
  returned: success
  type: str
  sample: apply
result:
  description: The object as the API server answered the apply (the dry run's answer in check mode).
  returned: success
  type: dict
diff:
  description: The before and after of the fields that changed (diff mode).
  returned: success, in diff mode, when the object existed
  type: dict
reason:
  description: The API server's reason of a failure (C(Conflict), C(Forbidden), ...).
  returned: failure, when the API server answered
  type: str
missing_namespace:
  description: The namespace that does not exist, when the API server refused the apply for that (404); the failure message is then one
    line with the fix instead of the API server's JSON Status.
  returned: failure, when the object's namespace does not exist
  type: str
  sample: models
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.apply import server_side_apply
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec


def argument_spec():
    return argspec(
        definition=dict(type="dict", required=True),
        field_manager=dict(type="str", required=True),
        force_conflicts=dict(type="bool", default=False),
    )


def execute(module):
    definition = module.params["definition"]
    missing = [key for key in ("apiVersion", "kind") if not definition.get(key)]
    if not (definition.get("metadata") or {}).get("name"):
        missing.append("metadata.name")
    if missing:
        raise ValidationError("the object has no %s" % ", ".join(missing), field="definition",
                              hint="give the whole object (apiVersion, kind, metadata.name and, when namespaced, metadata.namespace)")
    return server_side_apply(module)


CONTRACT = ModuleContract(argument_spec, execute)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
