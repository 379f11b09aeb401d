# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait for an InferenceService to be Ready *at its current generation*.

kubernetes.core's `wait_condition` only looks at the condition, so a Ready=True left over from the
previous revision would pass right after an apply. This waiter watches the object until
status.observedGeneration == metadata.generation and Ready=True (polling where the watch is refused), and on
timeout explains why, with the conditions and the predictor pods' states. Plain Python over a `kubernetes.client.ApiClient`.

The checks per kind (InferenceService; LLMInferenceService and, asked with ``pools=True``, its pools' rollout) are here and
go into ``kube/wait.py``'s readiness table; the loop that reads, watches and waits out an API server outage is its
``wait_for``: this file has no loop of its own. ``wait_for_row`` waits on any row of that table for an InferenceService
(ops/canary_wait.py's canary revisions) with this file's timeout error.
"""

from __future__ import annotations

import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.defaults import KSERVE_GROUP, KSERVE_VERSION
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import load_failure
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import cluster as llmisvc_cluster
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import status as llmisvc_status


# A predictor KServe refused (readers.readiness' ``failed``): the runtime it names is missing, disabled or does not fit.
RUNTIME_FIX = ("create the ServingRuntime that spec.predictor.model.runtime names in this namespace (or a ClusterServingRuntime), "
               "enable it, or name one that exists and supports the model format (spec_decoding_runtime in the inventory)")


class WaitTimeout(kube_wait.WaitTimeout):
    """The InferenceService did not become Ready at its generation in time (``isvc``: as last read; ``pods``: its
    predictor pods then)."""

    def __init__(self, message, isvc, pods, field=None, hint=None):
        super().__init__(message, isvc, pods, field=field, hint=hint)
        self.isvc = isvc


def _pod_states(api_client, namespace, name):
    try:
        pods, skipped = k8s_pods.list_predictor_pods(api_client, namespace, name)
    except SpecDecodingError as exc:
        return [{"error": str(exc)}]
    return pods + skipped


def _raise_if_load_failed(api_client, namespace, name, isvc, restarts, redact):
    """Raise a WaitTimeout on KServe's FailedToLoad at this generation with a predictor container restarted ``restarts``
    times, carrying lastFailureInfo and that container's previous log tail (redacted by ``redact``; not read without it).
    Returns True on a FailedToLoad with fewer restarts so far (look again later: restarts do not change the
    InferenceService, so no watch event would come), else False. The pods are listed only once KServe said FailedToLoad."""
    model = load_failure.verdict(isvc) if restarts and restarts > 0 else None
    if model is None:
        return False
    pods = _pod_states(api_client, namespace, name)
    crash = load_failure.crash_looping(pods, restarts)
    if crash is None:
        return True
    raise WaitTimeout(load_failure.message(namespace, name, model, crash, previous_log_tail(api_client, namespace, crash, redact)),
                      isvc, pods, field="crash_loop_restarts", hint=load_failure.FIX)


def previous_log_tail(api_client, namespace, crash, redact):
    """The last lines of the previous run of a crash-looping container (``crash`` as load_failure.crash_looping gives it),
    passed through ``redact`` (text -> text); a sentence when there is no redaction or the log cannot be read."""
    if redact is None:
        return "(not read: this caller gives no redaction)"
    try:
        return redact(load_failure.log_tail(k8s_pods.stream_pod_log(
            api_client, namespace, crash[0]["name"], container=crash[1], tail_lines=load_failure.LOG_TAIL_LINES,
            previous=True, timeout=30)))
    except SpecDecodingError as exc:
        return "(could not be read: %s)" % exc


def describe(isvc, pods):
    """One paragraph for a timeout message: readiness, every condition, every predictor pod."""
    state = isvc_readers.readiness(isvc)
    conds = ["%s=%s%s" % (c.get("type"), c.get("status"), (" (%s)" % (c.get("message") or c.get("reason"))) if (c.get("message") or c.get("reason")) else "")
             for c in ((isvc or {}).get("status") or {}).get("conditions") or []]
    pod_text = ["%s: %s%s" % (p.get("name"), p.get("phase") or p.get("error"), (", " + p["reason"]) if p.get("reason") else "") for p in pods]
    return "generation %s, observedGeneration %s; conditions: %s; predictor pods: %s" % (
        state["generation"], state["observed_generation"], ", ".join(conds) or "none", "; ".join(pod_text) or "none")


def _ready_pending(state):
    """The table's answer from a readiness dict (readers.readiness / llmisvc status.readiness): None when Ready at the
    current generation, else why not."""
    if state["ready"] and state["up_to_date"]:
        return None
    return "not reconciled yet" if not state["up_to_date"] else "not Ready"


def isvc_pending(obj, api_client=None):  # pylint: disable=unused-argument
    """The InferenceService row: None when Ready at the current generation, else why not."""
    return _ready_pending(isvc_readers.readiness(obj))


# KServe's controller marks a pool ready from its Deployment's Available condition, True on the old pods during a rolling
# update; the rollout does not change the LLMInferenceService (no watch event): look again this often.
POOL_ROLLOUT_INTERVAL = 1.0


def llmisvc_pending(obj, api_client=None, pools=False):
    """The LLMInferenceService row: None when Ready at the current generation and, with ``pools``, every pool's workload
    rolled out to it (llmisvc/cluster.rollout_pending reads them with ``api_client``: a LookAgain while one rolls out)."""
    why = _ready_pending(llmisvc_status.readiness(obj))
    if why is not None or not pools:
        return why
    rolling = llmisvc_cluster.rollout_pending(api_client, obj)
    return None if rolling is None else kube_wait.LookAgain(rolling, POOL_ROLLOUT_INTERVAL)


# The KServe kinds' rows of the one readiness table (kube/wait.py): Ready *at the current generation*.
kube_wait.register("InferenceService", isvc_pending)
kube_wait.register("LLMInferenceService", llmisvc_pending)


class _Kind:
    """What differs between the kinds this waiter watches: the API path, the readiness predicate, the pod listing."""

    def __init__(self, kind="InferenceService", version=None):
        self.kind = kind
        self.llm = kind == "LLMInferenceService"
        if self.llm:
            self.group, self.version, self.plural = llmisvc_model.GROUP, llmisvc_model.check_api_version(version, field="api_version"), llmisvc_model.PLURAL
        else:
            # ``version`` is the LLMInferenceService API version; an InferenceService is always read as serving.kserve.io/v1beta1.
            self.group, self.version, self.plural = KSERVE_GROUP, KSERVE_VERSION, "inferenceservices"

    def get(self, api_client, namespace, name):
        if not self.llm:
            return k8s_pods.get_inference_service(api_client, namespace, name)
        return llmisvc_cluster.get(api_client, namespace, name, self.version)

    def readiness(self, obj):
        return llmisvc_status.readiness(obj) if self.llm else isvc_readers.readiness(obj)

    def describe(self, obj, pods):
        return llmisvc_status.describe(obj) if self.llm else describe(obj, pods)

    def pods(self, api_client, namespace, name):
        if not self.llm:
            return _pod_states(api_client, namespace, name)
        # One listing for every pool, single-node (Deployment) and multi-node (LeaderWorkerSet leaders and workers).
        try:
            keep, skipped = k8s_pods.list_pods(api_client, namespace, llmisvc_model.all_pods_selector(name))
        except SpecDecodingError as exc:
            return [{"error": str(exc)}]
        return [dict(p, pool=llmisvc_model.pod_pool(p.get("labels"))) for p in keep + skipped]


def wait_ready(api_client, namespace, name, timeout=1200, interval=5, clock=time.monotonic, sleep=time.sleep, watch=True,
               kind="InferenceService", api_version=None, crash_loop_restarts=0, redact=None):
    """Wait until Ready at the current generation. Returns (isvc, elapsed seconds); raises WaitTimeout.

    It watches the InferenceService (one watch request from the resourceVersion it last read), so it returns as soon as
    the controller writes the status, not up to ``interval`` later. Where the API server refuses the watch (a role
    without the ``watch`` verb) it falls back to reading the object every ``interval`` seconds.
    An API server outage during the wait (restart, overload) is waited out until the timeout; if the server
    is still unreachable then, the error names the connection problem.
    ``kind="LLMInferenceService"`` waits the same way on KServe's LLMInferenceService (``api_version`` v1alpha1 or
    v1alpha2) with the readiness of ``llmisvc.readiness``; a PresetsCombined=False at the current generation (a missing
    or broken baseRefs preset) fails at once, since waiting does not fix it.
    ``crash_loop_restarts`` N > 0: an InferenceService KServe reports FailedToLoad (BlockedByFailedLoad) at the current
    generation, with a predictor container restarted N times, fails at once with lastFailureInfo and the container's
    previous log tail passed through ``redact`` (text -> text; without it the log is not read)."""
    res = _Kind(kind, api_version)

    def check(obj):
        # the table's row; an LLMInferenceService Ready at this generation whose pools still roll out is a LookAgain
        why = kube_wait.pending(res.kind, obj, api_client, pools=True) if res.llm else kube_wait.pending(res.kind, obj)
        if why is None:
            return True
        if isinstance(why, kube_wait.LookAgain):
            return why.after
        state = res.readiness(obj)
        look_again = not res.llm and _raise_if_load_failed(api_client, namespace, name, obj, crash_loop_restarts, redact)
        if state.get("failed"):
            raise WaitTimeout("%s %s/%s cannot become Ready: %s" % (res.kind, namespace, name, state["failed"]), obj,
                              res.pods(api_client, namespace, name), hint=None if res.llm else RUNTIME_FIX)
        return float(interval) if look_again else False

    def on_timeout(obj, elapsed):
        pods = res.pods(api_client, namespace, name)
        why = kube_wait.pending(res.kind, obj) or "not Ready"
        raise WaitTimeout("%s %s/%s is %s after %ds: %s. A cold start with a draft model takes about 5 "
                          "minutes; raise the timeout if pods are still starting"
                          % (res.kind, namespace, name, why, int(elapsed), res.describe(obj, pods)), obj, pods)

    return kube_service.service_of(api_client).wait_for(namespace, name, res, check, on_timeout, timeout, interval, clock, sleep, watch)


def wait_for_row(api_client, namespace, name, row, timeout=1200, interval=5, clock=time.monotonic, sleep=time.sleep, watch=True,
                 **options):
    """Wait until the InferenceService passes the readiness table's row ``row`` (kube/wait.py; ``options`` are the row's,
    e.g. ops/canary_wait.py's canary revisions): kube/wait's ``wait_ready`` with the InferenceService's reader (a 404
    names it) and this file's timeout error. Returns (isvc, elapsed seconds); raises WaitTimeout naming the row's last
    reason, with the conditions and the predictor pods."""
    res, api_client = _Kind(), kube_service.service_of(api_client).api_client

    def on_timeout(obj, elapsed, why):
        pods = _pod_states(api_client, namespace, name)
        raise WaitTimeout("InferenceService %s/%s: %s after %ds: %s" % (namespace, name, why, int(elapsed), describe(obj, pods)), obj, pods)

    return kube_wait.wait_ready(api_client, namespace, name, res, row=row, timeout=timeout, interval=interval, clock=clock, sleep=sleep,
                                watch=watch, on_timeout=on_timeout, **options)
