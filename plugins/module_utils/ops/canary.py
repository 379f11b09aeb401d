# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Canary rollout of speculative decoding: the plan, each step's manifest, readiness per revision, the measurement
over a window of live traffic from vLLM's own histograms (``bench/canary_window.py``), and the decision.

How KServe splits traffic (read in kserve/kserve, see docs/rollback.md "Canary rollout"):

- Knative mode: ``spec.predictor.canaryTrafficPercent: N`` on an updated predictor (a new pod template, so a new
  Knative revision). KServe (``reconcilers/knative/ksvc_reconciler.go``) routes N% to ``latestRevision`` (the latest
  ready revision) and 100-N% to the last revision that had 100% (``latestRolledoutRevision``), tagged ``prev``;
  ``status.components.predictor`` carries
  ``latestCreatedRevision``, ``latestReadyRevision``, ``latestRolledoutRevision``, ``previousRolledoutRevision`` and
  ``traffic[]`` ``{revisionName, percent, latestRevision, tag}``. Pods of a revision carry the label
  ``serving.knative.dev/revision=<revision>``. Removing ``canaryTrafficPercent`` promotes (100% to the latest
  revision; the previous one gets no traffic and scales to zero). The rollback is KServe's ``canaryTrafficPercent: 0``
  (100% back on the ``prev`` revision, which is not touched) together with the predictor without the flag: the spec no
  longer names the speculative config, and the revision Knative makes of it (the previous spec again) gets 0%.
- Standard mode (KServe v0.20, ``spec.canary[]`` in the v0.20 CRD): each entry ``{trafficPercent, predictor}`` with a
  ``predictor.name`` gets its own Deployment and Service (``controllers/v1beta1/inferenceservice/canary_controller_test.go``:
  ``constants.PredictorServiceName(isvc, name)``, here ``<isvc>-predictor-<name>``), the stable Deployment
  keeps ``<isvc>-predictor`` (or ``-<spec.predictor.name>``); replicas are split by the percent (25% of 4 -> 1 canary, 3
  stable once the canary is available); ``status.canaryStatuses[]`` ``{name, ready, trafficPercent, modelStatus}``.
  Promotion: ``spec.predictor`` becomes the canary's predictor with the canary's ``name`` and ``spec.canary`` is
  removed; the canary Deployment (same name) stays without a new rollout and the old stable one is deleted. Removing
  ``spec.canary`` deletes the canary Deployment and Service and gives the stable one its replicas back.
  Pods of each Deployment carry ``app=isvc.<deployment name>`` (``constants.GetRawServiceLabel``).

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import copy
import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import canary_window
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.defaults import DEFAULT_CONTAINER
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import http_target
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit as vllm_edit

STANDARD, KNATIVE = "Standard", "Knative"
STANDARD_MIN_KSERVE = (0, 20)
DEFAULT_CANARY_NAME = "spec"
REVISION_LABEL = "serving.knative.dev/revision"
APP_LABEL = "app"
# The steps' merge patches are Update operations under this manager (not the client's default "OpenAPI-Generator"), so
# managedFields say which fields the canary wrote; the deploy still treats it as foreign (kube/ssa_conflicts.py).
CANARY_FIELD_MANAGER = "alauda-spec-decoding-canary"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# -- the plan ---------------------------------------------------------------------------------------------------------

def check_percent(value, field="percent"):
    """A canary traffic percent: an integer 1..99."""
    try:
        number = int(value)
        if isinstance(value, bool) or float(value) != number:
            raise ValueError
    except (TypeError, ValueError):
        raise ValidationError("%r is not a whole number" % (value,), field=field, hint="give a percent from 1 to 99, e.g. 10") from None
    if not 1 <= number <= 99:
        raise ValidationError("%d is outside 1..99" % number, field=field,
                              hint="give the share of traffic the canary gets, from 1 to 99 (100 is the promotion, 0 the rollback)")
    return number


