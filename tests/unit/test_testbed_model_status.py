"""KServe v0.20.0's PropagateModelStatus cases (tests/fixtures/kserve/model_status.json) against the KServe stand-in's
reading of it (tests/testbed/kserve_model_status.py), which writes status.modelStatus of a raw-deployment
InferenceService: the FailedToLoad verdict the collection's wait acts on comes from KServe's own rule."""
from __future__ import annotations

import pytest

from tests.paths import kserve_vectors
from tests.testbed import kserve_model_status

DOC = kserve_vectors("model_status.json")
CASES = DOC["cases"]


def _run(data):
    status = data["service_ready"]
    return kserve_model_status.propagate_model_status(
        data["model_status"], data["isvc_ready"] == "True", data["pods"], raw_deployment=data["raw_deployment"],
        service_conditions=[] if status is None else [{"type": "Ready", "status": status}],
        latest_created=data["latest_created_revision"], latest_ready=data["latest_ready_revision"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_standin_model_status_follows_kserve(case):
    model, returned = _run(case["input"])
    want = case["expected"]
    assert returned is want["returns"]
    if "totalCopies" in want:
        assert model["copies"]["totalCopies"] == want["totalCopies"]
        assert model["states"] == case["input"]["model_status"]["states"]  # counting leaves the states alone
        return
    assert model.get("states") == want["states"]
    assert model.get("transitionStatus", "") == want["transitionStatus"]
    assert model.get("lastFailureInfo") == want["lastFailureInfo"]


def test_vectors_name_their_upstream():
    assert DOC["source"]["tag"] == "v0.20.0"
    assert {c["go_test"] for c in CASES} == {"TestInferenceServiceStatus_PropagateModelStatus",
                                             "TestPropagateModelStatus_ReadyPodsCountingOnly"}
    assert len(CASES) == 17


def test_failure_keeps_an_earlier_failure_and_copies_count_ready_pods():
    before = {"transitionStatus": "BlockedByFailedLoad", "lastFailureInfo": {"reason": "ModelLoadFailed", "exitCode": 2}}
    pod = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                      "containerStatuses": [{"name": "kserve-container", "state": {"running": {}}}]}}
    model = kserve_model_status.propagate_model_status(before, False, [pod])[0]
    assert model["states"]["targetModelState"] == "Pending" and model["transitionStatus"] == "InProgress"
    assert model["lastFailureInfo"] == before["lastFailureInfo"]  # KServe only replaces it with a newer failure
    assert model["copies"]["totalCopies"] == 0
