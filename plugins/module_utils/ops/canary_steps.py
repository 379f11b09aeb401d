# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The canary_rollout module's steps (plan, check, render, apply) and the canary_observe_info module's window,
built on the canary's patch plans and decision in ``canary.py``.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import copy
import json
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import decision as bench_decision
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import http_target
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as spec_config
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary_git
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.rollback import crash_loop_check
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import canary_window


def check_confidence(value, field="confidence"):
    """How sure (0.5 to 1) a measured difference must be to count; outside that, a ValidationError."""
    value = analysis.DEFAULT_CONFIDENCE if value is None else value
    if not 0.5 <= value < 1:
        raise ValidationError("must be at least 0.5 and below 1, got %r" % (value,), field=field,
                              hint="e.g. 0.95: an unchanged engine fails the decision at most 5% of the time")
    return value


def plan_step(params, isvc, kserve_version):
    """(mode, patch, canary predictor) of the step, validated; nothing is written here."""
    mode = canary.check_mode(canary.deployment_mode(isvc), kserve_version)
    name = canary.check_canary_name(params["canary_name"])
    state = params["state"]
    spec = isvc.get("spec") or {}
    entry = next((c for c in spec.get("canary") or [] if (c.get("predictor") or {}).get("name") == name), None)
    canary_pred = None
    if params.get("speculative_config") is not None:
        json_text = spec_config.canonical_json(params["speculative_config"], vllm_version=params.get("vllm_version"))[0]
        if state == "present" and entry is None and canary.already_promoted(isvc, json.loads(json_text)):
            return mode, None, None  # a rerun after the promotion: the serving revision already runs this config
        stable = spec.get("predictor") or {}
        if mode == canary.KNATIVE and stable.get("canaryTrafficPercent") is not None:
            stable = canary.rollback_source(isvc)
        canary_pred = canary.canary_predictor(stable, json_text, name) if not (state != "present" and entry) else None
    if canary_pred is None and entry is not None:
        canary_pred = copy.deepcopy(entry["predictor"])
    if state == "present":
        percent = canary.check_percent(params.get("percent"))
        return mode, canary.step_patch(isvc, mode, percent, canary_pred), canary_pred
    if state == "promoted":
        if canary_pred is None and mode == canary.STANDARD:
            raise ValidationError("there is no canary %r to promote" % name, field="canary_name",
                                  hint="start the canary first (state: present), or give speculative_config to render the promotion")
        if mode == canary.KNATIVE:
            canary.check_knative_promotion(isvc)
        return mode, canary.promote_patch(isvc, mode, canary_pred), canary_pred
    return mode, canary.rollback_patch(isvc, mode, canary.rollback_source(isvc)), canary_pred


def check_step_params(params):
    """Refuse a percent that is not one of the steps, or out of range, before anything is read."""
    if params.get("steps"):
        plan = canary.check_steps(params["steps"])
        if params["state"] == "present" and params.get("percent") not in plan:
            raise ValidationError("percent %s is not one of the steps %s" % (params.get("percent"), plan), field="percent",
                                  hint="give one of the steps as the percent")
    if params["state"] == "present":
        canary.check_percent(params["percent"])


def render_step(params):
    """canary_rollout with a definition: the canary.manifest after the step; nothing is read or written."""
    isvc = params["definition"]
    mode, patch, _pred = plan_step(params, isvc, params.get("kserve_version"))
    patch = patch or {}
    out = canary.manifest(isvc, patch)
    selectors = canary.revision_selectors(out, mode, params["canary_name"]) if mode == canary.STANDARD else {}
    return dict(changed=False, manifest=out, patch=patch, mode=mode, selectors=selectors)


