# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reach an InferenceService's predictor pods through the API server: list them, stream their logs, proxy HTTP.

Every function takes a ``kubernetes.client.ApiClient`` (modules get one from kubernetes.core's
``get_api_client(module).client.client``), so authentication stays kubernetes.core's business. Each call is one request
by path (``kube.client.request``): pods come back as dicts, and no typed API class is imported. Logs are streamed
(``stream=True``) and handed on in chunks: memory stays bounded whatever the log size.

Also reads an InferenceService object; what it says (predictor containers, the speculative flag, Ready at its
generation) is read in ``kserve/isvc/readers.py``, where vLLM's HTTP server listens in a pod in ``vllm/http_target.py``.

Plain Python, no Ansible imports; ``kubernetes`` is imported guardedly.
"""

from __future__ import annotations

import json
import urllib.parse

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as _client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.defaults import (
    DEFAULT_CONTAINER, DEFAULT_HTTP_PORT, ISVC_LABEL, KSERVE_GROUP, KSERVE_VERSION)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import HAS_KUBERNETES, ApiException  # noqa: F401  pylint: disable=unused-import


try:
    from urllib3.exceptions import HTTPError as TransportError
except ImportError:  # pragma: no cover - urllib3 comes with kubernetes
    class TransportError(Exception):
        """Stand-in so except clauses work without the library."""

LOG_CHUNK = 1 << 16


class PodAccessError(SpecDecodingError):
    """The API server refused or failed a pod read (log, proxy, list)."""


def api_error_message(exc):
    """The API server's own message from an ApiException (its JSON Status body), else its reason."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if body:
        try:
            status = json.loads(body)
            if isinstance(status, dict) and status.get("message"):
                return "%s (HTTP %s)" % (status["message"], getattr(exc, "status", "?"))
        except ValueError:
            return "%s (HTTP %s)" % (body.strip()[:500], getattr(exc, "status", "?"))
    return "%s (HTTP %s)" % (getattr(exc, "reason", None) or exc, getattr(exc, "status", "?"))


# ----------------------------------------------------------------------------------------------------
# InferenceService

def get_inference_service(api_client, namespace, name, version=KSERVE_VERSION):
    """The InferenceService as a dict; ValidationError naming it when it does not exist."""
    try:
        return _client.request(api_client, "GET", "/apis/%s/%s/namespaces/%s/inferenceservices/%s" % (
            KSERVE_GROUP, version, urllib.parse.quote(namespace, safe=""), urllib.parse.quote(name, safe="")))
    except ApiException as exc:
        if getattr(exc, "status", None) == 404:
            raise ValidationError("InferenceService %s/%s not found" % (namespace, name), field="name",
                                  hint="check name and namespace (kubectl get inferenceservices -n %s)" % namespace) from exc
        raise PodAccessError("reading InferenceService %s/%s failed: %s" % (namespace, name, api_error_message(exc)),
                             field="name") from exc


# ----------------------------------------------------------------------------------------------------
# Pods

def _pods_path(namespace, pod=None, sub=None):
    path = "/api/v1/namespaces/%s/pods" % urllib.parse.quote(namespace, safe="")
    if pod is not None:
        path += "/" + urllib.parse.quote(pod, safe=":")
    return path + ("/" + sub if sub else "")


