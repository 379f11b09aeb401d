"""Output of a vLLM newer than the tables: the known part is read exactly as the same output without the additions, and
every addition is listed in not_understood, never a crash, never dropped.

The newer files are tests/fixtures/vllm/newer/ (the real captures plus the edits of its derivation.json). Each test reads
a newer file and the capture it was made from, or that file with the additions taken out again, and compares.
"""

import os
import re

from hypothesis import given, settings, strategies as st

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log as el
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as sm
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood as nu
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import spec_decoding_log as sdl
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as spec_core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_repr
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import engine_config_info

from tests import vllm_newer
from tests.paths import read_capture  # noqa: E402  pylint: disable=wrong-import-position

ADDED_FIELDS = ", parallel_drafting=False, speculator_options={'draft_top_k': 1, 'window': (4, 8)}, adaptive_draft_length=True"
UNKNOWN_FIELD = ", adaptive_draft_length=True"
ADDED_LOG_FIELD = re.compile(r", Per-position draft tokens: [0-9, ]+(?=, Avg)")


def newer(name):
    with open(os.path.join(vllm_newer.NEWER, name), encoding="utf-8") as handle:
        return handle.read()


def capture_lines(folder, needle):
    return [line for line in read_capture(folder, "startup.log").splitlines() if needle in line]


def test_the_newer_files_are_what_the_derivation_makes():
    derived = vllm_newer.derive()
    assert sorted(derived) == ["custom_method.log", "metrics.txt", "startup.log"]
    for name, text in derived.items():
        assert newer(name) == text, "%s differs from its derivation: run python -m tests.vllm_newer" % name


# ---------------------------------------------------------------------------------------------------- engine line

def test_newer_engine_line_reads_the_known_part_as_without_the_unknown_field():
    line = newer("startup.log").splitlines()[0]
    assert UNKNOWN_FIELD in line
    got = el.parse_engine_line(line)
    without = el.parse_engine_line(line.replace(UNKNOWN_FIELD, ""))
    assert without["not_understood"] == []
    assert {k: v for k, v in got.items() if k not in ("line", "not_understood")} == \
        {k: v for k, v in without.items() if k not in ("line", "not_understood")}
    # The fields the 0.34 table knows are kept as printed; method/model/num_spec_tokens are the capture's.
    assert got["speculative_config"] == {"method": "draft_model", "model": "/mnt/models/tiny-draft", "num_spec_tokens": 3,
                                         "parallel_drafting": False, "speculator_options": "{'draft_top_k': 1, 'window': (4, 8)}"}
    real = el.parse_engine_line(capture_lines("draft_model", "Initializing a V1 LLM engine")[0])
    assert {k: got["speculative_config"][k] for k in real["speculative_config"]} == real["speculative_config"]
    assert (got["vllm_version"], real["vllm_version"]) == ("0.35.0", "0.32.0")
    assert got["not_understood"] == [{
        "source": "engine_line", "name": "adaptive_draft_length", "value": "True", "count": 1,
        "reason": "SpeculativeConfig field 'adaptive_draft_length' is not in vLLM 0.34's table (the engine is 0.35.0, "
                  "newer than the newest table)"}]


def test_newer_startup_log_scan_reports_the_last_engine_and_its_unknowns():
    result = el.scan_text(newer("startup.log"))
    assert result["found"] and result["engine_lines_seen"] == 1
    assert [n["name"] for n in result["not_understood"]] == ["adaptive_draft_length"]


def test_unknown_method_is_on_never_off():
    line = newer("custom_method.log").splitlines()[0]
    got = el.parse_engine_line(line)
    real = el.parse_engine_line(capture_lines("eagle3", "Initializing a V1 LLM engine")[0])
    assert got["speculative_config"] == dict(real["speculative_config"], method="my_proposer")
    assert got["not_understood"] == [{
        "source": "engine_line", "name": "my_proposer", "count": 1,
        "reason": "method 'my_proposer' is unknown to the tables (vLLM 0.10 to 0.34): speculative decoding is on with it"}]
    # A rollback's check (expected off) must fail on it; a check for speculative decoding on passes.
    diffs, _notes = el.compare_expected(got["speculative_config"], {"enabled": False})
    assert diffs == ["expected no speculative decoding (speculative_config=None), engine runs "
                     "SpeculativeConfig(method='my_proposer', model='/mnt/models/tiny-eagle3', num_spec_tokens=3)"]
    assert el.compare_expected(got["speculative_config"], {"enabled": True}) == ([], [])


def test_engine_config_after_a_rollback_fails_on_an_unknown_method():
    params = {"name": None, "expected": {"enabled": False}, "log_text": newer("custom_method.log"), "log_path": None}
    result, problem = engine_config_info.engine_config(params)
    assert problem.startswith("the running engine differs from what was requested: expected no speculative decoding")
    assert [n["name"] for n in result["not_understood"]] == ["my_proposer"]
    assert "speculative_config_printed" not in result


