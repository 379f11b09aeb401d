# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster service: the one object a feature talks to the cluster through, after kubernetes.core's ``K8sService``
(plugins/module_utils/k8s/service.py, built once per module run from its client) and community.okd's
``AnsibleOpenshiftModule`` (one client per module, its helpers on it).

Built once per task from the module's connection (``KubeModule.cluster`` / ``TaskModule.cluster``: the api_client
kubernetes.core's ``get_api_client`` authenticated), it owns that client and offers:

- typed reads: ``inference_service``, ``get`` / ``list`` of any ``Resource`` (LLMInferenceService, ServingRuntime,
  ClusterServingRuntime, ConfigMap, Deployment, PVC ...), ``pods``, ``predictor_pods``, ``pod_log``, ``proxy_get``,
  ``read_pod`` (kube/pods.py's functions: they stay the implementation, so their callers and tests see one behaviour);
- the one patch writer (kube/writer.py): ``json_patch``, ``merge_patch``, ``create`` under the collection's field
  managers, a server-side dry run when asked, a changed object a ``PatchConflict``;
- the one wait loop (kube/wait.py): ``wait_for``.

Plain Python, no Ansible imports; the kubernetes package is reached through kube/client.py and kube/pods.py inside each
call, so building the service (and importing this file) does not load it: offline work never pays for it.
"""

from __future__ import annotations

import collections
import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import writer
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.defaults import KSERVE_GROUP, KSERVE_VERSION
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.ssa_conflicts import ROLLBACK_FIELD_MANAGER


class Resource(collections.namedtuple("Resource", "group version plural kind namespaced")):
    """Where a kind lives in the API (``group`` "" for the core API)."""

    def path(self, name=None, namespace=None):
        return writer.object_path(self.group, self.version, self.plural, name, namespace if self.namespaced else None)

    def at(self, version):
        """The same kind at another API version (LLMInferenceService v1alpha1 / v1alpha2)."""
        return self._replace(version=version)

    def get(self, api_client, namespace, name):
        """The object (the ``kind`` interface of kube/wait.wait_for, which reads what it waits for with this)."""
        return ClusterService(api_client).get(self, name, namespace)

    def label(self, name, namespace=None):
        return "%s %s" % (self.kind, "%s/%s" % (namespace, name) if self.namespaced and namespace else name)


INFERENCE_SERVICE = Resource(KSERVE_GROUP, KSERVE_VERSION, "inferenceservices", "InferenceService", True)
# KServe's CRD serves v1alpha1 and v1alpha2; the callers pass the version they were given (kserve/llmisvc/model.py checks it)
LLM_INFERENCE_SERVICE = Resource(KSERVE_GROUP, "v1alpha2", "llminferenceservices", "LLMInferenceService", True)
SERVING_RUNTIME = Resource(KSERVE_GROUP, "v1alpha1", "servingruntimes", "ServingRuntime", True)
CLUSTER_SERVING_RUNTIME = Resource(KSERVE_GROUP, "v1alpha1", "clusterservingruntimes", "ClusterServingRuntime", False)
CONFIG_MAP = Resource("", "v1", "configmaps", "ConfigMap", True)
PERSISTENT_VOLUME_CLAIM = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True)
DEPLOYMENT = Resource("apps", "v1", "deployments", "Deployment", True)
JOB = Resource("batch", "v1", "jobs", "Job", True)
POD = Resource("", "v1", "pods", "Pod", True)
EVENT = Resource("", "v1", "events", "Event", True)
SECRET = Resource("", "v1", "secrets", "Secret", True)
SERVICE_ACCOUNT = Resource("", "v1", "serviceaccounts", "ServiceAccount", True)


def _pods():
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods  # pylint: disable=import-outside-toplevel
    return pods


def api_error_message(exc):
    """The API server's own message from an ApiException (kube/pods.api_error_message)."""
    return _pods().api_error_message(exc)


def api_failure(what, exc, field="name", hint=None):
    """A SpecDecodingError ``<what> failed: <the API server's own message>`` (a 403 names the user, the verb and the
    resource, so the default fix is the grant)."""
    if hint is None and getattr(exc, "status", None) == 403:
        hint = "grant the verb on the resource named above (docs/rbac.md lists the rules each playbook needs)"
    return SpecDecodingError("%s failed: %s" % (what, api_error_message(exc)), field=field, hint=hint)


class ClusterService:
    """The cluster, as one task reaches it: the authenticated client, the reads, the patch writer and the wait loop."""

    def __init__(self, api_client):
        self.api_client = api_client

    # -- reads -----------------------------------------------------------------------------------------------------

    def request(self, method, path, **kwargs):
        """kube.client.request with this service's client (one call by path, dicts back)."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
        return request(self.api_client, method, path, **kwargs)

    def get(self, res, name, namespace=None, missing="refuse", field="name", timeout=None):
        """The object as a dict. A 404 is a ValidationError naming it (``missing="refuse"``) or None (``missing="none"``);
        any other refusal the client's ApiException, for the caller to say what it was reading. ``timeout``: seconds
        for the request (the client's default without)."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
        try:
            return self.request("GET", res.path(name, namespace), timeout=timeout)
        except ApiException as exc:
            if getattr(exc, "status", None) != 404:
                raise
            if missing == "none":
                return None
            raise ValidationError("%s not found" % res.label(name, namespace), field=field,
                                  hint="check name and namespace (kubectl get %s%s)" % (
                                      res.plural, " -n %s" % namespace if res.namespaced and namespace else "")) from exc

    def list(self, res, namespace=None, selector=None, timeout=None):
        """The items of ``res`` (in ``namespace``; all namespaces without one), whole objects as dicts (``pods`` gives
        summaries). The client's ApiException on a refusal."""
        return (self.request("GET", res.path(None, namespace), query={"labelSelector": selector}, timeout=timeout) or {}).get("items") or []

    def delete(self, res, name, namespace=None, propagation=None):
        """DELETE the object (``propagation``: Background, Foreground or Orphan for its dependents); a 404 is not an
        error (it is gone). The client's ApiException for any other refusal."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
        try:
            self.request("DELETE", res.path(name, namespace), query={"propagationPolicy": propagation})
        except ApiException as exc:
            if getattr(exc, "status", None) != 404:
                raise

    def inference_service(self, namespace, name):
        """The InferenceService (kube/pods.get_inference_service: a 404 names it, another refusal is a PodAccessError)."""
        return _pods().get_inference_service(self.api_client, namespace, name)

    def pods(self, namespace, selector):
        return _pods().list_pods(self.api_client, namespace, selector)

    def predictor_pods(self, namespace, name, label_selector=None, component="predictor"):
        return _pods().list_predictor_pods(self.api_client, namespace, name, label_selector=label_selector, component=component)

    def pod_log(self, namespace, pod, **kwargs):
        return _pods().stream_pod_log(self.api_client, namespace, pod, **kwargs)

    def pod_log_text(self, namespace, pod, max_bytes=None, **kwargs):
        """The log as text, up to the first chunk past ``max_bytes`` (kube/pods.read_pod_log)."""
        return _pods().read_pod_log(self.api_client, namespace, pod, max_bytes=max_bytes, **kwargs)

    def proxy_get(self, namespace, pod, **kwargs):
        return _pods().proxy_get(self.api_client, namespace, pod, **kwargs)

    def read_pod(self, namespace, pod):
        return _pods().read_pod(self.api_client, namespace, pod)

    def custom_objects(self):
        """CustomObjectsApi's read calls (get/list, namespaced and cluster-scoped) over ``request``: dicts back, the same
        ApiException on a refusal, without the typed class's import and models (kube/client.py says what they cost)."""
        return CustomObjectReads(self)

    # -- the patch writer ---------------------------------------------------------------------------------------------

    def json_patch(self, res, name, ops, namespace=None, field_manager=ROLLBACK_FIELD_MANAGER, dry_run=False, read=None):
        """kube/writer.json_patch of the object (``read()`` gives it afresh to judge a failed ``test``; default: a GET)."""
        if read is None:
            def read():
                return self.get(res, name, namespace)
        return writer.json_patch(self.api_client, res.path(name, namespace), ops, field_manager=field_manager, dry_run=dry_run,
                                 read=read)

    def merge_patch(self, res, name, body, namespace=None, field_manager=None, dry_run=False):
        return writer.merge_patch(self.api_client, res.path(name, namespace), body, field_manager=field_manager, dry_run=dry_run)

    def create(self, res, body, namespace=None, field_manager=ROLLBACK_FIELD_MANAGER, dry_run=False):
        return writer.create(self.api_client, res.path(None, namespace), body, field_manager=field_manager, dry_run=dry_run)

    # -- the wait loop ------------------------------------------------------------------------------------------------

    def wait_for(self, namespace, name, kind, check=None, on_timeout=None, timeout=1200, interval=5, clock=time.monotonic,
                 sleep=time.sleep, watch=True, **row_options):
        """kube/wait.wait_for with this service's client (``kind``: group, version, plural, kind and get(api_client,
        namespace, name); ``check`` and ``on_timeout`` as there). Without ``check``: the readiness table's row of the
        kind (kube/wait.wait_ready, ``row_options`` the row's, ``on_timeout(obj, elapsed, why)``), e.g. a Job ended and
        its pods started: ``wait_for(ns, job, JOB, timeout=t, finished=True, pod_selector=sel)``."""
        if check is None:
            return kube_wait.wait_ready(self.api_client, namespace, name, kind, timeout=timeout, interval=interval, clock=clock, sleep=sleep,
                                        watch=watch, on_timeout=on_timeout, **row_options)
        return kube_wait.wait_for(self.api_client, namespace, name, kind, check, on_timeout, timeout, interval, clock, sleep, watch)

    def job_outcome(self, namespace, name, timeout, container=None, interval=1.0, max_bytes=None, clock=time.monotonic,
                    sleep=time.sleep):
        """Wait until the Job ends and say how: ``{"ended": "Complete"|"Failed", "condition": its JobCondition,
        "job": the Job, "pod": its newest pod that ran (``_has_run``) or None, "pod_phase": that pod's phase,
        "log": that pod's (``container``'s) log up to ``max_bytes`` (kube/pods.read_pod_log), "" without such a pod}``.

        The wait is the table's Job row through ``wait_for`` (ended, Complete or Failed; its pods looked at on every
        read, one that cannot start fails at once: kube/wait.PodCannotStart), the Job read again every ``interval``
        seconds (a pod's progress does not change the Job, so there is no event to watch for). A Job that does not end
        within ``timeout`` seconds is a kube/wait.WaitTimeout; one that does not exist a ValidationError naming it.
        A pod that never ran (a retry the deadline stopped before it started) has no log to read: the newest one that
        did is the one that says why. A Job's read refused is an ApiException, the log's a kube/pods.PodAccessError."""
        selector = "job-name=%s" % name
        job, _elapsed = self.wait_for(namespace, name, JOB, timeout=timeout, interval=interval, clock=clock, sleep=sleep,
                                      finished=True, pod_selector=selector, pod_interval=interval)
        ran = [p for p in self.list(POD, namespace, selector=selector) if _has_run(p)]
        newest = max(ran, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "", default=None)
        pod = (newest.get("metadata") or {}).get("name") if newest else None
        log = self.pod_log_text(namespace, pod, max_bytes=max_bytes, container=container) if pod else ""
        condition = kube_wait.job_end(job)
        return {"ended": condition.get("type"), "condition": condition, "job": job, "pod": pod,
                "pod_phase": newest["status"]["phase"] if newest else None, "log": log}


def _has_run(pod):
    """A pod with a log to read: it ended (Succeeded, Failed) or a container of it started, now or before a restart. A
    retry its Job's deadline stopped before its container started has none."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    return any(kube_wait.container_started(c) for c in status.get("containerStatuses") or [])


class CustomObjectReads:
    """The four read calls of kubernetes' CustomObjectsApi, with its argument order, answered through the service."""

    def __init__(self, service):
        self.service = service

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        return self.service.request("GET", writer.object_path(group, version, plural, name, namespace))

    def get_cluster_custom_object(self, group, version, plural, name):
        return self.service.request("GET", writer.object_path(group, version, plural, name))

    def list_namespaced_custom_object(self, group, version, namespace, plural, label_selector=None):
        return self.service.request("GET", writer.object_path(group, version, plural, None, namespace), query={"labelSelector": label_selector})

    def list_cluster_custom_object(self, group, version, plural, label_selector=None):
        return self.service.request("GET", writer.object_path(group, version, plural), query={"labelSelector": label_selector})


def of_module(module):
    """The module's cluster service, built on first use from its ``api_client`` and kept on it (KubeModule and the
    in-process TaskModule both answer ``module.cluster`` with this)."""
    service = getattr(module, "_cluster", None)
    if service is None:
        service = module._cluster = ClusterService(module.api_client)  # pylint: disable=protected-access
    return service


def service_of(cluster_or_client):
    """The ClusterService for a ClusterService or a bare ``ApiClient`` (callers that still pass the client)."""
    return cluster_or_client if isinstance(cluster_or_client, ClusterService) else ClusterService(cluster_or_client)