def _pod_summary(pod):
    """What the collection reads of a pod (a dict with the API's camelCase keys)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "phase": status.get("phase"),
        "deleting": meta.get("deletionTimestamp") is not None,
        "labels": dict(meta.get("labels") or {}),
        "containers": [c.get("name") for c in ((pod.get("spec") or {}).get("containers") or [])],
        "restarts": {cs.get("name"): cs.get("restartCount") for cs in status.get("containerStatuses") or []},
        "init_restarts": {cs.get("name"): cs.get("restartCount") for cs in status.get("initContainerStatuses") or []},
        # per container, the state a pod listing shows: waiting/terminated reason (CrashLoopBackOff, Error), or running
        "states": {cs.get("name"): _container_state(cs) for cs in (status.get("initContainerStatuses") or []) +
                   (status.get("containerStatuses") or [])},
    }


def _container_state(cs):
    state = cs.get("state") or {}
    for key in ("waiting", "terminated"):
        if state.get(key):
            return state[key].get("reason") or key
    return "running" if state.get("running") is not None else None


def list_pods(api_client, namespace, selector):
    """Pods matching ``selector`` (any workload, e.g. an LLMInferenceService pool): ``(pods, skipped)`` as summary dicts,
    pods being deleted or finished in ``skipped`` with the reason."""
    try:
        pods = _client.request(api_client, "GET", _pods_path(namespace), query={"labelSelector": selector})
    except ApiException as exc:
        raise PodAccessError("listing pods %s in namespace %s failed: %s" % (selector, namespace, api_error_message(exc)),
                             field="namespace", hint="the identity needs list on pods in that namespace") from exc
    keep, skipped = [], []
    for pod in sorted(pods.get("items") or [], key=lambda p: p["metadata"]["name"]):
        info = _pod_summary(pod)
        if info["deleting"]:
            skipped.append(dict(info, reason="being deleted"))
        elif info["phase"] in ("Succeeded", "Failed"):
            skipped.append(dict(info, reason="phase %s" % info["phase"]))
        else:
            keep.append(info)
    return keep, skipped


def list_predictor_pods(api_client, namespace, name, label_selector=None, component="predictor"):
    """Predictor pods of an InferenceService: ``(pods, skipped)`` as summary dicts.

    Selected by ``serving.kserve.io/inferenceservice=<name>`` (plus ``label_selector``); pods labelled with
    another KServe ``component`` (transformer, explainer) are left out; so are pods being deleted and pods
    that finished (Succeeded/Failed), which are returned in ``skipped`` with the reason.
    """
    selector = "%s=%s" % (ISVC_LABEL, name)
    if label_selector:
        selector += "," + label_selector
    keep, skipped = list_pods(api_client, namespace, selector)

    def wanted(info):
        comp = info["labels"].get("component")
        return not (component and comp and comp != component)
    return [p for p in keep if wanted(p)], [p for p in skipped if wanted(p)]


def stream_pod_log(api_client, namespace, pod, container=DEFAULT_CONTAINER, since_seconds=None, tail_lines=None,
                   previous=False, chunk_size=LOG_CHUNK, timeout=None):
    """Yield a pod container's log in byte chunks, streamed from the API server (never loaded whole)."""
    query = {"container": container, "sinceSeconds": None if since_seconds is None else int(since_seconds),
             "tailLines": None if tail_lines is None else int(tail_lines), "previous": "true" if previous else None}
    try:
        resp = _client.request(api_client, "GET", _pods_path(namespace, pod, "log"), query=query, stream=True, timeout=timeout)
    except ApiException as exc:
        hint = None
        text = api_error_message(exc)
        if "previous terminated container" in text:
            hint = "the container has not restarted; drop previous"
        elif "is not valid for pod" in text or "container" in text and "not found" in text:
            hint = "set container to one of the pod's containers (vLLM runs in %s by default)" % DEFAULT_CONTAINER
        elif "waiting to start" in text or "ContainerCreating" in text or "PodInitializing" in text:
            hint = "the container has not started yet; wait for the InferenceService to be Ready"
        raise PodAccessError("reading log of pod %s/%s container %s failed: %s" % (namespace, pod, container, text),
                             field="name", hint=hint) from exc
    try:
        yield from resp.stream(chunk_size, decode_content=True)
    finally:
        resp.release_conn()


def read_pod_log(api_client, namespace, pod, max_bytes=None, **kwargs):
    """A pod container's log as text (stream_pod_log's chunks, ``kwargs`` as there), read up to the first chunk past
    ``max_bytes`` when given: a Job's result block, a bundle's tail, never a runaway log held whole."""
    chunks, size = [], 0
    for chunk in stream_pod_log(api_client, namespace, pod, **kwargs):
        chunks.append(chunk)
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            break
    return b"".join(chunks).decode("utf-8", "replace")


def proxy_get(api_client, namespace, pod, port=DEFAULT_HTTP_PORT, path="metrics", scheme="http", timeout=30):
    """GET ``path`` on a pod's port through the API server's pod proxy; returns the body as text."""
    target = "%s:%s" % (pod, port) if scheme == "http" else "%s:%s:%s" % (scheme, pod, port)
    try:
        resp = _client.request(api_client, "GET", _pods_path(namespace, target, "proxy/" + urllib.parse.quote(path.lstrip("/"))),
                               stream=True, timeout=timeout)
        # the body is read after the headers: a pod that stalls or drops the connection half-way fails here
        try:
            return resp.data.decode("utf-8", "replace")
        finally:
            resp.release_conn()
    except ApiException as exc:
        raise PodAccessError("GET /%s on pod %s/%s port %s (%s) through the API server proxy failed: %s"
                             % (path.lstrip("/"), namespace, pod, port, scheme, api_error_message(exc)), field="port",
                             hint="check the pod is Running and serves /%s on that port (vLLM's default in KServe is 8080) "
                                  "with that scheme (https when vLLM runs with --ssl-certfile); "
                                  "the identity needs get on pods/proxy" % path.lstrip("/")) from exc
    except (TransportError, OSError) as exc:
        raise PodAccessError("GET /%s on pod %s/%s port %s (%s) through the API server proxy failed: %s"
                             % (path.lstrip("/"), namespace, pod, port, scheme, exc), field="timeout",
                             hint="the API server or the pod did not answer in time; raise timeout or check the pod") from exc


def read_pod(api_client, namespace, pod):
    """A pod as a plain dict (the API's camelCase keys)."""
    try:
        return _client.request(api_client, "GET", _pods_path(namespace, pod))
    except ApiException as exc:
        if getattr(exc, "status", None) == 404:
            raise ValidationError("pod %s/%s not found" % (namespace, pod), field="pod",
                                  hint="check pod and namespace (kubectl get pods -n %s)" % namespace) from exc
        raise PodAccessError("reading pod %s/%s failed: %s" % (namespace, pod, api_error_message(exc)), field="pod",
                             hint="the identity needs get on pods to find the HTTP port and scheme; or give port (a number) "
                                  "and scheme") from exc
