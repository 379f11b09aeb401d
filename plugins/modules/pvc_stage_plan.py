#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pvc_stage_plan
short_description: Plan staging model files onto a PVC (sizes, PVC decision, subdirectory ownership)
version_added: 0.1.0
description:
  - Lists every source the controller can see (a controller directory, an HTTP mirror, a Hugging Face
    mirror, an S3 bucket) and sums the file sizes, adds headroom and decides whether the PVC is created,
    reused or expanded.
  - Fails before anything is written when a source is missing, the PVC is too small and cannot expand,
    a size would shrink the PVC, the storage class does not exist, a subdirectory already holds a
    different model (recorded in the PVC annotation C(spec-decoding.alauda.io/staged)) and O(force) is
    not set, or an air-gapped inventory would reach a public hub.
  - Returns the stager's JSON plan for the ConfigMap. With O(stager_log) it instead checks the stager's
    last log line (the engine's JSON summary) against the items.
  - Used by the C(alauda.spec_decoding.stage_pvc) role; the copy itself is the stager (C(artifact_sync.pyz), lookup
    P(alauda.spec_decoding.stager_zipapp#lookup)) in a Job.
author:
  - Alauda Platform Team (@alauda)
options:
  pvc_name:
    description: PVC name.
    type: str
    required: true
  items:
    description:
      - Models to stage. Keys C(name) (model id recorded in the manifest), C(subdir) (directory on the
        PVC), C(source) (a controller directory, C(volume:<path>) inside O(source_volume), C(http(s)://),
        C(hf://<repo>[@<rev>]) or C(s3://bucket/prefix)), optional C(revision), C(include), C(exclude)
        (globs), C(size_bytes) (size hint for sources the controller cannot list), C(hf_endpoint),
        C(s3_endpoint), C(index_url).
    type: list
    elements: dict
    required: true
  air_gapped:
    description: Refuse public hub hosts (huggingface.co, hf.co, modelscope and their subdomains).
    type: bool
    default: false
  hf_endpoint:
    description: Hugging Face mirror for C(hf://) sources (what C(HF_ENDPOINT) is for the hub client).
    type: str
  s3_endpoint:
    description: S3-compatible endpoint for C(s3://) sources (anonymous GET and ListObjectsV2).
    type: str
  insecure:
    description: Skip TLS verification when listing mirrors.
    type: bool
    default: false
  list_sources:
    description: List remote sources from the controller. V(false) trusts C(size_bytes) or O(size).
    type: bool
    default: true
  force:
    description: Replace a different model found in a subdirectory.
    type: bool
    default: false
  size:
    description: PVC size to request (a quantity such as C(60Gi)); empty computes it from the files plus O(headroom_percent).
    type: str
  min_size:
    description: Smallest size to request.
    type: str
    default: 1Gi
  headroom_percent:
    description: Percent added to the files' total.
    type: float
    default: 10
  storage_class_name:
    description: Requested storage class; empty uses the cluster default.
    type: str
  storage_class:
    description: The StorageClass object named O(storage_class_name) as read from the cluster (empty when absent).
    type: dict
  existing_storage_class:
    description: The StorageClass object of the existing PVC (decides whether it can expand).
    type: dict
  existing_pvc:
    description: The PVC as read from the cluster (empty when absent).
    type: dict
  access_modes:
    description: Requested access modes (compared with an existing PVC).
    type: list
    elements: str
    default: []
  controller_address:
    description: Address of this controller that pods can reach; needed for controller-directory sources.
    type: str
  controller_port:
    description: First port for serving controller directories (one port per directory).
    type: int
    default: 8765
  source_volume:
    description: The volume the stager mounts at C(/mnt/source) for C(volume:) sources (only checked for presence).
    type: dict
  verify:
    description: The engine's verify mode in the Job.
    type: str
    choices: [auto, full, quick]
    default: auto
  workers:
    description: Files the stager copies in parallel.
    type: int
  model_mount_path:
    description: Where the InferenceService mounts the PVC (for RV(paths)).
    type: str
    default: /mnt/models
  script_sha256:
    description: sha256 of the sync script, folded into RV(plan_sha256) so a new script makes a new Job.
    type: str
  stager_log:
    description: The stager pod's log. When set, the module checks its summary line instead of planning.
    type: str
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
notes:
  - The kube auth options are accepted so C(module_defaults) of the action group apply; the module does not contact the
    cluster (the role reads the PVC and StorageClass with M(kubernetes.core.k8s_info) and passes them in).
  - Listing HTTP/HF/S3 sources needs the controller to reach them; set O(list_sources=false) with C(size_bytes) otherwise.
"""

EXAMPLES = r"""
- name: Plan the PVC for Llama 3.1 8B and its EAGLE-3 head
  alauda.spec_decoding.pvc_stage_plan:
    pvc_name: llama-models
    items:
      - name: meta-llama/Llama-3.1-8B-Instruct
        subdir: Meta-Llama-3.1-8B-Instruct
        source: hf://meta-llama/Llama-3.1-8B-Instruct
        exclude: ["original/*"]
      - name: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
        subdir: EAGLE3-LLaMA3.1-Instruct-8B
        source: hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
    hf_endpoint: https://hf-mirror.internal.example
    air_gapped: true
    existing_pvc: "{{ pvc_info.resources[0] | default({}) }}"
  register: stage_plan
"""

RETURN = r"""
pvc_action:
  description: C(create), C(reuse) or C(expand).
  returned: planning
  type: str
size:
  description: Storage quantity to request.
  returned: planning
  type: str
  sample: 18Gi
required_bytes:
  description: Files plus headroom, in bytes.
  returned: planning
  type: int
data_bytes:
  description: Total size of the files.
  returned: planning
  type: int
items:
  description: Per item C(name), C(subdir), C(source), C(kind), C(bytes), C(files), C(listed).
  returned: planning
  type: list
  elements: dict
replaced:
  description: Subdirectories whose recorded model differs (only with O(force)).
  returned: planning
  type: list
  elements: str
plan:
  description: The stager's plan (the JSON that goes into the ConfigMap as C(plan.json)).
  returned: planning
  type: dict
plan_json:
  description: RV(plan) serialised.
  returned: planning
  type: str
plan_sha256:
  description: Digest of the plan and the script; the Job name carries its first characters.
  returned: planning
  type: str
serve:
  description: Controller directories to serve to the Job (C(dir), C(port), C(subdir)).
  returned: planning
  type: list
  elements: dict
paths:
  description: subdir -> path inside the InferenceService (e.g. C(/mnt/models/Meta-Llama-3.1-8B-Instruct)).
  returned: planning
  type: dict
storage_uri:
  description: C(pvc://<pvc>/) for the InferenceService.
  returned: planning
  type: str
warnings:
  description: Differences kept as they are (storage class, access modes of an existing PVC).
  returned: planning
  type: list
  elements: str
stager_summary:
  description: The engine's summary parsed from O(stager_log) (C(ok), C(items), C(layout)).
  returned: with stager_log
  type: dict
staged_annotation:
  description: JSON for the PVC annotation C(spec-decoding.alauda.io/staged) built from RV(stager_summary).
  returned: with stager_log
  type: str
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import pvc_plan as pvc_stage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec


def argument_spec():
    # The kubernetes auth options are accepted (module_defaults of the action group set them) but not used: this module
    # only plans, the role applies.
    return argspec(
        pvc_name=dict(type="str", required=True),
        items=dict(type="list", elements="dict", required=True),
        air_gapped=dict(type="bool", default=False),
        hf_endpoint=dict(type="str"),
        s3_endpoint=dict(type="str"),
        insecure=dict(type="bool", default=False),
        list_sources=dict(type="bool", default=True),
        force=dict(type="bool", default=False),
        size=dict(type="str"),
        min_size=dict(type="str", default="1Gi"),
        headroom_percent=dict(type="float", default=10),
        storage_class_name=dict(type="str"),
        storage_class=dict(type="dict"),
        existing_storage_class=dict(type="dict"),
        existing_pvc=dict(type="dict"),
        access_modes=dict(type="list", elements="str", default=[]),
        controller_address=dict(type="str"),
        controller_port=dict(type="int", default=8765),
        source_volume=dict(type="dict"),
        verify=dict(type="str", default="auto", choices=["auto", "full", "quick"]),
        workers=dict(type="int"),
        model_mount_path=dict(type="str", default="/mnt/models"),
        script_sha256=dict(type="str"),
        stager_log=dict(type="str"),
    )


def execute(module):
    params = module.params
    if params["stager_log"] is not None:
        items = pvc_stage.normalize_items(params["items"])
        summary = pvc_stage.parse_stager_log(params["stager_log"], [i["subdir"] for i in items], [i["name"] for i in items])
        staged = pvc_stage.staged_record(params["items"], summary, params["existing_pvc"])
        return dict(changed=False, stager_summary=summary, staged_annotation=staged)
    result = pvc_stage.plan(params)
    for warning in result["warnings"]:
        module.warn(warning)
    return dict(changed=False, **result)


CONTRACT = ModuleContract(argument_spec, execute, cluster=False)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
