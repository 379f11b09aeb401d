"""Request classes: the workload's class, the client's per-request block, per-class figures and decisions, the /metrics
cross-check and the report's per-class section."""
import json
import os
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import request_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import workloads as bench_workloads
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.bench_streams import streams
from tests.loopback_http import OpenAIStream, serving
from tests.paths import read_capture
from tests.request_class_records import class_records as _records, spec_decoding_block as _block


# -- the workload ------------------------------------------------------------------------------------------------------------
def test_builtin_workloads_name_their_class():
    assert {p["class"] for p in bench_workloads.builtin_workload("code_refactor")} == {"code"}
    assert {p["class"] for p in bench_workloads.builtin_workload("general_chat")} == {"chat"}


def test_prompts_file_classes():
    text = '{"prompt": "a", "class": "code"}\n"plain"\n{"prompt": "b", "class": null}\n{"messages": [{"role": "user", "content": "m"}], "class": "chat-2"}\n'
    parsed = bench_workloads.parse_prompts_jsonl(text, "f.jsonl")
    assert [p.get("class") for p in parsed] == ["code", None, None, "chat-2"]
    assert bench_workloads.prompt_classes(parsed) == ["chat-2", "code"]
    assert bench_workloads.prompt_classes(bench_workloads.parse_prompts_jsonl('"x"\n', "f")) == []


@pytest.mark.parametrize("value", ['"Code"', '""', "1", '"a b"', '"-x"', '"%s"' % ("a" * 64), '["code"]'])
def test_bad_class_is_refused_naming_the_line_and_the_fix(value):
    text = '"fine"\n{"prompt": "p", "class": %s}\n' % value
    with pytest.raises(ValidationError) as err:
        bench_workloads.parse_prompts_jsonl(text, "f.jsonl")
    assert err.value.field == "prompts_file"
    assert "f.jsonl line 2: class" in str(err.value) and "DNS label" in str(err.value.hint)


# -- the client keeps the class and the per-request block --------------------------------------------------------------------
PERREQ_BODY = json.loads([block.split("\n", 1)[0] for block in read_capture("ngram_perreq", "requests.txt").split("--- RESPONSE:\n")[1:]][0])
BLOCK = PERREQ_BODY["metrics"]["speculative_decoding"]


class UsageWithMetrics(OpenAIStream):
    """Two content chunks, then the usage chunk vLLM 0.32 sends: with metrics.speculative_decoding unless n > 1."""

    def do_POST(self):  # pylint: disable=invalid-name
        body = self.read_json()
        self.start_stream()
        for text in ("a", "b"):
            time.sleep(0.01)
            self.event({"choices": [{"index": 0, "text": text}]})
        if body.get("prompt") == "no usage":  # a server that ignores stream_options.include_usage
            self.end_stream()
            return
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        if body.get("n", 1) == 1:
            usage["metrics"] = {"time_to_first_token_ms": None, "speculative_decoding": BLOCK}
        self.event(usage)
        self.end_stream()


def test_client_keeps_class_and_block_not_for_n_above_one():
    with serving(UsageWithMetrics) as url:
        endpoint = bench_client.Endpoint(url, api="completions", model="m")
        prompt = {"id": "p", "prompt": "x", "messages": [], "class": "code"}
        record, many, bare = streams(endpoint, (prompt, {"max_tokens": 2, "temperature": 0.0}),
                                     (prompt, {"max_tokens": 2, "temperature": 0.0, "extra_body": {"n": 2}}),
                                     (dict(prompt, prompt="no usage"), {"max_tokens": 2, "temperature": 0.0}))
        assert record["success"] and record["request_class"] == "code"
        assert record["spec_decoding"] == {k: BLOCK[k] for k in bench_client.SPEC_DECODING_KEYS}
        assert "per_step_accepted" not in record["spec_decoding"]  # the detailed arrays are not kept
        assert many["success"] and many["spec_decoding"] is None
        assert bare["spec_decoding"] is None and not bare["success"] and "no usage" in bare["error"]
    # neither counts as reported: the class's acceptance is not reported, nothing is estimated
    acc = request_classes.per_request_acceptance([dict(many, request_class="code"), dict(bare, request_class="code")])
    assert acc["reported"] == 0 and acc["mean_acceptance_length"] is None and acc["note"] == request_classes.NOT_REPORTED


# -- per-class statistics and decision ----------------------------------------------------------------------------------------
def _sides(code_block=None, chat_block=None):
    code_block = code_block or _block(20, 60, 40)
    chat_block = chat_block or _block(50, 150, 10)
    baseline = {"records": _records("code", 0.020) + _records("chat", 0.020)}
    candidate = {"records": _records("code", 0.011, block=code_block) + _records("chat", 0.021, block=chat_block)}
    return baseline, candidate


