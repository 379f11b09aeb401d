# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Canary rollout of speculative decoding: the plan, each step's manifest, readiness per revision, the measurement
over a window of live traffic from vLLM's own histograms, and the decision.

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
import math
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils import bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils import isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils import k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils import prometheus_text
from ansible_collections.alauda.spec_decoding.plugins.module_utils import spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils import speculative_config as spec_config
from ansible_collections.alauda.spec_decoding.plugins.module_utils import vllm_command

STANDARD, KNATIVE = "Standard", "Knative"
STANDARD_MIN_KSERVE = (0, 20)
DEFAULT_CANARY_NAME = "spec"
REVISION_LABEL = "serving.knative.dev/revision"
APP_LABEL = "app"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# The server-side latency histograms vLLM exposes (0.10 to 0.33), by the benchmark's metric keys.
HISTOGRAMS = {
    "ttft": "time_to_first_token_seconds",
    "tpot": "request_time_per_output_token_seconds",
    "itl": "inter_token_latency_seconds",
    "e2el": "e2e_request_latency_seconds",
}
COUNTERS = {"generation_tokens": "generation_tokens_total", "request_success": "request_success_total"}
PREFIXES = tuple(HISTOGRAMS.values()) + ("generation_tokens", "request_success")


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
                                  hint="give kserve_version (the kserve_facts module reports it) or let the module read the CRD")
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
    command, args = vllm_command.set_speculative_config_in(container.get("command"), container.get("args"), canonical_json)
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
            container[field] = vllm_command.strip_speculative_config(container[field])
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
    """JSON merge patch of the InferenceService (server-side dry run in check mode); returns the object."""
    kwargs = {"dry_run": "All"} if dry_run else {}
    try:
        return k8s_pods.CustomObjectsApi(api_client).patch_namespaced_custom_object(
            k8s_pods.KSERVE_GROUP, k8s_pods.KSERVE_VERSION, namespace, "inferenceservices", name, patch,
            _content_type="application/merge-patch+json", **kwargs)
    except k8s_pods.ApiException as exc:
        raise k8s_pods.PodAccessError("patching InferenceService %s/%s failed: %s" % (namespace, name, k8s_pods.api_error_message(exc)),
                                      field="name", hint="the identity needs patch on inferenceservices; read the message for a schema error") from exc


def canary_pods(api_client, namespace, name, selector):
    """Running (not deleting) pods of one revision."""
    pods, _skipped = k8s_pods.list_predictor_pods(api_client, namespace, name, label_selector=selector)
    return pods


def wait_step(api_client, namespace, name, state, mode, canary_name, percent, timeout, retired=None, poll=0.5,
              clock=None, sleep=None, stable_revision=None):
    """Wait until the step took effect: present - both revisions ready with the canary on ``percent``; promoted / absent -
    Ready at the generation without a canary (Knative: 100% on one revision, ``stable_revision`` after a rollback), then no
    pod of the ``retired`` revision (a label selector) left serving. Returns (isvc, elapsed, state); raises
    isvc_wait.WaitTimeout."""
    import time  # pylint: disable=import-outside-toplevel
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    start = clock()
    if state == "present":
        isvc, elapsed = isvc_wait.wait_until(api_client, namespace, name, lambda obj: rollout_state(obj, mode, canary_name, percent)["done"],
                                             timeout=timeout, what=lambda obj: rollout_state(obj, mode, canary_name, percent)["why"])
        return isvc, elapsed, rollout_state(isvc, mode, canary_name, percent)

    def settled(obj):
        ready = k8s_pods.readiness(obj)
        if mode == KNATIVE and not knative_settled(obj, state, stable_revision):
            return False
        return ready["ready"] and ready["up_to_date"] and not (obj.get("status") or {}).get("canaryStatuses")
    what = "not Ready without a canary at the current generation"
    if mode == KNATIVE:
        what += " (traffic %s)" % ("100% on the latest revision" if state == "promoted" else
                                   "100%% on %s" % (stable_revision or "the previous revision"))
    isvc, _elapsed = isvc_wait.wait_until(api_client, namespace, name, settled, timeout=timeout, what=what)
    while retired:
        left = [p["name"] for p in canary_pods(api_client, namespace, name, retired)]
        if not left:
            break
        if clock() - start >= timeout:
            raise isvc_wait.WaitTimeout("InferenceService %s/%s: pods of the retired revision (%s) still serve after %ds: %s"
                                        % (namespace, name, retired, int(clock() - start), ", ".join(left)), isvc, left)
        sleep(poll)
    return isvc, clock() - start, {"done": True, "why": "%s: 100%% on one revision" % state}


