"""spec_metrics: /metrics counters, SpecDecoding log lines, per-request metrics, diagnosis.

Every expected number below was read from the capture files with grep (metrics.txt lines 39-61,
startup.log `SpecDecoding metrics:` lines, requests.txt response bodies), not taken from the parser.
"""

import json
import os
import re

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as sm
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import spec_decoding_log as sdl
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

from tests.paths import CAPTURES, read_capture  # noqa: E402  pylint: disable=wrong-import-position

# folder: (model_name, num_drafts, num_draft_tokens, num_accepted_tokens, per-position accepted)  -- from metrics.txt
# (float32 and temperature 0: the three ngram servers run the same workload to the same counters)
METRICS = {
    "ngram": ("t-ngram", 229, 1002, 655, [190, 152, 126, 99, 88]),
    "ngram_eager": ("t-ngram_eager", 229, 1002, 655, [190, 152, 126, 99, 88]),
    "ngram_perreq": ("t-ngram_perreq", 229, 1002, 655, [190, 152, 126, 99, 88]),
    "draft_model": ("t-draft_model", 258, 774, 774, [258, 258, 258]),
    "eagle3": ("t-eagle3", 1026, 3078, 0, [0, 0, 0]),
}
# folder: [(accepted, drafted, printed mean, per-position rates, printed rate %)]  -- from startup.log
LOG_WINDOWS = {
    "baseline": [],
    "ngram": [(103, 206, 3.24, [0.717, 0.652, 0.457, 0.239, 0.174], 50.0),
              (552, 796, 4.02, [0.858, 0.667, 0.574, 0.481, 0.437], 69.3)],
    "ngram_eager": [(135, 264, 3.25, [0.750, 0.633, 0.450, 0.233, 0.183], 51.1),
                    (520, 738, 4.08, [0.858, 0.675, 0.586, 0.503, 0.456], 70.5)],
    "ngram_perreq": [(155, 337, 3.07, [0.720, 0.560, 0.413, 0.213, 0.160], 46.0),
                     (500, 665, 4.25, [0.883, 0.714, 0.617, 0.539, 0.494], 75.2)],
    "draft_model": [(432, 432, 4.00, [1.0, 1.0, 1.0], 100.0), (342, 342, 4.00, [1.0, 1.0, 1.0], 100.0)],
    "eagle3": [(0, 537, 1.00, [0.0, 0.0, 0.0], 0.0), (0, 774, 1.00, [0.0, 0.0, 0.0], 0.0), (0, 714, 1.00, [0.0, 0.0, 0.0], 0.0),
               (0, 741, 1.00, [0.0, 0.0, 0.0], 0.0), (0, 312, 1.00, [0.0, 0.0, 0.0], 0.0)],
}


def read(folder, name):
    return read_capture(folder, name)


# ----------------------------------------------------------------------------------------------------
# Prometheus

