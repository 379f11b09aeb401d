# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wait loop under every wait of the collection: read an object, check it, then watch it from the resourceVersion last
read (or read it again every few seconds where the API server refuses the watch) until the check passes or time runs out;
an API server outage (restart, overload) is waited out until the timeout.

What to wait for is the caller's: a ``kind`` (``group``, ``version``, ``plural``, ``kind`` and ``get(api_client,
namespace, name)``) and a ``check(obj)``. What "ready" means per kind is one table, ``READINESS`` (as kubernetes.core's
waiter has ``RESOURCE_PREDICATES``, plugins/module_utils/k8s/waiter.py at 6.2.0): kind -> ``pending(obj)``, None when the
object is ready, else why not (the reason goes into the timeout message). Deployment and Job are here; the district that
knows a kind registers its row (kserve/wait.py: InferenceService and LLMInferenceService, Ready *at the current
generation*). Plain Python over a ``kubernetes.client.ApiClient``.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError


def deployment_pending(dep):
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


def job_pending(job):
    """Why a Job (a dict) has not completed, or None: its Complete condition (batch/v1 JobCondition) is True. A Failed
    condition raises: waiting does not help."""
    name = (job.get("metadata") or {}).get("name")
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return None
        if condition.get("type") == "Failed":
            raise SpecDecodingError("Job %s failed: %s: %s" % (name, condition.get("reason"), condition.get("message") or ""),
                                    field="name", hint="see the Job's events and its pod's log (kubectl describe job %s)" % name)
    status = job.get("status") or {}
    return "Job %s not complete (%d active, %d succeeded)" % (name, status.get("active") or 0, status.get("succeeded") or 0)


# The table of per-kind readiness: kind -> pending(obj), None when ready. kserve/wait.py adds the KServe kinds.
READINESS = {"Deployment": deployment_pending, "Job": job_pending}


def register(kind, check):
    """Add ``kind``'s readiness, ``check(obj)`` -> None or why not, to the table (the district that knows the kind does
    it, once, on import)."""
    READINESS[kind] = check


def pending(kind, obj):
    """Why ``obj`` (of ``kind``) is not ready yet, or None: the table's row for the kind."""
    if kind not in READINESS:
        raise SpecDecodingError("no readiness check for kind %s (known: %s)" % (kind, ", ".join(sorted(READINESS))), field="kind")
    return READINESS[kind](obj)


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
