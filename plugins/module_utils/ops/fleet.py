# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet discovery (issue 53, read-only): which of many InferenceServices and LLMInferenceServices pass a speculative flag
to vLLM, and from where, read with LISTs rather than a GET per service.

What module ``fleet_speculative_info`` does, as plain Python: ``check_params`` refuses a selection that selects nothing,
``discover`` reads

* the services: one LIST per namespace and kind (named services, a namespace list, or with ``all_namespaces`` one
  cluster-wide LIST; when RBAC refuses that, the namespaces are listed and read one by one, and a namespace that refuses
  its LIST is reported in ``forbidden`` while the others go on);
* what KServe merges into them: one LIST of ServingRuntimes per namespace that has a predictor with a ``model`` and one of
  ClusterServingRuntimes (``ListedRuntimes``, the reader ``kserve/isvc/runtime_selection.py`` selects on), one LIST of
  LLMInferenceServiceConfigs per namespace with LLMInferenceServices and one in KServe's system namespace;

and asks the collection's own readers per service: ``kserve.isvc.runtime.resolve`` / ``effective_command`` (the runtime
KServe selects, the merged kserve-container, each occurrence's source and whether it reaches vLLM) and
``kserve.llmisvc.flags.flags`` (every pool and container through the presets). Every request goes through
``CountingClient``, so the result says what the run cost the API server. Nothing is written.
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime as srt
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llm_flags
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llm_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.releases import refuse_unknown_speculative_fields
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.wait import transient_error
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command

ISVC = "InferenceService"
LLMISVC = llm_model.KIND
KINDS = (ISVC, LLMISVC)
ISVC_VERSION = "v1beta1"
# where each kind lives on the API server: (group/version, plural)
_RESOURCES = {
    ISVC: ("%s/%s" % (srt.GROUP, ISVC_VERSION), "inferenceservices"),
    LLMISVC: ("%s/%s" % (llm_model.GROUP, llm_model.DEFAULT_API_VERSION), llm_model.PLURAL),
    srt.SERVING_RUNTIME: ("%s/%s" % (srt.GROUP, srt.RUNTIME_VERSION), "servingruntimes"),
    srt.CLUSTER_SERVING_RUNTIME: ("%s/%s" % (srt.GROUP, srt.RUNTIME_VERSION), "clusterservingruntimes"),
    llm_model.CONFIG_KIND: ("%s/%s" % (llm_model.GROUP, llm_model.DEFAULT_API_VERSION), llm_model.CONFIG_PLURAL),
}


class ListFailed(SpecDecodingError):
    """A LIST the API server refused (``status``: 403, 404, ...) or could not answer."""

    def __init__(self, message, status, field=None, hint=None):
        super().__init__(message, field=field, hint=hint)
        self.status = status


class CountingClient:
    """Every request of a discovery, counted by verb and resource (``requests``), over kubernetes.core's ApiClient.

    ``request`` is ``kube.client.request`` (a unit test of an error path passes its own)."""

    def __init__(self, api_client, request=None):
        self.api_client = api_client
        self._request = request
        self.requests = {}

    @property
    def total(self):
        return sum(self.requests.values())

    def list(self, kind, namespace=None, query=None):
        """The items of one LIST of ``kind`` (a key of _RESOURCES, or Namespace) in ``namespace`` (None: cluster-wide);
        ListFailed with the API server's status and message when it refuses."""
        if kind == "Namespace":
            path, resource = "/api/v1/namespaces", "namespaces"
        else:
            group_version, resource = _RESOURCES[kind]
            path = "/apis/%s/%s%s" % (group_version, "namespaces/%s/" % namespace if namespace else "", resource)
        key = "LIST %s" % resource
        self.requests[key] = self.requests.get(key, 0) + 1
        request = self._request
        if request is None:
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
        try:
            answer = request(self.api_client, "GET", path, query=query)
        except Exception as exc:  # pylint: disable=broad-except
            status = getattr(exc, "status", None)
            if status is None:
                raise
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
            raise ListFailed("list %s%s: %s" % (resource, " in %s" % namespace if namespace else " (all namespaces)",
                                                k8s_pods.api_error_message(exc)), status) from exc
        return (answer or {}).get("items") or []