def check_steps(steps, percent=None, field="steps"):
    """The traffic steps: rising percents 1..99; a trailing 100 (the promotion) is dropped. Empty: ``[percent]``."""
    if not steps:
        if percent is None:
            raise ValidationError("no canary percent and no steps", field=field, hint="set the percent (e.g. 10) or a list of steps (e.g. [10, 50])")
        return [check_percent(percent, field="percent")]
    if not isinstance(steps, (list, tuple)):
        raise ValidationError("must be a list of percents, got %r" % (steps,), field=field, hint="e.g. [10, 50, 100]")
    steps = list(steps)
    if len(steps) > 1 and str(steps[-1]).strip() == "100":
        steps = steps[:-1]
    out = []
    for i, value in enumerate(steps):
        number = check_percent(value, field="%s[%d]" % (field, i))
        if out and number <= out[-1]:
            raise ValidationError("%d does not rise above the step before it (%d)" % (number, out[-1]), field="%s[%d]" % (field, i),
                                  hint="list the percents in rising order, e.g. [10, 50, 100]")
        out.append(number)
    if percent is not None and out[0] != check_percent(percent, field="percent"):
        raise ValidationError("the first step is %d%% but percent is %s" % (out[0], percent), field=field,
                              hint="start the steps at the percent, or leave one of them unset")
    return out


def check_canary_name(name, field="canary_name"):
    text = str(name or "")
    if not _DNS_LABEL.match(text) or len(text) > 40:
        raise ValidationError("%r is not a DNS label of at most 40 characters" % (name,), field=field,
                              hint="use lowercase letters, digits and '-', e.g. spec (it names the canary Deployment <isvc>-predictor-<name>)")
    return text


def deployment_mode(isvc, default=STANDARD):
    value = (((isvc or {}).get("metadata") or {}).get("annotations") or {}).get("serving.kserve.io/deploymentMode") or \
        ((isvc or {}).get("status") or {}).get("deploymentMode") or default
    return {"RawDeployment": STANDARD, "Serverless": KNATIVE}.get(value, value)


def _version_tuple(text):
    parts = re.findall(r"\d+", str(text or ""))
    return tuple(int(p) for p in parts[:3]) if parts else None


def check_mode(mode, kserve_version, field="kserve_version"):
    """Standard mode splits traffic with ``spec.canary``, which KServe has from v0.20 on."""
    if mode not in (STANDARD, KNATIVE):
        raise ValidationError("deployment mode %r has no canary traffic split" % (mode,), field="deployment_mode",
                              hint="KServe splits traffic in Standard (v0.20+, spec.canary) and Knative (canaryTrafficPercent) mode")
    if mode == STANDARD:
        version = _version_tuple(kserve_version)
        if version is None:
            raise ValidationError("the KServe release is unknown, and Standard mode needs v0.20 or later for spec.canary", field=field,
                                  hint="give kserve_version (the kserve_info module reports it) or let the module read the CRD")
        if version[:2] < STANDARD_MIN_KSERVE:
            raise ValidationError("KServe %s has no spec.canary: Standard-mode canaries need v0.20 or later" % kserve_version, field=field,
                                  hint="upgrade KServe to v0.20+, or run the InferenceService in Knative mode (canaryTrafficPercent)")
    return mode


def _predictor_container(predictor):
    """(key, container dict) of the predictor's vLLM container: ``model`` or ``containers[0]``."""
    if predictor.get("model") is not None:
        return "model", predictor["model"]
    containers = predictor.get("containers") or []
    if containers:
        return "containers", containers[0]
    raise ValidationError("the predictor has neither model nor containers", field="spec.predictor",
                          hint="deploy the InferenceService (roles/inference_service) before a canary")


def carries_flag(predictor):
    _key, container = _predictor_container(predictor or {})
    return vllm_command.has_speculative_config(container.get("command") or []) or \
        vllm_command.has_speculative_config(container.get("args") or [])


