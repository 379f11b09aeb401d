# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reach an InferenceService's predictor pods through the API server: list them, stream their logs, proxy HTTP.

Every function takes a ``kubernetes.client.ApiClient`` (modules get one from kubernetes.core's
``get_api_client(module).client.client``), so authentication stays kubernetes.core's business. Logs are
streamed (``_preload_content=False``) and handed on in chunks: memory stays bounded whatever the log size.

Also reads an InferenceService: its predictor containers, whether their command/args carry
``--speculative-config`` in any form (through ``vllm_command``), Ready and observedGeneration.

Plain Python, no Ansible imports; ``kubernetes`` is imported guardedly.
"""

from __future__ import annotations

import json
import re
import shlex

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

try:
    from kubernetes.client import CoreV1Api, CustomObjectsApi
    from kubernetes.client.exceptions import ApiException
    HAS_KUBERNETES = True
except ImportError:  # pragma: no cover - the calling module reports it with missing_required_lib
    CoreV1Api = CustomObjectsApi = None

    class ApiException(Exception):
        """Stand-in so except clauses work without the library."""

    HAS_KUBERNETES = False

try:
    from urllib3.exceptions import HTTPError as TransportError
except ImportError:  # pragma: no cover - urllib3 comes with kubernetes
    class TransportError(Exception):
        """Stand-in so except clauses work without the library."""

ISVC_LABEL = "serving.kserve.io/inferenceservice"
DEFAULT_CONTAINER = "kserve-container"
KSERVE_GROUP = "serving.kserve.io"
KSERVE_VERSION = "v1beta1"
LOG_CHUNK = 1 << 16
DEFAULT_HTTP_PORT = 8080  # KServe's runtimes (and its vLLM examples) serve HTTP on 8080
# vLLM's own flag first; KServe's model servers (huggingfaceserver) use --http_port.
PORT_FLAGS = ("--port", "--http_port", "--http-port")
TLS_FLAGS = ("--ssl-certfile", "--ssl_certfile")
HTTP_PORT_NAMES = ("http", "http1", "h2c", "http-server", "metrics", "http-metrics")


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
    api = CustomObjectsApi(api_client)
    try:
        return api.get_namespaced_custom_object(KSERVE_GROUP, version, namespace, "inferenceservices", name)
    except ApiException as exc:
        if getattr(exc, "status", None) == 404:
            raise ValidationError("InferenceService %s/%s not found" % (namespace, name), field="name",
                                  hint="check name and namespace (kubectl get inferenceservices -n %s)" % namespace) from exc
        raise PodAccessError("reading InferenceService %s/%s failed: %s" % (namespace, name, api_error_message(exc)),
                             field="name") from exc


def predictor_containers(isvc):
    """``[(container_name, command_list, args_list)]`` of the predictor: the model spec, then custom containers."""
    predictor = ((isvc or {}).get("spec") or {}).get("predictor") or {}
    found = []
    model = predictor.get("model")
    if isinstance(model, dict):
        found.append((model.get("name") or DEFAULT_CONTAINER, list(model.get("command") or []), list(model.get("args") or [])))
    for container in predictor.get("containers") or []:
        if isinstance(container, dict):
            found.append((container.get("name") or DEFAULT_CONTAINER, list(container.get("command") or []),
                          list(container.get("args") or [])))
    return found


def readiness(isvc):
    """``{ready, generation, observed_generation, up_to_date, reason}`` from an InferenceService's status."""
    meta = (isvc or {}).get("metadata") or {}
    status = (isvc or {}).get("status") or {}
    generation = meta.get("generation")
    ready_cond = None
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            ready_cond = cond
    observed = status.get("observedGeneration")
    if observed is None and ready_cond is not None:
        observed = ready_cond.get("observedGeneration")
    ready = bool(ready_cond and str(ready_cond.get("status")) == "True")
    up_to_date = generation is not None and observed is not None and int(observed) == int(generation)
    return {
        "ready": ready,
        "generation": generation,
        "observed_generation": observed,
        "up_to_date": up_to_date,
        "reason": (ready_cond or {}).get("reason"),
        "message": (ready_cond or {}).get("message"),
    }


# ----------------------------------------------------------------------------------------------------
# --speculative-config in the predictor (the command editor of the rollback part reads every form)

