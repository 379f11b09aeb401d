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
* Storage (``pkg/controller/v1alpha1/llmisvc/workload_storage.go`` ``attachModelArtifacts``): one ``spec.model.uri``
  with scheme ``pvc://`` (mounted read-only at /mnt/models, the URI's path as subPath), ``oci://`` (Modelcar, needs
  ``enableOciImageSource``), ``hf://`` or ``s3://`` (storage initializer into /mnt/models); any other scheme is
  "unsupported schema in model URI". There is no list of URIs, so a draft reaches the pod inside the same artifact:
  a Modelcar image holding both, or a PVC holding both. The container the controller edits is named ``main``.
* vLLM arguments (``config/llmisvc/config-llm-*.yaml`` presets): ``command: [vllm, serve, <model>]`` with ``args``
  (argv), or ``command: [/bin/bash, -c]`` with one script in ``args`` that runs ``eval "vllm serve ...
  ${VLLM_ADDITIONAL_ARGS} ..."`` (the data-parallel presets): extra vLLM flags then come from the env variable
  ``VLLM_ADDITIONAL_ARGS``, whose value the shell parses again (``eval``). Presets merge into the resource
  container by container (by name) with a strategic merge patch (``config_merge.go``): a ``command``/``args`` the
  resource sets replaces the preset's, an env variable of the same name replaces the preset's, anything else of the
  preset stays.
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

import copy

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as spec_core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command

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
URI_SCHEMES = ("pvc://", "oci://", "hf://", "s3://")
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
# Flag spellings a leftover search looks for after a strip (a flag inside a quoted string, e.g. eval "..."):
# every spelling in vllm_command's registry, the legacy pre-0.10 flags included (except the short aliases).
_FLAG_WORDS = tuple(s for s in vllm_command.flag_spellings() if s.startswith("--"))


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


def multi_node(obj, pool, presets=None):
    """Whether KServe's controller runs ``pool`` (decode or prefill) as a LeaderWorkerSet.

    The status says so once it describes the current generation (the controller sets WorkerWorkloadReady /
    PrefillWorkerWorkloadReady for a LeaderWorkerSet and clears MainWorkloadReady / PrefillWorkloadReady, and the other
    way round); before that, ``spec.worker`` / ``spec.prefill.worker`` of the resource or of a baseRefs preset."""
    single, multi = _POOL_CONDITIONS["prefill" if pool.startswith("prefill") else "decode"]
    conds = _conditions(obj)
    if readiness(obj)["up_to_date"]:
        if multi in conds:
            return True
        if single in conds:
            return False
    path = ("prefill", "worker") if pool.startswith("prefill") else ("worker",)
    return any(_dig(layer, path) is not None for layer in _layers(obj, presets))


# ----------------------------------------------------------------------------------------------------------------
# Render

def _parallelism(value, field):
    if not value:
        return {}
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping such as {tensor: 2}", field=field, hint="write e.g. {tensor: 2}")
    out = {}
    for key, val in value.items():
        if key not in PARALLELISM_KEYS:
            raise ValidationError("'%s' is not a field of spec.parallelism" % key, field="%s.%s" % (field, key),
                                  hint="use one of %s" % ", ".join(PARALLELISM_KEYS))
        if key == "expert":
            if not isinstance(val, bool):
                raise ValidationError("must be true or false, got %r" % (val,), field="%s.%s" % (field, key), hint="write true or false")
        elif isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValidationError("must be a positive integer, got %r" % (val,), field="%s.%s" % (field, key), hint="write a bare number")
        out[key] = val
    return out


def check_draft_tp(spec, tensor, field="speculative.draft_tensor_parallel_size"):
    """vLLM's rule: the draft's tensor parallel size is 1 or the target's."""
    if spec is None:
        return
    draft_tp = spec.config.get("draft_tensor_parallel_size")
    if draft_tp is not None and draft_tp not in (1, tensor):
        raise ValidationError("is %s but the target runs with tensor parallel size %d (spec.parallelism.tensor); vLLM accepts only "
                              "1 or the target's size" % (draft_tp, tensor), field=field,
                              hint="set draft_tensor_parallel_size to 1 or %d, or drop it" % tensor)


def _artifacts(p, needs_draft):
    art = dict(p.get("artifacts") or {})
    mode = p.get("artifact_mode") or "auto"
    if needs_draft and (mode == "storage_uris" or (mode == "auto" and art.get("draft_uri"))):
        raise ValidationError("an LLMInferenceService has one spec.model.uri, so the draft cannot reach the pod as its own storage URI",
                              field="artifacts.draft_uri" if art.get("draft_uri") else "artifact_mode",
                              hint="put target and draft in one Modelcar image (artifact_mode modelcar) or on one PVC (artifact_mode pvc)")
    if mode == "storage_uris" and not needs_draft:
        mode = "single"
        art.setdefault("storage_uri", art.pop("target_uri", None))
    if mode == "auto" and not needs_draft and art.get("target_uri") and not art.get("storage_uri"):
        art["storage_uri"] = art.pop("target_uri")
    result = isvc.resolve_artifacts(mode, art, needs_draft, (0, 20, 0), p.get("modelcar_enabled", True))
    if not str(result.storage_uri or "").startswith(URI_SCHEMES):
        raise ValidationError("'%s' has a scheme KServe's LLMInferenceService controller cannot mount (it takes %s)"
                              % (result.storage_uri, ", ".join(URI_SCHEMES)), field="artifacts.storage_uri",
                              hint="stage the model onto a PVC (pvc://) or into a Modelcar image (oci://)")
    return result


def _check_version_fields(p, version):
    ext = p.get("llmisvc") or {}
    for other, fields in ONLY_IN.items():
        if other == version:
            continue
        for key, path in fields.items():
            if ext.get(key) is not None:
                raise ValidationError("%s exists only in %s, but api_version is %s" % (path, other, version),
                                      field="llmisvc.%s" % key, hint="set llmisvc.api_version: %s or drop %s" % (other, key))


