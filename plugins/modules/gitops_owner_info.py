#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gitops_owner_info
short_description: Who manages a serving object (Argo CD, Flux, Helm), its sync policy and Git source; wait for a commit to sync
version_added: 0.2.0
description:
  - Reads the InferenceService, LLMInferenceService or ServingRuntime and finds its owner from its own metadata - Argo CD's
    C(argocd.argoproj.io/tracking-id) annotation (Argo CD 3's default tracking; an Application outside the control-plane
    namespace is C(<namespace>_<name>)), or its C(app.kubernetes.io/instance) label with C(argocd.argoproj.io/installation-id)
    or field manager C(argocd-controller); Flux's C(kustomize.toolkit.fluxcd.io/name) and C(helm.toolkit.fluxcd.io/name)
    labels; Helm's C(meta.helm.sh/release-name) annotation; and the owners' field managers in C(metadata.managedFields).
  - Then reads the owner object where RBAC allows (C(docs/rbac/gitops-owner-reader.yaml)) - the Argo CD Application, the Flux
    Kustomization and its GitRepository, the Flux HelmRelease - for the sync policy (automated, selfHeal, prune, suspend,
    interval), the source (repository, path, revision) and the revisions it has synced and fetched. An owner that cannot
    be read (403, 404) is reported in RV(owner) (C(readable) false, C(read_error) naming the fix); it does not fail.
  - With O(revision) and O(wait), waits until the owner has synced that commit - Argo CD C(status.sync.revision) is the
    commit and C(status.sync.status) is C(Synced); Flux's Kustomization C(status.lastAppliedRevision) is the commit and
    its C(Ready) condition is true. With O(fetched), only until the owner has seen the commit (Argo CD
    C(status.sync.revision), Flux's GitRepository C(status.artifact.revision)), for an owner whose sync is paused.
author:
  - Alauda Platform Team (@alauda)
options:
  name:
    description: Name of the serving object.
    type: str
    required: true
  namespace:
    description: Its namespace.
    type: str
    required: true
  kind:
    description: Its kind.
    type: str
    choices: [InferenceService, LLMInferenceService, ServingRuntime]
    default: InferenceService
  api_version:
    description:
      - Its API version (C(serving.kserve.io/) optional); default V(v1beta1), V(v1alpha2) for an LLMInferenceService,
        V(v1alpha1) for a ServingRuntime.
    type: str
  argocd_namespace:
    description: Argo CD's control-plane namespace, where an Application the tracking id names without a namespace lives.
    type: str
    default: argocd
  revision:
    description:
      - A full commit sha. RV(revision_synced) says whether the owner has synced it (or seen it, with O(fetched)); with
        O(wait), the module waits for it.
    type: str
  fetched:
    description: With O(revision), only require the owner to have seen the commit in Git, not applied it.
    type: bool
    default: false
  wait:
    description: Wait until the owner has synced (or seen) O(revision).
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait; the failure names the owner's last status.
    type: int
    default: 600
  wait_sleep:
    description: Seconds between two reads of the owner.
    type: int
    default: 2
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
  - kubernetes.core.k8s_auth_options
notes:
  - Needs C(get) on the serving object, and to read the owner C(get) on C(applications.argoproj.io),
    C(kustomizations.kustomize.toolkit.fluxcd.io), C(gitrepositories.source.toolkit.fluxcd.io) and
    C(helmreleases.helm.toolkit.fluxcd.io) (C(docs/rbac/gitops-owner-reader.yaml)).
  - A plain Helm release keeps its state in Secrets, which are not read; no controller syncs it.
seealso:
  - module: alauda.spec_decoding.isvc_speculative
"""

EXAMPLES = r"""
- name: Who manages the InferenceService
  alauda.spec_decoding.gitops_owner_info:
    name: llama
    namespace: models
  register: owner

- name: Wait until Argo CD or Flux has synced the rollback commit
  alauda.spec_decoding.gitops_owner_info:
    name: llama
    namespace: models
    revision: "{{ pushed.commit }}"
    wait: true
    wait_timeout: 300
"""

RETURN = r"""
owner:
  description:
    - C(kind) (V(none), V(argocd), V(flux) - kustomize-controller, V(helm) - Flux helm-controller or plain Helm), C(name) and
      C(namespace) of the Application, Kustomization or HelmRelease (or Helm release), C(evidence) (the markers found),
      C(field_managers) (the owners' managers in managedFields).
    - C(readable) (null without an owner), C(read_error) (with the fix), C(sync) (C(automated), C(self_heal), C(prune),
      C(suspended), C(interval)), C(source) (C(repo_url), C(revision), C(path), C(source_kind), C(source_name),
      C(source_namespace)), C(synced_revision) (the commit applied and in sync), C(fetched_revision) (the newest commit
      seen), C(paused_by_collection) (what the collection recorded when it paused the sync), C(status) (the owner's status
      fields the waits read).
  returned: always
  type: dict
  sample: {"kind": "argocd", "name": "llm-serving", "namespace": "argocd",
           "evidence": ["annotation argocd.argoproj.io/tracking-id=llm-serving:serving.kserve.io/InferenceService:models/llama"],
           "field_managers": ["argocd-controller"], "readable": true, "read_error": null,
           "sync": {"automated": true, "self_heal": true, "prune": false, "suspended": false, "interval": null},
           "source": {"repo_url": "https://git.example.com/platform/serving.git", "revision": "main", "path": "models/llama",
                      "source_kind": "Application", "source_name": "llm-serving", "source_namespace": "argocd"},
           "synced_revision": "4f1c2d0e9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e", "fetched_revision": "4f1c2d0e9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e",
           "paused_by_collection": null}
managed:
  description: Whether an owner manages the object.
  returned: always
  type: bool
summary:
  description: The one line verify prints.
  returned: always
  type: str
  sample: "owner: Argo CD Application argocd/llm-serving (automated, selfHeal) from https://git.example.com/platform/serving.git models/llama@4f1c2d0"
resource_generation:
  description: The serving object's metadata.generation (after the wait, the generation the synced commit made).
  returned: always
  type: int
revision_synced:
  description: Whether the owner has synced (with O(fetched), seen) O(revision).
  returned: with revision
  type: bool
elapsed:
  description: Seconds waited.
  returned: with wait
  type: float
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner_info
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec


def argument_spec():
    return argspec(
        name=dict(type="str", required=True),
        namespace=dict(type="str", required=True),
        kind=dict(type="str", default="InferenceService", choices=sorted(owner_info.SERVING_KINDS)),
        api_version=dict(type="str"),
        argocd_namespace=dict(type="str", default="argocd"),
        revision=dict(type="str"),
        fetched=dict(type="bool", default=False),
        wait=dict(type="bool", default=False),
        wait_timeout=dict(type="int", default=600),
        wait_sleep=dict(type="int", default=2),
    )


def execute(module):
    return owner_info.owner_info(module.api_client, module.params)


CONTRACT = ModuleContract(
    argument_spec, execute,
    failure=dict(
        unexpected="gitops_owner_info",
    ),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
