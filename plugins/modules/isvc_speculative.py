#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: isvc_speculative
short_description: Strip (roll back) or set (roll forward) vLLM speculative decoding on a KServe InferenceService
version_added: 0.1.0
description:
  - O(state=absent) removes C(--speculative-config) and its value (every form, also C(-sc), C(--spec-method),
    C(--spec-model), C(--spec-tokens), dotted keys, and the legacy pre-0.10 flags such as C(--speculative-model),
    C(--num-speculative-tokens), C(--ngram-prompt-lookup-max), dash or underscore spelling) from the predictor's containers
    (C(spec.predictor.model) and C(spec.predictor.containers[*]), command and args, also inside C(bash -c)
    scripts). Every other byte of the command stays as it was. KServe then rolls out a revision without a
    proposer.
  - O(state=present) sets or replaces it with the canonical JSON of O(config) (validated like
    M(alauda.spec_decoding.speculative_config)), or with what the backup holds (O(restore_backup=true)).
  - The write is one JSON patch that C(test)s the exact old command/args (and, with O(guard=resource_version),
    C(metadata.resourceVersion)), so a concurrent edit between read and write fails with a clear message
    instead of being overwritten; O(retries) re-reads and plans again on the fresh object.
  - Before stripping, the previous config and the exact old command lists are kept in the annotation
    C(spec-decoding.alauda.io/previous-speculative-config) (at most 16 KiB; larger command lists are left
    out and only the config is kept, and the result says C(backup_truncated)) and/or a local file.
  - Check mode is a server-side dry run (C(dryRun=All)); the API server validates the patch and stores nothing.
  - Idempotent - C(changed=false) when the flag is already absent (or the same config already set).
author:
  - Alauda Platform Team (@alauda)
