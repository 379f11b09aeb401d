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
* Readiness (``pkg/apis/serving/v1alpha2/llm_inference_service_lifecycle.go``): a Knative living condition set
  over ``PresetsCombined``, ``WorkloadsReady`` and ``RouterReady``; ``WorkloadsReady`` rolls up
  ``MainWorkloadReady``, ``WorkerWorkloadReady``, ``PrefillWorkloadReady``, ``PrefillWorkerWorkloadReady``,
  ``ScalingReady``, ``PrefillScalingReady`` (absent ones are skipped, the first False wins); ``Ready`` is True
  when the three are True. ``status.observedGeneration`` says which generation the conditions describe.
"""

from __future__ import annotations

import copy

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils import isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils import speculative_config as spec_core
from ansible_collections.alauda.spec_decoding.plugins.module_utils import vllm_command

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
# Flag spellings a leftover search looks for after a strip (a flag inside a quoted string, e.g. eval "...").
_FLAG_WORDS = ("--speculative-config", "--speculative_config", "--spec-method", "--spec_method", "--spec-model",
               "--spec_model", "--spec-tokens", "--spec_tokens")


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


def pod_selector(name, pool):
    """Label selector of a pool's pods, as KServe's controller labels them."""
    return "app.kubernetes.io/component=%s,app.kubernetes.io/name=%s,app.kubernetes.io/part-of=llminferenceservice" % (
        POOLS[pool]["component"], name)


def deployment_name(name, pool):
    return name + ("-kserve-prefill" if pool.startswith("prefill") else "-kserve")


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


def container_flags(container):
    """The speculative flags of one container: ``[{field, form, config}]`` for command/args and VLLM_ADDITIONAL_ARGS,
    plus ``unstrippable`` (a flag spelling the token-exact editor does not see as a shell word, e.g. inside eval "...")."""
    found = []
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    occ = vllm_command.find_occurrences(command) + vllm_command.find_occurrences(args)
    if occ:
        found.append({"field": "command/args", "forms": sorted({o.form for o in occ}), "occurrences": occ})
    env_occ = []
    for index, item in enumerate(container.get("env") or []):
        if isinstance(item, dict) and item.get("name") == ADDITIONAL_ARGS_ENV and isinstance(item.get("value"), str):
            words = vllm_command._script_occurrences(item["value"], 0) or []  # pylint: disable=protected-access
            if words:
                env_occ.extend(words)
                found.append({"field": "env[%d] %s" % (index, ADDITIONAL_ARGS_ENV), "forms": ["env"], "occurrences": words})
    stripped_cmd = vllm_command.strip_speculative_config(command) or []
    stripped_args = vllm_command.strip_speculative_config(args) or []
    env_values = [vllm_command.strip_script(e.get("value")) for e in container.get("env") or []
                  if isinstance(e, dict) and e.get("name") == ADDITIONAL_ARGS_ENV and isinstance(e.get("value"), str)]
    unstrippable = _leftover(stripped_cmd + stripped_args + env_values)
    return found, unstrippable


def flags(obj, presets=None):
    """Per pool and container: where a speculative flag is (the resource's own, or a baseRefs preset's that the resource
    does not override). Returns ``[{pool, container, source, field, forms, config, error, unstrippable}]``."""
    spec = (obj or {}).get("spec") or {}
    out = []
    for pool, info in POOLS.items():
        podspec = _dig(spec, info["path"])
        own = {c.get("name"): c for c in (podspec or {}).get("containers") or [] if isinstance(c, dict)}
        for cname, container in own.items():
            found, unstrippable = container_flags(container)
            for entry in found:
                out.append(_entry(pool, cname, "resource", entry, unstrippable))
            if unstrippable and not found:
                out.append({"pool": pool, "container": cname, "source": "resource", "field": "command/args", "forms": [],
                            "config": None, "error": None, "unstrippable": unstrippable})
        for ref in spec.get("baseRefs") or []:
            preset = (presets or {}).get((ref or {}).get("name"))
            pspec = _dig((preset or {}).get("spec") or {}, info["path"])
            for container in (pspec or {}).get("containers") or []:
                cname = container.get("name")
                mine = own.get(cname) or {}
                # What of the preset survives the merge: a command/args list the resource sets replaces the preset's
                # (strategic merge replaces lists without a merge key); an env variable of the same name replaces it.
                mine_env = {e.get("name") for e in mine.get("env") or [] if isinstance(e, dict)}
                effective = {key: container[key] for key in ("command", "args") if key in container and key not in mine}
                effective["env"] = [e for e in container.get("env") or [] if isinstance(e, dict) and e.get("name") not in mine_env]
                found = container_flags(effective)[0]
                for entry in found:
                    out.append(_entry(pool, cname, "%s/%s" % (CONFIG_KIND, ref.get("name")), entry, []))
    return out


def _entry(pool, cname, source, entry, unstrippable):
    config, error = None, None
    try:
        config = vllm_command.config_from_occurrences(entry["occurrences"], field="%s %s" % (pool, cname))
    except ValidationError as exc:
        error = str(exc)
    return {"pool": pool, "container": cname, "source": source, "field": entry["field"], "forms": entry["forms"],
            "config": config, "error": error, "unstrippable": unstrippable}


def strip(obj, presets=None):
    """Remove every speculative flag the resource itself carries, token-exact, in every pool and form.

    Returns ``(patch, changes)``: ``patch`` is a JSON patch (list of ops, each with a ``test`` of the old value first)
    or [] when there is nothing to strip; ``changes`` describes each edit. Refuses (ValidationError) when a baseRefs
    preset supplies the flag (the resource does not own it) or a flag sits where it cannot be removed token-exact."""
    found = flags(obj, presets)
    foreign = [f for f in found if f["source"] != "resource"]
    if foreign:
        f = foreign[0]
        raise ValidationError("the speculative flag of pool %s container %s comes from the preset %s (%s), which this "
                              "LLMInferenceService does not own; stripping the resource alone would leave it on" % (
                                  f["pool"], f["container"], f["source"], f["field"]), field="spec.baseRefs",
                              hint="remove the flag from that LLMInferenceServiceConfig (it is shared), or set the container's "
                                   "args / %s in the LLMInferenceService so they override the preset's" % ADDITIONAL_ARGS_ENV)
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


def pools_of(obj):
    """The pools an object runs (decode always; prefill when spec.prefill has a template)."""
    spec = (obj or {}).get("spec") or {}
    out = ["decode"]
    if _dig(spec, ("prefill", "template")) is not None:
        out.append("prefill")
    return out


def rank0_pod(pods):
    """With data parallelism (vLLM 0.24+) only local data-parallel rank 0 logs the engine line: the first pod (by name,
    as LeaderWorkerSet names the leader ``<group>-0``) that has the line wins; returns its name or None."""
    for pod in sorted(pods, key=lambda p: p.get("name") or ""):
        if pod.get("found"):
            return pod.get("name")
    return None


# ----------------------------------------------------------------------------------------------------------------
# Cluster reads (a kubernetes.client.ApiClient; the kubernetes library is imported only here)

def _custom_api(api_client):
    from kubernetes.client import CustomObjectsApi  # pylint: disable=import-outside-toplevel
    return CustomObjectsApi(api_client)


def get(api_client, namespace, name, version=DEFAULT_API_VERSION):
    """The LLMInferenceService as a dict; ValidationError naming it when it does not exist."""
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel
    try:
        return _custom_api(api_client).get_namespaced_custom_object(GROUP, version, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            raise ValidationError("LLMInferenceService %s/%s not found" % (namespace, name), field="name",
                                  hint="check name and namespace (kubectl get llminferenceservices -n %s)" % namespace) from exc
        raise


def read_presets(api_client, obj, system_namespace="kserve", version=DEFAULT_API_VERSION):
    """The LLMInferenceServiceConfig objects its spec.baseRefs name, looked up in the object's namespace first and then
    in KServe's system namespace, as KServe's config loader does. Missing ones are left out (the controller reports them
    as PresetsCombined=False, ConfigNotFound)."""
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel
    api = _custom_api(api_client)
    namespace = obj["metadata"]["namespace"]
    out = {}
    for ref in ((obj.get("spec") or {}).get("baseRefs") or []):
        name = (ref or {}).get("name")
        for ns in (namespace, system_namespace):
            try:
                out[name] = api.get_namespaced_custom_object(GROUP, version, ns, CONFIG_PLURAL, name)
                break
            except ApiException as exc:
                if exc.status != 404:
                    raise
    return out


def expected_per_pool(found_flags, pools, expected=None):
    """What each pool's engine line must say: the pool's flag (or the given ``expected``) where it has one, no
    speculative decoding where it has none."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils import engine_log  # pylint: disable=import-outside-toplevel
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


