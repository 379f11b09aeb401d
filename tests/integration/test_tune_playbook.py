"""playbooks/tune.yml with the sides named as InferenceServices and the confirmation deployed through the
inference_service role, on the real kube-apiserver.

The baseline and candidate are guide-style InferenceServices (Example 1 without and with ngram k=5) reconciled by the
KServe stand-in; their pods log the real vLLM 0.32 engine lines (tests/captures), which the role reads through the
benchmark role's reader and the module checks before any request. The inference endpoints are paced loopback servers
(tests/paced_server.py; the API server cannot proxy to loopback, so the URLs are given): the candidate runs k=5 with
an acceptance curve that collapses at slot 2, so with a verify cost of 0.2 per slot the prediction is k=1. The role
then deploys the k=1 InferenceService with the inference_service role (server-side apply, the stand-in makes it
Ready), and confirms it by an A/B against k=5 on the loopback server standing for its endpoint. The second sweep call
resumes the first one's JSON.
"""
from __future__ import annotations

import json

from tests.ansible_run import run_playbook
from tests.integration.test_benchmark_role import _manifest, _wait_ready
from tests.integration.test_deploy import BASE_VARS
from tests.loopback_http import serving
from tests.paced_server import paced_handler
from tests.paths import read_capture

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
NAME = "llama-ngram-k1"
BASE, CAND = "qwen25-7b-base", "qwen25-7b-ngram"
# the caller's context; the commands and the vLLM version come from the cluster (InferenceServices, engine lines)
CONTEXT = {"gpu_model": "none (paced loopback server)", "gpu_count": 0, "model": "paced", "dtype": "none", "image": "none"}


def _named_sides(kserve, k8s_client, namespace, baseline_log="baseline"):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    api = client.CustomObjectsApi(k8s_client)
    kserve.set_behaviour(namespace, BASE, ready_after=0.2, log_text=read_capture(baseline_log, "startup.log"))
    kserve.set_behaviour(namespace, CAND, ready_after=0.2, log_text=read_capture("ngram", "startup.log"))
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _manifest("guide_example1_ngram.rolled_back.yaml", namespace, BASE))
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _manifest("guide_example1_ngram.yaml", namespace, CAND))
    _wait_ready(k8s_client, namespace, BASE)
    _wait_ready(k8s_client, namespace, CAND)


def _prompts(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "p%d " % i * 5}) + "\n" for i in range(2)))
    return str(prompts)


def test_tune_deploys_the_predicted_k_and_confirms_it(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=read_capture("ngram", "startup.log"))
    _named_sides(kserve, k8s_client, namespace)
    base = paced_handler("paced-base", 0.020, 0.010)
    cand = paced_handler("paced-ngram", 0.015, 0.006, spec_rates=[0.9, 0.1, 0.05, 0.02, 0.01])
    k1 = paced_handler("paced-ngram-k1", 0.010, 0.004, spec_rates=[0.9])
    with serving(base) as b_url, serving(cand) as c_url, serving(k1) as k_url:
        extra = dict(BASE_VARS, spec_decoding_namespace=namespace, spec_decoding_isvc_name=NAME,
                     tune_baseline_name=BASE, tune_candidate_name=CAND, tune_baseline_url=b_url, tune_candidate_url=c_url,
                     tune_concurrencies=[1, 2], tune_method="ngram",
                     tune_k_candidates=[1, 2, 3], tune_verify_cost_ratio=0.2, tune_confirm_deploy=True, tune_confirm_url=k_url,
                     tune_prompts_file=_prompts(tmp_path), tune_max_tokens=8, tune_report_dir=str(tmp_path / "report"),
                     tune_report_context=CONTEXT)
        run = run_playbook(tmp_path, "playbooks/tune.yml", kubeconfig=kubeconfig, extra_vars=extra, timeout=600)
        assert run.rc == 0 and not run.failed, run.output
        posts = {"baseline": base.state["posts"], "candidate": cand.state["posts"], "k1": k1.state["posts"]}
    first, second = [res for name, _h, res in run.tasks if name.endswith("Run the sweep")]
    # what each side runs, read from its pods' engine lines before the first request; k=5 is the candidate's own
    assert first["checks"]["baseline"]["engine_line"] == "speculative_config=None", first["checks"]
    assert first["checks"]["candidate"]["engine_line"] == "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5)"
    assert first["k"]["current_k"] == 5
    assert first["k"]["prediction"]["predicted_k"] == 1 and first["k"]["recommended_k"] is None
    assert (first["resumed"], first["measured"]) == (0, 4)
    assert (second["resumed"], second["measured"]) == (4, 2)
    # 2 loads x 13 requests per side, then one confirmation pair at the lowest load: nothing measured twice
    assert posts == {"baseline": 2 * 13, "candidate": 3 * 13, "k1": 13}
    assert second["k"]["confirmation"]["status"] == "confirmed" and second["k"]["recommended_k"] == 1
    assert run.result("Record the recommendation")["ansible_facts"]["tune_recommended_k"] == 1
    # the report's commands and vLLM version are the cluster's (the InferenceServices and the engine line)
    md = open(second["report_markdown"], encoding="utf-8").read()
    assert "--served-model-name qwen25-7b-ngram" in md and "| Runtime: vLLM version | 0.32.0 |" in md, md
    # the predicted k was deployed through the inference_service role: applied with ngram and num_speculative_tokens=1
    isvc = client.CustomObjectsApi(k8s_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    script = json.dumps(isvc["spec"]["predictor"])
    assert '\\"num_speculative_tokens\\": 1' in script or '\\"num_speculative_tokens\\":1' in script, script
    assert "ngram" in script
    assert run.result("Apply the InferenceService")["changed"] is True


def test_a_baseline_whose_engine_runs_ngram_is_refused_before_any_request(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    _named_sides(kserve, k8s_client, namespace, baseline_log="ngram")
    base = paced_handler("paced-base", 0.020, 0.010)  # its /metrics has no spec-decode counters: only the log tells
    cand = paced_handler("paced-ngram", 0.015, 0.006, spec_rates=[0.9, 0.1, 0.05, 0.02, 0.01])
    with serving(base) as b_url, serving(cand) as c_url:
        run = run_playbook(tmp_path, "playbooks/tune.yml", kubeconfig=kubeconfig, extra_vars={
            "tune_namespace": namespace, "tune_baseline_name": BASE, "tune_candidate_name": CAND, "tune_baseline_url": b_url,
            "tune_candidate_url": c_url, "tune_concurrencies": [1], "tune_prompts_file": _prompts(tmp_path), "tune_max_tokens": 8,
            "tune_report_dir": str(tmp_path / "report"), "tune_report_context": CONTEXT}, timeout=300)
        assert run.rc != 0
        failed = run.failed[-1]
        assert failed.get("field") == "baseline_engine_config" and "so it is no baseline" in failed["msg"], failed
        assert "method='ngram'" in failed["msg"], failed["msg"]
        assert (base.state["posts"], cand.state["posts"]) == (0, 0)
    assert not (tmp_path / "report" / "sweep.json").exists()
