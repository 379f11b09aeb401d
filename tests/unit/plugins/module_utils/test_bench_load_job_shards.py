"""The load Job scaled out (issue 53): shards of one seeded schedule, their results merged with the same statistics, the
send lag against the schedule, the refusal of a decision the client could not measure cleanly, and every report (a load
sent from the controller too) saying whether its client kept up. Requests go to a real
loopback streaming server (tests/loopback_http.py); each "pod" is load_job_pod.measure run in this process, as the pod runs it."""
from __future__ import annotations

import asyncio
import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job_merge
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job_pod
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.loopback_http import OpenAIStream, serving

PROMPTS = [{"id": "p%d" % i, "messages": [{"role": "user", "content": "prompt %d" % i}]} for i in range(4)]
PARAMS = {"max_tokens": 8, "temperature": 0.0, "seed": 0, "extra_body": {}}


class Paced(OpenAIStream):
    """/v1/models, and a chat stream of 4 tokens 2 ms apart after 5 ms; /metrics empty."""
    nodelay = True

    def do_GET(self):  # pylint: disable=invalid-name
        self.send_payload(200, self.models_payload() if self.path == "/v1/models" else b"")

    def do_POST(self):  # pylint: disable=invalid-name
        self.read_json()
        self.stream_chat(4, 0.005, 0.002)


@pytest.fixture(scope="module")
def url():
    with serving(Paced) as base:
        yield base + "/v1"


def _request(url, pods, concurrency=4, rate=40.0, runs=3, warmup=1):
    return {"scrape_only": False, "api": "chat", "timeout": 30, "validate_certs": True, "ca_path": None, "scrape_metrics": False,
            "metric_prefixes": [], "prompts": PROMPTS, "params": PARAMS, "pods": pods,
            "protocol": {"warmup": warmup, "runs_per_prompt": runs, "concurrency": concurrency, "request_rate": rate,
                         "arrival": "poisson", "seed": 3},
            "sides": [{"name": "candidate", "url": url, "model": None, "field": "candidate_url"}]}


def test_shards_partition_the_schedule_at_its_offsets(url):
    request = _request(url, pods=3)
    results = [load_job_pod.measure(request, index=i) for i in range(3)]
    everyone = bench_client.schedule(PROMPTS, 3)
    offsets = bench_client.arrival_offsets(len(everyone), 40.0, "poisson", 3)
    seen = []
    for index, result in enumerate(results):
        records = result["sides"]["candidate"]["records"]
        assert [r["schedule_index"] for r in records] == list(range(len(everyone)))[index::3]
        for record in records:
            assert record["prompt_id"] == everyone[record["schedule_index"]]["id"]
            # sent no earlier than its place in the whole schedule (the pod's own clock)
            assert record["start_offset"] >= offsets[record["schedule_index"]] - 1e-6
        seen += [r["schedule_index"] for r in records]
    assert sorted(seen) == list(range(len(everyone)))  # every request exactly once
    # the concurrency is shared out: 4 threads over 3 pods -> 2, 1, 1
    assert [load_job_pod.shard_concurrency(4, i, 3) for i in range(3)] == [2, 1, 1]
    merged = load_job_merge.merge_results(results)["sides"]["candidate"]
    assert [r["schedule_index"] for r in merged["records"]] == list(range(len(everyone)))
    assert merged["warmup"]["requests"] == 3 and len(merged["clients"]) == 3
    assert bench_stats.summarize_run(merged["records"], merged["duration_s"])["completed"] == len(everyone)


def test_merged_figures_equal_the_single_run_figures_on_the_same_data(url):
    single = load_job_pod.measure(_request(url, pods=1), index=0)["sides"]["candidate"]
    records, duration = single["records"], single["duration_s"]
    # the same records as two pods that started together would have sent them: shard i holds i, i + 2, ...
    parts = []
    for index in range(2):
        mine = [dict(r, schedule_index=i) for i, r in enumerate(records) if i % 2 == index]
        own_end = max(r["start_offset"] + r["latency"] for r in mine)
        parts.append(dict(single, records=mine, duration_s=duration if own_end == max(r["start_offset"] + r["latency"] for r in records)
                          else own_end, epoch=single["epoch"]))
    merged = load_job_merge.merge_side(parts)
    assert merged["duration_s"] == pytest.approx(duration, abs=1e-9)
    want = bench_stats.summarize_run(records, duration)
    got = bench_stats.summarize_run(merged["records"], merged["duration_s"])
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    # pods that started 0.5 s apart: the later one's requests move 0.5 s on the common clock, the skew is said
    late = [parts[0], dict(parts[1], epoch=parts[1]["epoch"] + 0.5)]
    shifted = load_job_merge.merge_side(late)
    assert shifted["start_skew_s"] == 0.5
    assert shifted["records"][1]["start_offset"] == pytest.approx(records[1]["start_offset"] + 0.5)


