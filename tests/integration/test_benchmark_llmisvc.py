"""benchmark role with spec_decoding_resource_kind=LLMInferenceService, on the test bed (the real LLMInferenceService CRD,
the controller stand-in written from KServe's llmisvc controller, pods logging the recorded vLLM 0.32 engine lines).

deploy-eagle3.yml with its guard (spec_decoding_guard=true, the benchmark role as benchmark.yml runs it) deploys a
speculative-decoding LLMInferenceService, then its baseline twin (same spec, flag stripped), benchmarks both against
loopback streaming servers (the API server cannot proxy to loopback, so the URLs are given; the URL the role read from
status is checked apart), finds that the candidate does not pay and rolls it back through the rollback role: the API
server then shows the flag gone and the twin deleted. The benchmark role refuses bad input before it writes anything or
sends a request.
"""
from __future__ import annotations

import json

import pytest

from tests.ansible_run import run_playbook
from tests.integration.test_benchmark_role import _ok
from tests.integration.test_deploy import _get
from tests.loopback_http import serving
from tests.module_run import run_module
from tests.paced_server import paced_handler
from tests.paths import read_capture

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import baseline_twin as bench_twin
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit as vllm_edit

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1alpha2", "llminferenceservices"
NAME = "bench-eagle3"
TWIN = NAME + "-baseline"
IMAGE = "registry.local/vllm/vllm-openai:v0.32.0"
EAGLE3 = {"method": "eagle3", "model": "/mnt/models/tiny-eagle3", "num_spec_tokens": 3}  # as recorded (tests/fixtures/vllm/eagle3)
BENCH_VARS = {"benchmark_workload": "general_chat", "benchmark_max_tokens": 16, "benchmark_concurrency": 3,
              "benchmark_baseline_twin_wait_timeout": 60, "rollback_wait_timeout": 60, "rollback_wait_sleep": 1,
              "rollback_verify_delay": 1, "verify_wait_interval": 1, "verify_metrics_scheme": "http"}  # inert, see test_benchmark_role


def _get_or_none(k8s_client, namespace, name):
    return _get(k8s_client, namespace, name, version=VERSION, plural=PLURAL)


@pytest.fixture
def endpoints():
    """A fast baseline and a slow candidate endpoint; each handler's .state counts the requests it served."""
    fast, slow = paced_handler(NAME, 0.002, 0.001), paced_handler(NAME, 0.02, 0.01)
    with serving(fast) as fast_url, serving(slow) as slow_url:
        yield {"baseline": fast_url, "candidate": slow_url, "baseline_state": fast.state, "candidate_state": slow.state}


