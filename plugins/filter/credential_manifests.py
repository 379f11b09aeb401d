# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: credential_manifests
short_description: Secrets and ServiceAccount for private hf://, s3:// and OCI artifact sources, as KServe expects them
version_added: 0.1.0
description:
  - Takes the credential settings (a dict) and returns the manifests to apply (O(target=cluster)) or to commit
    (O(target=gitops)).
  - C(cluster) returns Secrets with their values (base64 in C(data)), so keep the task that uses them behind
    C(no_log). An C(HF_TOKEN) Secret for C(hf://), an C(AWS_ACCESS_KEY_ID)/C(AWS_SECRET_ACCESS_KEY) Secret
    with the C(serving.kserve.io/s3-*) annotations for C(s3://), a C(kubernetes.io/dockerconfigjson) Secret for
    registries, and a ServiceAccount listing the storage Secrets in C(secrets) and the pull Secret in
    C(imagePullSecrets).
  - C(gitops) never carries a value; per Secret it returns an ExternalSecret, a SealedSecret placeholder or only a
    note saying which Secret must exist (C(gitops_style) V(external_secret), V(sealed_secret), V(reference)).
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description:
      - Settings with keys C(namespace), C(service_account_name), C(hf_token), C(s3) (C(access_key_id),
        C(secret_access_key), C(endpoint), C(use_https), C(region), C(verify_ssl), ...), C(registries) (list of
        C(server), C(username), C(password)), C(existing_secrets), C(existing_pull_secrets), the Secret names, and
        for GitOps C(gitops_style), C(external_secret_store), C(hf_enabled), C(s3_enabled), C(registry_enabled).
    type: dict
    required: true
  target:
    description: V(cluster) (values included) or V(gitops) (no values).
    type: str
    default: cluster
    choices: [cluster, gitops]
"""

EXAMPLES = r"""
- name: Secrets and ServiceAccount for the storage initializer and Modelcar pulls
  kubernetes.core.k8s:
    definition: "{{ item }}"
  loop: "{{ (settings | alauda.spec_decoding.credential_manifests).secrets }}"
  no_log: true
"""

RETURN = r"""
_value:
  description:
    - With O(target=cluster) C(secrets), C(service_account), C(secret_names), C(pull_secret_names),
      C(service_account_name), C(namespace), C(secret_values); with O(target=gitops) C(manifests), C(notes) and the names.
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import credentials
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError


def credential_manifests(settings, target="cluster"):
    """settings dict -> plan dict (see module_utils.credentials)."""
    if not isinstance(settings, dict):
        raise AnsibleFilterError("credential_manifests: expects a dict of settings, got %s" % type(settings).__name__)
    try:
        if target == "gitops":
            return credentials.build_gitops_plan(settings)
        if target == "cluster":
            return credentials.build_cluster_plan(settings)
    except SpecDecodingError as exc:
        raise AnsibleFilterError("credential_manifests: %s" % exc) from exc
    raise AnsibleFilterError("credential_manifests: target must be cluster or gitops, got %r" % (target,))


class FilterModule:
    """Artifact credentials."""

    def filters(self):
        return {"credential_manifests": credential_manifests}
