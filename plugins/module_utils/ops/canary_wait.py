# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Waiting for a canary step to take effect on the cluster (``canary_rollout``): both revisions ready with the canary on
its percent, or one revision left after a promotion or a removal; a canary revision that crash-loops fails the wait at
once. The patches, the readers of the two revisions and the observation are in ``canary``."""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import load_failure
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.canary import (
    KNATIVE, canary_pods, knative_settled, revision_selectors, rollout_state)


def canary_crash_loop(api_client, namespace, name, isvc, mode, canary_name, restarts, redact=None):
    """Raise isvc_wait.WaitTimeout when a container of the canary revision's pods restarted ``restarts`` times (0: never),
    with that container's previous log tail (passed through ``redact``). KServe's modelStatus describes the stable
    revision during a canary, so the revision's own pods are what tells that the canary cannot start."""
    if not restarts or restarts <= 0:
        return
    try:
        selector = revision_selectors(isvc, mode, canary_name)["canary"]
    except ValidationError:  # Knative: no traffic split between two revisions yet
        return
    pods, skipped = k8s_pods.list_predictor_pods(api_client, namespace, name, label_selector=selector)
    crash = load_failure.crash_looping(pods + skipped, restarts)
    if crash is None:
        return
    pod, container, count, container_state = crash
    raise isvc_wait.WaitTimeout(
        "InferenceService %s/%s: the canary revision (%s) crash-loops: container %s of pod %s restarted %d times (%s); the "
        "stable revision still serves all traffic it had. The end of the container's previous run's log:\n%s" % (
            namespace, name, selector, container, pod["name"], count, container_state or "restarting",
            isvc_wait.previous_log_tail(api_client, namespace, crash, redact)), isvc, pods + skipped,
        field="wait_crash_loop_restarts",
        hint="fix the canary's command (the log above says why it exits), then set the step again; or remove the canary with "
             "state=absent. wait_crash_loop_restarts=0 waits for wait_timeout instead")


def wait_step(api_client, namespace, name, state, mode, canary_name, percent, timeout, retired=None, poll=0.5,
              clock=None, sleep=None, stable_revision=None, crash_loop_restarts=0, redact=None):
    """Wait until the step took effect: present - both revisions ready with the canary on ``percent``; promoted / absent -
    Ready at the generation without a canary (Knative: 100% on one revision, ``stable_revision`` after a rollback), then no
    pod of the ``retired`` revision (a label selector) left serving. Returns (isvc, elapsed, state); raises
    isvc_wait.WaitTimeout, at once for a canary revision that crash-loops (``crash_loop_restarts``, see canary_crash_loop)."""
    import time  # pylint: disable=import-outside-toplevel
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    start = clock()
    if state == "present":
        def present(obj):
            if rollout_state(obj, mode, canary_name, percent)["done"]:
                return True
            if not crash_loop_restarts:
                return False
            canary_crash_loop(api_client, namespace, name, obj, mode, canary_name, crash_loop_restarts, redact)
            return 2.0  # restarts do not change the InferenceService (no watch event): look at the pods again
        isvc, elapsed = isvc_wait.wait_until(api_client, namespace, name, present, timeout=timeout,
                                             what=lambda obj: rollout_state(obj, mode, canary_name, percent)["why"])
        return isvc, elapsed, rollout_state(isvc, mode, canary_name, percent)

    def settled(obj):
        if mode == KNATIVE and not knative_settled(obj, state, stable_revision):
            return False
        return kube_wait.pending("InferenceService", obj) is None and not (obj.get("status") or {}).get("canaryStatuses")
    what = "not Ready without a canary at the current generation"
    if mode == KNATIVE:
        what += " (traffic %s)" % ("100% on the latest revision" if state == "promoted" else
                                   "100%% on %s" % (stable_revision or "the previous revision"))
    isvc, _elapsed = isvc_wait.wait_until(api_client, namespace, name, settled, timeout=timeout, what=what)
    while retired:
        left = [p["name"] for p in canary_pods(api_client, namespace, name, retired)]
        if not left:
            break
        if clock() - start >= timeout:
            raise isvc_wait.WaitTimeout("InferenceService %s/%s: pods of the retired revision (%s) still serve after %ds: %s"
                                        % (namespace, name, retired, int(clock() - start), ", ".join(left)), isvc, left)
        sleep(poll)
    return isvc, clock() - start, {"done": True, "why": "%s: 100%% on one revision" % state}