def _acceptance(records):
    sums = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    for r in records:
        sums["num_drafts"] += r["spec_decoding"]["num_spec_steps"]
        sums["num_draft_tokens"] += r["spec_decoding"]["num_draft_tokens"]
        sums["num_accepted_tokens"] += r["spec_decoding"]["num_accepted_draft_tokens"]
    return dict(sums, counter_reset=False)


def test_per_class_decision_and_figures():
    baseline, candidate = _sides()
    block = request_classes.class_report(baseline, candidate, acceptance=_acceptance(candidate["records"]))
    by_class = {e["class"]: e for e in block["classes"]}
    assert list(by_class) == ["chat", "code"]
    code, chat = by_class["code"], by_class["chat"]
    assert code["decision"] == "keep" and code["gain_confidence"] > 0.99
    assert chat["decision"] == "roll_back" and chat["outcome"] == "worse"
    assert block["keep"] == ["code"]
    assert code["requests"] == {"baseline": {"completed": 12, "failed": 0}, "candidate": {"completed": 12, "failed": 0}}
    # the class's output rate is its tokens over its own request time: 60 tokens per request over the summed latencies
    code_time = sum(r["latency"] for r in candidate["records"] if r["request_class"] == "code")
    assert code["output_rate"]["candidate"] == pytest.approx(12 * 60 / code_time)
    assert code["speedup"] == pytest.approx(code["output_rate"]["candidate"] / code["output_rate"]["baseline"])
    assert 1.7 < code["speedup"] < 1.9
    # medians with their distribution-free intervals, around the median
    tpot = code["latency"]["tpot_ms"]
    low, high = tpot["candidate_interval"]
    assert low <= tpot["candidate"] <= high and 10.99 <= low and high <= 11.0 * 1.13
    assert tpot["change"] == pytest.approx(tpot["candidate"] / tpot["baseline"] - 1)
    # per-request acceptance, pooled: 12 requests of 20 steps, 40 accepted of 60 drafted each
    assert code["acceptance"]["reported"] == 12 and code["acceptance"]["note"] is None
    assert code["acceptance"]["mean_acceptance_length"] == pytest.approx(3.0)
    assert code["acceptance"]["acceptance_rate"] == pytest.approx(40 / 60)
    assert chat["acceptance"]["mean_acceptance_length"] == pytest.approx(1.2)
    assert block["counters_check"]["status"] == "equal"
    assert block["counters_check"]["per_request"] == {"num_drafts": 840, "num_draft_tokens": 2520, "num_accepted_tokens": 600}


def test_same_statistics_as_the_service_wide_decision():
    """A run of one class decides exactly as the service-wide keep rule on the same requests."""
    baseline = {"records": _records("code", 0.020)}
    candidate = {"records": _records("code", 0.019)}
    [entry] = request_classes.class_report(baseline, candidate)["classes"]
    whole = bench_report.decide(request_classes.class_summary(baseline["records"]), request_classes.class_summary(candidate["records"]))
    assert (entry["decision"], entry["outcome"], entry["reasons"]) == (whole["decision"], whole["outcome"], whole["reasons"])
    assert [c.get("gain_confidence") for c in entry["checks"]] == [c.get("gain_confidence") for c in whole["checks"]]


def test_acceptance_from_the_real_capture():
    records = [{"success": True, "spec_decoding": {k: BLOCK[k] for k in bench_client.SPEC_DECODING_KEYS}}]
    acc = request_classes.per_request_acceptance(records)
    # the server's own figures for this response (mean acceptance length and draft acceptance rate) agree with the sums
    assert acc["mean_acceptance_length"] == pytest.approx(BLOCK["mean_acceptance_length"], abs=0.005)
    assert acc["acceptance_rate"] == pytest.approx(BLOCK["draft_acceptance_rate"], abs=0.005)
    assert acc["counters"] == {"num_drafts": BLOCK["num_spec_steps"], "num_draft_tokens": BLOCK["num_draft_tokens"],
                               "num_accepted_tokens": BLOCK["num_accepted_draft_tokens"]}


