"""Artifact credentials on the real kube-apiserver: Secrets as KServe reads them, the ServiceAccount binding them,
the InferenceService's pods running as it (imagePullSecrets copied by the API server's ServiceAccount admission),
and canary secret values that never appear in ansible-playbook output (-vvv) nor in GitOps files."""
from __future__ import annotations

import base64
import json
import os
import time

import yaml

from tests.ansible_run import PlaybookRun, run_playbook

from tests.paths import CAPTURES  # noqa: E402  pylint: disable=wrong-import-position
CANARY_HF = "hf_CANARYhfTokenDoNotPrint0123456789"
CANARY_S3 = "CANARYs3SecretKeyDoNotPrint/abc+987"
CANARY_REG = "CANARYregistryPasswordDoNotPrint42"
CANARIES = (CANARY_HF, CANARY_S3, CANARY_REG, base64.b64encode(CANARY_HF.encode()).decode(),
            base64.b64encode(CANARY_S3.encode()).decode(), base64.b64encode(("robot:" + CANARY_REG).encode()).decode())


def _vars(namespace, **more):
    out = {"spec_decoding_hosts": "localhost", "artifact_credentials_target": "cluster",
           "artifact_credentials_namespace": namespace, "artifact_credentials_service_account_name": "llm-artifacts",
           "artifact_credentials_hf_token": CANARY_HF,
           "artifact_credentials_s3": {"access_key_id": "AKIACANARYID0001", "secret_access_key": CANARY_S3,
                                       "endpoint": "http://minio.storage.svc:9000", "use_https": False, "region": "us-east-2"},
           "artifact_credentials_registries": [{"server": "registry.internal.example:5000", "username": "robot", "password": CANARY_REG}]}
    out.update(more)
    return out


def parsed(run):
    """A -vvv run prints lines before the json callback's document: parse from the document's first line."""
    start = run.stdout.find("\n{\n")
    proc = type("Proc", (), {"returncode": run.rc, "stdout": run.stdout[start + 1:] if start >= 0 else run.stdout, "stderr": run.stderr})
    return PlaybookRun(proc)


def _assert_no_canary(text, where):
    for value in CANARIES:
        assert value not in text, "secret value %r leaked into %s" % (value[:12], where)


def test_cluster_secrets_service_account_and_pods_use_them(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    core = client.CoreV1Api(k8s_client)
    run = run_playbook(tmp_path, "playbooks/credentials.yml", extra_vars=_vars(namespace), kubeconfig=kubeconfig, verbosity=3)
    assert run.rc == 0, run.output
    _assert_no_canary(run.stdout + run.stderr, "the json callback output at -vvv")
    assert parsed(run).changed >= 2   # the Secrets (one looped task) and the ServiceAccount

    hf = core.read_namespaced_secret("llm-artifacts-hf", namespace)
    assert base64.b64decode(hf.data["HF_TOKEN"]).decode() == CANARY_HF and hf.type == "Opaque"
    s3 = core.read_namespaced_secret("llm-artifacts-s3", namespace)
    assert base64.b64decode(s3.data["AWS_SECRET_ACCESS_KEY"]).decode() == CANARY_S3
    assert base64.b64decode(s3.data["AWS_ACCESS_KEY_ID"]).decode() == "AKIACANARYID0001"
    assert s3.metadata.annotations == {"serving.kserve.io/s3-endpoint": "minio.storage.svc:9000",
                                       "serving.kserve.io/s3-usehttps": "0", "serving.kserve.io/s3-region": "us-east-2"}
    reg = core.read_namespaced_secret("llm-artifacts-registry", namespace)
    assert reg.type == "kubernetes.io/dockerconfigjson"
    auths = json.loads(base64.b64decode(reg.data[".dockerconfigjson"]))["auths"]
    assert auths["registry.internal.example:5000"]["password"] == CANARY_REG
    sa = core.read_namespaced_service_account("llm-artifacts", namespace)
    assert {"llm-artifacts-hf", "llm-artifacts-s3"} <= {s.name for s in sa.secrets or []}
    assert [s.name for s in sa.image_pull_secrets] == ["llm-artifacts-registry"]

    # Second run, default callback at -vvv: nothing changes, nothing leaks.
    rerun = run_playbook(tmp_path, "playbooks/credentials.yml", extra_vars=_vars(namespace), kubeconfig=kubeconfig, verbosity=3,
                         env={"ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default"})
    assert rerun.rc == 0, rerun.stdout[-3000:] + rerun.stderr[-2000:]
    _assert_no_canary(rerun.stdout + rerun.stderr, "the default callback output at -vvv")
    assert "changed=0" in rerun.stdout and "failed=0" in rerun.stdout

    # The InferenceService names the ServiceAccount; its predictor pods run as it and get its imagePullSecrets.
    with open(os.path.join(CAPTURES, "baseline", "startup.log"), encoding="utf-8") as handle:
        kserve.set_behaviour(namespace, "private", logs={"kserve-container": handle.read()})
    deploy = run_playbook(tmp_path, "playbooks/deploy.yml", kubeconfig=kubeconfig, extra_vars={
        "spec_decoding_hosts": "localhost", "spec_decoding_target": "cluster", "spec_decoding_namespace": namespace,
        "spec_decoding_isvc_name": "private", "spec_decoding_service_account_name": "llm-artifacts",
        "spec_decoding_runtime": "aml-vllm-0.32.0", "spec_decoding_vllm_version": "0.32.0", "spec_decoding_gpu_count": 0,
        "spec_decoding_wait_timeout": 60, "spec_decoding_artifact_mode": "pvc",
        "spec_decoding_artifacts": {"pvc_name": "model-store", "target_subdir": "target"}})
    assert deploy.rc == 0, deploy.output
    isvc = client.CustomObjectsApi(k8s_client).get_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace,
                                                                            "inferenceservices", "private")
    assert isvc["spec"]["predictor"]["serviceAccountName"] == "llm-artifacts"
    deadline = time.monotonic() + 30
    pods = []
    while time.monotonic() < deadline and not pods:
        pods = core.list_namespaced_pod(namespace, label_selector="serving.kserve.io/inferenceservice=private").items
        time.sleep(0.3)
    assert pods, "no predictor pod"
    assert pods[0].spec.service_account_name == "llm-artifacts"
    assert [s.name for s in pods[0].spec.image_pull_secrets] == ["llm-artifacts-registry"]