class ListedRuntimes:
    """The runtime reader of ``kserve/isvc/runtime_selection.py`` (``get``/``list``) answered from one LIST of
    ServingRuntimes per namespace and one of ClusterServingRuntimes, each made on first use: a GET per service would cost
    a request per service, these cost one per namespace. A 403 reads as no runtime of that kind, remembered per namespace
    (``view(namespace).forbidden``), as ``runtime_readers.ClientReader`` does for one service."""

    def __init__(self, client):
        self.client = client
        self._lists = {}
        self._forbidden = set()

    def list(self, kind, namespace):
        key = (kind, namespace if kind == srt.SERVING_RUNTIME else None)
        if key not in self._lists:
            try:
                self._lists[key] = self.client.list(kind, key[1])
            except ListFailed as exc:
                if exc.status not in (403, 404):
                    raise SpecDecodingError(str(exc), field="runtime") from exc
                if exc.status == 403:
                    self._forbidden.add(key)
                self._lists[key] = []
        return self._lists[key]

    def get(self, kind, namespace, name):
        for item in self.list(kind, namespace):
            if (item.get("metadata") or {}).get("name") == name:
                return item
        return None

    def view(self, namespace):
        """A reader for the services of one namespace: its ``forbidden`` names only what that namespace could not read."""
        return _RuntimeView(self, namespace)


class _RuntimeView:
    def __init__(self, runtimes, namespace):
        self.runtimes = runtimes
        self.namespace = namespace

    def list(self, kind, namespace):
        return self.runtimes.list(kind, namespace)

    def get(self, kind, namespace, name):
        return self.runtimes.get(kind, namespace, name)

    @property
    def forbidden(self):
        return [kind for kind, ns in sorted(self.runtimes._forbidden) if ns in (None, self.namespace)]  # pylint: disable=protected-access


class ListedPresets:
    """The LLMInferenceServiceConfigs an LLMInferenceService merges, from one LIST per namespace (its own and KServe's
    system namespace), looked up as ``kserve/llmisvc/cluster.read_presets`` does with a GET each: the names spec.baseRefs
    gives, then the well-known ones for the object's shape (``flags.well_known_presets``), the object's namespace first."""

    def __init__(self, client, system_namespace, config_prefix=llm_flags.WELL_KNOWN_PREFIX):
        self.client = client
        self.system_namespace = system_namespace
        self.config_prefix = config_prefix
        self._lists = {}

    def _items(self, namespace):
        if namespace not in self._lists:
            try:
                self._lists[namespace] = ({(i.get("metadata") or {}).get("name"): i for i in self.client.list(llm_model.CONFIG_KIND, namespace)},
                                          None)
            except ListFailed as exc:
                if exc.status not in (403, 404):
                    raise SpecDecodingError(str(exc), field="llmisvc_system_namespace") from exc
                self._lists[namespace] = ({}, exc.status)
        return self._lists[namespace]

    def presets(self, obj, unreadable):
        """``{name: object}`` as read_presets returns; a well-known preset that could not be listed goes to
        ``unreadable``, a baseRefs one the caller may not list is an error (the resource names it)."""
        namespace = obj["metadata"]["namespace"]
        out = {}

        def find(name, named_by_resource):
            for ns in (namespace, self.system_namespace):
                items, status = self._items(ns)
                if name in items:
                    out[name] = items[name]
                    return
                if status == 403:
                    if named_by_resource:
                        raise ValidationError("may not list the %ss of %s, where spec.baseRefs' %s may be" % (llm_model.CONFIG_KIND, ns, name),
                                              field="spec.baseRefs", hint="grant list on llminferenceserviceconfigs in %s" % ns)
                    unreadable.append("%s/%s" % (ns, name))

        refs = [(ref or {}).get("name") for ref in ((obj.get("spec") or {}).get("baseRefs") or [])]
        for name in refs:
            if name and name not in out:
                find(name, True)
        base_specs = [(out[n].get("spec") or {}) for n in refs if n in out]
        for name in llm_flags.well_known_presets(obj, base_specs, self.config_prefix):
            if name not in out:
                find(name, False)
        return out


# --------------------------------------------------------------------------------------------------
# One service's record
# --------------------------------------------------------------------------------------------------

def _record(kind, obj):
    meta = obj.get("metadata") or {}
    return {"kind": kind, "namespace": meta.get("namespace"), "name": meta.get("name"), "found": True,
            "speculative": False, "sources": [], "where": [], "runtime": None, "speculative_config": None,
            "error": None, "warnings": [], "undecided": None}


