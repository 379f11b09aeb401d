"""engine_log: the engine-config line and the speculative warnings, checked against the real captures.

Expected values were read from the files by hand (grep), not produced by the parser:
every capture's startup.log has exactly one line with `Initializing a V1 LLM engine (v0.32.0)`.
"""

import os
import re

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log as el
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

from tests.paths import CAPTURES, capture_path  # noqa: E402  pylint: disable=wrong-import-position

NGRAM = {"method": "ngram", "model": None, "num_spec_tokens": 5}
EAGLE3 = {"method": "eagle3", "model": "/mnt/models/tiny-eagle3", "num_spec_tokens": 3}
DRAFT = {"method": "draft_model", "model": "/mnt/models/tiny-draft", "num_spec_tokens": 3}
# folder: (speculative_config, {warning kind: count of lines}, engine line number (1-based) in startup.log)
EXPECTED = {
    "baseline": (None, {}, 24),
    "ngram": (NGRAM, {"async_scheduling_disabled": 1, "min_p_logit_bias": 1}, 23),
    "ngram_eager": (NGRAM, {"async_scheduling_disabled": 1, "min_p_logit_bias": 1}, 26),
    "ngram_perreq": (NGRAM, {"async_scheduling_disabled": 1, "min_p_logit_bias": 1}, 23),
    "draft_model": (DRAFT, {"min_p_logit_bias": 1}, 27),
    "eagle3": (EAGLE3, {"min_p_logit_bias": 1}, 27),
}


def capture(folder, name):
    return capture_path(folder, name)


def test_every_capture_folder_is_covered():
    # newer/ is derived from these captures (a vLLM newer than the tables), tested in test_vllm_newer.py.
    folders = sorted(d for d in os.listdir(CAPTURES) if os.path.isdir(os.path.join(CAPTURES, d)) and d != "newer")
    assert folders == sorted(EXPECTED)


@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_capture_engine_line(folder):
    spec, _warnings, line_no = EXPECTED[folder]
    result = el.scan_file(capture(folder, "startup.log"))
    assert result["found"] is True
    assert result["engine"] == "V1"
    assert result["vllm_version"] == "0.32.0"
    assert result["speculative_config"] == spec
    assert result["engine_lines_seen"] == 1
    with open(capture(folder, "startup.log"), encoding="utf-8") as handle:
        raw_line = handle.read().splitlines()[line_no - 1]
    assert result["line"] == raw_line
    assert result["line"].startswith("(EngineCore pid=")


@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_capture_version_matches_version_txt(folder):
    with open(capture(folder, "version.txt"), encoding="utf-8") as handle:
        server_version = re.search(r'\{"version":"([^"]+)"\}', handle.read()).group(1)
    assert server_version == "0.32.0"
    assert el.scan_file(capture(folder, "startup.log"))["vllm_version"] == server_version


@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_capture_warnings(folder):
    _spec, warnings, _line = EXPECTED[folder]
    result = el.scan_file(capture(folder, "startup.log"))
    kinds = {}
    for warning in result["log_warnings"]:
        if warning["kind"] != "speculative_other":
            kinds[warning["kind"]] = kinds.get(warning["kind"], 0) + warning["count"]
    assert kinds == warnings
    messages = [w["message"] for w in result["log_warnings"]]
    if "async_scheduling_disabled" in warnings:
        assert "Async scheduling not supported with ngram-based speculative decoding and will be disabled." in messages
    if "min_p_logit_bias" in warnings:
        assert "min_p and logit_bias parameters won't work with speculative decoding." in messages


def test_capture_eagle3_draft_config_is_the_draft_the_engine_runs():
    # draft_config.json is the config of the head at /mnt/models/tiny-eagle3 (README): an EAGLE-3 architecture.
    import json
    with open(capture("eagle3", "draft_config.json"), encoding="utf-8") as handle:
        draft = json.load(handle)
    assert draft["architectures"] == ["LlamaForCausalLMEagle3"]
    spec = el.scan_file(capture("eagle3", "startup.log"))["speculative_config"]
    assert spec["method"] == "eagle3" and spec["model"].endswith("eagle3")


