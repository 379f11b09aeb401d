#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: draft_preflight_info
short_description: Check a draft against its target from the checkpoints' metadata, before any GPU time
version_added: 0.2.0
description:
  - Reads the small metadata of the target and the draft (C(config.json), C(tokenizer_config.json), the weight tensor
    names from C(model.safetensors.index.json) or the C(model.safetensors) header), never the weights, and checks the pair
    for the speculative method as vLLM does when it loads it (rules read in vLLM 0.32.0, each naming its vLLM function in
    C(plugins/module_utils/vllm/draft_preflight.py); C(docs/preflight.md)).
  - V(draft_model) - same vocabulary size (vLLM refuses otherwise), same special tokens and tokenizer class, a draft smaller
    than its target. V(eagle)/V(eagle3) - the head's architecture is one vLLM knows, its hidden size is the target's, the
    target layers it reads (C(eagle_aux_hidden_state_layer_ids), C(eagle_config.eagle_aux_hidden_state_layer_ids), else
    vLLM's default for the target) exist in the target, a draft vocabulary other than the target's comes with its C(d2t)
    map. A speculators-format checkpoint (C(speculators_config)) - its type, structure, verifier and trained k.
    V(mtp) - the target carries MTP layers for its family and C(num_speculative_tokens) fits them. V(ngram), V(suffix) -
    nothing to open.
  - Sources - a local directory, an http(s) mirror directory, C(hf://org/name[@revision]) (refused when O(air_gapped)), an
    C(oci://) Modelcar image (only the layers holding those files are read), C(s3://bucket/prefix) on O(s3_endpoint)
    (unsigned path-style GETs, as the PVC stager reads S3), C(pvc://claim/path) (one short Job in O(namespace) mounts the
    claims read-only and prints those files; it is deleted once its log is read).
  - A source that cannot be read (unreachable, no C(config.json), no cluster for a PVC) is a warning - the check could
    not run, and the rollout goes on.
  - A refusal (what vLLM refuses at start or crashes on at the first request) fails the task under O(preflight=require),
    naming the file, the field, both values and the fix; under O(preflight=warn) it is a warning.
author:
  - Alauda Platform Team (@alauda)
options:
  target:
    description: Where the target checkpoint is (directory, http(s) URL, C(hf://), C(oci://) image, C(s3://), C(pvc://)).
    type: str
  draft:
    description: Where the draft checkpoint is. Omitted for V(mtp) (the target carries the MTP layers) and the methods without a draft.
    type: str
  target_subdir:
    description: The target's directory under C(/models) in an C(oci://) Modelcar image.
    type: str
    default: target
  draft_subdir:
    description: The draft's directory under C(/models) in an C(oci://) Modelcar image.
    type: str
    default: draft
  method:
    description:
      - The speculative method (as in C(--speculative-config); C(*_mtp) aliases are V(mtp)).
      - Required unless O(name) is given (then the InferenceService's flag names it).
    type: str
  name:
    description:
      - A live InferenceService in O(namespace) whose pair is checked - read-only, as verify re-runs the preflight. Its
        C(--speculative-config) gives the method and keys, C(vllm serve <path>) or C(--model) the target, the config's
        C(model) the draft; each path is mapped to the storage KServe mounts it from (C(storageUris) entries, the
        C(storageUri) at C(/mnt/models)) - a PVC subdirectory, the Modelcar image's directory, or the store's URI.
      - With O(kind=LLMInferenceService), the decode pool's flag after KServe's merge with its presets (well-known and
        C(spec.baseRefs)), the served path of the merged C(main) container (else C(/mnt/models), which KServe's presets
        serve), each path mapped to C(spec.model.uri), which KServe mounts at C(/mnt/models).
    type: str
  kind:
    description: The kind of O(name).
    type: str
    choices: [InferenceService, LLMInferenceService]
    default: InferenceService
  api_version:
    description: The LLMInferenceService API version O(name) is read at.
    type: str
    choices: [v1alpha1, v1alpha2]
    default: v1alpha2
  config_namespace:
    description: KServe's system namespace, where the well-known LLMInferenceServiceConfig presets live (looked up after O(namespace)).
    type: str
    default: kserve
  speculative:
    description: The speculative config's keys the checks read (C(num_speculative_tokens), C(use_heterogeneous_vocab)).
    type: dict
    default: {}
  deploy:
    description:
      - The inference_service role's artifact variables, from which O(target), O(draft) and the image subdirectories are
        taken when not given - C(artifacts) (C(target_uri), C(draft_uri), C(storage_uri), C(modelcar_image), C(pvc_name),
        C(target_subdir), C(draft_subdir)), C(modelcar_build) (C(target_dir), C(draft_dir) - the local build input, read
        first), C(stage_items) and C(stage) (the PVC stager's sources, target then draft).
      - With it, O(speculative) is merged over the method's preset, as the render does.
    type: dict
  vllm_version:
    description: The vLLM release of the runtime; the rules were read from 0.32.0, another release gets a warning.
    type: str
  preflight:
    description: V(require) fails on a refusal, V(warn) reports it as a warning, V(off) reads nothing.
    type: str
    choices: [require, warn, "off"]
    default: require
  air_gapped:
    description: Refuse every source on the internet (C(hf://), a public host or registry), as the deploy does.
    type: bool
    default: false
  hf_endpoint:
    description: The Hugging Face compatible endpoint C(hf://) is read from (default C(HF_ENDPOINT), else the public hub).
    type: str
  registry_username:
    description: User for the Modelcar image's registry.
    type: str
  registry_password:
    description: Password for the Modelcar image's registry.
    type: str
  registry_auth_file:
    description: A C(containers-auth.json) / Docker C(config.json) holding the registry's credentials.
    type: path
  tls_verify:
    description: Verify TLS certificates of the mirror or registry.
    type: bool
    default: true
  ca_file:
    description: CA bundle for the mirror or registry.
    type: path
  s3_endpoint:
    description:
      - The S3-compatible endpoint URL of C(s3://) locations, e.g. V(https://s3.internal:9000).
      - Default O(s3.endpoint), else C(AWS_ENDPOINT_URL_S3), else C(AWS_ENDPOINT_URL).
    type: str
  s3:
    description:
      - S3 access for C(s3://) locations, the C(artifact_credentials_s3) dict the artifact_credentials role stores for
        KServe. With C(access_key_id) and C(secret_access_key) the GETs are signed (AWS Signature Version 4), else anonymous.
      - C(endpoint) (host[:port]) with C(use_https) (default true) gives the endpoint when O(s3_endpoint) is not set;
        C(region) (default V(us-east-1)) signs; C(verify_ssl=false) skips TLS verification; C(use_anonymous_credential)
        sends no signature. The other keys are KServe's and ignored here.
    type: dict
    default: {}
    suboptions:
      access_key_id:
        description: Access key id.
        type: str
      secret_access_key:
        description: Secret access key.
        type: str
      access_key_id_name:
        description: Ignored (the Secret's key name for KServe).
        type: str
      secret_access_key_name:
        description: Ignored (the Secret's key name for KServe).
        type: str
      endpoint:
        description: S3 endpoint host[:port]; a scheme is stripped.
        type: str
      use_https:
        description: Reach O(s3.endpoint) over https.
        type: bool
      region:
        description: The region the signature names.
        type: str
      verify_ssl:
        description: Verify the endpoint's TLS certificate.
        type: bool
      use_virtual_bucket:
        description: Ignored (path-style requests are sent, as the stager sends them).
        type: bool
      use_anonymous_credential:
        description: Send unsigned requests.
        type: bool
      ca_bundle:
        description: Ignored (a path inside KServe's storage initializer).
        type: str
      ca_bundle_configmap:
        description: Ignored (KServe's ConfigMap name).
        type: str
  namespace:
    description: The namespace of the PVC of a C(pvc://) location, where the read Job runs.
    type: str
    default: default
  pvc_image:
    description:
      - The image of the PVC read Job; it needs C(python3). Checked against the air-gap rules with O(air_gapped).
      - Default the PVC stager's default image (C(docker.io/vllm/vllm-openai:latest)).
    type: str
  pvc_job:
    description:
      - Start the read Job for a C(pvc://) location. V(false) (the deploy's GitOps render) and check mode skip the check,
        saying so - neither writes to the cluster.
    type: bool
    default: true
  pvc_timeout:
    description:
      - Seconds the PVC read Job may take (its C(activeDeadlineSeconds)); then the check is reported as not run.
      - A ReadWriteOnce claim that a pod on another node holds cannot be mounted by the Job - the check then waits this long
        and says it did not run; model stores read by several pods are ReadOnlyMany or ReadWriteMany.
    type: int
    default: 120
  pvc_job_annotations:
    description: Annotations of the PVC read Job's pod (e.g. a service mesh's sidecar opt-out); the deploy passes C(spec_decoding_preflight_job_annotations).
    type: dict
    default: {}
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
notes:
  - Reads at most a few MiB per checkpoint (a safetensors header is read with two ranged GETs).
  - A C(pvc://) read needs create, get and delete on jobs, list on pods and get on pods/log in O(namespace); the kubernetes
    library is needed only then.
  - Rules for V(dflash), V(dspark), V(medusa) and V(mlp_speculator) are not taken yet; the result says so.
seealso:
  - module: alauda.spec_decoding.speculative_config
  - module: alauda.spec_decoding.modelcar_image
"""

EXAMPLES = r"""
- name: Check the EAGLE-3 head against its target on the internal mirror
  alauda.spec_decoding.draft_preflight_info:
    target: https://mirror.internal.example/models/Llama-3.1-8B-Instruct/
    draft: https://mirror.internal.example/models/EAGLE3-LLaMA3.1-Instruct-8B/
    method: eagle3
    speculative:
      num_speculative_tokens: 3
    vllm_version: "0.32.0"
  register: preflight

- name: The same pair inside a Modelcar image, reported but not enforced
  alauda.spec_decoding.draft_preflight_info:
    target: oci://registry.internal.example:5000/models/llama-eagle3:v1
    draft: oci://registry.internal.example:5000/models/llama-eagle3:v1
    method: eagle3
    preflight: warn
    registry_auth_file: /run/containers/auth.json

- name: Check the pair a running InferenceService serves (its checkpoints on a PVC), read-only
  alauda.spec_decoding.draft_preflight_info:
    name: llama-eagle3
    namespace: models
    preflight: warn
    pvc_image: registry.internal.example:5000/vllm/vllm-openai:v0.32.0

- name: The same for an LLMInferenceService's decode pool (its flag may come from a preset)
  alauda.spec_decoding.draft_preflight_info:
    name: llama-eagle3
    namespace: models
    kind: LLMInferenceService
    preflight: warn
    pvc_image: registry.internal.example:5000/vllm/vllm-openai:v0.32.0
"""

RETURN = r"""
preflight:
  description:
    - C(method) (the method vLLM runs), C(num_speculative_tokens), C(rules_from_vllm), C(checks) (each with C(check),
      C(status) V(passed), V(failed), V(warning) or V(not checked), C(message), C(figures)), C(figures) (C(target),
      C(draft) - architecture, model_type, layers, hidden size, vocabulary sizes, aux layer ids, trained k; C(target_mtp)),
      C(errors), C(warnings), C(passed), C(mode), C(skipped) (why nothing was read, or null), C(sources) (what was read
      where).
  returned: always
  type: dict
  sample: {"method": "eagle3", "num_speculative_tokens": 3, "rules_from_vllm": "0.32.0", "passed": true, "mode": "require",
           "skipped": null, "errors": [], "warnings": [],
           "checks": [{"check": "aux layers", "status": "passed", "figures": {"aux_layer_ids": [2, 16, 29], "target_layers": 32},
                       "message": "the head reads target layers [2, 16, 29] (vLLM's default for a 32-layer target) of 32"}],
           "figures": {"target": {"architecture": "LlamaForCausalLM", "num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 128256}}}
summary:
  description: One line for the deploy's output and verify's summary.
  returned: always
  type: str
  sample: "preflight eagle3: passed (5 checks, 0 warnings)"
report:
  description: The summary, the target's and the draft's figures and each check that did not pass, one line each (verify's summary shows it).
  returned: always
  type: list
  elements: str
  sample: ["preflight eagle3: passed (5 checks, 0 warnings)",
           "  target (pvc://model-store/target) - LlamaForCausalLM: layers 2, hidden 256, vocabulary 4096"]
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.draft_preflight import preflight, report, summary
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import draft_preflight

OPTIONS = dict(
    target=dict(type="str"),
    draft=dict(type="str"),
    target_subdir=dict(type="str", default="target"),
    draft_subdir=dict(type="str", default="draft"),
    method=dict(type="str"),
    name=dict(type="str"),
    kind=dict(type="str", default="InferenceService", choices=["InferenceService", "LLMInferenceService"]),
    api_version=dict(type="str", default="v1alpha2", choices=["v1alpha1", "v1alpha2"]),
    config_namespace=dict(type="str", default="kserve"),
    speculative=dict(type="dict", default={}),
    deploy=dict(type="dict"),
    vllm_version=dict(type="str"),
    preflight=dict(type="str", default="require", choices=list(draft_preflight.MODES)),
    air_gapped=dict(type="bool", default=False),
    hf_endpoint=dict(type="str"),
    registry_username=dict(type="str"),
    registry_password=dict(type="str", no_log=True),
    registry_auth_file=dict(type="path"),
    tls_verify=dict(type="bool", default=True),
    ca_file=dict(type="path"),
    s3_endpoint=dict(type="str"),
    s3=dict(type="dict", default={}, options=dict(
        access_key_id=dict(type="str", no_log=True), secret_access_key=dict(type="str", no_log=True),
        access_key_id_name=dict(type="str", no_log=False), secret_access_key_name=dict(type="str", no_log=False),
        endpoint=dict(type="str"), use_https=dict(type="bool"), region=dict(type="str"), verify_ssl=dict(type="bool"),
        use_virtual_bucket=dict(type="bool"), use_anonymous_credential=dict(type="bool"), ca_bundle=dict(type="str"),
        ca_bundle_configmap=dict(type="str"))),
    namespace=dict(type="str", default="default"),
    pvc_image=dict(type="str"),
    pvc_job=dict(type="bool", default=True),
    pvc_timeout=dict(type="int", default=120),
    pvc_job_annotations=dict(type="dict", default={}),
)


def argument_spec():
    return argspec(OPTIONS)


def execute(module):
    params = dict(module.params)
    if module.check_mode and params["pvc_job"]:
        params.update(pvc_job=False, pvc_job_off_reason="check mode")
    result = preflight(params, hide=module.no_log_values.add, connect=lambda: module.api_client)
    for text in result["warnings"]:
        module.warn(text)
    return {"changed": False, "preflight": result, "summary": summary(result), "report": report(result)}


# check_k8s/check_pyyaml off: the kubernetes library is imported only when a pvc:// location or an InferenceService
# needs the cluster
CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        required_one_of=[("method", "name")],
    ),
    module_options=dict(check_k8s=False, check_pyyaml=False),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
