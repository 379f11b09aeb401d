"""A load sent from the controller that fell behind its schedule gets no decision, as a load Job's run does (issue 53), and
the client's CPU is its event loop thread's own. Requests go to a real loopback streaming server (tests/loopback_http.py)
through spec_benchmark's own flow (bench/run.py ``benchmark``)."""
from __future__ import annotations

import json
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.loopback_http import OpenAIStream, serving

CONTEXT = {"gpu_model": "L4", "gpu_count": 1, "model": "tiny", "dtype": "float32", "vllm_version": "0.32.0",
           "image": "vllm/vllm-openai:v0.32.0", "baseline_command": "vllm serve /m", "candidate_command": "vllm serve /m --speculative-config {}"}
# how long the slow consumer holds the event loop after each finished request
HOLD_S = 0.2


class Paced(OpenAIStream):
    """/v1/models, and a chat stream of 4 tokens 2 ms apart after 5 ms (each POST counted); /metrics empty."""
    nodelay = True
    posts = []
    burn_s = 0.0

    def do_GET(self):  # pylint: disable=invalid-name
        self.send_payload(200, self.models_payload() if self.path == "/v1/models" else b"")

    def do_POST(self):  # pylint: disable=invalid-name
        self.read_json()
        Paced.posts.append(time.monotonic())
        until = time.thread_time() + self.burn_s
        while time.thread_time() < until:  # the server's own CPU, in a thread of the test's process
            pass
        self.stream_chat(4, 0.005, 0.002)


@pytest.fixture(scope="module")
def url():
    with serving(Paced) as base:
        yield base + "/v1"


def params(tmp_path, url, **over):
    base = {"baseline_url": url, "candidate_url": url, "phase": "both", "baseline_results": None, "baseline_model": None,
            "candidate_model": None, "api": "chat", "workload": "general_chat", "prompts_file": None, "num_prompts": 2,
            "runs_per_prompt": 5, "warmup": 3, "concurrency": 2, "request_rate": 50.0, "arrival": "fixed", "temperature": 0.0,
            "max_tokens": 4, "seed": 0, "extra_body": {}, "bearer_token": None, "headers": {}, "validate_certs": True,
            "ca_path": None, "timeout": 30.0, "scrape_metrics": False, "report_dir": str(tmp_path / "rep"), "report_name": "report",
            "report_context": dict(CONTEXT), "tolerances": {}, "plots": False, "title": None, "progress_file": None,
            "load_from": "controller", "load_job": {}}
    base.update(over)
    return base


def test_a_controller_load_that_kept_up_gets_a_decision(tmp_path, url):
    out = bench_run.benchmark(params(tmp_path, url))
    assert out["decision"] in ("keep", "roll_back")
    with open(out["report_json"], encoding="utf-8") as handle:
        report = json.load(handle)
    for side in ("baseline", "candidate"):
        client = report[side]["client"]
        assert client["sent_from"] == "controller" and client["kept_up"], client
        assert client["send_lag_ms"]["p99"] < 100.0 and report[side]["summary"]["completed"] == 10


def test_a_controller_load_that_fell_behind_gets_no_decision_and_names_the_fix(tmp_path, url, monkeypatch):
    """A slow consumer in the client's event loop (each finished request's progress holds the loop HOLD_S): the releases
    after it go out late, the side's send lag p99 is over the bound and the run is refused before the next side is sent."""
    request = bench_run.Progress.request

    def slow_consumer(self, label, done, total, record):
        request(self, label, done, total, record)
        if "warmup" not in label:
            time.sleep(HOLD_S)  # in the loop's thread: nothing else of the client runs meanwhile

    monkeypatch.setattr(bench_run.Progress, "request", slow_consumer)
    Paced.posts = []
    with pytest.raises(ValidationError) as info:
        bench_run.benchmark(params(tmp_path, url, num_prompts=1))
    error = info.value
    assert error.field == "load_from"
    assert str(error).startswith("load_from: no decision: the load was not measured cleanly, the client fell behind its schedule (baseline: ")
    assert "send lag p99" in str(error) and "candidate" not in str(error)
    assert "benchmark_load_pods" in error.hint and "load_job.pods" in error.hint and "lower concurrency" in error.hint
    assert len(Paced.posts) == 3 + 5  # the baseline's warmup and measured requests; the candidate was never sent
    assert not (tmp_path / "rep" / "report.json").exists()
    with open(tmp_path / "rep" / "report-progress.log", encoding="utf-8") as handle:
        said = [line for line in handle if "baseline client (the controller)" in line]
    assert len(said) == 1 and said[0].rstrip().endswith("did NOT keep up"), said


def test_the_client_cpu_is_its_loop_threads_not_the_processes(url):
    """A server in this process that burns 40 ms of CPU a request: the process's CPU over the run is mostly the server's,
    the client's figure (``measure_side``'s ``client``) is the loop thread's alone."""
    endpoint = bench_client.Endpoint(url, model="tiny")
    prompts = [{"id": "p%d" % i, "messages": [{"role": "user", "content": "prompt %d" % i}]} for i in range(4)]
    Paced.burn_s = 0.04
    try:
        process = time.process_time()
        side = bench_client.measure_side(endpoint, prompts, {"max_tokens": 4, "temperature": 0.0}, runs_per_prompt=2, warmup=0,
                                         concurrency=2)
        process = time.process_time() - process
    finally:
        Paced.burn_s = 0.0
    assert process >= 8 * 0.04 * 0.9  # the server's burn is in this process
    assert side["client"]["cpu_s"] < 0.5 * process, (side["client"], process)
    assert 0.0 < side["client"]["cpu_ratio"] < 0.5