def test_warnings_seen_file_is_classified():
    """Every distinct warning format of the recorded runs (warnings_seen.txt) lands in the right kind."""
    with open(capture_path(".", "warnings_seen.txt"), encoding="utf-8") as handle:
        lines = [line for line in handle.read().splitlines() if line.strip()]
    # The suffix method needs arctic-inference (not installable here), so no recording has its form of the async warning:
    # this is vLLM 0.32's line for it (vllm/config/vllm.py, seen on a machine where suffix ran).
    lines.append("      1 WARNING [vllm.py:1605] Async scheduling not supported with suffix-based speculative decoding and will be disabled.")
    kinds = {}
    for line in lines:
        found = el.classify_warning(line)
        kind = found[0] if found else None
        kinds.setdefault(kind, []).append(line)
    assert len(kinds["async_scheduling_disabled"]) == 2     # ngram-based and suffix-based
    assert any("ngram-based" in line for line in kinds["async_scheduling_disabled"])
    assert any("suffix-based" in line for line in kinds["async_scheduling_disabled"])
    assert len(kinds["min_p_logit_bias"]) == 1
    # speculative but not one of the named kinds: max_num_scheduled_tokens and the CPU OpenMP advice
    assert len(kinds["speculative_other"]) == 2
    assert "method_deprecated" not in kinds
    # Unrelated warnings (Triton, ulimit, shutdown...) are not reported.
    assert any("Triton is not installed" in line for line in kinds[None])
    assert all("peculative" not in line for line in kinds[None])


# ----------------------------------------------------------------------------------------------------
# Synthetic variants from facts.md section 1

CONFIG_TAIL = ", tokenizer='/mnt/models/target', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None"


@pytest.mark.parametrize("line,engine,version,spec", [
    # 0.8.5 V0 engine
    ("INFO 04-29 10:00:00 [llm_engine.py:240] Initializing a V0 LLM engine (v0.8.5) with config: model='/mnt/models/target', "
     "speculative_config=SpeculativeConfig(method='eagle', model='/mnt/models/eagle-llama', num_spec_tokens=3)" + CONFIG_TAIL,
     "V0", "0.8.5", {"method": "eagle", "model": "/mnt/models/eagle-llama", "num_spec_tokens": 3}),
    # 0.8.5 V1 engine, no process prefix
    ("INFO 04-29 10:00:00 [core.py:58] Initializing a V1 LLM engine (v0.8.5) with config: model='/m', "
     "speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=4)" + CONFIG_TAIL,
     "V1", "0.8.5", {"method": "ngram", "model": None, "num_spec_tokens": 4}),
    # 0.24 with DP rank prefix, custom_class has model=None
    ("(EngineCore_DP0 pid=812) INFO 02-11 12:00:01 [core.py:95] Initializing a V1 LLM engine (v0.24.1) with config: model='/m', "
     "speculative_config=SpeculativeConfig(method='suffix', model=None, num_spec_tokens=24)" + CONFIG_TAIL,
     "V1", "0.24.1", {"method": "suffix", "model": None, "num_spec_tokens": 24}),
    # 0.33 mtp, colour codes around the prefix and level
    ("\x1b[1;36m(EngineCore pid=77)\x1b[0;0m \x1b[32mINFO\x1b[0m 05-14 08:20:30 [core.py:133] Initializing a V1 LLM engine (v0.33.0) "
     "with config: model='/mnt/models/q', speculative_config=SpeculativeConfig(method='mtp', model='/mnt/models/q', num_spec_tokens=2)"
     + CONFIG_TAIL, "V1", "0.33.0", {"method": "mtp", "model": "/mnt/models/q", "num_spec_tokens": 2}),
    # a collector timestamp in front, a repr without model
    ("2026-05-01 18:26:59.783 | (EngineCore pid=1) INFO 05-01 16:27:00 [core.py:133] Initializing a V1 LLM engine (v0.33.0) with config: "
     "model='/m', speculative_config=SpeculativeConfig(method='mtp', num_spec_tokens=1)" + CONFIG_TAIL,
     "V1", "0.33.0", {"method": "mtp", "model": None, "num_spec_tokens": 1}),
    # pre-0.8: "an LLM engine", ngram printed as draft_model='[ngram]'
    ("INFO 10-01 00:00:00 llm_engine.py:237] Initializing an LLM engine (v0.6.3) with config: model='/m', "
     "speculative_config=SpeculativeConfig(draft_model='[ngram]', num_spec_tokens=5)" + CONFIG_TAIL,
     "V0", "0.6.3", {"method": "ngram", "model": None, "num_spec_tokens": 5}),
    # a path with a comma and parentheses inside the quotes
    ("(EngineCore pid=3) INFO 01-01 00:00:00 [core.py:1] Initializing a V1 LLM engine (v0.32.0) with config: model='/m', "
     "speculative_config=SpeculativeConfig(method='draft_model', model='/mnt/d (copy), v2/', num_spec_tokens=3)" + CONFIG_TAIL,
     "V1", "0.32.0", {"method": "draft_model", "model": "/mnt/d (copy), v2", "num_spec_tokens": 3}),
    # baseline with CRLF
    ("(EngineCore pid=3) INFO 01-01 00:00:00 [core.py:1] Initializing a V1 LLM engine (v0.24.0) with config: model='/m', "
     "speculative_config=None" + CONFIG_TAIL + "\r", "V1", "0.24.0", None),
])
def test_synthetic_engine_lines(line, engine, version, spec):
    text = "(APIServer pid=1) INFO starting\n" + line + "\n(APIServer pid=1) INFO done\n"
    result = el.scan_text(text)
    assert result["found"] is True
    assert (result["engine"], result["vllm_version"], result["speculative_config"]) == (engine, version, spec)
    assert "\x1b" not in result["line"]


