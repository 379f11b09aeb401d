"""engine_config_info and speculative_metrics_info on the output of a vLLM newer than the tables
(tests/fixtures/vllm/newer/): they return what they understood as for the capture it was made from, list the rest in
not_understood and warn once. Run in-process (tests/module_run.py)."""

import os

from tests.module_run import run_module
from tests.paths import capture_path
from tests.vllm_newer import NEWER


def newer(name):
    return os.path.join(NEWER, name)


def test_engine_config_info_returns_and_warns_what_it_did_not_understand():
    res = run_module("engine_config_info", {"log_path": newer("startup.log"),
                                            "expected": {"method": "draft_model", "num_speculative_tokens": 3}})
    assert not res.failed, res.msg
    assert (res["vllm_version"], res["speculative_config"]["method"], res["differences"]) == ("0.35.0", "draft_model", [])
    assert [(n["source"], n["name"]) for n in res["not_understood"]] == [("engine_line", "adaptive_draft_length")]
    assert len(res.warning_messages) == 1 and "engine line adaptive_draft_length" in res.warning_messages[0]


def test_engine_config_info_on_a_capture_has_nothing_to_say():
    res = run_module("engine_config_info", {"log_path": capture_path("draft_model", "startup.log")})
    assert not res.failed and res["not_understood"] == [] and not res.warning_messages


def test_engine_config_info_after_a_rollback_fails_on_an_unknown_method_and_names_it():
    res = run_module("engine_config_info", {"log_path": newer("custom_method.log"), "expected": {"enabled": False}})
    assert res.failed
    assert "engine runs SpeculativeConfig(method='my_proposer'" in res.msg
    assert [n["name"] for n in res["not_understood"]] == ["my_proposer"]
    assert "engine line my_proposer" in res.warning_messages[0]


def test_speculative_metrics_info_on_a_newer_page():
    res = run_module("speculative_metrics_info", {"metrics_path": newer("metrics.txt")})
    real = run_module("speculative_metrics_info", {"metrics_path": capture_path("ngram", "metrics.txt")})
    assert not res.failed, res.msg
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "mean_acceptance_length", "diagnosis"):
        assert res[key] == real[key]
    assert res["num_draft_tokens"] == 1002 and real["not_understood"] == [] and not real.warning_messages
    assert [(n["source"], n["name"], n["count"]) for n in res["not_understood"]] == [
        ("metrics", "vllm:spec_decode_num_draft_tokens_per_pos_total", 5)]
    assert len(res.warning_messages) == 1 and "/metrics vllm:spec_decode_num_draft_tokens_per_pos_total" in res.warning_messages[0]


def test_speculative_metrics_info_on_newer_log_lines():
    res = run_module("speculative_metrics_info", {"log_path": newer("startup.log")})
    assert not res.failed, res.msg
    assert (res["source"], res["windows_total"], res["num_draft_tokens"], res["num_accepted_tokens"]) == ("log", 2, 774, 774)
    assert [(n["source"], n["name"], n["count"]) for n in res["not_understood"]] == [
        ("spec_decoding_line", "Per-position draft tokens", 2)]
    assert "SpecDecoding line Per-position draft tokens" in res.warning_messages[0]