# -- histograms from /metrics -----------------------------------------------------------------------------------------

def scrape(text, model_name=None, field="metrics"):
    """One /metrics page: ``{"histograms": {key: {"buckets": [[le, cumulative]...], "count", "sum"}}, "counters": {...},
    "spec": SpecDecodeCounters}``, summed over ``engine`` (and model names unless ``model_name``)."""
    hists = {key: {"buckets": {}, "count": 0.0, "sum": 0.0, "found": False} for key in HISTOGRAMS}
    by_name = {"vllm:" + base: key for key, base in HISTOGRAMS.items()}
    counters = {key: None for key in COUNTERS}
    counter_names = {"vllm:" + base: key for key, base in COUNTERS.items()}
    for sample in prometheus_text.parse_samples(text, PREFIXES, field=field):
        labels = sample.labels or {}
        if model_name is not None and labels.get("model_name") != model_name:
            continue
        if sample.name in counter_names:
            key = counter_names[sample.name]
            counters[key] = (counters[key] or 0.0) + sample.value
            continue
        for suffix in ("_bucket", "_count", "_sum"):
            base = sample.name[:-len(suffix)] if sample.name.endswith(suffix) else None
            if base in by_name:
                hist = hists[by_name[base]]
                hist["found"] = True
                if suffix == "_bucket":
                    upper = float(labels.get("le", "+Inf"))
                    hist["buckets"][upper] = hist["buckets"].get(upper, 0.0) + sample.value
                else:
                    hist[suffix[1:]] += sample.value
                break
    for hist in hists.values():
        hist["buckets"] = sorted(hist["buckets"].items())
    return {"histograms": hists, "counters": counters, "spec": spec_metrics.parse_prometheus(text, model_name=model_name)}


def histogram_delta(later, earlier):
    """Bucket-wise ``later - earlier``; a count that went down (server restart) gives ``later`` itself, ``reset`` True."""
    if earlier is None or not earlier.get("found"):
        return dict(later, reset=False)
    if later["count"] < earlier["count"]:
        return dict(later, reset=True)
    before = dict(earlier["buckets"])
    buckets = [(upper, cum - before.get(upper, 0.0)) for upper, cum in later["buckets"]]
    return {"buckets": buckets, "count": later["count"] - earlier["count"], "sum": later["sum"] - earlier["sum"],
            "found": later["found"], "reset": False}


def add_histograms(first, second):
    if first is None:
        return copy.deepcopy(second)
    merged = dict(first["buckets"])
    for upper, cum in second["buckets"]:
        merged[upper] = merged.get(upper, 0.0) + cum
    return {"buckets": sorted(merged.items()), "count": first["count"] + second["count"], "sum": first["sum"] + second["sum"],
            "found": first["found"] or second["found"], "reset": first.get("reset") or second.get("reset")}


