# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The readers runtime.py's selection and merge run on: ``ClientReader`` (the cluster, through kubernetes.core's
``ApiClient``), ``RecordingReader`` / ``record_runtime_reads`` (the reads kept as plain data) and ``SnapshotReader``
(answers from that snapshot, no cluster), and ``runtime_info``, the serving_runtime_info module's read.

Apart from runtime.py so that the merge and selection stay offline logic on whatever reader they are given.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.releases import refuse_unknown_speculative_fields
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc.runtime import (
    CLUSTER_SERVING_RUNTIME, GROUP, RUNTIME_VERSION, SERVING_RUNTIME, flag_locations, resolve, select_runtime, users_of_runtime,
)


# --------------------------------------------------------------------------------------------------
# Reading the cluster (the module's client or cluster service, kube/service.py)
# --------------------------------------------------------------------------------------------------

class ClientReader:
    """reader.get/list over a ``kubernetes.client.ApiClient`` (kubernetes.core's authenticated client).

    A 404 (object or CRD missing) reads as None / []; a 403 on cluster-scoped runtimes is remembered in
    ``forbidden`` and reads as none, so a namespaced identity still resolves namespaced runtimes.

    One reader is one snapshot: each runtime and each list is read once per reader. A rollback resolves the merged
    command before and after its strip; both must see the same runtime (and it saves the second round trip).
    """

    PLURALS = {SERVING_RUNTIME: "servingruntimes", CLUSTER_SERVING_RUNTIME: "clusterservingruntimes"}

    def __init__(self, api_client):
        # the cluster service's CustomObjectsApi-shaped reads (an ApiClient or the service itself)
        self.api = kube_service.service_of(api_client).custom_objects()
        self.forbidden = []
        self._read = {}

    def _call(self, kind, fn, *args):
        key = (fn.__name__,) + args
        if key not in self._read:
            self._read[key] = self._fetch(kind, fn, *args)
        return self._read[key]

    def _fetch(self, kind, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # pylint: disable=broad-except
            status = getattr(exc, "status", None)
            if status == 404:
                return None
            if status == 403:
                self.forbidden.append(kind)
                return None
            if status is None:
                raise
            raise SpecDecodingError("reading %ss failed: %s" % (kind, kube_service.api_error_message(exc)),
                                    field="runtime") from exc

    def get(self, kind, namespace, name):
        if kind == SERVING_RUNTIME:
            return self._call(kind, self.api.get_namespaced_custom_object, GROUP, RUNTIME_VERSION, namespace,
                              self.PLURALS[kind], name)
        return self._call(kind, self.api.get_cluster_custom_object, GROUP, RUNTIME_VERSION, self.PLURALS[kind], name)

    def list(self, kind, namespace):
        if kind == SERVING_RUNTIME:
            got = self._call(kind, self.api.list_namespaced_custom_object, GROUP, RUNTIME_VERSION, namespace, self.PLURALS[kind])
        else:
            got = self._call(kind, self.api.list_cluster_custom_object, GROUP, RUNTIME_VERSION, self.PLURALS[kind])
        return (got or {}).get("items") or []

    def inference_services(self, namespace=None):
        if namespace:
            got = self.api.list_namespaced_custom_object(GROUP, "v1beta1", namespace, "inferenceservices")
        else:
            got = self.api.list_cluster_custom_object(GROUP, "v1beta1", "inferenceservices")
        return (got or {}).get("items") or []

    def users(self, effective):
        """Every InferenceService using the runtime of ``effective`` (ServingRuntime: its namespace; else all)."""
        kind, name = effective.kind, effective.runtime_name
        if kind == SERVING_RUNTIME:
            return users_of_runtime(kind, name, effective.isvc["metadata"]["namespace"],
                                    self.inference_services(effective.isvc["metadata"]["namespace"]))
        isvcs = self.inference_services()
        shadows = {}
        for ns in sorted({i["metadata"]["namespace"] for i in isvcs}):
            if self.get(SERVING_RUNTIME, ns, name) is not None:
                shadows.setdefault(ns, set()).add(name)
        return users_of_runtime(kind, name, None, isvcs, shadows)


class RecordingReader:
    """A reader that passes every get/list on to ``reader`` and keeps the answers: ``snapshot`` (plain data) lets a later
    step resolve the same runtime without the cluster (``SnapshotReader``), e.g. the render after kserve_facts."""

    def __init__(self, reader):
        self.reader = reader
        self.snapshot = {"get": {}, "list": {}, "forbidden": []}

    @property
    def forbidden(self):
        return getattr(self.reader, "forbidden", [])

    def get(self, kind, namespace, name):
        found = self.reader.get(kind, namespace, name)
        self.snapshot["get"][_snapshot_key(kind, namespace, name)] = found
        self.snapshot["forbidden"] = sorted(set(self.forbidden))
        return found

    def list(self, kind, namespace):
        found = self.reader.list(kind, namespace)
        self.snapshot["list"][_snapshot_key(kind, namespace)] = found
        self.snapshot["forbidden"] = sorted(set(self.forbidden))
        return found


def record_runtime_reads(reader, namespace, runtime=None, model_format="vllm"):
    """Read what resolving an InferenceService of ``namespace`` with ``runtime`` (or, without one, KServe's auto-selection
    for ``model_format``) needs, through ``reader``; returns the snapshot. A runtime that does not exist is recorded as
    missing (the check that reads the snapshot reports it)."""
    recorder = RecordingReader(reader)
    model = {"modelFormat": {"name": model_format or "vllm"}}
    if runtime:
        model["runtime"] = runtime
    stub = {"metadata": {"namespace": namespace, "name": "snapshot"}, "spec": {"predictor": {"model": model}}}
    try:
        select_runtime(stub, recorder)
    except ValidationError:
        pass
    return recorder.snapshot


class SnapshotReader:
    """reader.get/list answered from a ``RecordingReader`` snapshot; a read the snapshot does not hold is an error (it was
    taken for another runtime or namespace), never a silent 'not found'."""

    def __init__(self, snapshot):
        self.snapshot = snapshot or {}
        self.forbidden = list(self.snapshot.get("forbidden") or [])

    def _answer(self, table, key):
        held = self.snapshot.get(table) or {}
        if key not in held:
            raise ValidationError("the runtimes read from the cluster do not cover %s" % key, field="runtimes",
                                  hint="pass the runtimes that kserve_info read for this InferenceService's namespace and runtime")
        return held[key]

    def get(self, kind, namespace, name):
        return self._answer("get", _snapshot_key(kind, namespace, name))

    def list(self, kind, namespace):
        return self._answer("list", _snapshot_key(kind, namespace)) or []


def _snapshot_key(kind, namespace, name=None):
    """'ServingRuntime/<ns>/<name>', 'ClusterServingRuntime/<name>'; without a name, the list of that kind (and namespace)."""
    return "/".join(part for part in (kind, namespace, name) if part)


# Module serving_runtime_info: the runtime KServe merges into an InferenceService's predictor, and what that means for its flag.

def runtime_info(api_client, params):
    """Module serving_runtime_info: (result, warnings, problem or None) for the InferenceService read or given."""
    if params["inference_service"] is not None:
        isvc = dict(params["inference_service"])
        meta = dict(isvc.get("metadata") or {})
        meta.setdefault("namespace", params["namespace"])
        if params["name"]:
            meta.setdefault("name", params["name"])
        isvc["metadata"] = meta
    else:
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
        isvc = k8s_pods.get_inference_service(api_client, params["namespace"], params["name"])
    # verify reads "where is the flag" here: a field this collection does not know may carry it
    refuse_unknown_speculative_fields(isvc)
    reader = ClientReader(api_client)
    result, warnings, problem, effective = resolve(isvc, reader, params["runtime_flag"], params["missing_runtime"])
    result["flag_locations"], result["flag_source"] = flag_locations(isvc, effective)
    result["unreadable_scripts"] = unreadable_scripts(isvc, effective)
    if params["list_users"] and effective is not None and effective.runtime is not None:
        result["users"] = reader.users(effective)
    if params["name"] and params["inference_service"] is None:
        result["inference_service"] = isvc
    return result, warnings, problem


def unreadable_scripts(isvc, effective=None):
    """``["<container>: the bash -c script does not parse (<why>)"]`` for the predictor's containers and the runtime's
    kserve-container: a script no shell can run shows no flag, and verify says why instead of "no flag"."""
    containers = [(name, command + args) for name, command, args in isvc_readers.predictor_containers(isvc)]
    runtime = getattr(effective, "runtime", None)
    for container in (((runtime or {}).get("spec") or {}).get("containers") or []):
        if isinstance(container, dict):
            containers.append(("%s %s container %s" % (effective.kind, effective.runtime_name, container.get("name")),
                               list(container.get("command") or []) + list(container.get("args") or [])))
    return ["%s: the shell script does not parse (%s)" % (where, why)
            for where, argv in containers for why in vllm_command.script_errors(argv)]