def _occurrence_keys(occurrences):
    return {(o.index, o.flag, o.raw, getattr(o.flag_token, "start", None)) for o in occurrences}


def _env_occurrences(container, field, reaches, source):
    """Flags that come into the vLLM invocation through the container's env (a ``$VAR`` or ``$(VAR)`` whose value from
    the pod spec carries the flag): found with the env, absent without it."""
    items = container.get(field) or []
    env = container.get("env") or []
    if not items or not env:
        return []
    plain = _occurrence_keys(vllm_command.find_occurrences(items))
    return [{"source": source, "field": "env", "flag": o.flag, "form": o.form, "reaches_engine": reaches}
            for o in vllm_command.find_occurrences(items, env=env)
            if (o.index, o.flag, o.raw, getattr(o.flag_token, "start", None)) not in plain]


def isvc_record(isvc, reader):
    """Whether a speculative flag reaches the vLLM of one InferenceService and from where: ``speculative``, ``sources``
    (inference_service, serving_runtime, cluster_serving_runtime, in command-line order), ``where`` (each occurrence:
    source, field command/args/env, flag, form, reaches_engine), ``runtime``, ``speculative_config``."""
    rec = _record(ISVC, isvc)
    status = isvc_readers.readiness(isvc)
    rec.update(ready=status["ready"], up_to_date=status["up_to_date"], generation=status["generation"],
               observed_generation=status["observed_generation"],
               # an earlier rollback stripped it (isvc_speculative's backup annotation): the fleet rollback proves it again
               # while it is not Ready at its generation
               stripped_by_rollback=isvc_patch_plan.BACKUP_ANNOTATION in ((isvc.get("metadata") or {}).get("annotations") or {}))
    try:
        refuse_unknown_speculative_fields(isvc)
        result, warnings, _problem, effective = srt.resolve(isvc, reader, missing_runtime="warn")
    except SpecDecodingError as exc:
        rec["error"] = str(exc)
        return rec
    rec["warnings"] = warnings
    if effective is None:  # the runtime could not be found or read: the predictor's own containers only, as verify reports
        # a flag in the runtime would be missed: whether the flag reaches vLLM is not decided
        rec["undecided"] = "; ".join(warnings) or "the runtime could not be merged in"
        locations, _source = srt.flag_locations(isvc, None)
        rec["where"] = [{"source": srt.SOURCE_ISVC, "field": "command/args", "container": name, "reaches_engine": None}
                        for name in locations]
        rec.update(speculative=bool(locations), sources=[srt.SOURCE_ISVC] if locations else [])
        return rec
    rec["runtime"] = result["runtime"]
    for occ, source, field, reaches in effective.occurrences():
        rec["where"].append({"source": source, "field": field, "flag": occ.flag, "form": occ.form, "reaches_engine": reaches})
    rec["where"] += _env_occurrences(effective.container, "command", True, effective.command_from)
    rec["where"] += _env_occurrences(effective.container, "args", effective.args_reach, srt.SOURCE_ISVC)
    for item in rec["where"]:
        if item["reaches_engine"] and item["source"] not in rec["sources"]:
            rec["sources"].append(item["source"])
    rec["speculative"] = bool(rec["sources"])
    rec["speculative_config"] = result["speculative_config"]
    if result["speculative_config_error"]:
        rec["warnings"].append(result["speculative_config_error"])
    return rec


def llmisvc_record(obj, presets):
    """The same for one LLMInferenceService: ``where`` per pool and container (source ``resource`` or the preset,
    field ``command/args`` or ``env``), through the presets KServe merges (``kserve/llmisvc/flags.flags``)."""
    rec = _record(LLMISVC, obj)
    unreadable = []
    try:
        found = llm_flags.flags(obj, presets.presets(obj, unreadable), config_prefix=presets.config_prefix)
    except SpecDecodingError as exc:
        rec["error"] = str(exc)
        return rec
    if unreadable:
        rec["warnings"].append("well-known presets not readable (403), their flags not checked: %s" % ", ".join(unreadable))
        rec["undecided"] = rec["warnings"][-1]
    for entry in found:
        if entry.get("opaque"):
            rec["warnings"].append("%s %s %s: %s" % (entry["pool"], entry["container"], entry["field"], entry["opaque"]))
            rec["undecided"] = rec["undecided"] or rec["warnings"][-1]
            continue
        source = entry["source"]
        rec["where"].append({"source": source, "field": "env" if entry["field"].startswith("env") else "command/args",
                             "pool": entry["pool"], "container": entry["container"], "forms": entry["forms"],
                             "reaches_engine": True})
        if source not in rec["sources"]:
            rec["sources"].append(source)
        if rec["speculative_config"] is None and entry.get("config") is not None:
            rec["speculative_config"] = entry["config"]
    rec["speculative"] = bool(rec["sources"])
    return rec


