# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight of a draft against its target (module draft_preflight_info, the deploy's preflight task): where the
checkpoints are, their small metadata files read (artifacts/model_metadata.py), the pair checked as the vLLM release does
(vllm/draft_preflight.py)."""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import model_metadata
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import cluster as llmisvc_cluster
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_preflight_live, draft_preflight_pvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import draft_preflight, speculative_config


def summary(result):
    if result.get("skipped"):
        return "preflight %s: skipped (%s)" % (result["method"], result["skipped"])
    state = "passed" if result["passed"] else "REFUSED" if result["mode"] == "require" else "failed (warn only)"
    return "preflight %s: %s (%d checks, %d warnings)" % (result["method"], state, len(result["checks"]), len(result["warnings"]))


def _checkpoint_figures(fig):
    """``LlamaForCausalLM: layers 32, hidden 4096, vocabulary 128256`` and the head's extra figures."""
    fig = fig or {}
    parts = ["layers %s" % fig.get("num_hidden_layers"), "hidden %s" % fig.get("hidden_size"), "vocabulary %s" % fig.get("vocab_size")]
    for key, label in (("draft_vocab_size", "draft vocabulary"), ("aux_layer_ids", "aux layers"), ("trained_k", "trained k")):
        if fig.get(key) is not None:
            parts.append("%s %s" % (label, fig[key]))
    return "%s: %s" % (fig.get("architecture") or fig.get("model_type") or "?", ", ".join(parts))


def report(result):
    """What verify's summary and the troubleshooting bundle show of a preflight result: the summary line, the figures
    of target and draft (layers, hidden sizes, vocabulary sizes, aux layers, trained k, MTP layers), what was read
    where, and each check that did not pass with its message. A list of lines."""
    if not result:
        return ["preflight: not recorded"]
    lines = [summary(result)]
    if result.get("skipped"):
        return lines
    figures = result.get("figures") or {}
    for role in ("target", "draft"):
        if figures.get(role):
            source = (result.get("sources") or {}).get(role) or {}
            where = " (%s)" % source["location"] if source.get("location") else ""
            lines.append("  %s%s - %s" % (role, where, _checkpoint_figures(figures[role])))
    mtp = figures.get("target_mtp")
    if mtp:
        lines.append("  target MTP layers: %s (%s, %s)" % (mtp.get("mtp_layers"), mtp.get("family"), mtp.get("key")))
    if result.get("num_speculative_tokens") is not None:
        lines.append("  num_speculative_tokens %s; rules of vLLM %s" % (result["num_speculative_tokens"], result.get("rules_from_vllm")))
    for check in result.get("checks") or []:
        if check.get("status") != "passed":
            lines.append("  %s %s: %s" % (check.get("status"), check.get("check"), check.get("message")))
    return lines


# draft_preflight_info's option defaults: a caller other than the module (the troubleshooting bundle) starts from them.
PARAM_DEFAULTS = {"target": None, "draft": None, "target_subdir": "target", "draft_subdir": "draft", "method": None, "name": None,
                  "speculative": {}, "deploy": None, "vllm_version": None, "preflight": "require", "air_gapped": False,
                  "hf_endpoint": None, "registry_username": None, "registry_password": None, "registry_auth_file": None,
                  "tls_verify": True, "ca_file": None, "s3_endpoint": None, "s3": {}, "namespace": "default", "pvc_image": None,
                  "pvc_job": True, "pvc_timeout": 120, "pvc_job_annotations": {}, "kind": "InferenceService",
                  "api_version": llmisvc_model.DEFAULT_API_VERSION, "config_namespace": "kserve"}


def _live_pair(params, connect, obj):
    """``(kind, name, pair)`` of the live object (``obj``, else read by ``params``' kind, namespace and name): an
    InferenceService's predictor, or an LLMInferenceService's decode pool after its presets' merge."""
    kind = (obj or {}).get("kind") or params.get("kind") or "InferenceService"
    namespace = params.get("namespace") or "default"
    version = params.get("api_version") or llmisvc_model.DEFAULT_API_VERSION
    if obj is None:
        obj = (llmisvc_cluster.get(connect(), namespace, params["name"], version) if kind == llmisvc_model.KIND
               else kube_service.service_of(connect()).inference_service(namespace, params["name"]))
    name = params.get("name") or (obj.get("metadata") or {}).get("name")
    if kind != llmisvc_model.KIND:
        return kind, name, draft_preflight_live.pair_of(obj)
    # the presets the controller merges (well-known and baseRefs) may carry the flag or the served path
    presets = llmisvc_cluster.read_presets(connect(), obj, system_namespace=params.get("config_namespace") or "kserve",
                                           version=version, unreadable=[]) if connect is not None else None
    return kind, name, draft_preflight_live.llmisvc_pair_of(obj, presets)


