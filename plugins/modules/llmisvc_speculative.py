#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llmisvc_speculative
short_description: Find or strip vLLM's speculative config on a KServe LLMInferenceService, in every pool and form
version_added: 0.2.0
description:
  - Reads the LLMInferenceService and the C(LLMInferenceServiceConfig) presets KServe's controller merges into it - the
    well-known ones it picks by the resource's shape (C(kserve-config-llm-template), C(kserve-config-llm-decode-template) and
    C(kserve-config-llm-prefill-template) with a prefill pool, the C(...-worker-data-parallel) ones with workers and data
    parallelism, names pinned in C(status.annotations) win) and those its C(spec.baseRefs) name, in the controller's merge
    order, each in its namespace first, then in O(config_namespace) - and reports, per pool (C(decode) = C(spec.template),
    C(prefill) = C(spec.prefill.template), C(worker), C(prefill_worker)) and container, where a speculative flag is and
    what it says - argv in C(command)/C(args), a C(bash -c) script (also with the script in C(args)), or the
    C(VLLM_ADDITIONAL_ARGS) env variable that KServe's data-parallel presets expand, with its C(value) or through
    C(valueFrom.configMapKeyRef) (the ConfigMap's key is read and scanned). A C(valueFrom.secretKeyRef) is never read.
  - O(state=absent) removes the flag and nothing else (token-exact, the same editor as
    M(alauda.spec_decoding.isvc_speculative)) with one JSON patch whose C(test) operations make a concurrent edit fail
    instead of being overwritten. It refuses, before anything is written, naming the preset, when the flag comes from a
    preset the resource does not own (well-known or baseRefs); naming the variable, ConfigMap and key when
    C(VLLM_ADDITIONAL_ARGS) comes from a ConfigMap holding the flag (or one it cannot read); when it comes from a Secret
    (unless O(secret_env_has_no_flag)); and a flag inside a quoted string (C(eval "...")) that cannot be removed token-exact.
  - Needs C(get) on C(llminferenceserviceconfigs) (its namespace and O(config_namespace)) and on C(configmaps) a
    C(VLLM_ADDITIONAL_ARGS) refers to.
  - Writes as the field manager C(alauda-spec-decoding-rollback), like the InferenceService rollback, so the next deploy
    takes the fields back.
author:
  - Alauda Platform Team (@alauda)
options:
  name:
    description: LLMInferenceService name.
    type: str
    required: true
  namespace:
    description: Namespace.
    type: str
    required: true
  api_version:
    description: API version to read and patch.
    type: str
    choices: [v1alpha1, v1alpha2]
    default: v1alpha2
  state:
    description: V(query) only reports; V(absent) strips the flag.
    type: str
    choices: [query, absent]
    default: query
  config_namespace:
    description: KServe's system namespace, where shared C(LLMInferenceServiceConfig) presets live.
    type: str
    default: kserve
  config_prefix:
    description:
      - Prefix of KServe's well-known preset names (the controller's C(LLM_INFERENCE_SERVICE_CONFIG_PREFIX), V(kserve-) by
        default; for example V(v3-4-0-kserve-) where the platform versions them). Names the resource's
        C(status.annotations) pin (C(serving.kserve.io/config-llm-template) ...) win.
    type: str
    default: kserve-
  secret_env_has_no_flag:
    description:
      - C(VLLM_ADDITIONAL_ARGS) set through C(valueFrom.secretKeyRef) is never read, so by default O(state=absent) refuses.
        Set this after checking that the Secret's key holds no speculative flag; the rollback role's engine-line proof
        still checks every pod.
    type: bool
    default: false
extends_documentation_fragment:
  - alauda.spec_decoding.gitops_owner
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
"""

EXAMPLES = r"""
- name: Where is the flag?
  alauda.spec_decoding.llmisvc_speculative:
    name: llama-eagle3
    namespace: models
  register: found

- name: Roll back speculative decoding on every pool
  alauda.spec_decoding.llmisvc_speculative:
    name: llama-eagle3
    namespace: models
    state: absent
"""

RETURN = r"""
flags:
  description:
    - Each flag found before any change, C({pool, container, source, preset, field, forms, config, error}); C(source) is
      V(resource) or C(LLMInferenceServiceConfig/<name>), C(preset) V(well-known), V(baseRefs) or null (with C(preset_namespace)).
    - A C(VLLM_ADDITIONAL_ARGS) from valueFrom adds C(value_from) C({kind, name, key, optional}) and, when its value could not
      be inspected (a Secret, an unreadable ConfigMap), C(opaque) with the reason.
  returned: always
  type: list
  elements: dict
previous_config:
  description: Per pool, the speculative config it carried before (null when none).
  returned: always
  type: dict
changes:
  description: Each field edited, C({pool, container, field, before, after}).
  returned: always
  type: list
  elements: dict
patch:
  description: The JSON patch sent (empty when nothing changed).
  returned: always
  type: list
  elements: dict
generation:
  description: metadata.generation after the change (what a wait must see observed).
  returned: always
  type: int
resource:
  description: The LLMInferenceService after the change (or as read, in check mode and with O(state=query)).
  returned: always
  type: dict
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops.owner import GITOPS_OWNER_ARG_SPEC
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec


def argument_spec():
    return argspec(
        GITOPS_OWNER_ARG_SPEC,
        name=dict(type="str", required=True),
        namespace=dict(type="str", required=True),
        api_version=dict(type="str", default="v1alpha2", choices=["v1alpha1", "v1alpha2"]),
        state=dict(type="str", default="query", choices=["query", "absent"]),
        config_namespace=dict(type="str", default="kserve"),
        config_prefix=dict(type="str", default=llmisvc.WELL_KNOWN_PREFIX),
        secret_env_has_no_flag=dict(type="bool", default=False),
    )


def execute(module):
    changed, result = rollback.strip_llmisvc(module.api_client, module.params, check_mode=module.check_mode,
                                             diff=module._diff, warn=module.warn)  # pylint: disable=protected-access
    return dict(changed=changed, **result)


CONTRACT = ModuleContract(argument_spec, execute)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
