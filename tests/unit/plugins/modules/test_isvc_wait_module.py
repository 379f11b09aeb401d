"""isvc_wait's `unchanged` (issue 46, P4): a no-op redeploy hands the wait the apply's answer, and an InferenceService Ready at
its generation there is returned without a client or a read; anything else is waited for as before. The wait itself runs
against the real API server in tests/integration/test_isvc_wait.py."""
import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as kserve_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from tests.module_run import run_module


def isvc(generation, observed, ready):
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "llama-eagle3", "namespace": "models", "generation": generation},
            "status": {"observedGeneration": observed, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


CLIENT = object()


@pytest.fixture
def waits(monkeypatch):
    """The API clients the module builds and the waits it starts: recorded, the waits answered with the object Ready at
    generation 3."""
    calls = {"clients": [], "waits": []}

    def wait_ready(api_client, namespace, name, **kwargs):
        assert api_client is CLIENT
        calls["waits"].append((namespace, name, kwargs["kind"]))
        return isvc(3, 3, True), 1.25

    def client(**kwargs):
        calls["clients"].append(kwargs)
        return CLIENT
    monkeypatch.setattr(kserve_wait, "wait_ready", wait_ready)
    monkeypatch.setattr(kube_client, "authenticated_api_client", client)
    return calls


BASE = {"name": "llama-eagle3", "namespace": "models"}


def test_an_unchanged_object_ready_at_its_generation_is_returned_without_a_read(waits):
    result = run_module("isvc_wait", dict(BASE, unchanged=isvc(2, 2, True)))
    assert not result.failed, result
    assert (result["ready"], result["waited"], result["elapsed"], result["generation"]) == (True, False, 0.0, 2)
    assert result["resource"]["metadata"]["generation"] == 2 and result["changed"] is False
    assert waits == {"clients": [], "waits": []}


@pytest.mark.parametrize("unchanged,kind", [
    (isvc(2, 1, True), "InferenceService"),    # Ready left over from the previous generation
    (isvc(2, 2, False), "InferenceService"),   # reconciled but not Ready
    ({}, "InferenceService"),                   # nothing handed over
    (isvc(2, 2, True), "LLMInferenceService"),  # its pool rollouts are not in the object
])
def test_anything_else_is_waited_for(waits, unchanged, kind):
    result = run_module("isvc_wait", dict(BASE, unchanged=unchanged, kind=kind))
    assert not result.failed, result
    assert (result["waited"], result["generation"], result["elapsed"]) == (True, 3, 1.2)
    assert waits["waits"] == [("models", "llama-eagle3", kind)] and len(waits["clients"]) == 1
