#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llmisvc_engine_config_info
short_description: Prove per pool which speculative config the vLLM engines of a KServe LLMInferenceService run
version_added: 0.2.0
description:
  - Lists the pods of each pool the way KServe's LLMInferenceService controller labels them (C(decode), or the single
    pool, by C(app.kubernetes.io/component=llminferenceservice-workload); C(prefill) by
    C(llminferenceservice-workload-prefill); both with C(app.kubernetes.io/name=<name>)), reads the engine-config line
    from each pod's C(main) container and compares every pool separately with what it must run.
  - Without O(expected), a pool must run the speculative config its own flag (or the baseRefs preset's) carries, and a
    pool without the flag (the prefill pool, by default) must run C(speculative_config=None).
  - With data parallelism (C(spec.parallelism.data) x C(dataLocal) above 1) vLLM 0.24+ logs the line on data-parallel
    rank 0 only; the pool passes when one pod logged it, and RV(pools) names that pod as C(engine_pod).
  - A multi-node pool (C(spec.worker) or C(spec.prefill.worker), in the resource or a baseRefs preset) runs as a
    LeaderWorkerSet C(<name>-kserve-mn) (C(<name>-kserve-mn-prefill)); its pods are selected by
    C(leaderworkerset.sigs.k8s.io/name). The leader of each group (worker index 0, data-parallel rank 0, the API server)
    must log the line; workers (Ray or multiprocessing workers, C(--headless) data-parallel ranks) may be silent, and a
    worker that logs a line that contradicts the flag fails the check. C(engine_pod) is the leader of the lowest group,
    C(groups) says per group which pod logged it. Without a leader template the worker template's flag is what counts.
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
    description: API version to read.
    type: str
    choices: [v1alpha1, v1alpha2]
    default: v1alpha2
  container:
    description: Container whose log holds the vLLM output (KServe's controller edits the one named C(main)).
    type: str
    default: main
  expected:
    description:
      - What the pools that carry the flag must run (keys left out are not compared); pools without the flag must always
        run without speculative decoding. C(enabled) V(false) requires C(speculative_config=None) everywhere (after a rollback).
    type: dict
    suboptions:
      enabled:
        description: V(false) requires C(speculative_config=None); V(true) requires speculative decoding.
        type: bool
      method:
        description: Expected method (C(*_mtp) aliases compare as C(mtp)).
        type: str
      model:
        description: Expected draft path as vLLM sees it.
        type: str
      num_speculative_tokens:
        description: Expected number of speculative tokens.
        type: int
  config_namespace:
    description: KServe's system namespace, where shared C(LLMInferenceServiceConfig) presets live.
    type: str
    default: kserve
  timeout:
    description: Seconds for each pod log read.
    type: int
    default: 60
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
"""

EXAMPLES = r"""
- name: Verify the decode pool runs EAGLE-3 and the prefill pool runs without it
  alauda.spec_decoding.llmisvc_engine_config_info:
    name: llama-eagle3
    namespace: models

- name: After a rollback, no pool may run speculative decoding
  alauda.spec_decoding.llmisvc_engine_config_info:
    name: llama-eagle3
    namespace: models
    expected:
      enabled: false
"""

RETURN = r"""
pools:
  description:
    - Per pool, C({expected, flag, workload, pods, skipped_pods, engine_pod, speculative_config, vllm_version, differences,
      data_parallel, not_understood}); C(workload) is C({kind, name}) (C(Deployment) or C(LeaderWorkerSet)); C(pods) holds
      C({name, found, speculative_config, vllm_version, error, not_understood}) of each pod, plus C(group), C(worker_index) and C(role)
      (C(leader) or C(worker)) for LeaderWorkerSet pods.
    - Multi-node pools also have C(groups), a list of C({group, leader, workers, engine_pod, logged_by}).
  returned: always
  type: dict
speculative_config:
  description: The decode pool's engine speculative config (null when it runs without).
  returned: always
  type: dict
not_understood:
  description:
    - What the pods' engine lines hold that this collection does not know (a vLLM newer than its tables), each item
      C({source, name, reason, count, value, pod, pool}); what is known was still read and compared. A warning names them.
  returned: always
  type: list
  elements: dict
  sample: [{"source": "engine_line", "name": "draft_sampler", "reason": "a field vLLM 0.33 does not print", "count": 1,
            "pod": "llama-kserve-6c9d-x", "pool": "decode"}]
problems:
  description: Why the check failed (empty when it passed).
  returned: always
  type: list
  elements: str
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import cluster as llmisvc_cluster
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood as unknown


def argument_spec():
    return argspec(
        name=dict(type="str", required=True),
        namespace=dict(type="str", required=True),
        api_version=dict(type="str", default="v1alpha2", choices=["v1alpha1", "v1alpha2"]),
        container=dict(type="str", default=llmisvc_model.MAIN_CONTAINER),
        expected=dict(type="dict", options=dict(
            enabled=dict(type="bool"),
            method=dict(type="str"),
            model=dict(type="str"),
            num_speculative_tokens=dict(type="int", no_log=False),
        )),
        config_namespace=dict(type="str", default="kserve"),
        timeout=dict(type="int", default=60),
    )


def execute(module):
    params = module.params
    api_client = module.api_client
    expected = {k: v for k, v in (params["expected"] or {}).items() if v is not None} or None
    obj = llmisvc_cluster.get(api_client, params["namespace"], params["name"], params["api_version"])
    unreadable = []
    presets = llmisvc_cluster.read_presets(api_client, obj, params["config_namespace"], params["api_version"], unreadable=unreadable)
    for preset in unreadable:
        module.warn("could not read KServe's well-known preset %s (forbidden): what each pool must run is taken from the "
                    "resource and its baseRefs only" % preset)
    report, problems = llmisvc_cluster.engine_report(api_client, obj, expected=expected, container=params["container"],
                                                     timeout=params["timeout"], presets=presets)
    not_understood = []
    for pool, entry in report.items():
        unknown.add(not_understood, entry["not_understood"], pool=pool)
    if not_understood:
        module.warn(unknown.warning(not_understood))
    result = {"changed": False, "pools": report, "problems": problems, "not_understood": not_understood,
              "speculative_config": (report.get("decode") or {}).get("speculative_config")}
    if problems:
        module.fail_json(msg="LLMInferenceService %s/%s: %s" % (params["namespace"], params["name"], "; ".join(problems)), **result)
    return result


CONTRACT = ModuleContract(argument_spec, execute)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
