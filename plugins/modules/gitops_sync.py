#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gitops_sync
short_description: Pause and resume the sync of a serving object's Argo CD Application or Flux Kustomization
version_added: 0.3.0
description:
  - The emergency path of the rollback role (C(rollback_mode=emergency)) - pause the owner's sync, patch live, prove, commit
    the same change to Git, wait for the owner to have the commit, resume the sync exactly as it was.
  - With O(state=paused) the owner's automation is switched off and what it was is recorded on the owner object, in the
    annotation C(spec-decoding.alauda.io/paused-sync) (JSON with C(kind), C(previous), C(by) the run id and C(at)), in one
    JSON patch. Argo CD Application - C(previous) is the exact C(spec.syncPolicy) (null when absent) and the pause removes
    C(spec.syncPolicy.automated), leaving its other keys (this stops automated sync on every Argo CD release). Flux
    Kustomization - C(previous) is C(spec.suspend) (true, false, or null when absent) and the pause sets C(spec.suspend=true).
  - An owner already paused by the collection (the annotation is there) keeps its FIRST record, so a run killed after the
    pause and run again resumes what was there before the first pause. An owner whose sync was already off (paused by
    someone else) is recorded as it is and stays off after the resume; RV(paused_by_others) says so.
  - With O(state=resumed) the recorded C(spec.syncPolicy) or C(spec.suspend) is put back as recorded (absent stays absent)
    and the annotation removed, in one JSON patch. Without the annotation it changes nothing.
  - Every patch tests the values it changes, so an edit of the owner between this module's read and its write fails the
    task with nothing written (run it again).
  - Name the serving object (O(name), O(namespace), O(kind), O(api_version)) and its owner is found as
    M(alauda.spec_decoding.gitops_owner_info) finds it, or name the owner directly (O(owner_kind), O(owner_name),
    O(owner_namespace)). A Helm release or an unmanaged object has no sync to pause - the task fails naming the fixes.
author:
  - Alauda Platform Team (@alauda)
options:
  state:
    description: V(paused) switches the owner's sync off and records it; V(resumed) puts back what was recorded.
    type: str
    choices: [paused, resumed]
    required: true
  name:
    description: The serving object whose owner to pause or resume (mutually exclusive with O(owner_name)).
    type: str
  namespace:
    description: The serving object's namespace.
    type: str
  kind:
    description: The serving object's kind.
    type: str
    choices: [InferenceService, LLMInferenceService, ServingRuntime]
    default: InferenceService
  api_version:
    description: The serving object's apiVersion (default - the kind's version that M(alauda.spec_decoding.gitops_owner_info) reads).
    type: str
  argocd_namespace:
    description: Argo CD's control-plane namespace, where an Application named in a tracking id without C(<namespace>_) lives.
    type: str
    default: argocd
  owner_kind:
    description: The owner named directly - an Argo CD C(Application) or a Flux C(Kustomization).
    type: str
    choices: [Application, Kustomization]
  owner_name:
    description: The owner's name (with O(owner_kind) and O(owner_namespace)).
    type: str
  owner_namespace:
    description: The owner's namespace (Argo CD's control-plane namespace, C(argocd) by default, or the apps-in-any-namespace one).
    type: str
  run_id:
    description: The run that pauses (recorded as C(by)); required with O(state=paused).
    type: str
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
notes:
  - Needs C(get) and C(patch) on C(applications.argoproj.io) or C(kustomizations.kustomize.toolkit.fluxcd.io) in the owner's
    namespace (the patch Role of C(docs/rbac/gitops-owner-reader.yaml)), and C(get) on the serving object when it is named.
  - Check mode sends the patch as a server-side dry run (C(dryRun=All)); nothing is stored.
seealso:
  - module: alauda.spec_decoding.gitops_owner_info
"""

EXAMPLES = r"""
- name: Pause the sync of the InferenceService's owner
  alauda.spec_decoding.gitops_sync:
    state: paused
    name: llama
    namespace: models
    run_id: "{{ rollback_run_id }}"
  register: paused

- name: Resume it exactly as it was
  alauda.spec_decoding.gitops_sync:
    state: resumed
    name: llama
    namespace: models

