# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The API calls ``draft_removal.execute`` makes, for module draft_artifacts: the InferenceService or
LLMInferenceService, the namespace's other users of a PVC subdirectory, the JSON patch, the wait for Ready, the PVC
and its annotations; and the registry client with the module's credentials for a Modelcar image.

Each reaches the API through the cluster service (kube/service.py), which loads the kubernetes client inside the call
that needs it, so the image rewrite alone does not.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import writer as kube_writer


class Cluster:
    """The API calls draft_removal.execute makes, on the cluster service (kube/service.py)."""

    def __init__(self, api_client, params):
        self.service = kube_service.service_of(api_client)
        self.api_client = self.service.api_client
        self.params = params

    def _error(self, what, exc):
        return SpecDecodingError("%s failed: %s" % (what, kube_service.api_error_message(exc)), field="name")

    def _llm(self):
        return self.params.get("kind") == "LLMInferenceService"

    def _resource(self):
        if self._llm():
            return kube_service.LLM_INFERENCE_SERVICE.at(self.params["api_version"])
        return kube_service.INFERENCE_SERVICE

    def get_isvc(self):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import (  # pylint: disable=import-outside-toplevel
            cluster as llmisvc_cluster,
        )
        if self._llm():
            return llmisvc_cluster.get(self.api_client, self.params["namespace"], self.params["name"], self.params["api_version"])
        return self.service.inference_service(self.params["namespace"], self.params["name"])

    def list_users(self):
        """The namespace's InferenceServices and LLMInferenceServices (other users of a PVC), and the kinds that could
        not be listed (a kind whose CRD is not installed has no objects)."""
        objects, unchecked = [], []
        for res in (kube_service.INFERENCE_SERVICE, kube_service.LLM_INFERENCE_SERVICE.at(self.params["api_version"])):
            try:
                items = self.service.list(res, self.params["namespace"])
            except Exception as exc:  # pylint: disable=broad-except
                if getattr(exc, "status", None) is None:
                    raise
                if getattr(exc, "status", None) == 404:
                    continue
                unchecked.append("%ss (listing them failed, so it is unknown whether one uses it: %s)" % (res.kind, kube_service.api_error_message(exc)))
                continue
            objects += [dict(item, kind=res.kind) for item in items]
        return objects, unchecked

    def patch_isvc(self, ops, dry_run=False):
        # The rollback's field manager: a later deploy takes these fields back instead of refusing a foreign edit.
        try:
            return self.service.json_patch(self._resource(), self.params["name"], ops, namespace=self.params["namespace"],
                                           dry_run=dry_run, read=self.get_isvc)
        except Exception as exc:  # pylint: disable=broad-except
            cause = exc.api_error if isinstance(exc, kube_writer.PatchConflict) else exc
            if getattr(cause, "status", None) is None:
                raise
            raise self._error("patching InferenceService %s/%s" % (self.params["namespace"], self.params["name"]), cause) from exc

    def wait_ready(self):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.rollback import crash_loop_check  # pylint: disable=import-outside-toplevel
        isvc, _elapsed = isvc_wait.wait_ready(self.api_client, self.params["namespace"], self.params["name"],
                                              timeout=self.params["wait_timeout"], interval=self.params["wait_sleep"],
                                              kind=self.params["kind"], api_version=self.params["api_version"] if self._llm() else None,
                                              **crash_loop_check(self.params))
        return isvc

    def get_pvc(self, name):
        try:
            return self.service.get(kube_service.PERSISTENT_VOLUME_CLAIM, name, self.params["namespace"], missing="none")
        except Exception as exc:  # pylint: disable=broad-except
            if getattr(exc, "status", None) is None:
                raise
            raise self._error("reading PVC %s" % name, exc) from exc

    def patch_pvc_annotations(self, name, annotations):
        try:
            self.service.merge_patch(kube_service.PERSISTENT_VOLUME_CLAIM, name, {"metadata": {"annotations": annotations}},
                                     namespace=self.params["namespace"])
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