def histogram_quantile(q, buckets):
    """Prometheus' ``histogram_quantile`` over cumulative ``[(upper, count)...]`` (sorted, ending with +Inf).

    Rank ``q * total``; linear interpolation inside the first bucket whose cumulative count reaches the rank (lower
    bound 0 for the first bucket when its upper bound is positive); a rank in the +Inf bucket gives the highest finite
    bound. None when the histogram is empty.
    """
    if not buckets or not 0 <= q <= 1:
        return None
    total = buckets[-1][1]
    if total <= 0 or not math.isinf(buckets[-1][0]):
        return None
    rank = q * total
    prev_upper, prev_count = 0.0, 0.0
    for i, (upper, count) in enumerate(buckets):
        if count >= rank:
            if math.isinf(upper):
                return buckets[i - 1][0] if i else None
            lower = prev_upper if i else (0.0 if upper > 0 else upper)
            in_bucket = count - prev_count
            if in_bucket <= 0:
                return upper
            return lower + (upper - lower) * ((rank - prev_count) / in_bucket)
        prev_upper, prev_count = upper, count
    return None


def _counter_delta(later, earlier):
    if later is None:
        return None
    if earlier is None or later < earlier:
        return later
    return later - earlier


def window_delta(later, earlier):
    """The figures of one pod over the window between two ``scrape`` results."""
    return {
        "histograms": {key: histogram_delta(later["histograms"][key], (earlier or {}).get("histograms", {}).get(key))
                       for key in HISTOGRAMS},
        "counters": {key: _counter_delta(later["counters"][key], (earlier or {}).get("counters", {}).get(key)) for key in COUNTERS},
        "spec": later["spec"].delta(earlier["spec"] if earlier else None),
    }


def revision_figures(pod_deltas, window_s, percentiles=(50, 99)):
    """One revision's figures from its pods' window deltas (summed): requests, latency quantiles in ms, acceptance."""
    hists = {key: None for key in HISTOGRAMS}
    gen_tokens, spec = 0.0, None
    for delta in pod_deltas:
        for key in HISTOGRAMS:
            hists[key] = add_histograms(hists[key], delta["histograms"][key])
        gen_tokens += delta["counters"]["generation_tokens"] or 0.0
        spec = delta["spec"] if spec is None else spec + delta["spec"]
    figures = {"pods": len(pod_deltas), "window_s": window_s}
    e2e = hists["e2el"] or {"count": 0.0, "sum": 0.0}
    figures["requests"] = int(round(e2e["count"]))
    figures["generation_tokens"] = int(round(gen_tokens))
    for key in HISTOGRAMS:
        hist = hists[key]
        row = {"count": int(round(hist["count"])) if hist else 0, "mean": None}
        for pct in percentiles:
            value = histogram_quantile(pct / 100.0, hist["buckets"]) if hist else None
            row["median" if pct == 50 else "p%d" % pct] = None if value is None else value * 1000.0
        if hist and hist["count"]:
            row["mean"] = hist["sum"] / hist["count"] * 1000.0
        figures["%s_ms" % key] = row
    # Per-request output rate: tokens per second of request time. The two sides carry different shares of the traffic,
    # so a throughput per revision would compare the split, not the engines.
    figures["output_rate_per_request"] = gen_tokens / e2e["sum"] if e2e["sum"] else None
    figures["request_rate"] = e2e["count"] / window_s if window_s else None
    figures["counter_reset"] = any(h and h.get("reset") for h in hists.values())
    figures["acceptance"] = spec_metrics.summarize(spec) if spec is not None else None
    return figures


def as_bench_summary(figures):
    """A revision's figures in the shape bench_report.decide reads (medians in ms, output throughput, completed)."""
    return {"ttft_ms": figures["ttft_ms"], "tpot_ms": figures["tpot_ms"], "output_throughput": figures["output_rate_per_request"],
            "completed": figures["requests"], "failed": 0}


DEFAULT_P99_TOLERANCE = 0.5
# Below 100 requests a side's p99 is its slowest request or two: one cold or stalled request would decide. The tails
# are then reported, not decided on.
P99_MIN_REQUESTS = 100
P99_CHECKS = (("ttft", "p99 TTFT"), ("tpot", "p99 TPOT (per-token latency)"))