def test_engine_line_without_the_speculative_config_field_is_not_taken_for_off():
    line = capture_lines("baseline", "Initializing a V1 LLM engine")[0]
    assert "speculative_config=None, " in line
    cut = line.replace("speculative_config=None, ", "")
    got = el.parse_engine_line(cut)
    assert (got["speculative_config"], got["speculative_config_printed"]) == (None, False)
    assert [n["name"] for n in got["not_understood"]] == ["speculative_config"]
    params = {"name": None, "expected": {"enabled": False}, "log_text": cut + "\n", "log_path": None}
    result, problem = engine_config_info.engine_config(params)
    assert result["differences"] == ["the engine line (vLLM 0.32.0) prints no speculative_config field, so what the engine "
                                     "runs cannot be compared (see not_understood)"]
    assert problem and "prints no speculative_config field" in problem


def test_speculative_config_in_another_form_is_on_and_listed():
    line = capture_lines("eagle3", "Initializing a V1 LLM engine")[0]
    other = line.replace("SpeculativeConfig(method='eagle3', model='/mnt/models/tiny-eagle3', num_spec_tokens=3)",
                         "{'method': 'eagle3', 'num_spec_tokens': 3}")
    got = el.parse_engine_line(other)
    assert got["speculative_config"]["method"] is None and got["speculative_config"]["raw"].startswith("{'method': 'eagle3'")
    assert [n["name"] for n in got["not_understood"]] == ["speculative_config"]
    assert el.compare_expected(got["speculative_config"], {"enabled": False})[0]


def test_field_of_an_older_release_says_which_releases_had_it():
    line = capture_lines("ngram", "Initializing a V1 LLM engine")[0]
    had = spec_core.releases_with("disable_by_batch_size", "key")
    assert had and had[0] == "0.10" and "0.32" not in had
    got = el.parse_engine_line(line.replace("num_spec_tokens=5)", "num_spec_tokens=5, disable_by_batch_size=None)"))
    assert got["speculative_config"] == {"method": "ngram", "model": None, "num_spec_tokens": 5}
    assert got["not_understood"][0]["reason"] == (
        "SpeculativeConfig field 'disable_by_batch_size' is not in vLLM 0.32's table (newest known %s; vLLM 0.10 to %s had it)"
        % (spec_core.NEWEST_TABLE, had[-1]))


def test_unknown_engine_generation_is_listed_and_read():
    line = capture_lines("ngram", "Initializing a V1 LLM engine")[0].replace("a V1 LLM engine", "a V2 LLM engine")
    got = el.parse_engine_line(line)
    assert got["engine"] == "V2" and got["speculative_config"]["method"] == "ngram"
    assert [n["name"] for n in got["not_understood"]] == ["V2"]


_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True).filter(
    lambda n: n not in speculative_repr.READ_FIELDS and not spec_core.releases_with(n, "key"))
_VALUES = st.one_of(st.integers(-5, 10 ** 6).map(str), st.sampled_from(["True", "False", "None", "1.5", "torch.float32"]),
                    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\\'\n\r"), max_size=30).map(repr),
                    st.sampled_from(["Foo(a=1, b='x, y')", "[1, (2, 3)]", "{'k': 'v)'}"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES), min_size=1, max_size=4, unique_by=lambda kv: kv[0]))
def test_any_added_fields_never_change_the_known_part(added):
    line = capture_lines("draft_model", "Initializing a V1 LLM engine")[0]
    extra = "".join(", %s=%s" % kv for kv in added)
    got = el.parse_engine_line(line.replace("num_spec_tokens=3)", "num_spec_tokens=3%s)" % extra))
    assert got["speculative_config"] == {"method": "draft_model", "model": "/mnt/models/tiny-draft", "num_spec_tokens": 3}
    assert [n["name"] for n in got["not_understood"]] == [name for name, _value in added]


# ---------------------------------------------------------------------------------------------------- SpecDecoding lines

def test_newer_spec_decoding_windows_read_as_the_captured_ones():
    lines = [line for line in newer("startup.log").splitlines() if "SpecDecoding metrics:" in line]
    real = capture_lines("draft_model", "SpecDecoding metrics:")[:2]
    assert [ADDED_LOG_FIELD.sub("", line) for line in lines] == real
    assert [sdl.parse_log_line(line) for line in lines] == [sdl.parse_log_line(line) for line in real]
    counters, windows, total = sdl.parse_log_text(newer("startup.log"))
    real_counters, real_windows, _total = sdl.parse_log_text("\n".join(real) + "\n")
    assert (counters.to_dict(), windows, total) == (real_counters.to_dict(), real_windows, 2)
    listed = []
    sdl.parse_log_text(newer("startup.log"), not_understood=listed)
    assert listed == [{
        "source": "spec_decoding_line", "name": "Per-position draft tokens", "value": "144, 144, 144", "count": 2,
        "reason": "SpecDecoding metrics field 'Per-position draft tokens' unknown (vLLM 0.8.5 to 0.34 do not print it): not read"}]