options:
  state:
    description:
      - V(absent) strips the speculative flags (the rollback), V(present) sets them (the roll-forward).
    type: str
    choices: [absent, present]
    default: absent
  config:
    description:
      - The speculative config for O(state=present), a mapping or a JSON string. Validated and rendered as
        canonical JSON by the collection's speculative-config core.
    type: raw
  vllm_version:
    description: vLLM release of the runtime, to validate O(config) against (newest known when omitted).
    type: str
  restore_backup:
    description:
      - With O(state=present) and no O(config), roll forward from the backup (the annotation, or
        O(backup_file) when O(backup=file)). When the command has not changed since the rollback the exact
        old command lists come back byte for byte; otherwise the backed-up config is set again.
    type: bool
    default: false
  container:
    description:
      - The predictor container to set the flag in (O(state=present)) or to strip it from (O(state=absent)) -
        C(model) for C(spec.predictor.model), else a container name. An unknown name fails before anything is patched.
      - Default - O(state=present) sets it in the container that already has a flag, else the one running vLLM;
        O(state=absent) strips it from every predictor container.
    type: str
  backup:
    description:
      - Where to keep what a change removes. V(annotation) writes the previous config and command lists to the
        C(spec-decoding.alauda.io/previous-speculative-config) annotation in the same patch; V(file) writes them
        to O(backup_file); V(both) does both; V(none) keeps nothing.
    type: str
    choices: [annotation, file, both, none]
    default: annotation
  backup_file:
    description:
      - Local path (on the controller) for the backup with O(backup=file) or O(backup=both). An existing
        directory gets C(<namespace>.<name>.speculative-backup.json) inside it.
    type: path
  guard:
    description:
      - V(value) tests the exact old command/args in the patch (edits to other fields do not conflict);
        V(resource_version) also tests C(metadata.resourceVersion) (any concurrent edit conflicts).
    type: str
    choices: [value, resource_version]
    default: value
  retries:
    description:
      - On a conflict (the patch's C(test) failed, HTTP 422, or HTTP 409), re-read the InferenceService and plan
        again this many times. V(0) fails on the first conflict.
    type: int
    default: 0
  runtime_copy:
    description:
      - With O(state=absent), when the flag vLLM runs with comes from the InferenceService's ServingRuntime or
        ClusterServingRuntime (KServe merges the runtime's args before the InferenceService's), create the namespaced
        ServingRuntime C(<name>-<runtime>-nospec) - the runtime without the speculative flags, C(autoSelect) off - and
        point C(spec.predictor.model.runtime) at it in the same guarded patch as the strip. Other services keep the
        shared runtime.
      - Without O(runtime_copy) or O(edit_runtime) such a rollback is refused (nothing is written) with the runtime named.
    type: bool
    default: false
  edit_runtime:
    description:
      - With O(state=absent), strip the flag from the shared runtime itself (a guarded JSON patch of its
        C(kserve-container)). Every InferenceService using that runtime is listed first (C(runtime_users), and a
        warning) since all of them lose speculative decoding.
    type: bool
    default: false
  remove_draft_artifacts:
    description:
      - After a rollback (O(state=absent)), once the rolled-back revision is Ready at its generation, remove the
        draft's C(spec.predictor.storageUris) entry. Draft weights on a PVC subdirectory or inside a Modelcar
        image are not touched by this option; M(alauda.spec_decoding.draft_artifacts) removes those (the rollback
        role runs it after the engine line proves C(speculative_config=None)).
      - Draft artifacts stay mounted by default, as the guide says, so a roll-forward needs no new download.
    type: bool
    default: false
extends_documentation_fragment:
  - alauda.spec_decoding.inference_service
  - alauda.spec_decoding.inference_service.WAIT
  - alauda.spec_decoding.gitops_owner
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
notes:
  - Needs C(get) and C(patch) on C(inferenceservices) (and C(get)/C(list) on pods for O(wait)).
  - The backup annotation is written in the same patch as the change, so it cannot be lost between two writes.
seealso:
  - module: alauda.spec_decoding.speculative_config
  - module: alauda.spec_decoding.engine_config_info
  - module: alauda.spec_decoding.draft_artifacts
"""

EXAMPLES = r"""
- name: Roll back speculative decoding (keep a backup in the annotation)
  alauda.spec_decoding.isvc_speculative:
    name: llama31-8b-eagle3
    namespace: llm-demo
    state: absent
    wait: true

- name: Roll forward from the backup annotation
  alauda.spec_decoding.isvc_speculative:
    name: llama31-8b-eagle3
    namespace: llm-demo
    state: present
    restore_backup: true

- name: Set an ngram config (replaces any existing one), retry once if someone edits at the same time
  alauda.spec_decoding.isvc_speculative:
    name: qwen25-7b
    namespace: llm-demo
    state: present
    config: {method: ngram, num_speculative_tokens: 5, prompt_lookup_max: 4, prompt_lookup_min: 2}
    vllm_version: "0.11.2"
    retries: 1

- name: Roll back, keep the backup as a local file too, and drop the draft's storageUris entry once Ready
  alauda.spec_decoding.isvc_speculative:
    name: llama31-8b-eagle3
    namespace: llm-demo
    state: absent
    backup: both
    backup_file: /var/backups/spec-decoding/
    wait: true
    remove_draft_artifacts: true
"""

RETURN = r"""
previous_config:
  description: The speculative config the predictor had before this run (null when it had none).
  returned: always
  type: dict
  sample: {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
previous_legacy_flags:
  description:
    - vLLM's legacy (pre-0.10) speculative flags the rollback removed, flag to value (V(true) for a flag without a
      value), e.g. C(--speculative-model) and C(--num-speculative-tokens). They are kept in the backup as C(legacy_flags);
      O(restore_backup) refuses to write them back and names the C(--speculative-config) to set instead.
  returned: when state is absent
  type: dict
  sample: {"--speculative-model": "[ngram]", "--num-speculative-tokens": "5", "--ngram-prompt-lookup-max": "4"}
config:
  description: The speculative config after this run (null after a rollback).
  returned: always
  type: dict
json:
  description: Canonical JSON that was set (O(state=present)).
  returned: when state is present
  type: str
containers:
  description: Names of the predictor containers whose command or args changed.
  returned: always
  type: list
  elements: str
patch:
  description: The JSON patch sent (empty when nothing changed).
  returned: always
  type: list
  elements: dict
backup:
  description: The backup document kept (annotation and/or file).
  returned: when a backup was kept
  type: dict
backup_truncated:
  description: True when the command lists were too big for the annotation and only the config was kept.
  returned: always
  type: bool
backup_file:
  description: Path of the backup file written.
  returned: when a backup file was written
  type: str
attempts:
  description: Patch attempts made (more than 1 after conflicts with O(retries)).
  returned: always
  type: int
runtime:
  description:
    - The runtime the predictor's command is merged with, C(source) of the flag vLLM ran with before this run
      (C(inference_service), C(serving_runtime), C(cluster_serving_runtime)), and what was done to the runtime
      (C(fix) - V(none), V(copy) with C(copy) the ServingRuntime created, or V(edit)).
  returned: when state is absent
  type: dict
  sample: {"kind": "ClusterServingRuntime", "name": "vllm-runtime", "source": "cluster_serving_runtime", "fix": "copy"}
runtime_users:
  description: namespace/name of every InferenceService using the runtime (listed before O(edit_runtime) or a refusal).
  returned: when the flag came from the runtime
  type: list
  elements: str
draft_artifacts:
  description: What O(remove_draft_artifacts) did or why it left things in place.
  returned: when remove_draft_artifacts is true
  type: dict
  sample: {"removed": {"uri": "pvc://models/draft", "mountPath": "/mnt/models/draft"}, "note": "removed the storageUris entry ..."}
ready:
  description: Readiness at the current generation after O(wait).
  returned: when wait is true
  type: dict
resource:
  description: The InferenceService after the change (as the server returned it; a dry-run result in check mode).
  returned: always
  type: dict
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops.owner import GITOPS_OWNER_ARG_SPEC
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import INFERENCE_SERVICE_ARG_SPEC, ModuleContract, argspec, wait_arg_spec


def argument_spec():
    return argspec(
        INFERENCE_SERVICE_ARG_SPEC,
        wait_arg_spec(),
        GITOPS_OWNER_ARG_SPEC,
        state=dict(type="str", choices=["absent", "present"], default="absent"),
        config=dict(type="raw"),
        vllm_version=dict(type="str"),
        restore_backup=dict(type="bool", default=False),
        container=dict(type="str"),
        backup=dict(type="str", choices=["annotation", "file", "both", "none"], default="annotation"),
        backup_file=dict(type="path"),
        guard=dict(type="str", choices=["value", "resource_version"], default="value"),
        retries=dict(type="int", default=0),
        runtime_copy=dict(type="bool", default=False),
        edit_runtime=dict(type="bool", default=False),
        remove_draft_artifacts=dict(type="bool", default=False),
    )


def execute(module):
    params = module.params
    rollback.check_params(params)
    result, warnings = rollback.run(module.cluster, params, check_mode=module.check_mode, diff=module._diff)  # pylint: disable=protected-access
    for warning in warnings:
        module.warn(warning)
    return result


# A wait that times out comes after the patch: the task changed the InferenceService.
CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        mutually_exclusive=[("config", "restore_backup")],
        required_if=[
            ("backup", "file", ("backup_file",)),
            ("backup", "both", ("backup_file",)),
        ],
    ),
    failure=dict(
        timed_out={"changed": True},
        unexpected="isvc_speculative",
    ),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
