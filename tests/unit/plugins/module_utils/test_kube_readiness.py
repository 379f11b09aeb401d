"""kube/wait.py's one readiness table (kind -> why not ready, or None), as kubernetes.core's waiter has its predicates."""
import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # noqa: F401  pylint: disable=unused-import  # registers the KServe rows


def _deployment(generation=2, observed=2, replicas=2, updated=2, total=2, available=2):
    return {"metadata": {"name": "d", "generation": generation}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "updatedReplicas": updated, "replicas": total, "availableReplicas": available}}


def test_a_deployment_is_ready_as_kubectl_rollout_status_says():
    assert kube_wait.pending("Deployment", _deployment()) is None
    assert kube_wait.pending("Deployment", _deployment(observed=1)) == "Deployment d not observed at generation 2 yet"
    assert kube_wait.pending("Deployment", _deployment(total=3)) == "Deployment d rolling out (2 of 2 updated, 1 old, 2 available)"
    assert kube_wait.pending("Deployment", _deployment(available=1)) == "Deployment d rolling out (2 of 2 updated, 0 old, 1 available)"


def test_a_job_is_ready_when_complete_and_a_failed_one_fails_the_wait():
    job = {"metadata": {"name": "j"}, "status": {"active": 1}}
    assert kube_wait.pending("Job", job) == "Job j not complete (1 active, 0 succeeded)"
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    assert kube_wait.pending("Job", job) is None
    job["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "3 failures"}]}
    with pytest.raises(SpecDecodingError, match="Job j failed: BackoffLimitExceeded: 3 failures"):
        kube_wait.pending("Job", job)


def test_the_kserve_kinds_are_rows_of_the_same_table_ready_at_the_current_generation():
    isvc = {"metadata": {"generation": 3}, "status": {"observedGeneration": 2, "conditions": [{"type": "Ready", "status": "True"}]}}
    assert kube_wait.pending("InferenceService", isvc) == "not reconciled yet"  # a Ready left over from the last generation
    isvc["status"]["observedGeneration"] = 3
    assert kube_wait.pending("InferenceService", isvc) is None
    assert {"Deployment", "Job", "InferenceService", "LLMInferenceService"} <= set(kube_wait.READINESS)
    with pytest.raises(SpecDecodingError, match="no readiness check for kind Pod"):
        kube_wait.pending("Pod", {})
