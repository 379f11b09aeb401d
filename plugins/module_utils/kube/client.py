# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubernetes client package, imported here and nowhere else in the collection (tests/unit/test_layers.py checks it).

Modules and module_utils take what they need from here (``from ...module_utils.kube.client import CoreV1Api``), inside
the function that calls the API where the import should stay lazy: the package costs about a second and 40+ MiB, which
offline work (rendering, image rewrites) does not pay. The authenticated ``ApiClient`` itself always comes from
kubernetes.core (``get_api_client(module).client.client``).

Without the package the names are None (``ApiException`` a stand-in, so ``except`` clauses work) and HAS_KUBERNETES is
False; the calling module reports it with ``missing_required_lib``.
"""

from __future__ import annotations

import json

try:
    from kubernetes import client, watch
    from kubernetes.client.exceptions import ApiException  # the same class as kubernetes.client.rest.ApiException
    HAS_KUBERNETES = True
except ImportError:  # pragma: no cover - the calling module reports it with missing_required_lib
    client = watch = None

    class ApiException(Exception):
        """Stand-in so except clauses work without the library."""

    HAS_KUBERNETES = False

# The typed API classes are imported on first use (PEP 562): with kubernetes 37 their modules build pydantic models of
# every type they mention, so importing CoreV1Api alone costs 0.65 CPU s and AppsV1Api 0.4 s, in every module process
# that imported them, whether it called the API or not (a no-op deploy's kserve_info and isvc_wait did not).
_LAZY_APIS = ("ApiextensionsV1Api", "AppsV1Api", "CoreV1Api", "CustomObjectsApi")


def __getattr__(name):
    if name in _LAZY_APIS:
        if client is None:
            return None
        return getattr(client, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def authenticated(module=None, **options):
    """kubernetes.core's authenticated K8SClient (``get_api_client``: kubeconfig, context, host, api_key, certificates,
    proxy, impersonation and the K8S_AUTH_* environment, as its modules read them) from a module or from connection
    options: the one place the collection asks for a client (``.client.client`` is the kubernetes ApiClient)."""
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client  # pylint: disable=import-outside-toplevel
    return get_api_client(module=module, **options)


def authenticated_api_client(module=None, **options):
    """The kubernetes ``ApiClient`` of ``authenticated``: what the cluster service (kube/service.py) is built on."""
    return authenticated(module, **options).client.client


def request(api_client, method, path, query=None, body=None, content_type="application/json", stream=False, timeout=None,
            accept=None):
    """One API request by path with kubernetes.core's authenticated ``ApiClient``: the answer's JSON as plain dicts (the
    API's camelCase keys), or with ``stream=True`` the open urllib3 response (the caller reads it and releases it).

    Why not the typed API classes: with kubernetes 37 importing CoreV1Api costs 0.45-1 CPU s and every answer is turned
    into pydantic models and back, in each module process; the collection reads dicts anyway. This is what
    ``kubernetes.dynamic``'s ``DynamicClient.request`` does, without the discovery. A non-2xx answer raises the client's
    own ``ApiException`` (with status, reason and body), as the typed classes do. Works with the generated client
    before and after its 2024 rewrite (kubernetes 24 to 37)."""
    query_params = [(key, value) for key, value in (query or {}).items() if value is not None]
    # ``accept``: another JSON form of the answer, e.g. an object's metadata alone (kserve/facts.PARTIAL_METADATA)
    headers = {"Accept": accept or ("application/json" if not stream else "*/*")}
    if body is not None:
        headers["Content-Type"] = content_type
    if hasattr(api_client, "param_serialize"):  # kubernetes >= 31: serialise, call, deserialise are separate steps
        prepared = api_client.param_serialize(method.upper(), path, query_params=query_params, header_params=headers,
                                              body=body, auth_settings=["BearerToken"])
        if timeout is not None and method.upper() == "GET":
            answer = _get_once(api_client, prepared, timeout)
        else:
            answer = api_client.call_api(*prepared, _request_timeout=timeout)
        if not 200 <= answer.status <= 299:
            answer.read()
            api_client.response_deserialize(answer, {})  # raises ApiException (or its subclass for the status)
        raw = answer.response
    else:  # the older generated client raises on a non-2xx answer itself
        raw = api_client.call_api(path, method.upper(), query_params=query_params, header_params=headers, body=body,
                                  auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
                                  _request_timeout=timeout)
    if stream:
        return raw
    try:
        data = raw.data
    finally:
        raw.release_conn()
    return json.loads(data) if data else None


def _get_once(api_client, prepared, timeout):
    """A GET with a ``timeout`` (a pod's /metrics or log through the proxy): one attempt, so the timeout is the whole
    request's. The client's connection pool retries a timed-out read three more times (urllib3's default ``Retry``), which
    made the watchdog's 30 s per /metrics read about 2 minutes on a pod that stopped answering, and each read of the
    watchdog's, the canary's and verify's 4 times their timeout. What ``RESTClientObject.request`` does for a GET
    (kubernetes 31+), with ``retries=False``."""
    import urllib3  # pylint: disable=import-outside-toplevel
    from kubernetes.client import rest  # pylint: disable=import-outside-toplevel
    method, url, headers = prepared[0], prepared[1], prepared[2]
    raw = api_client.rest_client.pool_manager.request(method, url, fields={}, headers=headers, preload_content=False,
                                                      timeout=urllib3.Timeout(total=timeout), retries=False)
    return rest.RESTResponse(raw)


# The typed API classes (_LAZY_APIS) are reached through __getattr__ and so are not listed here.
__all__ = ["ApiException", "HAS_KUBERNETES", "client", "request", "watch"]
