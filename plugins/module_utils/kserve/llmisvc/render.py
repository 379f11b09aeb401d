# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render an LLMInferenceService (v1alpha1 or v1alpha2) with vLLM speculative decoding: the artifacts in ``spec.model.uri``,
the ``main`` container's command, the fields one API version has and the other has not.

Plain Python, no Ansible imports. What KServe does with the object is in ``model.py``'s docstring.
"""

from __future__ import annotations

import copy

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import crd_rules, storage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as spec_core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import per_request_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc.model import (
    GROUP, KIND, MAIN_CONTAINER, ONLY_IN, PARALLELISM_KEYS, check_api_version,
)

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
    # KServe's LLMInferenceService controller takes fewer schemes than the InferenceService's (kserve/storage.py).
    return isvc.resolve_artifacts(mode, art, needs_draft, (0, 20, 0), storage.oci_mode_of(p), kind=KIND, method=p.get("method"))


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
    Returns the same keys as ``isvc.render``. Every refusal is raised before anything is written, the CEL rules of the
    LLMInferenceService CRD (``crd_rules.check``) last.
    """
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
    per_request = per_request_metrics.resolve(p.get("per_request_metrics"), p.get("vllm_version"), spec, extra)
    q = dict(p, served_model_name=served, gpu_memory_utilization=gmu, extra_args=extra, per_request_args=per_request["args"])
    args = isvc.server_args(q, artifacts.target_path, spec)
    plain = isvc.server_args(q, artifacts.target_path, None)
    warnings += spec_core.check_command(args, vllm_version=p.get("vllm_version"), config=spec.config if spec else None, field="extra_args",
                                        data_parallel_size=parallelism.get("data", 1) * parallelism.get("dataLocal", 1))
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
    annotations, labels = isvc.metadata_maps({isvc.MODEL_REPO_ANNOTATION: (p["model_repo"], "model_repo")} if p.get("model_repo") else {},
                                             p.get("annotations"), p.get("labels"))
    metadata = {"name": p["name"], "namespace": p["namespace"], "labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    manifest = {"apiVersion": "%s/%s" % (GROUP, version), "kind": KIND, "metadata": metadata, "spec": spec_body}
    # existing (the object on the cluster) only feeds the CRD's transition rules: an LLMInferenceService has no deploymentMode to keep.
    cel_rules = crd_rules.check(manifest, p.get("kserve_crds"), existing=existing,
                                kserve_version=spec_core.parse_version(p["kserve_version"]) if p.get("kserve_version") else None)
    warnings.extend(cel_rules["warnings"])
    return {"manifest": manifest, "speculative": spec, "artifacts": artifacts, "warnings": warnings, "runtime_check": None,
            "cel_rules": cel_rules, "per_request_metrics": {k: v for k, v in per_request.items() if k != "args"}}


def manifest_filename(manifest):
    meta = manifest["metadata"]
    return "%s-%s.llmisvc.yaml" % (meta["namespace"], meta["name"])
