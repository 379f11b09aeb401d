# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""KServe's own verdict that an InferenceService's model failed to load, and the words a wait fails with.

KServe (PropagateModelStatus, v0.20) writes ``status.modelStatus`` from the newest predictor pod: its ``kserve-container``
(or ``storage-initializer``) terminated with reason Error or waiting in CrashLoopBackOff gives targetModelState
FailedToLoad, transitionStatus BlockedByFailedLoad and ``lastFailureInfo`` {reason ModelLoadFailed, message, exitCode}.
A crash-looping server does not heal by waiting, so the wait stops there, once the pod restarted a few times (a single
crash can be a node hiccup) and the verdict is about the current generation (a status left over from the previous
revision, or one whose Ready=True came later, does not count). Pure functions over dicts; the reads are in ``kserve/wait.py``.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers

CONTAINERS = ("kserve-container", "storage-initializer")
LOG_TAIL_LINES = 20
LOG_TAIL_CHARS = 4000


def verdict(isvc):
    """``status.modelStatus`` when KServe says the model failed to load at the current generation and the
    InferenceService is not Ready; else None."""
    state = isvc_readers.readiness(isvc)
    if state["ready"] or not state["up_to_date"]:
        return None
    model = ((isvc or {}).get("status") or {}).get("modelStatus") or {}
    target = (model.get("states") or {}).get("targetModelState")
    if model.get("transitionStatus") == "BlockedByFailedLoad" or target == "FailedToLoad":
        return model
    return None


def crash_looping(pods, restarts):
    """``(pod, container, restarts, state)`` of the predictor pod whose kserve-container or storage-initializer restarted
    most, when that is at least ``restarts`` times (``restarts`` 0 or less: never); else None. ``pods`` as
    ``kube.pods.list_predictor_pods`` returns them."""
    if not restarts or restarts <= 0:
        return None
    best = None
    for pod in pods or []:
        counts = dict(pod.get("restarts") or {}, **(pod.get("init_restarts") or {}))
        for name in CONTAINERS:
            count = counts.get(name) or 0
            if count >= restarts and (best is None or count > best[2]):
                best = (pod, name, count, (pod.get("states") or {}).get(name))
    return best


def message(namespace, name, model, crash, log_text):
    """Why the wait stops: KServe's verdict with lastFailureInfo, the pod and container, and the previous run's own log
    tail (``log_text``, already redacted; a sentence when it could not be read)."""
    info = model.get("lastFailureInfo") or {}
    target = (model.get("states") or {}).get("targetModelState")
    parts = ["reason %s" % info.get("reason")] if info.get("reason") else []
    if info.get("exitCode") is not None:
        parts.append("exitCode %s" % info.get("exitCode"))
    if info.get("message"):
        parts.append("message %r" % info["message"].strip()[-500:])
    pod, container, count, state = crash
    return ("InferenceService %s/%s cannot become Ready: KServe reports the model %s (transitionStatus %s%s); pod %s "
            "container %s restarted %d times%s. The previous run's log (last %d lines):\n%s"
            % (namespace, name, target or "FailedToLoad", model.get("transitionStatus") or "unset",
               ", lastFailureInfo: " + ", ".join(parts) if parts else "", pod.get("name"), container, count,
               " and is %s" % state if state else "", LOG_TAIL_LINES, log_text))


def log_tail(chunks):
    """The last LOG_TAIL_CHARS characters of a log read as byte chunks, as text."""
    text = b"".join(chunks).decode("utf-8", "replace").rstrip("\n")
    return text[-LOG_TAIL_CHARS:] if text else "(empty)"


FIX = ("fix the container's command or the model files (the log above says why the server exited) and apply again; "
       "crash_loop_restarts=0 waits for the timeout instead")