def test_renamed_counts_drop_the_window_and_say_so():
    line = capture_lines("draft_model", "SpecDecoding metrics:")[0].replace("Accepted: 432 tokens", "Accepted tokens: 432")
    listed = []
    counters, windows, total = sdl.parse_log_text(line + "\n", not_understood=listed)
    assert (counters.found, windows, total) == (False, [], 0)
    assert [(n["name"], n["reason"].split(":")[0]) for n in listed] == [
        ("Accepted tokens", "SpecDecoding metrics field 'Accepted tokens' unknown (vLLM 0.8.5 to 0.34 do not print it)"),
        ("SpecDecoding metrics", "a line without 'Accepted")]


def test_known_field_in_another_form_is_listed_and_the_rest_read():
    real = capture_lines("ngram", "SpecDecoding metrics:")[0]
    changed = re.sub(r"Mean acceptance length: [0-9.]+", "Mean acceptance length: n/a", real)
    listed = []
    window = sdl.parse_log_line(changed, listed)
    expected = sdl.parse_log_line(real)
    assert window == dict(expected, printed_mean_acceptance_length=None)
    assert [(n["name"], n["value"]) for n in listed] == [("Mean acceptance length", "n/a")]


def test_other_forms_of_the_line_are_listed():
    listed = []
    assert sdl.parse_log_line("INFO 12-01 13:47:42 [metrics.py:120] SpecDecoding metrics (engine 0): Accepted: 1 tokens", listed) is None
    assert sdl.parse_log_line("INFO Speculative metrics: acceptance 0.5", listed) is None
    assert [n["name"] for n in listed] == ["SpecDecoding metrics (engine 0)", "Speculative metrics"]


# ---------------------------------------------------------------------------------------------------- /metrics

def test_newer_metrics_page_reads_as_the_captured_one():
    listed = []
    got = sm.parse_prometheus(newer("metrics.txt"), not_understood=listed)
    real = sm.parse_prometheus(read_capture("ngram", "metrics.txt"))
    assert got.to_dict() == real.to_dict()
    assert (got.num_drafts, got.num_draft_tokens, got.num_accepted_tokens) == (229, 1002, 655)
    assert listed == [{
        "source": "metrics", "name": "vllm:spec_decode_num_draft_tokens_per_pos_total", "count": 5,
        "reason": "metric vllm:spec_decode_num_draft_tokens_per_pos_total unknown (not exposed by vLLM 0.10 to 0.34): not read"}]


PAGE = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m",method="ngram"} 10.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m",method="eagle3"} 5.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="bonus"} 9.0
# TYPE vllm:spec_decode_acceptance_length histogram
vllm:spec_decode_acceptance_length_bucket{engine="0",model_name="m",le="1.0"} 1.0
vllm:spec_decode_acceptance_length_bucket{engine="0",model_name="m",le="+Inf"} 3.0
vllm:spec_decode_acceptance_length_count{engine="0",model_name="m"} 3.0
vllm:spec_decode_acceptance_length_sum{engine="0",model_name="m"} 5.0
"""


def test_unknown_labels_histograms_and_positions_are_listed_and_the_rest_summed():
    listed = []
    got = sm.parse_prometheus(PAGE, not_understood=listed)
    assert (got.num_drafts, got.accepted_per_pos) == (15, [4])
    assert [(n["name"], n["count"]) for n in listed] == [("method", 2), ("position", 1), ("vllm:spec_decode_acceptance_length", 4)]
    assert listed[0]["reason"] == "label method on vllm:spec_decode_num_drafts_total unknown: the series were summed over it"


def test_the_warning_is_one_short_line_naming_what():
    items = []
    nu.add(items, [nu.item(nu.METRICS, "vllm:spec_decode_x_total", "r")], pod="p1")
    nu.add(items, [nu.item(nu.METRICS, "vllm:spec_decode_x_total", "r")], pod="p1")
    nu.add(items, [nu.item(nu.METRICS, "vllm:spec_decode_x_total", "r")], pod="p2")
    nu.add(items, [nu.item(nu.ENGINE_LINE, "f%d" % i, "r") for i in range(5)])
    assert [(i["name"], i.get("pod"), i["count"]) for i in items[:2]] == [("vllm:spec_decode_x_total", "p1", 2),
                                                                          ("vllm:spec_decode_x_total", "p2", 1)]
    text = nu.warning(items)
    assert "\n" not in text and len(text) < 300
    assert "/metrics vllm:spec_decode_x_total, engine line f0, engine line f1, engine line f2 and 2 more" in text
    assert nu.warning([]) is None
