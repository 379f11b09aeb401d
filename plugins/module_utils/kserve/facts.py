# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a deploy needs to know about the cluster before it renders, read in one go.

- the KServe release, from the InferenceService CRD's schema (``releases.kserve_version_from_crd``): only the verdict
  leaves this module, never the 2 MB CRD (handing it to the render through Ansible facts cost seconds per deploy). A
  release newer than the collection knows (fields v0.20's CRD has not, or a newer storage-initializer image tag) is
  named in ``kserve_warning`` and reported as the newest known (``kserve/releases.py``): its rules are used;
- the cluster's OCI mode (``storageInitializer`` of ``inferenceservice-config``, read as KServe's ResolveOciModelMode:
  ``modelcar``, ``native``, ``fetch`` or ``disabled``; ``kserve/storage.py``), which the storage rules take;
- the current InferenceService (for the deployment-mode check and the diff), or None;
- the ServingRuntime / ClusterServingRuntime the InferenceService will run on (as a ``serving_runtime`` snapshot), so the
  render can merge the runtime's command and refuse a second ``--speculative-config`` without reading the cluster again.

A CRD that the identity may not read (403: CRDs are cluster-scoped) is reported, not fatal: the render then assumes a
release. A missing CRD means KServe is not installed. Plain Python over a ``kubernetes.client.ApiClient``.
"""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import releases, storage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

CRD_NAME = "inferenceservices.serving.kserve.io"
CONFIG_MAP = storage.CONFIG_MAP
# What a read fails with when the API server is away or answers an error these reads do not handle (a restart: connection
# refused, 503): kserve_info reports it as its message instead of a traceback.
API_ERRORS = (k8s_pods.ApiException, k8s_pods.TransportError, OSError)


def _status(exc):
    return getattr(exc, "status", None)


# The release verdict is kept per API server, CRD uid and resourceVersion, and the release tables that gave it: the CRD
# is a 0.7 MB answer (0.08-0.11 s of a no-op redeploy's 1.6 here, and as much API server work on every deploy), its
# metadata alone from the API server's watch cache (resourceVersion=0) 1-2 ms. A KServe upgrade, or any edit of the CRD,
# changes its resourceVersion, so a kept verdict is never one of another CRD; the watch cache may be a moment behind an
# upgrade, and then the verdict is the one a deploy started that moment earlier got. The file is the user's own, beside
# the Modelcar layer digests (files.CACHE_DIR), mode 0600.
RELEASE_CACHE = os.path.join(files.CACHE_DIR, "kserve-releases.json")
RELEASE_CACHE_ENTRIES = 64
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + CRD_NAME


def _read_crd(api_client, metadata_only=False):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
    # Deserialising the typed object would walk the whole schema: the raw JSON is what is read.
    if metadata_only:
        return request(api_client, "GET", CRD_PATH, query={"resourceVersion": "0"}, accept=PARTIAL_METADATA)
    return request(api_client, "GET", CRD_PATH)


def _tables_fingerprint():
    """The release tables' source (kserve/releases.py, from a file or a module process's zip), None when it cannot be
    read: then nothing is kept."""
    try:
        return hashlib.sha256(releases.__loader__.get_data(releases.__file__)).hexdigest()
    except (AttributeError, OSError, TypeError):
        return None


def _cache_key(api_client, meta):
    tables = _tables_fingerprint()
    uid, version = (meta.get("metadata") or {}).get("uid"), (meta.get("metadata") or {}).get("resourceVersion")
    host = getattr(getattr(api_client, "configuration", None), "host", None)
    if not (tables and uid and version and host):
        return None
    return hashlib.sha256(json.dumps([host, uid, version, tables]).encode("utf-8")).hexdigest()


def kserve_release(api_client, cache=RELEASE_CACHE):
    """``{installed, crd_readable, kserve_version, evidence, kserve_warning}``; kserve_version is None when the CRD cannot
    be read; kserve_warning names a release newer than the collection knows (None otherwise). The verdict for a CRD
    already read (its uid and resourceVersion) comes from ``cache`` (a path; None: always read the CRD)."""
    try:
        key = _cache_key(api_client, _read_crd(api_client, metadata_only=True)) if cache else None
        path = cache if key else None
        kept = files.read_private_json(path) if path else {}
        if isinstance(kept.get(key), dict):
            return dict(kept[key])
        crd = _read_crd(api_client)
    except k8s_pods.ApiException as exc:
        if _status(exc) == 403:
            return {"installed": None, "crd_readable": False, "kserve_version": None, "kserve_warning": None,
                    "evidence": "CustomResourceDefinition %s is not readable: %s" % (CRD_NAME, k8s_pods.api_error_message(exc))}
        if _status(exc) == 404:
            return {"installed": False, "crd_readable": True, "kserve_version": None, "kserve_warning": None,
                    "evidence": "the cluster has no CustomResourceDefinition %s" % CRD_NAME}
        raise k8s_pods.PodAccessError("reading CustomResourceDefinition %s failed: %s" % (CRD_NAME, k8s_pods.api_error_message(exc)),
                                      field="kubeconfig") from exc
    version, evidence = releases.kserve_version_from_crd(crd)
    newer = releases.newer_crd_fields(crd)
    verdict = {"installed": True, "crd_readable": True, "kserve_version": releases.format_release(version), "evidence": evidence,
               "kserve_warning": "the InferenceService CRD has %s: %s" % (", ".join(newer), releases.newer_warning("this KServe"))
               if newer else None}
    if path:
        kept.pop(key, None)
        kept[key] = verdict
        files.write_private_json(path, dict(list(kept.items())[-RELEASE_CACHE_ENTRIES:]))
    return dict(verdict)


def oci_model_mode(api_client, kserve_namespace):
    """``(mode, how, settings)`` from the storage initializer settings (``settings``: the parsed JSON, or None); what
    KServe installs (``modelcar``) when the ConfigMap is not readable."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
    where = "ConfigMap %s/%s key %s" % (kserve_namespace, CONFIG_MAP, storage.CONFIG_KEY)
    try:
        config_map = request(api_client, "GET", "/api/v1/namespaces/%s/configmaps/%s" % (kserve_namespace, CONFIG_MAP))
    except k8s_pods.ApiException as exc:
        return storage.DEFAULT_OCI_MODE, "ConfigMap %s/%s not readable (%s): what KServe installs, enableModelcar: true" % (
            kserve_namespace, CONFIG_MAP, k8s_pods.api_error_message(exc)), None
    raw = (config_map.get("data") or {}).get(storage.CONFIG_KEY) or "{}"
    try:
        settings = json.loads(raw)
    except ValueError as exc:
        raise ValidationError("%s is not JSON: %s" % (where, exc), field="kserve_namespace",
                              hint="fix the KServe configuration, or point kserve_namespace at the namespace KServe is installed in") from exc
    mode, how = storage.resolve_oci_mode(settings)
    return mode, "%s: %s" % (where, how), settings if isinstance(settings, dict) else None


