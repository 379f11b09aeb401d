#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: draft_artifacts
short_description: Remove a rolled-back InferenceService's draft model (storageUris entry, PVC subdirectory or Modelcar layers)
version_added: 0.1.0
description:
  - The guide keeps the draft mounted after a rollback so a roll-forward needs no download. This module removes it,
    only once the rolled-back revision is Ready at its generation and the predictor runs no speculative config.
  - The draft's path is O(draft_path), else the C(model) of the previous speculative config (O(previous_config), else
    the rollback's C(spec-decoding.alauda.io/previous-speculative-config) annotation).
  - A C(spec.predictor.storageUris) entry of its own is removed with a guarded JSON patch.
  - A subdirectory of the PVC behind C(storageUri=pvc://<claim>/<prefix>) is planned here and removed by a short Job
    (the M(alauda.spec_decoding.draft_artifacts) result C(pvc_job) feeds the rollback role's Job); run the module again
    with O(remover_log) to check the Job's summary and drop the subdirectory from the PVC's
    C(spec-decoding.alauda.io/staged) record.
  - Inside a Modelcar image (C(storageUri=oci://...)) a new manifest is pushed that reuses the image's blobs (same
    repository, or a cross-repository mount) without the draft's layers, under O(tag) (default C(<tag>-nodraft), or
    C(nodraft-<digest>) for a digest-pinned URI), manifest last; C(storageUri) then moves to the new digest.
    Layers other tools wrote (no per-file annotations, plain or gzip, any size) are read as a stream for their file
    list, and a layer holding draft and other files is streamed from the registry into its rewritten upload,
    never held in memory; every blob read is checked against its digest.
  - Refuses to remove what the rolled-back command, args or env still name, the directory holding them (the target),
    the whole volume, and paths with C(..). Idempotent - a rerun finds nothing left to remove.
  - A PVC subdirectory that another InferenceService or LLMInferenceService of the namespace still mounts (its storage
    URI points into it) or names (its command, args or env name a path in it) is kept, with a warning naming them; so is
    one the module cannot check (listing a kind forbidden). A Modelcar image is never changed in place (the others keep
    the old digest).
  - O(kind=LLMInferenceService) does the same for KServe's LLMInferenceService - its one C(spec.model.uri) (C(pvc://)
    subdirectory or C(oci://) Modelcar) holds target and draft; the paths still named are those of every pool.
author:
  - Alauda Platform Team (@alauda)
options:
  name:
    description: InferenceService (or LLMInferenceService) name.
    type: str
    required: true
  kind:
    description: Kind of the rolled-back resource.
    type: str
    choices: [InferenceService, LLMInferenceService]
    default: InferenceService
  api_version:
    description: API version of an LLMInferenceService (O(kind=LLMInferenceService)).
    type: str
    choices: [v1alpha1, v1alpha2]
    default: v1alpha2
  namespace:
    description: Namespace of the InferenceService.
    type: str
    required: true
  previous_config:
    description: The speculative config the rollback removed (the C(previous_config) that M(alauda.spec_decoding.isvc_speculative) returns).
    type: dict
  draft_path:
    description: The draft's path in the predictor container (for example V(/mnt/models/draft)); overrides the config's C(model).
    type: str
  remover_log:
    description:
      - Log of the remover Job for a PVC subdirectory. When given, the module checks the Job's summary and records the
        removal on the PVC instead of planning.
    type: str
  remover_job:
    description: Name of the remover Job (recorded on the PVC with O(remover_log)).
    type: str
  script_sha256:
    description: sha256 of the shipped stager (the base64 text of C(artifact_sync.pyz)), so a new stager gives a new Job name.
    type: str
  tag:
    description: Tag for the Modelcar image without the draft.
    type: str
  repository:
    description: Repository (same registry) for the image without the draft; blobs are mounted from the original one.
    type: str
  username:
    description: Registry user for the Modelcar image.
    type: str
  password:
    description: Registry password or token. Never logged or returned.
    type: str
  auth_file:
    description: Docker C(config.json) or containers C(auth.json) holding the registry's credentials.
    type: path
  tls_verify:
    description: Verify the registry's TLS certificate (false also accepts plain HTTP).
    type: bool
    default: true
  ca_file:
    description: PEM file with the registry's CA.
    type: path
  registry_timeout:
    description: Socket timeout in seconds for each registry operation.
    type: int
    default: 120
  wait:
    description: After changing the InferenceService, wait until it is Ready at its new generation.
    type: bool
    default: true
extends_documentation_fragment:
  - alauda.spec_decoding.gitops_owner
  - alauda.spec_decoding.inference_service.WAIT
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
notes:
  - Needs C(get)/C(patch) on C(inferenceservices) (or C(llminferenceservices)) and, in PVC mode, C(get)/C(patch) on
    C(persistentvolumeclaims) and C(list) on C(inferenceservices) and C(llminferenceservices) (the other users of the PVC).
seealso:
  - module: alauda.spec_decoding.isvc_speculative
  - module: alauda.spec_decoding.modelcar_image
"""

EXAMPLES = r"""
- name: Remove the draft once the rollback is Ready and proven
  alauda.spec_decoding.draft_artifacts:
    name: llama31-8b-eagle3
    namespace: llm-demo
    previous_config: "{{ rollback.previous_config }}"
  register: draft

- name: Modelcar image in a registry with credentials, pushed under a tag of your choice
  alauda.spec_decoding.draft_artifacts:
    name: llama31-8b-eagle3
    namespace: llm-demo
    tag: v1-rolled-back
    auth_file: ~/.config/containers/auth.json
"""

RETURN = r"""
mode:
  description: Where the draft lived - V(storage_uris), V(pvc), V(modelcar) or V(none) (nothing to remove).
  returned: always
  type: str
draft_path:
  description: The draft's path in the container.
  returned: always
  type: str
note:
  description: What was (or will be) done, or why nothing was.
  returned: always
  type: str
removed:
  description: The storageUris entry, the remover's summary of the PVC subdirectory, or the image path removed.
  returned: when something was removed
  type: dict
still_used_by:
  description: PVC mode - the other InferenceServices / LLMInferenceServices that still use the subdirectory (it was kept).
  returned: when the draft was kept for them
  type: list
  elements: str
pvc_job:
  description: PVC mode - the remover Job's name, ConfigMap, plan (JSON), PVC, subdirectory and kept paths.
  returned: in pvc mode
  type: dict
run_job:
  description: PVC mode - whether the remover Job still has to run (false when an earlier run removed the subdirectory).
  returned: in pvc mode
  type: bool
image:
  description: Modelcar mode - source and new image, digest, new storage_uri, layers dropped/rewritten/kept, blobs reused.
  returned: in modelcar mode
  type: dict
patch:
  description: The JSON patch sent to the InferenceService.
  returned: when the InferenceService changed
  type: list
  elements: dict
resource:
  description: The InferenceService after the change.
  returned: when the InferenceService changed
  type: dict
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops.owner import GITOPS_OWNER_ARG_SPEC
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_removal
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_removal_cluster
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec, wait_arg_spec


def argument_spec():
    return argspec(
        wait_arg_spec(wait=True),
        GITOPS_OWNER_ARG_SPEC,
        name=dict(type="str", required=True),
        namespace=dict(type="str", required=True),
        kind=dict(type="str", default="InferenceService", choices=["InferenceService", "LLMInferenceService"]),
        api_version=dict(type="str", default="v1alpha2", choices=["v1alpha1", "v1alpha2"]),
        previous_config=dict(type="dict"),
        draft_path=dict(type="str"),
        remover_log=dict(type="str"),
        remover_job=dict(type="str"),
        script_sha256=dict(type="str"),
        tag=dict(type="str"),
        repository=dict(type="str"),
        username=dict(type="str"),
        password=dict(type="str", no_log=True),
        auth_file=dict(type="path"),
        tls_verify=dict(type="bool", default=True),
        ca_file=dict(type="path"),
        registry_timeout=dict(type="int", default=120),
    )


def execute(module):
    # A password read from auth_file stays out of every output too.
    open_registry = draft_removal_cluster.registry_opener(module.params, hide=module.no_log_values.add)
    result = draft_removal.execute(module.params, draft_removal_cluster.calls(module.cluster, module.params), open_registry,
                                   check_mode=module.check_mode, warn=module.warn)
    if module._diff and result.get("patch"):  # pylint: disable=protected-access
        result["diff"] = {"before": {"draft_path": result.get("draft_path"), "mode": result.get("mode")},
                          "after": {"removed": result.get("removed")}}
    return result


# A wait that times out comes after the patch: the task changed the InferenceService.
CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        mutually_exclusive=[("auth_file", "username"), ("auth_file", "password")],
        required_together=[("username", "password")],
    ),
    failure=dict(
        timed_out={"changed": True},
        unexpected="draft_artifacts",
    ),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
