# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one waiter of the collection: the wait loop and the table of per-kind readiness.

The loop (``wait_for``): read an object, check it, then watch it from the resourceVersion last read (or read it again
every few seconds where the API server refuses the watch) until the check passes or time runs out; an API server outage
(restart, overload) is waited out until the timeout, read again after 0.5 s, 1 s, then every 2 s. No other module of the
collection loops to wait for the cluster.

The table (``READINESS``, as kubernetes.core's waiter has ``RESOURCE_PREDICATES``, plugins/module_utils/k8s/waiter.py at
6.2.0, and its ``Waiter`` one loop over them): row name -> ``pending(obj, api_client=None, **options)``, None when the
object is ready, else why not (the reason goes into the timeout message). A reason that is a ``LookAgain`` is progress
the object itself does not report (its pods, the workloads it owns): no watch event would come, so the object is read
again after ``.after`` seconds. A row may raise to fail the wait at once (a failed Job, a pod that cannot start).
Deployment and Job are here; the district that knows a kind registers its rows on import (kserve/wait.py:
InferenceService, LLMInferenceService and its pools, Ready *at the current generation*; ops/canary_wait.py: the canary
revisions of an InferenceService step). ``wait_ready`` waits on one row. Plain Python over a ``kubernetes.client.ApiClient``.
"""

from __future__ import annotations

import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import writer


class LookAgain(str):
    """A row's "not ready yet" (the reason, a str) about progress the object itself does not report (its pods, the
    workloads it owns): the object does not change meanwhile, so the loop reads it again after ``after`` seconds instead
    of waiting for a watch event."""

    def __new__(cls, why, after):
        text = super().__new__(cls, why)
        text.after = after
        return text


class WaitTimeout(SpecDecodingError):
    """The object did not pass its readiness row in time; ``obj`` is the object as last read, ``pods`` what the caller
    listed of its pods (kserve/wait.py's WaitTimeout adds the InferenceService's)."""

    def __init__(self, message, obj=None, pods=None, field=None, hint=None):
        super().__init__(message, field=field, hint=hint)
        self.obj = obj
        self.pods = pods


class PodCannotStart(SpecDecodingError):
    """A pod of the awaited object waits in a state it will not leave by itself (an image that cannot be pulled, a
    container that cannot be created): ``pod`` (its name), ``reason`` and ``detail`` (the kubelet's message)."""

    def __init__(self, message, pod, reason, detail, field="image", hint=None):
        super().__init__(message, field=field, hint=hint)
        self.pod = pod
        self.reason = reason
        self.detail = detail


def deployment_pending(dep, api_client=None):  # pylint: disable=unused-argument
    """Why a Deployment (a dict) has not finished rolling out to its current spec, or None: as ``kubectl rollout status``
    says (kubectl's DeploymentStatusViewer.Status): observedGeneration caught up, every replica updated and available,
    no old one left."""
    name = (dep.get("metadata") or {}).get("name")
    replicas = (dep.get("spec") or {}).get("replicas")
    want = replicas if replicas is not None else 1
    status, generation = dep.get("status") or {}, (dep.get("metadata") or {}).get("generation") or 0
    if (status.get("observedGeneration") or 0) < generation:
        return "Deployment %s not observed at generation %s yet" % (name, generation)
    updated, total, available = status.get("updatedReplicas") or 0, status.get("replicas") or 0, status.get("availableReplicas") or 0
    if updated < want or total > updated or available < updated:
        return "Deployment %s rolling out (%d of %d updated, %d old, %d available)" % (name, updated, want, max(0, total - updated), available)
    return None


# A pod waiting for one of these will not start by itself (kubelet's container waiting reasons): waiting longer does not
# help, the image or the pod spec must change. bench/load_job.py and ops/draft_preflight_pvc.py wait on their Jobs with it.
STUCK_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
                 "CreateContainerError", "RunContainerError")


