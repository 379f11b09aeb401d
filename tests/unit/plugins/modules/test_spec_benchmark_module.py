"""spec_benchmark's flow on a loopback streaming server: two phases, refusal before requests, protocol checks."""
import json
import os
import sys
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from tests.loopback_http import serving
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
            "report_context": dict(CONTEXT), "tolerances": {}, "plots": True, "title": None, "progress_file": None,
            "load_from": "auto", "load_job": {}}
    base.update(over)
    return base


def test_two_phases_around_a_rollout(tmp_path, url):
    first = bench_run.benchmark(params(tmp_path, phase="baseline", baseline_url=url, report_context={}))
    assert "decision" not in first and os.path.exists(first["baseline_results"])
    assert first["baseline"]["summary"]["completed"] == 5
    second = bench_run.benchmark(params(tmp_path, phase="candidate", candidate_url=url))
    assert second["decision"] in ("keep", "roll_back") and second["changed"] is False
    with open(second["report_json"], encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["baseline"]["summary"] == first["baseline"]["summary"]
    # Static counters: no delta; the scripted page has no vllm:cache_config_info gauge, so the setting is unknown.
    assert report["baseline"]["prefix_cache"] == {"hits": 0, "queries": 0, "hit_rate": None, "enabled": None}
    assert os.path.exists(second["plots"]["latency"]) and "acceptance" not in second["plots"]  # no spec counters here
    with open(second["progress_file"], encoding="utf-8") as handle:
        assert "candidate 5/5" in handle.read()
    # Different parameters in the second phase are refused.
    with pytest.raises(ValidationError, match="max_tokens"):
        bench_run.benchmark(params(tmp_path, phase="candidate", candidate_url=url, max_tokens=33))


def test_refusal_happens_before_any_request(tmp_path, url):
    sent = len(ScriptedSSE.bodies)
    context = dict(CONTEXT, image=None)
    with pytest.raises(ValidationError, match="Runtime: image"):
        bench_run.benchmark(params(tmp_path, baseline_url=url, candidate_url=url, report_context=context))
    assert len(ScriptedSSE.bodies) == sent


def test_plots_without_matplotlib_are_refused_before_any_request(tmp_path, url, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # a host without matplotlib
    sent = len(ScriptedSSE.bodies)
    with pytest.raises(SpecDecodingError) as err:
        bench_run.benchmark(params(tmp_path, baseline_url=url, candidate_url=url))
    assert err.value.field == "plots" and "pip install 'matplotlib>=3.8'" in str(err.value)
    assert len(ScriptedSSE.bodies) == sent and not os.path.exists(str(tmp_path / "rep"))
    # the baseline phase draws nothing, so it runs without matplotlib
    out = bench_run.benchmark(params(tmp_path, phase="baseline", baseline_url=url, report_context={}))
    assert os.path.exists(out["baseline_results"])


@pytest.mark.parametrize("over,match", [({"runs_per_prompt": 4}, "runs_per_prompt"), ({"runs_per_prompt": 11}, "runs_per_prompt"),
                                        ({"warmup": 2}, "warmup"), ({"request_rate": 0.0}, "request_rate")])
def test_protocol_bounds(tmp_path, over, match):
    with pytest.raises(ValidationError, match=match):
        bench_run.check_protocol(params(tmp_path, **over))


class BufferedSSE(ScriptedSSE):
    """What a buffering proxy delivers: the server works for a while, then the whole stream (role chunk, 40 token
    chunks, usage) goes out in one write and the client reads its chunks microseconds apart."""

    def _stream(self, chat):
        self.start_stream()
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        events += [{"choices": [{"index": 0, "delta": {"content": "t%d " % i}}]} for i in range(40)]
        events.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 40}})
        data = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"
        time.sleep(0.1)
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        self.wfile.flush()


@pytest.fixture
def buffered_url():
    with serving(BufferedSSE) as url:
        yield url


def test_buffered_candidate_is_noted_and_not_kept(tmp_path, url, buffered_url):
    out = bench_run.benchmark(params(tmp_path, baseline_url=url, candidate_url=buffered_url, scrape_metrics=False, plots=False))
    with open(out["requests_file"], encoding="utf-8") as handle:
        requests = json.load(handle)
    assert [bench_stats.burst_delivered(r) for r in requests["candidate"]] == [True] * 5
    assert all(len(r["itl"]) == 40 for r in requests["candidate"])
    assert out["baseline"]["summary"]["burst_delivered"] == 0  # 4 paced chunks: too short to judge, never flagged
    assert out["candidate"]["summary"]["burst_delivered"] == 5
    assert out["decision"] == "roll_back"
    assert out["reasons"][0].startswith("TTFT, ITL and TPOT were not measured per token on the candidate: 5 of 5 streams arrived in bursts")
    [note] = [n for n in out["notes"] if n.startswith("burst delivery on the candidate: 5 of 5 requests")]
    with open(out["report_markdown"], encoding="utf-8") as handle:
        markdown = handle.read()
    assert "- " + out["reasons"][0] in markdown and "- " + note in markdown


def _cache_page(queries, enabled):
    return ("# TYPE vllm:prefix_cache_queries_total counter\n"
            'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} %s\n'
            "# TYPE vllm:prefix_cache_hits_total counter\n"
            'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} %s\n'
            "# TYPE vllm:cache_config_info gauge\n"
            'vllm:cache_config_info{block_size="16",enable_prefix_caching="%s",engine="0"} 1.0\n' % (queries, queries / 4.0, enabled))


def _pages_handler(pages):
    """``(handler, served)``: a ScriptedSSE handler whose /metrics serves ``pages`` in turn (the last repeats)."""
    served = []

    class Pages(ScriptedSSE):
        def do_GET(self):
            if self.path != "/metrics":
                ScriptedSSE.do_GET(self)
                return
            payload = pages[min(len(served), len(pages) - 1)].encode()
            served.append(self.path)
            self.send_payload(200, payload)

    return Pages, served


def test_prefix_caching_setting_per_side_from_the_scrape_after_the_run(tmp_path):
    # Baseline: off before the run, on after it (the later page counts); candidate: off throughout.
    base_handler, base_served = _pages_handler([_cache_page(100.0, "False"), _cache_page(300.0, "True")])
    cand_handler, cand_served = _pages_handler([_cache_page(40.0, "False"), _cache_page(40.0, "False")])
    with serving(base_handler) as base_url, serving(cand_handler) as cand_url:
        out = bench_run.benchmark(params(tmp_path, baseline_url=base_url, candidate_url=cand_url, plots=False))
    assert len(base_served) == 2 and len(cand_served) == 2  # before and after the measured requests
    assert out["baseline"]["prefix_cache"] == {"hits": 50, "queries": 200, "hit_rate": 0.25, "enabled": True}
    assert out["candidate"]["prefix_cache"] == {"hits": 0, "queries": 0, "hit_rate": None, "enabled": False}
    [note] = [n for n in out["notes"] if n.startswith("prefix caching is")]
    assert note.startswith("prefix caching is on for the baseline (hit rate 25.0%) and off for the candidate")
    with open(out["report_markdown"], encoding="utf-8") as handle:
        markdown = handle.read()
    assert "| baseline | on | 50 / 200 | 25.0% |" in markdown and "| candidate | off | 0 / 0 | n/a |" in markdown
    assert "- " + note in markdown