def check_p99_tolerance(value, field="p99_tolerance"):
    """The p99 tolerance as a float >= 0, or None (tails not checked); ValidationError otherwise."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = -1.0
    if value < 0:
        raise ValidationError("must be a fraction >= 0, got %r" % (value,), field=field,
                              hint="e.g. 0.5 lets the canary's p99 TTFT and TPOT be at most 50% worse; null leaves the tails out")
    return value


def _p99_checks(stable, canary, tolerance):
    """The tail checks: the canary's p99 TTFT and p99 TPOT at most ``tolerance`` worse than the stable revision's. A p99
    that one side's histogram cannot give (no requests in the window) is not a check: the medians already refuse that."""
    checks, reasons = [], []
    for key, label in P99_CHECKS:
        s_val, c_val = (stable.get("%s_ms" % key) or {}).get("p99"), (canary.get("%s_ms" % key) or {}).get("p99")
        if s_val is None or c_val is None:
            continue
        limit = s_val * (1.0 + tolerance)
        check = {"metric": "%s_p99" % key, "label": label, "baseline": s_val, "candidate": c_val, "better": "lower",
                 "tolerance": tolerance, "limit": limit, "passed": c_val <= limit,
                 "change": (c_val - s_val) / s_val if s_val else None}
        checks.append(check)
        if not check["passed"]:
            reasons.append("%s got worse: canary %.2f ms vs stable %.2f ms (%s, tail tolerance %.0f%%)" % (
                label, c_val, s_val, "%+.1f%%" % (100.0 * check["change"]) if check["change"] is not None else "from 0",
                100.0 * tolerance))
    return checks, reasons


def decide(stable, canary, min_requests=20, tolerances=None, missing=None, p99_tolerance=DEFAULT_P99_TOLERANCE):
    """``promote`` | ``roll_back`` | ``none`` (not enough evidence), with the reasons.

    The keep rule is the benchmark's (``bench_report.decide``: median TTFT, median TPOT and the output rate all at least as
    good within the tolerances), on the medians of the window's histogram deltas. Live traffic adds a tail guard: the
    canary's p99 TTFT and p99 TPOT may be at most ``p99_tolerance`` worse (None: tails not checked), since a median
    win can hide a tail that users feel. No decision when a side's pods had no metrics (``missing``:
    ``{side: [pod, ...]}``) or fewer than ``min_requests`` requests finished on either side.
    """
    missing = {side: pods for side, pods in (missing or {}).items() if pods}
    if missing:
        return {"decision": "none", "reasons": ["no /metrics from the %s pods %s" % (side, ", ".join(pods)) for side, pods in sorted(missing.items())],
                "checks": []}
    short = ["the %s revision finished %d requests in the window, fewer than min_requests %d" % (side, fig["requests"], min_requests)
             for side, fig in (("stable", stable), ("canary", canary)) if fig["requests"] < min_requests]
    if short:
        return {"decision": "none", "reasons": short, "checks": []}
    verdict = bench_report.decide(as_bench_summary(stable), as_bench_summary(canary), tolerances=tolerances)
    tolerance = check_p99_tolerance(p99_tolerance)
    tail_checks, tail_reasons = _p99_checks(stable, canary, tolerance) if tolerance is not None else ([], [])
    fewest = min(stable["requests"], canary["requests"])
    if tail_checks and fewest < P99_MIN_REQUESTS:
        for check in tail_checks:
            check.update(passed=None, decided=False)
        tail_reasons = []
        verdict["reasons"] = verdict["reasons"] + ["p99 TTFT/TPOT reported, not decided on: a side finished %d requests in the window, "
                                                   "fewer than the %d a p99 needs (lengthen the window)" % (fewest, P99_MIN_REQUESTS)]
    if verdict["decision"] == "keep" and not tail_reasons:
        return {"decision": "promote", "reasons": verdict["reasons"], "checks": verdict["checks"] + tail_checks,
                "tolerances": dict(verdict["tolerances"], p99=tolerance)}
    reasons = (verdict["reasons"] if verdict["decision"] != "keep" else []) + tail_reasons
    return {"decision": "roll_back", "reasons": reasons, "checks": verdict["checks"] + tail_checks,
            "tolerances": dict(verdict["tolerances"], p99=tolerance)}


