"""The load Job's pods (issue 53, bench/load_job.py ``load_job.pods``) on the test bed's kube-apiserver. The test bed runs
Kubernetes 1.20, which has no Indexed Jobs (alpha in 1.21): the API server drops ``completionMode`` and would run N
copies of shard 0. The run must say so and leave nothing behind, in check mode (the dry run) as in a real run. The
sharded run itself (N pods, merged) is tests/unit/plugins/module_utils/test_bench_load_job_shards.py's: the pods' code
run in-process against a loopback server."""
from __future__ import annotations

import pytest

from tests.module_run import run_module

pytestmark = pytest.mark.integration

CONTEXT = {"gpu_model": "none (test bed)", "gpu_count": 0, "model": "paced", "dtype": "float32", "vllm_version": "0.32.0",
           "image": "testbed/python", "baseline_command": "paced baseline", "candidate_command": "paced candidate"}


def _args(kubeconfig, namespace, tmp_path, pods):
    return {"baseline_url": "http://base-predictor.%s.svc.cluster.local" % namespace, "baseline_model": "base",
            "candidate_url": "http://cand-predictor.%s.svc.cluster.local" % namespace, "candidate_model": "cand",
            "load_from": "cluster", "num_prompts": 2, "runs_per_prompt": 5, "warmup": 3, "max_tokens": 12, "concurrency": 2,
            "report_dir": str(tmp_path / "report"), "report_context": CONTEXT, "plots": False,
            "load_job": {"namespace": namespace, "image": "testbed/python", "kubeconfig": kubeconfig, "pods": pods, "resources": {}}}


def _load_objects(controlplane, namespace):
    api = controlplane.rest()
    try:
        selector = "?labelSelector=app.kubernetes.io/component=benchmark-load"
        return [o["metadata"]["name"] for path in ("/api/v1/namespaces/%s/configmaps", "/apis/batch/v1/namespaces/%s/jobs")
                for o in api.get(path % namespace + selector)["items"]]
    finally:
        api.close()


def test_two_pods_on_an_api_server_without_indexed_jobs_are_refused_and_nothing_is_left(controlplane, kubeconfig, namespace, tmp_path):
    for check_mode in (True, False):
        out = run_module("spec_benchmark", _args(kubeconfig, namespace, tmp_path, pods=2), check_mode=check_mode)
        assert out.failed and out["field"] == "load_job.pods", out
        assert "without completionMode: Indexed" in out.msg and "load_job.pods: 1" in out["fix"], out.msg
        assert _load_objects(controlplane, namespace) == []
    assert not (tmp_path / "report").exists() or not list((tmp_path / "report").glob("*.json"))
    # more pods than threads: refused before anything is created
    out = run_module("spec_benchmark", _args(kubeconfig, namespace, tmp_path, pods=3))
    assert out.failed and out["field"] == "load_job.pods" and "at most 2 pods" in out["fix"], out
