# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""KServe's LLMInferenceService (serving.kserve.io v1alpha1 / v1alpha2) with vLLM speculative decoding.

Plain Python, no Ansible imports. What this file relies on, read from KServe's source (kserve/kserve, the CRD of
record in ../shared/kserve-crds, commit in its SOURCE.md):

* Fields (CRD ``llminferenceservices.serving.kserve.io``, versions v1alpha1 served, v1alpha2 served + storage,
  conversion ``None``): ``spec.model`` (``uri`` required, ``name``), ``spec.template`` (a PodSpec: the decode pool,
  or the only pool), ``spec.prefill`` (``template``, ``worker``, ``parallelism``, ``replicas``: the prefill pool of
  prefill/decode disaggregation), ``spec.worker`` (multi-node workers, a LeaderWorkerSet), ``spec.parallelism``
  (``tensor``, ``pipeline``, ``data``, ``dataLocal``, ``dataRPCPort``, ``expert``), ``spec.replicas``,
  ``spec.baseRefs`` (names of ``LLMInferenceServiceConfig`` presets), ``spec.router``. Only in v1alpha1:
  ``spec.model.criticality``. Only in v1alpha2: ``spec.kvCacheOffloading``, ``spec.prefill.kvCacheOffloading``,
  ``spec.model.confidential``.
* Storage (``pkg/controller/v1alpha2/llmisvc/workload_storage.go`` ``attachModelArtifacts``, rules in
  ``kserve/storage.py``): one ``spec.model.uri`` with scheme ``pvc://`` (mounted read-only at /mnt/models, the URI's
  path as subPath), ``oci://`` (the cluster's OCI mode: Modelcar or, native, an ImageVolume; off: refused),
  ``oci+native://`` (an ImageVolume), ``hf://`` or ``s3://`` (storage initializer into /mnt/models); any other scheme
  is "unsupported schema in model URI". There is no list of URIs, so a draft reaches the pod inside the same artifact:
  a Modelcar image holding both, or a PVC holding both. The container the controller edits is named ``main``.
* vLLM arguments (``config/llmisvc/config-llm-*.yaml`` presets): ``command: [vllm, serve, <model>]`` with ``args``
  (argv), or ``command: [/bin/bash, -c]`` with one script in ``args`` that runs ``eval "vllm serve ...
  ${VLLM_ADDITIONAL_ARGS} ..."`` (the data-parallel presets): extra vLLM flags then come from the env variable
  ``VLLM_ADDITIONAL_ARGS``, whose value the shell parses again (``eval``). Presets merge into the resource
  container by container (by name) with a strategic merge patch (``config_merge.go``, see ``merge.py``): a non-empty
  ``command``/``args`` the resource sets replaces the preset's, an env variable's non-empty ``value`` replaces the
  preset's; an empty one (``value: ""``, ``args: []``) does not override, and anything else of the preset stays.
* Workloads (``workload_single_node.go``): the main Deployment ``<name>-kserve`` with pod labels
  ``app.kubernetes.io/component=llminferenceservice-workload``, ``app.kubernetes.io/name=<name>``,
  ``app.kubernetes.io/part-of=llminferenceservice``, ``kserve.io/component=workload``, ``llm-d.ai/role`` =
  ``decode`` (with a prefill pool) or ``both``; the prefill Deployment ``<name>-kserve-prefill`` with component
  ``llminferenceservice-workload-prefill`` and role ``prefill``. A pool's condition follows its Deployment's
  ``Available`` condition (``propagateDeploymentStatus``).
* Multi-node workloads (``workload_multi_node.go``): with ``spec.worker`` (``spec.prefill.worker``) the pool runs as a
  LeaderWorkerSet ``<name>-kserve-mn`` (``<name>-kserve-mn-prefill``) instead, the Deployment is deleted and its
  condition cleared; ``size`` is ``ParallelismSpec.GetSize`` (data / dataLocal, else pipeline), ``replicas`` the number
  of groups; leader pods (worker index 0) carry component ``llminferenceservice-workload-leader[-prefill]``, workers
  ``llminferenceservice-workload-worker[-prefill]``; ``WorkerWorkloadReady`` / ``PrefillWorkerWorkloadReady`` follow
  the LWS's ``Available`` condition (``propagateLeaderWorkerSetStatus``).
* Readiness (``pkg/apis/serving/v1alpha2/llm_inference_service_lifecycle.go``): a Knative living condition set
  over ``PresetsCombined``, ``WorkloadsReady`` and ``RouterReady``; ``WorkloadsReady`` rolls up
  ``MainWorkloadReady``, ``WorkerWorkloadReady``, ``PrefillWorkloadReady``, ``PrefillWorkerWorkloadReady``,
  ``ScalingReady``, ``PrefillScalingReady`` (absent ones are skipped, the first False wins); ``Ready`` is True
  when the three are True. ``status.observedGeneration`` says which generation the conditions describe.
