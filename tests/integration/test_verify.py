"""Verify on the loopback test bed: real kube-apiserver, KServe stand-in, logs served by the kubelet stand-in.

Pod logs are the real vLLM captures (tests/fixtures/vllm), served through the API server's pods/log
endpoint; the modules and the verify role read them the way they would on a cluster. Expected values are
the numbers in the capture files (see tests/unit/plugins/module_utils/test_engine_log.py).
"""

import json
import os
import time

import pytest

from tests import vllm_newer
from tests.ansible_run import run_playbook
from tests.module_run import run_module

from tests.paths import read_capture  # noqa: E402  pylint: disable=wrong-import-position

EAGLE3_JSON = '{"method":"eagle3","model":"/mnt/models/tiny-eagle3","num_speculative_tokens":3}'
NGRAM_JSON = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}'
DRAFT_JSON = '{"method":"draft_model","model":"/mnt/models/tiny-draft","num_speculative_tokens":3}'


def capture(folder, name="startup.log"):
    return read_capture(folder, name)


def isvc_manifest(name, args, replicas=1, command=None, ports=None):
    model = {"modelFormat": {"name": "vllm"}, "args": list(args)}
    if command:
        model["command"] = list(command)
    if ports:
        model["ports"] = list(ports)
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": name, "annotations": {"serving.kserve.io/deploymentMode": "Standard"}},
            "spec": {"predictor": {"minReplicas": replicas, "model": model}}}


def predictor_pods(k8s_client, ns, name):
    from kubernetes import client
    pods = client.CoreV1Api(k8s_client).list_namespaced_pod(ns, label_selector="serving.kserve.io/inferenceservice=%s" % name)
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


def deploy(k8s_client, kserve, ns, name, args, log_text, replicas=1, command=None, wait_ready=True, ports=None, **behaviour):
    """Create the InferenceService with pods whose kserve-container log is log_text; wait for its pods (and Ready)."""
    from kubernetes import client
    kserve.set_behaviour(ns, name, logs={"kserve-container": log_text}, **behaviour)
    client.CustomObjectsApi(k8s_client).create_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", ns, "inferenceservices", isvc_manifest(name, args, replicas, command, ports))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        pods = predictor_pods(k8s_client, ns, name)
        running = [p for p in pods if p.status and p.status.phase == "Running"]
        isvc = client.CustomObjectsApi(k8s_client).get_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", ns, "inferenceservices", name)
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in (isvc.get("status") or {}).get("conditions") or [])
        if len(running) == replicas and (ready or not wait_ready):
            return [p.metadata.name for p in running]
        time.sleep(0.3)
    pytest.fail("InferenceService %s/%s did not come up: %s" % (ns, name, kserve.errors[-3:]))
    return None


def engine(name, ns, kubeconfig, **more):
    """engine_config_info in this process (the verify role's wiring of it is tested by the playbook tests below)."""
    return run_module("engine_config_info", dict(name=name, namespace=ns, kubeconfig=kubeconfig, **more))


def test_engine_line_on_every_pod_matches_the_flag(k8s_client, kubeconfig, kserve, namespace):
    pods = deploy(k8s_client, kserve, namespace, "llama", ["--port", "8080", "--speculative-config", EAGLE3_JSON],
                  capture("eagle3"), replicas=2)
    res = engine("llama", namespace, kubeconfig)
    assert not res.failed, res.msg
    assert res["changed"] is False and res["found"] is True
    assert sorted(p["name"] for p in res["pods"]) == sorted(pods)
    for pod in res["pods"]:
        assert pod["found"] is True and pod["vllm_version"] == "0.32.0" and pod["engine"] == "V1"
        assert pod["speculative_config"] == {"method": "eagle3", "model": "/mnt/models/tiny-eagle3", "num_spec_tokens": 3}
    # compared with the flag the InferenceService carries
    assert res["expected"] == {"enabled": True, "method": "eagle3", "model": "/mnt/models/tiny-eagle3",
                               "num_speculative_tokens": 3, "method_given": True}
    assert res["inference_service"]["speculative_flag_present"] is True
    assert res["inference_service"]["flags"][0]["forms"] == ["argv"]
    assert res["inference_service"]["ready"] is True
    assert sorted({w["pod"] for w in res["log_warnings"] if w["kind"] == "min_p_logit_bias"}) == sorted(pods)


