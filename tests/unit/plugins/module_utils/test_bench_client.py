"""Streaming client: SSE parsing and timing over a real loopback HTTP exchange, arrivals, workloads, /metrics."""
import json
import threading
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import workloads as bench_workloads
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.bench_streams import streams
from tests.loopback_http import OpenAIStream, serving
from tests.paths import read_capture

GAP = 0.05


class ScriptedSSE(OpenAIStream):
    """Streams: role chunk, 3 content chunks GAP apart (the 2nd carries 3 tokens), finish, usage, [DONE]."""
    gap = GAP
    bodies = []
    active = 0
    max_active = 0
    lock = threading.Lock()

    def do_GET(self):  # pylint: disable=invalid-name
        if self.path == "/v1/models":
            payload = json.dumps({"data": [{"id": "tiny"}]}).encode()
        else:
            payload = b"vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"tiny\"} 100.0\n" \
                      b"vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"tiny\"} 25.0\n"
        self.send_payload(200, payload)

    def do_POST(self):  # pylint: disable=invalid-name
        body = self.read_json()
        ScriptedSSE.bodies.append((self.path, body, self.headers.get("Authorization")))
        if body.get("max_completion_tokens", body.get("max_tokens")) == 400:
            self.send_payload(400, b'{"error": "min_p is not supported with speculative decoding"}')
            return
        chat = self.path.endswith("/chat/completions")
        with ScriptedSSE.lock:
            ScriptedSSE.active += 1
            ScriptedSSE.max_active = max(ScriptedSSE.max_active, ScriptedSSE.active)
        try:
            self._stream(chat)
        finally:
            with ScriptedSSE.lock:
                ScriptedSSE.active -= 1

    def _stream(self, chat):
        self.start_stream()

        def choice(text):
            return {"choices": [{"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}]}

        time.sleep(self.gap)
        if chat:
            self.event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        else:
            self.event(choice("a"))
        for text in ("b", "cde", "f"):
            time.sleep(self.gap)
            self.event(choice(text))
        self.write_chunk(b": ping\n\n")  # an SSE comment (keep-alive): not a chunk
        self.event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 6}})
        self.end_stream()


@pytest.fixture(scope="module")
def server():
    with serving(ScriptedSSE) as url:
        yield url


PARAMS = {"max_tokens": 64, "temperature": 0.0, "seed": 7, "extra_body": {"ignore_eos": True}}


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_stream_timing_and_body(server, api):
    endpoint = bench_client.Endpoint(server + "/v1", api=api, token="s3cret")
    assert endpoint.resolve_model() == "tiny"
    prompt = bench_workloads.builtin_workload("general_chat")[0]
    # the second request goes on the keep-alive connection the first left open
    record, record2 = streams(endpoint, (prompt, PARAMS), (prompt, PARAMS))
    assert record["success"], record
    assert record["output_tokens"] == 6 and record["prompt_tokens"] == 7
    assert record["chunks"] == 4 and len(record["itl"]) == 3
    # The server sleeps GAP before every chunk, so chunk i cannot arrive before (i + 1) * GAP (minus timer slack).
    # A single interval can be shorter: a client descheduled on a busy machine reads two buffered chunks at once.
    # Each interval stays well under a second.
    assert GAP * 0.9 <= record["ttft"] < GAP + 1.0
    arrived = record["ttft"]
    for index, gap in enumerate(record["itl"], start=2):
        arrived += gap
        assert arrived >= index * GAP * 0.9 and 0 <= gap < GAP + 1.0, record
    assert record["latency"] == pytest.approx(record["ttft"] + sum(record["itl"]), rel=1e-9)
    path, body, auth = ScriptedSSE.bodies[-1]
    assert auth == "Bearer s3cret"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.0 and body["seed"] == 7 and body["ignore_eos"] is True and body["model"] == "tiny"
    if api == "chat":
        assert path == "/v1/chat/completions" and body["messages"] == prompt["messages"] and body["max_completion_tokens"] == 64
        # the request shape of `vllm bench serve --backend openai-chat`: one user message, one text part
        assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": prompt["prompt"]}]}]
    else:
        assert path == "/v1/completions" and body["prompt"] == prompt["prompt"] and body["max_tokens"] == 64
    # The keep-alive connection is reusable for the next request.
    assert record2["success"]


def test_run_requests_concurrency_and_errors(server):
    endpoint = bench_client.Endpoint(server, api="completions", model="tiny")
    prompts = bench_workloads.builtin_workload("code_refactor")
    seen = []
    ScriptedSSE.max_active = 0
    records, duration = bench_client.run_requests(endpoint, bench_client.schedule(prompts, 3), PARAMS, concurrency=3,
                                                  progress=lambda *a: seen.append(a[1]))
    assert ScriptedSSE.max_active == 3  # three in flight at once, never more
    assert len(records) == 6 and all(r["success"] for r in records) and sorted(seen) == list(range(1, 7))
    assert [r["prompt_id"] for r in records] == [p["id"] for p in prompts] * 3
    assert duration > 0
    bad, = streams(endpoint, (prompts[0], dict(PARAMS, max_tokens=400)))
    assert not bad["success"] and bad["error"].startswith("HTTP 400") and "min_p" in bad["error"]
    with pytest.raises(bench_client.BenchmarkRequestError, match="every warmup request"):
        bench_client.measure_side(endpoint, prompts, dict(PARAMS, max_tokens=400), warmup=3)