def serving_config(predictor):
    """The speculative config (a dict) the predictor's vLLM command passes, or None."""
    _key, container = _predictor_container(predictor or {})
    return vllm_command.find_speculative_config(container.get("command"), container.get("args"))


def already_promoted(isvc, canonical_config):
    """True when no canary runs and the serving revision already passes ``canonical_config`` (a dict, as
    speculative_config.canonical_json normalises it): a rerun after a promotion, which has nothing left to do."""
    spec = (isvc or {}).get("spec") or {}
    if spec.get("canary") or (spec.get("predictor") or {}).get("canaryTrafficPercent") is not None:
        return False
    return serving_config(spec.get("predictor")) == canonical_config


def canary_predictor(predictor, canonical_json, canary_name):
    """The stable predictor with ``--speculative-config <canonical_json>`` set and the canary's ``name``."""
    if carries_flag(predictor):
        raise ValidationError("the serving revision already runs with --speculative-config", field="spec.predictor",
                              hint="a canary compares speculative decoding with the revision without it: roll back first (playbooks/rollback.yml)")
    out = copy.deepcopy(predictor)
    out.pop("canaryTrafficPercent", None)
    key, container = _predictor_container(out)
    command, args = vllm_edit.set_speculative_config_in(container.get("command"), container.get("args"), canonical_json)
    if command is not None:
        container["command"] = command
    if args is not None:
        container["args"] = args
    if key == "containers":
        out["containers"][0] = container
    else:
        # The v0.20 CRD requires model.name inside spec.canary[].predictor (modelFormat and name); KServe names the
        # container kserve-container.
        container.setdefault("name", "kserve-container")
    out["name"] = canary_name
    return out


def step_patch(isvc, mode, percent, canary):
    """The merge patch that puts ``canary`` (a predictor) on ``percent`` of the traffic."""
    if mode == STANDARD:
        return {"spec": {"canary": [{"trafficPercent": percent, "predictor": canary}]}}
    predictor = copy.deepcopy(canary)
    predictor.pop("name", None)
    # spec.canary[] needs model.name; the Knative predictor keeps the model as it was (same pod template but the flag).
    stable_model = (((isvc or {}).get("spec") or {}).get("predictor") or {}).get("model")
    if isinstance(predictor.get("model"), dict) and isinstance(stable_model, dict) and "name" not in stable_model:
        predictor["model"].pop("name", None)
    predictor["canaryTrafficPercent"] = percent
    return {"spec": {"predictor": predictor}}


def promote_patch(isvc, mode, canary):
    """Canary to 100%: Standard - the canary becomes spec.predictor (same name, so its Deployment stays), the old one goes."""
    if mode == STANDARD:
        return {"spec": {"predictor": copy.deepcopy(canary), "canary": None}}
    return {"spec": {"predictor": {"canaryTrafficPercent": None}}}


def check_knative_promotion(isvc):
    """Knative: removing ``canaryTrafficPercent`` sends 100% to the latest revision, so promote only a predictor that carries
    the flag (after a rollback, ``canaryTrafficPercent: 0`` sits on the predictor without it: promoting that would move
    all the traffic to a revision without speculative decoding)."""
    predictor = ((isvc or {}).get("spec") or {}).get("predictor") or {}
    if predictor.get("canaryTrafficPercent") is not None and not carries_flag(predictor):
        raise ValidationError("there is no canary to promote: the predictor has canaryTrafficPercent %s but no --speculative-config"
                              % predictor.get("canaryTrafficPercent"), field="spec.predictor",
                              hint="start the canary first (state: present); the predictor was rolled back")