# --------------------------------------------------------------------------------------------------
# The selection and the run
# --------------------------------------------------------------------------------------------------

def _split_name(item):
    if isinstance(item, dict):
        namespace, name = item.get("namespace"), item.get("name")
    else:
        namespace, _sep, name = str(item).rpartition("/")
    if not namespace or not name:
        raise ValidationError("%r does not name a namespace and a service" % (item,), field="names",
                              hint="write each as namespace/name (or a mapping with namespace and name)")
    return namespace, name


def check_params(params):
    """The selection as ``(named {namespace: {name...}}, namespaces, kinds)``; refuses one that selects nothing."""
    named = {}
    for item in params.get("names") or []:
        namespace, name = _split_name(item)
        named.setdefault(namespace, set()).add(name)
    namespaces = list(dict.fromkeys(params.get("namespaces") or []))
    if not named and not namespaces and not params.get("all_namespaces"):
        raise ValidationError("selects no service", field="names/namespaces/all_namespaces",
                              hint="name services (namespace/name), list namespaces, or set all_namespaces: true")
    if params.get("all_namespaces") and namespaces:
        raise ValidationError("all_namespaces reads every namespace; a namespace list as well contradicts it", field="namespaces",
                              hint="drop namespaces, or set all_namespaces: false")
    kinds = list(params.get("kinds") or KINDS)
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown:
        raise ValidationError("%s: not a kind this reads" % ", ".join(map(str, unknown)), field="kinds",
                              hint="use %s" % " and/or ".join(KINDS))
    return named, namespaces, kinds


class _Listing:
    """The services of one kind the selection names, and the namespaces that refused."""

    def __init__(self, client, kind, label_selector):
        self.client = client
        self.kind = kind
        self.label_selector = label_selector
        self.items = {}
        self.forbidden = []
        self.served = True

    def add(self, items, only=None):
        for item in items:
            meta = item.get("metadata") or {}
            if only is None or meta.get("name") in only:
                self.items[(meta.get("namespace"), meta.get("name"))] = item

    def namespace(self, namespace, query, only=None):
        if not self.served:
            return
        try:
            self.add(self.client.list(self.kind, namespace, query), only)
        except ListFailed as exc:
            if exc.status == 404:  # the kind's CRD is not served here
                self.served = False
            else:
                self.forbidden.append({"kind": self.kind, "namespace": namespace, "status": exc.status, "message": str(exc)})


def _all_namespaces(client, listing, query, namespace_names):
    try:
        listing.add(client.list(listing.kind, None, query))
        return
    except ListFailed as exc:
        if exc.status == 404:
            listing.served = False
            return
        if exc.status != 403:
            raise SpecDecodingError(str(exc), field="all_namespaces") from exc
    # no cluster-wide list: one LIST per namespace, those that refuse reported
    if not namespace_names:
        try:
            namespace_names.extend((n.get("metadata") or {}).get("name") for n in client.list("Namespace"))
        except ListFailed as exc:
            raise SpecDecodingError("%ss cannot be listed cluster-wide, nor can the namespaces: %s" % (listing.kind, exc),
                                    field="all_namespaces",
                                    hint="grant list on %s cluster-wide, or on namespaces, or pass namespaces instead of all_namespaces"
                                    % _RESOURCES[listing.kind][1]) from exc
    for namespace in namespace_names:
        listing.namespace(namespace, query)


