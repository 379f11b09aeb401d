# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An LLMInferenceService's readiness as KServe's controller reports it (the conditions, their roll-up, the observed
generation), its pools and, for multi-node pools, the LeaderWorkerSet groups of its pods.

Plain Python, no Ansible imports. What KServe does with the object is in ``model.py``'s docstring.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc.model import (
    LWS_GROUP_INDEX_LABEL, LWS_WORKER_INDEX_LABEL, ROUTER_CONDITIONS, WORKLOAD_CONDITIONS, _POOL_CONDITIONS, _dig, _layers,
)

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