- name: Pause a Flux Kustomization named directly
  alauda.spec_decoding.gitops_sync:
    state: paused
    owner_kind: Kustomization
    owner_name: serving
    owner_namespace: flux-system
    run_id: manual-2026-12-05
"""

RETURN = r"""
changed:
  description: Whether the owner object was (or in check mode would be) changed.
  returned: always
  type: bool
owner:
  description:
    - The owner - C(kind) (argocd or flux), C(name), C(namespace); when the serving object was named, the dict
      M(alauda.spec_decoding.gitops_owner_info) reads from its metadata (with C(evidence) and C(field_managers)).
  returned: success
  type: dict
owner_object:
  description: The owner object's C(api_version), C(kind), C(name) and C(namespace).
  returned: success
  type: dict
  sample: {"api_version": "argoproj.io/v1alpha1", "kind": "Application", "name": "serving", "namespace": "argocd"}
previous:
  description: What was recorded at the (first) pause - the Application's C(spec.syncPolicy) or the Kustomization's C(spec.suspend); null when absent.
  returned: success
  type: raw
  sample: {"automated": {"prune": true, "selfHeal": true}, "syncOptions": ["ServerSideApply=true"]}
record:
  description: The parsed annotation (C(kind), C(previous), C(by), C(at)); null on a resume that found none.
  returned: success
  type: dict
paused:
  description: Whether the owner is paused by the collection after the task (true after V(paused), false after V(resumed)).
  returned: success
  type: bool
resumed:
  description: Whether this task put the recorded sync back.
  returned: success
  type: bool
already_paused:
  description: The collection had paused the owner already (the first record kept).
  returned: state=paused
  type: bool
paused_by_others:
  description: The owner's sync was already off before the (first) pause, so it stays off after the resume.
  returned: success
  type: bool
restored:
  description: The C(spec.syncPolicy) or C(spec.suspend) the resume wrote back (null - the key removed).
  returned: state=resumed
  type: raw
edited_while_paused:
  description: Someone changed the syncPolicy or suspend while paused; their change was kept (see the warning).
  returned: state=resumed
  type: bool
patch:
  description: The JSON patch sent (empty when nothing changed).
  returned: success
  type: list
  elements: dict
diff:
  description: The owner's syncPolicy or suspend and the annotation before and after (diff mode).
  returned: success, in diff mode
  type: dict
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner as gitops_owner
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner_info, sync_pause
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec

# owner_kind -> the owner dict's kind
OWNER_KINDS = {"Application": "argocd", "Kustomization": "flux"}


def argument_spec():
    return argspec(
        state=dict(type="str", choices=["paused", "resumed"], required=True),
        name=dict(type="str"),
        namespace=dict(type="str"),
        kind=dict(type="str", default="InferenceService", choices=sorted(owner_info.SERVING_KINDS)),
        api_version=dict(type="str"),
        argocd_namespace=dict(type="str", default="argocd"),
        owner_kind=dict(type="str", choices=sorted(OWNER_KINDS)),
        owner_name=dict(type="str"),
        owner_namespace=dict(type="str"),
        run_id=dict(type="str"),
    )


def owner_of_params(module):
    """The owner dict: named directly, or the serving object's owner as gitops_owner_info finds it."""
    params = module.params
    if params["owner_name"]:
        return {"kind": OWNER_KINDS[params["owner_kind"]], "name": params["owner_name"], "namespace": params["owner_namespace"]}
    obj = owner_info.get_serving_object(module.api_client, params["kind"], params["namespace"], params["name"], params["api_version"])
    return gitops_owner.owner_of(obj, argocd_namespace=params["argocd_namespace"])


def execute(module):
    owner = owner_of_params(module)
    if module.params["state"] == "paused":
        result = sync_pause.pause(module.api_client, owner, module.params["run_id"], check_mode=module.check_mode)
    else:
        result = sync_pause.resume(module.api_client, owner, check_mode=module.check_mode)
    for warning in result.pop("warnings"):
        module.warn(warning)
    if not module._diff:  # pylint: disable=protected-access
        result.pop("diff")
    return result


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        mutually_exclusive=[("name", "owner_name")],
        required_one_of=[("name", "owner_name")],
        required_together=[("name", "namespace"), ("owner_kind", "owner_name", "owner_namespace")],
        required_if=[("state", "paused", ("run_id",))],
    ),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
