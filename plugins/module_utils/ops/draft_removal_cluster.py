# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The API calls ``draft_removal.execute`` makes, for module draft_artifacts: the InferenceService or
LLMInferenceService, the namespace's other users of a PVC subdirectory, the JSON patch, the wait for Ready, the PVC
and its annotations; and the registry client with the module's credentials for a Modelcar image.

Each is a function over the cluster service (kube/service.py), which loads the kubernetes client inside the call that
needs it, so the image rewrite alone does not; ``calls`` binds them to the module's parameters for ``execute``.
"""

from __future__ import annotations

import functools
import types

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import writer as kube_writer


def calls(cluster, params):
    """The API calls ``draft_removal.execute`` makes, as functions over the cluster service bound to the module's
    ``params`` (``cluster``: the ClusterService, or a bare ApiClient): get_isvc(), list_users(), patch_isvc(ops, dry_run),
    wait_ready(), get_pvc(name), patch_pvc_annotations(name, annotations), and the service's api_client (the GitOps
    owner's read). No cluster class of its own: the service is the one way to the cluster."""
    service = kube_service.service_of(cluster)
    return types.SimpleNamespace(
        api_client=service.api_client,
        get_isvc=functools.partial(get_isvc, service, params),
        list_users=functools.partial(list_users, service, params),
        patch_isvc=functools.partial(patch_isvc, service, params),
        wait_ready=functools.partial(wait_ready, service, params),
        get_pvc=functools.partial(get_pvc, service, params),
        patch_pvc_annotations=functools.partial(patch_pvc_annotations, service, params),
    )


def _error(what, exc):
    return SpecDecodingError("%s failed: %s" % (what, kube_service.api_error_message(exc)), field="name")


def _llm(params):
    return params.get("kind") == "LLMInferenceService"


def _resource(params):
    if _llm(params):
        return kube_service.LLM_INFERENCE_SERVICE.at(params["api_version"])
    return kube_service.INFERENCE_SERVICE


def get_isvc(service, params):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import (  # pylint: disable=import-outside-toplevel
        cluster as llmisvc_cluster,
    )
    if _llm(params):
        return llmisvc_cluster.get(service.api_client, params["namespace"], params["name"], params["api_version"])
    return service.inference_service(params["namespace"], params["name"])


def list_users(service, params):
    """The namespace's InferenceServices and LLMInferenceServices (other users of a PVC), and the kinds that could
    not be listed (a kind whose CRD is not installed has no objects)."""
    objects, unchecked = [], []
    for res in (kube_service.INFERENCE_SERVICE, kube_service.LLM_INFERENCE_SERVICE.at(params["api_version"])):
        try:
            items = service.list(res, params["namespace"])
        except Exception as exc:  # pylint: disable=broad-except
            if getattr(exc, "status", None) is None:
                raise
            if getattr(exc, "status", None) == 404:
                continue
            unchecked.append("%ss (listing them failed, so it is unknown whether one uses it: %s)" % (res.kind, kube_service.api_error_message(exc)))
            continue
        objects += [dict(item, kind=res.kind) for item in items]
    return objects, unchecked


def patch_isvc(service, params, ops, dry_run=False):
    # The rollback's field manager: a later deploy takes these fields back instead of refusing a foreign edit.
    try:
        return service.json_patch(_resource(params), params["name"], ops, namespace=params["namespace"], dry_run=dry_run,
                                  read=functools.partial(get_isvc, service, params))
    except Exception as exc:  # pylint: disable=broad-except
        cause = exc.api_error if isinstance(exc, kube_writer.PatchConflict) else exc
        if getattr(cause, "status", None) is None:
            raise
        raise _error("patching InferenceService %s/%s" % (params["namespace"], params["name"]), cause) from exc


def wait_ready(service, params):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.rollback import crash_loop_check  # pylint: disable=import-outside-toplevel
    isvc, _elapsed = isvc_wait.wait_ready(service.api_client, params["namespace"], params["name"],
                                          timeout=params["wait_timeout"], interval=params["wait_sleep"],
                                          kind=params["kind"], api_version=params["api_version"] if _llm(params) else None,
                                          **crash_loop_check(params))
    return isvc


def get_pvc(service, params, name):
    try:
        return service.get(kube_service.PERSISTENT_VOLUME_CLAIM, name, params["namespace"], missing="none")
    except Exception as exc:  # pylint: disable=broad-except
        if getattr(exc, "status", None) is None:
            raise
        raise _error("reading PVC %s" % name, exc) from exc


def patch_pvc_annotations(service, params, name, annotations):
    try:
        service.merge_patch(kube_service.PERSISTENT_VOLUME_CLAIM, name, {"metadata": {"annotations": annotations}},
                            namespace=params["namespace"])
    except Exception as exc:  # pylint: disable=broad-except
        if getattr(exc, "status", None) is None:
            raise
        raise _error("recording the removal on PVC %s" % name, exc) from exc


def registry_opener(params, hide=None):
    """open_registry(ref) for execute: a registry client with draft_artifacts' credentials (username/password or
    auth_file), TLS and timeout options; `hide` as for oci_registry.open_client."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as oci_registry  # pylint: disable=import-outside-toplevel

    def open_registry(ref):
        return oci_registry.open_client(ref, params["username"], params["password"], params["auth_file"], hide=hide,
                                        tls_verify=params["tls_verify"], ca_file=params["ca_file"], timeout=params["registry_timeout"])
    return open_registry
