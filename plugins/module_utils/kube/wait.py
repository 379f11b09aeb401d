# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait for an InferenceService to be Ready *at its current generation*.

kubernetes.core's `wait_condition` only looks at the condition, so a Ready=True left over from the
previous revision would pass right after an apply. This waiter watches the object until
status.observedGeneration == metadata.generation and Ready=True (polling where the watch is refused), and on
timeout explains why, with the conditions and the predictor pods' states. Plain Python over a `kubernetes.client.ApiClient`.
"""

from __future__ import annotations

import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError


class WaitTimeout(SpecDecodingError):
    """The InferenceService did not become Ready at its generation in time."""

    def __init__(self, message, isvc, pods):
        super().__init__(message)
        self.isvc = isvc
        self.pods = pods


def _pod_states(api_client, namespace, name):
    try:
        pods, skipped = k8s_pods.list_predictor_pods(api_client, namespace, name)
    except SpecDecodingError as exc:
        return [{"error": str(exc)}]
    return pods + skipped


def describe(isvc, pods):
    """One paragraph for a timeout message: readiness, every condition, every predictor pod."""
    state = k8s_pods.readiness(isvc)
    conds = ["%s=%s%s" % (c.get("type"), c.get("status"), (" (%s)" % (c.get("message") or c.get("reason"))) if (c.get("message") or c.get("reason")) else "")
             for c in ((isvc or {}).get("status") or {}).get("conditions") or []]
    pod_text = ["%s: %s%s" % (p.get("name"), p.get("phase") or p.get("error"), (", " + p["reason"]) if p.get("reason") else "") for p in pods]
    return "generation %s, observedGeneration %s; conditions: %s; predictor pods: %s" % (
        state["generation"], state["observed_generation"], ", ".join(conds) or "none", "; ".join(pod_text) or "none")


# An API server that restarts or sheds load answers with these (or not at all): worth waiting out, not a failure.
TRANSIENT_STATUS = (429, 500, 502, 503, 504)


def transient_error(exc):
    """A short reason when ``exc`` (or what caused it) is an API server outage worth waiting out, else None.

    Connection errors (refused, reset, timed out: ``OSError`` or urllib3's errors, which the kubernetes client
    raises as they are) and HTTP 429/5xx count; a 404, 403 or 422 does not."""
    cause, depth = exc, 0
    while cause is not None and depth < 6:
        status = getattr(cause, "status", None)
        if isinstance(status, int) and status in TRANSIENT_STATUS:
            return "the API server answered HTTP %d" % status
        if isinstance(cause, OSError) or (type(cause).__module__ or "").split(".")[0] == "urllib3":
            return "cannot reach the API server: %s" % (getattr(cause, "reason", None) or cause)
        cause, depth = cause.__cause__ or cause.__context__, depth + 1
    return None


# Longest single watch request: the API server closes watches on its own (its --min-request-timeout, 30 min by
# default, randomised); a shorter bound also re-reads the object now and then, in case an event was missed.
WATCH_SECONDS_MAX = 300


def _watch_unavailable(exc):
    """True when the API server refuses to watch (RBAC without ``watch``, a proxy without streaming): poll then."""
    return getattr(exc, "status", None) in (403, 405, 406, 501)


class _Kind:
    """What differs between the kinds this waiter watches: the API path, the readiness predicate, the pod listing."""

    def __init__(self, kind="InferenceService", version=None):
        self.kind = kind
        if kind == "LLMInferenceService":
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc  # pylint: disable=import-outside-toplevel
            self.llmisvc = llmisvc
            self.group, self.version, self.plural = llmisvc.GROUP, llmisvc.check_api_version(version, field="api_version"), llmisvc.PLURAL
        else:
            self.llmisvc = None
            # ``version`` is the LLMInferenceService API version; an InferenceService is always read as serving.kserve.io/v1beta1.
            self.group, self.version, self.plural = k8s_pods.KSERVE_GROUP, k8s_pods.KSERVE_VERSION, "inferenceservices"

    def get(self, api_client, namespace, name):
        if self.llmisvc is None:
            return k8s_pods.get_inference_service(api_client, namespace, name)
        return self.llmisvc.get(api_client, namespace, name, self.version)

    def rollout_pending(self, api_client, obj):
        return None if self.llmisvc is None else self.llmisvc.rollout_pending(api_client, obj)

    def readiness(self, obj):
        return k8s_pods.readiness(obj) if self.llmisvc is None else self.llmisvc.readiness(obj)

    def describe(self, obj, pods):
        return describe(obj, pods) if self.llmisvc is None else self.llmisvc.describe(obj)

    def pods(self, api_client, namespace, name):
        if self.llmisvc is None:
            return _pod_states(api_client, namespace, name)
        # One listing for every pool, single-node (Deployment) and multi-node (LeaderWorkerSet leaders and workers).
        try:
            keep, skipped = k8s_pods.list_pods(api_client, namespace, self.llmisvc.all_pods_selector(name))
        except SpecDecodingError as exc:
            return [{"error": str(exc)}]
        return [dict(p, pool=self.llmisvc.pod_pool(p.get("labels"))) for p in keep + skipped]


def _watch_for_change(api_client, namespace, name, resource_version, seconds, kind=None):
    """Block until the InferenceService changes after ``resource_version`` or ``seconds`` pass.

    Returns the changed object (a dict), or None when the window ended without an event or the object was deleted: the
    caller re-reads it then. Raises the API error otherwise; the kubernetes client raises an expired resourceVersion
    (after an API server restart) as HTTP 410, which the caller answers with a fresh read."""
    from kubernetes import watch  # pylint: disable=import-outside-toplevel
    from kubernetes.client import CustomObjectsApi  # pylint: disable=import-outside-toplevel
    watcher = watch.Watch()
    api = CustomObjectsApi(api_client)
    res = kind or _Kind()
    try:
        for event in watcher.stream(api.list_namespaced_custom_object, res.group, res.version,
                                    namespace, res.plural, field_selector="metadata.name=%s" % name,
                                    resource_version=resource_version, timeout_seconds=max(1, int(seconds)),
                                    _request_timeout=max(1, int(seconds)) + 10):
            event_type, obj = event.get("type"), event.get("object")
            if event_type == "ERROR" or not isinstance(obj, dict):
                return None  # clients that pass an expired resourceVersion on as an ERROR event: read the object again
            if event_type in ("ADDED", "MODIFIED"):
                return obj
            if event_type == "DELETED":
                return None
    finally:
        watcher.stop()
    return None


def _wait(api_client, namespace, name, res, check, on_timeout, timeout, interval, clock, sleep, watch):
    """The loop of every wait here: read the object, ``check(obj)``, then watch it from the resourceVersion last read (or
    read it every ``interval`` where the API server refuses the watch) until the check passes or ``timeout`` runs out.

    ``check`` returns True (done), False (wait for the object's next change) or a number of seconds after which to read
    the object again without waiting for a change (progress the object itself does not report, such as a Deployment
    still rolling out); it may raise to fail at once. ``on_timeout(obj, elapsed)`` raises the timeout error.
    An API server outage (restart, overload) is waited out until the timeout; then the error names the problem."""
    start = clock()
    obj = None
    while True:
        if obj is None:
            try:
                obj = res.get(api_client, namespace, name)
            except Exception as exc:  # pylint: disable=broad-except
                why = transient_error(exc)
                if why is None:
                    raise
                elapsed = clock() - start
                if elapsed >= timeout:
                    raise SpecDecodingError("waiting for %s %s/%s: %s (still after %ds)" % (res.kind, namespace, name, why, int(elapsed)),
                                            field="name", hint="check that the API server is up and reachable, then rerun") from exc
                sleep(min(interval, max(0.1, timeout - elapsed)))
                continue
        verdict = check(obj)
        if verdict is True:
            return obj, clock() - start
        elapsed = clock() - start
        if elapsed >= timeout:
            on_timeout(obj, elapsed)
        remaining = timeout - elapsed
        if verdict:
            sleep(min(verdict, max(0.1, remaining)))
            obj = None
            continue
        if watch:
            try:
                obj = _watch_for_change(api_client, namespace, name, (obj.get("metadata") or {}).get("resourceVersion"),
                                        min(remaining, WATCH_SECONDS_MAX), kind=res)
                continue
            except Exception as exc:  # pylint: disable=broad-except
                if getattr(exc, "status", None) == 410:
                    # The resourceVersion is older than the API server's watch cache (it restarted, or compacted):
                    # read the object again and watch from its new resourceVersion, without waiting.
                    obj = None
                    continue
                if _watch_unavailable(exc):
                    watch = False
                elif transient_error(exc) is None:
                    raise
        obj = None
        sleep(min(interval, max(0.1, remaining)))


def wait_ready(api_client, namespace, name, timeout=1200, interval=5, clock=time.monotonic, sleep=time.sleep, watch=True,
               kind="InferenceService", api_version=None):
    """Wait until Ready at the current generation. Returns (isvc, elapsed seconds); raises WaitTimeout.

    It watches the InferenceService (one watch request from the resourceVersion it last read), so it returns as soon as
    the controller writes the status, not up to ``interval`` later. Where the API server refuses the watch (a role
    without the ``watch`` verb) it falls back to reading the object every ``interval`` seconds.
    An API server outage during the wait (restart, overload) is waited out until the timeout; if the server
    is still unreachable then, the error names the connection problem.
    ``kind="LLMInferenceService"`` waits the same way on KServe's LLMInferenceService (``api_version`` v1alpha1 or
    v1alpha2) with the readiness of ``llmisvc.readiness``; a PresetsCombined=False at the current generation (a missing
    or broken baseRefs preset) fails at once, since waiting does not fix it."""
    res = _Kind(kind, api_version)

    def check(obj):
        state = res.readiness(obj)
        if state["ready"] and state["up_to_date"]:
            # Ready at this generation; an LLMInferenceService's pool Deployments may still roll out (its status does
            # not change meanwhile): look again in a second.
            return True if res.rollout_pending(api_client, obj) is None else 1.0
        if state.get("failed"):
            raise WaitTimeout("%s %s/%s cannot become Ready: %s" % (res.kind, namespace, name, state["failed"]), obj,
                              res.pods(api_client, namespace, name))
        return False

    def on_timeout(obj, elapsed):
        pods = res.pods(api_client, namespace, name)
        why = "not reconciled yet" if not res.readiness(obj)["up_to_date"] else "not Ready"
        raise WaitTimeout("%s %s/%s is %s after %ds: %s. A cold start with a draft model takes about 5 "
                          "minutes; raise the timeout if pods are still starting"
                          % (res.kind, namespace, name, why, int(elapsed), res.describe(obj, pods)), obj, pods)

    return _wait(api_client, namespace, name, res, check, on_timeout, timeout, interval, clock, sleep, watch)


def wait_until(api_client, namespace, name, done, timeout=1200, interval=5, clock=time.monotonic, sleep=time.sleep, watch=True,
               what="the condition"):
    """Wait until ``done(isvc)`` is true; like wait_ready (a watch from the last resourceVersion, reads every ``interval``
    where watching is refused, outages waited out) but for any condition on the InferenceService (a canary step: both
    revisions ready at a percent). Returns (isvc, elapsed seconds); raises WaitTimeout naming ``what`` (a str, or a
    callable isvc -> str)."""
    res = _Kind()

    def on_timeout(obj, elapsed):
        pods = _pod_states(api_client, namespace, name)
        text = what(obj) if callable(what) else what
        raise WaitTimeout("InferenceService %s/%s: %s after %ds: %s" % (namespace, name, text, int(elapsed), describe(obj, pods)), obj, pods)

    return _wait(api_client, namespace, name, res, lambda obj: bool(done(obj)), on_timeout, timeout, interval, clock, sleep, watch)
