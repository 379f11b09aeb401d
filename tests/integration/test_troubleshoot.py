"""Troubleshooting bundle on the loopback test bed: a crash-looping predictor with a previous log, and a never-ready
one whose Deployment runs out of its progress deadline. The archive's files, the summary's likely cause and the
redaction of secret values are checked on what the real playbook wrote."""
from __future__ import annotations

import base64
import json
import os
import tarfile
import time

import pytest
import yaml

from tests.ansible_run import PlaybookRun, run_playbook

from tests.paths import read_capture  # noqa: E402  pylint: disable=wrong-import-position

EAGLE3 = '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'
CANARY = "CANARYapiKeyInSecret0987654321"
CANARY_ARG = "CANARYtokenInArgs1234567890"


def capture(folder):
    return read_capture(folder, "startup.log")


def create_isvc(k8s_client, ns, name, env=None, args_extra=()):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    model = {"modelFormat": {"name": "vllm"}, "args": ["--port", "8080", "--speculative-config", EAGLE3] + list(args_extra)}
    if env:
        model["env"] = env
    body = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": name, "annotations": {"serving.kserve.io/deploymentMode": "Standard"}},
            "spec": {"predictor": {"minReplicas": 1, "model": model}}}
    client.CustomObjectsApi(k8s_client).create_namespaced_custom_object("serving.kserve.io", "v1beta1", ns, "inferenceservices", body)


