"""Troubleshooting rules on API objects shaped as the API server returns them, with real vLLM log captures."""
from __future__ import annotations

import json
import tarfile

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import troubleshoot as t
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import troubleshoot_rules as rules

from tests.paths import read_capture  # noqa: E402  pylint: disable=wrong-import-position
EAGLE3 = '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'
NGRAM = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}'


def capture(folder):
    return read_capture(folder, "startup.log")


def isvc(flag=EAGLE3, ready="False", reason="", message="", mode="Standard", storage=None, annotations=None):
    model = {"modelFormat": {"name": "vllm"}, "args": ["--port", "8080"] + (["--speculative-config", flag] if flag else [])}
    predictor = {"model": model}
    if storage:
        predictor["storageUris"] = [{"uri": u} for u in storage]
    conds = [{"type": "IngressReady", "status": "True"},
             {"type": "PredictorReady", "status": ready, "reason": reason, "message": message},
             {"type": "Ready", "status": ready, "reason": reason, "message": message}]
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "llama", "namespace": "models", "generation": 2,
                         "annotations": dict({"serving.kserve.io/deploymentMode": mode}, **(annotations or {}))},
            "spec": {"predictor": predictor},
            "status": {"conditions": conds, "deploymentMode": mode, "observedGeneration": 2}}


def pod(name="llama-predictor-abc", phase="Running", statuses=None, init_statuses=None, conditions=None):
    return {"metadata": {"name": name, "namespace": "models"},
            "spec": {"containers": [{"name": "kserve-container"}]},
            "status": {"phase": phase, "conditions": conditions or [{"type": "PodScheduled", "status": "True"}],
                       "containerStatuses": statuses or [], "initContainerStatuses": init_statuses or []}}


def cstatus(name="kserve-container", ready=False, waiting=None, running=False, last=None, restarts=0, image="vllm:0.32.0"):
    state = {"waiting": waiting} if waiting else ({"running": {"startedAt": "2025-01-01T00:00:00Z"}} if running else {})
    out = {"name": name, "ready": ready, "restartCount": restarts, "image": image, "state": state}
    if last:
        out["lastState"] = {"terminated": last}
    return out


def causes(findings):
    return [f["cause"] for f in findings]


def test_crash_loop_names_the_vllm_error_from_the_previous_log():
    prev = capture("eagle3").split("SpecDecoding metrics")[0][:4000] + (
        "\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
        "ValueError: Target and draft model should have the same vocabulary size. Target: 128256, Draft: 32000\n")
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(),
            "pods": [pod(statuses=[cstatus(waiting={"reason": "CrashLoopBackOff"}, last={"exitCode": 1, "reason": "Error"}, restarts=4)])],
            "logs": {"llama-predictor-abc": {"kserve-container": {"current": "", "previous": prev}}}}
    findings = rules.diagnose(snap)
    assert findings[0]["cause"] == "crash_loop"
    assert "Target and draft model should have the same vocabulary size" in findings[0]["title"]
    assert "speculative config is rejected" in findings[0]["fix"]


def test_oom_killed_and_cuda_oom():
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(),
            "pods": [pod(statuses=[cstatus(waiting={"reason": "CrashLoopBackOff"}, last={"exitCode": 137, "reason": "OOMKilled"}, restarts=2)])]}
    assert rules.diagnose(snap)[0]["cause"] == "oom"
    snap["pods"] = [pod(statuses=[cstatus(waiting={"reason": "CrashLoopBackOff"}, last={"exitCode": 1, "reason": "Error"}, restarts=2)])]
    oom_log = "INFO loading\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    snap["logs"] = {"llama-predictor-abc": {"kserve-container": {"previous": oom_log}}}
    first = rules.diagnose(snap)[0]
    assert first["cause"] == "oom" and "accelerator memory" in first["title"] and "draft" in first["fix"]


def test_image_pull_of_the_modelcar_image_points_at_pull_secrets():
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(storage=["oci://registry.internal:5000/m:v1"]),
            "pods": [pod(phase="Pending", statuses=[
                cstatus(), cstatus(name="modelcar", image="registry.internal:5000/m:v1",
                                   waiting={"reason": "ImagePullBackOff",
                                            "message": "Back-off pulling image: 401 Unauthorized"})])],
            "storage_initializer": {"enableModelcar": True}}
    first = rules.diagnose(snap)[0]
    assert first["cause"] == "image_pull" and "Modelcar" in first["title"]
    assert "imagePullSecrets" in first["fix"] and "artifact_credentials" in first["fix"]