def test_referenced_secrets_must_exist_and_check_mode_writes_nothing(tmp_path, kubeconfig, k8s_client, namespace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    core = client.CoreV1Api(k8s_client)
    only_refs = {"spec_decoding_hosts": "localhost", "artifact_credentials_target": "cluster",
                 "artifact_credentials_namespace": namespace, "artifact_credentials_service_account_name": "refs",
                 "artifact_credentials_existing_secrets": ["vault-synced-hf"]}
    run = run_playbook(tmp_path, "playbooks/credentials.yml", extra_vars=only_refs, kubeconfig=kubeconfig)
    assert run.rc != 0 and "vault-synced-hf do not exist" in run.result("referenced Secret is missing")["msg"]
    core.create_namespaced_secret(namespace, {"metadata": {"name": "vault-synced-hf"}, "stringData": {"HF_TOKEN": "x" * 8}})
    run = run_playbook(tmp_path, "playbooks/credentials.yml", extra_vars=only_refs, kubeconfig=kubeconfig)
    assert run.rc == 0, run.output
    assert "vault-synced-hf" in [s.name for s in core.read_namespaced_service_account("refs", namespace).secrets]

    check = run_playbook(tmp_path, "playbooks/credentials.yml", extra_vars=_vars(namespace), kubeconfig=kubeconfig, check=True, diff=True)
    assert check.rc == 0, check.output
    _assert_no_canary(check.stdout + check.stderr, "check/diff output")
    names = [s.metadata.name for s in core.list_namespaced_secret(namespace).items]
    assert "llm-artifacts-hf" not in names and "llm-artifacts-registry" not in names


def test_gitops_writes_references_never_values(tmp_path):
    out = tmp_path / "gitops"
    for style, kind in (("external_secret", "ExternalSecret"), ("sealed_secret", "SealedSecret"), ("reference", None)):
        run = run_playbook(tmp_path, "playbooks/credentials.yml", verbosity=3, extra_vars=_vars(
            "models", artifact_credentials_target="gitops", artifact_credentials_gitops_dir=str(out / style),
            artifact_credentials_gitops_style=style))
        assert run.rc == 0, run.output
        _assert_no_canary(run.stdout + run.stderr, "gitops run output")
        files = sorted(os.listdir(out / style))
        assert files == ["kustomization.yaml", "models-llm-artifacts-credentials.yaml"]
        for name in files:
            _assert_no_canary((out / style / name).read_text(), name)
        docs = [d for d in yaml.safe_load_all((out / style / "models-llm-artifacts-credentials.yaml").read_text()) if d]
        assert docs[0]["kind"] == "ServiceAccount" and docs[0]["imagePullSecrets"] == [{"name": "llm-artifacts-registry"}]
        assert [d["kind"] for d in docs[1:]] == ([kind] * 3 if kind else [])
        assert yaml.safe_load((out / style / "kustomization.yaml").read_text())["resources"] == ["models-llm-artifacts-credentials.yaml"]
    # GitOps without any value: the sources are declared, the placeholders are the same.
    run = run_playbook(tmp_path, "playbooks/credentials.yml", extra_vars={
        "spec_decoding_hosts": "localhost", "artifact_credentials_target": "gitops", "artifact_credentials_namespace": "models",
        "artifact_credentials_gitops_dir": str(out / "declared"), "artifact_credentials_gitops_sources": ["hf", "registry"]})
    assert run.rc == 0, run.output
    assert run.result("Record the result")["ansible_facts"]["artifact_credentials_result"]["secret_names"] == ["spec-decoding-artifacts-hf"]
