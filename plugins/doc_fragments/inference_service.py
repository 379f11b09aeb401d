# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Options of the modules that read or change one KServe InferenceService.

    Their argument specs are in plugins/module_utils/kube/module.py (INFERENCE_SERVICE_ARG_SPEC, wait_arg_spec); a module
    that documents one of these options itself (another default, another description) overrides the fragment's text.
    """

    DOCUMENTATION = r"""
options:
  name:
    description: InferenceService name.
    type: str
    required: true
  namespace:
    description: Namespace of the InferenceService.
    type: str
    required: true
"""

    # Ready at the current generation after a change; isvc_wait.wait_ready watches the object and polls only without watch.
    WAIT = r"""
options:
  wait:
    description:
      - Wait until the InferenceService is Ready with C(status.observedGeneration == metadata.generation) after a change.
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait. A cold start with a draft model takes about 5 minutes.
    type: int
    default: 1200
  wait_sleep:
    description:
      - Seconds between readiness reads when the API server refuses to watch the InferenceService (no C(watch) verb);
        with C(watch) allowed the wait ends as soon as the Ready status is written.
    type: int
    default: 5
  wait_crash_loop_restarts:
    description:
      - With O(wait), a predictor that crash-loops fails the wait at once rather than at O(wait_timeout) - KServe reports
        C(FailedToLoad) (C(BlockedByFailedLoad)) at the current generation and a predictor container has restarted this
        many times; the failure has KServe's C(lastFailureInfo) and the container's previous log tail (secrets
        redacted). V(0) waits for O(wait_timeout) whatever the pods do.
    type: int
    default: 2
"""