def preflight(params, hide=None, connect=None, isvc=None):
    """Module draft_preflight_info's work as a function of its parameters: the locations (given, or found in the deploy's
    variables), their metadata read, the checks of vllm/draft_preflight.py run and enforced by ``preflight`` (require|warn|off).
    ``connect()`` gives the API client for a pvc:// location (one read-only Job reads every one of them) and for ``name``
    (the live InferenceService or, with ``kind: LLMInferenceService``, the LLMInferenceService whose pair is checked:
    ops/draft_preflight_live.py), unless ``isvc`` gives the object already read."""
    params = dict(params)
    live = None
    live_kind = None
    if (params.get("name") or isvc is not None) and params["preflight"] != "off":
        live_kind, params["name"], live = _live_pair(params, connect, isvc)
        params.update(method=params.get("method") or live["method"], speculative=dict(live["speculative"], **(params.get("speculative") or {})),
                      target=params.get("target") or live["target"], draft=params.get("draft") or live["draft"],
                      target_subdir=live["target_subdir"], draft_subdir=live["draft_subdir"], deploy=None)
    mode = params["preflight"]
    method = draft_preflight.normalized_method(params["method"], None)
    base = {"method": method, "mode": mode, "skipped": None, "sources": {}, "checks": [], "figures": {}, "errors": [],
            "warnings": [], "passed": True, "num_speculative_tokens": (params["speculative"] or {}).get("num_speculative_tokens"),
            "rules_from_vllm": draft_preflight.RULES_RELEASE}
    if mode == "off":
        base["skipped"] = "preflight: off"
        return base
    if live is not None and live["skipped"]:
        base["skipped"] = "%s %s: %s" % (live_kind, params["name"], live["skipped"])
        return base
    if method in draft_preflight.NO_DRAFT_METHODS:
        result = draft_preflight.run(method, None, None, params["speculative"], params["vllm_version"])
        result.update(mode=mode, skipped=None, sources={})
        return result
    params = dict(params)
    deploy = params.get("deploy")
    if deploy is not None:
        found = model_metadata.sources_from_deploy(deploy.get("artifacts"), deploy.get("modelcar_build"), deploy.get("stage_items"),
                                                   bool(deploy.get("stage")))
        if not params["target"] and not params["draft"] and found["skipped"]:
            base["skipped"] = found["skipped"]
            return base
        params["target"] = params["target"] or found["target"]
        # mtp drafts with the target's own layers: a draft location of the deploy is not the MTP checkpoint
        params["draft"] = params["draft"] or (found["draft"] if method != "mtp" else None)
        params["target_subdir"], params["draft_subdir"] = found["target_subdir"], found["draft_subdir"]
        params["speculative"] = dict(speculative_config.PRESETS.get(method) or {}, **(params["speculative"] or {}))
        base["num_speculative_tokens"] = params["speculative"].get("num_speculative_tokens")
    registry = {"username": params["registry_username"], "password": params["registry_password"],
                "auth_file": params["registry_auth_file"], "tls_verify": params["tls_verify"], "ca_file": params["ca_file"]}
    for secret in (registry["password"], (params.get("s3") or {}).get("secret_access_key"), (params.get("s3") or {}).get("access_key_id")):
        if secret and hide is not None:
            hide(secret)
    wanted = [("target", params["target"], params["target_subdir"])]
    if method != "mtp" or params["draft"]:
        wanted.append(("draft", params["draft"], params["draft_subdir"]))
    read = {}
    on_pvc = {role: location for role, location, _subdir in wanted if location and model_metadata.location_kind(location) == "pvc"}
    for role, location, subdir in wanted:
        if not location and deploy is not None:
            # the deploy's render refuses a method without its draft, naming the inventory variable: said there, not here
            base["skipped"] = "no %s location in the deploy's variables" % role
            return base
        if not location:
            raise ValidationError("no %s location given for method %s" % (role, method), field=role,
                                  hint="give the %s's directory, http(s) URL, hf://, s3://, pvc:// or oci:// image, or set preflight: off" % role)
        kind = model_metadata.location_kind(location)
        if kind == "pvc" and not params.get("pvc_job", True):
            # a GitOps render or a --check run writes nothing to the cluster, not even a short Job
            base["skipped"] = "the %s is on a PVC (%s), which only a Job can read, and none is started (%s)" % (
                role, location, params.get("pvc_job_off_reason") or "pvc_job: false; a GitOps render writes nothing to the cluster")
            return base
        if kind not in model_metadata.READABLE:
            base["skipped"] = "the %s is a %s location (%s), which the preflight does not read yet" % (role, kind, location)
            return base
        try:
            if role in on_pvc and role not in read:
                read.update(draft_preflight_pvc.read_pvc_locations(
                    connect, params.get("namespace") or "default", on_pvc, params.get("pvc_image"),
                    timeout=params.get("pvc_timeout") or 120, air_gapped=params["air_gapped"], annotations=params.get("pvc_job_annotations")))
            elif role not in read:
                read[role] = model_metadata.read_location(location, air_gapped=params["air_gapped"], hf_endpoint=params["hf_endpoint"],
                                                          subdir=subdir, registry=registry, field=role, s3_endpoint=params.get("s3_endpoint"),
                                                          s3=params.get("s3"))
        except draft_preflight_pvc.NothingOnTheClaim as exc:
            base["skipped"] = model_metadata.plain(exc)
            return base
        except model_metadata.MetadataUnreadable as exc:
            # The check could not run: said so, and it does not stop the rollout (the pods may reach what this host cannot).
            base["warnings"].append("preflight not run, the rollout goes on: %s" % exc)
            base["skipped"] = str(exc)
            return base
        base["sources"][role] = {"location": location, "files_read": read[role]["files_read"],
                                 "layers_read": read[role].get("layers_read")}
        if read[role].get("job"):
            base["sources"][role]["job"] = read[role]["job"]
    result = draft_preflight.run(params["method"], read.get("target"), read.get("draft"), params["speculative"], params["vllm_version"])
    result.update(mode=mode, skipped=None, sources=base["sources"])
    result["warnings"] = draft_preflight.enforce(result, mode)
    return result
