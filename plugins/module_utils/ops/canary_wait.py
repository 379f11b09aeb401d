# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Waiting for a canary step to take effect on the cluster (``canary_rollout``): both revisions ready with the canary on
its percent, or one revision left after a promotion or a removal; a canary revision that crash-loops fails the wait at
once. That readiness is the row ``CANARY`` of kube/wait.py's one readiness table (``canary_pending``); the wait is the one
loop there (through kserve/wait.wait_for_row): this file has none. The patches, the readers of the two revisions and
the observation are in ``canary``."""

from __future__ import annotations

import time

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


# The row's name in kube/wait.py's readiness table.
CANARY = "InferenceService canary"
# Restarts and retired pods do not change the InferenceService (no watch event): look at the pods again this often.
CRASH_LOOP_INTERVAL = 2.0
RETIRED_INTERVAL = 0.5


def settled_why(state, mode, stable_revision=None):
    """What a promotion / removal waits for, as the timeout says it."""
    what = "not Ready without a canary at the current generation"
    if mode == KNATIVE:
        what += " (traffic %s)" % ("100% on the latest revision" if state == "promoted" else
                                   "100%% on %s" % (stable_revision or "the previous revision"))
    return what


def canary_pending(isvc, api_client=None, state="present", mode=None, canary_name=None, percent=None, stable_revision=None,
                   retired=None, crash_loop_restarts=0, redact=None, retired_interval=RETIRED_INTERVAL):
    """The canary revisions' row: None when the step took effect, else why not. present - both revisions ready with the
    canary on ``percent`` (canary.rollout_state); a canary revision crash-looping ``crash_loop_restarts`` times raises
    (canary_crash_loop; its pods are read only with that option, then a LookAgain). promoted / absent - Ready at the
    generation without a canary (Knative: 100% on one revision, ``stable_revision`` after a rollback), then no pod of the
    ``retired`` revision (a label selector) left serving (a LookAgain while there is)."""
    namespace, name = isvc["metadata"].get("namespace"), isvc["metadata"]["name"]
    if state == "present":
        rollout = rollout_state(isvc, mode, canary_name, percent)
        if rollout["done"]:
            return None
        if not crash_loop_restarts:
            return rollout["why"]
        canary_crash_loop(api_client, namespace, name, isvc, mode, canary_name, crash_loop_restarts, redact)
        return kube_wait.LookAgain(rollout["why"], CRASH_LOOP_INTERVAL)
    if mode == KNATIVE and not knative_settled(isvc, state, stable_revision):
        return settled_why(state, mode, stable_revision)
    if kube_wait.pending("InferenceService", isvc) is not None or (isvc.get("status") or {}).get("canaryStatuses"):
        return settled_why(state, mode, stable_revision)
    left = [p["name"] for p in canary_pods(api_client, namespace, name, retired)] if retired else []
    if left:
        return kube_wait.LookAgain("pods of the retired revision (%s) still serve: %s" % (retired, ", ".join(left)), retired_interval)
    return None


kube_wait.register(CANARY, canary_pending)


def wait_step(api_client, namespace, name, state, mode, canary_name, percent, timeout, retired=None, poll=RETIRED_INTERVAL,
              clock=time.monotonic, sleep=time.sleep, stable_revision=None, crash_loop_restarts=0, redact=None):
    """Wait until the step took effect (the ``CANARY`` row, see canary_pending). Returns (isvc, elapsed, state); raises
    isvc_wait.WaitTimeout, at once for a canary revision that crash-loops (``crash_loop_restarts``, see canary_crash_loop)."""
    isvc, elapsed = isvc_wait.wait_for_row(
        api_client, namespace, name, CANARY, timeout=timeout, clock=clock, sleep=sleep, state=state, mode=mode, canary_name=canary_name,
        percent=percent, stable_revision=stable_revision, retired=retired, crash_loop_restarts=crash_loop_restarts, redact=redact,
        retired_interval=poll)
    if state == "present":
        return isvc, elapsed, rollout_state(isvc, mode, canary_name, percent)
    return isvc, elapsed, {"done": True, "why": "%s: 100%% on one revision" % state}