"""

from __future__ import annotations

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

GROUP = "serving.kserve.io"
KIND = "LLMInferenceService"
PLURAL = "llminferenceservices"
CONFIG_KIND = "LLMInferenceServiceConfig"
CONFIG_PLURAL = "llminferenceserviceconfigs"
API_VERSIONS = ("v1alpha1", "v1alpha2")
DEFAULT_API_VERSION = "v1alpha2"  # the storage version of the CRD
RESOURCE_KINDS = ("InferenceService", "LLMInferenceService")
MAIN_CONTAINER = "main"
ADDITIONAL_ARGS_ENV = "VLLM_ADDITIONAL_ARGS"
PARALLELISM_KEYS = ("tensor", "pipeline", "data", "dataLocal", "dataRPCPort", "expert")
# Spec fields that exist in one API version only (CRD schema diff): using them with the other version is refused.
ONLY_IN = {
    "v1alpha1": {"criticality": "spec.model.criticality"},
    "v1alpha2": {"kv_cache_offloading": "spec.kvCacheOffloading", "confidential": "spec.model.confidential"},
}
# Pools: where their pod spec lives, their Deployment suffix, their pod labels and the condition that reports them.
POOLS = {
    "decode": {"path": ("template",), "component": "llminferenceservice-workload", "condition": "MainWorkloadReady"},
    "worker": {"path": ("worker",), "component": "llminferenceservice-workload", "condition": "WorkerWorkloadReady"},
    "prefill": {"path": ("prefill", "template"), "component": "llminferenceservice-workload-prefill",
                "condition": "PrefillWorkloadReady"},
    "prefill_worker": {"path": ("prefill", "worker"), "component": "llminferenceservice-workload-prefill",
                       "condition": "PrefillWorkerWorkloadReady"},
}
TOP_CONDITIONS = ("PresetsCombined", "WorkloadsReady", "RouterReady")
WORKLOAD_CONDITIONS = ("MainWorkloadReady", "WorkerWorkloadReady", "PrefillWorkloadReady", "PrefillWorkerWorkloadReady",
                       "ScalingReady", "PrefillScalingReady")
ROUTER_CONDITIONS = ("GatewaysReady", "HTTPRoutesReady", "InferencePoolReady", "SchedulerWorkloadReady", "TokenizerReady")


def check_resource_kind(kind, field="resource_kind"):
    if kind not in RESOURCE_KINDS:
        raise ValidationError("'%s' is not a resource kind the collection deploys" % (kind,), field=field,
                              hint="use InferenceService (the default) or LLMInferenceService")
    return kind


def check_api_version(version, field="llmisvc.api_version"):
    version = (version or DEFAULT_API_VERSION).rsplit("/", 1)[-1]
    if version not in API_VERSIONS:
        raise ValidationError("'%s' is not an LLMInferenceService API version" % version, field=field,
                              hint="use v1alpha2 (the CRD's storage version) or v1alpha1")
    return version


def pod_selector(name, pool, multi_node=False):
    """Label selector of a pool's pods, as KServe's controller labels them. ``multi_node``: the pool runs as a
    LeaderWorkerSet, whose pods (leaders and workers) all carry ``leaderworkerset.sigs.k8s.io/name=<LWS name>``."""
    if multi_node:
        return "%s=%s" % (LWS_NAME_LABEL, lws_name(name, pool))
    return "app.kubernetes.io/component=%s,app.kubernetes.io/name=%s,app.kubernetes.io/part-of=llminferenceservice" % (
        POOLS[pool]["component"], name)


def deployment_name(name, pool):
    return name + ("-kserve-prefill" if pool.startswith("prefill") else "-kserve")


# Multi-node pools (workload_multi_node.go): a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) named <name>-kserve-mn or
# <name>-kserve-mn-prefill instead of the Deployment; its leader pods are labelled component
# llminferenceservice-workload-leader[-prefill], its worker pods llminferenceservice-workload-worker[-prefill]; the pool's
# condition is WorkerWorkloadReady / PrefillWorkerWorkloadReady (from the LWS's Available condition) and
# MainWorkloadReady / PrefillWorkloadReady are cleared. The LWS controller labels every pod with the set name, the group
# index and the worker index (0 = the group's leader, named <lws>-<group>; workers <lws>-<group>-<index>).
LWS_GROUP, LWS_VERSION, LWS_PLURAL, LWS_KIND = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
_POOL_CONDITIONS = {"decode": ("MainWorkloadReady", "WorkerWorkloadReady"),
                    "prefill": ("PrefillWorkloadReady", "PrefillWorkerWorkloadReady")}
_POD_POOLS = {"llminferenceservice-workload": "decode", "llminferenceservice-workload-prefill": "prefill",
              "llminferenceservice-workload-leader": "decode leader", "llminferenceservice-workload-worker": "decode worker",
              "llminferenceservice-workload-leader-prefill": "prefill leader",
              "llminferenceservice-workload-worker-prefill": "prefill worker"}


def lws_name(name, pool):
    return name + ("-kserve-mn-prefill" if pool.startswith("prefill") else "-kserve-mn")


def all_pods_selector(name):
    """Every workload pod of the LLMInferenceService, single- or multi-node (for a timeout description)."""
    return "app.kubernetes.io/name=%s,app.kubernetes.io/part-of=llminferenceservice" % name


def pod_pool(labels):
    """Which pool (and multi-node role) a pod belongs to, from its component label; None for other pods."""
    return _POD_POOLS.get((labels or {}).get("app.kubernetes.io/component"))


def _layers(obj, presets):
    spec = (obj or {}).get("spec") or {}
    return [spec] + [((presets or {}).get((ref or {}).get("name")) or {}).get("spec") or {} for ref in spec.get("baseRefs") or []]


def _dig(obj, path):
    node = obj
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node if isinstance(node, dict) else None