def _container(p, args, env, image):
    container = {"name": MAIN_CONTAINER}
    if image:
        container["image"] = image
    if p.get("command_style", "bash") == "args":
        container["command"] = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        container["args"] = list(args)
    else:
        container["command"] = ["bash", "-c", isvc.bash_script(args)]
    container["env"] = env
    resources = {"limits": {}, "requests": {}}
    for key, value in sorted((p.get("resources") or {}).items()):
        resources["limits"][key] = str(value)
        resources["requests"][key] = str(value)
    if p.get("gpu_count", 1):
        resources["limits"]["nvidia.com/gpu"] = str(p.get("gpu_count", 1))
    container["resources"] = {k: v for k, v in resources.items() if v}
    container["ports"] = [{"containerPort": 8080, "name": "http", "protocol": "TCP"}]
    startup_seconds = int(p.get("startup_timeout_seconds", 1800))
    container["startupProbe"] = {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10,
                                 "failureThreshold": max(1, startup_seconds // 10), "timeoutSeconds": 5}
    return container


def render(p, existing=None):
    """Render the LLMInferenceService for the role's parameters ``p`` (the isvc_manifest module's options).

    ``p["llmisvc"]`` holds what only this kind has: ``api_version``, ``image``, ``base_refs``, ``parallelism``,
    ``prefill`` (``{replicas, parallelism}``: a prefill pool), ``speculative_pools`` (``[decode]`` default,
    ``[decode, prefill]``), ``criticality`` (v1alpha1), ``kv_cache_offloading`` / ``confidential`` (v1alpha2).
    Returns the same keys as ``isvc.render``. Every refusal is raised before anything is written.
    """
    del existing  # an LLMInferenceService has no deploymentMode to keep
    ext = dict(p.get("llmisvc") or {})
    warnings = []
    isvc.check_dns1123(p.get("name"), "name")
    isvc.check_dns1123(p.get("namespace"), "namespace")
    version = check_api_version(ext.get("api_version"))
    _check_version_fields(p, version)
    if isvc.normalise_deployment_mode(p.get("deployment_mode") or "Standard") != "Standard":
        raise ValidationError("an LLMInferenceService has no Knative mode (its controller runs Deployments)", field="deployment_mode",
                              hint="drop deployment_mode or use Standard")
    method = p.get("method") or "none"
    if method not in isvc.METHODS:
        raise ValidationError("'%s' is not a supported method" % method, field="method", hint="use one of %s" % ", ".join(isvc.METHODS))
    needs_draft = method in ("eagle3", "eagle", "draft_model")
    artifacts = _artifacts(p, needs_draft)
    if artifacts.reason:
        warnings.append("artifact_mode auto chose %s: %s" % (artifacts.mode, artifacts.reason))
    spec = isvc.speculative_for(method, p.get("speculative"), artifacts.draft_path, p.get("vllm_version"))
    parallelism = _parallelism(ext.get("parallelism"), "llmisvc.parallelism")
    tensor = parallelism.get("tensor", 1)
    check_draft_tp(spec, tensor)
    if spec is not None:
        warnings.extend(w for w in spec.warnings if "--gpu-memory-utilization" not in w and "draft_tensor_parallel_size" not in w)
    pools = list(ext.get("speculative_pools") or ["decode"])
    for pool in pools:
        if pool not in ("decode", "prefill"):
            raise ValidationError("'%s' is not a pool" % pool, field="llmisvc.speculative_pools", hint="use decode and/or prefill")
    prefill = ext.get("prefill")
    if "decode" not in pools and spec is not None:
        raise ValidationError("puts the speculative config on the prefill pool only; speculative decoding acts in the decode pool",
                              field="llmisvc.speculative_pools", hint="use [decode] (the default) or [decode, prefill]")
    if "prefill" in pools and not prefill:
        raise ValidationError("names the prefill pool but llmisvc.prefill is not set", field="llmisvc.speculative_pools",
                              hint="add llmisvc.prefill (e.g. {replicas: 1}) or drop prefill from speculative_pools")

    gmu = isvc.engine_sizing(p, spec, warnings)
    served = p.get("served_model_name") or p["name"]
    extra = [str(a) for a in (p.get("extra_args") or [])]
    if tensor > 1:
        extra = ["--tensor-parallel-size", str(tensor)] + extra
    if parallelism.get("pipeline", 1) > 1:
        extra = ["--pipeline-parallel-size", str(parallelism["pipeline"])] + extra
    q = dict(p, served_model_name=served, gpu_memory_utilization=gmu, extra_args=extra)
    args = isvc.server_args(q, artifacts.target_path, spec)
    plain = isvc.server_args(q, artifacts.target_path, None)
    spec_core.check_command(args, vllm_version=p.get("vllm_version"), config=spec.config if spec else None, field="extra_args")
    env = [{"name": "DTYPE", "value": str(p["dtype"])},
           {"name": "GPU_MEMORY_UTILIZATION", "value": isvc._fmt_number(gmu)},  # pylint: disable=protected-access
           {"name": "MODEL_NAME", "value": served}]
    env += [{"name": k, "value": str(v)} for k, v in sorted((p.get("env") or {}).items())]
    image = ext.get("image")
    base_refs = [str(r) for r in (ext.get("base_refs") or [])]
    if not image and not base_refs:
        # KServe's controller merges its well-known presets (kserve-config-llm-template ...) into every LLMInferenceService;
        # they carry the llm-d vLLM image. Pinning the image keeps the vLLM release (and its flags) known.
        warnings.append("llmisvc.image is not set: the main container's image comes from KServe's well-known presets; "
                        "set llmisvc.image to pin the vLLM release the speculative config was validated for")
    replicas = int(p.get("min_replicas", 1))
    if int(p.get("max_replicas", replicas)) != replicas:
        raise ValidationError("min_replicas %d and max_replicas %s differ; an LLMInferenceService has a static spec.replicas "
                              "(autoscaling is spec.scaling, which this collection does not render)" % (replicas, p.get("max_replicas")),
                              field="max_replicas", hint="set min_replicas and max_replicas to the same number")
    template = {"containers": [_container(p, args, env, image)], "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}
    if p.get("service_account_name"):
        template["serviceAccountName"] = p["service_account_name"]
    model = {"uri": artifacts.storage_uri, "name": served}
    if ext.get("criticality") is not None:
        model["criticality"] = ext["criticality"]
    if ext.get("confidential") is not None:
        model["confidential"] = ext["confidential"]
    spec_body = {"model": model, "replicas": replicas, "template": template}
    if parallelism:
        spec_body["parallelism"] = parallelism
    if base_refs:
        spec_body["baseRefs"] = [{"name": r} for r in base_refs]
    if ext.get("kv_cache_offloading") is not None:
        spec_body["kvCacheOffloading"] = ext["kv_cache_offloading"]
    if prefill:
        if not isinstance(prefill, dict):
            raise ValidationError("must be a mapping such as {replicas: 1}", field="llmisvc.prefill", hint="write {replicas: 1}")
        prefill_args = args if "prefill" in pools else plain
        ptemplate = copy.deepcopy(template)
        ptemplate["containers"] = [_container(p, prefill_args, env, image)]
        body = {"replicas": int(prefill.get("replicas", 1)), "template": ptemplate}
        if prefill.get("parallelism"):
            body["parallelism"] = _parallelism(prefill.get("parallelism"), "llmisvc.prefill.parallelism")
        spec_body["prefill"] = body
    annotations = dict(p.get("annotations") or {})
    if p.get("model_repo"):
        annotations[isvc.MODEL_REPO_ANNOTATION] = p["model_repo"]
    labels = {isvc.RUNTIME_TYPE_LABEL: "vllm"}
    labels.update(p.get("labels") or {})
    metadata = {"name": p["name"], "namespace": p["namespace"], "labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    manifest = {"apiVersion": "%s/%s" % (GROUP, version), "kind": KIND, "metadata": metadata, "spec": spec_body}
    return {"manifest": manifest, "speculative": spec, "artifacts": artifacts, "warnings": warnings, "runtime_check": None}


def manifest_filename(manifest):
    meta = manifest["metadata"]
    return "%s-%s.llmisvc.yaml" % (meta["namespace"], meta["name"])


# ----------------------------------------------------------------------------------------------------------------
# Where the flag is: every pool, every container, every form

def _dig(obj, path):
    node = obj
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node if isinstance(node, dict) else None


def _leftover(texts):
    return [t for t in texts if isinstance(t, str) and any(w in t for w in _FLAG_WORDS)]


# KServe's well-known presets (pkg/controller/v1alpha2/llmisvc/config_merge.go, combineBaseRefsConfig): besides
# spec.baseRefs the controller merges these LLMInferenceServiceConfig objects, chosen by the shape of the spec (the
# resource merged with its baseRefs), looked up in the resource's namespace first, then in KServe's system namespace.
# Their names are the controller's LLM_INFERENCE_SERVICE_CONFIG_PREFIX (default "kserve-") + suffix, unless the
# resource's status.annotations pin another name under "serving.kserve.io/<suffix>" (WellKnownConfigResolver; the
# router-route preset is never pinned). Merge order: well-known presets, then baseRefs, then the resource itself.
WELL_KNOWN_PREFIX = "kserve-"
WELL_KNOWN_PIN_PREFIX = "serving.kserve.io/"
WK_TEMPLATE = "config-llm-template"
WK_DECODE = "config-llm-decode-template"
WK_PREFILL = "config-llm-prefill-template"
WK_WORKER_DP = "config-llm-worker-data-parallel"
WK_DECODE_WORKER_DP = "config-llm-decode-worker-data-parallel"
WK_PREFILL_WORKER_DP = "config-llm-prefill-worker-data-parallel"
WK_WORKER_PP = "config-llm-worker-pipeline-parallel"
WK_DECODE_WORKER_PP = "config-llm-decode-worker-pipeline-parallel"
WK_PREFILL_WORKER_PP = "config-llm-prefill-worker-pipeline-parallel"
WK_SCHEDULER = "config-llm-scheduler"
WK_ROUTE = "config-llm-router-route"
WK_TRACING = "config-llm-tracing"


def _merge_maps(base, over):
    """Maps merged key by key (recursively), anything else replaced; enough to tell the spec's shape after the baseRefs."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return copy.deepcopy(over) if over is not None else copy.deepcopy(base)
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is not None:
            out[key] = _merge_maps(out.get(key), value)
    return out


def _data_parallel(par):
    par = par if isinstance(par, dict) else {}
    return int(par.get("data") or 0) > 0 or int(par.get("dataLocal") or 0) > 0


def _pipeline_parallel(par):
    return int((par if isinstance(par, dict) else {}).get("pipeline") or 0) > 0


def well_known_presets(obj, base_specs=(), config_prefix=WELL_KNOWN_PREFIX):
    """The well-known LLMInferenceServiceConfig names KServe's controller merges into ``obj``, in merge order (first =
    lowest priority). ``base_specs``: the specs of its baseRefs presets (they decide the shape too)."""
    spec = copy.deepcopy((obj or {}).get("spec") or {})
    for base in base_specs or ():
        spec = _merge_maps(spec, base or {})
    pins = (((obj or {}).get("status") or {}).get("annotations")) or {}

    def name(suffix, pinned=True):
        if pinned and pins.get(WELL_KNOWN_PIN_PREFIX + suffix):
            return pins[WELL_KNOWN_PIN_PREFIX + suffix]
        return (config_prefix if config_prefix is not None else WELL_KNOWN_PREFIX) + suffix

    out = []
    router = spec.get("router") if isinstance(spec.get("router"), dict) else None
    if router is not None:
        scheduler = router.get("scheduler")
        if isinstance(scheduler, dict) and not (((scheduler.get("pool") or {}).get("ref") or {}).get("name")):
            out.append(name(WK_SCHEDULER))
        route = router.get("route")
        if isinstance(route, dict) and not ((route.get("http") or {}).get("refs")):
            out.append(name(WK_ROUTE, pinned=False))
    if spec.get("tracing") is not None:
        out.append(name(WK_TRACING))
    prefill = spec.get("prefill")
    worker = spec.get("worker")
    if isinstance(prefill, dict):
        if prefill.get("worker") is None:
            out.append(name(WK_PREFILL))
        elif _data_parallel(prefill.get("parallelism")):
            out.append(name(WK_PREFILL_WORKER_DP))
        elif _pipeline_parallel(prefill.get("parallelism")):
            out.append(name(WK_PREFILL_WORKER_PP))
        decode_names = (WK_DECODE, WK_DECODE_WORKER_DP, WK_DECODE_WORKER_PP)
    else:
        decode_names = (WK_TEMPLATE, WK_WORKER_DP, WK_WORKER_PP)
    if worker is None:
        out.append(name(decode_names[0]))
    elif _data_parallel(spec.get("parallelism")):
        out.append(name(decode_names[1]))
    elif _pipeline_parallel(spec.get("parallelism")):
        out.append(name(decode_names[2]))
    return out


def preset_layers(obj, presets=None, config_prefix=WELL_KNOWN_PREFIX):
    """What KServe's controller merges, in its order: ``[{source, name, namespace, well_known, spec}]`` - the well-known
    presets found in ``presets``, the baseRefs presets found, then the resource itself (``source`` ``resource``)."""
    presets = presets or {}
    refs = [(ref or {}).get("name") for ref in (((obj or {}).get("spec") or {}).get("baseRefs") or [])]
    base = [(n, presets[n]) for n in refs if presets.get(n)]
    layers = []
    names = well_known_presets(obj, [(p.get("spec") or {}) for _n, p in base], config_prefix)
    for well_known, entries in ((True, [(n, presets[n]) for n in names if presets.get(n)]), (False, base)):
        for name, preset in entries:
            layers.append({"source": "%s/%s" % (CONFIG_KIND, name), "name": name, "well_known": well_known,
                           "namespace": ((preset.get("metadata") or {}).get("namespace")), "spec": preset.get("spec") or {}})
    layers.append({"source": "resource", "name": None, "well_known": False, "namespace": None, "spec": (obj or {}).get("spec") or {}})
    return layers


def _effective_containers(layers, path):
    """Per container name, what survives KServe's strategic merge of the layers and which layer each part comes from:
    ``command`` / ``args`` / ``envFrom`` lists are replaced by the last layer that sets them; ``env`` merges by name
    (the last layer setting a variable owns it). Returns ``{name: {"layers": {index: container}, "owner": {...}}}``."""
    out = {}
    for li, layer in enumerate(layers):
        podspec = _dig(layer["spec"], path)
        for container in (podspec or {}).get("containers") or []:
            if not isinstance(container, dict) or not container.get("name"):
                continue
            entry = out.setdefault(container["name"], {"layers": {}, "fields": {}, "env": {}})
            entry["layers"][li] = container
            for key in ("command", "args", "envFrom"):
                if key in container:
                    entry["fields"][key] = li
            for ei, item in enumerate(container.get("env") or []):
                if isinstance(item, dict) and item.get("name"):
                    entry["env"][item["name"]] = (li, ei)
    return out


def _owned_view(entry, li):
    """The container of layer ``li`` reduced to what it owns after the merge (env items it does not own become None, so
    indices stay those of the layer's own list)."""
    container = entry["layers"][li]
    view = {key: container[key] for key in ("command", "args") if entry["fields"].get(key) == li}
    view["env"] = [item if (isinstance(item, dict) and entry["env"].get(item.get("name")) == (li, ei)) else None
                   for ei, item in enumerate(container.get("env") or [])]
    return view


def env_ref(item):
    """``{kind: ConfigMap|Secret, name, key, optional}`` for an env item set through valueFrom configMapKeyRef /
    secretKeyRef (and no plain value), else None."""
    if not isinstance(item, dict) or item.get("value") not in (None, ""):
        return None
    source = item.get("valueFrom") or {}
    for field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
        ref = source.get(field)
        if isinstance(ref, dict):
            return {"kind": kind, "name": ref.get("name"), "key": ref.get("key"), "optional": bool(ref.get("optional"))}
    return None


def _env_text_flags(text):
    words = vllm_command._script_occurrences(text, 0) or []  # pylint: disable=protected-access
    return words, _leftover([vllm_command.strip_script(text)])


def container_flags(container, env_sources=None):
    """The speculative flags of one container: ``[{field, forms, occurrences}]`` for command/args and VLLM_ADDITIONAL_ARGS,
    plus ``unstrippable`` (a flag spelling the token-exact editor does not see as a shell word, e.g. inside eval "...").

    With ``env_sources`` (what read_env_sources returned: ConfigMap values by ``(name, key)``), a VLLM_ADDITIONAL_ARGS set
    through valueFrom is inspected too: a ConfigMap's value is scanned (entry with ``value_from``), a Secret is never
    read (entry with ``opaque``: the reason it cannot be inspected); without it, valueFrom is not looked at."""
    found = []
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    occ = vllm_command.find_occurrences(command) + vllm_command.find_occurrences(args)
    if occ:
        found.append({"field": "command/args", "forms": sorted({o.form for o in occ}), "occurrences": occ})
    env_values = []
    for index, item in enumerate(container.get("env") or []):
        if not isinstance(item, dict) or item.get("name") != ADDITIONAL_ARGS_ENV:
            continue
        field = "env[%d] %s" % (index, ADDITIONAL_ARGS_ENV)
        ref = env_ref(item)
        if ref is None:
            if isinstance(item.get("value"), str):
                words = vllm_command._script_occurrences(item["value"], 0) or []  # pylint: disable=protected-access
                if words:
                    found.append({"field": field, "forms": ["env"], "occurrences": words})
                env_values.append(vllm_command.strip_script(item["value"]))
            continue
        if env_sources is None:
            continue
        where = "%s from %s %s key %s" % (field, ref["kind"], ref["name"], ref["key"])
        if ref["kind"] == "Secret":
            found.append({"field": where, "forms": ["env_secret"], "occurrences": [], "value_from": ref,
                          "opaque": "the rollback never reads a Secret's value"})
            continue
        source = env_sources.get((ref["name"], ref["key"])) or {"value": None, "reason": "not read"}
        if source.get("value") is None:
            found.append({"field": where, "forms": ["env_configmap"], "occurrences": [], "value_from": ref,
                          "opaque": "ConfigMap %s key %s could not be read (%s)" % (ref["name"], ref["key"], source.get("reason"))})
            continue
        words, leftover = _env_text_flags(source["value"])
        if words or leftover:
            found.append({"field": where, "forms": ["env_configmap"], "occurrences": words, "value_from": ref,
                          "leftover": leftover})
    stripped_cmd = vllm_command.strip_speculative_config(command) or []
    stripped_args = vllm_command.strip_speculative_config(args) or []
    unstrippable = _leftover(stripped_cmd + stripped_args + env_values)
    return found, unstrippable


def flags(obj, presets=None, env_sources=None, config_prefix=WELL_KNOWN_PREFIX):
    """Per pool and container: where a speculative flag is in effect after KServe's merge - the resource's own, or a
    preset's (well-known or baseRefs) that the resource does not override. ``presets``: read_presets' result;
    ``env_sources``: read_env_sources' (valueFrom of VLLM_ADDITIONAL_ARGS inspected only with it).
    Returns ``[{pool, container, source, preset, field, forms, config, error, unstrippable[, value_from, opaque]}]``;
    ``preset`` is None, ``well-known`` or ``baseRefs``."""
    layers = preset_layers(obj, presets, config_prefix)
    out = []
    for pool, info in POOLS.items():
        effective = _effective_containers(layers, info["path"])
        for cname, entry in effective.items():
            resource_index = len(layers) - 1
            for li in sorted(entry["layers"], key=lambda i: (i != resource_index, i)):
                layer = layers[li]
                view = _owned_view(entry, li)
                found, unstrippable = container_flags(view, env_sources)
                if layer["source"] != "resource":
                    unstrippable = []
                for item in found:
                    out.append(_entry(pool, cname, layer, item, unstrippable))
                if unstrippable and not found:
                    out.append({"pool": pool, "container": cname, "source": "resource", "preset": None, "field": "command/args",
                                "forms": [], "config": None, "error": None, "unstrippable": unstrippable})
    return out


def _entry(pool, cname, layer, entry, unstrippable):
    config, error = None, None
    try:
        config = vllm_command.config_from_occurrences(entry["occurrences"], field="%s %s" % (pool, cname))
    except ValidationError as exc:
        error = str(exc)
    out = {"pool": pool, "container": cname, "source": layer["source"],
           "preset": None if layer["source"] == "resource" else ("well-known" if layer["well_known"] else "baseRefs"),
           "field": entry["field"], "forms": entry["forms"], "config": config, "error": error,
           "unstrippable": unstrippable + list(entry.get("leftover") or [])}
    if layer["source"] != "resource":
        out["preset_namespace"] = layer["namespace"]
    for key in ("value_from", "opaque"):
        if key in entry:
            out[key] = entry[key]
    return out


def _pool_field(pool, container, field):
    return "spec.%s.containers[%s].%s" % (".".join(POOLS[pool]["path"]), container, field)


def strip(obj, presets=None, env_sources=None, secret_env_has_no_flag=False, config_prefix=WELL_KNOWN_PREFIX):
    """Remove every speculative flag the resource itself carries, token-exact, in every pool and form.

    Returns ``(patch, changes)``: ``patch`` is a JSON patch (list of ops, each with a ``test`` of the old value first)
    or [] when there is nothing to strip; ``changes`` describes each edit. Refuses (ValidationError), before anything is
    written, when a preset supplies the flag (a well-known one KServe merges, or a baseRefs one: the resource does not own
    it), when VLLM_ADDITIONAL_ARGS comes from a ConfigMap that holds the flag or that could not be read, from a Secret
    (never read; unless ``secret_env_has_no_flag``), or when a flag sits where it cannot be removed token-exact."""
    found = flags(obj, presets, env_sources, config_prefix)
    if secret_env_has_no_flag:
        found = [f for f in found if (f.get("value_from") or {}).get("kind") != "Secret"]
    foreign = [f for f in found if f["source"] != "resource"]
    if foreign:
        f = foreign[0]
        name = f["source"].split("/", 1)[1]
        if f["preset"] == "well-known":
            raise ValidationError(
                "the speculative flag of pool %s container %s comes from %s %s/%s (%s), a well-known preset KServe's controller "
                "merges into every LLMInferenceService of this shape; the LLMInferenceService does not own it, and stripping the "
                "resource alone would leave it on" % (f["pool"], f["container"], CONFIG_KIND, f.get("preset_namespace"), name, f["field"]),
                field="spec.%s" % ".".join(POOLS[f["pool"]]["path"]),
                hint="set the container's args (or %s with value) in the LLMInferenceService so they override the preset's, or remove "
                     "the flag from %s %s/%s (it applies to every LLMInferenceService that merges it), then rerun"
                     % (ADDITIONAL_ARGS_ENV, CONFIG_KIND, f.get("preset_namespace"), name))
        raise ValidationError("the speculative flag of pool %s container %s comes from the preset %s (%s), which this "
                              "LLMInferenceService does not own; stripping the resource alone would leave it on" % (
                                  f["pool"], f["container"], f["source"], f["field"]), field="spec.baseRefs",
                              hint="remove the flag from that LLMInferenceServiceConfig (it is shared), or set the container's "
                                   "args / %s in the LLMInferenceService so they override the preset's" % ADDITIONAL_ARGS_ENV)
    sourced = [f for f in found if f.get("value_from")]
    if sourced:
        f = sourced[0]
        ref = f["value_from"]
        field = _pool_field(f["pool"], f["container"], "env[%s]" % ADDITIONAL_ARGS_ENV)
        set_value = "or set %s with value (without the flag) in the LLMInferenceService's %s instead of valueFrom" % (
            ADDITIONAL_ARGS_ENV, "spec." + ".".join(POOLS[f["pool"]]["path"]))
        if ref["kind"] == "Secret":
            raise ValidationError(
                "pool %s container %s takes %s from Secret %s key %s (valueFrom secretKeyRef); the rollback never reads a "
                "Secret's value, so it cannot tell whether it holds a speculative flag, and cannot remove one token-exact"
                % (f["pool"], f["container"], ADDITIONAL_ARGS_ENV, ref["name"], ref["key"]), field=field,
                hint="remove any speculative flag from that Secret's key yourself and rerun with secret_env_has_no_flag: true "
                     "(rollback_llmisvc_secret_env_has_no_flag; the engine line on every pod still proves it), %s" % set_value)
        if f.get("opaque"):
            raise ValidationError(
                "pool %s container %s takes %s from ConfigMap %s key %s (valueFrom configMapKeyRef), which could not be "
                "inspected: %s" % (f["pool"], f["container"], ADDITIONAL_ARGS_ENV, ref["name"], ref["key"], f["opaque"]), field=field,
                hint="let the rollback read that ConfigMap (get configmaps in the namespace), %s" % set_value)
        raise ValidationError(
            "pool %s container %s takes %s from ConfigMap %s key %s (valueFrom configMapKeyRef), which holds the speculative "
            "flag; the rollback edits only the LLMInferenceService (token-exact) and does not edit a ConfigMap other "
            "workloads may read" % (f["pool"], f["container"], ADDITIONAL_ARGS_ENV, ref["name"], ref["key"]), field=field,
            hint="remove the flag from ConfigMap %s key %s (kubectl edit configmap %s), %s, then rerun" % (
                ref["name"], ref["key"], ref["name"], set_value))
    bad = [f for f in found if f["unstrippable"]]
    if bad:
        raise ValidationError("pool %s container %s has a speculative flag inside a quoted string (%r), which cannot be removed "
                              "token-exact" % (bad[0]["pool"], bad[0]["container"], bad[0]["unstrippable"][0][:200]),
                              field="spec.%s" % ".".join(POOLS[bad[0]["pool"]]["path"]),
                              hint="move the flag out of the eval string into %s or the argv, then rerun" % ADDITIONAL_ARGS_ENV)
    spec = (obj or {}).get("spec") or {}
    patch, changes = [], []
    for pool, info in POOLS.items():
        podspec = _dig(spec, info["path"])
        base = "/spec/" + "/".join(info["path"]) + "/containers"
        for ci, container in enumerate((podspec or {}).get("containers") or []):
            for key in ("command", "args"):
                if key not in container:
                    continue
                old = list(container.get(key) or [])
                new = vllm_command.strip_speculative_config(old)
                if new != old:
                    path = "%s/%d/%s" % (base, ci, key)
                    patch += [{"op": "test", "path": path, "value": old}, {"op": "replace", "path": path, "value": new}]
                    changes.append({"pool": pool, "container": container.get("name"), "field": key, "before": old, "after": new})
            for ei, item in enumerate(container.get("env") or []):
                if isinstance(item, dict) and item.get("name") == ADDITIONAL_ARGS_ENV and isinstance(item.get("value"), str):
                    new = vllm_command.strip_script(item["value"])
                    if new != item["value"]:
                        path = "%s/%d/env/%d/value" % (base, ci, ei)
                        patch += [{"op": "test", "path": path, "value": item["value"]}, {"op": "replace", "path": path, "value": new}]
                        changes.append({"pool": pool, "container": container.get("name"), "field": "env " + ADDITIONAL_ARGS_ENV,
                                        "before": item["value"], "after": new})
    return patch, changes


# ----------------------------------------------------------------------------------------------------------------
# Readiness, as KServe's controller reports it

def _conditions(obj):
    return {c.get("type"): c for c in (((obj or {}).get("status") or {}).get("conditions") or []) if isinstance(c, dict)}


def readiness(obj):
    """``{ready, up_to_date, generation, observed_generation, reason, message, pools, failed}``.

    Ready means the Ready condition is True *and* status.observedGeneration equals metadata.generation (a Ready left from
    the previous spec does not count). ``pools`` maps each pool condition present to True/False/Unknown; ``failed`` is
    the reason when PresetsCombined is False (a missing or broken preset: waiting does not help)."""
    meta = (obj or {}).get("metadata") or {}
    status = (obj or {}).get("status") or {}
    conds = _conditions(obj)
    ready_cond = conds.get("Ready") or {}
    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    up_to_date = generation is not None and observed is not None and int(observed) == int(generation)
    pools = {name: str(conds[name].get("status")) for name in WORKLOAD_CONDITIONS + ROUTER_CONDITIONS if name in conds}
    presets = conds.get("PresetsCombined") or {}
    failed = None
    if up_to_date and str(presets.get("status")) == "False":
        failed = "PresetsCombined=False (%s): %s" % (presets.get("reason"), presets.get("message"))
    return {"ready": str(ready_cond.get("status")) == "True", "up_to_date": up_to_date, "generation": generation,
            "observed_generation": observed, "reason": ready_cond.get("reason"), "message": ready_cond.get("message"),
            "pools": pools, "failed": failed}


def describe(obj):
    state = readiness(obj)
    conds = ["%s=%s%s" % (c.get("type"), c.get("status"), (" (%s)" % (c.get("message") or c.get("reason"))) if (c.get("message") or c.get("reason")) else "")
             for c in (((obj or {}).get("status") or {}).get("conditions") or [])]
    return "generation %s, observedGeneration %s; conditions: %s" % (
        state["generation"], state["observed_generation"], ", ".join(conds) or "none")


def pools_of(obj, presets=None):
    """The pools an object runs: decode always; prefill when spec.prefill has a template or (multi-node) a worker, in the
    resource or a baseRefs preset."""
    layers = _layers(obj, presets)
    out = ["decode"]
    if any(_dig(layer, ("prefill", "template")) is not None or _dig(layer, ("prefill", "worker")) is not None for layer in layers):
        out.append("prefill")
    return out


def _index(labels, key):
    try:
        return int((labels or {}).get(key))
    except (TypeError, ValueError):
        return None


def _pod_order(pod):
    labels = pod.get("labels") or {}
    group, worker = _index(labels, LWS_GROUP_INDEX_LABEL), _index(labels, LWS_WORKER_INDEX_LABEL)
    return (group if group is not None else 1 << 30, worker if worker is not None else 1 << 30, pod.get("name") or "")


def rank0_pod(pods):
    """The pod whose engine line counts: with a LeaderWorkerSet the leader (worker index 0) of the lowest group, which
    runs data-parallel rank 0 (KServe's presets start each pod's ranks at LWS_WORKER_INDEX x dataLocal) and the API
    server; otherwise the first pod by name. Among the pods that logged the line (``found``); its name or None."""
    for pod in sorted(pods, key=_pod_order):
        if pod.get("found"):
            return pod.get("name")
    return None


def lws_groups(pods):
    """Group LeaderWorkerSet pods by their group index: ``[{group, leader, workers}]`` sorted by group (leader None
    when the group's leader pod is missing, e.g. being recreated)."""
    groups = {}
    for pod in sorted(pods, key=_pod_order):
        labels = pod.get("labels") or {}
        group = _index(labels, LWS_GROUP_INDEX_LABEL)
        entry = groups.setdefault(group, {"group": group, "leader": None, "workers": []})
        if _index(labels, LWS_WORKER_INDEX_LABEL) == 0:
            entry["leader"] = pod.get("name")
        else:
            entry["workers"].append(pod.get("name"))
    return [groups[k] for k in sorted(groups, key=lambda g: (g is None, g or 0))]


# ----------------------------------------------------------------------------------------------------------------
# Cluster reads (a kubernetes.client.ApiClient; the kubernetes library is imported only here)

def api_error(what, exc, field):
    """A SpecDecodingError carrying the API server's own message (a 403 names the user, the verb and the resource)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError  # pylint: disable=import-outside-toplevel
    hint = "grant the verb on the resource named above (docs/rbac.md lists the rules each playbook needs)" if getattr(exc, "status", None) == 403 else None
    return SpecDecodingError("%s failed: %s" % (what, k8s_pods.api_error_message(exc)), field=field, hint=hint)


def _custom_api(api_client):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import CustomObjectsApi  # pylint: disable=import-outside-toplevel
    return CustomObjectsApi(api_client)


def get(api_client, namespace, name, version=DEFAULT_API_VERSION):
    """The LLMInferenceService as a dict; ValidationError naming it when it does not exist."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
    try:
        return _custom_api(api_client).get_namespaced_custom_object(GROUP, version, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            raise ValidationError("LLMInferenceService %s/%s not found" % (namespace, name), field="name",
                                  hint="check name and namespace (kubectl get llminferenceservices -n %s)" % namespace) from exc
        raise api_error("reading LLMInferenceService %s/%s" % (namespace, name), exc, "name") from exc


def read_presets(api_client, obj, system_namespace="kserve", version=DEFAULT_API_VERSION, config_prefix=WELL_KNOWN_PREFIX,
                 well_known=True, unreadable=None):
    """The LLMInferenceServiceConfig objects KServe's controller merges into ``obj``: those its spec.baseRefs name and
    (``well_known``) the well-known presets for its shape (well_known_presets), each looked up in the object's namespace
    first and then in KServe's system namespace, as the controller's getConfig does. Missing ones are left out (the
    controller reports them as PresetsCombined=False, ConfigNotFound). Returns ``{name: object}``.

    A well-known preset the caller may not read (403, e.g. no rights in KServe's namespace) is left out and its
    ``namespace/name`` appended to ``unreadable``: the engine line on the pods still proves what runs. A baseRefs
    preset the caller may not read is an error: the resource names it, so its flags cannot be guessed."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError  # pylint: disable=import-outside-toplevel
    api = _custom_api(api_client)
    namespace = obj["metadata"]["namespace"]
    out = {}

    def fetch(name, named_by_resource):
        forbidden = []
        for ns in (namespace, system_namespace):
            try:
                out[name] = api.get_namespaced_custom_object(GROUP, version, ns, CONFIG_PLURAL, name)
                return
            except ApiException as exc:
                if exc.status == 403 and not named_by_resource:
                    forbidden.append("%s/%s" % (ns, name))
                    continue
                if exc.status == 403:
                    raise SpecDecodingError("may not read the %s %s/%s that spec.baseRefs names" % (CONFIG_KIND, ns, name),
                                            field="spec.baseRefs", hint="grant get on llminferenceserviceconfigs in %s" % ns) from exc
                if exc.status != 404:
                    raise
        if unreadable is not None:
            unreadable.extend(forbidden)

    refs = [(ref or {}).get("name") for ref in ((obj.get("spec") or {}).get("baseRefs") or [])]
    for name in refs:
        if name and name not in out:
            fetch(name, True)
    if well_known:
        base_specs = [(out[n].get("spec") or {}) for n in refs if n in out]
        for name in well_known_presets(obj, base_specs, config_prefix):
            if name not in out:
                fetch(name, False)
    return out


def env_configmap_refs(obj, presets=None, config_prefix=WELL_KNOWN_PREFIX):
    """The ``(ConfigMap name, key, optional)`` pairs the merged pods read VLLM_ADDITIONAL_ARGS from (valueFrom
    configMapKeyRef), in every pool and layer that owns the variable after the merge."""
    layers = preset_layers(obj, presets, config_prefix)
    out = []
    for info in POOLS.values():
        for entry in _effective_containers(layers, info["path"]).values():
            owner = entry["env"].get(ADDITIONAL_ARGS_ENV)
            if owner is None:
                continue
            ref = env_ref((entry["layers"][owner[0]].get("env") or [])[owner[1]])
            if ref and ref["kind"] == "ConfigMap" and (ref["name"], ref["key"], ref["optional"]) not in out:
                out.append((ref["name"], ref["key"], ref["optional"]))
    return out


def read_env_sources(api_client, obj, presets=None, config_prefix=WELL_KNOWN_PREFIX):
    """The values of the ConfigMap keys VLLM_ADDITIONAL_ARGS comes from (env_configmap_refs), read in the object's
    namespace (where its pods run): ``{(name, key): {"value": str or None, "reason": str or None}}``. A missing ConfigMap
    or key gives the value "" (the pod then has no such variable, or does not start: no flag can come from it); a read
    that fails otherwise (e.g. forbidden) gives None and the reason. Secrets are never read."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import CoreV1Api  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    namespace = obj["metadata"]["namespace"]
    out, cache = {}, {}
    for name, key, _optional in env_configmap_refs(obj, presets, config_prefix):
        if name not in cache:
            try:
                cache[name] = (CoreV1Api(api_client).read_namespaced_config_map(name, namespace).data or {}, None)
            except ApiException as exc:
                cache[name] = ({}, None) if exc.status == 404 else (None, k8s_pods.api_error_message(exc))
        data, reason = cache[name]
        out[(name, key)] = {"value": None, "reason": reason} if data is None else {"value": data.get(key) or "", "reason": None}
    return out


def expected_per_pool(found_flags, pools, expected=None):
    """What each pool's engine line must say: the pool's flag (or the given ``expected``) where it has one, no
    speculative decoding where it has none."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log  # pylint: disable=import-outside-toplevel
    out = {}
    for pool in pools:
        mine = [f for f in found_flags if f["pool"] == pool]
        if expected and expected.get("enabled") is False:
            out[pool] = dict(expected)  # after a rollback: no pool may run speculative decoding
        elif not mine:
            out[pool] = {"enabled": False}
        elif expected:
            out[pool] = dict(expected)
        elif mine[0]["config"] is not None:
            out[pool] = engine_log.expected_from_flag(mine[0]["config"])
        else:
            out[pool] = {"enabled": True}
    return out


def data_parallel(obj, pool):
    spec = (obj or {}).get("spec") or {}
    par = (spec.get("prefill") or {}).get("parallelism") if pool.startswith("prefill") else spec.get("parallelism")
    par = par or {}
    return int(par.get("data") or 1) * int(par.get("dataLocal") or 1)


def _flag_pool(obj, pool, presets, multi):
    """Which pod template's flag a pool's engine runs: the leader's (spec.template / spec.prefill.template), or, in a
    LeaderWorkerSet without a leader template, the worker template (the LWS controller then starts leaders from it)."""
    if not multi:
        return pool
    path = POOLS[pool]["path"]
    if any(_dig(layer, path) is not None for layer in _layers(obj, presets)):
        return pool
    return "worker" if pool == "decode" else "prefill_worker"


def _read_engine_lines(api_client, namespace, pods, container, timeout):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError  # pylint: disable=import-outside-toplevel
    out = []
    for pod in pods:
        res = {"name": pod["name"], "found": False, "speculative_config": None, "vllm_version": None, "error": None}
        labels = pod.get("labels") or {}
        if LWS_WORKER_INDEX_LABEL in labels:
            res.update(group=_index(labels, LWS_GROUP_INDEX_LABEL), worker_index=_index(labels, LWS_WORKER_INDEX_LABEL),
                       role="leader" if _index(labels, LWS_WORKER_INDEX_LABEL) == 0 else "worker")
        try:
            result = engine_log.scan_chunks(k8s_pods.stream_pod_log(api_client, namespace, pod["name"], container=container,
                                                                    timeout=timeout))
            res.update(found=result["found"], speculative_config=result["speculative_config"], vllm_version=result["vllm_version"])
        except SpecDecodingError as exc:
            res["error"] = str(exc)
        out.append(res)
    return out


def engine_report(api_client, obj, expected=None, container=MAIN_CONTAINER, timeout=60, presets=None):
    """Read the engine-config line of every pod of every pool and compare each pool with what it must run.

    Single-node pools (a Deployment): every pod logs the line, except that with data parallelism (spec.parallelism.data x
    dataLocal > 1) vLLM 0.24+ logs it on data-parallel rank 0 only: the pool passes when one pod logged it and no pod
    contradicts it. Multi-node pools (a LeaderWorkerSet, spec.worker): the leader of each group runs the engine core of
    rank 0 (and the API server) and must log the line; workers (Ray / multiprocessing workers, ``--headless``
    data-parallel ranks) are expected silent, and a worker that does log it must agree. ``engine_pod`` names the pod
    whose line counts, ``groups`` (multi-node) the leader and workers of each group and which pod logged the line.
    Returns ``(report, problems)``; problems are the reasons the check failed (empty: passed)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    found_flags = flags(obj, presets)
    pools = pools_of(obj, presets)
    multi = {pool: multi_node(obj, pool, presets) for pool in pools}
    mapped = []
    for pool in pools:
        source = _flag_pool(obj, pool, presets, multi[pool])
        mapped += [dict(f, pool=pool) for f in found_flags if f["pool"] == source]
    want = expected_per_pool(mapped, pools, expected)
    report, problems = {}, []
    for pool in pools:
        selector = pod_selector(name, pool, multi_node=multi[pool])
        pods, skipped = k8s_pods.list_pods(api_client, namespace, selector)
        workload = {"kind": LWS_KIND if multi[pool] else "Deployment",
                    "name": lws_name(name, pool) if multi[pool] else deployment_name(name, pool)}
        entry = {"expected": want[pool], "flag": [f["source"] for f in mapped if f["pool"] == pool], "workload": workload,
                 "pods": [], "skipped_pods": [p["name"] for p in skipped], "engine_pod": None, "speculative_config": None,
                 "vllm_version": None, "differences": [], "data_parallel": data_parallel(obj, pool)}
        report[pool] = entry
        if not pods:
            problems.append("pool %s: no pods (selector %s)" % (pool, selector))
            continue
        entry["pods"] = _read_engine_lines(api_client, namespace, pods, container, timeout)
        entry["engine_pod"] = rank0_pod(entry["pods"])
        counted = next((p for p in entry["pods"] if p["name"] == entry["engine_pod"]), None)
        if counted:
            entry["speculative_config"] = counted["speculative_config"]
            entry["vllm_version"] = counted["vllm_version"]
        if multi[pool]:
            _check_groups(pool, entry, pods, container, problems)
        else:
            # vLLM 0.24+ with data parallelism: only rank 0 logs the line, so the other pods' silence is expected
            rank0_only = bool(entry["data_parallel"] > 1 and counted and
                              spec_core.parse_version(counted["vllm_version"] or "0") >= (0, 24, 0))
            for pod in entry["pods"]:
                if pod["error"]:
                    problems.append("pool %s pod %s: %s" % (pool, pod["name"], pod["error"]))
                elif not pod["found"] and not rank0_only:
                    problems.append("pool %s pod %s: no engine-config line in container %s" % (pool, pod["name"], container))
        for pod in entry["pods"]:
            if pod["found"]:
                diffs, _notes = engine_log.compare_expected(pod["speculative_config"], want[pool])
                entry["differences"] += ["pod %s: %s" % (pod["name"], d) for d in diffs]
        problems += ["pool %s %s" % (pool, d) for d in entry["differences"]]
    return report, problems


def _check_groups(pool, entry, pods, container, problems):
    """Multi-node: each group's leader must have logged the line; workers may be silent."""
    by_name = {p["name"]: p for p in entry["pods"]}
    entry["groups"] = []
    for group in lws_groups(pods):
        leader = by_name.get(group["leader"]) if group["leader"] else None
        logged = [n for n in ([group["leader"]] if group["leader"] else []) + group["workers"] if by_name[n]["found"]]
        entry["groups"].append(dict(group, engine_pod=group["leader"] if leader and leader["found"] else None, logged_by=logged))
        if leader is None:
            problems.append("pool %s group %s: no leader pod (worker index 0) running" % (pool, group["group"]))
        elif leader["error"]:
            problems.append("pool %s group %s leader pod %s: %s" % (pool, group["group"], leader["name"], leader["error"]))
        elif not leader["found"]:
            problems.append("pool %s group %s leader pod %s: no engine-config line in container %s (the leader runs "
                            "data-parallel rank 0 and the API server)" % (pool, group["group"], leader["name"], container))
        for worker in group["workers"]:
            if by_name[worker]["error"]:
                problems.append("pool %s group %s worker pod %s: %s" % (pool, group["group"], worker, by_name[worker]["error"]))


def lws_rollout_pending(lws, pool="decode"):
    """Why a LeaderWorkerSet (a dict) has not finished rolling out to its current spec, or None.

    From the LWS controller's status (sigs.k8s.io/lws ``updateConditions``): ``observedGeneration`` (newer releases; else
    the conditions' own observedGeneration when set) caught up with metadata.generation; no ``UpdateInProgress=True``;
    ``updatedReplicas`` (groups whose leader and workers run the current revision) and ``readyReplicas`` reach
    spec.replicas, ``replicas`` (groups created) does not exceed it (no surge or leftover group); ``Available=True``.
    Like a Deployment's Available, LWS's Available stays True on the old groups until the controller has seen the edit,
    so the generation check comes first; an LWS release that reports neither generation cannot be told apart from a
    stale status right after an edit (then the counts decide)."""
    meta, spec, status = lws.get("metadata") or {}, lws.get("spec") or {}, lws.get("status") or {}
    name = meta.get("name")
    conds = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    if observed is None:
        seen = [int(c["observedGeneration"]) for c in conds.values() if c.get("observedGeneration")]
        observed = max(seen) if seen else None
    if observed is not None and generation is not None and int(observed) < int(generation):
        return "pool %s: LeaderWorkerSet %s not observed at generation %s yet" % (pool, name, generation)
    want = 1 if spec.get("replicas") is None else int(spec["replicas"])
    updated, ready, total = int(status.get("updatedReplicas") or 0), int(status.get("readyReplicas") or 0), int(status.get("replicas") or 0)
    in_progress = str((conds.get("UpdateInProgress") or {}).get("status")) == "True"
    if in_progress or updated < want or ready < want or total > want:
        return "pool %s: LeaderWorkerSet %s rolling out (%d of %d groups updated, %d ready, %d created%s)" % (
            pool, name, updated, want, ready, total, ", UpdateInProgress" if in_progress else "")
    available = conds.get("Available") or {}
    if str(available.get("status")) != "True":
        return "pool %s: LeaderWorkerSet %s not Available (%s)" % (pool, name, available.get("reason") or "no Available condition yet")
    return None


def rollout_pending(api_client, obj, presets=None):
    """Why the pools' workloads have not finished rolling out to the current spec, or None.

    KServe's controller marks a pool ready from its Deployment's (or, multi-node, its LeaderWorkerSet's) Available
    condition, which stays True on the old pods during a rolling update: Ready at the current generation alone does not
    mean the new pods run. A Deployment is done as `kubectl rollout status` says (observedGeneration caught up, every
    replica updated and available, no old one left); a LeaderWorkerSet as ``lws_rollout_pending`` says."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import AppsV1Api  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    for pool in pools_of(obj, presets):
        if multi_node(obj, pool, presets):
            try:
                lws = _custom_api(api_client).get_namespaced_custom_object(
                    LWS_GROUP, LWS_VERSION, namespace, LWS_PLURAL, lws_name(name, pool))
            except ApiException as exc:
                if exc.status == 404:
                    return "pool %s: LeaderWorkerSet %s does not exist yet" % (pool, lws_name(name, pool))
                raise api_error("reading LeaderWorkerSet %s/%s (the pool's rollout)" % (namespace, lws_name(name, pool)), exc,
                                "name") from exc
            why = lws_rollout_pending(lws, pool)
            if why:
                return why
            continue
        dep_name = deployment_name(name, pool)
        try:
            dep = AppsV1Api(api_client).read_namespaced_deployment(dep_name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return "pool %s: Deployment %s does not exist yet" % (pool, dep_name)
            raise api_error("reading Deployment %s/%s (the pool's rollout)" % (namespace, dep_name), exc, "name") from exc
        want = dep.spec.replicas if dep.spec.replicas is not None else 1
        st = dep.status
        if (st.observed_generation or 0) < (dep.metadata.generation or 0):
            return "pool %s: Deployment %s not observed at generation %s yet" % (pool, dep_name, dep.metadata.generation)
        updated, total, available = st.updated_replicas or 0, st.replicas or 0, st.available_replicas or 0
        if updated < want or total > updated or available < updated:
            return "pool %s: Deployment %s rolling out (%d of %d updated, %d old, %d available)" % (
                pool, dep_name, updated, want, max(0, total - updated), available)
    return None


# ----------------------------------------------------------------------------------------------------------------
# Benchmark twin

# Router fields that name objects the twin would share with its source (KServe's router.go: routes given as refs are
# used as they are, an InferencePool ref is not reconciled per service), so the twin's URL could reach the candidate.
TWIN_SHARED_ROUTER_FIELDS = (("route", "http", "refs"), ("scheduler", "pool", "ref"))


def baseline_twin(obj, name=None, suffix=None, found_flags=None):
    """The manifest of the baseline twin of the LLMInferenceService ``obj`` (as read from the API server): the same
    spec under another name with every speculative flag of every pool removed token-exact (:func:`strip`), labelled and
    annotated as the InferenceService twin is (``bench_twin``).

    ``found_flags`` is what :func:`flags` found with the baseRefs presets (``llmisvc_speculative`` state=query returns
    it); without it only the resource's own flags are seen. Raises ValidationError, before anything is written, when the
    object runs no speculative flag (it already is a baseline), when a preset supplies the flag (the twin would inherit
    it), when a flag cannot be removed token-exact, or when the router names a shared HTTPRoute or InferencePool."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import baseline_twin as bench_twin  # pylint: disable=import-outside-toplevel
    if not isinstance(obj, dict) or obj.get("kind") not in (None, KIND) or not isinstance(obj.get("spec"), dict):
        raise ValidationError("is not an LLMInferenceService with a spec", field="candidate",
                              hint="pass the LLMInferenceService as read from the cluster (llmisvc_speculative's resource)")
    meta = obj.get("metadata") or {}
    source = meta.get("name")
    if not source:
        raise ValidationError("has no metadata.name", field="candidate", hint="pass the LLMInferenceService as read from the cluster")
    found = flags(obj) if found_flags is None else list(found_flags)
    if not found:
        raise ValidationError("LLMInferenceService %s carries no speculative flag in any pool, so it already is a baseline" % source,
                              field="candidate", hint="benchmark it as the baseline (benchmark_baseline_name) instead of deploying "
                                                      "a twin, or name the speculative-decoding LLMInferenceService")
    foreign = [f for f in found if f.get("source", "resource") != "resource"]
    if foreign:
        raise ValidationError("the speculative flag of pool %s comes from the preset %s, which the twin would inherit (same "
                              "spec.baseRefs), so the twin would not be a baseline" % (foreign[0]["pool"], foreign[0]["source"]),
                              field="spec.baseRefs", hint="deploy a baseline LLMInferenceService without that preset and benchmark "
                                                          "it as benchmark_baseline_name")
    router = obj["spec"].get("router") or {}
    for path in TWIN_SHARED_ROUTER_FIELDS:
        node = router
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node:
            raise ValidationError("names an object the twin would share with %s, so the twin's URL could reach the candidate's "
                                  "pods" % source, field="spec.router." + ".".join(path),
                                  hint="deploy a baseline LLMInferenceService with its own route and benchmark it as "
                                       "benchmark_baseline_name, or give benchmark_baseline_url")
    patch, _changes = strip(obj)
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch  # pylint: disable=import-outside-toplevel
    stripped = isvc_patch.apply_patch(obj, patch)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in bench_twin.DROPPED_ANNOTATIONS}
    namespace = meta.get("namespace")
    annotations[bench_twin.TWIN_OF_ANNOTATION] = "%s/%s" % (namespace, source) if namespace else source
    labels = dict(meta.get("labels") or {})
    labels[bench_twin.TWIN_LABEL] = "true"
    twin_meta = {"name": bench_twin.twin_name(source, name, suffix or bench_twin.DEFAULT_SUFFIX), "labels": labels,
                 "annotations": annotations}
    if namespace:
        twin_meta["namespace"] = namespace
    return {"apiVersion": obj.get("apiVersion") or "%s/%s" % (GROUP, DEFAULT_API_VERSION), "kind": KIND,
            "metadata": twin_meta, "spec": copy.deepcopy(stripped["spec"])}
