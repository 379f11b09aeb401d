"""The benchmark's load from inside the cluster (issue #32; bench/load_job.py): spec_benchmark, given the two
InferenceServices' cluster-internal URLs (``status.address.url``, which do not resolve on this host), runs its own client
as a Job in their namespace. On the test bed every pod is a process-mode pod (tests/testbed/pod_process.py): the two
predictors are paced OpenAI servers (tests/paced_server.py; the candidate with vLLM's spec-decode counters), and the
Job's pod resolves the predictors' Service names and reaches them through their Service port, as cluster DNS and
kube-proxy give it (tests/testbed/pod_services.py). The module runs in-process (tests/module_run.py)."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from tests.integration.test_rbac import grants, kserve_namespace  # noqa: F401  pylint: disable=unused-import
from tests.module_run import run_module
from tests.testbed.rest import ApiError

pytestmark = pytest.mark.integration

PROCESS = {"testbed.alauda.io/run": "process"}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The paced server's modules reach the pod as a ConfigMap volume, as a cluster gives a pod files (not through the host's
# path to the checkout: a pod has its own /tmp, and many checkouts live under /tmp).
SERVER_MODULES = ("paced_server.py", "loopback_http.py")
SERVER_DIR = "/opt/paced"
# A paced OpenAI server on :8080 (the predictor's containerPort), in the pod's own network namespace.
SERVER = """
import sys
sys.path.insert(0, %r)
from http.server import ThreadingHTTPServer
from tests.paced_server import paced_handler
name, gap, rates = sys.argv[1], float(sys.argv[2]), [float(r) for r in sys.argv[3:]]
ThreadingHTTPServer(("", 8080), paced_handler(name, 0.004, gap, spec_rates=rates or None)).serve_forever()
""" % SERVER_DIR
CONTEXT = {"gpu_model": "none (test bed)", "gpu_count": 0, "model": "paced", "dtype": "float32", "vllm_version": "0.32.0",
           "image": "testbed/python", "baseline_command": "paced baseline", "candidate_command": "paced candidate"}
TOKEN = "load-job-s3cr3t-token"


def _server_modules(api, namespace):
    """The ConfigMap holding the paced server's modules (tests/paced_server.py and what it imports) as a package."""
    data = {"__init__.py": ""}
    for module in SERVER_MODULES:
        with open(os.path.join(REPO, "tests", module), encoding="utf-8") as handle:
            data[module] = handle.read()
    api.post(f"/api/v1/namespaces/{namespace}/configmaps",
             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "paced-server"}, "data": data})


def _isvc(api, namespace, name, gap, rates=()):
    api.post(f"/apis/serving.kserve.io/v1beta1/namespaces/{namespace}/inferenceservices", {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": name, "annotations": {"serving.kserve.io/deploymentMode": "RawDeployment", **PROCESS}},
        "spec": {"predictor": {"containers": [{
            "name": "kserve-container", "image": "testbed/python",
            "command": ["python3", "-c", SERVER, name, str(gap)] + [str(r) for r in rates],
            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            "volumeMounts": [{"name": "paced-server", "mountPath": SERVER_DIR + "/tests", "readOnly": True}],
            "readinessProbe": {"httpGet": {"path": "/v1/models", "port": 8080}, "periodSeconds": 1}}],
            "volumes": [{"name": "paced-server", "configMap": {"name": "paced-server"}}]}}})