def test_benchmark_against_the_twin_and_the_guard_rolls_back(tmp_path, kubeconfig, k8s_client, llmisvc, namespace, gpu_node, endpoints):
    baseline, eagle3 = read_capture("baseline", "startup.log"), read_capture("eagle3", "startup.log")
    llmisvc.set_behaviour(namespace, NAME, ready_after=0.2, logs={"main": baseline})
    llmisvc.set_behaviour(namespace, NAME, pool="decode", generation=1, ready_after=0.2, logs={"main": eagle3})
    llmisvc.set_behaviour(namespace, TWIN, ready_after=0.2, logs={"main": baseline})
    report_dir = tmp_path / "report"
    # deploy-eagle3.yml, as users run it, with its guard: apply, wait, verify, then the benchmark role against the twin.
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig, timeout=900, extra_vars=dict(
        BENCH_VARS, spec_decoding_hosts="localhost", spec_decoding_target="cluster", spec_decoding_namespace=namespace,
        spec_decoding_isvc_name=NAME, spec_decoding_resource_kind="LLMInferenceService", spec_decoding_llmisvc={"image": IMAGE},
        spec_decoding_vllm_version="0.32.0", spec_decoding_gpu_count=1, spec_decoding_dtype="bfloat16",
        spec_decoding_wait_timeout=60, spec_decoding_artifact_mode="pvc",
        spec_decoding_artifacts={"pvc_name": "model-store", "draft_subdir": "tiny-eagle3"}, spec_decoding_guard=True,
        benchmark_baseline_twin=True, benchmark_report_dir=str(report_dir),
        benchmark_baseline_url=endpoints["baseline"], benchmark_candidate_url=endpoints["candidate"]))
    _ok(run)
    applied = [res["result"] for name, _h, res in run.tasks if "Apply the InferenceService" in name]
    assert [a["metadata"]["name"] for a in applied] == [NAME, TWIN]  # the rollout first, then its twin
    cand_applied = applied[0]
    twin = applied[1]
    # The twin, as the API server stored it: the candidate's spec with the flag removed token-exact, labelled a twin.
    cand_cmd = cand_applied["spec"]["template"]["containers"][0]["command"]
    twin_cmd = twin["spec"]["template"]["containers"][0]["command"]
    assert vllm_command.find_speculative_config(cand_cmd)["method"] == "eagle3"
    assert vllm_command.find_speculative_config(twin_cmd) is None and twin_cmd == vllm_edit.strip_speculative_config(cand_cmd)
    assert {k: v for k, v in twin["spec"].items() if k != "template"} == {k: v for k, v in cand_applied["spec"].items() if k != "template"}
    assert twin["metadata"]["labels"][bench_twin.TWIN_LABEL] == "true"
    assert twin["metadata"]["annotations"][bench_twin.TWIN_OF_ANNOTATION] == "%s/%s" % (namespace, NAME)
    # The twin was proven to run without a proposer (verify role, per pool) before it was measured.
    twin_engine = [res for name, _h, res in run.tasks if "Check the engine-config line of every pod, per pool" in name][-1]
    assert twin_engine["pools"]["decode"]["speculative_config"] is None

    # Both sides were really measured, and the candidate does not pay: roll_back.
    bench = run.result("Run the A/B benchmark")
    assert bench["decision"] == "roll_back", bench.get("reasons")
    assert endpoints["baseline_state"]["posts"] >= 3 + 5 and endpoints["candidate_state"]["posts"] >= 3 + 5
    with open(bench["report_json"], encoding="utf-8") as handle:
        ctx = json.load(handle)["context"]
    # Read from the cluster: commands from spec.template (main), image and GPU limit from the decode pod, GPU model from
    # its node, vLLM version and speculative config from the decode pool's engine line, model from --served-model-name.
    assert ctx["commands"]["candidate"] == cand_cmd and ctx["commands"]["baseline"] == twin_cmd
    assert ctx["runtime"] == {"vllm_version": "0.32.0", "image": IMAGE}
    assert ctx["hardware"] == {"gpu_model": "NVIDIA-L4", "gpu_count": "1", "notes": None}
    assert ctx["model"] == {"id": NAME, "dtype": "bfloat16"}
    assert ctx["speculative_config"] == EAGLE3
    # The URLs the role read from each side's status (overridden here by the loopback ones).
    seen = [res["ansible_facts"]["benchmark_cluster"] for name, _h, res in run.tasks
            if "Remember what the cluster says about the side" in name][-1]
    live = _get_or_none(k8s_client, namespace, NAME)
    assert seen["candidate"]["url"] == live["status"]["url"] and seen["candidate"]["url"]
    assert seen["baseline"]["url"] and TWIN in seen["baseline"]["url"]

    # The guard rolled the candidate back (rollback role, LLMInferenceService path) and the API server shows it.
    strip = run.result("Strip the speculative config")
    assert strip["changed"] and strip["previous_config"]["decode"]["method"] == "eagle3"
    assert run.result("Prove no pool's engine runs a proposer")["pools"]["decode"]["speculative_config"] is None
    assert live["metadata"]["generation"] == 2
    assert vllm_command.find_speculative_config(live["spec"]["template"]["containers"][0]["command"]) is None
    assert live["spec"]["template"]["containers"][0]["command"] == twin_cmd
    assert run.result("Delete the baseline twin")["changed"] is True
    assert _get_or_none(k8s_client, namespace, TWIN) is None