class SlowStart(bench_client.Endpoint):
    """A client that needs 150 ms of its own before each connection is up (a TLS handshake on a starved CPU, say)."""

    async def stream_connection(self):
        await asyncio.sleep(0.15)
        return await super().stream_connection()


def test_send_lag_is_the_clients_lateness_not_the_concurrency_wait(url):
    prompts = PROMPTS * 2
    # one thread, all released at 0: seven of eight wait for the thread, which is the protocol, not lag
    fast = bench_client.Endpoint(url, model="tiny")
    records, _duration = bench_client.run_requests(fast, prompts, PARAMS, concurrency=1)
    lags = [r["send_lag"] for r in records]
    assert max(lags) < 0.05, lags
    assert records[-1]["start_offset"] > 0.05  # the last one did wait for the thread
    # each of 4 workers opens its connection late: those first requests are 150 ms behind the schedule
    slow = SlowStart(url, model="tiny")
    records, _duration = bench_client.run_requests(slow, prompts[:4], PARAMS, concurrency=4)
    assert all(0.14 < r["send_lag"] < 1.0 for r in records), [r["send_lag"] for r in records]
    summary = load_job_merge.client_summary({"records": records, "client": {"cpu_ratio": 0.1}}, 100.0, 0.9)
    assert summary["send_lag_ms"]["p99"] > 140 and not summary["kept_up"]


def test_a_client_that_fell_behind_gets_no_decision_and_is_told_to_use_more_pods():
    behind = {"records": [{"send_lag": 0.001}] * 98 + [{"send_lag": 0.3}] * 2, "clients": [{"cpu_ratio": 0.4}, {"cpu_ratio": 0.95}]}
    fine = {"records": [{"send_lag": 0.001}] * 100, "client": {"cpu_ratio": 0.3}}

    class Lines:
        def __init__(self):
            self.lines = []

        def line(self, text):
            self.lines.append(text)

    progress = Lines()
    assert load_job.kept_up({"baseline": dict(fine)}, 1, progress)["baseline"]["kept_up"]
    assert "kept up" in progress.lines[-1] and "p99 1.0 ms" in progress.lines[-1]
    with pytest.raises(ValidationError) as info:
        load_job.kept_up({"baseline": dict(fine), "candidate": dict(behind)}, 2, progress)
    error = info.value
    assert error.field == "load_job.pods" and "load_job.pods to 4" in error.hint
    assert "candidate" in str(error) and "baseline" not in str(error).split("(", 1)[1]
    assert "send lag p99" in str(error) and "0.95 of a CPU" in str(error)
    assert "did NOT keep up" in progress.lines[-1]


def test_indexed_job_and_pod_count_checks():
    options = dict({k: v.get("default") for k, v in load_job.options_spec().items()}, namespace="ns", image="python:3", pods=2)
    _cm, _secret, job = load_job.manifests("spec-decoding-load-x", options, {"sides": []}, code=b"")
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 2, 2)
    _cm, _secret, one = load_job.manifests("spec-decoding-load-x", dict(options, pods=1), {"sides": []}, code=b"")
    assert "completionMode" not in one["spec"] and "completions" not in one["spec"]  # one pod: the Job as before
    with pytest.raises(ValidationError) as info:
        load_job.check_pods(options, concurrency=1, requests=20)
    assert info.value.field == "load_job.pods" and "at most 1 pods" in info.value.hint
    load_job.check_pods(options, concurrency=2, requests=2)
    with pytest.raises(ValidationError):
        load_job.check_options(dict(options, pods=0))


def test_a_pod_of_a_job_that_is_not_indexed_refuses_to_guess_its_shard(url):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError  # pylint: disable=import-outside-toplevel
    with pytest.raises(SpecDecodingError) as info:
        load_job_pod.measure(_request(url, pods=2), index=None)
    assert info.value.field == "load_job.pods" and "JOB_COMPLETION_INDEX" in str(info.value)


