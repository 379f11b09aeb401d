"""playbooks/tune.yml with the confirmation deployed through the inference_service role, on the real kube-apiserver.

The sweep measures paced loopback servers (tests/paced_server.py): the candidate runs k=3 with an acceptance curve
that collapses at slot 2, so with a verify cost of 0.2 per slot the prediction is k=1. The role then deploys the
k=1 InferenceService with the inference_service role (server-side apply, the KServe stand-in makes it Ready), and
confirms it by an A/B against k=3 on the loopback server standing for its endpoint (the API server cannot proxy to
loopback, so ``tune_confirm_url`` gives its address). The second sweep call resumes the first one's JSON.
"""
from __future__ import annotations

import json

from tests.ansible_run import run_playbook
from tests.integration.test_deploy import BASE_VARS
from tests.loopback_http import serving
from tests.paced_server import paced_handler
from tests.paths import read_capture

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
NAME = "llama-ngram-k1"
CONTEXT = {"gpu_model": "none (paced loopback server)", "gpu_count": 0, "model": "paced", "dtype": "none", "vllm_version": "none",
           "image": "none", "baseline_command": ["paced-sse"],
           "candidate_command": ["paced-sse", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']}


def test_tune_deploys_the_predicted_k_and_confirms_it(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=read_capture("ngram", "startup.log"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "p%d " % i * 5}) + "\n" for i in range(2)))
    base = paced_handler("paced-base", 0.020, 0.010)
    cand = paced_handler("paced-ngram", 0.015, 0.006, spec_rates=[0.9, 0.1, 0.05])
    k1 = paced_handler("paced-ngram-k1", 0.010, 0.004, spec_rates=[0.9])
    with serving(base) as b_url, serving(cand) as c_url, serving(k1) as k_url:
        extra = dict(BASE_VARS, spec_decoding_namespace=namespace, spec_decoding_isvc_name=NAME,
                     tune_baseline_url=b_url, tune_candidate_url=c_url, tune_concurrencies=[1, 2], tune_method="ngram",
                     tune_k_candidates=[1, 2, 3], tune_verify_cost_ratio=0.2, tune_confirm_deploy=True, tune_confirm_url=k_url,
                     tune_prompts_file=str(prompts), tune_max_tokens=8, tune_report_dir=str(tmp_path / "report"),
                     tune_report_context=CONTEXT)
        run = run_playbook(tmp_path, "playbooks/tune.yml", kubeconfig=kubeconfig, extra_vars=extra, timeout=600)
        assert run.rc == 0 and not run.failed, run.output
        posts = {"baseline": base.state["posts"], "candidate": cand.state["posts"], "k1": k1.state["posts"]}
    first, second = [res for name, _h, res in run.tasks if name.endswith("Run the sweep")]
    assert first["k"]["prediction"]["predicted_k"] == 1 and first["k"]["recommended_k"] is None
    assert (first["resumed"], first["measured"]) == (0, 4)
    assert (second["resumed"], second["measured"]) == (4, 2)
    # 2 loads x 13 requests per side, then one confirmation pair at the lowest load: nothing measured twice
    assert posts == {"baseline": 2 * 13, "candidate": 3 * 13, "k1": 13}
    assert second["k"]["confirmation"]["status"] == "confirmed" and second["k"]["recommended_k"] == 1
    assert run.result("Record the recommendation")["ansible_facts"]["tune_recommended_k"] == 1
    # the predicted k was deployed through the inference_service role: applied with ngram and num_speculative_tokens=1
    isvc = client.CustomObjectsApi(k8s_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    script = json.dumps(isvc["spec"]["predictor"])
    assert '\\"num_speculative_tokens\\": 1' in script or '\\"num_speculative_tokens\\":1' in script, script
    assert "ngram" in script
    assert run.result("Apply the InferenceService")["changed"] is True