def discover(client, params):
    """Module fleet_speculative_info: ``{services: [record], totals, forbidden}`` for the selection in ``params``
    (names, namespaces, all_namespaces, label_selector, kinds, llmisvc_system_namespace, llmisvc_config_prefix) over ``client`` (CountingClient)."""
    named, namespaces, kinds = check_params(params)
    selector = params.get("label_selector") or None
    listings = []
    namespace_names = []
    for kind in kinds:
        listing = _Listing(client, kind, selector)
        listings.append(listing)
        if params.get("all_namespaces"):
            _all_namespaces(client, listing, {"labelSelector": selector}, namespace_names)
        for namespace in namespaces:
            listing.namespace(namespace, {"labelSelector": selector})
        for namespace, names in sorted(named.items()):
            selected = params.get("all_namespaces") or namespace in namespaces
            if selected and not selector:
                continue  # the selection's LIST of that namespace already holds them
            # the named ones regardless of the label selector; one name: the API server filters (metadata.name)
            query = {"fieldSelector": "metadata.name=%s" % next(iter(names))} if len(names) == 1 else None
            listing.namespace(namespace, query, only=names)
    runtimes = ListedRuntimes(client)
    presets = ListedPresets(client, params.get("llmisvc_system_namespace") or "kserve",
                            params.get("llmisvc_config_prefix") or llm_flags.WELL_KNOWN_PREFIX)
    records = []
    for listing in listings:
        for (namespace, _name), obj in sorted(listing.items.items()):
            if listing.kind == ISVC:
                records.append(isvc_record(obj, runtimes.view(namespace)))
            else:
                records.append(llmisvc_record(obj, presets))
    found = {(r["namespace"], r["name"]) for r in records}
    refused = {f["namespace"] for listing in listings for f in listing.forbidden}
    for namespace, names in sorted(named.items()):
        for name in sorted(names - {n for ns, n in found if ns == namespace}):
            records.append({"kind": None, "namespace": namespace, "name": name, "found": False, "speculative": None,
                            "sources": [], "where": [], "runtime": None, "speculative_config": None, "warnings": [],
                            "undecided": None, "error": "not readable: the namespace refused the LIST" if namespace in refused else
                            "not found (as %s)" % " or ".join(kinds)})
    forbidden = [f for listing in listings for f in listing.forbidden]
    return {"services": records, "forbidden": forbidden, "totals": totals(records, client, forbidden, listings)}


def run(api_client, params, request=None):
    """``discover`` over kubernetes.core's ApiClient (``api_client``, or a callable that builds it: kubernetes.core's
    ``get_api_client`` asks the server for /version), with ``api_server`` (the URL the client talks to) in the result.
    An API server that does not answer (refused, reset, timed out: ``kube.wait.transient_error``) fails the whole
    discovery with one message that names it, as a fleet rollback reports a cluster that is down."""
    server = params.get("host")
    try:
        if callable(api_client):
            api_client = api_client()
        server = getattr(getattr(api_client, "configuration", None), "host", None) or server
        result = discover(CountingClient(api_client, request=request), params)
    except SpecDecodingError:
        raise
    except Exception as exc:  # pylint: disable=broad-except
        reason = transient_error(exc)
        if reason is None:
            raise
        if not server:  # the client was not built: urllib3 names the host and port it could not reach
            found = re.search(r"host='([^']+)', port=(\d+)", str(exc))
            server = "%s:%s" % found.groups() if found else "(unknown)"
        raise SpecDecodingError("the API server %s did not answer: %s" % (server, reason), field="kubeconfig",
                                hint="check that the cluster is up and that kubeconfig/context (spec_decoding_kubeconfig, "
                                     "spec_decoding_context) point at it, then run again") from exc
    result["api_server"] = server
    return result


def totals(records, client, forbidden, listings=()):
    """The run's figures: services read, with and without the flag, errors, API requests (by verb and resource)."""
    read = [r for r in records if r["found"]]
    out = {
        "services": len(read),
        "with_flag": sum(1 for r in read if r["speculative"]),
        "without_flag": sum(1 for r in read if not r["speculative"] and not r["error"]),
        "errors": sum(1 for r in read if r["error"]),
        "not_found": sum(1 for r in records if not r["found"]),
        "forbidden_namespaces": sorted({f["namespace"] for f in forbidden if f["namespace"]}),
        "kinds_not_served": [listing.kind for listing in listings if not listing.served],
        "api_requests": client.total,
        "api_requests_by": dict(sorted(client.requests.items())),
    }
    out["api_requests_per_service"] = round(client.total / len(read), 3) if read else None
    return out