def rollback_patch(isvc, mode, stable):
    """Canary removed, 100% back on the previous revision; ``stable`` is the predictor without the flag.

    Knative: ``canaryTrafficPercent: 0`` (KServe's rollback: 100% on the ``prev`` revision, untouched) with the flag
    gone from the predictor; without a canary (no canaryTrafficPercent) there is nothing to remove."""
    if mode == STANDARD:
        return {"spec": {"canary": None}}
    if (((isvc or {}).get("spec") or {}).get("predictor") or {}).get("canaryTrafficPercent") is None:
        return {}
    predictor = copy.deepcopy(stable)
    predictor["canaryTrafficPercent"] = 0
    return {"spec": {"predictor": predictor}}


def rollback_source(isvc):
    """The predictor of the previous revision: Standard - spec.predictor as it is; Knative - the predictor without the
    flag and without canaryTrafficPercent (the spec of the revision that had 100%)."""
    predictor = copy.deepcopy(((isvc or {}).get("spec") or {}).get("predictor") or {})
    predictor.pop("canaryTrafficPercent", None)
    key, container = _predictor_container(predictor)
    for field in ("command", "args"):
        if container.get(field):
            container[field] = vllm_edit.strip_speculative_config(container[field])
    if key == "containers":
        predictor["containers"][0] = container
    return predictor


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch (what the API server applies for application/merge-patch+json)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def manifest(isvc, patch):
    """The InferenceService manifest after ``patch``, without server-side fields (for a GitOps directory)."""
    meta = (isvc or {}).get("metadata") or {}
    clean = {"apiVersion": isvc.get("apiVersion", "serving.kserve.io/v1beta1"), "kind": isvc.get("kind", "InferenceService"),
             "metadata": {k: copy.deepcopy(meta[k]) for k in ("name", "namespace", "labels", "annotations") if meta.get(k)},
             "spec": copy.deepcopy(isvc.get("spec") or {})}
    annotations = clean["metadata"].get("annotations") or {}
    annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
    return merge_patch(clean, patch)


# -- readiness per revision -------------------------------------------------------------------------------------------

def _conditions(isvc):
    return {c.get("type"): c for c in ((isvc or {}).get("status") or {}).get("conditions") or []}


def rollout_state(isvc, mode, canary_name, percent):
    """Where the canary step stands: ``{done, stable_ready, canary_ready, traffic, why}``.

    Generation-aware (status.observedGeneration == metadata.generation) and revision-aware: Standard mode needs the
    canaryStatuses entry of ``canary_name`` Ready at ``percent``; Knative mode the latest revision ready and on ``percent``.
    """
    meta, status = (isvc or {}).get("metadata") or {}, (isvc or {}).get("status") or {}
    up_to_date = status.get("observedGeneration") == meta.get("generation")
    ready = (_conditions(isvc).get("Ready") or {}).get("status") == "True"
    state = {"up_to_date": up_to_date, "stable_ready": ready and up_to_date, "canary_ready": False, "traffic": None}
    if mode == STANDARD:
        entry = next((c for c in status.get("canaryStatuses") or [] if c.get("name") == canary_name), None)
        if entry is not None:
            state["canary_ready"] = bool(entry.get("ready")) and up_to_date
            state["traffic"] = entry.get("trafficPercent")
    else:
        split = knative_split(isvc)
        state["traffic"] = split["canary_percent"]
        # revision-aware: the revision on the canary share is the latest created one, and it is ready; the rest of the
        # traffic is on another (the previous rolled-out) revision
        state["canary_ready"] = up_to_date and bool(split["canary"]) and split["canary"] == split["latest_created"] and \
            split["canary"] == split["latest_ready"] and bool(split["stable"]) and split["stable"] != split["canary"]
        state["revisions"] = {"stable": split["stable"], "canary": split["canary"]}
    state["done"] = state["stable_ready"] and state["canary_ready"] and state["traffic"] == percent
    why = []
    if not up_to_date:
        why.append("generation %s not observed yet (observedGeneration %s)" % (meta.get("generation"), status.get("observedGeneration")))
    if not ready:
        cond = _conditions(isvc).get("Ready") or {}
        why.append("Ready is %s%s" % (cond.get("status", "missing"), (": " + cond["message"]) if cond.get("message") else ""))
    if not state["canary_ready"]:
        why.append("canary %s not ready" % canary_name)
    if state["traffic"] != percent:
        why.append("canary traffic %s%%, want %s%%" % (state["traffic"], percent))
    state["why"] = "; ".join(why) or "both revisions ready, canary on %s%%" % percent
    return state


