#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gitops_publish
short_description: Commit a rendered directory (the deploy's GitOps output) into a Git repository
version_added: 0.2.0
description:
  - Clones O(branch) of O(repo_url), copies the files of O(src) (the directory the deploy rendered the manifests and
    kustomization.yaml into) to O(path) of the repository, commits and pushes to O(branch) or, with O(push_branch),
    to a new branch for review. Argo CD or Flux then syncs the commit.
  - C(changed) only when the repository's tree differs from what it was; a rerun with the same render pushes nothing.
  - A push rejected as non-fast-forward is met once by fetching the new head, copying again and pushing again; a
    protected branch or a server hook that refuses the push fails naming the branch and the fixes.
  - Needs no cluster.
author:
  - Alauda Platform Team (@alauda)
options:
  src:
    description:
      - The local directory whose files are published (hidden files and directories are skipped).
    type: path
    required: true
  prune:
    description:
      - Also delete the files under O(path) of the repository that O(src) does not have.
    type: bool
    default: false
extends_documentation_fragment:
  - alauda.spec_decoding.git_repository
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
notes:
  - In check mode the repository is cloned and compared; nothing is committed or pushed. C(changed) then says whether a
    commit would be pushed.
seealso:
  - module: alauda.spec_decoding.isvc_manifest
  - module: alauda.spec_decoding.gitops_speculative
"""

EXAMPLES = r"""
- name: Commit the rendered InferenceService to the repository Argo CD syncs
  alauda.spec_decoding.gitops_publish:
    src: "{{ spec_decoding_gitops_dir }}"
    repo_url: https://git.example.com/platform/serving.git
    branch: main
    path: apps/llm
    token: "{{ lookup('ansible.builtin.env', 'GIT_TOKEN') }}"
    commit_message: Deploy llm with EAGLE-3 speculative decoding
  register: published
"""

RETURN = r"""
commit:
  description: The pushed commit, or null when the tree did not change (or check mode).
  returned: always
  type: str
  sample: 3f1c2a9d0c8b7e6f5a4b3c2d1e0f9a8b7c6d5e4f
base:
  description: The commit the files were copied onto.
  returned: always
  type: str
branch:
  description: The branch that was cloned.
  returned: always
  type: str
pushed_branch:
  description: Where the commit went (O(branch), or O(push_branch)); null when nothing was pushed.
  returned: always
  type: str
retried:
  description: The first push was rejected as non-fast-forward and the copy was made again on the new head.
  returned: always
  type: bool
files:
  description: What changed in the repository, as C(git status --porcelain) says it (C(status) A, M or D, and C(file)).
  returned: always
  type: list
  elements: dict
  sample: [{status: M, file: apps/llm/llm.yaml}]
commit_message:
  description: The commit message.
  returned: always
  type: str
diff:
  description: The repository's diff (C(prepared)), shown with C(--diff).
  returned: always
  type: dict
"""

import os

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import git_repo
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, plain_argspec


def argument_spec():
    return plain_argspec(git_repo.ARG_SPEC, src=dict(type="path", required=True), prune=dict(type="bool", default=False))


def execute(module):
    params = module.params
    src = params["src"]
    if not os.path.isdir(src) or next(git_repo.source_files(src), None) is None:
        raise ValidationError("%s is not a directory with files" % src, field="src",
                              hint="render the manifests first (the inference_service role writes them to spec_decoding_gitops_dir)")
    message = params["commit_message"] or "Publish %s from alauda.spec_decoding" % (params["path"] or ".")
    seen = {}

    def edit(repo):
        git_repo.copy_tree(src, repo.path(params["path"]), params["prune"])
        seen["changes"] = repo.status()
        seen["diff"] = repo.git("diff", "--cached")[1]
        return seen["changes"]

    out = git_repo.change_in_clone(params, edit, message, check_mode=module.check_mode)
    files = [{"status": code, "file": path} for code, path in out["edit"]]
    return dict(changed=out["commit"] is not None or (module.check_mode and bool(files)), commit=out["commit"], base=out["base"],
                branch=params["branch"], pushed_branch=out["pushed_branch"], retried=out["retried"], files=files, commit_message=message,
                diff={"prepared": seen.get("diff", "")})


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=git_repo.CONSTRAINTS,
    cluster=False,
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