def test_last_engine_start_wins_and_all_are_counted():
    first = "(EngineCore pid=1) INFO x [core.py:1] Initializing a V1 LLM engine (v0.32.0) with config: model='/m', speculative_config=None, a=1\n"
    second = first.replace("speculative_config=None", "speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=2)")
    result = el.scan_text(first + "noise\n" * 10 + second)
    assert result["engine_lines_seen"] == 2
    assert result["speculative_config"] == {"method": "ngram", "model": None, "num_spec_tokens": 2}
    assert result["configs_seen"] == [None, {"method": "ngram", "model": None, "num_spec_tokens": 2}]


def test_not_found_and_empty():
    assert el.scan_text("")["found"] is False
    result = el.scan_text("(APIServer pid=1) INFO 11-29 07:38:32 [api_server.py:1] vLLM API server version 0.32.0\n")
    assert result["found"] is False and result["speculative_config"] is None and result["line"] is None


def test_method_deprecated_warning():
    line = "(APIServer pid=1) WARNING 05-14 08:20:20 [speculative.py:456] method `qwen3_next_mtp` is deprecated and replaced with mtp.\n"
    result = el.scan_text(line)
    assert result["log_warnings"] == [{"kind": "method_deprecated", "level": "WARNING", "count": 1,
                                       "message": "method `qwen3_next_mtp` is deprecated and replaced with mtp."}]


def test_033_async_warning_form():
    line = ("(APIServer pid=1) WARNING 06-01 00:00:00 [vllm.py:1] Async scheduling is disabled because the V1 model runner "
            "does not support it with ngram-based speculative decoding.\n")
    assert el.scan_text(line)["log_warnings"][0]["kind"] == "async_scheduling_disabled"


def test_info_lines_mentioning_speculation_are_not_warnings():
    text = "(APIServer pid=1) INFO 01-01 00:00:00 [x.py:1] Loading speculative decoding draft model\n"
    assert el.scan_text(text)["log_warnings"] == []


def test_warnings_are_bounded():
    text = "".join("(APIServer pid=1) WARNING 01-01 00:00:00 [x.py:1] speculative thing %d\n" % i for i in range(200))
    scanner = el.EngineLogScanner(max_warnings=10)
    scanner.feed(text)
    result = scanner.result()
    assert len(result["log_warnings"]) == 10 and scanner.warnings_dropped == 190


# ----------------------------------------------------------------------------------------------------
# Streaming: chunk boundaries, bounded memory

