#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: isvc_manifest
short_description: Render a KServe InferenceService that runs vLLM, with or without speculative decoding
version_added: 0.1.0
description:
  - Renders the InferenceService in the shape the speculative-decoding guide uses (annotations, runtime label,
    C(bash -c) command running C(python3 -m vllm.entrypoints.openai.api_server), env, resources, seccomp profile).
  - Derives the storage fields and the C(--model) and draft paths from the artifact mode
    (V(storage_uris), V(modelcar), V(pvc), V(single), or V(auto)), so no path is typed twice.
  - Enforces KServe's rules before anything is written, including the C(x-kubernetes-validations) (CEL) rules of the
    kind's CRD (see O(kserve_crds)), validates the speculative config for the vLLM release,
    and refuses a C(deploymentMode) change when O(existing) is the object on the cluster.
  - Pure computation; the role M(alauda.spec_decoding.inference_service) applies or writes the result.
author:
  - Alauda Platform Team (@alauda)
options:
  name:
    description: InferenceService name (DNS-1123 label).
    type: str
    required: true
  namespace:
    description: Namespace (DNS-1123 label).
    type: str
    required: true
  method:
    description: Speculative method; V(none) renders the baseline with everything else identical.
    type: str
    choices: [none, ngram, eagle3, eagle, draft_model, mtp, suffix, custom_class]
    default: none
  speculative:
    description:
      - Keys of the speculative config merged over the method's preset (for example C(num_speculative_tokens)).
      - The draft C(model) path is derived from the artifact mode; give it here only to check it agrees.
    type: dict
  artifact_mode:
    description: How target and draft reach the pod (the guide's options A, B, C), or V(single) for one artifact.
    type: str
    choices: [auto, storage_uris, modelcar, pvc, single]
    default: auto
  artifacts:
    description:
      - Artifact locations. Keys C(storage_uri) (single), C(target_uri), C(draft_uri), C(target_mount_path),
        C(draft_mount_path) (storage_uris), C(modelcar_image) (modelcar), C(pvc_name) (pvc), C(target_subdir),
        C(draft_subdir) (modelcar and pvc layouts), C(target_path), C(draft_path) (explicit paths inside what is mounted).
    type: dict
    default: {}
  kserve_version:
    description:
      - KServe release of the cluster. When omitted it is detected from O(kserve_crd), else 0.20 is assumed (with a warning).
      - A release newer than the collection knows (after 0.20) is rendered with 0.20's rules, with a warning naming it.
    type: str
  kserve_crd:
    description: The C(inferenceservices.serving.kserve.io) CustomResourceDefinition, to detect what the cluster's KServe supports.
    type: dict
  kserve_crds:
    description:
      - A CustomResourceDefinition file, or a directory of them (such as the cluster's own, C(kubectl get crd NAME -o yaml)),
        whose C(x-kubernetes-validations) (CEL) rules the manifest must pass. Without it the rules of the KServe release the
        collection ships are used (the newest one not newer than O(kserve_version); KServe 0.20 today).
      - Either way a manifest that breaks a rule is refused with the rule's message and field before anything is written; a
        rule that cannot be evaluated here is named in a warning and in RV(cel_rules), never passed in silence.
    type: path
  oci_model_mode:
    description:
      - The cluster's OCI mode (C(storageInitializer) of KServe's C(inferenceservice-config) ConfigMap, as
        M(alauda.spec_decoding.kserve_info) returns it), which KServe's storage rules depend on. V(modelcar) (what KServe
        installs) and V(fetch) need a different parent directory for each C(oci://) C(storageUris) entry; V(native)
        (Kubernetes ImageVolumes) only a different path; V(disabled) mounts no C(oci://) image, so one is refused.
        An C(oci+native://) URI is mounted as an ImageVolume in every mode.
      - When omitted, V(disabled) if O(modelcar_enabled=false), else V(modelcar). For GitOps renders (no cluster to read)
        set it to the target cluster's mode.
    type: str
    choices: [modelcar, native, fetch, disabled]
  modelcar_enabled:
    description:
      - Whether the storage initializer mounts C(oci://) images; O(oci_model_mode) says more and wins when given.
    type: bool
    default: true
  vllm_version:
    description: vLLM release of the runtime image; the speculative config is validated for it.
    type: str
  runtime:
    description: KServe ServingRuntime name (C(spec.predictor.model.runtime)).
    type: str
    required: true
  deployment_mode:
    description: KServe deployment mode; legacy names are accepted and rendered as their new names.
    type: str
    choices: [Standard, Knative, RawDeployment, Serverless]
    default: Standard
  model_repo:
    description: Value of the C(aml-model-repo) annotation.
    type: str
  served_model_name:
    description: C(--served-model-name); defaults to O(name).
    type: str
  dtype:
    description: C(--dtype) (also the C(DTYPE) env variable).
    type: str
    default: auto
  gpu_memory_utilization:
    description: C(--gpu-memory-utilization) before the draft headroom is taken off.
    type: float
    default: 0.9
  draft_memory_headroom:
    description: Fraction taken off O(gpu_memory_utilization) when the method loads draft weights (they are outside vLLM's budget).
    type: float
    default: 0.05
  max_model_len:
    description: C(--max-model-len).
    type: int
    default: 8192
  max_num_seqs:
    description: C(--max-num-seqs).
    type: int
    default: 64
  seed:
    description: C(--seed).
    type: int
    default: 42
  kv_cache_memory_bytes:
    description: Optional C(--kv-cache-memory-bytes).
    type: int
  extra_args:
    description: More server flags, appended before C(--speculative-config).
    type: list
    elements: str
    default: []
  per_request_metrics:
    description:
      - vLLM's C(--per-request-spec-decode-metrics) on the speculative side (each response carries its own acceptance in
        C(metrics.speculative_decoding); the benchmark's per-class report reads it). Never on a baseline (O(method=none)),
        since vLLM refuses the flag without C(--speculative-config).
      - C(auto) renders C(summary) where the O(vllm_version) release has the flag (vLLM 0.32 and newer) and nothing, with a
        note in RV(per_request_metrics), where not; C(summary) or C(detailed) on a release without it fail before anything
        is written; C(off) renders nothing.
    type: str
    choices: [auto, summary, detailed, "off"]
    default: auto
  env:
    description: More environment variables for the model container.
    type: dict
    default: {}
  model_format:
    description: C(modelFormat.name).
    type: str
    default: transformers
  runtimes:
    description:
      - The ServingRuntime/ClusterServingRuntime reads of M(alauda.spec_decoding.kserve_info) (its C(runtimes) result).
        With them the render merges the runtime's C(kserve-container) with the predictor the way KServe does and applies
        O(runtime_flag); without them the runtime is not checked (GitOps renders).
    type: dict
  runtime_flag:
    description:
      - With O(runtimes). V(refuse) fails when C(--speculative-config) would reach vLLM from the runtime as well as from
        the InferenceService (vLLM takes the last one), naming the runtime and its kind; V(replace) lets the
        InferenceService's flag (the last one) win with a warning. A flag that only the runtime carries always fails.
    type: str
    default: refuse
    choices: [refuse, replace]
  air_gapped:
    description:
      - With O(runtimes), for an InferenceService. Fails when the image of the ServingRuntime (or ClusterServingRuntime)
        that O(runtime) names, which KServe runs as the predictor's C(kserve-container), is on a public registry or has
        no registry host, naming the runtime, the image and the fix, before anything is rendered. The role
        C(alauda.spec_decoding.inference_service) sets it from C(spec_decoding_air_gapped).
    type: bool
    default: false
  protocol_version:
    description: C(protocolVersion).
    type: str
    default: v2
  command_style:
    description: V(bash) renders C(command=[bash, -c, script]) as the guide does; V(args) renders an argv list in C(args).
    type: str
    choices: [bash, args]
    default: bash
  resources:
    description: Resource amounts set as both requests and limits (for example C(cpu), C(memory)).
    type: dict
    default: {}
  gpu_count:
    description: C(nvidia.com/gpu) limit; 0 leaves it out.
    type: int
    default: 1
  min_replicas:
    description: C(predictor.minReplicas).
    type: int
    default: 1
  max_replicas:
    description: C(predictor.maxReplicas).
    type: int
    default: 1
  startup_timeout_seconds:
    description:
      - How long a cold start may take (a draft adds about 5 minutes). Sets the startup probe window in Standard mode
        and C(serving.knative.dev/progress-deadline) in Knative mode.
    type: int
    default: 1800
  service_account_name:
    description: C(predictor.serviceAccountName), for private artifact sources.
    type: str
  annotations:
    description:
      - More C(metadata.annotations) (strings), merged with the collection's own (C(serving.kserve.io/deploymentMode),
        C(aml-model-repo), C(serving.knative.dev/progress-deadline) in Knative mode).
      - A key the collection sets with another value is refused, naming the option that sets it (for example
        O(deployment_mode)); the same value is accepted. Keys and the total size follow Kubernetes' annotation rules.
    type: dict
    default: {}
  labels:
    description:
      - More C(metadata.labels), merged with the collection's C(aml.cpaas.io/runtime-type=vllm) (a different value for it
        is refused). Keys and values follow Kubernetes' label rules (values at most 63 characters).
    type: dict
    default: {}
  existing:
    description: The InferenceService currently on the cluster, if any (from M(kubernetes.core.k8s_info)).
    type: dict
  resource_kind:
    description:
      - V(InferenceService) (the default) or KServe's V(LLMInferenceService), rendered from the same options plus O(llmisvc).
      - An LLMInferenceService takes one C(spec.model.uri) (C(pvc://), C(oci://), C(hf://), C(s3://)), so a draft comes in
        the Modelcar image or on the PVC with the target; O(artifact_mode=storage_uris) with a draft is refused.
        O(runtime), O(runtimes) and O(runtime_flag) do not apply to it.
    type: str
    choices: [InferenceService, LLMInferenceService]
    default: InferenceService
  llmisvc:
    description: What only an O(resource_kind=LLMInferenceService) has.
    type: dict
    default: {}
    suboptions:
      api_version:
        description: V(v1alpha2) (the CRD's storage version) or V(v1alpha1).
        type: str
        choices: [v1alpha1, v1alpha2]
        default: v1alpha2
      image:
        description: Image of the C(main) container; required unless O(llmisvc.base_refs) names a preset that sets it.
        type: str
      base_refs:
        description: Names of C(LLMInferenceServiceConfig) presets (C(spec.baseRefs)).
        type: list
        elements: str
      parallelism:
        description:
          - C(spec.parallelism) (C(tensor), C(pipeline), C(data), C(dataLocal), C(dataRPCPort), C(expert)). C(tensor) and
            C(pipeline) also become C(--tensor-parallel-size) and C(--pipeline-parallel-size); the draft's
            C(draft_tensor_parallel_size) must then be 1 or C(tensor).
        type: dict
      prefill:
        description: A prefill pool (C(spec.prefill)) for prefill/decode disaggregation, for example a dict with C(replicas) 1.
        type: dict
      speculative_pools:
        description: Pools that get the speculative config; V([decode]) by default, V([decode, prefill]) on request. Prefill only is refused.
        type: list
        elements: str
      criticality:
        description: C(spec.model.criticality) (v1alpha1 only).
        type: str
      kv_cache_offloading:
        description: C(spec.kvCacheOffloading) (v1alpha2 only).
        type: dict
      confidential:
        description: C(spec.model.confidential) (v1alpha2 only).
        type: dict
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - PyYAML
  - cel-expr-python (the CRDs' CEL rules)
"""

EXAMPLES = r"""
- name: Render the EAGLE-3 service from a PVC holding target and draft
  alauda.spec_decoding.isvc_manifest:
    name: llama-eagle3
    namespace: models
    method: eagle3
    artifact_mode: pvc
    artifacts:
      pvc_name: model-store
      target_subdir: Meta-Llama-3.1-8B-Instruct
      draft_subdir: EAGLE3-LLaMA3.1-Instruct-8B
    runtime: aml-vllm-0.32.0
    vllm_version: "0.32.0"
  register: rendered

- name: The same as a KServe LLMInferenceService with a prefill pool and two-way tensor parallelism
  alauda.spec_decoding.isvc_manifest:
    resource_kind: LLMInferenceService
    name: llama-eagle3
    namespace: models
    method: eagle3
    artifact_mode: pvc
    artifacts:
      pvc_name: model-store
    runtime: unused
    llmisvc:
      image: registry.local/vllm/vllm-openai:v0.32.0
      parallelism:
        tensor: 2
      prefill:
        replicas: 1
"""

RETURN = r"""
manifest:
  description: The InferenceService.
  returned: success
  type: dict
manifest_yaml:
  description: The manifest as deterministic YAML (what GitOps mode writes).
  returned: success
  type: str
speculative_json:
  description: Canonical C(--speculative-config) JSON, or null for the baseline.
  returned: success
  type: str
  sample: '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'
artifact_mode:
  description: The artifact mode used (the one V(auto) chose).
  returned: success
  type: str
  sample: pvc
target_path:
  description: The C(--model) path inside the pod.
  returned: success
  type: str
draft_path:
  description: The draft model path inside the pod, or null.
  returned: success
  type: str
filename:
  description: File name the GitOps target uses for this manifest.
  returned: success
  type: str
runtime_check:
  description:
    - The merged command KServe will run (C(command), C(args), C(source) of the flag vLLM takes, C(sources), C(runtime)
      with its kind and name), as M(alauda.spec_decoding.serving_runtime_info) returns it; null without O(runtimes).
  returned: success
  type: dict
  sample: models-llama-eagle3.yaml
cel_rules:
  description:
    - The CRD's C(x-kubernetes-validations) rules checked on the manifest (a manifest that breaks one fails the task).
    - C(source) is the shipped KServe release or O(kserve_crds), C(evaluated) how many rules ran, C(not_evaluated) the
      C(field), C(rule) and C(reason) of each rule that could not be evaluated (for example a transition rule on a create).
  returned: success
  type: dict
  sample: {"source": "KServe 0.20's CRDs (shipped with the collection)", "evaluated": 3, "not_evaluated": []}
resource_kind:
  description: The kind rendered (O(resource_kind)).
  returned: success
  type: str
  sample: LLMInferenceService
api_version:
  description: C(apiVersion) of the manifest.
  returned: success
  type: str
  sample: serving.kserve.io/v1alpha2
per_request_metrics:
  description:
    - What O(per_request_metrics) rendered, C(mode) (C(summary), C(detailed) or null when the flag is not rendered) and
      C(note) (why not, for example a vLLM release without the flag; null otherwise).
  returned: success
  type: dict
  sample: {"mode": "summary", "note": null}
warnings:
  description: Advice that does not block the rollout.
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import air_gap
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import crd_rules
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import render as llmisvc_render
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract


def argument_spec():
    return dict(
        name=dict(type="str", required=True),
        namespace=dict(type="str", required=True),
        method=dict(type="str", default="none", choices=list(isvc.METHODS)),
        speculative=dict(type="dict"),
        artifact_mode=dict(type="str", default="auto", choices=list(isvc.ARTIFACT_MODES)),
        artifacts=dict(type="dict", default={}),
        kserve_version=dict(type="str"),
        kserve_crd=dict(type="dict"),
        oci_model_mode=dict(type="str", choices=["modelcar", "native", "fetch", "disabled"]),
        kserve_crds=dict(type="path"),
        modelcar_enabled=dict(type="bool", default=True),
        vllm_version=dict(type="str"),
        runtime=dict(type="str", required=True),
        deployment_mode=dict(type="str", default="Standard", choices=["Standard", "Knative", "RawDeployment", "Serverless"]),
        model_repo=dict(type="str"),
        served_model_name=dict(type="str"),
        dtype=dict(type="str", default="auto"),
        gpu_memory_utilization=dict(type="float", default=0.9),
        draft_memory_headroom=dict(type="float", default=0.05),
        max_model_len=dict(type="int", default=8192),
        max_num_seqs=dict(type="int", default=64),
        seed=dict(type="int", default=42),
        kv_cache_memory_bytes=dict(type="int"),
        extra_args=dict(type="list", elements="str", default=[]),
        per_request_metrics=dict(type="str", default="auto", choices=["auto", "summary", "detailed", "off"]),
        env=dict(type="dict", default={}),
        model_format=dict(type="str", default="transformers"),
        protocol_version=dict(type="str", default="v2"),
        command_style=dict(type="str", default="bash", choices=["bash", "args"]),
        resources=dict(type="dict", default={}),
        gpu_count=dict(type="int", default=1),
        min_replicas=dict(type="int", default=1),
        max_replicas=dict(type="int", default=1),
        startup_timeout_seconds=dict(type="int", default=1800),
        service_account_name=dict(type="str"),
        annotations=dict(type="dict", default={}),
        labels=dict(type="dict", default={}),
        existing=dict(type="dict"),
        runtimes=dict(type="dict"),
        runtime_flag=dict(type="str", default="refuse", choices=["refuse", "replace"]),
        air_gapped=dict(type="bool", default=False),
        resource_kind=dict(type="str", default="InferenceService", choices=["InferenceService", "LLMInferenceService"]),
        llmisvc=dict(type="dict", default={}, options=dict(
            api_version=dict(type="str", default="v1alpha2", choices=["v1alpha1", "v1alpha2"]),
            image=dict(type="str"),
            base_refs=dict(type="list", elements="str"),
            parallelism=dict(type="dict"),
            prefill=dict(type="dict"),
            speculative_pools=dict(type="list", elements="str"),
            criticality=dict(type="str"),
            kv_cache_offloading=dict(type="dict"),
            confidential=dict(type="dict"),
        )),
    )


def execute(module):
    if not isvc.HAS_YAML:
        module.fail_json(msg=missing_required_lib("PyYAML"))
    if not crd_rules.HAS_CEL:
        module.fail_json(msg=missing_required_lib(crd_rules.LIBRARY))
    params = dict(module.params)
    existing = params.pop("existing")
    kind = params.pop("resource_kind")
    if params.pop("air_gapped") and kind != llmisvc_model.KIND and params["runtimes"]:
        refused = air_gap.messages({"runtimes": params["runtimes"], "namespace": params["namespace"], "runtime": params["runtime"]})
        if refused:
            module.fail_json(msg=" | ".join(refused))
    if kind == llmisvc_model.KIND:
        rendered = llmisvc_render.render(params, existing=existing)
    else:
        rendered = isvc.render(params, existing=existing)
    for warning in rendered["warnings"]:
        module.warn(warning)
    manifest = rendered["manifest"]
    spec = rendered["speculative"]
    art = rendered["artifacts"]
    return dict(changed=False, manifest=manifest, manifest_yaml=isvc.to_yaml(manifest),
                speculative_json=spec.json if spec else None, artifact_mode=art.mode,
                target_path=art.target_path, draft_path=art.draft_path,
                filename=(llmisvc_render.manifest_filename(manifest) if kind == llmisvc_model.KIND else isvc.manifest_filename(manifest)),
                runtime_check=rendered["runtime_check"], resource_kind=kind, api_version=manifest["apiVersion"],
                cel_rules={k: v for k, v in rendered["cel_rules"].items() if k != "warnings"},
                per_request_metrics=rendered["per_request_metrics"])


CONTRACT = ModuleContract(argument_spec, execute, cluster=False)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
