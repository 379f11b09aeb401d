"""The in-cluster load Job's parts without a cluster (bench/load_job.py, bench/load_job_pod.py): where the load runs
from, what is created (no secret outside the Secret), and the zip application itself run as the pod runs it (``python3
-E -S``: the standard library only) against a paced loopback server, its log read back by the controller's parser.
The Job on the test bed's API server and kubelet: tests/integration/test_benchmark_load_job.py."""
import base64
import io
import json
import subprocess
import sys
import zipfile

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job_pod
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.loopback_http import serving
from tests.paced_server import paced_handler

SVC = "http://tiny-predictor.models.svc.cluster.local"


@pytest.mark.parametrize("urls, environ, expected", [
    ([SVC], {}, "cluster"),
    (["http://tiny-predictor.models.svc:8080/v1"], {}, "cluster"),
    (["http://tiny-predictor.models.svc.example.internal"], {}, "cluster"),  # another cluster domain
    (["https://tiny.apps.example.com", SVC], {}, "cluster"),  # both sides from the same place
    (["https://tiny.apps.example.com"], {}, "controller"),  # an ingress URL given by the user
    (["http://127.0.0.1:8000"], {}, "controller"),
    ([SVC], {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "controller"),  # the playbook runs in a pod: it reaches the Service
])
def test_auto_sends_from_the_cluster_only_for_cluster_internal_names_off_the_cluster(urls, environ, expected):
    assert load_job.choose("auto", urls, environ=environ) == expected
    assert load_job.choose("controller", [SVC], environ={}) == "controller"
    assert load_job.choose("cluster", ["http://127.0.0.1:1"], environ={}) == "cluster"


def _options(**over):
    options = {key: spec.get("default") for key, spec in load_job.options_spec().items()}
    options.update(namespace="models", image="vllm/vllm-openai:v0.32.0")
    options.update(over)
    return options


@pytest.mark.parametrize("over, field, words", [({"namespace": None}, "load_job.namespace", "Fix: set the InferenceService's namespace"),
                                                ({"image": ""}, "load_job.image", "Fix: set an image with python3"),
                                                ({"timeout": 30}, "load_job.timeout", "at least 60 seconds")])
def test_missing_options_are_refused_naming_the_field(over, field, words):
    with pytest.raises(ValidationError) as err:
        load_job.check_options(_options(**over))
    assert err.value.field == field and str(err.value).startswith(field + ":") and words in str(err.value)


def test_the_token_and_headers_are_only_in_the_secret_and_the_pod_holds_no_api_token():
    request = {"sides": [{"name": "candidate", "url": SVC}]}
    env = {load_job_pod.TOKEN_ENV: "s3cr3t-token", load_job_pod.HEADERS_ENV: json.dumps({"X-Api-Key": "hdr-s3cr3t"})}
    configmap, secret, job = load_job.manifests("spec-decoding-load-0a1b2c3d", _options(node_selector={"pool": "cpu"}), request,
                                                env, code=b"zip")
    for obj in (configmap, job):
        text = json.dumps(obj)
        assert "s3cr3t" not in text
    assert secret["stringData"] == env and secret["metadata"]["namespace"] == "models"
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["env"] == [{"name": key, "valueFrom": {"secretKeyRef": {"name": "spec-decoding-load-0a1b2c3d", "key": key}}}
                                for key in sorted(env)]
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never" and pod["nodeSelector"] == {"pool": "cpu"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert "limits" not in container["resources"] or "cpu" not in container["resources"]["limits"]  # no CPU throttling in the timings
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 3600
    assert container["command"] == ["python3", "-E", "-S", "/etc/spec-decoding-load/load.pyz", "/etc/spec-decoding-load/request.json"]
    assert base64.b64decode(configmap["binaryData"]["load.pyz"]) == b"zip"
    assert json.loads(configmap["data"]["request.json"]) == request
    # without a token or headers there is no Secret and no environment from one
    _cm, none, job = load_job.manifests("spec-decoding-load-0a1b2c3d", _options(), request, {}, code=b"zip")
    assert none is None and job["spec"]["template"]["spec"]["containers"][0]["env"] == []


def test_the_bundle_is_the_same_bytes_each_time_and_has_only_what_the_pod_imports():
    code = load_job.bundle()
    assert code == load_job.bundle()
    names = zipfile.ZipFile(io.BytesIO(code)).namelist()
    modules = sorted(n for n in names if not n.endswith("__init__.py"))
    prefix = "ansible_collections/alauda/spec_decoding/plugins/module_utils/"
    assert modules == ["__main__.py", prefix + "bench/client.py", prefix + "bench/load_job_pod.py", prefix + "bench/stream_client.py",
                       prefix + "errors.py", prefix + "vllm/prometheus_text.py"]


def _run_bundle(tmp_path, request, env=None):
    (tmp_path / "load.pyz").write_bytes(load_job.bundle())
    (tmp_path / "request.json").write_text(json.dumps(request))
    # as the pod runs it: -E -S, so neither Ansible nor any site package (prometheus_client) is importable
    proc = subprocess.run([sys.executable, "-E", "-S", str(tmp_path / "load.pyz"), str(tmp_path / "request.json")],
                          capture_output=True, text=True, timeout=120, env=dict(env or {}), check=False)
    return proc, load_job.parse_log(proc.stderr + proc.stdout)


def _request(url, token_field="candidate_url"):
    params = {"api": "chat", "timeout": 30.0, "validate_certs": True, "scrape_metrics": True, "warmup": 3, "runs_per_prompt": 5,
              "concurrency": 2, "request_rate": None, "arrival": "poisson", "seed": 0}
    endpoint = bench_client.Endpoint(url, field=token_field)
    prompts = [{"id": "p%d" % i, "messages": [{"role": "user", "content": "prompt %d" % i}]} for i in range(2)]
    return load_job.job_request(params, [("candidate", endpoint)], prompts,
                                {"max_tokens": 8, "temperature": 0.0, "seed": 0, "extra_body": {}}), endpoint


def test_the_zip_application_measures_like_the_controller_and_its_log_is_read_back(tmp_path):
    handler = paced_handler("paced-job", 0.005, 0.002, spec_rates=[0.8, 0.5])
    with serving(handler) as url:
        request, endpoint = _request(url)
        proc, (progress, result) = _run_bundle(tmp_path, request, env={load_job_pod.TOKEN_ENV: "tok-s3cr3t"})
    assert proc.returncode == 0, proc.stderr
    assert "tok-s3cr3t" not in proc.stdout + proc.stderr
    assert any(line.startswith("candidate 10/10 ") for line in progress)
    side = result["sides"]["candidate"]
    assert side["model"] == "paced-job" and len(side["records"]) == 10 and all(r["success"] for r in side["records"])
    assert side["warmup"]["requests"] == 3
    # only the families the controller reads came back from /metrics
    assert side["metrics_after"] and all("spec_decode" in line or "prefix_cache" in line or "cache_config_info" in line
                                         for line in side["metrics_after"].splitlines())

    class Progress:
        lines = []

        def line(self, text):
            self.lines.append(text)
    out = bench_run.side_of("candidate", endpoint, side, Progress())
    assert out["summary"]["completed"] == 10 and out["model"] == "paced-job"
    assert out["acceptance"]["num_drafts"] > 0 and out["acceptance"]["per_position"][0] == pytest.approx(0.8, abs=0.05)


def test_a_refused_run_prints_the_error_as_its_result_and_exits_1(tmp_path):
    request, _endpoint = _request("http://127.0.0.1:9")  # nothing listens on the discard port
    proc, (_progress, result) = _run_bundle(tmp_path, request)
    assert proc.returncode == 1
    assert result["error"]["field"] == "candidate_url" and "cannot reach http://127.0.0.1:9/v1/models" in result["error"]["msg"]


def test_a_log_without_a_whole_result_has_none():
    lines = load_job_pod.encode({"schema": load_job_pod.RESULT_SCHEMA, "sides": {}})
    whole = "\n".join(["progress"] + [load_job_pod.BEGIN] + lines + [load_job_pod.END])
    assert load_job.parse_log(whole) == (["progress"], {"schema": load_job_pod.RESULT_SCHEMA, "sides": {}})
    assert load_job.parse_log("\n".join(["progress", load_job_pod.BEGIN] + lines))[1] is None  # cut before the end marker
    assert load_job.parse_log("\n".join([load_job_pod.BEGIN, "not base64!", load_job_pod.END]))[1] is None
    other = load_job_pod.encode({"schema": "something/else"})
    assert load_job.parse_log("\n".join([load_job_pod.BEGIN] + other + [load_job_pod.END]))[1] is None