with open(capture("eagle3", "startup.log"), "rb") as _fh:
    EAGLE3_BYTES = _fh.read()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=4096), min_size=1, max_size=40))
def test_any_chunking_gives_the_same_answer(sizes):
    chunks, pos, i = [], 0, 0
    while pos < len(EAGLE3_BYTES):
        size = sizes[i % len(sizes)]
        chunks.append(EAGLE3_BYTES[pos:pos + size])
        pos += size
        i += 1
    result = el.scan_chunks(chunks)
    assert result["speculative_config"] == EAGLE3
    assert result["vllm_version"] == "0.32.0"
    assert sum(w["count"] for w in result["log_warnings"] if w["kind"] == "min_p_logit_bias") == 1


def test_carry_stays_bounded_on_a_line_without_newlines():
    scanner = el.EngineLogScanner(max_line=1 << 16)
    for _i in range(64):
        scanner.feed(b"x" * 50000)
        assert len(scanner._carry) <= 1 << 16  # pylint: disable=protected-access
    scanner.feed(b"\n" + EAGLE3_BYTES)
    assert scanner.result()["speculative_config"] == EAGLE3


def test_str_and_bytes_inputs_agree_and_non_utf8_is_tolerated():
    text = EAGLE3_BYTES.decode("utf-8")
    assert el.scan_text(text)["speculative_config"] == el.scan_text(EAGLE3_BYTES)["speculative_config"] == EAGLE3
    dirty = b"\xff\xfe garbage \xc3\n" + EAGLE3_BYTES
    assert el.scan_text(dirty)["speculative_config"] == EAGLE3


def test_scan_file_missing_names_the_field(tmp_path):
    with pytest.raises(ValidationError, match="^log_path: cannot read"):
        el.scan_file(str(tmp_path / "nope.log"))


def test_iter_needle_lines_keeps_order_and_only_matching_lines():
    chunks = [b"a SpecDecoding 1\nno\nb Spec", b"Decoding 2\nc SpecDecoding 3"]
    assert list(el.iter_needle_lines(chunks, (b"SpecDecoding",))) == ["a SpecDecoding 1", "b SpecDecoding 2", "c SpecDecoding 3"]


# ----------------------------------------------------------------------------------------------------
# Comparing with what was requested

def test_compare_matches():
    assert el.compare_expected(EAGLE3, {"method": "eagle3", "model": "/mnt/models/tiny-eagle3/", "num_speculative_tokens": 3}) == ([], [])


def test_compare_mtp_alias_is_normalised():
    diffs, notes = el.compare_expected({"method": "mtp", "model": "/m", "num_spec_tokens": 1}, {"method": "deepseek_mtp"})
    assert diffs == []
    assert notes == ["method 'deepseek_mtp' is an alias that vLLM normalises to 'mtp'"]


def test_compare_reports_both_sides():
    diffs, _notes = el.compare_expected(EAGLE3, {"method": "eagle", "num_speculative_tokens": 5, "model": "/x"})
    assert diffs == ["method: expected 'eagle', engine runs 'eagle3'", "model: expected '/x', engine runs '/mnt/models/tiny-eagle3'",
                     "num_speculative_tokens: expected 5, engine runs 3"]


def test_compare_explains_a_guessed_method():
    found = {"method": "draft_model", "model": "/mnt/models/draft", "num_spec_tokens": 3}
    # the flag omitted method; the user meant eagle3 (stated in expected)
    diffs, _notes = el.compare_expected(found, {"method": "eagle3", "method_given": False})
    assert len(diffs) == 1 and "vLLM guesses the method" in diffs[0] and "/mnt/models/draft silently becomes draft_model" in diffs[0]
    # expected derived from a flag without method: not a failure, but explained
    diffs, notes = el.compare_expected(found, el.expected_from_flag({"model": "/mnt/models/draft", "num_speculative_tokens": 3}))
    assert diffs == [] and len(notes) == 1 and "omitted \"method\"" in notes[0]


