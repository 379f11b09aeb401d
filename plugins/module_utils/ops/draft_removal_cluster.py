# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The API calls ``draft_removal.execute`` makes, for module draft_artifacts: the InferenceService or
LLMInferenceService, the namespace's other users of a PVC subdirectory, the JSON patch, the wait for Ready, the PVC
and its annotations; and the registry client with the module's credentials for a Modelcar image.

Each reaches the API through module_utils.kube inside the call that needs it, so the image rewrite alone does not
load the kubernetes client.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.ssa_conflicts import ROLLBACK_FIELD_MANAGER


class Cluster:
    """The API calls draft_removal.execute makes, over kubernetes.core's authenticated ApiClient."""

    def __init__(self, api_client, params):
        self.api_client = api_client
        self.params = params

    def _error(self, what, exc):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
        return SpecDecodingError("%s failed: %s" % (what, k8s_pods.api_error_message(exc)), field="name")

    def _llm(self):
        return self.params.get("kind") == "LLMInferenceService"

    def get_isvc(self):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import (  # pylint: disable=import-outside-toplevel
            cluster as llmisvc_cluster,
        )
        if self._llm():
            return llmisvc_cluster.get(self.api_client, self.params["namespace"], self.params["name"], self.params["api_version"])
        return k8s_pods.get_inference_service(self.api_client, self.params["namespace"], self.params["name"])

    def list_users(self):
        """The namespace's InferenceServices and LLMInferenceServices (other users of a PVC), and the kinds that could
        not be listed (a kind whose CRD is not installed has no objects)."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import CustomObjectsApi  # pylint: disable=import-outside-toplevel
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
        objects, unchecked = [], []
        for kind, version, plural in (("InferenceService", "v1beta1", "inferenceservices"),
                                      ("LLMInferenceService", self.params["api_version"], "llminferenceservices")):
            try:
                items = CustomObjectsApi(self.api_client).list_namespaced_custom_object(
                    "serving.kserve.io", version, self.params["namespace"], plural).get("items") or []
            except Exception as exc:  # pylint: disable=broad-except
                if getattr(exc, "status", None) is None:
                    raise
                if exc.status == 404:
                    continue
                unchecked.append("%ss (listing them failed, so it is unknown whether one uses it: %s)" % (kind, k8s_pods.api_error_message(exc)))
                continue
            objects += [dict(item, kind=kind) for item in items]
        return objects, unchecked

    def patch_isvc(self, ops, dry_run=False):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import CustomObjectsApi  # pylint: disable=import-outside-toplevel
        api = CustomObjectsApi(self.api_client)
        # The rollback's field manager: a later deploy takes these fields back instead of refusing a foreign edit.
        kwargs = {"field_manager": ROLLBACK_FIELD_MANAGER}
        if dry_run:
            kwargs["dry_run"] = "All"
        version, plural = (self.params["api_version"], "llminferenceservices") if self._llm() else ("v1beta1", "inferenceservices")
        try:
            return api.patch_namespaced_custom_object("serving.kserve.io", version, self.params["namespace"], plural,
                                                      self.params["name"], ops, _content_type="application/json-patch+json", **kwargs)
        except Exception as exc:  # pylint: disable=broad-except
            if getattr(exc, "status", None) is None:
                raise
            raise self._error("patching InferenceService %s/%s" % (self.params["namespace"], self.params["name"]), exc) from exc

    def wait_ready(self):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.rollback import crash_loop_check  # pylint: disable=import-outside-toplevel
        isvc, _elapsed = isvc_wait.wait_ready(self.api_client, self.params["namespace"], self.params["name"],
                                              timeout=self.params["wait_timeout"], interval=self.params["wait_sleep"],
                                              kind=self.params["kind"], api_version=self.params["api_version"] if self._llm() else None,
                                              **crash_loop_check(self.params))
        return isvc

    def get_pvc(self, name):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
        try:
            return request(self.api_client, "GET", "/api/v1/namespaces/%s/persistentvolumeclaims/%s" % (self.params["namespace"], name))
        except Exception as exc:  # pylint: disable=broad-except
            if getattr(exc, "status", None) == 404:
                return None
            if getattr(exc, "status", None) is None:
                raise
            raise self._error("reading PVC %s" % name, exc) from exc

    def patch_pvc_annotations(self, name, annotations):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
        try:
            request(self.api_client, "PATCH", "/api/v1/namespaces/%s/persistentvolumeclaims/%s" % (self.params["namespace"], name),
                    body={"metadata": {"annotations": annotations}}, content_type="application/merge-patch+json")
        except Exception as exc:  # pylint: disable=broad-except
            if getattr(exc, "status", None) is None:
                raise
            raise self._error("recording the removal on PVC %s" % name, exc) from exc


def registry_opener(params, hide=None):
    """open_registry(ref) for execute: a registry client with draft_artifacts' credentials (username/password or
    auth_file), TLS and timeout options; `hide` as for oci_registry.open_client."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as oci_registry  # pylint: disable=import-outside-toplevel

    def open_registry(ref):
        return oci_registry.open_client(ref, params["username"], params["password"], params["auth_file"], hide=hide,
                                        tls_verify=params["tls_verify"], ca_file=params["ca_file"], timeout=params["registry_timeout"])
    return open_registry
