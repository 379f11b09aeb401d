"""KServe v0.20's status.modelStatus of an InferenceService (PropagateModelStatus in
pkg/apis/serving/v1beta1/inference_service_status.go), for the KServe stand-in.

What KServe concludes from the predictor pods: the first pod's `storage-initializer` init container or its
`kserve-container` terminated with reason Error, or waiting in CrashLoopBackOff, makes the model FailedToLoad
(transitionStatus BlockedByFailedLoad) with lastFailureInfo {reason ModelLoadFailed, message and exitCode of that
termination}; a running storage initializer makes it Loading; a Ready InferenceService Loaded; otherwise Pending.
copies.totalCopies counts the Ready pods. Pinned to KServe's own test vectors (tests/fixtures/kserve/model_status.json).
Plain dicts in the API's JSON form; imports nothing from plugins/ (the stand-in reads KServe, not the product).
"""
from __future__ import annotations

import copy

KSERVE_CONTAINER = "kserve-container"
STORAGE_INITIALIZER = "storage-initializer"
_TRANSITION = {"Pending": "InProgress", "Loading": "InProgress", "Loaded": "UpToDate", "FailedToLoad": "BlockedByFailedLoad"}


def ready_pods(pods) -> int:
    """countReadyPods: pods Running with condition Ready=True."""
    return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or []))


def _set_state(model: dict, state: str, failure: dict | None = None) -> None:
    """UpdateModelRevisionStates: the target state, the transition it implies, lastFailureInfo only when given (an
    earlier failure stays, as in KServe)."""
    states = dict(model.get("states") or {"activeModelState": ""})
    states["targetModelState"] = state
    model["transitionStatus"] = _TRANSITION[state]
    if state == "Loaded":
        states["activeModelState"] = "Loaded"
    model["states"] = states
    if failure is not None:
        model["lastFailureInfo"] = failure


def _failure(terminated: dict | None) -> dict:
    term = terminated or {}
    out = {"reason": "ModelLoadFailed", "exitCode": int(term.get("exitCode") or 0)}
    if term.get("message"):
        out["message"] = term["message"]
    return out


def _failed(cs: dict):
    """FailureInfo of a container KServe counts as failed to load (terminated with Error, or CrashLoopBackOff), else None."""
    state = cs.get("state") or {}
    if (state.get("terminated") or {}).get("reason") == "Error":
        return _failure(state["terminated"])
    if (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff":
        return _failure((cs.get("lastState") or {}).get("terminated"))
    return None


def propagate_model_status(model_status: dict | None, isvc_ready: bool, pods: list, raw_deployment: bool = True,
                           service_conditions=(), latest_created: str = "", latest_ready: str = "") -> tuple:
    """(new modelStatus, KServe's return value) from the modelStatus before, whether the InferenceService is Ready, and
    the predictor pods (API JSON, list order). ``service_conditions``, ``latest_created``/``latest_ready``: the Knative
    Service's conditions and revisions (Knative mode only). False: KServe requeues and leaves the status as it was."""
    model = copy.deepcopy(model_status or {})
    model["copies"] = dict(model.get("copies") or {"failedCopies": 0}, totalCopies=ready_pods(pods))
    if not pods:
        if not raw_deployment and any(c.get("status") == "False" for c in service_conditions or ()):
            _set_state(model, "FailedToLoad")
        else:
            _set_state(model, "Pending")
        return model, True
    first = pods[0].get("status") or {}
    for cs in first.get("initContainerStatuses") or []:
        if cs.get("name") != STORAGE_INITIALIZER:
            continue
        state = cs.get("state") or {}
        if "running" in state:
            if (cs.get("lastState") or {}).get("terminated") is not None:
                return model, False  # between a crash and the next: KServe requeues, the states stay
            _set_state(model, "Loading")
            return model, True
        failure = _failed(cs)
        if failure is not None:
            _set_state(model, "FailedToLoad", failure)
            return model, True
    if isvc_ready and (raw_deployment or latest_created == latest_ready):
        _set_state(model, "Loaded")
        return model, True
    for cs in first.get("containerStatuses") or []:
        if cs.get("name") == KSERVE_CONTAINER:
            failure = _failed(cs)
            _set_state(model, "FailedToLoad" if failure else "Pending", failure)
    return model, True