def wait_for(predicate, what, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    pytest.fail("timed out waiting for " + what)
    return None


def running_pods(k8s_client, ns, name):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    pods = client.CoreV1Api(k8s_client).list_namespaced_pod(ns, label_selector="serving.kserve.io/inferenceservice=%s" % name).items
    return [p for p in pods if p.metadata.deletion_timestamp is None and p.status and p.status.phase == "Running"]


def parsed(run):
    """A -vvv run prints lines before the json callback's document: parse from the document's first line."""
    start = run.stdout.find("\n{\n")
    proc = type("Proc", (), {"returncode": run.rc, "stdout": run.stdout[start + 1:] if start >= 0 else run.stdout, "stderr": run.stderr})
    return PlaybookRun(proc)


def read_archive(path):
    out = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            out[member.name.split("/", 1)[1]] = tar.extractfile(member).read().decode("utf-8")
    return out


def test_crash_looping_predictor_bundle(tmp_path, k8s_client, kubeconfig, kserve, namespace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    core = client.CoreV1Api(k8s_client)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "vllm-api"}, "stringData": {"VLLM_API_KEY": CANARY}})
    previous = ("\n".join(capture("eagle3").splitlines()[:30]) + "\n(APIServer pid=1) INFO non-default args: {'api_key': '%s'}\n"
                "(EngineCore pid=7) Loading with key %s\nTraceback (most recent call last):\n  File \"/opt/vllm/config.py\", line 9\n"
                "ValueError: Target and draft model should have the same vocabulary size. Target: 4096, Draft: 32000\n") % (CANARY, CANARY)
    kserve.set_behaviour(namespace, "crashy", crash_loop=True, logs={"kserve-container": "INFO starting again\n"},
                         previous_logs={"kserve-container": previous})
    create_isvc(k8s_client, namespace, "crashy", args_extra=["--hf-token", CANARY_ARG],
                env=[{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-api", "key": "VLLM_API_KEY"}}}])
    pods = wait_for(lambda: running_pods(k8s_client, namespace, "crashy"), "the crash-looping pod")
    pod = pods[0].metadata.name
    dest = tmp_path / "out"
    run = run_playbook(tmp_path, "playbooks/troubleshoot.yml", kubeconfig=kubeconfig, verbosity=3, extra_vars={
        "troubleshoot_names": ["%s/crashy" % namespace], "troubleshoot_dest": str(dest), "troubleshoot_tail_lines": 200,
        "troubleshoot_kserve_namespaces": [namespace]})
    assert run.rc == 0, run.output
    for value in (CANARY, CANARY_ARG, base64.b64encode(CANARY.encode()).decode()):
        assert value not in run.stdout + run.stderr
    result = parsed(run).result("Collect the bundle")
    service = result["services"][0]
    assert service["likely_cause"] == "crash_loop", result["summary"]
    assert "Target and draft model should have the same vocabulary size" in service["findings"][0]["title"]
    assert service["vllm_version"] == "0.32.0"
    files = read_archive(result["archive"])
    base = "%s/crashy/" % namespace
    for rel in ("inferenceservice.yaml", "describe.txt", "events.yaml", "deployments.yaml", "pods/%s.yaml" % pod,
                "pods/%s.events.yaml" % pod, "logs/%s/kserve-container.log" % pod, "logs/%s/kserve-container.previous.log" % pod,
                "engine_config.json", "findings.json"):
        assert base + rel in files, sorted(files)
    assert "summary.md" in files and "summary.json" in files
    assert "starting again" in files[base + "logs/%s/kserve-container.log" % pod]
    prev_log = files[base + "logs/%s/kserve-container.previous.log" % pod]
    assert "same vocabulary size" in prev_log and "<redacted>" in prev_log
    for rel, text in files.items():
        assert CANARY not in text and CANARY_ARG not in text, rel
    isvc = yaml.safe_load(files[base + "inferenceservice.yaml"])
    assert isvc["metadata"]["name"] == "crashy" and isvc["status"]["conditions"]
    describe = files[base + "describe.txt"]
    assert "Conditions:" in describe and "PredictorReady" in describe and "eagle3" in describe
    # the draft preflight re-run for the bundle: this predictor names no target path (no --model), which it says
    assert "  preflight eagle3: skipped (InferenceService crashy: the target path is not on the command line)" in describe, describe
    assert json.loads(files[base + "preflight.json"])["skipped"].endswith("the target path is not on the command line")
    pod_yaml = yaml.safe_load(files[base + "pods/%s.yaml" % pod])
    assert pod_yaml["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    summary = (dest / os.path.basename(result["summary_path"])).read_text()
    assert summary == files["summary.md"] and "likely cause crash_loop" in summary and "vLLM version: 0.32.0" in summary
    assert "Modelcar: unknown" in summary


def test_never_ready_with_draft_runs_out_of_its_deadline(tmp_path, k8s_client, kubeconfig, kserve, namespace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    core, apps = client.CoreV1Api(k8s_client), client.AppsV1Api(k8s_client)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "inferenceservice-config"}, "data": {
        "storageInitializer": '{"image": "kserve/storage-initializer:v0.20.0", "enableModelcar": false, "uidModelcar": 1010}'}})
    loading = "\n".join(capture("eagle3").splitlines()[:20]) + "\n"
    kserve.set_behaviour(namespace, "slow", never_ready=True, logs={"kserve-container": loading})
    create_isvc(k8s_client, namespace, "slow")
    wait_for(lambda: running_pods(k8s_client, namespace, "slow"), "the never-ready pod")
    dep = wait_for(lambda: apps.list_namespaced_deployment(namespace).items, "the predictor Deployment")[0]
    apps.patch_namespaced_deployment(dep.metadata.name, namespace, {"spec": {"progressDeadlineSeconds": 1}})

    def exceeded():   # KServe shows Available=False (MinimumReplicasUnavailable) on the InferenceService; the Deployment says why
        conds = apps.read_namespaced_deployment(dep.metadata.name, namespace).status.conditions or []
        return any(c.reason == "ProgressDeadlineExceeded" for c in conds)
    wait_for(exceeded, "ProgressDeadlineExceeded on the predictor Deployment", timeout=120)
    run = run_playbook(tmp_path, "playbooks/troubleshoot.yml", kubeconfig=kubeconfig, extra_vars={
        "troubleshoot_names": ["slow"], "troubleshoot_namespace": namespace, "troubleshoot_dest": str(tmp_path / "out"),
        "troubleshoot_kserve_namespaces": ["kserve-absent", namespace], "troubleshoot_archive_name": "slow.tar.gz"})
    assert run.rc == 0, run.output
    result = run.result("Collect the bundle")
    assert result["archive"] == str(tmp_path / "out" / "slow.tar.gz")
    service = result["services"][0]
    assert service["likely_cause"] == "readiness_deadline", result["summary"]
    assert service["modelcar"] is False
    first = service["findings"][0]
    assert "too short for the target + draft cold start" in first["title"]
    assert "progressDeadlineSeconds=1" in " ".join(first["evidence"])
    files = read_archive(result["archive"])
    config = yaml.safe_load(files["kserve/inferenceservice-config.yaml"])
    assert config["namespace"] == namespace and config["data"]["storageInitializer"]["enableModelcar"] is False
    assert "Modelcar: off" in files["summary.md"]
    assert "logs/%s/kserve-container.previous.log" % running_pods(k8s_client, namespace, "slow")[0].metadata.name not in \
        " ".join(files)   # no restart, no previous log


def test_ready_but_draft_never_accepted(tmp_path, k8s_client, kubeconfig, kserve, namespace):
    kserve.set_behaviour(namespace, "mismatch", logs={"kserve-container": capture("eagle3")})
    create_isvc(k8s_client, namespace, "mismatch")
    wait_for(lambda: running_pods(k8s_client, namespace, "mismatch"), "the ready pod")
    run = run_playbook(tmp_path, "playbooks/troubleshoot.yml", kubeconfig=kubeconfig, extra_vars={
        "troubleshoot_names": ["%s/mismatch" % namespace], "troubleshoot_dest": str(tmp_path / "out"),
        "troubleshoot_kserve_namespaces": [namespace]})
    assert run.rc == 0, run.output
    metrics = run.result("Read the acceptance metrics")["results"][0]
    assert metrics["has_data"] is True and metrics["num_accepted_tokens"] == 0   # from the pods' SpecDecoding lines
    service = run.result("Collect the bundle")["services"][0]
    assert service["likely_cause"] == "acceptance_near_zero", run.result("Collect the bundle")["summary"]
    assert "does not match the target" in service["findings"][0]["fix"]
    files = read_archive(run.result("Collect the bundle")["archive"])
    assert '"has_data": true' in files["%s/mismatch/spec_metrics.json" % namespace]
    assert "speculative_config" in files["%s/mismatch/engine_config.json" % namespace]
