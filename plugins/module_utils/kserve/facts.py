# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a deploy needs to know about the cluster before it renders, read in one go.

- the KServe release, from the InferenceService CRD's schema (``isvc.kserve_version_from_crd``): only the verdict
  leaves this module, never the 2 MB CRD (handing it to the render through Ansible facts cost seconds per deploy);
- whether the storage initializer has Modelcar on (``inferenceservice-config``, key ``storageInitializer``);
- the current InferenceService (for the deployment-mode check and the diff), or None;
- the ServingRuntime / ClusterServingRuntime the InferenceService will run on (as a ``serving_runtime`` snapshot), so the
  render can merge the runtime's command and refuse a second ``--speculative-config`` without reading the cluster again.

A CRD that the identity may not read (403: CRDs are cluster-scoped) is reported, not fatal: the render then assumes a
release. A missing CRD means KServe is not installed. Plain Python over a ``kubernetes.client.ApiClient``.
"""

from __future__ import annotations

import json

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

CRD_NAME = "inferenceservices.serving.kserve.io"
CONFIG_MAP = "inferenceservice-config"


def _status(exc):
    return getattr(exc, "status", None)


def _read_crd(api_client):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
    # Deserialising the typed object would walk the whole schema: the raw JSON is what is read.
    return request(api_client, "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + CRD_NAME)


def kserve_release(api_client):
    """``{installed, crd_readable, kserve_version, evidence}``; kserve_version is None when the CRD cannot be read."""
    try:
        crd = _read_crd(api_client)
    except k8s_pods.ApiException as exc:
        if _status(exc) == 403:
            return {"installed": None, "crd_readable": False, "kserve_version": None,
                    "evidence": "CustomResourceDefinition %s is not readable: %s" % (CRD_NAME, k8s_pods.api_error_message(exc))}
        if _status(exc) == 404:
            return {"installed": False, "crd_readable": True, "kserve_version": None,
                    "evidence": "the cluster has no CustomResourceDefinition %s" % CRD_NAME}
        raise k8s_pods.PodAccessError("reading CustomResourceDefinition %s failed: %s" % (CRD_NAME, k8s_pods.api_error_message(exc)),
                                      field="kubeconfig") from exc
    version, evidence = isvc.kserve_version_from_crd(crd)
    return {"installed": True, "crd_readable": True, "kserve_version": ".".join(str(part) for part in version), "evidence": evidence}


def modelcar_enabled(api_client, kserve_namespace):
    """``(enabled, how)`` from the storage initializer settings; KServe's default (on since v0.15.2) when unreadable."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
    try:
        config_map = request(api_client, "GET", "/api/v1/namespaces/%s/configmaps/%s" % (kserve_namespace, CONFIG_MAP))
    except k8s_pods.ApiException as exc:
        return True, "ConfigMap %s/%s not readable (%s): KServe's default, Modelcar on" % (
            kserve_namespace, CONFIG_MAP, k8s_pods.api_error_message(exc))
    raw = (config_map.get("data") or {}).get("storageInitializer") or "{}"
    try:
        settings = json.loads(raw)
    except ValueError as exc:
        raise ValidationError("ConfigMap %s/%s key storageInitializer is not JSON: %s" % (kserve_namespace, CONFIG_MAP, exc),
                              field="kserve_namespace", hint="fix the KServe configuration, or point kserve_namespace at the "
                              "namespace KServe is installed in") from exc
    enabled = settings.get("enableModelcar", True) if isinstance(settings, dict) else True
    if isinstance(enabled, str):
        enabled = enabled.strip().lower() in ("true", "1", "yes")
    return bool(enabled), "storageInitializer.enableModelcar in ConfigMap %s/%s" % (kserve_namespace, CONFIG_MAP)


def current_inference_service(api_client, namespace, name):
    """The InferenceService as it is on the cluster, or None when there is none yet."""
    try:
        return k8s_pods.get_inference_service(api_client, namespace, name)
    except ValidationError:
        return None


def gather(api_client, namespace, name, kserve_namespace, runtime=None, model_format=None):
    """Everything above as one dict (the module's result)."""
    facts = kserve_release(api_client)
    if facts["installed"] is False:
        raise SpecDecodingError("The cluster has no InferenceService CRD (%s)" % CRD_NAME, field="kubeconfig",
                                hint="install KServe, or set spec_decoding_target: gitops to only render manifests")
    facts["modelcar_enabled"], facts["modelcar_evidence"] = modelcar_enabled(api_client, kserve_namespace)
    facts["existing"] = current_inference_service(api_client, namespace, name)
    facts["runtimes"] = runtime_readers.record_runtime_reads(runtime_readers.ClientReader(api_client), namespace, runtime, model_format)
    return facts