def test_one_pod_running_another_config_fails_naming_it(k8s_client, kubeconfig, kubelet, kserve, namespace):
    pods = deploy(k8s_client, kserve, namespace, "mixed", ["--speculative-config", NGRAM_JSON], capture("ngram"), replicas=2)
    odd = sorted(pods)[1]
    kubelet.write_log(namespace, odd, "kserve-container", capture("baseline"), append=False)
    res = engine("mixed", namespace, kubeconfig)
    assert res.failed
    msg = res.msg
    assert "pod %s: expected {method='ngram', num_speculative_tokens=5}, engine runs without speculative decoding" % odd in msg
    assert sorted(pods)[0] not in msg.split("predictor pods run different")[0]


def test_mismatch_with_expected_prints_both(k8s_client, kubeconfig, kserve, namespace):
    deploy(k8s_client, kserve, namespace, "svc", ["--speculative-config", EAGLE3_JSON], capture("eagle3"))
    res = engine("svc", namespace, kubeconfig, expected={"method": "deepseek_mtp", "num_speculative_tokens": 1})
    assert res.failed
    msg = res.msg
    assert "method: expected 'mtp', engine runs 'eagle3'" in msg and "num_speculative_tokens: expected 1, engine runs 3" in msg


def test_method_omitted_in_the_flag_is_explained(k8s_client, kubeconfig, kserve, namespace):
    log = capture("eagle3").replace("SpeculativeConfig(method='eagle3', model='/mnt/models/tiny-eagle3'",
                                    "SpeculativeConfig(method='draft_model', model='/mnt/models/draft'")
    deploy(k8s_client, kserve, namespace, "guess", ["--speculative-config", '{"model":"/mnt/models/draft","num_speculative_tokens":3}'], log)
    first = engine("guess", namespace, kubeconfig)
    assert not first.failed and first["differences"] == [] and any("vLLM guesses the method" in n for n in first["notes"])
    stated = engine("guess", namespace, kubeconfig, expected={"method": "eagle3"})
    assert stated.failed and "method: expected 'eagle3', engine runs 'draft_model'" in stated.msg


def test_line_absent_fails_with_hint(k8s_client, kubeconfig, kserve, namespace):
    starting = "\n".join(capture("ngram").splitlines()[:12])    # the API server's first lines, before the engine core
    deploy(k8s_client, kserve, namespace, "starting", ["--speculative-config", NGRAM_JSON], starting)
    res = engine("starting", namespace, kubeconfig)
    assert res.failed
    msg = res.msg
    assert "engine-config line missing on 1 of 1 predictor pods" in msg and "still be starting" in msg


def test_wrong_container_and_previous(k8s_client, kubeconfig, kserve, namespace):
    deploy(k8s_client, kserve, namespace, "crashy", ["--speculative-config", NGRAM_JSON], "crashed again\n",
           wait_ready=False, crash_loop=True, previous_logs={"kserve-container": capture("ngram")})
    tasks = [engine("crashy", namespace, kubeconfig, previous=True), engine("crashy", namespace, kubeconfig, container="vllm")]
    assert not tasks[0].failed and tasks[0]["found"] is True and tasks[0]["speculative_config"] == {"method": "ngram", "model": None, "num_spec_tokens": 5}
    assert tasks[1]["failed"] is True and "pod has no container 'vllm' (containers: kserve-container)" in tasks[1]["msg"]


def test_rollback_state_expect_disabled(k8s_client, kubeconfig, kserve, namespace):
    deploy(k8s_client, kserve, namespace, "plain", ["--port", "8080"], capture("baseline"))
    res = engine("plain", namespace, kubeconfig)
    assert not res.failed, res.msg
    assert res["expected"] == {"enabled": False} and res["speculative_config"] is None
    assert res["inference_service"]["speculative_flag_present"] is False


def test_missing_inference_service_names_it(kubeconfig, controlplane, namespace):
    res = engine("nope", namespace, kubeconfig)
    assert res.failed and res.msg.startswith("name: InferenceService %s/nope not found" % namespace)


