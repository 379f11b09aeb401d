#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gitops_speculative
short_description: Remove a serving object's speculative-decoding flags in its Git repository
version_added: 0.2.0
description:
  - The rollback of an InferenceService, LLMInferenceService or ServingRuntime that Argo CD or Flux syncs from Git,
    made where the truth is. Clones O(branch) of O(repo_url), finds every file under O(path) that gives the object its
    C(--speculative-config) (or vLLM's older speculative flags), removes the flags there with the same command-line
    editor as the live rollback, commits with a message that says what was removed and why, and pushes to O(branch)
    or, with O(push_branch), to a new branch for review.
  - "Files searched: plain manifests (multi-document YAML; the object matched by kind, name and namespace), a kustomize
    tree (C(resources), C(bases) and C(components) followed; C(patches), C(patchesStrategicMerge) and C(patchesJson6902),
    in files or inline; a JSON 6902 op that adds the flag is removed), the collection's own rendered directory."
  - Nothing else in an edited file changes (comments, key order, quoting, block scalar styles are kept).
  - An object rendered by a Helm chart is refused, naming the chart and the value that holds the flag.
  - A push rejected as non-fast-forward (someone pushed in between) is met once by fetching, editing the new head and
    pushing again. A protected branch or a server hook that refuses the push fails naming the branch and the fixes.
  - Needs no cluster. Waiting until the owner has synced the commit is the job of
    M(alauda.spec_decoding.gitops_owner_info).
author:
  - Alauda Platform Team (@alauda)
options:
  kind:
    description:
      - The kind of the serving object.
    type: str
    choices: [InferenceService, LLMInferenceService, ServingRuntime]
    default: InferenceService
  name:
    description:
      - The object's C(metadata.name) (as the cluster has it; a kustomize C(namePrefix)/C(nameSuffix) is taken into account).
    type: str
    required: true
  namespace:
    description:
      - The object's namespace.
    type: str
    required: true
  default_namespace:
    description:
      - The namespace a manifest without C(metadata.namespace) lands in (the Application's C(spec.destination.namespace),
        the Kustomization's C(spec.targetNamespace)). Default O(namespace).
    type: str
  owner_kind:
    description:
      - The owner's kind as M(alauda.spec_decoding.gitops_owner_info) returns it. V(helm) is refused (chart values are not
        manifests).
    type: str
    choices: [none, argocd, flux, helm]
  state:
    description:
      - V(absent) removes the speculative flags.
    type: str
    choices: [absent]
    default: absent
  reason:
    description:
      - Why the flags are removed; it goes into the commit message.
    type: str
    default: rollback
extends_documentation_fragment:
  - alauda.spec_decoding.git_repository
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - ruamel.yaml >= 0.17
notes:
  - In check mode the repository is cloned and the edit computed; nothing is committed or pushed. C(changed) then says
    whether a commit would be pushed.
  - "The commit message is C(Roll back speculative decoding on <namespace>/<name>: remove --speculative-config <value> (<reason>))
    unless O(commit_message) is given."
seealso:
  - module: alauda.spec_decoding.isvc_speculative
  - module: alauda.spec_decoding.gitops_publish
"""

EXAMPLES = r"""
- name: Roll back speculative decoding in Git (the repository Argo CD syncs)
  alauda.spec_decoding.gitops_speculative:
    repo_url: https://git.example.com/platform/serving.git
    branch: main
    path: apps/llm/overlays/prod
    token: "{{ lookup('ansible.builtin.env', 'GIT_TOKEN') }}"
    name: llm
    namespace: serving
    reason: acceptance rate below the floor
  register: git_rollback

- name: Propose the rollback on a branch for review, over SSH with a deploy key
  alauda.spec_decoding.gitops_speculative:
    repo_url: git@git.example.com:platform/serving.git
    branch: main
    path: apps/llm
    push_branch: rollback/llm-speculative
    ssh_key_file: /run/secrets/git/ssh-privatekey
    known_hosts_file: /run/secrets/git/known_hosts
    name: llm
    namespace: serving
"""

RETURN = r"""
commit:
  description: The pushed commit, or null when nothing was pushed (no flag left to remove, or check mode).
  returned: always
  type: str
  sample: 3f1c2a9d0c8b7e6f5a4b3c2d1e0f9a8b7c6d5e4f
base:
  description: The commit the edit was made on (the branch's head after the clone, or after the retry's fetch).
  returned: always
  type: str
branch:
  description: The branch that was cloned.
  returned: always
  type: str
  sample: main
pushed_branch:
  description: Where the commit went (O(branch), or O(push_branch) for review); null when nothing was pushed.
  returned: always
  type: str
  sample: main
retried:
  description: The first push was rejected as non-fast-forward and the edit was made again on the new head.
  returned: always
  type: bool
files:
  description: Each edited file with its unified diff and what was removed from it.
  returned: always
  type: list
  elements: dict
  sample:
    - file: apps/llm/base/isvc.yaml
      kind: manifest
      exact: true
      diff: "--- a/apps/llm/base/isvc.yaml\n+++ b/apps/llm/base/isvc.yaml\n..."
      removed:
        - {field: spec.predictor.model.args, flag: --speculative-config, value: '{"method":"ngram"}', file: apps/llm/base/isvc.yaml}
removed:
  description: Every flag removed, over all files (C(field), C(flag), C(value), C(file)).
  returned: always
  type: list
  elements: dict
defined_in:
  description: The files (and inline patches) that define the object.
  returned: always
  type: list
  elements: str
commit_message:
  description: The commit message (also in check mode).
  returned: always
  type: str
diff:
  description: The unified diff of every edited file (C(prepared)), shown with C(--diff).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import git_repo, manifest_edit
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops.yaml_roundtrip import RUAMEL_IMPORT_ERROR
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, plain_argspec


def argument_spec():
    return plain_argspec(
        git_repo.ARG_SPEC,
        kind=dict(type="str", choices=list(manifest_edit.KINDS), default="InferenceService"),
        name=dict(type="str", required=True),
        namespace=dict(type="str", required=True),
        default_namespace=dict(type="str"),
        owner_kind=dict(type="str", choices=["none", "argocd", "flux", "helm"]),
        state=dict(type="str", choices=["absent"], default="absent"),
        reason=dict(type="str", default="rollback"),
    )


def execute(module):
    if RUAMEL_IMPORT_ERROR is not None:
        module.fail_json(msg=missing_required_lib("ruamel.yaml"), exception=str(RUAMEL_IMPORT_ERROR))
    params = module.params
    messages = []

    def edit(repo):
        return manifest_edit.strip_in_directory(repo.root, params["path"], params["kind"], params["name"], params["namespace"],
                                                default_namespace=params["default_namespace"], owner_kind=params["owner_kind"])

    def message(result):
        text = params["commit_message"] or "Roll back speculative decoding on %s/%s: remove %s (%s)" % (
            params["namespace"], params["name"], manifest_edit.removed_summary(result["removed"]), params["reason"])
        messages.append(text)
        return text

    out = git_repo.change_in_clone(params, edit, message, check_mode=module.check_mode)
    result = out["edit"]
    for item in result["files"]:
        if not item["exact"]:
            module.warn("%s: the edit could not be carried over line by line; the file is written as ruamel.yaml formats it "
                        "(check its diff)" % item["file"])
    if result["files"] and not messages:
        message(result)
    return dict(
        changed=out["commit"] is not None or (module.check_mode and bool(result["files"])),
        commit=out["commit"], base=out["base"], branch=params["branch"], pushed_branch=out["pushed_branch"], retried=out["retried"],
        files=result["files"], removed=result["removed"], defined_in=result["defined_in"],
        commit_message=messages[-1] if messages else None,
        diff={"prepared": "".join(item["diff"] for item in result["files"])},
    )


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=git_repo.CONSTRAINTS,
    cluster=False,
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