# -- observing a window of live traffic -----------------------------------------------------------------------------------

def _targets(api_client, namespace, name, selector, container, port, scheme):
    out = {}
    for pod in canary_pods(api_client, namespace, name, selector):
        spec = k8s_pods.read_pod(api_client, namespace, pod["name"])
        out[pod["name"]] = k8s_pods.pod_http_target(spec, container=container, port=port, scheme=scheme)
    return out


def _scrape_all(api_client, namespace, targets, model_name, timeout):
    pages, missing = {}, []
    for pod, target in sorted(targets.items()):
        try:
            text = k8s_pods.proxy_get(api_client, namespace, pod, port=target["port"], path="metrics", scheme=target["scheme"], timeout=timeout)
            page = scrape(text, model_name=model_name, field="metrics of pod %s" % pod)
        except (k8s_pods.PodAccessError, ValidationError):
            missing.append(pod)
            continue
        if not page["histograms"]["e2el"]["found"]:
            missing.append(pod)
            continue
        pages[pod] = page
    return pages, missing


def observe(api_client, namespace, name, selectors, window, max_window=None, min_requests=20, tolerances=None, model_name=None,
            container=k8s_pods.DEFAULT_CONTAINER, port=None, scheme=None, timeout=30, clock=None, sleep=None,
            p99_tolerance=DEFAULT_P99_TOLERANCE):
    """Scrape every pod of both revisions, wait ``window`` seconds of live traffic, scrape again; while a side has fewer than
    ``min_requests`` finished requests, extend the window (up to ``max_window`` seconds in all) instead of deciding on noise.

    Returns ``{"stable": figures, "canary": figures, "window_s", "missing", "decision", "reasons", "checks", "extended"}``.
    """
    import time  # pylint: disable=import-outside-toplevel
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    max_window = max(window, max_window or window)
    targets = {side: _targets(api_client, namespace, name, selectors[side], container, port, scheme) for side in ("stable", "canary")}
    missing = {side: [] if targets[side] else ["(no running pod matches %s)" % selectors[side]] for side in targets}
    first = {}
    for side in targets:
        first[side], lost = _scrape_all(api_client, namespace, targets[side], model_name, timeout)
        missing[side] += lost
    start = clock()
    sleep(window)
    extended = 0
    while True:
        figures, later_missing, scraped = {}, {}, {}
        for side in targets:
            pages, lost = _scrape_all(api_client, namespace, targets[side], model_name, timeout)
            later_missing[side] = missing[side] + [p for p in lost if p not in missing[side]]
            scraped[side] = pages
        elapsed = clock() - start  # the window ends with the last scrape
        for side, pages in scraped.items():
            deltas = [window_delta(page, first[side].get(pod)) for pod, page in sorted(pages.items())]
            figures[side] = revision_figures(deltas, elapsed)
            figures[side]["pod_names"] = sorted(pages)
        verdict = decide(figures["stable"], figures["canary"], min_requests=min_requests, tolerances=tolerances, missing=later_missing,
                         p99_tolerance=p99_tolerance)
        short = verdict["decision"] == "none" and not any(later_missing.values())
        remaining = max_window - elapsed
        if not short or remaining <= 0.05:
            break
        extended += 1
        sleep(min(window, remaining))
    return dict(verdict, stable=figures["stable"], canary=figures["canary"], window_s=elapsed, missing=later_missing,
                extended=extended, min_requests=min_requests, selectors=dict(selectors))


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
            "selectors": observed["selectors"], "actions": list(actions or [])}