def isvc_speculative_flags(isvc):
    """Per predictor container: does its command+args carry a speculative flag (any form)?

    Returns ``[{container, present, forms, config, error}]``; config is the merged dict vLLM would see
    (None when absent or unreadable, error then says why).
    """
    out = []
    for name, command, args in predictor_containers(isvc):
        occurrences = vllm_command.find_occurrences(command) + vllm_command.find_occurrences(args)
        entry = {"container": name, "present": bool(occurrences), "forms": sorted({o.form for o in occurrences}),
                 "config": None, "error": None}
        if occurrences:
            try:
                entry["config"] = vllm_command.config_from_occurrences(occurrences, field="spec.predictor")
            except ValidationError as exc:
                entry["error"] = str(exc)
        out.append(entry)
    return out


# ----------------------------------------------------------------------------------------------------
# Pods

def _pod_summary(pod):
    meta = pod.metadata
    status = pod.status
    containers = [c.name for c in (pod.spec.containers or [])] if pod.spec else []
    restarts = {}
    for cs in (status.container_statuses or []) if status else []:
        restarts[cs.name] = cs.restart_count
    return {
        "name": meta.name,
        "namespace": meta.namespace,
        "phase": status.phase if status else None,
        "deleting": meta.deletion_timestamp is not None,
        "labels": dict(meta.labels or {}),
        "containers": containers,
        "restarts": restarts,
    }


def list_pods(api_client, namespace, selector):
    """Pods matching ``selector`` (any workload, e.g. an LLMInferenceService pool): ``(pods, skipped)`` as summary dicts,
    pods being deleted or finished in ``skipped`` with the reason."""
    try:
        pods = CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=selector)
    except ApiException as exc:
        raise PodAccessError("listing pods %s in namespace %s failed: %s" % (selector, namespace, api_error_message(exc)),
                             field="namespace", hint="the identity needs list on pods in that namespace") from exc
    keep, skipped = [], []
    for pod in sorted(pods.items, key=lambda p: p.metadata.name):
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
    kwargs = {"container": container, "_preload_content": False}
    if since_seconds is not None:
        kwargs["since_seconds"] = int(since_seconds)
    if tail_lines is not None:
        kwargs["tail_lines"] = int(tail_lines)
    if previous:
        kwargs["previous"] = True
    if timeout is not None:
        kwargs["_request_timeout"] = timeout
    try:
        resp = CoreV1Api(api_client).read_namespaced_pod_log(pod, namespace, **kwargs)
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


def proxy_get(api_client, namespace, pod, port=DEFAULT_HTTP_PORT, path="metrics", scheme="http", timeout=30):
    """GET ``path`` on a pod's port through the API server's pod proxy; returns the body as text."""
    target = "%s:%s" % (pod, port) if scheme == "http" else "%s:%s:%s" % (scheme, pod, port)
    try:
        resp = CoreV1Api(api_client).connect_get_namespaced_pod_proxy_with_path(
            target, namespace, path.lstrip("/"), _preload_content=False, _request_timeout=timeout)
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
    try:
        return resp.data.decode("utf-8", "replace")
    finally:
        resp.release_conn()


def read_pod(api_client, namespace, pod):
    """A pod as a plain dict (the API's camelCase keys)."""
    try:
        obj = CoreV1Api(api_client).read_namespaced_pod(pod, namespace)
    except ApiException as exc:
        if getattr(exc, "status", None) == 404:
            raise ValidationError("pod %s/%s not found" % (namespace, pod), field="pod",
                                  hint="check pod and namespace (kubectl get pods -n %s)" % namespace) from exc
        raise PodAccessError("reading pod %s/%s failed: %s" % (namespace, pod, api_error_message(exc)), field="pod",
                             hint="the identity needs get on pods to find the HTTP port and scheme; or give port (a number) "
                                  "and scheme") from exc
    return api_client.sanitize_for_serialization(obj)


def _argv_tokens(argv):
    """command+args as tokens; an element holding a shell line (``sh -c "vllm serve ... --port 8000"``) is split too."""
    tokens = []
    for item in argv or []:
        item = str(item)
        if any(ch.isspace() for ch in item.strip()):
            try:
                tokens.extend(shlex.split(item))
            except ValueError:
                tokens.extend(item.split())
        else:
            tokens.append(item)
    return tokens


def argv_option(argv, flags):
    """Value of the last ``--flag V`` / ``--flag=V`` in argv for any of ``flags`` (None when absent)."""
    tokens = _argv_tokens(argv)
    value = None
    for i, token in enumerate(tokens):
        for flag in flags:
            if token == flag and i + 1 < len(tokens):
                value = tokens[i + 1]
            elif token.startswith(flag + "="):
                value = token[len(flag) + 1:]
    return value


_PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$")


def check_port(port, field="port"):
    """A port as the pod proxy takes it: a number 1-65535 or a container port name (IANA_SVC_NAME: at most 15
    lowercase letters, digits and inner dashes, at least one letter). Checked before any API call."""
    text = None if port is None else str(port).strip()
    if not text:
        return None
    if text.isdigit():
        if not 1 <= int(text) <= 65535:
            raise ValidationError("port %s is out of range" % text, field=field, hint="give a port number from 1 to 65535, or a container port name")
        return int(text)
    if not _PORT_NAME.match(text) or "--" in text:
        raise ValidationError("%r is neither a port number nor a valid container port name" % text, field=field,
                              hint="give a number from 1 to 65535, or the name of a port in the pod spec (e.g. http)")
    return text


def pod_http_target(pod, container=DEFAULT_CONTAINER, port=None, scheme=None):
    """Where vLLM's HTTP server listens in a pod (a dict with the API's camelCase keys).

    Returns ``{"scheme", "port", "container", "how"}``. ``port`` as given: a number is used as is; a name is
    looked up among the pod's container ports (the pod proxy only takes numbers). Without it: ``--port`` (or
    KServe's ``--http_port``) in the container's command/args, which is what the server binds; else the
    container's port named http/http1/h2c/metrics, else its first TCP port; else 8080. ``scheme`` without a
    value: https when the container passes ``--ssl-certfile`` to vLLM, else http.
    """
    spec = (pod or {}).get("spec") or {}
    pod_name = ((pod or {}).get("metadata") or {}).get("name") or "?"
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    chosen = None
    for item in containers:
        if item.get("name") == container:
            chosen = item
    how = []
    if chosen is None:
        chosen = containers[0] if containers else {}
        if containers:
            how.append("pod has no container %r, used %r" % (container, chosen.get("name")))
    argv = list(chosen.get("command") or []) + list(chosen.get("args") or [])
    ports = [p for p in chosen.get("ports") or [] if isinstance(p, dict) and p.get("containerPort")]
    resolved = None
    checked = check_port(port)
    text = None if checked is None else str(checked)
    if text:
        if text.isdigit():
            resolved, source = int(text), "given"
        else:
            named = [(c.get("name"), p) for c in [chosen] + [c for c in containers if c is not chosen]
                     for p in c.get("ports") or [] if isinstance(p, dict) and p.get("name") == text]
            if not named:
                names = sorted({p.get("name") for c in containers for p in c.get("ports") or [] if isinstance(p, dict) and p.get("name")})
                raise ValidationError("pod %s has no container port named %r (named ports: %s)"
                                      % (pod_name, text, ", ".join(names) or "none"), field="port",
                                      hint="give the port number, or one of the pod's port names")
            resolved, source = int(named[0][1]["containerPort"]), "from the port named %r of container %s" % (text, named[0][0])
    if resolved is None:
        flag_value = argv_option(argv, PORT_FLAGS)
        if flag_value is not None and str(flag_value).isdigit():
            resolved, source = int(flag_value), "from %s in the command/args of %s" % (
                [f for f in PORT_FLAGS if argv_option(argv, (f,)) == flag_value][0], chosen.get("name"))
    if resolved is None and ports:
        tcp = [p for p in ports if str(p.get("protocol") or "TCP").upper() == "TCP"]
        named = [p for p in tcp if str(p.get("name") or "").lower() in HTTP_PORT_NAMES]
        plain = [p for p in tcp if "grpc" not in str(p.get("name") or "").lower()]
        pick = (named or plain or tcp or ports)[0]
        resolved, source = int(pick["containerPort"]), "from containerPort%s of %s" % (
            " %r" % pick["name"] if pick.get("name") else "", chosen.get("name"))
    if resolved is None:
        resolved, source = DEFAULT_HTTP_PORT, "by default (no --port and no containerPort on %s)" % (chosen.get("name") or "the pod")
    how.append("port %s %s" % (resolved, source))
    if scheme:
        chosen_scheme = scheme
        how.append("scheme %s given" % scheme)
    elif argv_option(argv, TLS_FLAGS):
        chosen_scheme = "https"
        how.append("https because %s passes --ssl-certfile" % chosen.get("name"))
    else:
        chosen_scheme = "http"
    return {"scheme": chosen_scheme, "port": resolved, "container": chosen.get("name"), "how": "; ".join(how)}