def _apply_rendered(kubeconfig, namespace, name, method, **more):
    """Render with isvc_manifest and server-side apply, in-process (as the inference_service role does); the object."""
    rendered = run_module("isvc_manifest", dict({
        "resource_kind": "LLMInferenceService", "name": name, "namespace": namespace, "method": method, "artifact_mode": "pvc",
        "artifacts": {"pvc_name": "model-store", "draft_subdir": "tiny-eagle3"}, "runtime": "unused", "vllm_version": "0.32.0",
        "gpu_count": 0, "llmisvc": {"image": IMAGE}}, **more))
    assert not rendered.failed, rendered.msg
    applied = run_module("kubernetes.core.k8s", {"kubeconfig": kubeconfig, "state": "present", "definition": rendered["manifest"],
                                                 "apply": True, "server_side_apply": {"field_manager": "alauda-spec-decoding"}})
    assert not applied.failed, applied.msg
    return applied["result"]


def test_bad_input_is_refused_before_anything_is_written_or_sent(tmp_path, kubeconfig, k8s_client, llmisvc, namespace, endpoints):
    _apply_rendered(kubeconfig, namespace, "spec-on", "eagle3")
    _apply_rendered(kubeconfig, namespace, "spec-off", "none")
    before = {n: _get_or_none(k8s_client, namespace, n)["metadata"]["generation"] for n in ("spec-on", "spec-off")}
    # One ansible-playbook run: each case includes the role (as benchmark.yml does) in a block whose rescue records the
    # refusal; a case the role accepted leaves no "Refused:" task and the lookups below fail.
    cases = {
        "unknown kind": {"benchmark_resource_kind": "LLMInferenceServices", "benchmark_candidate_name": "spec-on",
                         "benchmark_baseline_name": "spec-off"},
        "baseline with the flag": {"benchmark_resource_kind": "LLMInferenceService", "benchmark_candidate_name": "spec-on",
                                   "benchmark_baseline_name": "spec-on"},
        "candidate without the flag": {"benchmark_resource_kind": "LLMInferenceService", "benchmark_candidate_name": "spec-off",
                                       "benchmark_baseline_twin": True},
    }
    tasks = [{"name": "Case " + case, "block": [{"ansible.builtin.include_role": {"name": "alauda.spec_decoding.benchmark"},
                                                 "vars": dict(case_vars, benchmark_guard=True)}],
              "rescue": [{"name": "Refused: " + case, "ansible.builtin.debug": {"msg": "{{ ansible_failed_result.msg }}"}}]}
             for case, case_vars in cases.items()]
    run = run_playbook(tmp_path, tasks=json.dumps(tasks), kubeconfig=kubeconfig, extra_vars=dict(
        BENCH_VARS, benchmark_namespace=namespace, benchmark_report_dir=str(tmp_path / "report"),
        benchmark_baseline_url=endpoints["baseline"], benchmark_candidate_url=endpoints["candidate"]))
    _ok(run)
    # An unknown kind: the role's argument spec names the variable.
    msg = run.result("Refused: unknown kind")["msg"]
    assert "benchmark_resource_kind" in msg and "LLMInferenceServices" in msg, msg
    # A named baseline that carries the flag.
    msg = run.result("Refused: baseline with the flag")["msg"]
    assert "benchmark_baseline_name: LLMInferenceService %s/spec-on carries a speculative flag in pool(s) decode" % namespace in msg, msg
    # A candidate without the flag: no twin is made of it.
    msg = run.result("Refused: candidate without the flag")["msg"]
    assert "candidate: LLMInferenceService spec-off carries no speculative flag" in msg, msg
    assert _get_or_none(k8s_client, namespace, "spec-off-baseline") is None
    # Nothing was sent, nothing written, nothing rolled back.
    assert endpoints["baseline_state"]["posts"] == endpoints["candidate_state"]["posts"] == 0
    assert not (tmp_path / "report").exists()
    assert {n: _get_or_none(k8s_client, namespace, n)["metadata"]["generation"] for n in ("spec-on", "spec-off")} == before