def render_markdown(report):
    """The canary report: window, both revisions side by side, the decision and why."""
    stable, canary = report["stable"], report["canary"]
    lines = ["# Canary report: %s/%s" % (report["namespace"], report["name"]), "",
             "- Mode: %s; canary `%s` on %s%% of the traffic" % (report["mode"], report["canary_name"], report["percent"]),
             "- Window: %s s (min_requests %s per side)" % (_cell(report["window_s"], 1), report["min_requests"]),
             "- Decision: **%s**" % report["decision"], ""]
    lines += ["| | stable (%s) | canary (%s) |" % (report["selectors"]["stable"], report["selectors"]["canary"]), "|---|---|---|"]
    rows = [("pods", "pods", None), ("requests", "requests", None)]
    for key in HISTOGRAMS:
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

def plan_step(params, isvc, kserve_version):
    """(mode, patch, canary predictor) of the step, validated; nothing is written here."""
    mode = check_mode(deployment_mode(isvc), kserve_version)
    name = check_canary_name(params["canary_name"])
    state = params["state"]
    spec = isvc.get("spec") or {}
    entry = next((c for c in spec.get("canary") or [] if (c.get("predictor") or {}).get("name") == name), None)
    canary_pred = None
    if params.get("speculative_config") is not None:
        json_text = spec_config.canonical_json(params["speculative_config"], vllm_version=params.get("vllm_version"))[0]
        if state == "present" and entry is None and already_promoted(isvc, json.loads(json_text)):
            return mode, None, None  # a rerun after the promotion: the serving revision already runs this config
        stable = spec.get("predictor") or {}
        if mode == KNATIVE and stable.get("canaryTrafficPercent") is not None:
            stable = rollback_source(isvc)
        canary_pred = canary_predictor(stable, json_text, name) if not (state != "present" and entry) else None
    if canary_pred is None and entry is not None:
        canary_pred = copy.deepcopy(entry["predictor"])
    if state == "present":
        percent = check_percent(params.get("percent"))
        return mode, step_patch(isvc, mode, percent, canary_pred), canary_pred
    if state == "promoted":
        if canary_pred is None and mode == STANDARD:
            raise ValidationError("there is no canary %r to promote" % name, field="canary_name",
                                  hint="start the canary first (state: present), or give speculative_config to render the promotion")
        if mode == KNATIVE:
            check_knative_promotion(isvc)
        return mode, promote_patch(isvc, mode, canary_pred), canary_pred
    return mode, rollback_patch(isvc, mode, rollback_source(isvc)), canary_pred


def check_step_params(params):
    """Refuse a percent that is not one of the steps, or out of range, before anything is read."""
    if params.get("steps"):
        plan = check_steps(params["steps"])
        if params["state"] == "present" and params.get("percent") not in plan:
            raise ValidationError("percent %s is not one of the steps %s" % (params.get("percent"), plan), field="percent",
                                  hint="give one of the steps as the percent")
    if params["state"] == "present":
        check_percent(params["percent"])


def render_step(params):
    """canary_rollout with a definition: the manifest after the step; nothing is read or written."""
    isvc = params["definition"]
    mode, patch, _pred = plan_step(params, isvc, params.get("kserve_version"))
    patch = patch or {}
    out = manifest(isvc, patch)
    selectors = revision_selectors(out, mode, params["canary_name"]) if mode == STANDARD else {}
    return dict(changed=False, manifest=out, patch=patch, mode=mode, selectors=selectors)