def current_inference_service(api_client, namespace, name):
    """The InferenceService as it is on the cluster, or None when there is none yet."""
    try:
        return k8s_pods.get_inference_service(api_client, namespace, name)
    except ValidationError:
        return None


# The release a render assumes when the CRD cannot be read and the caller names none (isvc_manifest's own default).
DEFAULT_ASSUMED_RELEASE = "0.20"


def crd_unreadable_warning(assumed_release=None):
    """The warning for a CRD the identity may not read: what the render assumes instead (``assumed_release``, the
    deploy's spec_decoding_kserve_version; None: the render's default) and the two fixes."""
    assumed = "%s (as given)" % assumed_release if assumed_release else "%s (the default)" % DEFAULT_ASSUMED_RELEASE
    return ("cannot read CustomResourceDefinition %s (403 Forbidden: get on customresourcedefinitions.apiextensions.k8s.io is "
            "cluster-scoped). KServe features are not detected: the render assumes KServe %s and auto mode picks the artifact "
            "mode for that release. Fix: bind the ClusterRole spec-decoding-kserve-crd-reader (docs/rbac.md) or set "
            "spec_decoding_kserve_version to the cluster's KServe release." % (CRD_NAME, assumed))


def gather(api_client, namespace, name, kserve_namespace, runtime=None, model_format=None, resource_kind="InferenceService"):
    """Everything above as one dict (the module's result). For an LLMInferenceService only the release and the OCI mode
    are read (it has no ServingRuntime, and the current object is read by the apply)."""
    facts = kserve_release(api_client)
    if facts["installed"] is False and resource_kind == "InferenceService":
        raise SpecDecodingError("The cluster has no InferenceService CRD (%s)" % CRD_NAME, field="kubeconfig",
                                hint="install KServe, or set spec_decoding_target: gitops to only render manifests")
    mode, how, settings = oci_model_mode(api_client, kserve_namespace)
    facts.update(oci_model_mode=mode, oci_model_mode_evidence=how,
                 # kept for playbooks that read them: oci:// images are mounted at all (modelcar, native or fetch)
                 modelcar_enabled=mode != storage.OCI_DISABLED, modelcar_evidence=how)
    image_release = releases.release_from_image((settings or {}).get("image"))
    if facts["kserve_warning"] is None and image_release is not None and image_release > releases.NEWEST_KNOWN:
        facts["kserve_warning"] = releases.newer_warning("KServe %s (storageInitializer image %s)" % (
            releases.format_release(image_release), settings["image"]))
        facts["kserve_version"] = releases.format_release(releases.NEWEST_KNOWN)
    if resource_kind == "InferenceService":
        facts["existing"] = current_inference_service(api_client, namespace, name)
        facts["runtimes"] = runtime_readers.record_runtime_reads(runtime_readers.ClientReader(api_client), namespace, runtime, model_format)
    else:
        facts.update(existing=None, runtimes=None)
    return facts