class _Lines:
    def __init__(self):
        self.lines = []

    def line(self, text):
        self.lines.append(text)

    def request(self, label, done, total, record):
        self.lines.append(bench_client.request_line(label, done, total, record))


def test_a_load_sent_from_the_controller_says_whether_its_client_kept_up(url):
    """Not only the load Job's pods: a side measured from the controller carries its client figures too, and says them."""
    params = {"warmup": 1, "runs_per_prompt": 2, "concurrency": 2, "request_rate": 40.0, "arrival": "poisson", "seed": 1,
              "scrape_metrics": False}
    progress = _Lines()
    side = bench_run.measure("baseline", bench_client.Endpoint(url, model="tiny"), PROMPTS, params, {"params": PARAMS}, progress)
    client = side["client"]
    assert client["sent_from"] == "controller" and client["pods"] == 1 and client["kept_up"], client
    assert client["send_lag_ms"]["p99"] is not None and client["send_lag_ms"]["p50"] <= client["send_lag_ms"]["p99"] < 100.0
    # the CPU of the measured requests over their wall time: the client's event loop thread's (not the fake server's threads)
    assert client["cpu_ratio_max"] is not None and 0.0 < client["cpu_ratio_max"] < 2.0
    said = [line for line in progress.lines if "baseline client (the controller)" in line]
    assert len(said) == 1 and said[0].endswith(": kept up") and "pods started" not in said[0], progress.lines


def test_every_report_says_whether_each_client_kept_up():
    """The A/B report's "Load client" section and its note: the figures of both sides, the one that fell behind named with the
    fix (a load Job's run that fell behind gets no decision at all: the refusal test above)."""
    fine = load_job.client_summary({"records": [{"send_lag": 0.002}] * 50, "clients": [{"cpu_ratio": 0.3}, {"cpu_ratio": 0.25}]})
    fine["sent_from"] = "load_job"
    behind = dict(load_job.client_summary({"records": [{"send_lag": 0.25}] * 50, "client": {"cpu_ratio": 0.97}}), sent_from="controller")
    assert fine["kept_up"] and not behind["kept_up"]
    summary = bench_stats.summarize_run([{"success": True, "ttft": 0.05, "itl": [0.01] * 9, "latency": 0.14, "output_tokens": 10,
                                          "prompt_tokens": 5}] * 4, 1.0)
    base = {"url": "http://b", "model": "m", "api": "chat", "warmup": {"requests": 1, "failed": 0}, "summary": summary,
            "prefix_cache": None, "client": fine}
    cand = dict(base, url="http://c", client=behind)
    request = {"api": "chat", "workload": "w", "num_prompts": 4, "temperature": 0.0, "max_tokens": 10, "seed": 0, "concurrency": 2,
               "request_rate": None, "arrival": None, "runs_per_prompt": 1, "warmup_requests": 1, "sampling": {"seed": 0}}
    context = bench_report.build_context({"gpu_model": "cpu", "gpu_count": 0, "model": "m", "dtype": "float32", "vllm_version": "0.32.0",
                                          "image": "i", "baseline_command": ["vllm", "serve"], "candidate_command": ["vllm", "serve"]},
                                         request)
    report = bench_report.build_report(base, cand, context)
    assert report["baseline"]["client"] == fine and report["candidate"]["client"] == behind  # the JSON report keeps both
    notes = [n for n in report["notes"] if "keep up" in n]
    assert len(notes) == 1 and notes[0].startswith("the candidate's client (the controller) did not keep up with its schedule (")
    assert "send lag p99 250.0 ms" in notes[0] and "0.97 of a CPU" in notes[0] and "load_job.pods" in notes[0]
    markdown = bench_report.render_markdown(report)
    section = markdown.split("## Load client", 1)[1].split("\n## ", 1)[0]
    assert "| baseline | load Job, 2 pods | 2.0 / 2.0 / 2.0 | 0.30 | yes |" in section, section
    assert "| candidate | the controller | 250.0 / 250.0 / 250.0 | 0.97 | **no** |" in section, section
    # a saved baseline from before the figures: no row for it, no note
    older = bench_report.build_report(dict(base, client=None), dict(cand, client=fine), context)
    assert not [n for n in older["notes"] if "keep up" in n]
    assert "| baseline |" not in bench_report.render_markdown(older).split("## Load client", 1)[1].split("\n## ", 1)[0]