STREAM_CHILD = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[1])
from kubernetes import config
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
api = config.new_client_from_config(config_file=sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = {}
if sys.argv[5] == "scan":
    result = engine_log.scan_chunks(k8s_pods.stream_pod_log(api, sys.argv[3], sys.argv[4]))
    result.pop("line")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kib": before, "after_kib": after, "result": result}))
"""


def test_huge_log_is_streamed_in_bounded_memory(kubeconfig, k8s_client, kubelet, kserve, namespace):
    """64 MiB of log through the real API server, read in a child process: found at the end, RSS grows < 16 MiB."""
    import subprocess
    import sys
    pods = deploy(k8s_client, kserve, namespace, "big", ["--speculative-config", EAGLE3_JSON], "")
    noise = ('(APIServer pid=1) INFO:     127.0.0.1:52114 - "POST /v1/completions HTTP/1.1" 200 OK\n' * 4000)
    engine_line = [line for line in capture("eagle3").splitlines() if "Initializing a V1 LLM engine" in line][0]
    for _i in range(200):
        kubelet.write_log(namespace, pods[0], "kserve-container", noise)
    kubelet.write_log(namespace, pods[0], "kserve-container", engine_line)
    collections = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".build", "collections")
    outs = {}
    for mode in ("baseline", "scan"):
        proc = subprocess.run([sys.executable, "-c", STREAM_CHILD, collections, kubeconfig, namespace, pods[0], mode],
                              capture_output=True, text=True, timeout=300, check=True)
        outs[mode] = json.loads(proc.stdout)
    result = outs["scan"]["result"]
    assert result["found"] and result["speculative_config"]["method"] == "eagle3"
    assert result["bytes_scanned"] > 60 * (1 << 20)
    growth_mib = (outs["scan"]["after_kib"] - outs["baseline"]["after_kib"]) / 1024.0
    assert growth_mib < 16, "reading a %d-byte log grew the peak RSS by %.1f MiB" % (result["bytes_scanned"], growth_mib)


def test_spec_metrics_falls_back_to_pod_logs(k8s_client, kubeconfig, kserve, namespace):
    """The API server will not proxy to a loopback pod IP, so /metrics fails and the log windows are read instead."""
    deploy(k8s_client, kserve, namespace, "ng", ["--speculative-config", NGRAM_JSON], capture("ngram"))
    res = run_module("speculative_metrics_info", {"name": "ng", "namespace": namespace, "kubeconfig": kubeconfig})
    assert not res.failed, res.msg
    assert res["source"] == "log" and res["windows_total"] == 2
    # ngram/startup.log windows add up to ngram/metrics.txt: 229 drafts, 1002 draft tokens, 655 accepted
    assert (res["num_drafts"], res["num_draft_tokens"], res["num_accepted_tokens"]) == (229, 1002, 655)
    assert res["accepted_tokens_per_position"] == [190, 152, 126, 99, 88]
    assert res["diagnosis"]["status"] == "healthy" and res["diagnosis"]["method"] == "ngram"
    assert "through the API server proxy failed" in res["notes"][0]
    nofb = run_module("speculative_metrics_info", {"name": "ng", "namespace": namespace, "kubeconfig": kubeconfig, "log_fallback": False})
    assert nofb["failed"] is True and nofb["msg"].startswith("port: GET /metrics on pod %s/" % namespace)


def test_verify_playbook_end_to_end(tmp_path, k8s_client, kubeconfig, kserve, namespace):
    deploy(k8s_client, kserve, namespace, "llama-eagle3", ["--speculative-config", EAGLE3_JSON], capture("eagle3"))
    run = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig,
                       extra_vars={"verify_name": "llama-eagle3", "verify_namespace": namespace, "verify_wait_timeout": 60,
                                   "verify_wait_interval": 1})
    assert run.rc == 0, run.output
    summary = run.result("Summary")["msg"]
    assert summary[0] == "InferenceService %s/llama-eagle3: Ready at generation 1" % namespace
    assert "method=eagle3 model=/mnt/models/tiny-eagle3 num_spec_tokens=3" in summary[1]
    assert any(line.startswith("diagnosis: likely_draft_mismatch") for line in summary)
    # the preflight re-run read-only on the live object: its flag has no target path (no --model), which it says
    assert "preflight eagle3: skipped (InferenceService llama-eagle3: the target path is not on the command line)" in summary, summary
    facts = run.result("Register the full verification data")["ansible_facts"]["verify_result"]
    assert facts["flag_containers"] == ["kserve-container"]
    assert facts["engine"]["pods"][0]["speculative_config"]["num_spec_tokens"] == 3
    # eagle3/startup.log windows: 0 accepted of 537 + 774 + 714 + 741 + 312 drafted
    assert facts["metrics"]["num_draft_tokens"] == 3078 and facts["metrics"]["num_accepted_tokens"] == 0


def test_verify_playbook_names_what_a_newer_vllm_printed(tmp_path, k8s_client, kubeconfig, kserve, namespace):
    """A pod log of a vLLM newer than the tables (tests/fixtures/vllm/newer/startup.log: the draft_model capture's engine
    line and windows with fields added): verify passes on what it understood and its summary names the rest."""
    with open(os.path.join(vllm_newer.NEWER, "startup.log"), encoding="utf-8") as handle:
        log = handle.read()
    deploy(k8s_client, kserve, namespace, "newer", ["--speculative-config", DRAFT_JSON], log)
    run = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig,
                       extra_vars={"verify_name": "newer", "verify_namespace": namespace, "verify_wait_timeout": 60,
                                   "verify_wait_interval": 1})
    assert run.rc == 0, run.output
    summary = run.result("Summary")["msg"]
    assert "(vLLM 0.35.0 V1)" in summary[1] and "method=draft_model model=/mnt/models/tiny-draft num_spec_tokens=3" in summary[1]
    assert ("not understood: SpeculativeConfig field 'adaptive_draft_length' is not in vLLM 0.34's table (the engine is 0.35.0, "
            "newer than the newest table) | SpecDecoding metrics field 'Per-position draft tokens' unknown") in "\n".join(summary)
    engine = run.result("Check the engine-config line on every predictor pod")
    assert [(n["name"], n["pod"]) for n in engine["not_understood"]] == [("adaptive_draft_length", engine["pods"][0]["name"])]
    assert any("engine line adaptive_draft_length" in w for w in engine["warnings"])
    # draft_model/startup.log's first two windows: 432 + 342 drafted, all accepted
    metrics = run.result("Read the acceptance metrics")
    assert (metrics["source"], metrics["num_draft_tokens"], metrics["num_accepted_tokens"]) == ("log", 774, 774)
    assert [n["name"] for n in metrics["not_understood"]] == ["Per-position draft tokens"]


def test_verify_playbook_fails_without_the_flag_and_checks_a_rollback(tmp_path, k8s_client, kubeconfig, kserve, namespace):
    deploy(k8s_client, kserve, namespace, "base", ["--port", "8080"], capture("baseline"))
    extra = {"verify_name": "base", "verify_namespace": namespace, "verify_wait_timeout": 60, "verify_wait_interval": 1}
    run = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig, extra_vars=extra)
    assert run.rc != 0
    message = run.result("Check the speculative flag")["msg"]
    # the way to check a rolled-back service is named in the refusal (issue #48)
    assert "carries no --speculative-config" in message and "-e verify_speculative=false" in message, message
    run = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig, extra_vars=dict(extra, verify_speculative=False))
    assert run.rc == 0, run.output
    assert "speculative_config=None" in run.result("Summary")["msg"][1]
    assert json.dumps(run.result("Register the full verification data")["ansible_facts"]["verify_result"]["metrics"]) == "{}"
    # a rollback check of a service that still has the flag names the flag's container and the variable
    deploy(k8s_client, kserve, namespace, "spec", ["--speculative-config", EAGLE3_JSON], capture("eagle3"))
    run = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig,
                       extra_vars=dict(extra, verify_name="spec", verify_speculative=False))
    assert run.rc != 0
    message = run.result("Check the speculative flag")["msg"]
    assert "still carries a speculative flag" in message and "verify_speculative=false asks for none" in message, message


def test_verify_playbook_over_a_selector_verifies_each_flagged_service_and_goes_on_past_a_failure(
        tmp_path, k8s_client, kubeconfig, kserve, namespace):
    """The fleet form (issue 53): a label selector and a name, found with one discovery; the service whose pods run the
    flag's config is verified, the one whose pods run without it fails its engine check, the named one that does not exist
    fails its own check, and the one without a flag is reported, not verified; the run fails at the end, not at the first."""
    from kubernetes import client
    api = client.CustomObjectsApi(k8s_client)
    # a runtime KServe auto-selects, so that the discovery decides where each flag comes from (none from it)
    api.create_namespaced_custom_object("serving.kserve.io", "v1alpha1", namespace, "servingruntimes", {
        "apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime", "metadata": {"name": "vllm-rt"},
        "spec": {"supportedModelFormats": [{"name": "vllm", "autoSelect": True}],
                 "containers": [{"name": "kserve-container", "image": "vllm/vllm-openai:v0.11.2", "args": ["--port=8080"]}]}})
    services = (("fa", ["--speculative-config", EAGLE3_JSON], capture("eagle3"), {"fleet": "verify"}),
                ("fb", ["--speculative-config", NGRAM_JSON], capture("baseline"), {"fleet": "verify"}),
                ("fc", ["--port", "8080"], capture("baseline"), {"fleet": "verify"}),
                ("other", ["--speculative-config", EAGLE3_JSON], capture("eagle3"), {}))  # not selected: no label
    for name, args, log, labels in services:  # created together, so that the stand-in rolls them out side by side
        kserve.set_behaviour(namespace, name, logs={"kserve-container": log})
        manifest = isvc_manifest(name, args)
        manifest["metadata"]["labels"] = labels
        api.create_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace, "inferenceservices", manifest)

    def ready(name):
        isvc = api.get_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace, "inferenceservices", name)
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (isvc.get("status") or {}).get("conditions") or [])
    deadline = time.monotonic() + 90
    while not all(ready(name) for name in ("fa", "fb", "fc")):
        assert time.monotonic() < deadline, kserve.errors[-3:]
        time.sleep(0.3)
    run = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig,
                       extra_vars={"verify_label_selector": "fleet=verify", "verify_names": ["missing"],
                                   "verify_namespaces": [namespace], "verify_wait_timeout": 60, "verify_wait_interval": 1})
    assert run.rc != 0, run.output
    found = run.result("Find the services to verify")
    assert sorted(s["name"] for s in found["services"]) == ["fa", "fb", "fc", "missing"]
    fleet = run.result("Record per service what was found and verified")["ansible_facts"]["verify_fleet"]
    done = {s["service"]: s["done"] for s in fleet["services"]}
    assert done == {"%s/fa" % namespace: "verified", "%s/fb" % namespace: "failed", "%s/missing" % namespace: "failed",
                    "%s/fc" % namespace: "skipped_without_flag"}, fleet
    totals = fleet["totals"]
    assert (totals["selected"], totals["with_flag"], totals["verified_ok"], totals["failed"], totals["without_flag"],
            totals["not_checked"], totals["forbidden_namespaces"]) == (4, 2, 1, 2, 1, 0, [])
    # the selector's LIST, the named one's LIST (field selector), the namespace's ServingRuntimes, the ClusterServingRuntimes
    assert totals["api_requests_to_find"] == found["totals"]["api_requests"] == 4, found["totals"]
    lines = run.result("Fleet summary")["msg"]
    assert lines[0].startswith("totals: 4 selected, 2 with a flag, 1 verified ok, 2 failed, 1 without a flag"), lines
    assert "%s/fa: verified - engine on 1 pod(s): method=eagle3 model=/mnt/models/tiny-eagle3 num_spec_tokens=3" % namespace in lines[1]
    assert lines[1].endswith("[flag from inference_service]"), lines
    assert lines[2].startswith("%s/fb: FAILED at 'Check the engine-config line on every predictor pod'" % namespace), lines
    assert lines[3] == "%s/fc: without speculative decoding, not verified" % namespace
    assert lines[4].startswith("%s/missing: FAILED at 'Check that the InferenceService exists'" % namespace), lines
    # each verified service printed its own summary too, and the run failed at the end, naming the failed ones
    assert run.result("Summary")["msg"][0] == "InferenceService %s/fa: Ready at generation 1" % namespace
    message = run.result("Check that every verified service passed")["msg"]
    assert message.startswith("2 of 3 service(s) failed their verify: %s/fb, %s/missing" % (namespace, namespace)), message
    # verify_name as an extra var would override every selected service: refused before anything is read
    run = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig,
                       extra_vars={"verify_label_selector": "fleet=verify", "verify_namespaces": [namespace], "verify_name": "fa"})
    assert run.rc != 0
    message = run.result("Check that verify_name and verify_namespace are not extra vars")["msg"]
    assert "which would override every selected service" in message and "verify_names" in message, message