@pytest.mark.parametrize("folder", sorted(METRICS))
def test_capture_counters(folder):
    model, drafts, drafted, accepted, per_pos = METRICS[folder]
    counters = sm.parse_prometheus(read(folder, "metrics.txt"))
    assert counters.found is True
    assert (counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens) == (drafts, drafted, accepted)
    assert counters.accepted_per_pos == per_pos
    assert counters.model_names == [model] and counters.engines == ["0"]
    summary = sm.summarize(counters)
    assert summary["has_data"] is True and summary["source"] == "prometheus"
    assert summary["num_drafts"] == drafts and isinstance(summary["num_drafts"], int)
    assert summary["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    assert summary["draft_acceptance_rate"] == pytest.approx(accepted / drafted)
    assert summary["per_position_acceptance_rate"] == pytest.approx([v / drafts for v in per_pos])


def test_capture_ngram_known_values():
    summary = sm.summarize(sm.parse_prometheus(read("ngram", "metrics.txt")), method="ngram")
    assert round(summary["mean_acceptance_length"], 2) == 3.86      # 1 + 655/229
    assert round(summary["draft_acceptance_rate"], 3) == 0.654      # 655/1002
    assert [round(v, 3) for v in summary["per_position_acceptance_rate"]] == [0.830, 0.664, 0.550, 0.432, 0.384]
    assert summary["diagnosis"]["status"] == "healthy"


def test_capture_draft_model_copy_of_the_target_accepts_everything():
    summary = sm.summarize(sm.parse_prometheus(read("draft_model", "metrics.txt")), method="draft_model")
    assert summary["draft_acceptance_rate"] == 1.0 and summary["mean_acceptance_length"] == 4.0      # 1 + 774/258
    assert summary["per_position_acceptance_rate"] == [1.0, 1.0, 1.0]
    assert summary["diagnosis"]["status"] == "healthy"


def test_capture_baseline_has_no_data():
    counters = sm.parse_prometheus(read("baseline", "metrics.txt"))
    assert counters.found is False
    summary = sm.summarize(counters)
    assert summary["has_data"] is False and summary["diagnosis"]["status"] == "no_data"
    assert summary["mean_acceptance_length"] is None and summary["draft_acceptance_rate"] is None
    assert "--disable-log-stats" in summary["msg"]


def test_capture_eagle3_random_head_is_a_mismatch():
    summary = sm.summarize(sm.parse_prometheus(read("eagle3", "metrics.txt")), method="eagle3")
    assert summary["draft_acceptance_rate"] == 0.0 and summary["mean_acceptance_length"] == 1.0
    assert summary["diagnosis"]["status"] == "likely_draft_mismatch"
    assert summary["diagnosis"]["num_draft_tokens"] == 3078


def test_metric_names_file_lists_the_families_the_parser_reads():
    names = read(".", "metric_names_ngram.txt").split("\n")
    spec_counters = sorted(line.split()[0] for line in names if "spec_decode" in line and line.endswith(" counter"))
    assert spec_counters == sorted("vllm:%s_total" % base for base in list(sm.V1_COUNTERS) + [sm.PER_POS])
    # and the created gauges beside them are ignored
    assert sum(1 for line in names if "spec_decode" in line and "_created gauge" in line) == 4


@pytest.mark.parametrize("folder", sorted(METRICS))
def test_model_name_filter(folder):
    model = METRICS[folder][0]
    text = read(folder, "metrics.txt")
    assert sm.parse_prometheus(text, model_name=model).num_draft_tokens == METRICS[folder][2]
    other = sm.parse_prometheus(text, model_name="someone-else")
    assert other.found is False and other.all_model_names == [model]


SYNTH_DP = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 50.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="other"} 7.0
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 150.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 120.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 60.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 20.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
"""


def test_sums_over_engines_and_filters_model():
    counters = sm.parse_prometheus(SYNTH_DP, model_name="m")
    assert (counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens) == (150, 450, 180)
    assert counters.accepted_per_pos == [120, 50, 10]
    assert counters.engines == ["0", "1"]
    assert sm.parse_prometheus(SYNTH_DP).num_drafts == 157      # all models
    summary = sm.summarize(counters)
    assert summary["mean_acceptance_length"] == pytest.approx(2.2)
    assert summary["draft_acceptance_rate"] == pytest.approx(0.4)


def test_delta_between_two_scrapes():
    earlier = sm.parse_prometheus(SYNTH_DP, model_name="m")
    later = sm.parse_prometheus(SYNTH_DP.replace('engine="0",model_name="m"} 100.0', 'engine="0",model_name="m"} 160.0')
                                .replace('engine="0",model_name="m"} 300.0', 'engine="0",model_name="m"} 480.0')
                                .replace('engine="0",model_name="m"} 120.0', 'engine="0",model_name="m"} 210.0'), model_name="m")
    window = later.delta(earlier)
    assert (window.num_drafts, window.num_draft_tokens, window.num_accepted_tokens) == (60, 180, 90)
    assert window.reset is False
    summary = sm.summarize(window)
    assert summary["mean_acceptance_length"] == pytest.approx(2.5)
    assert summary["draft_acceptance_rate"] == pytest.approx(0.5)
    # no traffic between the scrapes
    idle = earlier.delta(earlier)
    assert idle.num_draft_tokens == 0 and sm.summarize(idle)["diagnosis"]["status"] == "no_data"


def test_delta_detects_a_restart():
    later = sm.parse_prometheus(read("ngram", "metrics.txt"))
    earlier = sm.parse_prometheus(read("eagle3", "metrics.txt"))    # higher counters than ngram's
    window = later.delta(earlier)
    assert window.reset is True and window.num_drafts == 229


def test_counters_add_for_pods():
    a = sm.parse_prometheus(read("ngram", "metrics.txt"))
    b = sm.parse_prometheus(read("ngram_eager", "metrics.txt"))
    total = a + b
    assert (total.num_drafts, total.num_draft_tokens, total.num_accepted_tokens) == (458, 2004, 1310)
    assert total.accepted_per_pos == [380, 304, 252, 198, 176]


def test_v0_prometheus_names():
    text = """# TYPE vllm:spec_decode_draft_acceptance_rate gauge
