#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gitops_files
short_description: Write the rendered files of a GitOps directory and its kustomization.yaml in one task
version_added: 0.2.0
description:
  - Writes each of O(files) into the directory O(path) (created with mode 0755 when missing), then, unless
    O(kustomization=none), a C(kustomization.yaml) that lists the directory's manifests, as the
    P(alauda.spec_decoding.kustomization#filter) filter renders it (sorted, so a rerun is byte-identical).
  - Each file is written whole beside its path and renamed over it, with mode 0644, so a reader finds the old file or
    the new one, never half of one. C(changed) only when a byte or the mode of a file changed (or the directory was
    created); a rerun with the same render writes nothing.
  - Runs in the task's own process when the task runs on the controller (a local connection, no C(become), no
    C(async)), as a module process otherwise. Needs no cluster.
author:
  - Alauda Platform Team (@alauda)
options:
  path:
    description:
      - The directory the files go into.
    type: path
    required: true
  files:
    description:
      - The files to write, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description:
          - The file name inside O(path) (no directory, not hidden).
        type: str
        required: true
      content:
        description:
          - The file's text, written as UTF-8.
        type: str
        required: true
      secret:
        description:
          - The file can carry a secret. Its content is kept out of the diff (which then names the file only) and out
            of the module's output.
        type: bool
        default: false
  kustomization:
    description:
      - V(directory) lists every C(*.yaml) manifest of O(path) (kustomization.yaml and hidden files left out) together
        with O(files), so manifests that other tasks wrote there stay listed.
      - V(files) lists only O(files) and O(resources).
      - V(none) writes no kustomization.yaml.
    type: str
    choices: [directory, files, none]
    default: directory
  resources:
    description:
      - More file names for kustomization.yaml to list (files of O(path) written by another task).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
notes:
  - In check mode nothing is written; C(changed), C(written) and the diff say what would be, and with
    O(kustomization=directory) the kustomization lists the files as they would be.
seealso:
  - module: alauda.spec_decoding.isvc_manifest
  - module: alauda.spec_decoding.gitops_publish
"""

EXAMPLES = r"""
- name: Write the InferenceService manifest and kustomization.yaml
  alauda.spec_decoding.gitops_files:
    path: "{{ spec_decoding_gitops_dir }}"
    files:
      - name: "{{ rendered.filename }}"
        content: "{{ rendered.manifest_yaml }}"

- name: Write a Secret's manifest (its content never in the diff or the output)
  alauda.spec_decoding.gitops_files:
    path: gitops/credentials
    files:
      - name: models-hf-token.yaml
        content: "{{ secret_yaml }}"
        secret: true
"""

RETURN = r"""
path:
  description: The directory.
  returned: always
  type: str
files:
  description: Every file of the call, kustomization.yaml last, with its path and whether it changed (or would).
  returned: always
  type: list
  elements: dict
  sample: [{name: models-llama.yaml, path: gitops/models-llama.yaml, changed: true}]
written:
  description: The names of the files that changed (or would, in check mode).
  returned: always
  type: list
  elements: str
resources:
  description: What kustomization.yaml lists; null with O(kustomization=none).
  returned: always
  type: list
  elements: str
diff:
  description: One C(before)/C(after) entry per file whose content changes, shown with C(--diff).
  returned: with --diff
  type: list
  elements: dict
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import render_files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, plain_argspec


def argument_spec():
    return plain_argspec(
        path=dict(type="path", required=True),
        files=dict(type="list", elements="dict", default=[], options=dict(
            name=dict(type="str", required=True),
            content=dict(type="str", required=True),
            secret=dict(type="bool", default=False),
        )),
        kustomization=dict(type="str", choices=list(render_files.KUSTOMIZATION_MODES), default="directory"),
        resources=dict(type="list", elements="str", default=[]),
    )


def execute(module):
    # A file that can carry a secret: masked wherever its text would show (the module process's echoed arguments, a
    # failure message), as an option with no_log is.
    module.no_log_values.update(f["content"] for f in module.params["files"] if f["secret"] and f["content"])
    return render_files.write(module.params, check_mode=module.check_mode, diff=module._diff)  # pylint: disable=protected-access


CONTRACT = ModuleContract(
    argument_spec, execute,
    failure=dict(unexpected="gitops_files", unexpected_types=OSError),
    cluster=False,
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
