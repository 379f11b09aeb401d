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
    C(oci://) Modelcar image (only the layers holding those files are read). A C(pvc://) or C(s3://) location is not read
    yet - the result says the preflight was skipped and why.
  - A refusal (what vLLM refuses at start or crashes on at the first request) fails the task under O(preflight=require),
    naming the file, the field, both values and the fix; under O(preflight=warn) it is a warning.
author:
  - Alauda Platform Team (@alauda)
options:
  target:
    description: Where the target checkpoint is (directory, http(s) URL, C(hf://), C(oci://) image).
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
    description: The speculative method (as in C(--speculative-config); C(*_mtp) aliases are V(mtp)).
    type: str
    required: true
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
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
notes:
  - Reads at most a few MiB per checkpoint (a safetensors header is read with two ranged GETs).
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
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import model_metadata
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import run
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import draft_preflight, speculative_config

ARGUMENT_SPEC = dict(
    target=dict(type="str"),
    draft=dict(type="str"),
    target_subdir=dict(type="str", default="target"),
    draft_subdir=dict(type="str", default="draft"),
    method=dict(type="str", required=True),
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
)


def summary(result):
    if result.get("skipped"):
        return "preflight %s: skipped (%s)" % (result["method"], result["skipped"])
    state = "passed" if result["passed"] else "REFUSED" if result["mode"] == "require" else "failed (warn only)"
    return "preflight %s: %s (%d checks, %d warnings)" % (result["method"], state, len(result["checks"]), len(result["warnings"]))


def preflight(params, hide=None):
    """The module's work as a function of its parameters (the role and the tests call it the same way)."""
    mode = params["preflight"]
    method = draft_preflight.normalized_method(params["method"], None)
    base = {"method": method, "mode": mode, "skipped": None, "sources": {}, "checks": [], "figures": {}, "errors": [],
            "warnings": [], "passed": True, "num_speculative_tokens": (params["speculative"] or {}).get("num_speculative_tokens"),
            "rules_from_vllm": draft_preflight.RULES_RELEASE}
    if mode == "off":
        base["skipped"] = "preflight: off"
        return base
    if method in draft_preflight.NO_DRAFT_METHODS:
        result = draft_preflight.run(method, None, None, params["speculative"], params["vllm_version"])
        result.update(mode=mode, skipped=None, sources={})
        return result
    params = dict(params)
    deploy = params.get("deploy")
    if deploy is not None:
        found = model_metadata.sources_from_deploy(deploy.get("artifacts"), deploy.get("modelcar_build"), deploy.get("stage_items"),
                                                   bool(deploy.get("stage")))
        if not params["target"] and not params["draft"] and found["skipped"]:
            base["skipped"] = found["skipped"]
            return base
        params["target"] = params["target"] or found["target"]
        # mtp drafts with the target's own layers: a draft location of the deploy is not the MTP checkpoint
        params["draft"] = params["draft"] or (found["draft"] if method != "mtp" else None)
        params["target_subdir"], params["draft_subdir"] = found["target_subdir"], found["draft_subdir"]
        params["speculative"] = dict(speculative_config.PRESETS.get(method) or {}, **(params["speculative"] or {}))
        base["num_speculative_tokens"] = params["speculative"].get("num_speculative_tokens")
    registry = {"username": params["registry_username"], "password": params["registry_password"],
                "auth_file": params["registry_auth_file"], "tls_verify": params["tls_verify"], "ca_file": params["ca_file"]}
    if registry["password"] and hide is not None:
        hide(registry["password"])
    wanted = [("target", params["target"], params["target_subdir"])]
    if method != "mtp" or params["draft"]:
        wanted.append(("draft", params["draft"], params["draft_subdir"]))
    read = {}
    for role, location, subdir in wanted:
        if not location and deploy is not None:
            # the deploy's render refuses a method without its draft, naming the inventory variable: said there, not here
            base["skipped"] = "no %s location in the deploy's variables" % role
            return base
        if not location:
            raise ValidationError("no %s location given for method %s" % (role, method), field=role,
                                  hint="give the %s's directory, http(s) URL, hf:// or oci:// image, or set preflight: off" % role)
        kind = model_metadata.location_kind(location)
        if kind not in model_metadata.READABLE:
            base["skipped"] = "the %s is a %s location (%s), which the preflight does not read yet" % (role, kind, location)
            return base
        try:
            read[role] = model_metadata.read_location(location, air_gapped=params["air_gapped"], hf_endpoint=params["hf_endpoint"],
                                                      subdir=subdir, registry=registry, field=role)
        except model_metadata.MetadataUnreadable as exc:
            # The check could not run: said so, and it does not stop the rollout (the pods may reach what this host cannot).
            base["warnings"].append("preflight not run, the rollout goes on: %s" % exc)
            base["skipped"] = str(exc)
            return base
        base["sources"][role] = {"location": location, "files_read": read[role]["files_read"],
                                 "layers_read": read[role].get("layers_read")}
    result = draft_preflight.run(params["method"], read.get("target"), read.get("draft"), params["speculative"], params["vllm_version"])
    result.update(mode=mode, skipped=None, sources=base["sources"])
    result["warnings"] = draft_preflight.enforce(result, mode)
    return result


def execute(module):
    result = preflight(module.params, hide=module.no_log_values.add)
    for text in result["warnings"]:
        module.warn(text)
    return {"changed": False, "preflight": result, "summary": summary(result)}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run(module, execute)


if __name__ == "__main__":
    main()