def test_compare_enabled_flags():
    assert el.compare_expected(None, {"enabled": False}) == ([], [])
    assert el.compare_expected(NGRAM, {"enabled": False})[0] == [
        "expected no speculative decoding (speculative_config=None), engine runs SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5)"]
    assert "engine runs without speculative decoding" in el.compare_expected(None, {"method": "ngram"})[0][0]
    assert el.compare_expected(None, {"enabled": True})[0]
    assert el.compare_expected(NGRAM, {}) == ([], [])


# vLLM 0.32 SpeculativeConfig.__repr__ (vllm/config/speculative.py) prints model=None for ngram, suffix,
# extract_hidden_states and custom_class; the release table's repr_model_none is read from that source.
CUSTOM_PRINTED = {"method": "custom_class", "model": None, "num_spec_tokens": 3}


@pytest.mark.parametrize("flag,printed", [
    ({"method": "custom_class", "model": "my_pkg.proposers.Mine", "num_speculative_tokens": 3}, CUSTOM_PRINTED),
    ({"model": "my_pkg.proposers.Mine", "num_speculative_tokens": 3}, CUSTOM_PRINTED),
    ({"model": "ngram", "num_speculative_tokens": 5}, NGRAM),
    ({"method": "ngram", "model": "ngram", "num_speculative_tokens": 5}, NGRAM),
    ({"method": "suffix", "model": "suffix", "num_speculative_tokens": 8}, {"method": "suffix", "model": None, "num_spec_tokens": 8}),
    ({"method": "extract_hidden_states", "model": "extract_hidden_states", "num_speculative_tokens": 1},
     {"method": "extract_hidden_states", "model": None, "num_spec_tokens": 1}),
], ids=["custom-class", "custom-class-by-path", "ngram-by-model", "ngram-with-model", "suffix", "extract-hidden-states"])
def test_no_false_alarm_for_methods_vllm_prints_without_a_model(flag, printed):
    diffs, notes = el.compare_expected(printed, el.expected_from_flag(flag), "0.32.0")
    assert diffs == []
    assert any("vLLM prints model=None for method %r" % printed["method"] in n for n in notes), notes
    # the version may be unknown (no engine line version): the same
    assert el.compare_expected(printed, el.expected_from_flag(flag))[0] == []


def test_a_model_vllm_prints_is_still_compared():
    # eagle3 prints its draft path: another path is a difference, and model=None for eagle3 is one too
    assert el.compare_expected(EAGLE3, {"method": "eagle3", "model": "/mnt/models/other"})[0] == [
        "model: expected '/mnt/models/other', engine runs '/mnt/models/tiny-eagle3'"]
    assert el.compare_expected(dict(EAGLE3, model=None), {"method": "eagle3", "model": "/mnt/models/tiny-eagle3"}, "0.32.0")[0] == [
        "model: expected '/mnt/models/tiny-eagle3', engine runs None"]


def test_a_method_vllm_overrides_is_a_mismatch_that_names_the_rule():
    # issue #49 (tests/e2e/test_engine_line_differential.py): a draft path containing 'eagle3' makes vLLM 0.32 run EAGLE-3
    # although the flag says draft_model (SpeculativeConfig.__post_init__); verify used to call that a match
    expected = el.expected_from_flag({"method": "draft_model", "model": "/mnt/models/tiny-eagle3", "num_speculative_tokens": 3})
    assert expected["method"] == "draft_model" and "contains 'eagle3'" in expected["method_rule"]
    diffs, notes = el.compare_expected(EAGLE3, expected, "0.32.0")
    assert len(diffs) == 1 and diffs[0].startswith("method: expected 'draft_model', engine runs 'eagle3' (vLLM overrides the method "
                                                   "written: the draft path '/mnt/models/tiny-eagle3' contains 'eagle3'"), diffs
    assert notes == []
    # an mtp alias is no override, but the draft path still overrides it
    diffs = el.compare_expected(EAGLE3, el.expected_from_flag({"method": "deepseek_mtp", "model": "/mnt/models/tiny-eagle3"}), "0.32.0")[0]
    assert len(diffs) == 1 and diffs[0].startswith("method: expected 'mtp', engine runs 'eagle3' (vLLM overrides"), diffs
    # a method the path rule keeps (eagle, eagle3, dflash, dspark) is what runs: no rule, no difference
    assert el.expected_from_flag({"method": "eagle3", "model": "/mnt/models/tiny-eagle3"}) == {
        "enabled": True, "method": "eagle3", "model": "/mnt/models/tiny-eagle3", "method_given": True}