def test_pending_pod_unschedulable():
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(),
            "pods": [pod(phase="Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                       "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])],
            "events": [{"involvedObject": {"kind": "Pod", "name": "llama-predictor-abc"}, "type": "Warning", "reason": "FailedScheduling",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}
    first = rules.diagnose(snap)[0]
    assert first["cause"] == "pending_pod" and "Insufficient nvidia.com/gpu" in first["evidence"][0]


@pytest.mark.parametrize("flag, draft", [(EAGLE3, True), (NGRAM, False)])
def test_progress_deadline_exceeded(flag, draft):
    msg = 'ReplicaSet "llama-predictor-6d4" has timed out progressing.'
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(flag=flag, reason="ProgressDeadlineExceeded", message=msg),
            "pods": [pod(statuses=[cstatus(running=True)])],
            "deployments": [{"metadata": {"name": "llama-predictor"}, "spec": {"progressDeadlineSeconds": 600},
                             "status": {"conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                                        "message": msg}]}}],
            "logs": {"llama-predictor-abc": {"kserve-container": {"current": "INFO Loading weights took 200 s\n"}}}}
    first = rules.diagnose(snap)[0]
    assert first["cause"] == "readiness_deadline"
    assert ("too short for the target + draft" in first["title"]) is draft
    assert "progressDeadlineSeconds" in first["fix"] and "progressDeadlineSeconds=600" in " ".join(first["evidence"])
    knative = dict(snap, isvc=isvc(flag=flag, reason="ProgressDeadlineExceeded", message=msg, mode="Knative",
                                   annotations={"serving.knative.dev/progress-deadline": "600s"}))
    assert "serving.knative.dev/progress-deadline" in rules.diagnose(knative)[0]["fix"]


def test_probe_kills_a_loading_engine_is_a_deadline_not_a_crash():
    prev = "\n".join(capture("eagle3").splitlines()[:15])   # killed while loading: no error, no startup complete
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(),
            "pods": [pod(statuses=[cstatus(running=True, last={"exitCode": 137, "reason": "Error"}, restarts=3)])],
            "events": [{"involvedObject": {"kind": "Pod", "name": "llama-predictor-abc"}, "type": "Warning", "reason": "Unhealthy",
                        "message": "Startup probe failed: Get \"http://10.0.0.1:8080/health\": connection refused"}],
            "logs": {"llama-predictor-abc": {"kserve-container": {"previous": prev, "current": "INFO starting\n"}}}}
    findings = rules.diagnose(snap)
    assert findings[0]["cause"] == "readiness_deadline" and "draft" in findings[0]["title"]
    assert "crash_loop" not in causes(findings)


def test_acceptance_near_zero_from_the_eagle3_capture():
    log = capture("eagle3")
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(ready="True"),
            "pods": [pod(statuses=[cstatus(ready=True, running=True)])],
            "logs": {"llama-predictor-abc": {"kserve-container": {"current": log}}}}
    findings = rules.diagnose(snap)
    assert findings[0]["cause"] == "acceptance_near_zero" and findings[0]["severity"] == "error"
    assert "does not match the target" in findings[0]["fix"]
    assert "draft acceptance 0.0%" in findings[0]["evidence"][0]
    healthy = dict(snap, isvc=isvc(flag=NGRAM, ready="True"),
                   logs={"llama-predictor-abc": {"kserve-container": {"current": capture("ngram")}}})
    assert "acceptance_near_zero" not in causes(rules.diagnose(healthy))


def test_acceptance_from_a_spec_metrics_result_wins():
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(ready="True"), "pods": [],
            "metrics": {"has_data": True, "source": "prometheus", "draft_acceptance_rate": 0.01, "mean_acceptance_length": 1.03,
                        "num_draft_tokens": 3000, "per_position_acceptance_rate": [0.02, 0.01, 0.0],
                        "diagnosis": {"status": "likely_draft_mismatch", "reason": "draft tokens are almost never accepted"}}}
    first = rules.diagnose(snap)[0]
    assert first["cause"] == "acceptance_near_zero" and "source prometheus" in first["evidence"][0]