def stuck_pod(pods):
    """The first pod (a dict as the API gives it) with a container waiting for one of STUCK_REASONS, as
    ``(pod name, reason, message)``, or None."""
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_REASONS:
                return (pod.get("metadata") or {}).get("name"), waiting["reason"], waiting.get("message") or ""
    return None


def container_started(status):
    """Whether the container of ``status`` (an entry of a pod's containerStatuses) started, now or before a restart: it
    has a log to read."""
    state = status.get("state") or {}
    return bool(state.get("running") or state.get("terminated") or status.get("lastState"))


def job_end(job):
    """The Job's first True Complete or Failed condition (batch/v1 JobCondition), ``{}`` while it runs."""
    return next((c for c in (job.get("status") or {}).get("conditions") or []
                 if c.get("type") in ("Failed", "Complete") and c.get("status") == "True"), {})


def job_pending(job, api_client=None, finished=False, pod_selector=None, pod_interval=1.0):
    """Why a Job (a dict) has not completed, or None: its Complete condition (batch/v1 JobCondition) is True. A Failed
    condition raises (waiting does not help), unless ``finished``: then a Failed Job has ended too, and the caller reads
    its pods (their logs say why).

    With ``pod_selector`` (its pods' label selector, e.g. ``job-name=<name>``) and the ``api_client``, a Job not ended
    yet has its pods listed: one that cannot start (STUCK_REASONS) raises PodCannotStart, else the reason is a
    LookAgain after ``pod_interval`` seconds (a pod's state does not change the Job)."""
    name = (job.get("metadata") or {}).get("name")
    condition = job_end(job)
    if condition.get("type") == "Complete" or condition and finished:
        return None
    if condition:
        raise SpecDecodingError("Job %s failed: %s: %s" % (name, condition.get("reason"), condition.get("message") or ""),
                                field="name", hint="see the Job's events and its pod's log (kubectl describe job %s)" % name)
    status = job.get("status") or {}
    why = "Job %s not complete (%d active, %d succeeded)" % (name, status.get("active") or 0, status.get("succeeded") or 0)
    if pod_selector is None:
        return why
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client  # pylint: disable=import-outside-toplevel
    namespace = (job.get("metadata") or {}).get("namespace")
    pods = client.request(api_client, "GET", writer.object_path("", "v1", "pods", None, namespace),
                          query={"labelSelector": pod_selector}).get("items") or []
    stuck = stuck_pod(pods)
    if stuck is not None:
        pod, reason, detail = stuck
        raise PodCannotStart("the pod %s/%s of Job %s cannot start: %s: %s" % (namespace, pod, name, reason, detail), pod, reason, detail,
                             hint="give the Job an image the nodes can pull and run")
    return LookAgain(why, pod_interval)


# The table of per-kind readiness: row name (a kind) -> pending(obj, api_client=None, **options), None when ready.
# kserve/wait.py adds the KServe kinds, ops/canary_wait.py the canary revisions.
READINESS = {"Deployment": deployment_pending, "Job": job_pending}


def register(kind, check):
    """Add ``kind``'s readiness, ``check(obj, api_client=None, **options)`` -> None or why not, to the table (the
    district that knows the kind does it, once, on import)."""
    READINESS[kind] = check


def pending(kind, obj, api_client=None, **options):
    """Why ``obj`` (of ``kind``) is not ready yet, or None: the table's row for the kind (``options`` are the row's)."""
    if kind not in READINESS:
        raise SpecDecodingError("no readiness check for kind %s (known: %s)" % (kind, ", ".join(sorted(READINESS))), field="kind")
    return READINESS[kind](obj, api_client, **options)


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


# An API server outage is polled for with short reads that double up to OUTAGE_RETRY_MAX (capped by the caller's
# ``interval``): a restart is over in seconds (the test bed's: about 6 s), and a fixed 5 s poll noticed the server back up
# to 5 s late; doubling keeps a long outage at one read every 2 s.
OUTAGE_RETRY_FIRST = 0.5
OUTAGE_RETRY_MAX = 2.0