def knative_split(isvc):
    """Knative mode: where the traffic is, from ``status.components.predictor``: ``{stable, canary, canary_percent,
    stable_percent, latest_created, latest_ready, rolled_out}`` (revision names or None)."""
    comp = ((((isvc or {}).get("status") or {}).get("components") or {}).get("predictor")) or {}
    traffic = comp.get("traffic") or []
    latest = next((t for t in traffic if t.get("latestRevision")), None)
    prev = next((t for t in traffic if not t.get("latestRevision") and t.get("revisionName")), None)
    return {"canary": (latest or {}).get("revisionName") if prev else None,
            "canary_percent": (latest or {}).get("percent") if latest else None,
            "stable": (prev or {}).get("revisionName"), "stable_percent": (prev or {}).get("percent"),
            "latest_created": comp.get("latestCreatedRevision"), "latest_ready": comp.get("latestReadyRevision"),
            "rolled_out": comp.get("latestRolledoutRevision"),
            "serving": [t.get("revisionName") for t in traffic if t.get("percent")]}


def knative_settled(isvc, state, stable_revision=None):
    """Knative mode after a promotion / a rollback: 100% on one revision - the latest (ready) one for ``promoted``, the
    previous one (``stable_revision`` when known) for ``absent``."""
    split = knative_split(isvc)
    if len(split["serving"]) != 1:
        return False
    if state == "promoted":
        return split["serving"][0] == split["latest_ready"] == split["latest_created"]
    return stable_revision is None or split["serving"][0] == stable_revision


def knative_retired(isvc, state):
    """Knative mode, before a promotion / a rollback is written: ``(stable revision, selector of the pods that go)``.

    Promoted: the previous revision goes. Absent: the canary revision, i.e. the latest created one (when it never became
    ready, Knative routes its share to the previous revision, so the traffic does not name it). None where nothing goes."""
    split = knative_split(isvc)
    stable = split["stable"] or split["rolled_out"]
    if state == "promoted":
        gone = stable if stable and stable != split["latest_created"] else None
    else:
        gone = split["latest_created"] if split["latest_created"] and split["latest_created"] != stable else None
    return stable, ("%s=%s" % (REVISION_LABEL, gone) if gone else None)


def revision_selectors(isvc, mode, canary_name):
    """Label selectors of the pods of each revision: ``{"stable": sel, "canary": sel}``."""
    name = isvc["metadata"]["name"]
    if mode == STANDARD:
        stable_name = ((isvc.get("spec") or {}).get("predictor") or {}).get("name")
        stable = "%s-predictor-%s" % (name, stable_name) if stable_name else "%s-predictor" % name
        return {"stable": "%s=isvc.%s" % (APP_LABEL, stable), "canary": "%s=isvc.%s-predictor-%s" % (APP_LABEL, name, canary_name)}
    split = knative_split(isvc)
    if not split["stable"] or not split["canary"] or split["stable"] == split["canary"]:
        raise ValidationError("status.components.predictor.traffic splits no traffic between two revisions (%s)"
                              % (((isvc.get("status") or {}).get("components") or {}).get("predictor") or {}).get("traffic"),
                              field="name", hint="wait until the canary step is ready (both revisions) before observing")
    return {"stable": "%s=%s" % (REVISION_LABEL, split["stable"]), "canary": "%s=%s" % (REVISION_LABEL, split["canary"])}