def test_a_method_vllm_picks_for_a_flag_without_one_is_no_mismatch():
    # no method written: vLLM's pick from the names is what the flag asks for, explained in a note
    expected = el.expected_from_flag({"model": "my_pkg.Mine", "num_speculative_tokens": 3})
    assert expected["method"] == "custom_class" and "dotted class path" in expected["method_rule"]
    diffs, notes = el.compare_expected(CUSTOM_PRINTED, expected, "0.32.0")
    assert diffs == [] and any("vLLM runs 'custom_class', a method the flag does not name" in n for n in notes), notes
    expected = el.expected_from_flag({"model": "/mnt/models/tiny-eagle3", "num_speculative_tokens": 3})
    assert expected["method"] == "eagle3"
    assert el.compare_expected(EAGLE3, expected, "0.32.0")[0] == []
    # and another method in the line is still a difference, explained as vLLM's guess (no method was written)
    diffs = el.compare_expected(dict(EAGLE3, method="draft_model"), expected, "0.32.0")[0]
    assert len(diffs) == 1 and diffs[0].startswith("method: expected 'eagle3', engine runs 'draft_model' (vLLM guesses"), diffs


def test_expected_from_flag_hyphen_keys():
    assert el.expected_from_flag({"method": "ngram", "num-speculative-tokens": 5}) == {
        "enabled": True, "method": "ngram", "num_speculative_tokens": 5, "method_given": True}
    assert el.expected_from_flag(None) == {"enabled": False}


def test_normalize_method():
    assert el.normalize_method("Qwen3_Next_MTP") == "mtp"
    assert el.normalize_method("eagle3") == "eagle3"
    assert el.normalize_method(None) is None and el.normalize_method("None") is None


@pytest.mark.parametrize("chunk_size", [1, 7, 4096, 1 << 20])
def test_scan_file_buffer_sizes(chunk_size):
    result = el.scan_file(capture("eagle3", "startup.log"), chunk_size=chunk_size)
    assert result["speculative_config"] == EAGLE3 and result["bytes_scanned"] == len(EAGLE3_BYTES)


# -- flagless speculative decoding (a speculators-format checkpoint served as the model) ---------------------------------

SPECULATOR_LINE = ("(EngineCore pid=1) INFO 12-02 10:00:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
                   "model='/mnt/models/llama', speculative_config=SpeculativeConfig(method='eagle3', "
                   "model='/mnt/models/llama-eagle3-speculator', num_spec_tokens=3), tokenizer='/mnt/models/llama', dtype=torch.bfloat16")


def test_engine_line_gives_the_served_model():
    found = el.scan_text(SPECULATOR_LINE + "\n")
    assert found["model"] == "/mnt/models/llama"
    assert found["speculative_config"]["model"] == "/mnt/models/llama-eagle3-speculator"
    with open(capture_path("eagle3", "startup.log"), encoding="utf-8") as handle:
        assert el.scan_text(handle.read())["model"] == "/mnt/models/tiny-llama"


def test_a_speculators_checkpoint_served_as_the_model_is_named_with_its_verifier_and_the_fix():
    found = el.scan_text(SPECULATOR_LINE + "\n")
    source = el.flagless_source(found, ["bash", "-c", "exec vllm serve /mnt/models/llama-eagle3-speculator/ --port 8080"])
    assert source["kind"] == "speculators_checkpoint"
    assert (source["checkpoint"], source["verifier"]) == ("/mnt/models/llama-eagle3-speculator/", "/mnt/models/llama")
    assert "speculators_config" in source["message"] and "serve the target model /mnt/models/llama directly" in source["fix"]


