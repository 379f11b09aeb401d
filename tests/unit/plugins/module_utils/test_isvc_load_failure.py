"""A crash-looping predictor fails the InferenceService wait at once (kserve/isvc/load_failure.py, kserve/wait.py), on
KServe's own verdict (modelStatus FailedToLoad at the current generation) after N restarts, with lastFailureInfo and the
pod's previous log tail, redacted; hand-made statuses, including the ones that must NOT fail."""

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.credentials import redact
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import load_failure
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait

FAILURE = {"reason": "ModelLoadFailed", "exitCode": 2}


def isvc(generation=3, observed=3, ready=False, transition="BlockedByFailedLoad", target="FailedToLoad", rv=1, failure=None):
    failure = dict(FAILURE) if failure is None else failure
    model = {"transitionStatus": transition, "states": {"activeModelState": "", "targetModelState": target}}
    if failure:
        model["lastFailureInfo"] = failure
    return {"metadata": {"name": "m", "generation": generation, "resourceVersion": str(rv)},
            "status": {"observedGeneration": observed, "modelStatus": model,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name="m-predictor-1", restarts=2, state="CrashLoopBackOff", init_restarts=None):
    return {"name": name, "phase": "Running", "restarts": {"kserve-container": restarts},
            "init_restarts": dict(init_restarts or {}), "states": {"kserve-container": state}}


def test_verdict_is_kserve_failed_to_load_at_this_generation():
    assert load_failure.verdict(isvc())["lastFailureInfo"] == FAILURE
    assert load_failure.verdict(isvc(transition="InProgress", target="FailedToLoad")) is not None
    assert load_failure.verdict(isvc(transition="InProgress", target="Pending")) is None


@pytest.mark.parametrize("obj", [
    isvc(ready=True),              # Ready=True with a FailedToLoad left from an earlier crash: serving
    isvc(generation=4, observed=3),  # the verdict is about the previous generation: the new one has not been seen
    isvc(observed=None),
], ids=["ready-with-stale-failure", "old-generation", "never-observed"])
def test_verdict_ignores_stale_statuses(obj):
    assert load_failure.verdict(obj) is None


def test_crash_looping_needs_the_restarts():
    assert load_failure.crash_looping([pod(restarts=1)], 2) is None
    assert load_failure.crash_looping([pod(restarts=5)], 0) is None  # 0: never fail early
    worst = load_failure.crash_looping([pod("a", 2), pod("b", 4)], 2)
    assert (worst[0]["name"], worst[1], worst[2], worst[3]) == ("b", "kserve-container", 4, "CrashLoopBackOff")
    init = load_failure.crash_looping([pod(restarts=0, init_restarts={"storage-initializer": 3})], 2)
    assert init[1:3] == ("storage-initializer", 3)
    assert load_failure.crash_looping([{"name": "x", "restarts": {"sidecar": 9}}], 2) is None


@pytest.fixture
def cluster(monkeypatch):
    """Scripted reads: the InferenceService's GETs (no watch), its pods, the previous log."""
    script = {"gets": [], "pods": [pod()], "logs": [], "log": b"export HF_TOKEN=hf_abcdefghijklmnopqrstu\n"
              b"bash: -c: line 1: unexpected EOF while looking for matching `''\n"}

    def get(_api, _ns, _name):
        return script["gets"].pop(0)

    def watch(*_a, **_k):
        raise isvc_wait.k8s_pods.ApiException(status=403, reason="no watch")

    def log(_api, _ns, pod_name, **kwargs):
        script["logs"].append((pod_name, kwargs))
        yield script["log"]
    monkeypatch.setattr(isvc_wait.k8s_pods, "get_inference_service", get)
    monkeypatch.setattr(isvc_wait.k8s_pods, "list_predictor_pods", lambda *_a, **_k: (list(script["pods"]), []))
    monkeypatch.setattr(isvc_wait.k8s_pods, "stream_pod_log", log)
    monkeypatch.setattr(kube_wait, "_watch_for_change", watch)
    return script


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_wait_fails_at_once_with_last_failure_and_the_redacted_log(cluster):
    clock = Clock()
    cluster["gets"] = [isvc()]
    with pytest.raises(isvc_wait.WaitTimeout) as err:
        isvc_wait.wait_ready(None, "ns", "m", timeout=1200, interval=5, clock=clock, sleep=clock.sleep,
                             crash_loop_restarts=2, redact=redact)
    text = str(err.value)
    assert clock.now == 0  # no sleeping until the timeout
    assert "FailedToLoad" in text and "BlockedByFailedLoad" in text and "ModelLoadFailed" in text and "exitCode 2" in text
    assert "m-predictor-1 container kserve-container restarted 2 times and is CrashLoopBackOff" in text
    assert "unexpected EOF while looking for matching" in text
    assert "hf_abcdefghijklmnopqrstu" not in text and "<redacted>" in text
    assert cluster["logs"] == [("m-predictor-1", {"container": "kserve-container", "tail_lines": 20, "previous": True,
                                                  "timeout": 30})]
    assert err.value.field == "crash_loop_restarts" and "crash_loop_restarts=0" in err.value.hint
    assert err.value.pods == cluster["pods"]


@pytest.mark.parametrize("first,restarts,option", [
    (isvc(ready=True, generation=3, observed=2), 5, 2),  # stale Ready and FailedToLoad of the old generation
    (isvc(), 1, 2),                                      # one crash only
    (isvc(), 5, 0),                                      # 0: never fail early
], ids=["old-generation", "too-few-restarts", "disabled"])
def test_wait_goes_on_where_it_must_not_fail(cluster, first, restarts, option):
    clock = Clock()
    cluster["pods"] = [pod(restarts=restarts)]
    cluster["gets"] = [first, isvc(ready=True, transition="UpToDate", target="Loaded", rv=2)]
    found, elapsed = isvc_wait.wait_ready(None, "ns", "m", timeout=60, interval=5, clock=clock, sleep=clock.sleep,
                                          crash_loop_restarts=option, redact=redact)
    assert found["metadata"]["resourceVersion"] == "2" and elapsed == 5 and cluster["logs"] == []


def test_without_redaction_the_log_is_not_read(cluster):
    cluster["gets"] = [isvc()]
    with pytest.raises(isvc_wait.WaitTimeout, match="not read: this caller gives no redaction"):
        isvc_wait.wait_ready(None, "ns", "m", timeout=60, clock=Clock(), sleep=lambda s: None, crash_loop_restarts=2)
    assert cluster["logs"] == []