def test_not_reported_is_said_never_guessed():
    baseline = {"records": _records("code", 0.020)}
    candidate = {"records": _records("code", 0.011)}  # no per-request block: an older release, n > 1, or no usage
    block = request_classes.class_report(baseline, candidate, acceptance={"num_drafts": 5, "num_draft_tokens": 15,
                                                                          "num_accepted_tokens": 7, "counter_reset": False})
    [entry] = block["classes"]
    assert entry["acceptance"]["reported"] == 0 and entry["acceptance"]["mean_acceptance_length"] is None
    assert entry["acceptance"]["acceptance_rate"] is None and entry["acceptance"]["note"].startswith("not reported")
    assert block["counters_check"]["status"] == "not_checked" and "12 of 12 requests" in block["counters_check"]["reason"]
    text = "\n".join(request_classes.render_markdown(block))
    assert "| `code` | 12 / 12 | `keep` (keep) |" in text and "| not reported | not reported |" in text
    # some reported, some not: the figures are those of the reporting requests, and the note says how many
    candidate["records"][0]["spec_decoding"] = _block(10, 30, 15)
    acc = request_classes.per_request_acceptance(candidate["records"])
    assert acc["reported"] == 1 and acc["mean_acceptance_length"] == pytest.approx(2.5) and acc["note"].startswith("1 of 12")


def test_counters_check_differs_and_resets():
    _baseline, candidate = _sides()
    sums = _acceptance(candidate["records"])
    check = request_classes.counters_check(candidate["records"], dict(sums, num_accepted_tokens=sums["num_accepted_tokens"] + 3))
    assert check["status"] == "differ" and check["differ"] == ["num_accepted_tokens"]
    assert request_classes.counters_check(candidate["records"], dict(sums, counter_reset=True))["status"] == "not_checked"
    assert request_classes.counters_check(candidate["records"], None)["reason"].startswith("the candidate's /metrics had no")


def test_unclassified_requests_are_their_own_group_last():
    baseline, candidate = _sides()
    baseline["records"] += _records(None, 0.020)
    candidate["records"] += _records(None, 0.020, block=_block(20, 60, 20))
    block = request_classes.class_report(baseline, candidate)
    assert [e["class"] for e in block["classes"]] == ["chat", "code", None]
    assert None not in block["keep"]
    assert "| (unclassified) |" in "\n".join(request_classes.render_markdown(block))


def test_no_class_no_section():
    baseline = {"records": [dict(r, request_class=None) for r in _records(None, 0.02)]}
    assert request_classes.class_report(baseline, {"records": _records(None, 0.01)}) is None
    assert request_classes.class_report({"summary": {}}, {"summary": {}}) is None  # sides without records


def test_report_gets_the_per_class_section():
    baseline, candidate = _sides()
    for side in (baseline, candidate):
        side.update(url="http://x", model="m", api="chat", warmup={}, prefix_cache=None,
                    summary=bench_stats.summarize_run(side["records"], 10.0))
    context = {"hardware": {"gpu_model": "cpu", "gpu_count": 0}, "model": {"id": "m", "dtype": "bf16"},
               "runtime": {"vllm_version": "0.32.0", "image": "i"}, "commands": {"baseline": ["vllm"], "candidate": ["vllm"]},
               "request": {"concurrency": 1, "request_rate": None}}
    report = bench_report.build_report(baseline, candidate, context, acceptance=_acceptance(candidate["records"]))
    assert report["classes"]["keep"] == ["code"]
    json.dumps(report)  # the JSON report carries it
    text = bench_report.render_markdown(report)
    assert "## Per request class" in text and "**equal**" in text
    assert text.index("## Per request class") < text.index("## Notes") if "## Notes" in text else True


def test_report_plot_per_class(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import plots as bench_plots  # pylint: disable=import-outside-toplevel
    baseline, candidate = _sides()
    for side in (baseline, candidate):
        side.update(url="http://x", model="m", api="chat", warmup={}, prefix_cache=None,
                    summary=bench_stats.summarize_run(side["records"], 10.0))
    context = {"hardware": {"gpu_model": "cpu", "gpu_count": 0}, "model": {"id": "m", "dtype": "bf16"},
               "runtime": {"vllm_version": "0.32.0", "image": "i"}, "commands": {"baseline": ["vllm"], "candidate": ["vllm"]},
               "request": {"concurrency": 1, "request_rate": None, "temperature": 0.0, "max_tokens": 64, "sampling": {"seed": 0},
                           "runs_per_prompt": 5}}
    report = bench_report.build_report(baseline, candidate, context, acceptance=_acceptance(candidate["records"]))
    paths = bench_report.write_report(report, str(tmp_path), plots=True, basename="r")
    assert paths["plots"]["classes"] == os.path.join(str(tmp_path), "r-classes.png")
    with Image.open(paths["plots"]["classes"]) as image:
        assert image.size == (800, 450)
        colors = {rgb for _count, rgb in image.convert("RGB").getcolors(maxcolors=800 * 450)}
    for side in ("baseline", "candidate"):
        color = bench_plots.COLORS[side]
        assert tuple(int(color[i:i + 2], 16) for i in (1, 3, 5)) in colors
    with open(paths["markdown"], encoding="utf-8") as handle:
        assert "![Median TPOT per request class](r-classes.png)" in handle.read()
