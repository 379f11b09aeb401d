# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight of a draft against its target (module draft_preflight_info, the deploy's preflight task): where the
checkpoints are, their small metadata files read (artifacts/model_metadata.py), the pair checked as the vLLM release does
(vllm/draft_preflight.py)."""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import model_metadata
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import draft_preflight, speculative_config


def summary(result):
    if result.get("skipped"):
        return "preflight %s: skipped (%s)" % (result["method"], result["skipped"])
    state = "passed" if result["passed"] else "REFUSED" if result["mode"] == "require" else "failed (warn only)"
    return "preflight %s: %s (%d checks, %d warnings)" % (result["method"], state, len(result["checks"]), len(result["warnings"]))


def preflight(params, hide=None):
    """Module draft_preflight_info's work as a function of its parameters: the locations (given, or found in the deploy's
    variables), their metadata read, the checks of vllm/draft_preflight.py run and enforced by ``preflight`` (require|warn|off)."""
    mode = params["preflight"]
    method = draft_preflight.normalized_method(params["method"], None)
    base = {"method": method, "mode": mode, "skipped": None, "sources": {}, "checks": [], "figures": {}, "errors": [],
            "warnings": [], "passed": True, "num_speculative_tokens": (params["speculative"] or {}).get("num_speculative_tokens"),
            "rules_from_vllm": draft_preflight.RULES_RELEASE}
    if mode == "off":
        base["skipped"] = "preflight: off"
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
    if registry["password"] and hide is not None:
        hide(registry["password"])
    wanted = [("target", params["target"], params["target_subdir"])]
    if method != "mtp" or params["draft"]:
        wanted.append(("draft", params["draft"], params["draft_subdir"]))
    read = {}
    for role, location, subdir in wanted:
        if not location and deploy is not None:
            # the deploy's render refuses a method without its draft, naming the inventory variable: said there, not here
            base["skipped"] = "no %s location in the deploy's variables" % role
            return base
        if not location:
            raise ValidationError("no %s location given for method %s" % (role, method), field=role,
                                  hint="give the %s's directory, http(s) URL, hf:// or oci:// image, or set preflight: off" % role)
        kind = model_metadata.location_kind(location)
        if kind not in model_metadata.READABLE:
            base["skipped"] = "the %s is a %s location (%s), which the preflight does not read yet" % (role, kind, location)
            return base
        try:
            read[role] = model_metadata.read_location(location, air_gapped=params["air_gapped"], hf_endpoint=params["hf_endpoint"],
                                                      subdir=subdir, registry=registry, field=role)
        except model_metadata.MetadataUnreadable as exc:
            # The check could not run: said so, and it does not stop the rollout (the pods may reach what this host cannot).
            base["warnings"].append("preflight not run, the rollout goes on: %s" % exc)
            base["skipped"] = str(exc)
            return base
        base["sources"][role] = {"location": location, "files_read": read[role]["files_read"],
                                 "layers_read": read[role].get("layers_read")}
    result = draft_preflight.run(params["method"], read.get("target"), read.get("draft"), params["speculative"], params["vllm_version"])
    result.update(mode=mode, skipped=None, sources=base["sources"])
    result["warnings"] = draft_preflight.enforce(result, mode)
    return result