# -- on the cluster (kubernetes client objects from the calling module) --------------------------------------------------

def apply_merge_patch(api_client, namespace, name, patch, dry_run=False):
    """JSON merge patch of the InferenceService through the one patch writer (kube/writer.merge_patch, on the cluster
    service) as CANARY_FIELD_MANAGER (server-side dry run in check mode); returns the object. ``api_client``: the
    ClusterService or a bare ApiClient."""
    try:
        return kube_service.service_of(api_client).merge_patch(kube_service.INFERENCE_SERVICE, name, patch, namespace=namespace,
                                                               field_manager=CANARY_FIELD_MANAGER, dry_run=dry_run)
    except k8s_pods.ApiException as exc:
        raise k8s_pods.PodAccessError("patching InferenceService %s/%s failed: %s" % (namespace, name, k8s_pods.api_error_message(exc)),
                                      field="name", hint="the identity needs patch on inferenceservices; read the message for a schema error") from exc


def canary_pods(api_client, namespace, name, selector):
    """Running (not deleting) pods of one revision."""
    pods, _skipped = k8s_pods.list_predictor_pods(api_client, namespace, name, label_selector=selector)
    return pods


# -- observing a window of live traffic -----------------------------------------------------------------------------------

def _targets(api_client, namespace, name, selector, container, port, scheme):
    return pod_targets(api_client, namespace, [p["name"] for p in canary_pods(api_client, namespace, name, selector)], container, port, scheme)


def pod_targets(api_client, namespace, pods, container, port, scheme):
    """Per pod name: scheme and port of vLLM's /metrics (from the pod's spec unless given)."""
    return {pod: http_target.pod_http_target(k8s_pods.read_pod(api_client, namespace, pod), container=container, port=port, scheme=scheme)
            for pod in pods}


def scrape_pods(api_client, namespace, targets, model_name, timeout):
    pages, missing = {}, []
    for pod, target in sorted(targets.items()):
        try:
            text = k8s_pods.proxy_get(api_client, namespace, pod, port=target["port"], path="metrics", scheme=target["scheme"], timeout=timeout)
            page = canary_window.scrape(text, model_name=model_name, field="metrics of pod %s" % pod)
        except (k8s_pods.PodAccessError, ValidationError):
            missing.append(pod)
            continue
        if not page["histograms"]["e2el"]["found"]:
            missing.append(pod)
            continue
        pages[pod] = page
    return pages, missing


def _observe_window(api_client, namespace, targets, selectors, window, max_window, min_requests, tolerances, model_name, timeout,
                    clock, sleep, p99_tolerance, checks, confidence):
    """One window: scrape every pod of both revisions, wait ``window`` seconds, scrape again; while a side has fewer than
    ``min_requests`` finished requests, extend the window (up to ``max_window`` seconds in all) instead of deciding on noise.
    The verdict is the analysis engine's (``analysis.canary_window_verdict``)."""
    missing = {side: [] if targets[side] else ["(no running pod matches %s)" % selectors[side]] for side in targets}
    first = {}
    for side in targets:
        first[side], lost = scrape_pods(api_client, namespace, targets[side], model_name, timeout)
        missing[side] += lost
    start = clock()
    sleep(window)
    extended = 0
    while True:
        figures, later_missing, scraped = {}, {}, {}
        for side in targets:
            pages, lost = scrape_pods(api_client, namespace, targets[side], model_name, timeout)
            later_missing[side] = missing[side] + [p for p in lost if p not in missing[side]]
            scraped[side] = pages
        elapsed = clock() - start  # the window ends with the last scrape
        for side, pages in scraped.items():
            deltas = [canary_window.window_delta(page, first[side].get(pod)) for pod, page in sorted(pages.items())]
            figures[side] = analysis.window_figures(deltas, elapsed)
            figures[side]["pod_names"] = sorted(pages)
        decided = canary_window.decide(figures["stable"], figures["canary"], min_requests=min_requests, tolerances=tolerances,
                                       missing=later_missing, p99_tolerance=p99_tolerance, confidence=confidence,
                                       extra_checks=sum(1 for c in checks if not c["dry_run"]))
        short = decided["decision"] == "none" and not any(later_missing.values())
        remaining = max_window - elapsed
        if not short or remaining <= 0.05:
            break
        extended += 1
        sleep(min(window, remaining))
    verdict = analysis.canary_window_verdict(figures["stable"], figures["canary"], decided, later_missing, checks, confidence)
    return dict(verdict, keep_rule_checks=decided["checks"], stable=figures["stable"], canary=figures["canary"], window_s=elapsed,
                missing=later_missing, extended=extended)