def test_unreachable_and_reserved_keys():
    endpoint = bench_client.Endpoint("http://127.0.0.1:9", field="baseline_url", timeout=2)
    with pytest.raises(bench_client.BenchmarkRequestError, match="baseline_url: cannot reach"):
        endpoint.resolve_model()
    with pytest.raises(ValidationError, match="extra_body"):
        bench_client.Endpoint("http://x", model="m").body({"prompt": "p", "messages": []}, dict(PARAMS, extra_body={"stream": False}))
    with pytest.raises(ValidationError, match="baseline_url"):
        bench_client.Endpoint("ftp://x", field="baseline_url")


def test_arrivals_are_seeded():
    assert bench_client.arrival_offsets(3) == [0.0, 0.0, 0.0]
    assert bench_client.arrival_offsets(4, 2.0, "fixed") == [0.0, 0.5, 1.0, 1.5]
    first = bench_client.arrival_offsets(200, 5.0, "poisson", seed=3)
    assert first == bench_client.arrival_offsets(200, 5.0, "poisson", seed=3)
    assert first != bench_client.arrival_offsets(200, 5.0, "poisson", seed=4)
    gaps = [b - a for a, b in zip(first, first[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.2, rel=0.25)


def test_metrics_prefix_cache(server):
    endpoint = bench_client.Endpoint(server, model="tiny")
    after = bench_client.prefix_cache_counters(endpoint.metrics_text(), "tiny")
    assert after == {"hits": 25.0, "queries": 100.0}
    delta = bench_client.prefix_cache_delta({"hits": 5.0, "queries": 20.0}, after)
    assert delta == {"hits": 20, "queries": 80, "hit_rate": 0.25}
    assert bench_client.prefix_cache_delta({"hits": 50.0, "queries": 500.0}, after)["queries"] == 100  # restarted
    assert bench_client.prefix_cache_counters("# nothing\n") is None
    assert bench_client.prefix_cache_counters(read_capture("ngram", "metrics.txt"), "t-ngram") == {"hits": 0.0, "queries": 540.0}


def test_workloads_and_jsonl():
    refactor = bench_workloads.builtin_workload("code_refactor")
    for prompt in refactor:
        code = prompt["prompt"].split("```python\n", 1)[1].split("```", 1)[0]
        assert 28 <= len(code.strip().splitlines()) <= 36 and "def " in code and '"""' not in code
        compile(code, "<class>", "exec")
    chat = bench_workloads.builtin_workload("general_chat")
    assert all("at least 800 words" in p["prompt"] for p in chat)
    assert bench_workloads.builtin_workload("general_chat") == chat  # fixed order
    text = '# comment\n"plain"\n{"prompt": "p2", "id": "x"}\n\n{"messages": [{"role": "user", "content": "m"}]}\n'
    parsed = bench_workloads.parse_prompts_jsonl(text, "f.jsonl")
    assert [p["prompt"] for p in parsed] == ["plain", "p2", "m"] and parsed[1]["id"] == "x"
    for bad, msg in (("{nope", "line 1 is not valid JSON"), ('{"x": 1}', "neither"), ("[1]", "string or object"),
                     ('""', "empty prompt"), ("", "holds no prompts"), ('{"messages": []}', "messages must")):
        with pytest.raises(ValidationError, match=msg):
            bench_workloads.parse_prompts_jsonl(bad, "f.jsonl")
    with pytest.raises(ValidationError, match="workload"):
        bench_workloads.builtin_workload("nope")
    assert len(bench_workloads.load_workload("general_chat", num_prompts=2)) == 2
    assert json.loads(bench_workloads.to_jsonl(parsed).splitlines()[0]) == {"prompt": "plain"}


# -- prefix caching on/off (vllm:cache_config_info) -----------------------------------------------------------------
def _capture(folder):
    return read_capture(folder, "metrics.txt")


def _literal(text, prefix):
    """The value of the one sample line starting with ``prefix`` (read with string operations)."""
    [line] = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line.rsplit(" ", 1)[1])


CACHE_INFO = 'vllm:cache_config_info{block_size="16",enable_prefix_caching="%s",engine="%s",gpu_memory_utilization="0.9"} 1.0\n'


def _info_page(*engines):
    """A page with one cache_config_info gauge per engine: ``engines`` are the label values ("True", "False", ...)."""
    return "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n" + \
        "".join(CACHE_INFO % (value, index) for index, value in enumerate(engines))


@pytest.mark.parametrize("folder", ["baseline", "ngram", "ngram_eager", "ngram_perreq", "draft_model", "eagle3"])
def test_captures_report_prefix_caching_on_and_their_counters(folder):
    text = _capture(folder)
    [info] = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert 'enable_prefix_caching="True"' in info  # every capture ran with vLLM's default (on)
    assert bench_client.prefix_caching_enabled(text) is True
    model = "t-" + folder
    queries = _literal(text, 'vllm:prefix_cache_queries_total{engine="0",model_name="%s"}' % model)
    hits = _literal(text, 'vllm:prefix_cache_hits_total{engine="0",model_name="%s"}' % model)
    assert bench_client.prefix_cache_counters(text, model) == {"hits": hits, "queries": queries}
    # The model filter applies to the counters; the gauge has no model_name label and always counts.
    assert bench_client.prefix_cache_counters(text, "someone-else") is None
    assert bench_client.prefix_caching_enabled(text, "someone-else") is True


def test_prefix_caching_off_absent_and_unknown():
    text = _capture("ngram")
    assert text.count('enable_prefix_caching="True"') == 1
    assert bench_client.prefix_caching_enabled(text.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')) is False
    without_gauge = "\n".join(line for line in text.splitlines() if "vllm:cache_config_info" not in line) + "\n"
    assert bench_client.prefix_caching_enabled(without_gauge) is None                  # older vLLM: no gauge
    assert bench_client.prefix_cache_counters(without_gauge, "t-ngram")["queries"] == 540.0  # the counters stay
    assert bench_client.prefix_caching_enabled(text.replace('enable_prefix_caching="True",', "")) is None  # no label
    assert bench_client.prefix_caching_enabled(_info_page("None")) is None              # neither True nor False
    assert bench_client.prefix_caching_enabled(_info_page("false")) is False
    assert bench_client.prefix_caching_enabled("# HELP up Up.\n# TYPE up gauge\nup 1.0\n") is None  # not vLLM
    assert bench_client.prefix_caching_enabled(None) is None and bench_client.prefix_caching_enabled("") is None
    assert bench_client.prefix_caching_enabled('vllm:cache_config_info{enable_prefix_caching="True" 1.0\n') is None  # garbled


def test_prefix_caching_over_two_engines():
    assert bench_client.prefix_caching_enabled(_info_page("True", "True")) is True
    assert bench_client.prefix_caching_enabled(_info_page("False", "False")) is False
    # Engines that disagree cannot be summed: any engine that caches makes the side "on" (its timings can hold cache effects).
    assert bench_client.prefix_caching_enabled(_info_page("False", "True")) is True
    assert bench_client.prefix_caching_enabled(_info_page("True", "False")) is True
    # Off on one engine, unknown on the other: not known to be off everywhere.
    assert bench_client.prefix_caching_enabled(_info_page("False", "None")) is None


def test_prefix_cache_counters_over_engines_models_and_names():
    page = ("# TYPE vllm:prefix_cache_queries_total counter\n"
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n'
            'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50.0\n'
            'vllm:prefix_cache_queries_total{engine="0",model_name="other"} 7.0\n'
            "# TYPE vllm:prefix_cache_hits_total counter\n"
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 30.0\n'
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 10.0\n'
            "# TYPE vllm:external_prefix_cache_hits_total counter\n"
            'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 999.0\n'
            "# TYPE vllm:prefix_cache_hits_created gauge\n"
            'vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e+09\n')
    assert bench_client.prefix_cache_counters(page, "m") == {"hits": 40.0, "queries": 150.0}   # engines summed
    assert bench_client.prefix_cache_counters(page) == {"hits": 40.0, "queries": 157.0}        # all models
    old = ('vllm:gpu_prefix_cache_queries_total{model_name="m"} 20.0\nvllm:gpu_prefix_cache_hits_total{model_name="m"} 5.0\n'
           'vllm:gpu_prefix_cache_queries_total{engine="1"} 4.0\n')  # 0.8-0.9 names; a series without model_name counts
    assert bench_client.prefix_cache_counters(old, "m") == {"hits": 5.0, "queries": 24.0}
    assert bench_client.prefix_cache_counters('vllm:prefix_cache_queries_total{engine="0" 12\n') is None  # garbled: unknown


def test_prefix_cache_window_carries_the_later_setting():
    after = _capture("ngram")
    queries = _literal(after, 'vllm:prefix_cache_queries_total{engine="0",model_name="t-ngram"}')
    before = after.replace('prefix_cache_queries_total{engine="0",model_name="t-ngram"} %s' % queries,
                           'prefix_cache_queries_total{engine="0",model_name="t-ngram"} 89.0')
    before = before.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')  # only the later page counts
    window = bench_client.prefix_cache_window(before, after, "t-ngram")
    assert window == {"hits": 0, "queries": int(queries) - 89, "hit_rate": 0.0, "enabled": True}
    off = after.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    assert bench_client.prefix_cache_window(off, off, "t-ngram") == {"hits": 0, "queries": 0, "hit_rate": None, "enabled": False}
    # The setting without the counters (e.g. the first scrape failed): still reported.
    assert bench_client.prefix_cache_window(None, off, "t-ngram") == {"hits": None, "queries": None, "hit_rate": None, "enabled": False}
    assert bench_client.prefix_cache_window(None, None) is None
    assert bench_client.prefix_cache_window("up 1\n", "up 1\n") is None  # not vLLM: nothing known