def test_deployment_mode_change_rejected():
    text = ('admission webhook "inferenceservice.kserve-webhook-server.validator" denied the request: '
            "update rejected: deploymentMode cannot be changed from 'Standard' to 'Knative'")
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(ready="True"), "pods": [], "deploy_errors": [text]}
    first = rules.diagnose(snap)[0]
    assert first["cause"] == "deployment_mode_change_rejected" and "from Standard to Knative" in first["title"]
    assert "delete the InferenceService and create it again" in first["fix"]
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(ready="True", mode="Standard"), "pods": [],
            "expected_deployment_mode": "Serverless"}
    assert rules.diagnose(snap)[0]["cause"] == "deployment_mode_change_rejected"
    same = dict(snap, expected_deployment_mode="RawDeployment")
    assert "deployment_mode_change_rejected" not in causes(rules.diagnose(same))


def test_modelcar_off_with_oci_uris():
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(storage=["oci://r/m:v1"]), "pods": [],
            "storage_initializer": {"enableModelcar": False}, "deployments": [{"metadata": {"name": "x"}}]}
    assert "modelcar_disabled" in causes(rules.diagnose(snap))


def test_storage_initializer_refused_points_at_credentials():
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(storage=["hf://meta-llama/Llama-3.1-8B-Instruct"]),
            "pods": [pod(phase="Pending", statuses=[cstatus(waiting={"reason": "PodInitializing"})],
                         init_statuses=[cstatus(name="storage-initializer", waiting={"reason": "CrashLoopBackOff"},
                                                last={"exitCode": 1, "reason": "Error"}, restarts=2)])],
            "logs": {"llama-predictor-abc": {"storage-initializer": {
                "previous": "huggingface_hub.errors.GatedRepoError: 401 Client Error. Cannot access gated repo"}}}}
    first = rules.diagnose(snap)[0]
    assert first["cause"] == "storage_download" and "HF_TOKEN" in first["fix"] and "GatedRepoError" in first["evidence"][0]


def test_never_ready_still_loading_is_starting():
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(reason="MinimumReplicasUnavailable"),
            "pods": [pod(statuses=[cstatus(running=True)])],
            "logs": {"llama-predictor-abc": {"kserve-container": {"current": "\n".join(capture("eagle3").splitlines()[:15])}}}}
    first = rules.diagnose(snap)[0]
    assert first["cause"] == "starting" and "draft" in first["title"]


def test_missing_isvc_and_no_pods():
    assert rules.diagnose({"namespace": "m", "name": "x", "isvc_error": "InferenceService m/x: not found (HTTP 404)"})[0]["cause"] == "not_found"
    first = rules.diagnose({"namespace": "models", "name": "llama", "isvc": isvc(), "pods": []})[0]
    assert first["cause"] == "pods_not_created" and "KServe controller did not reconcile" in " ".join(first["evidence"])


def test_describe_summary_and_archive_redaction(tmp_path):
    snap = {"namespace": "models", "name": "llama", "isvc": isvc(reason="ProgressDeadlineExceeded", message="timed out progressing"),
            "events": [{"involvedObject": {"kind": "InferenceService", "name": "llama"}, "type": "Warning", "reason": "InternalError",
                        "message": "fails to reconcile", "count": 3}],
            "pods": [pod(statuses=[cstatus(running=True)])], "vllm_version": "0.32.0", "storage_initializer": {"enableModelcar": True}}
    text = t.describe(snap)
    assert "Ready" in text and "ProgressDeadlineExceeded" in text and "InternalError" in text and "eagle3" in text
    findings = rules.diagnose(snap)
    summary = t.summary_markdown([t.service_summary(snap, findings)])
    assert "## models/llama: likely cause readiness_deadline" in summary and "Modelcar: on" in summary and "vLLM version: 0.32.0" in summary
    path = str(tmp_path / "b.tar.gz")
    members = t.write_archive(path, {"summary.md": summary, "logs/x.log": "token hf_abcdefghijklmnopqrstu and CANARY-VALUE-1"},
                              secrets=["CANARY-VALUE-1"], root="bundle")
    assert members == ["bundle/logs/x.log", "bundle/summary.md"]
    with tarfile.open(path) as tar:
        log = tar.extractfile("bundle/logs/x.log").read().decode()
    assert "CANARY-VALUE-1" not in log and "hf_abcdefghijklmnopqrstu" not in log and "<redacted>" in log
    json.dumps(findings)