# analysis phase -> the canary's decision (none: the rollout stays where it is)
PHASE_DECISIONS = {analysis.SUCCESSFUL: "promote", analysis.FAILED: "roll_back"}
STOPPED_HINT = ("the canary stays at its step, neither promoted nor rolled back: look at the windows' reasons, then rerun the step "
                "with a longer interval or more windows (count) when the traffic was too thin or the difference inside the noise, "
                "or fix the /metrics access (errors), or remove the canary (canary_rollout state=absent)")


def observe(api_client, namespace, name, selectors, window, max_window=None, min_requests=20, tolerances=None, model_name=None,
            container=DEFAULT_CONTAINER, port=None, scheme=None, timeout=30, clock=None, sleep=None,
            p99_tolerance=canary_window.DEFAULT_P99_TOLERANCE, budgets=None, checks=(), confidence=analysis.DEFAULT_CONFIDENCE):
    """Observe both revisions over ``budgets.count`` windows of ``window`` seconds (``_observe_window``) and count the
    verdicts against the budgets (``analysis.run``). ``decision``: ``promote`` (successful), ``roll_back`` (failed) or
    ``none`` (inconclusive or error: nothing to act on).

    Returns the last window's ``{"stable", "canary", "window_s", "missing", "extended", "checks"}`` with ``decision``,
    ``reasons``, ``verdict``, ``confidence`` and ``analysis`` (phase, counts, budgets, every window's verdict).
    """
    import time  # pylint: disable=import-outside-toplevel
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    budgets = budgets or analysis.Budgets(count=1, interval=window)
    window = budgets.interval or window
    max_window = max(window, max_window or window)
    targets = {side: _targets(api_client, namespace, name, selectors[side], container, port, scheme) for side in ("stable", "canary")}
    windows = []

    def measure(_index):
        try:
            out = _observe_window(api_client, namespace, targets, selectors, window, max_window, min_requests, tolerances, model_name,
                                  timeout, clock, sleep, p99_tolerance, checks, budgets.window_confidence(confidence))
        except (k8s_pods.PodAccessError, ValidationError) as exc:
            out = dict(analysis.window_verdict((), error=str(exc)), decision="none", stable={}, canary={}, window_s=0.0,
                       missing={}, extended=0, keep_rule_checks=[])
        windows.append(out)
        return {k: out[k] for k in ("verdict", "reasons", "confidence")}
    run = analysis.run(measure, budgets, sleep=sleep)
    last = windows[-1]
    decision = PHASE_DECISIONS.get(run["phase"], "none")
    deciding = next((w for w in reversed(windows) if analysis.PHASE_VERDICTS.get(run["phase"]) == w["verdict"]), last)
    reasons = list(deciding["reasons"])
    if budgets.count > 1 or decision == "none" and run["phase"] != deciding["verdict"]:
        reasons.append("analysis %s: %s" % (run["phase"], run["message"]))
    return dict(stable=last["stable"], canary=last["canary"], window_s=last["window_s"], missing=last["missing"], extended=last["extended"],
                checks=deciding.get("keep_rule_checks") or [], engine_checks=deciding["checks"], decision=decision, reasons=reasons,
                verdict=run["phase"], confidence=deciding.get("confidence"), analysis=run, min_requests=min_requests,
                selectors=dict(selectors), next_step=STOPPED_HINT if decision == "none" else None)