vllm:spec_decode_draft_acceptance_rate{model_name="m"} 0.5
# TYPE vllm:spec_decode_efficiency gauge
vllm:spec_decode_efficiency{model_name="m"} 0.4
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 50.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 100.0
# TYPE vllm:spec_decode_num_emitted_tokens_total counter
vllm:spec_decode_num_emitted_tokens_total{model_name="m"} 80.0
"""
    counters = sm.parse_prometheus(text)
    assert counters.found and counters.num_drafts is None
    assert counters.v0 == {"v0_draft_acceptance_rate": 0.5, "v0_efficiency": 0.4, "v0_num_emitted_tokens": 80.0}
    summary = sm.summarize(counters)
    assert summary["draft_acceptance_rate"] == 0.5 and summary["mean_acceptance_length"] is None


def test_invalid_page_names_the_field():
    with pytest.raises(ValidationError, match="^metrics: "):
        sm.parse_prometheus('vllm:spec_decode_num_drafts_total{engine="0" 12\n')


def test_pre_filter_is_what_the_parser_sees():
    assert sm.filter_spec_lines("a 1\nb 2\n") == ""
    text = read("ngram", "metrics.txt")
    assert sm.filter_spec_lines(text).count("\n") == 32   # lines 37-68 of metrics.txt


# ----------------------------------------------------------------------------------------------------
# Log lines

@pytest.mark.parametrize("folder", sorted(LOG_WINDOWS))
def test_capture_log_windows(folder):
    counters, windows, total = sdl.parse_log_text(read(folder, "startup.log"))
    expected = LOG_WINDOWS[folder]
    assert total == len(expected) == len(windows)
    for window, (acc, dft, mean, rates, pct) in zip(windows, expected):
        assert window["format"] == "v1"
        assert (window["num_accepted_tokens"], window["num_draft_tokens"]) == (acc, dft)
        assert window["printed_mean_acceptance_length"] == mean
        assert window["per_position_acceptance_rate"] == rates
        assert round(100 * window["draft_acceptance_rate"], 1) == pct
        assert window["time"] is not None
    if not expected:
        assert counters.found is False and sm.summarize(counters)["diagnosis"]["status"] == "no_data"


@pytest.mark.parametrize("folder", sorted(METRICS))
def test_log_totals_agree_with_the_metrics_page_of_the_same_run(folder):
    """The log windows of a run add up to the /metrics counters read after it (numbers from metrics.txt)."""
    _model, drafts, drafted, accepted, per_pos = METRICS[folder]
    counters, _windows, _total = sdl.parse_log_file(os.path.join(CAPTURES, folder, "startup.log"))
    assert counters.source == "log" and counters.num_drafts_estimated is True
    assert (counters.num_draft_tokens, counters.num_accepted_tokens) == (drafted, accepted)
    assert counters.num_drafts == drafts
    assert counters.accepted_per_pos == per_pos


def test_log_ngram_weighted_totals():
    summary = sm.summarize(sdl.parse_log_text(read("ngram", "startup.log"))[0], method="ngram")
    # weighted by drafted tokens: (103 + 552) / (206 + 796), not the mean of 50.0% and 69.3%
    assert summary["draft_acceptance_rate"] == pytest.approx(655 / 1002)
    assert summary["mean_acceptance_length"] == pytest.approx(1 + 655 / 229)


SPEC_LINE_032 = ("(APIServer pid=1) INFO 11-29 07:37:05 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 2.42, "
                 "Accepted throughput: 25.70 tokens/s, Drafted throughput: 72.90 tokens/s, Accepted: 257 tokens, Drafted: 729 tokens, "
                 "Per-position acceptance rate: 0.569, 0.320, 0.249, 0.149, 0.133, Avg Draft acceptance rate: 35.3%")


def test_synthetic_085_line_mean_without_bonus():
    # 0.8.5: rate first, mean = accepted/drafts (no +1); 100 drafts of 2 tokens: 90 + 52 accepted
    line = ("INFO 04-29 10:00:10 [metrics.py:85] SpecDecoding metrics: Draft acceptance rate: 71.0%, Mean acceptance length: 1.42, "
            "Accepted: 142 tokens, Drafted: 200 tokens, Per-position acceptance rate: 0.900, 0.520")
    window = sdl.parse_log_line(line)
    assert window["format"] == "v1_legacy"
    assert window["num_drafts"] == 100 and window["accepted_tokens_per_position"] == [90, 52]
    assert window["mean_acceptance_length"] == pytest.approx(2.42)
    assert window["draft_acceptance_rate"] == pytest.approx(0.71)


def test_synthetic_legacy_line_without_per_position():
    line = "SpecDecoding metrics: Draft acceptance rate: 50.0%, Mean acceptance length: 2.00, Accepted: 200 tokens, Drafted: 400 tokens"
    window = sdl.parse_log_line(line)
    assert window["num_drafts"] == 100 and window["mean_acceptance_length"] == pytest.approx(3.0)


@pytest.mark.parametrize("prefix", [
    "(APIServer pid=1) ",                                        # 0.24-0.33
    "\x1b[1;36m(APIServer pid=7)\x1b[0;0m \x1b[32m",            # colour codes
    "2026-05-01 18:27:06.747 | (APIServer pid=1) ",             # collector timestamp
    "",
])
def test_synthetic_prefixes(prefix):
    line = prefix + SPEC_LINE_032[len("(APIServer pid=1) "):]
    window = sdl.parse_log_line(line)
    assert (window["num_accepted_tokens"], window["num_draft_tokens"], window["num_drafts"]) == (257, 729, 181)
    assert window["accepted_tokens_per_position"] == [103, 58, 45, 27, 24]


def test_synthetic_024_033_nan_window():
    line = ("(APIServer pid=1) INFO 02-01 00:00:00 [loggers.py:1] SpecDecoding metrics: Mean acceptance length: nan, Accepted throughput: "
            "0.00 tokens/s, Drafted throughput: 0.00 tokens/s, Accepted: 0 tokens, Drafted: 0 tokens, Per-position acceptance rate: nan, nan, "
            "nan, Avg Draft acceptance rate: nan%")
    window = sdl.parse_log_line(line)
    assert window["num_draft_tokens"] == 0 and window["num_drafts"] == 0 and window["draft_acceptance_rate"] is None
    counters, _w, total = sdl.parse_log_text(line + "\n")
    assert total == 1 and sm.summarize(counters)["has_data"] is False


def test_synthetic_033_draft_model_full_acceptance():
    line = ("(APIServer pid=1) INFO 06-01 00:00:10 [loggers.py:1] SpecDecoding metrics: Mean acceptance length: 4.00, Accepted throughput: "
            "30.00 tokens/s, Drafted throughput: 30.00 tokens/s, Accepted: 300 tokens, Drafted: 300 tokens, Per-position acceptance rate: "
            "1.000, 1.000, 1.000, Avg Draft acceptance rate: 100.0%")
    summary = sm.summarize(sdl.parse_log_text(line)[0], method="draft_model")
    assert summary["num_drafts"] == 100 and summary["draft_acceptance_rate"] == 1.0
    assert summary["diagnosis"]["status"] == "healthy"


def test_synthetic_v0_lines_are_cumulative():
    lines = (
        "INFO 01-01 00:00:05 metrics.py:455] Speculative metrics: Draft acceptance rate: 0.600, System efficiency: 0.500, "
        "Number of speculative tokens: 5, Number of accepted tokens: 300, Number of draft tokens: 500, Number of emitted tokens: 360.\n"
        "INFO 01-01 00:00:10 metrics.py:455] Speculative metrics: Draft acceptance rate: 0.712, System efficiency: 0.546, "
        "Number of speculative tokens: 5, Number of accepted tokens: 712, Number of draft tokens: 1000, Number of emitted tokens: 819.\n"
    )
    counters, windows, total = sdl.parse_log_text(lines)
    assert total == 2 and all(w["format"] == "v0" and w["cumulative"] for w in windows)
    assert (counters.num_accepted_tokens, counters.num_draft_tokens, counters.num_drafts) == (712, 1000, 200)
    summary = sm.summarize(counters)
    assert summary["draft_acceptance_rate"] == pytest.approx(0.712)
    assert summary["mean_acceptance_length"] == pytest.approx(1 + 712 / 200)


def test_windows_are_bounded_but_all_counted():
    text = "\n".join([SPEC_LINE_032] * 50)
    counters, windows, total = sdl.parse_log_text(text, max_windows=10)
    assert total == 50 and len(windows) == 10
    assert counters.num_draft_tokens == 50 * 729


# ----------------------------------------------------------------------------------------------------
# Per-request metrics (ngram_perreq/requests.txt)

def test_per_request_metrics_add_up_to_the_metrics_page():
    text = read("ngram_perreq", "requests.txt")
    bodies = [line for line in text.splitlines() if '"speculative_decoding"' in line]
    assert len(bodies) == 6
    total = sm.SpecDecodeCounters(source="response")
    for body in bodies:
        total = total + sm.counters_from_response(body)
    # equal to ngram_perreq/metrics.txt: drafts 229, draft tokens 1002, accepted 655, per position 190 152 126 99 88
    assert (total.num_drafts, total.num_draft_tokens, total.num_accepted_tokens) == (229, 1002, 655)
    assert total.accepted_per_pos == [190, 152, 126, 99, 88]


def test_per_request_first_response():
    body = re.search(r"^\{\"id\":\"cmpl-a91b4fe27f2c3002\".*$", read("ngram_perreq", "requests.txt"), re.M).group(0)
    summary = sm.summarize(sm.counters_from_response(json.loads(body)))
    # the response's own numbers: mean_acceptance_length 2.942857 (1 + 68/35), draft_acceptance_rate 0.41718 (68 of 163), 35 steps
    assert summary["mean_acceptance_length"] == pytest.approx(1 + 68 / 35)
    assert summary["draft_acceptance_rate"] == pytest.approx(68 / 163)
    assert summary["num_drafts"] == 35
    assert sm.counters_from_response("not json").found is False
    assert sm.counters_from_response({"metrics": None}).found is False


# ----------------------------------------------------------------------------------------------------
# Diagnosis and thresholds

def _counters(drafts, drafted, accepted, per_pos):
    return sm.SpecDecodeCounters(num_drafts=drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted, accepted_per_pos=per_pos, found=True)


def test_diagnosis_collapse_by_slot_two():
    summary = sm.summarize(_counters(100, 300, 65, [60, 4, 1]), method="eagle3")
    assert summary["diagnosis"]["status"] == "unsuitable_workload"
    assert summary["diagnosis"]["collapse_position"] == 2
    assert summary["diagnosis"]["per_position_acceptance_rate"] == pytest.approx([0.6, 0.04, 0.01])


def test_diagnosis_model_free_method_near_zero_is_the_workload():
    assert sm.summarize(_counters(100, 500, 3, [3, 0, 0, 0, 0]), method="ngram")["diagnosis"]["status"] == "unsuitable_workload"
    assert sm.summarize(_counters(100, 500, 3, [3, 0, 0, 0, 0]), method="qwen3_next_mtp")["diagnosis"]["status"] == "likely_draft_mismatch"


def test_diagnosis_unknown_method_near_zero_hedges():
    diag = sm.summarize(_counters(100, 300, 0, [0, 0, 0]))["diagnosis"]
    assert diag["status"] == "likely_draft_mismatch" and diag["reason"].startswith("if the method uses a draft model")


def test_diagnosis_single_slot():
    assert sm.summarize(_counters(100, 100, 8, [8]), method="eagle")["diagnosis"]["status"] == "unsuitable_workload"
    assert sm.summarize(_counters(100, 100, 70, [70]), method="eagle")["diagnosis"]["status"] == "healthy"


def test_thresholds():
    summary = sm.summarize(sm.parse_prometheus(read("ngram", "metrics.txt")))
    assert sm.check_thresholds(summary) == []
    # ngram/metrics.txt: mean acceptance length 1 + 655/229 = 3.8603, rate 655/1002 = 0.65369
    assert sm.check_thresholds(summary, min_mean_acceptance_length=3.86, min_acceptance_rate=0.65) == []
    failures = sm.check_thresholds(summary, min_mean_acceptance_length=3.87, min_acceptance_rate=0.66)
    assert failures == ["mean_acceptance_length 3.860 is below min_mean_acceptance_length 3.87",
                        "draft_acceptance_rate 0.6537 is below min_acceptance_rate 0.66"]
    no_data = sm.summarize(sm.parse_prometheus(read("baseline", "metrics.txt")))
    assert sm.check_thresholds(no_data)[:0] == [] and sm.check_thresholds(no_data) == []
    assert sm.check_thresholds(no_data, min_acceptance_rate=0.1)[0].startswith("thresholds were given but there is no data")
    with pytest.raises(ValidationError, match="^min_acceptance_rate: must be a fraction"):
        sm.check_thresholds(summary, min_acceptance_rate=35)
    with pytest.raises(ValidationError, match="^min_mean_acceptance_length: "):
        sm.check_thresholds(summary, min_mean_acceptance_length=0.5)


@pytest.mark.parametrize("size", [1, 13, 700, 65536])
def test_log_parse_any_chunking(size):
    with open(os.path.join(CAPTURES, "ngram", "startup.log"), "rb") as handle:
        data = handle.read()
    counters, _windows, total = sdl.parse_log([data[i:i + size] for i in range(0, len(data), size)])
    assert total == 2 and (counters.num_draft_tokens, counters.num_accepted_tokens, counters.num_drafts) == (1002, 655, 229)
