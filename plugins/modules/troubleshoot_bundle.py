#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: troubleshoot_bundle
short_description: Collect what to look at for failing vLLM InferenceServices into one archive, with a likely cause
version_added: 0.1.0
description:
  - For each named InferenceService reads, through the API server, what the guide says to look at
    the InferenceService (spec, status, conditions, events, as C(kubectl describe) shows them), its predictor
    Deployment, the predictor pods and their events, the last O(tail_lines) lines of every predictor container log
    (init containers too; current and previous instance), and the KServe C(inferenceservice-config)
    C(storageInitializer) settings (Modelcar on or off), and the ServingRuntime or ClusterServingRuntime KServe merges
    into the predictor with the merged command (C(effective_command.json), saying where C(--speculative-config) comes from).
  - Finds the vLLM version and the speculative config in the engine-config line of the logs, and acceptance from the
    C(SpecDecoding metrics:) lines; results of M(alauda.spec_decoding.engine_config_info) and
    M(alauda.spec_decoding.speculative_metrics_info) given in O(engine_results) and O(metrics_results) are used and stored too.
  - Writes one C(tar.gz) archive and a short C(summary.md) beside it that names the likely cause per InferenceService
    (pending pod, image pull, OOM, crash at startup, readiness deadline too short for a draft, acceptance near zero,
    deploymentMode change rejected, Modelcar off, ...), with evidence and the fix.
  - Secret values are redacted everywhere, in the archive and in the returned data - values of the Secrets the pods and
    their ServiceAccount reference (when readable), O(redact), token-like arguments and environment variables.
author:
  - Alauda Platform Team (@alauda)
options:
  names:
    description:
      - InferenceServices to look at, V(name) (in O(namespace)) or V(namespace/name).
    type: list
    elements: str
    required: true
  namespace:
    description: Namespace for names given without one.
    type: str
    default: default
  tail_lines:
    description: Lines kept from the end of every container log.
    type: int
    default: 500
  dest:
    description: Directory that receives the archive and the summary (created if missing).
    type: path
    required: true
  archive_name:
    description: File name of the archive; default C(troubleshoot-<UTC time>.tar.gz).
    type: str
  engine_results:
    description: Registered results of M(alauda.spec_decoding.engine_config_info), keyed by V(namespace/name).
    type: dict
    default: {}
  metrics_results:
    description: Registered results of M(alauda.spec_decoding.speculative_metrics_info), keyed by V(namespace/name).
    type: dict
    default: {}
  kserve_namespaces:
    description: Namespaces searched, in order, for the C(inferenceservice-config) ConfigMap.
    type: list
    elements: str
    default: [kserve, kubeflow, opendatahub, redhat-ods-applications, default]
  expected_deployment_mode:
    description: The deploymentMode the inventory or GitOps manifest asks for; a difference from the live one is reported.
    type: str
  deploy_errors:
    description: Error text of a failed deploy or GitOps sync (for example the webhook's message), searched by the rules.
    type: list
    elements: str
    default: []
  redact:
    description: Extra values to hide (tokens, passwords); never written, never returned.
    type: list
    elements: str
    default: []
  read_referenced_secrets:
    description:
      - Read the Secrets the pods (C(secretKeyRef), C(envFrom)) and their ServiceAccount reference, only to redact their values
        wherever they appear in logs. Needs get on secrets; without it only the other redaction applies.
    type: bool
    default: true
  timeout:
    description: Seconds allowed for each API server request.
    type: int
    default: 60
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
  - kubernetes.core.k8s_auth_options
notes:
  - Needs get/list on inferenceservices, pods, pods/log, events, deployments and configmaps in the KServe namespace.
  - In check mode everything is read and diagnosed, nothing is written (RV(members) lists what would be written).
  - Always reports C(changed) (a new archive each run).
seealso:
  - module: alauda.spec_decoding.engine_config_info
  - module: alauda.spec_decoding.speculative_metrics_info
"""

EXAMPLES = r"""
- name: Bundle for two InferenceServices
  alauda.spec_decoding.troubleshoot_bundle:
    names: [models/llama-eagle3, models/llama-ngram]
    dest: ./troubleshoot-out
    tail_lines: 300
  register: bundle

- name: Print the likely causes
  ansible.builtin.debug:
    msg: "{{ bundle.summary }}"
"""

RETURN = r"""
archive:
  description: Path of the archive (not written in check mode).
  returned: always
  type: str
  sample: /work/troubleshoot-out/troubleshoot-20250101T120000Z.tar.gz
summary_path:
  description: Path of the summary written beside the archive.
  returned: always
  type: str
summary:
  description: The summary text (Markdown), redacted.
  returned: always
  type: str
members:
  description: Files in the archive.
  returned: always
  type: list
  elements: str
services:
  description: Per InferenceService C(namespace), C(name), C(likely_cause), C(vllm_version), C(modelcar), C(owner) (who manages
    it - Argo CD, Flux, Helm - as M(alauda.spec_decoding.gitops_owner_info) returns it; null when it could not be read) and
    C(findings) (each with C(cause), C(severity), C(title), C(evidence), C(fix)).
  returned: always
  type: list
  elements: dict
  sample: [{"namespace": "models", "name": "llama-eagle3", "likely_cause": "readiness_deadline", "vllm_version": "0.32.0",
            "findings": [{"cause": "readiness_deadline", "severity": "error", "title": "...", "evidence": ["..."], "fix": "..."}]}]
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import troubleshoot
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec


def argument_spec():
    return argspec(
        names=dict(type="list", elements="str", required=True),
        namespace=dict(type="str", default="default"),
        tail_lines=dict(type="int", default=troubleshoot.BUNDLE_DEFAULTS["tail_lines"]),
        dest=dict(type="path", required=True),
        archive_name=dict(type="str"),
        engine_results=dict(type="dict", default={}),
        metrics_results=dict(type="dict", default={}),
        kserve_namespaces=dict(type="list", elements="str", default=["kserve", "kubeflow", "opendatahub", "redhat-ods-applications", "default"]),
        expected_deployment_mode=dict(type="str"),
        deploy_errors=dict(type="list", elements="str", default=[]),
        redact=dict(type="list", elements="str", default=[], no_log=True),
        read_referenced_secrets=dict(type="bool", default=True),
        timeout=dict(type="int", default=troubleshoot.BUNDLE_DEFAULTS["timeout"]),
    )


def execute(module):
    troubleshoot.check_inputs(module.params)  # before the API server is asked
    return troubleshoot.bundle(module.cluster, module.params, check_mode=module.check_mode, diff=module._diff)  # pylint: disable=protected-access


CONTRACT = ModuleContract(argument_spec, execute)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