def apply_step(api_client, params, dry_run=False, diff=False, warn=None):
    """canary_rollout on the cluster: plan the step on the live InferenceService, write it - a merge patch (a server dry
    run with `dry_run`), or with write_mode git a commit the owner syncs (canary_git.write_step) - and, with wait, wait
    until the step has taken effect. Returns the module's result. A live step of an object Argo CD or Flux syncs is
    refused before the write (option gitops_owner); `warn(text)` gets the ignore warning."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import facts as kserve_facts  # pylint: disable=import-outside-toplevel
    ns, name = params["namespace"], params["name"]
    git = params.get("write_mode", canary_git.LIVE) == canary_git.GIT
    isvc = k8s_pods.get_inference_service(api_client, ns, name)
    version = params.get("kserve_version") or kserve_facts.kserve_release(api_client).get("kserve_version")
    mode, patch, _pred = plan_step(params, isvc, version)
    if patch is None:
        return dict(changed=False, already_promoted=True, mode=mode, resource=isvc, selectors={}, patch={},
                    manifest=canary.manifest(isvc, {}),
                    msg="%s/%s already serves this speculative config without a canary: nothing to do" % (ns, name))
    read = isvc
    before = canary.manifest(isvc, {})
    after = canary.manifest(isvc, patch)
    changed = before["spec"] != after["spec"]
    selectors = canary.revision_selectors(after, mode, params["canary_name"]) if mode == canary.STANDARD else {}
    result = {"changed": changed, "canary.manifest": after, "patch": patch, "mode": mode, "selectors": selectors}
    if diff:
        result["diff"] = {"before": before, "after": after}
    if git:
        # the same plan, written where the owner syncs from; the owner's sync of the commit has been waited for
        result["git"] = canary_git.write_step(api_client, params, isvc, mode, patch, dry_run=dry_run)
        result["changed"] = changed = result["git"]["changed"]
        if diff:
            result["diff"] = {"prepared": "".join(item["diff"] for item in result["git"]["files"])}
        if not dry_run:
            isvc = k8s_pods.get_inference_service(api_client, ns, name)
    elif changed:
        canary_git.check_live_write(api_client, isvc, params, warn=warn)
        isvc = canary.apply_merge_patch(api_client, ns, name, patch, dry_run=dry_run)
    result["resource"] = isvc
    if params["wait"] and not dry_run:
        retired, stable_revision = None, None
        if mode == canary.STANDARD and params["state"] != "present":
            retired = canary.revision_selectors(before, mode, params["canary_name"])["stable" if params["state"] == "promoted" else "canary"]
        elif mode == canary.KNATIVE and params["state"] != "present" and changed:
            # the revisions as they were before this write: the one that goes out of the traffic is retired
            stable_revision, retired = canary.knative_retired(read, params["state"])
            if git:
                # the abort in Git is the spec without the canary, which Knative makes a new revision of (live, KServe's
                # canaryTrafficPercent: 0 sends 100% back to the previous one)
                stable_revision = None
        isvc, _elapsed, rollout = canary_wait.wait_step(api_client, ns, name, params["state"], mode, params["canary_name"],
                                                        params.get("percent"), params["wait_timeout"], retired=retired,
                                                        stable_revision=stable_revision, **crash_loop_check(params))
        result.update(resource=isvc, rollout=rollout)
        if mode == canary.KNATIVE and params["state"] == "present":
            result["selectors"] = canary.revision_selectors(isvc, mode, params["canary_name"])
    return result


def observe_canary(connect, params):
    """Module canary_observe: check the options, read the InferenceService (and the selectors of its two revisions when
    none are given), canary.observe both revisions' /metrics over the window and decide; returns the module's result.
    `connect()` returns the kubernetes ApiClient, called once the options are checked."""
    if params["window"] <= 0:
        raise ValidationError("must be more than 0 seconds", field="window", hint="canary.observe at least a few minutes of live traffic")
    if params["min_requests"] < 1:
        raise ValidationError("must be at least 1", field="min_requests", hint="ask for enough requests per side to decide on, e.g. 50")
    bench_decision.check_tolerances(params.get("tolerances"))
    canary_window.check_p99_tolerance(params.get("p99_tolerance"))
    http_target.check_port(params.get("port"))
    budgets = analysis.Budgets.from_params(dict(params, interval=params["window"]))
    checks = [analysis.check_spec(c) for c in params.get("checks") or []]
    confidence = check_confidence(params.get("confidence"))
    selectors = params.get("selectors")
    api_client = connect()
    isvc = k8s_pods.get_inference_service(api_client, params["namespace"], params["name"])
    mode = canary.deployment_mode(isvc)
    if not selectors:
        selectors = canary.revision_selectors(isvc, mode, canary.check_canary_name(params["canary_name"]))
    elif set(selectors) != {"stable", "canary"}:
        raise ValidationError("needs exactly the keys stable and canary, got %s" % ", ".join(sorted(selectors)), field="selectors",
                              hint="pass the selectors canary_rollout returned, e.g. {stable: app=isvc.x-predictor, canary: app=isvc.x-predictor-spec}")
    result = canary.observe(api_client, params["namespace"], params["name"], selectors, params["window"],
                            max_window=params.get("max_window"), min_requests=params["min_requests"],
                            tolerances=params.get("tolerances"), p99_tolerance=params.get("p99_tolerance"),
                            model_name=params.get("model_name"),
                            container=params["container"], port=params.get("port"), scheme=params.get("scheme"),
                            timeout=params["timeout"], budgets=budgets, checks=checks, confidence=confidence)
    report = canary.build_report(params["namespace"], params["name"], result, percent=params.get("percent"),
                                 canary_name=params["canary_name"], mode=mode)
    return dict(changed=False, report=report, markdown=canary.render_markdown(report), **result)
