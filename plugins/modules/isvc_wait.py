#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: isvc_wait
short_description: Wait until a KServe InferenceService is Ready at its current generation
version_added: 0.1.0
description:
  - Watches the InferenceService until C(status.observedGeneration) equals C(metadata.generation) and the
    C(Ready) condition is C(True), so it returns as soon as the controller writes that status. A Ready condition left
    over from the previous revision does not pass. Where the API server refuses the watch it reads the object every
    O(interval) seconds instead.
  - On timeout fails with the conditions and the predictor pods' states.
  - A predictor that crash-loops fails at once rather than at the timeout (see O(crash_loop_restarts)).
author:
  - Alauda Platform Team (@alauda)
options:
  timeout:
    description: Seconds to wait. A cold start with a draft model takes about 5 minutes.
    type: int
    default: 1200
  interval:
    description:
      - Seconds between reads of the InferenceService when the API server refuses to watch it (a role without the
        C(watch) verb). With C(watch) allowed the module returns as soon as the controller writes the Ready status.
    type: int
    default: 5
  crash_loop_restarts:
    description:
      - When KServe reports the InferenceService's model C(FailedToLoad) (C(status.modelStatus.transitionStatus)
        C(BlockedByFailedLoad), which KServe writes when the newest predictor pod's C(kserve-container) or
        C(storage-initializer) exits with an error or waits in C(CrashLoopBackOff)) at the current generation, and that
        container has restarted at least this many times, fail at once. The message carries KServe's
        C(lastFailureInfo) and the last 20 lines of the container's previous run's log, secret-looking values redacted.
      - V(0) never fails early; the wait runs to O(timeout). Only for O(kind=InferenceService).
    type: int
    default: 2
  kind:
    description:
      - The resource to wait for. V(LLMInferenceService) waits on KServe's LLMInferenceService with the readiness its
        controller reports (C(Ready) from C(PresetsCombined), C(WorkloadsReady), C(RouterReady)) at the current
        generation; a C(PresetsCombined=False) fails at once.
    type: str
    choices: [InferenceService, LLMInferenceService]
    default: InferenceService
  api_version:
    description: API version of an O(kind=LLMInferenceService) (V(v1alpha1) or V(v1alpha2)); ignored for InferenceServices.
    type: str
    choices: [v1alpha1, v1alpha2]
    default: v1alpha2
  unchanged:
    description:
      - The InferenceService as a write that changed nothing has just returned it (the C(result) of an apply that reported
        C(changed=false)). When it is Ready at its own generation the module returns it at once, without reading the
        cluster (C(waited=false)), as nothing was written and there is no new generation to wait for. Otherwise the
        module waits as without it.
      - Only for O(kind=InferenceService). An LLMInferenceService's pool rollouts are not in the object, so it is always
        waited for.
    type: dict
extends_documentation_fragment:
  - alauda.spec_decoding.inference_service
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
"""

EXAMPLES = r"""
- name: Wait for the new revision
  alauda.spec_decoding.isvc_wait:
    name: llama-eagle3
    namespace: models
    timeout: 900

- name: Apply, then wait only when the apply changed something or the object is not Ready at its generation
  alauda.spec_decoding.isvc_wait:
    name: llama-eagle3
    namespace: models
    unchanged: "{{ applied.result if not applied.changed else omit }}"

- name: Wait for an LLMInferenceService (decode and prefill pools)
  alauda.spec_decoding.isvc_wait:
    kind: LLMInferenceService
    name: llama-eagle3
    namespace: models
"""

RETURN = r"""
ready:
  description: Whether the InferenceService is Ready at its current generation.
  returned: always
  type: bool
elapsed:
  description: Seconds waited.
  returned: success
  type: float
waited:
  description: False when O(unchanged) was Ready at its generation and the cluster was not read; else true.
  returned: success
  type: bool
generation:
  description: metadata.generation that became Ready.
  returned: success
  type: int
resource:
  description: The InferenceService as read last.
  returned: always
  type: dict
pods:
  description: Predictor pod states (on timeout).
  returned: failure
  type: list
  elements: dict
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.credentials import redact
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import INFERENCE_SERVICE_ARG_SPEC, ModuleContract, argspec


def argument_spec():
    return argspec(
        INFERENCE_SERVICE_ARG_SPEC,
        timeout=dict(type="int", default=1200),
        interval=dict(type="int", default=5),
        kind=dict(type="str", default="InferenceService", choices=["InferenceService", "LLMInferenceService"]),
        crash_loop_restarts=dict(type="int", default=2),
        api_version=dict(type="str", default="v1alpha2", choices=["v1alpha1", "v1alpha2"]),
        unchanged=dict(type="dict"),
    )


def execute(module):
    params = module.params
    unchanged = params["unchanged"]
    # The no-op redeploy's path: the waiter's own InferenceService check on the apply's answer; no client is built and
    # nothing is read (issue 46, P4).
    waited = not (unchanged and params["kind"] == "InferenceService" and isvc_wait.isvc_pending(unchanged) is None)
    if waited:
        isvc, elapsed = isvc_wait.wait_ready(module.api_client, params["namespace"], params["name"],
                                             timeout=params["timeout"], interval=params["interval"],
                                             kind=params["kind"], api_version=params["api_version"],
                                             crash_loop_restarts=params["crash_loop_restarts"], redact=redact)
    else:
        isvc, elapsed = unchanged, 0.0
    return dict(changed=False, ready=True, waited=waited, elapsed=round(elapsed, 1), generation=isvc["metadata"].get("generation"), resource=isvc)


# A refusal returns an empty resource; a timeout the object as last read and its pods.
CONTRACT = ModuleContract(
    argument_spec, execute,
    failure=dict(
        failed={"ready": False, "resource": {}},
    ),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