def apply_step(api_client, params, dry_run=False, diff=False):
    """canary_rollout on the cluster: plan the step on the live InferenceService, merge-patch it (a server dry run with
    `dry_run`) and, with wait, wait until the step has taken effect. Returns the module's result."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils import kserve_facts  # pylint: disable=import-outside-toplevel
    ns, name = params["namespace"], params["name"]
    isvc = k8s_pods.get_inference_service(api_client, ns, name)
    version = params.get("kserve_version") or kserve_facts.kserve_release(api_client).get("kserve_version")
    mode, patch, _pred = plan_step(params, isvc, version)
    if patch is None:
        return dict(changed=False, already_promoted=True, mode=mode, resource=isvc, selectors={}, patch={},
                    manifest=manifest(isvc, {}),
                    msg="%s/%s already serves this speculative config without a canary: nothing to do" % (ns, name))
    read = isvc
    before = manifest(isvc, {})
    after = manifest(isvc, patch)
    changed = before["spec"] != after["spec"]
    selectors = revision_selectors(after, mode, params["canary_name"]) if mode == STANDARD else {}
    result = {"changed": changed, "manifest": after, "patch": patch, "mode": mode, "selectors": selectors}
    if diff:
        result["diff"] = {"before": before, "after": after}
    if changed:
        isvc = apply_merge_patch(api_client, ns, name, patch, dry_run=dry_run)
    result["resource"] = isvc
    if params["wait"] and not dry_run:
        retired, stable_revision = None, None
        if mode == STANDARD and params["state"] != "present":
            retired = revision_selectors(before, mode, params["canary_name"])["stable" if params["state"] == "promoted" else "canary"]
        elif mode == KNATIVE and params["state"] != "present" and changed:
            # the revisions as they were before this write: the one that goes out of the traffic is retired
            stable_revision, retired = knative_retired(read, params["state"])
        isvc, _elapsed, rollout = wait_step(api_client, ns, name, params["state"], mode, params["canary_name"],
                                            params.get("percent"), params["wait_timeout"], retired=retired,
                                            stable_revision=stable_revision)
        result.update(resource=isvc, rollout=rollout)
        if mode == KNATIVE and params["state"] == "present":
            result["selectors"] = revision_selectors(isvc, mode, params["canary_name"])
    return result


def observe_canary(connect, params):
    """Module canary_observe: check the options, read the InferenceService (and the selectors of its two revisions when
    none are given), observe both revisions' /metrics over the window and decide; returns the module's result.
    `connect()` returns the kubernetes ApiClient, called once the options are checked."""
    if params["window"] <= 0:
        raise ValidationError("must be more than 0 seconds", field="window", hint="observe at least a few minutes of live traffic")
    if params["min_requests"] < 1:
        raise ValidationError("must be at least 1", field="min_requests", hint="ask for enough requests per side to decide on, e.g. 50")
    bench_report.check_tolerances(params.get("tolerances"))
    check_p99_tolerance(params.get("p99_tolerance"))
    k8s_pods.check_port(params.get("port"))
    selectors = params.get("selectors")
    api_client = connect()
    isvc = k8s_pods.get_inference_service(api_client, params["namespace"], params["name"])
    mode = deployment_mode(isvc)
    if not selectors:
        selectors = revision_selectors(isvc, mode, check_canary_name(params["canary_name"]))
    elif set(selectors) != {"stable", "canary"}:
        raise ValidationError("needs exactly the keys stable and canary, got %s" % ", ".join(sorted(selectors)), field="selectors",
                              hint="pass the selectors canary_rollout returned, e.g. {stable: app=isvc.x-predictor, canary: app=isvc.x-predictor-spec}")
    result = observe(api_client, params["namespace"], params["name"], selectors, params["window"],
                     max_window=params.get("max_window"), min_requests=params["min_requests"],
                     tolerances=params.get("tolerances"), p99_tolerance=params.get("p99_tolerance"),
                     model_name=params.get("model_name"),
                     container=params["container"], port=params.get("port"), scheme=params.get("scheme"),
                     timeout=params["timeout"])
    report = build_report(params["namespace"], params["name"], result, percent=params.get("percent"),
                          canary_name=params["canary_name"], mode=mode)
    return dict(changed=False, report=report, markdown=render_markdown(report), **result)