def _ready_url(api, namespace, name, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        isvc = api.get(f"/apis/serving.kserve.io/v1beta1/namespaces/{namespace}/inferenceservices/{name}")
        conditions = {c["type"]: c["status"] for c in (isvc.get("status") or {}).get("conditions") or []}
        try:
            endpoints = api.get(f"/api/v1/namespaces/{namespace}/endpoints/{name}-predictor")
        except ApiError as exc:  # not made yet by the endpoints controller
            assert exc.status == 404, exc
            endpoints = {}
        if conditions.get("Ready") == "True" and any(s.get("addresses") for s in endpoints.get("subsets") or []):
            return isvc["status"]["address"]["url"]
        assert time.monotonic() < deadline, "InferenceService %s not Ready with an endpoint: %s" % (name, isvc.get("status"))
        time.sleep(0.2)


def _load_objects(api, namespace):
    selector = "app.kubernetes.io/component=benchmark-load"
    paths = {"configmaps": "/api/v1/namespaces/%s/configmaps", "secrets": "/api/v1/namespaces/%s/secrets",
             "jobs": "/apis/batch/v1/namespaces/%s/jobs"}
    return {kind: [o["metadata"]["name"] for o in api.get(path % namespace + "?labelSelector=" + selector)["items"]]
            for kind, path in paths.items()}


def _args(kubeconfig, namespace, tmp_path, urls, **over):
    args = {"baseline_url": urls[0], "candidate_url": urls[1], "api": "chat", "workload": "general_chat", "num_prompts": 2,
            "runs_per_prompt": 5, "warmup": 3, "max_tokens": 12, "bearer_token": TOKEN,
            "report_dir": str(tmp_path / "report"), "report_context": CONTEXT, "plots": False,
            "load_job": {"namespace": namespace, "image": "testbed/python", "kubeconfig": kubeconfig, "pod_annotations": PROCESS,
                         "resources": {}}}
    args.update(over)
    return args


def test_the_ab_runs_from_a_job_next_to_the_services_and_leaves_nothing_behind(
        controlplane, kserve, kubelet, namespace, grants, tmp_path):  # pylint: disable=unused-argument,redefined-outer-name
    """With a ServiceAccount bound only to docs/rbac/benchmark.yaml: its rules are enough for the load Job."""
    api = controlplane.rest()
    try:
        kubeconfig = grants.grant("benchmark.yaml", "bench")
        _server_modules(api, namespace)
        _isvc(api, namespace, "base", 0.004)
        _isvc(api, namespace, "cand", 0.002, rates=(0.8, 0.4))
        urls = [_ready_url(api, namespace, name) for name in ("base", "cand")]
        assert urls[1] == f"http://cand-predictor.{namespace}.svc.cluster.local"
        with pytest.raises(socket.gaierror):  # the URL is cluster-internal: this host cannot even resolve it
            socket.getaddrinfo(f"cand-predictor.{namespace}.svc.cluster.local", 80)

        # check mode: the objects pass the API server's dry run, nothing is created or measured
        checked = run_module("spec_benchmark", _args(kubeconfig, namespace, tmp_path, urls), check_mode=True)
        assert not checked.failed, checked.msg
        assert checked["load_job"]["dry_run"] is True and "decision" not in checked
        assert _load_objects(api, namespace) == {"configmaps": [], "secrets": [], "jobs": []}
        assert not (tmp_path / "report").exists()

        out = run_module("spec_benchmark", _args(kubeconfig, namespace, tmp_path, urls, concurrency=2))  # load_from: auto
        assert not out.failed, out.msg
        progress = open(out["progress_file"], encoding="utf-8").read()
        assert "load from the cluster: Job %s/spec-decoding-load-" % namespace in progress, progress
        assert "job: baseline 10/10 " in progress and "job: candidate 10/10 " in progress, progress
        for side in ("baseline", "candidate"):
            assert out[side]["summary"]["completed"] == 10 and out[side]["url"] == urls[("baseline", "candidate").index(side)]
        assert out["baseline"]["model"] == "base" and out["candidate"]["model"] == "cand"
        # acceptance from the candidate's own counters, scraped by the Job before and after its measured requests
        assert out["acceptance"]["num_drafts"] > 0 and out["acceptance"]["per_position"][0] == pytest.approx(0.8, abs=0.05)
        assert out["baseline"]["acceptance"] is None
        assert out["decision"] in ("keep", "roll_back") and os.path.exists(out["report_markdown"])
        report = json.load(open(out["report_json"], encoding="utf-8"))
        assert report["comparison"]["speedup"] == out["speedup"]
        # nothing left: the Job, its pod, the ConfigMap and the Secret are gone; the token is in no file the run wrote
        assert _load_objects(api, namespace) == {"configmaps": [], "secrets": [], "jobs": []}
        for path in (out["progress_file"], out["report_json"], out["report_markdown"], out["requests_file"]):
            assert TOKEN not in open(path, encoding="utf-8").read()
        assert TOKEN not in json.dumps(dict(out))
    finally:
        for name in ("base", "cand"):
            api.delete(f"/apis/serving.kserve.io/v1beta1/namespaces/{namespace}/inferenceservices/{name}")
        api.close()


def test_an_image_without_the_interpreter_fails_with_the_pods_log_and_cleans_up(
        controlplane, kubeconfig, kserve, kubelet, namespace, tmp_path):  # pylint: disable=unused-argument
    api = controlplane.rest()
    try:
        urls = [f"http://base-predictor.{namespace}.svc.cluster.local", f"http://cand-predictor.{namespace}.svc.cluster.local"]
        args = _args(kubeconfig, namespace, tmp_path, urls)
        args["load_job"]["python"] = "python2.7"  # not in the image: the container cannot start its command
        out = run_module("spec_benchmark", args)
        assert out.failed and out["field"] in ("load_job", "load_job.image"), out
        assert "spec-decoding-load-" in out.msg and "python2.7" in out.msg, out.msg
        assert _load_objects(api, namespace) == {"configmaps": [], "secrets": [], "jobs": []}
    finally:
        api.close()


def test_without_create_on_jobs_the_run_fails_naming_it_and_removes_what_it_made(
        controlplane, kserve, kubelet, namespace, grants, tmp_path):  # pylint: disable=unused-argument,redefined-outer-name
    api = controlplane.rest()
    try:
        kubeconfig = grants.grant("benchmark.yaml", "bench", drop_verb=("spec-decoding-benchmark", "jobs", "create"))
        urls = [f"http://base-predictor.{namespace}.svc.cluster.local", f"http://cand-predictor.{namespace}.svc.cluster.local"]
        out = run_module("spec_benchmark", _args(kubeconfig, namespace, tmp_path, urls))
        assert out.failed and out["field"] == "load_job", out
        assert 'cannot create resource "jobs"' in out.msg and "docs/rbac/benchmark.yaml" in out.msg, out.msg
        # the ConfigMap and the Secret made before the refused Job are gone again
        assert _load_objects(api, namespace) == {"configmaps": [], "secrets": [], "jobs": []}
    finally:
        api.close()


def test_the_sweep_reads_and_measures_each_load_from_jobs(controlplane, kubeconfig, kserve, kubelet, namespace, tmp_path):  # pylint: disable=unused-argument
    """spec_sweep: one Job reads each side's /metrics (the candidate's k from its per-position series) before any
    inference request, then one Job per measurement (2 loads x 2 sides)."""
    api = controlplane.rest()
    try:
        _server_modules(api, namespace)
        _isvc(api, namespace, "base", 0.004)
        _isvc(api, namespace, "cand", 0.002, rates=(0.8, 0.4))
        urls = [_ready_url(api, namespace, name) for name in ("base", "cand")]
        context = dict(CONTEXT, candidate_command="vllm serve paced --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 2}'")
        args = _args(kubeconfig, namespace, tmp_path, urls, concurrencies=[1, 2], max_concurrency=2, method="ngram", runs_per_prompt=5,
                     report_context=context)
        for key in ("baseline_url", "candidate_url"):
            assert args[key]
        checked = run_module("spec_sweep", args, check_mode=True)  # the first Job as a dry run, nothing measured or written
        assert not checked.failed and checked["load_job"]["dry_run"] is True and "measured" not in checked, checked
        assert _load_objects(api, namespace) == {"configmaps": [], "secrets": [], "jobs": []} and not (tmp_path / "report").exists()
        out = run_module("spec_sweep", args)
        assert not out.failed, out.msg
        progress = open(out["progress_file"], encoding="utf-8").read()
        assert progress.count("load from the cluster: Job %s/spec-decoding-load-" % namespace) == 5, progress
        assert out["measured"] == 4 and [(p["load"], p["side"]) for p in json.load(open(out["report_json"], encoding="utf-8"))["measurements"]] == [
            (1, "baseline"), (1, "candidate"), (2, "baseline"), (2, "candidate")]
        # the candidate's k, read by the first Job from its /metrics before any request
        assert out["checks"]["candidate"]["metrics"] == "vllm:spec_decode_* counters, 2 per-position series", out["checks"]
        assert _load_objects(api, namespace) == {"configmaps": [], "secrets": [], "jobs": []}
    finally:
        for name in ("base", "cand"):
            api.delete(f"/apis/serving.kserve.io/v1beta1/namespaces/{namespace}/inferenceservices/{name}")
        api.close()
