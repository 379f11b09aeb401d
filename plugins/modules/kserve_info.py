#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kserve_info
short_description: What a deploy needs to know about the cluster's KServe, in one read
version_added: 0.2.0
description:
  - Reads the InferenceService CustomResourceDefinition and returns the KServe release its schema shows (C(spec.canary)
    means 0.20+, C(spec.predictor.storageUris) 0.16+), not the CRD itself.
  - The schema (about 0.7 MB) is read once per version of the CRD. Each run reads the CRD's metadata only (from the API
    server's watch cache) and keeps the release in C(~/.cache/alauda-spec-decoding/kserve-releases.json) (mode 0600, not
    trusted when another user's or wider) under the API server, the CRD's uid and its resourceVersion, which a KServe
    upgrade changes.
  - A KServe newer than the releases the collection knows (its CRD has fields KServe 0.20's has not, or the storage
    initializer image is tagged with a newer release) is named in a warning and RV(kserve_warning), and RV(kserve_version)
    is the newest release the collection knows, whose rules the render then applies. It is never refused for its number.
  - Reads the cluster's OCI mode from the C(storageInitializer) key of the C(inferenceservice-config) ConfigMap, as KServe
    resolves it (C(ociModelMode) when set, else V(modelcar) when C(enableModelcar) or C(enableOciModelSupport) is true,
    else V(disabled)); what KServe installs (V(modelcar)) when the ConfigMap is not readable. The storage rules depend on
    it (in V(native) mode several C(oci://) entries may share a parent directory; in V(disabled) mode C(oci://) is not mounted).
  - Reads the current InferenceService, if there is one (not for O(resource_kind=LLMInferenceService)).
  - Reads the runtime the InferenceService will use (O(runtime) as a ServingRuntime of O(namespace), else a
    ClusterServingRuntime; without O(runtime) every runtime KServe could auto-select) and returns them as C(runtimes),
    which M(alauda.spec_decoding.isvc_manifest) takes to merge the runtime's command and refuse a second
    C(--speculative-config) before anything is applied.
  - Fails when the cluster has no InferenceService CRD (KServe not installed). A CRD the identity may not read
    (HTTP 403, CRDs are cluster-scoped) is returned as C(crd_readable=false) with C(kserve_version=null), and for
    O(resource_kind=InferenceService) a warning names the release the render assumes instead (O(assumed_kserve_version))
    and the fixes.
author:
  - Alauda Platform Team (@alauda)
options:
  kserve_namespace:
    description: Namespace KServe is installed in (where C(inferenceservice-config) lives).
    type: str
    default: kserve
  runtime:
    description: The ServingRuntime/ClusterServingRuntime name the InferenceService names (C(spec.predictor.model.runtime)).
    type: str
  model_format:
    description: C(spec.predictor.model.modelFormat.name), for KServe's auto-selection when O(runtime) is not given.
    type: str
    default: transformers
  assumed_kserve_version:
    description:
      - The KServe release the caller's render assumes when the CRD cannot be read (the inventory's
        C(spec_decoding_kserve_version)), named in that warning; omitted, the render's default (V(0.20)).
    type: str
  resource_kind:
    description:
      - The kind about to be deployed. For V(LLMInferenceService) only the release and the OCI mode are read (no
        ServingRuntime, no current InferenceService), and a cluster without the InferenceService CRD is not an error.
    type: str
    choices: [InferenceService, LLMInferenceService]
    default: InferenceService
extends_documentation_fragment:
  - alauda.spec_decoding.inference_service
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
notes:
  - Needs C(get) on C(inferenceservices) in O(namespace), C(get) on C(configmaps) in O(kserve_namespace) and, for the
    release, C(get) on C(customresourcedefinitions) (cluster-scoped; see the collection's docs/rbac.md), and C(get)
    (C(list) without O(runtime)) on C(servingruntimes) and C(clusterservingruntimes). Runtimes that cannot be read
    (403) are recorded as such and the render warns.
  - Over a local connection (the collection's inventories, C(delegate_to=localhost)) the reads run in the task's own
    process on the controller (an action plugin with this argument spec), which saves a module process; with C(become),
    a task C(environment), C(async), another connection, or a controller Python without the kubernetes library the
    module runs as usual. The answer is the same either way (without C(invocation) in the first case).
"""

EXAMPLES = r"""
- name: Read what the cluster's KServe supports and the current object
  alauda.spec_decoding.kserve_info:
    name: llama-eagle3
    namespace: models
  register: kserve

- name: Render for that release
  alauda.spec_decoding.isvc_manifest:
    name: llama-eagle3
    namespace: models
    method: eagle3
    kserve_version: "{{ kserve.kserve_version | default(omit, true) }}"
    oci_model_mode: "{{ kserve.oci_model_mode }}"
    existing: "{{ kserve.existing | default(omit, true) }}"
    artifacts:
      pvc_name: model-store
"""

RETURN = r"""
installed:
  description: Whether the InferenceService CRD exists (null when it is not readable).
  returned: success
  type: bool
crd_readable:
  description: Whether the identity may read the CRD.
  returned: success
  type: bool
kserve_version:
  description: Lowest KServe release whose CRD has the fields this one has, e.g. C(0.20.0); null when the CRD is not readable.
  returned: success
  type: str
evidence:
  description: Why that release (or why none).
  returned: success
  type: str
kserve_warning:
  description: Names a KServe newer than the releases the collection knows (null otherwise); its rules are the newest known.
  returned: success
  type: str
oci_model_mode:
  description: The cluster's OCI mode as KServe resolves it from C(storageInitializer).
  returned: success
  type: str
  sample: modelcar
oci_model_mode_evidence:
  description: Where RV(oci_model_mode) comes from.
  returned: success
  type: str
modelcar_enabled:
  description: Whether C(oci://) images are mounted at all (RV(oci_model_mode) is not V(disabled)); kept for older playbooks.
  returned: success
  type: bool
modelcar_evidence:
  description: Where RV(modelcar_enabled) comes from (the same as RV(oci_model_mode_evidence)).
  returned: success
  type: str
existing:
  description: The current InferenceService, or null (always null for O(resource_kind=LLMInferenceService)).
  returned: success
  type: dict
runtimes:
  description:
    - The runtime reads (C(get) and C(list) answers keyed by kind, namespace and name, and the kinds that were forbidden),
      for O(alauda.spec_decoding.isvc_manifest#module:runtimes).
  returned: success
  type: dict
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import facts as kserve_facts
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import INFERENCE_SERVICE_ARG_SPEC, ModuleContract, argspec


def argument_spec():
    return argspec(
        INFERENCE_SERVICE_ARG_SPEC,
        kserve_namespace=dict(type="str", default="kserve"),
        runtime=dict(type="str"),
        model_format=dict(type="str", default="transformers"),
        resource_kind=dict(type="str", default="InferenceService", choices=["InferenceService", "LLMInferenceService"]),
        assumed_kserve_version=dict(type="str"),
    )


def execute(module):
    params = module.params
    facts = kserve_facts.gather(module.api_client, params["namespace"], params["name"], params["kserve_namespace"],
                                runtime=params["runtime"], model_format=params["model_format"], resource_kind=params["resource_kind"])
    if facts["kserve_warning"]:
        module.warn(facts["kserve_warning"])
    if not facts["crd_readable"] and params["resource_kind"] == "InferenceService":
        module.warn(kserve_facts.crd_unreadable_warning(params["assumed_kserve_version"]))
    return dict(changed=False, **facts)


# The API errors the reads do not handle fail with "kserve_info: <error>": an API server that drops the connection
# mid-read fails with its message (urllib3's "Max retries exceeded ... Connection refused"), not a traceback.
CONTRACT = ModuleContract(
    argument_spec, execute,
    failure=dict(
        unexpected="kserve_info",
        unexpected_types=kserve_facts.API_ERRORS,
    ),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