def test_a_flag_or_no_proposer_is_not_flagless_and_an_unexplained_proposer_says_so():
    found = el.scan_text(SPECULATOR_LINE + "\n")
    with_flag = ["vllm", "serve", "/mnt/models/llama", "--speculative-config",
                 '{"method":"eagle3","model":"/mnt/models/llama-eagle3-speculator","num_speculative_tokens":3}']
    assert el.flagless_source(found, with_flag) is None
    legacy = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/mnt/models/llama",
              "--speculative_model", "/mnt/models/llama-eagle3-speculator", "--num-speculative-tokens", "3"]
    assert el.flagless_source(found, legacy) is None  # the legacy flags explain it (the rollback removes them)
    assert el.flagless_source(dict(found, speculative_config=None), ["vllm", "serve", "/mnt/models/llama"]) is None
    unexplained = el.flagless_source(found, ["vllm", "serve", "/mnt/models/llama"])
    assert unexplained["kind"] == "unexplained" and unexplained["checkpoint"] is None and "serving_runtime_info" in unexplained["fix"]


def test_the_schedule_dropped_for_data_parallelism_is_its_own_warning():
    # vLLM 0.32.0's wording (vllm/config/vllm.py, _maybe_disable_dynamic_sd_for_data_parallel), as logger.warning_once prints it
    line = ("(EngineCore_DP0 pid=1) WARNING 12-03 10:00:00 [vllm.py:1066] Dynamic speculative decoding is not supported with data "
            "parallelism because data-parallel ranks can select different speculative-token counts, causing DP divergence and "
            "deadlocks. Disabling num_speculative_tokens_per_batch_size and falling back to static num_speculative_tokens=4.")
    kind, level, message = el.classify_warning(line)
    assert (kind, level) == ("schedule_disabled_data_parallel", "WARNING") and message.startswith("Dynamic speculative decoding")


def test_a_flag_naming_no_method_asks_for_the_method_vllm_picks_from_the_draft_path():
    # issue #49 (tests/e2e/test_engine_line_differential.py): {"model": "/mnt/models/draft"} used to expect no method,
    # so a line running ngram, eagle or custom_class passed for it. vLLM 0.32 SpeculativeConfig.__post_init__ runs
    # draft_model for such a path, unless the draft's config.json names dflash, dspark, medusa, mlp_speculator or mtp.
    expected = el.expected_from_flag({"model": "/mnt/models/draft", "num_speculative_tokens": 3}, "0.32.0")
    assert expected["method"] == "draft_model"
    assert expected["method_from_files"] == ["dflash", "dspark", "medusa", "mlp_speculator", "mtp"]
    # vLLM 0.33 removed medusa and mlp_speculator (the newest table read, used when the version is not known)
    assert el.expected_from_flag({"model": "/mnt/models/draft"})["method_from_files"] == ["dflash", "dspark", "mtp"]
    draft = {"method": "draft_model", "model": "/mnt/models/draft", "num_spec_tokens": 3}
    assert el.compare_expected(draft, expected, "0.32.0")[0] == []
    diffs, notes = el.compare_expected(dict(draft, method="medusa"), expected, "0.32.0")
    assert diffs == [] and any("vLLM chose 'medusa', from the draft's config.json" in n for n in notes), notes
    diffs = el.compare_expected(dict(draft, method="eagle"), expected, "0.32.0")[0]
    assert len(diffs) == 1 and diffs[0].startswith("method: expected 'draft_model', engine runs 'eagle' (vLLM guesses"), diffs


def test_a_draft_asked_for_and_an_engine_printing_model_none_is_a_mismatch():
    # the draft is skipped only when the method asked prints model=None (SpeculativeConfig.__repr__), not when the
    # engine runs such a method: a draft_model flag against an ngram engine used to pass on the model
    expected = el.expected_from_flag({"model": "/mnt/models/draft", "num_speculative_tokens": 5})
    diffs, _notes = el.compare_expected(NGRAM, expected, "0.32.0")
    assert diffs == ["method: expected 'draft_model', engine runs 'ngram'", "model: expected '/mnt/models/draft', engine runs None"]
    # an expectation with a model and no method still skips it for a method printing model=None (as before)
    assert el.compare_expected(NGRAM, {"model": "ngram", "num_speculative_tokens": 5}, "0.32.0")[0] == []
