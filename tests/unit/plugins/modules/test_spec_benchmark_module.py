"""spec_benchmark's flow on a loopback streaming server: two phases, refusal before requests, protocol checks."""
import json
import os

import pytest

from ansible_collections.alauda.spec_decoding.plugins.modules import spec_benchmark
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.unit.plugins.module_utils.test_bench_client import ScriptedSSE, server  # noqa: F401  pylint: disable=unused-import

CONTEXT = {"gpu_model": "L4", "gpu_count": 1, "model": "tiny", "dtype": "float32", "vllm_version": "0.32.0",
           "image": "vllm/vllm-openai:v0.32.0", "baseline_command": "vllm serve /m", "candidate_command": "vllm serve /m --speculative-config {}"}


@pytest.fixture(scope="module")
def url(server):  # the scripted SSE server of the client tests
    return server


def params(tmp_path, **over):
    base = {"baseline_url": None, "candidate_url": None, "phase": "both", "baseline_results": None, "baseline_model": None,
            "candidate_model": None, "api": "chat", "workload": "general_chat", "prompts_file": None, "num_prompts": 1,
            "runs_per_prompt": 5, "warmup": 3, "concurrency": 2, "request_rate": None, "arrival": "poisson", "temperature": 0.0,
            "max_tokens": 32, "seed": 0, "extra_body": {}, "bearer_token": None, "headers": {}, "validate_certs": True,
            "ca_path": None, "timeout": 30.0, "scrape_metrics": True, "report_dir": str(tmp_path / "rep"), "report_name": "report",
            "report_context": dict(CONTEXT), "tolerances": {}, "plots": True, "title": None, "progress_file": None}
    base.update(over)
    return base


def test_two_phases_around_a_rollout(tmp_path, url):
    first = spec_benchmark.run(params(tmp_path, phase="baseline", baseline_url=url, report_context={}))
    assert "decision" not in first and os.path.exists(first["baseline_results"])
    assert first["baseline"]["summary"]["completed"] == 5
    second = spec_benchmark.run(params(tmp_path, phase="candidate", candidate_url=url))
    assert second["decision"] in ("keep", "roll_back") and second["changed"] is False
    with open(second["report_json"], encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["baseline"]["summary"] == first["baseline"]["summary"]
    assert report["baseline"]["prefix_cache"] == {"hits": 0, "queries": 0, "hit_rate": None}  # static counters: no delta
    assert os.path.exists(second["plots"]["latency"]) and "acceptance" not in second["plots"]  # no spec counters here
    with open(second["progress_file"], encoding="utf-8") as handle:
        assert "candidate 5/5" in handle.read()
    # Different parameters in the second phase are refused.
    with pytest.raises(ValidationError, match="max_tokens"):
        spec_benchmark.run(params(tmp_path, phase="candidate", candidate_url=url, max_tokens=33))


def test_refusal_happens_before_any_request(tmp_path, url):
    sent = len(ScriptedSSE.bodies)
    context = dict(CONTEXT, image=None)
    with pytest.raises(ValidationError, match="Runtime: image"):
        spec_benchmark.run(params(tmp_path, baseline_url=url, candidate_url=url, report_context=context))
    assert len(ScriptedSSE.bodies) == sent


@pytest.mark.parametrize("over,match", [({"runs_per_prompt": 4}, "runs_per_prompt"), ({"runs_per_prompt": 11}, "runs_per_prompt"),
                                        ({"warmup": 2}, "warmup"), ({"request_rate": 0.0}, "request_rate")])
def test_protocol_bounds(tmp_path, over, match):
    with pytest.raises(ValidationError, match=match):
        spec_benchmark.check_protocol(params(tmp_path, **over))
