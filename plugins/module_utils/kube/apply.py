# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Server-side apply of one object through kubernetes.core's own code (what ``kubernetes.core.k8s`` runs with
``apply: true`` and ``server_side_apply``), callable from a module process or from the task's own process.

Why not the k8s module itself: a deploy's apply was its one module process left (a Python start, an AnsiballZ payload,
kubernetes.core's and the kubernetes library's imports: 1.5-2 s of a no-op redeploy, docs/DEVELOPING.md "make bench").
kubernetes.core's ``perform_action`` is that module's logic for one definition (find the resource by discovery, read
the live object, apply, diff, hide nothing); this runs it with the parameters the module would have, so the request,
the result keys (``result``, ``method``, ``diff``, ``changed``) and the failure keys (``msg``, ``reason``, ``status``
...) are kubernetes.core's. Check mode is a server-side dry run, as kubernetes.core does it.

The same for the roles' other reads and writes (modules object_info and object_state): ``find_objects`` is
``kubernetes.core.k8s_info``'s ``K8sService.find``, ``object_state`` is ``kubernetes.core.k8s``'s ``get_definitions`` and
``perform_action`` for the options the roles use; a module process each cost about 0.9 CPU s (the stage_pvc role ran
about ten a run).
"""

from __future__ import annotations

import copy
import json

from ansible.module_utils.common.text.converters import to_native


# The options of ``kubernetes.core.k8s`` that its ``get_definitions``, ``perform_action`` and ``K8sService`` read, at that
# module's defaults (no wait, no label filter, no hidden fields, no validation): a caller sets the ones it has.
K8S_DEFAULTS = {
    "resource_definition": None, "src": None, "api_version": "v1", "kind": None, "name": None, "namespace": None,
    "state": "present", "apply": False, "server_side_apply": None, "merge_type": None, "delete_options": None,
    "wait": False, "wait_sleep": 5, "wait_timeout": 120, "wait_condition": None, "label_selectors": None,
    "hidden_fields": None, "append_hash": False, "force": False, "continue_on_error": False, "validate": None,
    "generate_name": None, "delete_all": False,
}


def k8s_parameters(definition, field_manager, force_conflicts):
    """The parameters ``kubernetes.core.k8s`` has for ``state: present, apply: true, server_side_apply: {...}`` with
    everything else at its default. ``apply`` is what makes kubernetes.core send a server-side apply; without it it
    creates and then merge-patches as "OpenAPI-Generator" (Update operations, which never conflict and overwrite anyone's
    edit)."""
    return dict(K8S_DEFAULTS, resource_definition=definition, apply=True,
                server_side_apply={"field_manager": field_manager, "force_conflicts": bool(force_conflicts)})


class _K8sModuleView:
    """What kubernetes.core's K8sService reads of its module: the k8s module's parameters, check and diff mode, warn."""

    def __init__(self, module, params):
        self.params = params
        self.check_mode = module.check_mode
        self._diff = module._diff  # pylint: disable=protected-access
        self.warn = module.warn


def _k8s_service(module, k8s_params, k8s_client=None):
    """kubernetes.core's K8sService for ``k8s_params`` over ``k8s_client`` (kubernetes.core's K8SClient, built from the
    module's auth options when not given). kubernetes.core: check mode is a server-side dry run (its module sets this
    from AnsibleK8SModule.server_side_dry_run); a read is the same either way."""
    # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import authenticated
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.service import K8sService
    if k8s_client is None:
        k8s_client = authenticated(**module.params)
    k8s_client.dry_run = bool(module.check_mode)
    return K8sService(k8s_client, _K8sModuleView(module, k8s_params))


def server_side_apply(module, k8s_client=None):
    """Apply ``module.params["definition"]`` as ``field_manager``: kubernetes.core.k8s's result for one definition.
    A failure ends in ``module.fail_json`` with the keys kubernetes.core.k8s fails with. `k8s_client`: kubernetes.core's
    K8SClient (built from the module's auth options when not given)."""
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.runner import perform_action  # pylint: disable=import-outside-toplevel
    params = module.params
    k8s_params = k8s_parameters(copy.deepcopy(params["definition"]), params["field_manager"], params["force_conflicts"])
    service = _k8s_service(module, k8s_params, k8s_client)
    try:
        return perform_action(service, k8s_params["resource_definition"], k8s_params)
    except Exception as exc:  # pylint: disable=broad-except
        error = k8s_failure(exc)
        error.update(missing_namespace_failure(exc.__cause__, params["definition"]))
        module.fail_json(**error)
    return None  # unreachable: fail_json exits (or raises in the task's process)


def k8s_failure(exc):
    """The failure keys kubernetes.core's ``run_module`` gives an exception of ``perform_action``: its ``result``, the
    API's ``reason``, ``msg``."""
    error = dict(getattr(exc, "result", None) or {})
    reason = getattr(exc.__cause__, "reason", None)
    if reason is not None:
        error["reason"] = reason
    error["msg"] = to_native(exc)
    return error


def _api_status(api_error):
    """The API server's Status object (a dict) in an ApiException's body, or {}."""
    body = getattr(api_error, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        status = json.loads(body) if body else {}
    except ValueError:
        return {}
    return status if isinstance(status, dict) else {}


def missing_namespace_failure(api_error, definition):
    """``{msg, missing_namespace}`` when the API server answered the apply with 404 because the object's namespace does not
    exist, else {}. kubernetes.core's message is the whole JSON Status, escaped; this is one line with the fix."""
    status = _api_status(api_error)
    details = status.get("details") or {}
    if status.get("code") != 404 or status.get("reason") != "NotFound" or details.get("kind") != "namespaces":
        return {}
    namespace = details.get("name") or (definition.get("metadata") or {}).get("namespace")
    what = "%s %s" % (definition.get("kind") or "the object", (definition.get("metadata") or {}).get("name") or "")
    return {"missing_namespace": namespace,
            "msg": "Namespace %s does not exist, so %s was not applied (nothing was written). Fix: create it (kubectl create "
                   "namespace %s) or apply into an existing namespace." % (namespace, what.strip(), namespace)}


def find_objects(module, k8s_client=None):
    """What ``kubernetes.core.k8s_info`` returns for ``module.params`` (kind, api_version, name, namespace,
    label_selectors, field_selectors): kubernetes.core's ``K8sService.find``, so discovery, the request and the result (``resources``,
    ``api_found``) are that module's, in the caller's process. An unknown kind is ``api_found: false`` and no resources,
    as there; another failure ends in ``module.fail_json`` with kubernetes.core's message."""
    params = module.params
    service = _k8s_service(module, dict(K8S_DEFAULTS, **{k: params[k] for k in ("api_version", "kind", "name", "namespace")}), k8s_client)
    try:
        return service.find(params["kind"], params["api_version"], name=params["name"], namespace=params["namespace"],
                            label_selectors=params["label_selectors"], field_selectors=params["field_selectors"])
    except Exception as exc:  # pylint: disable=broad-except
        module.fail_json(**k8s_failure(exc))
    return None  # unreachable: fail_json exits (or raises in the task's process)


def object_state(module, k8s_client=None):
    """What ``kubernetes.core.k8s`` does for ``module.params`` (state, definition or api_version/kind/name/namespace,
    apply, merge_type, delete_options, wait, wait_sleep, wait_timeout; every other option of that module at its
    default): kubernetes.core's ``get_definitions`` and ``perform_action`` per definition, so the requests, the result
    (``result``, ``method``, ``diff``, ``changed``; ``result.results`` for several definitions) and the failure keys
    (``msg``, ``reason``, ``status`` ...) are that module's. Check mode is a server-side dry run, as kubernetes.core does
    it. A failure ends in ``module.fail_json``."""
    # pylint: disable-next=import-outside-toplevel
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.runner import get_definitions, perform_action
    params = module.params
    options = ("state", "apply", "merge_type", "delete_options", "wait", "wait_sleep", "wait_timeout", "api_version", "kind", "name", "namespace")
    k8s_params = dict(K8S_DEFAULTS, resource_definition=copy.deepcopy(params["definition"]), **{k: params[k] for k in options})
    service = _k8s_service(module, k8s_params, k8s_client)
    results = []
    try:
        for definition in get_definitions(service, k8s_params):
            results.append(perform_action(service, definition, k8s_params))
    except Exception as exc:  # pylint: disable=broad-except
        module.fail_json(**k8s_failure(exc))
    if len(results) == 1:
        return results[0]
    return {"changed": any(r["changed"] for r in results), "result": {"results": results}}