def _watch_unavailable(exc):
    """True when the API server refuses to watch (RBAC without ``watch``, a proxy without streaming): poll then."""
    return getattr(exc, "status", None) in (403, 405, 406, 501)


def _watch_for_change(api_client, namespace, name, resource_version, seconds, kind=None):
    """Block until the object (of ``kind``: its group, version and plural) changes after ``resource_version`` or ``seconds`` pass.

    Returns the changed object (a dict), or None when the window ended without an event or the object was deleted: the
    caller re-reads it then. Raises the API error otherwise; the kubernetes client raises an expired resourceVersion
    (after an API server restart) as HTTP 410, which the caller answers with a fresh read."""
    from kubernetes import watch  # pylint: disable=import-outside-toplevel
    from kubernetes.client import CustomObjectsApi  # pylint: disable=import-outside-toplevel
    watcher = watch.Watch()
    api = CustomObjectsApi(api_client)
    res = kind
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


def wait_for(api_client, namespace, name, res, check, on_timeout, timeout, interval, clock, sleep, watch):
    """The loop of every wait here: read the object, ``check(obj)``, then watch it from the resourceVersion last read (or
    read it every ``interval`` where the API server refuses the watch) until the check passes or ``timeout`` runs out.

    ``check`` returns True (done), False (wait for the object's next change) or a number of seconds after which to read
    the object again without waiting for a change (progress the object itself does not report, such as a Deployment
    still rolling out); it may raise to fail at once. ``on_timeout(obj, elapsed)`` raises the timeout error.
    An API server outage (restart, overload) is waited out until the timeout, with reads OUTAGE_RETRY_FIRST apart
    doubling to OUTAGE_RETRY_MAX (never more than ``interval``); then the error names the problem."""
    start = clock()
    obj = None
    outage_retry = OUTAGE_RETRY_FIRST  # the next pause after an API server error; back to the first after a watch that worked

    def pause_in_outage(remaining):
        nonlocal outage_retry
        sleep(min(outage_retry, interval, max(0.1, remaining)))
        outage_retry = min(outage_retry * 2, OUTAGE_RETRY_MAX)

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
                pause_in_outage(timeout - elapsed)
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
                outage_retry = OUTAGE_RETRY_FIRST
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
                else:
                    # the watch broke in an outage: read again soon, and back off while the server stays away
                    obj = None
                    pause_in_outage(remaining)
                    continue
        obj = None
        sleep(min(interval, max(0.1, remaining)))


def wait_ready(api_client, namespace, name, kind, row=None, timeout=1200, interval=5, clock=time.monotonic, sleep=time.sleep,
               watch=True, on_timeout=None, **options):
    """Wait until the object passes the table's row ``row`` (default: its kind's, ``kind.kind``) with the row's
    ``options``: ``wait_for`` with the row as the check. Returns (obj, elapsed seconds).

    ``kind`` is what ``wait_for`` reads and watches (a kube/service.py ``Resource`` such as ``JOB``, or a district's own
    reader). On timeout
    ``on_timeout(obj, elapsed, why)`` (why: the row's last reason) may raise the caller's error; otherwise, or when it
    returns, a WaitTimeout naming the object, the reason and the time is raised."""
    row = row or kind.kind
    last = {"why": "not ready"}

    def check(obj):
        why = pending(row, obj, api_client, **options)
        if why is None:
            return True
        last["why"] = why
        return max(0.1, why.after) if isinstance(why, LookAgain) else False

    def timed_out(obj, elapsed):
        if on_timeout is not None:
            on_timeout(obj, elapsed, last["why"])
        raise WaitTimeout("%s %s/%s: %s after %ds" % (kind.kind, namespace, name, last["why"], int(elapsed)), obj, field="timeout",
                          hint="raise the timeout if it is still progressing, else see the object's events (kubectl describe %s -n %s %s)"
                          % (kind.plural, namespace, name))

    return wait_for(api_client, namespace, name, kind, check, timed_out, timeout, interval, clock, sleep, watch)