# -- report -----------------------------------------------------------------------------------------------------------

def _cell(value, digits=2):
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return ("%%.%df" % digits) % value
    return str(value)


def build_report(namespace, name, observed, percent=None, canary_name=DEFAULT_CANARY_NAME, mode=None, actions=None):
    """The report of one observation (``observe``'s result): what render_markdown and the JSON file hold."""
    return {"namespace": namespace, "name": name, "mode": mode or "n/a", "canary_name": canary_name, "percent": percent,
            "window_s": observed["window_s"], "min_requests": observed["min_requests"], "decision": observed["decision"],
            "reasons": observed["reasons"], "checks": observed.get("checks") or [], "missing": observed.get("missing") or {},
            "extended": observed.get("extended", 0), "stable": observed["stable"], "canary": observed["canary"],
            "selectors": observed["selectors"], "actions": list(actions or []), "verdict": observed.get("verdict"),
            "confidence": observed.get("confidence"), "analysis": observed.get("analysis"), "next_step": observed.get("next_step")}


def render_markdown(report):
    """The canary report: window, both revisions side by side, the decision and why."""
    stable, canary = report["stable"], report["canary"]
    lines = ["# Canary report: %s/%s" % (report["namespace"], report["name"]), "",
             "- Mode: %s; canary `%s` on %s%% of the traffic" % (report["mode"], report["canary_name"], report["percent"]),
             "- Window: %s s (min_requests %s per side)" % (_cell(report["window_s"], 1), report["min_requests"]),
             "- Decision: **%s**" % report["decision"]]
    run = report.get("analysis") or {}
    if run:
        lines.append("- Analysis: %s (%s); windows: %s" % (run["phase"], run["message"], ", ".join(
            "%d %s" % (run["counts"][v], v) for v in analysis.VERDICTS if run["counts"].get(v))))
    if report.get("confidence") is not None:
        lines.append("- Confidence that the canary is worse: %.1f%% (bench/noise.py's test of the figure that failed)" % (100 * report["confidence"]))
    lines += ["- Next: %s" % report["next_step"]] if report.get("next_step") else []
    lines.append("")
    lines += ["| | stable (%s) | canary (%s) |" % (report["selectors"]["stable"], report["selectors"]["canary"]), "|---|---|---|"]
    rows = [("pods", "pods", None), ("requests", "requests", None)]
    for key in canary_window.HISTOGRAMS:
        rows.append(("median %s (ms)" % key.upper(), "%s_ms" % key, "median"))
        rows.append(("p99 %s (ms)" % key.upper(), "%s_ms" % key, "p99"))
    rows.append(("output tokens/s per request", "output_rate_per_request", None))
    for label, key, sub in rows:
        values = [(fig.get(key) or {}).get(sub) if sub else fig.get(key) for fig in (stable, canary)]
        lines.append("| %s | %s | %s |" % (label, _cell(values[0]), _cell(values[1])))
    acc = (canary.get("acceptance") or {})
    lines.append("| acceptance rate | n/a | %s |" % _cell(acc.get("draft_acceptance_rate"), 3))
    lines.append("| mean acceptance length | n/a | %s |" % _cell(acc.get("mean_acceptance_length"), 2))
    lines += ["", "## Why", ""] + ["- %s" % r for r in report["reasons"]]
    if report.get("actions"):
        lines += ["", "## Done", ""] + ["- %s" % a for a in report["actions"]]
    return "\n".join(lines) + "\n"


def report_json(report):
    return json.dumps(report, indent=2, sort_keys=True, default=str) + "\n"


# Module canary_rollout: one step of the canary (start or move, promote, roll back), rendered from a definition or applied.