def engine_report(api_client, obj, expected=None, container=MAIN_CONTAINER, timeout=60, presets=None):
    """Read the engine-config line of every pod of every pool and compare each pool with what it must run.

    With data parallelism (spec.parallelism.data x dataLocal > 1), vLLM 0.24+ logs the line only on data-parallel rank
    0: a pool passes when one pod logged it and no pod contradicts it, and ``engine_pod`` names that pod.
    Returns ``(report, problems)``; problems are the reasons the check failed (empty: passed)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils import engine_log  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils import k8s_pods  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError  # pylint: disable=import-outside-toplevel
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    found_flags = flags(obj, presets)
    pools = pools_of(obj)
    want = expected_per_pool(found_flags, pools, expected)
    report, problems = {}, []
    for pool in pools:
        pods, skipped = k8s_pods.list_pods(api_client, namespace, pod_selector(name, pool))
        entry = {"expected": want[pool], "flag": [f["source"] for f in found_flags if f["pool"] == pool],
                 "pods": [], "skipped_pods": [p["name"] for p in skipped], "engine_pod": None, "speculative_config": None,
                 "vllm_version": None, "differences": [], "data_parallel": data_parallel(obj, pool)}
        report[pool] = entry
        if not pods:
            problems.append("pool %s: no pods (selector %s)" % (pool, pod_selector(name, pool)))
            continue
        for pod in pods:
            res = {"name": pod["name"], "found": False, "speculative_config": None, "vllm_version": None, "error": None}
            try:
                result = engine_log.scan_chunks(k8s_pods.stream_pod_log(api_client, namespace, pod["name"], container=container,
                                                                        timeout=timeout))
                res.update(found=result["found"], speculative_config=result["speculative_config"], vllm_version=result["vllm_version"])
            except SpecDecodingError as exc:
                res["error"] = str(exc)
            entry["pods"].append(res)
        logged = [p for p in entry["pods"] if p["found"]]
        entry["engine_pod"] = rank0_pod(entry["pods"])
        if logged:
            entry["speculative_config"] = logged[0]["speculative_config"]
            entry["vllm_version"] = logged[0]["vllm_version"]
        # vLLM 0.24+ with data parallelism: only rank 0 logs the line, so the other pods' silence is expected
        rank0_only = bool(entry["data_parallel"] > 1 and logged and spec_core.parse_version(logged[0]["vllm_version"] or "0") >= (0, 24, 0))
        for pod in entry["pods"]:
            if pod["error"]:
                problems.append("pool %s pod %s: %s" % (pool, pod["name"], pod["error"]))
            elif not pod["found"] and not rank0_only:
                problems.append("pool %s pod %s: no engine-config line in container %s" % (pool, pod["name"], container))
            elif pod["found"]:
                diffs, _notes = engine_log.compare_expected(pod["speculative_config"], want[pool])
                entry["differences"] += ["pod %s: %s" % (pod["name"], d) for d in diffs]
        problems += ["pool %s %s" % (pool, d) for d in entry["differences"]]
    return report, problems


def rollout_pending(api_client, obj):
    """Why the pools' Deployments have not finished rolling out to the current spec, or None.

    KServe's controller marks a pool ready from its Deployment's Available condition, which stays True on the old
    pods during a rolling update: Ready at the current generation alone does not mean the new pods run. Done means
    (as `kubectl rollout status`): observedGeneration caught up, every replica updated and available, no old one left."""
    from kubernetes.client import AppsV1Api  # pylint: disable=import-outside-toplevel
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    for pool in pools_of(obj):
        dep_name = deployment_name(name, pool)
        try:
            dep = AppsV1Api(api_client).read_namespaced_deployment(dep_name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return "pool %s: Deployment %s does not exist yet" % (pool, dep_name)
            raise
        want = dep.spec.replicas if dep.spec.replicas is not None else 1
        st = dep.status
        if (st.observed_generation or 0) < (dep.metadata.generation or 0):
            return "pool %s: Deployment %s not observed at generation %s yet" % (pool, dep_name, dep.metadata.generation)
        updated, total, available = st.updated_replicas or 0, st.replicas or 0, st.available_replicas or 0
        if updated < want or total > updated or available < updated:
            return "pool %s: Deployment %s rolling out (%d of %d updated, %d old, %d available)" % (
                pool, dep_name, updated, want, max(0, total - updated), available)
    return None
