"""isvc_wait's error paths (the watch itself is tested on the real API server in tests/integration/test_isvc_wait.py):
a refused watch falls back to polling at `interval`, an API outage is waited out, other errors are raised."""

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.pods import ApiException


def isvc(generation, observed, ready, rv):
    return {"metadata": {"name": "m", "generation": generation, "resourceVersion": str(rv)},
            "status": {"observedGeneration": observed, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def api_error(status):
    exc = ApiException(status=status, reason="x")
    return exc


@pytest.fixture
def reads(monkeypatch):
    """Scripted GETs of the InferenceService and watches that fail as the test says."""
    script = {"gets": [], "watch_errors": [], "watches": 0}

    def get(_api, _ns, _name):
        item = script["gets"].pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def watch(_api, _ns, _name, _rv, _seconds, kind=None):  # pylint: disable=unused-argument
        script["watches"] += 1
        raise script["watch_errors"].pop(0)
    monkeypatch.setattr(isvc_wait.k8s_pods, "get_inference_service", get)
    monkeypatch.setattr(kube_wait, "_watch_for_change", watch)
    return script


def test_refused_watch_falls_back_to_polling_at_the_interval(reads):
    clock = Clock()
    reads["gets"] = [isvc(2, 1, True, 10), isvc(2, 1, True, 11), isvc(2, 2, True, 12)]
    reads["watch_errors"] = [api_error(403)]
    found, elapsed = isvc_wait.wait_ready(None, "ns", "m", timeout=60, interval=7, clock=clock, sleep=clock.sleep)
    assert found["metadata"]["resourceVersion"] == "12"
    # one watch attempt (refused: no `watch` verb), then plain reads every 7 s and no more watches
    assert reads["watches"] == 1 and clock.sleeps == [7, 7] and elapsed == 14


def test_api_outage_during_the_watch_is_waited_out(reads):
    clock = Clock()
    reads["gets"] = [isvc(1, None, False, 1), isvc(1, 1, True, 2)]
    reads["watch_errors"] = [api_error(503)]
    found, _elapsed = isvc_wait.wait_ready(None, "ns", "m", timeout=60, interval=2, clock=clock, sleep=clock.sleep)
    # read again after the outage's first short pause, not after the 2 s poll interval
    assert found["metadata"]["resourceVersion"] == "2" and clock.sleeps == [kube_wait.OUTAGE_RETRY_FIRST]


def test_expired_resource_version_is_read_again_at_once(reads):
    """After an API server restart the watch from the old resourceVersion gets 410 Gone: read again, do not sleep."""
    clock = Clock()
    reads["gets"] = [isvc(2, 1, True, 872), isvc(2, 2, True, 879)]
    reads["watch_errors"] = [api_error(410)]
    found, _elapsed = isvc_wait.wait_ready(None, "ns", "m", timeout=60, interval=5, clock=clock, sleep=clock.sleep)
    assert found["metadata"]["resourceVersion"] == "879" and clock.sleeps == [] and reads["watches"] == 1


def test_other_watch_errors_are_raised(reads):
    clock = Clock()
    reads["gets"] = [isvc(1, None, False, 1)]
    reads["watch_errors"] = [api_error(400)]
    with pytest.raises(ApiException):
        isvc_wait.wait_ready(None, "ns", "m", timeout=60, interval=2, clock=clock, sleep=clock.sleep)


def test_timeout_names_the_stale_generation(reads, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(isvc_wait, "_pod_states", lambda *_a: [])
    reads["gets"] = [isvc(3, 2, True, 5)] * 4
    reads["watch_errors"] = [api_error(403)]
    with pytest.raises(isvc_wait.WaitTimeout) as err:
        isvc_wait.wait_ready(None, "ns", "m", timeout=10, interval=4, clock=clock, sleep=clock.sleep)
    assert "ns/m is not reconciled yet after 10s" in str(err.value) and "generation 3, observedGeneration 2" in str(err.value)


def test_an_inference_service_is_watched_at_v1beta1_whatever_api_version_the_caller_passes():
    """The isvc_wait module always passes api_version (the LLMInferenceService option, default v1alpha2): an
    InferenceService watch at that version is a 404, which failed every wait that did not return at the first read."""
    kind = isvc_wait._Kind("InferenceService", "v1alpha2")  # pylint: disable=protected-access
    assert (kind.group, kind.version, kind.plural) == ("serving.kserve.io", "v1beta1", "inferenceservices")
    llm = isvc_wait._Kind("LLMInferenceService", "v1alpha1")  # pylint: disable=protected-access
    assert (llm.version, llm.plural) == ("v1alpha1", "llminferenceservices")


def _refused(generation, observed, transition="InvalidSpec"):
    obj = isvc(generation, observed, False, 7)
    obj["status"]["modelStatus"] = {"transitionStatus": transition, "states": {"targetModelState": "FailedToLoad"},
                                    "lastFailureInfo": {"reason": "RuntimeNotRecognized", "message": "Waiting for runtime to become available"}}
    return obj


def test_a_predictor_kserve_refused_fails_at_once_in_one_line_with_the_fix(reads, monkeypatch):
    """KServe's InvalidSpec at this generation (a missing ServingRuntime: RuntimeNotRecognized) is not waited out."""
    clock = Clock()
    monkeypatch.setattr(isvc_wait, "_pod_states", lambda *_a: [])
    reads["gets"] = [_refused(2, 2)]
    with pytest.raises(isvc_wait.WaitTimeout) as err:
        isvc_wait.wait_ready(None, "ns", "m", timeout=600, interval=4, clock=clock, sleep=clock.sleep)
    message = str(err.value)
    assert clock.now == 0 and "\n" not in message
    assert "ns/m cannot become Ready: KServe refused the predictor (InvalidSpec, RuntimeNotRecognized)" in message
    assert "spec_decoding_runtime" in err.value.hint and "ServingRuntime" in err.value.hint


def test_an_old_generations_refusal_or_a_loaded_model_is_waited_on(reads, monkeypatch):
    """The refusal of the generation before a fix, or a failure KServe only keeps as history, is no reason to stop."""
    monkeypatch.setattr(isvc_wait, "_pod_states", lambda *_a: [])
    for obj in (_refused(3, 2), _refused(2, 2, transition="UpToDate")):
        clock = Clock()
        reads["gets"] = [obj] * 4
        reads["watch_errors"] = [api_error(403)]
        with pytest.raises(isvc_wait.WaitTimeout) as err:
            isvc_wait.wait_ready(None, "ns", "m", timeout=10, interval=4, clock=clock, sleep=clock.sleep)
        assert "after 10s" in str(err.value) and "refused" not in str(err.value)
