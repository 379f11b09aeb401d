"""The speculative-config core: methods and keys per vLLM version, validation messages, canonical JSON."""

import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

EAGLE3 = {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


# --- every method, on the versions that have it -------------------------------------------------------------

VALID = [
    ("0.10.2", {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}),
    ("0.10.2", {"method": "eagle", "model": "/m/eagle-head", "num_speculative_tokens": 3}),
    ("0.10.2", EAGLE3),
    ("0.11.0", {"method": "medusa", "model": "/m/medusa", "num_speculative_tokens": 3}),
    ("0.11.0", {"method": "mlp_speculator", "model": "/m/mlp", "num_speculative_tokens": 3}),
    ("0.11.0", {"method": "deepseek_mtp", "num_speculative_tokens": 1}),
    ("0.11.0", {"method": "ernie_mtp", "num_speculative_tokens": 1}),
    ("0.11.0", {"method": "qwen3_next_mtp", "num_speculative_tokens": 1}),
    ("0.11.0", {"method": "mimo_mtp", "num_speculative_tokens": 1}),
    ("0.11.0", {"method": "longcat_flash_mtp", "num_speculative_tokens": 1}),
    ("0.11.0", {"method": "mtp", "num_speculative_tokens": 1}),
    ("0.24.0", {"method": "draft_model", "model": "/mnt/models/draft", "num_speculative_tokens": 3}),
    ("0.24.0", {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 24}),
    ("0.24.0", {"method": "medusa", "model": "/m/medusa", "num_speculative_tokens": 3}),
    ("0.24.0", {"method": "dflash", "model": "/m/dflash", "num_speculative_tokens": 4}),
    ("0.24.0", {"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}),
    # vLLM 0.22-0.33 refuse custom_class without `model` (the proposer's import path)
    ("0.24.0", {"method": "custom_class", "model": "my_pkg.MyProposer", "num_speculative_tokens": 2}),
    ("0.24.0", {"method": "extract_hidden_states", "num_speculative_tokens": 1}),
    ("0.33.0", {"method": "dspark", "model": "/m/dspark", "num_speculative_tokens": 3}),
    ("0.33.0", {"method": "mtp", "num_speculative_tokens": 1, "enforce_eager": True}),
    ("0.33.0", {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1,
                "max_model_len": 4096, "quantization": "fp8", "revision": "main"}),
]


@pytest.mark.parametrize("version,config", VALID, ids=["%s-%s" % (v, c["method"]) for v, c in VALID])
def test_valid_configs_pass_and_round_trip(version, config):
    result = core.validate(config, vllm_version=version)
    assert json.loads(result.json) == config
    assert result.config == config


def test_canonical_order_is_method_model_tokens_then_sorted():
    messy = {"prompt_lookup_min": 2, "num_speculative_tokens": 5, "prompt_lookup_max": 4, "method": "ngram"}
    assert core.validate(messy, "0.32.0").json == (
        '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}')
    eagle = {"num_speculative_tokens": 3, "model": "/mnt/models/draft", "method": "eagle3", "draft_tensor_parallel_size": 1}
    assert core.validate(eagle, "0.32.0").json == (
        '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3,"draft_tensor_parallel_size":1}')


def test_same_config_same_bytes_from_dict_and_json_string():
    as_text = '{ "prompt_lookup_max": 4, "method": "ngram", "prompt_lookup_min": 2, "num_speculative_tokens": 5 }'
    assert core.validate(as_text, "0.24.0").json == core.validate(NGRAM, "0.24.0").json


def test_hyphenated_keys_become_underscores():
    result = core.validate({"method": "ngram", "num-speculative-tokens": 5, "prompt-lookup-min": 2,
                            "prompt-lookup-max": 4}, "0.32.0")
    assert result.config == NGRAM


def test_presets_are_the_guides_starting_points():
    assert core.from_preset("ngram", vllm_version="0.32.0").json == (
        '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}')
    assert core.from_preset("eagle3", {"model": "/mnt/models/draft"}, "0.32.0").json == (
        '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}')
    assert core.from_preset("ngram", {"num_speculative_tokens": 3}, "0.32.0").config["num_speculative_tokens"] == 3


def test_without_version_validates_against_newest_and_says_so():
    result = core.validate(NGRAM)
    assert result.vllm_version == core.NEWEST_KNOWN
    assert any("vllm_version not given" in w and "0.34.0" in w for w in result.warnings)


def test_newer_than_known_warns():
    result = core.validate(NGRAM, "0.40.1")
    assert any("newer than" in w for w in result.warnings)


@pytest.mark.parametrize("text,expected", [
    ("0.32.0", (0, 32, 0)), ("v0.11.1rc2", (0, 11, 1)), ("0.32.0+cpu", (0, 32, 0)), ("0.24", (0, 24, 0)),
    ("0.11.1.dev12+g1234", (0, 11, 1)),
])
def test_parse_version(text, expected):
    assert core.parse_version(text) == expected


# --- warnings returned as data -------------------------------------------------------------------------------

def _warnings(config, version="0.32.0"):
    return "\n".join(core.validate(config, version).warnings)


def test_warning_method_omitted_vllm_guesses_from_path():
    text = _warnings({"model": "/mnt/models/draft", "num_speculative_tokens": 3})
    assert "method is omitted" in text and "'draft_model'" in text
    assert "'eagle3'" in _warnings({"model": "/models/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3})
    assert "'eagle'" in _warnings({"model": "/models/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 3})


def test_guessed_method_matches_vllm_rules():
    assert core.guessed_method("/mnt/models/draft") == "draft_model"
    assert core.guessed_method("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") == "eagle3"
    assert core.guessed_method("yuhuili/EAGLE-LLaMA3-Instruct-8B") == "eagle"


def test_warning_ngram_and_suffix_turn_async_scheduling_off():
    assert "async scheduling off" in _warnings(NGRAM)
    assert "async scheduling off" in _warnings({"method": "suffix", "num_speculative_tokens": 8})
    assert "async scheduling" not in _warnings(EAGLE3)


def test_warning_min_p_logit_bias_per_version():
    assert "HTTP 400" in _warnings(EAGLE3, "0.24.0")
    assert "ignored" in _warnings(EAGLE3, "0.11.0") and "HTTP 400" not in _warnings(EAGLE3, "0.11.0")


def test_warning_draft_weights_outside_gpu_memory_utilization():
    assert "--gpu-memory-utilization" in _warnings(EAGLE3)
    assert "--gpu-memory-utilization" not in _warnings(NGRAM)


def test_warning_mtp_with_more_than_one_token():
    assert "mtp with num_speculative_tokens=2" in _warnings({"method": "deepseek_mtp", "num_speculative_tokens": 2})
    assert "mtp with" not in _warnings({"method": "mtp", "num_speculative_tokens": 1})


def test_unknown_key_is_a_warning_on_011_because_vllm_drops_it():
    text = _warnings({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
                      "lookahead": 3}, "0.11.0")
    assert "config.lookahead" in text and "silently drops" in text


def test_ngram_without_bounds_warns_with_vllms_defaults():
    # vLLM fills 5 and 5 when both are omitted (it used to be refused here)
    text = _warnings({"method": "ngram", "num_speculative_tokens": 5})
    assert "prompt_lookup_min/max are not set: vLLM 0.32.0 defaults them to 5 and 5" in text


def test_tokens_omitted_with_a_draft_model_warns_that_vllm_reads_its_config():
    text = _warnings({"method": "eagle3", "model": "/d"})
    assert "num_speculative_tokens is not set" in text and "n_predict" in text


def test_ngram_single_bound_warns_that_vllm_copies_it():
    assert "copies prompt_lookup_max=4" in _warnings({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})


def test_middle_version_uses_its_own_release_table():
    # every minor release has its table now: 0.15 keeps an explicit draft_model (0.14 still raised 'not supported yet')
    text = _warnings({"method": "draft_model", "model": "/d", "num_speculative_tokens": 3}, "0.15.0")
    assert "not verified" not in text
    with pytest.raises(ValidationError, match="not supported by vLLM 0.14.0"):
        core.validate({"method": "draft_model", "model": "/d", "num_speculative_tokens": 3}, "0.14.0")


def test_printed_method_normalises_mtp_aliases():
    assert core.printed_method("deepseek_mtp") == "mtp"
    assert core.printed_method("qwen3_next_mtp") == "mtp"
    assert core.printed_method("eagle3") == "eagle3"


# --- bad input: each message names the field and the fix -----------------------------------------------------

BAD = [
    # (id, config, version, field named in the message, a fragment of the fix)
    ("unknown-method", {"method": "lookahead", "num_speculative_tokens": 3}, "0.32.0", "config.method", "use one of"),
    ("unknown-method-011", {"method": "suffix_tree", "num_speculative_tokens": 3}, "0.11.0", "config.method", "use one of"),
    ("typo-method", {"method": "eagle-3", "model": "/d", "num_speculative_tokens": 3}, "0.32.0", "config.method", "eagle3"),
    ("medusa-removed-033", {"method": "medusa", "model": "/d", "num_speculative_tokens": 3}, "0.33.0", "config.method", "removed"),
    ("mlp-removed-033", {"method": "mlp_speculator", "model": "/d", "num_speculative_tokens": 3}, "0.33.0", "config.method", "removed"),
    ("draft-model-010", {"method": "draft_model", "model": "/d", "num_speculative_tokens": 3}, "0.10.2", "config.method", "upgrade"),
    ("draft-model-011", {"method": "draft_model", "model": "/d", "num_speculative_tokens": 3}, "0.11.1", "config.method", "upgrade"),
    ("guessed-draft-model-011", {"model": "/mnt/models/draft", "num_speculative_tokens": 3}, "0.11.0", "config.method", "upgrade"),
    ("suffix-011", {"method": "suffix", "num_speculative_tokens": 3}, "0.11.0", "config.method", "upgrade"),
    ("dspark-024", {"method": "dspark", "model": "/d", "num_speculative_tokens": 3}, "0.24.0", "config.method", "upgrade"),
    ("dflash-010", {"method": "dflash", "model": "/d", "num_speculative_tokens": 3}, "0.10.0", "config.method", "upgrade"),
    ("ernie-mtp-010", {"method": "ernie_mtp", "num_speculative_tokens": 1}, "0.10.1", "config.method", "upgrade"),
    ("unknown-mtp-alias-011", {"method": "foo_mtp", "num_speculative_tokens": 1}, "0.11.0", "config.method", "use one of"),
    ("no-method-no-model", {"num_speculative_tokens": 3}, "0.32.0", "config.method", "set method"),
    ("unknown-key-024", dict(NGRAM, lookahead=3), "0.24.0", "config.lookahead", "remove it"),
    ("unknown-key-033", dict(EAGLE3, draft_model_path="/x"), "0.33.0", "config.draft_model_path", "remove it"),
    ("tensor-parallel-size", dict(EAGLE3, tensor_parallel_size=2), "0.32.0", "config.tensor_parallel_size", "draft_tensor_parallel_size"),
    ("speculative-model-key", {"speculative_model": "/d", "num_speculative_tokens": 3}, "0.32.0", "config.speculative_model", "'model'"),
    ("num-spec-tokens-key", {"method": "eagle3", "model": "/d", "num_spec_tokens": 3}, "0.32.0", "config.num_spec_tokens", "num_speculative_tokens"),
    ("v0-acceptance-method", dict(EAGLE3, acceptance_method="typical_acceptance_sampler"), "0.32.0", "config.acceptance_method", "V0"),
    ("ngram-prompt-lookup-key", {"method": "ngram", "num_speculative_tokens": 3, "ngram_prompt_lookup_max": 4}, "0.32.0",
     "config.ngram_prompt_lookup_max", "prompt_lookup_max"),
    # without a `model` vLLM has no draft config to take num_speculative_tokens from
    ("k-missing", {"method": "mtp"}, "0.32.0", "config.num_speculative_tokens", "set it"),
    ("k-zero", dict(EAGLE3, num_speculative_tokens=0), "0.32.0", "config.num_speculative_tokens", "greater than zero"),
    ("k-negative", dict(EAGLE3, num_speculative_tokens=-2), "0.32.0", "config.num_speculative_tokens", "greater than zero"),
    ("k-float", dict(EAGLE3, num_speculative_tokens=2.5), "0.32.0", "config.num_speculative_tokens", "bare number"),
    ("k-null", dict(EAGLE3, num_speculative_tokens=None), "0.32.0", "config.num_speculative_tokens", "drop the key"),
    ("ngram-min-gt-max", dict(NGRAM, prompt_lookup_min=5, prompt_lookup_max=2), "0.32.0", "config.prompt_lookup_min", "swap"),
    ("ngram-min-zero", dict(NGRAM, prompt_lookup_min=0), "0.32.0", "config.prompt_lookup_min", "positive"),
    ("eagle3-no-model", {"method": "eagle3", "num_speculative_tokens": 3}, "0.32.0", "config.model", "/mnt/models/draft"),
    ("eagle-no-model", {"method": "eagle", "num_speculative_tokens": 3}, "0.32.0", "config.model", "set model"),
    ("draft-model-no-model", {"method": "draft_model", "num_speculative_tokens": 3}, "0.32.0", "config.model", "set model"),
    ("model-empty", dict(EAGLE3, model=""), "0.32.0", "config.model", "as text"),
    ("model-not-string", dict(EAGLE3, model=7), "0.32.0", "config.model", "as text"),
    ("draft-tp-zero", dict(EAGLE3, draft_tensor_parallel_size=0), "0.32.0", "config.draft_tensor_parallel_size", "positive"),
    ("max-model-len-str", dict(EAGLE3, max_model_len="4k"), "0.32.0", "config.max_model_len", "bare number"),
    ("enforce-eager-010", dict(EAGLE3, enforce_eager=True), "0.10.2", "config.enforce_eager", "added in vLLM 0.11"),
    ("suffix-prob", {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_min_token_prob": 2}, "0.32.0",
     "config.suffix_decoding_min_token_prob", "0.1"),
    ("suffix-factor", {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_spec_factor": -0.5}, "0.32.0",
     "config.suffix_decoding_max_spec_factor", "1.0"),
    ("suffix-cached-negative", {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_cached_requests": -1},
     "0.32.0", "config.suffix_decoding_max_cached_requests", "0 turns"),
    ("duplicate-spelling-011", {"method": "ngram", "num_speculative_tokens": 5, "num-speculative-tokens": 4},
     "0.11.0", "config.num-speculative-tokens", "underscores"),
    # Literal / Enum values (speculative_releases field_values, read from each release's source)
    ("rejection-unknown", dict(EAGLE3, rejection_sample_method="greedy"), "0.32.0", "config.rejection_sample_method", "block, standard, synthetic"),
    ("rejection-fly-032", dict(EAGLE3, rejection_sample_method="fly"), "0.32.0", "config.rejection_sample_method", "use one of"),
    ("draft-sample-unknown", dict(EAGLE3, draft_sample_method="topk"), "0.32.0", "config.draft_sample_method", "greedy, probabilistic"),
    ("moe-backend-unknown", dict(EAGLE3, moe_backend="fast"), "0.32.0", "config.moe_backend", "triton"),
    ("kv-cache-dtype-unknown", dict(EAGLE3, kv_cache_dtype="int3"), "0.32.0", "config.kv_cache_dtype", "fp8"),
    ("attention-backend-unknown", dict(EAGLE3, attention_backend="fastest"), "0.32.0", "config.attention_backend", "FLASH_ATTN"),
    ("attention-backend-class-path", dict(EAGLE3, attention_backend="vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"),
     "0.32.0", "config.attention_backend", "CPU_ATTN"),
    ("draft-load-config-string", dict(EAGLE3, draft_load_config="auto"), "0.32.0", "config.draft_load_config", "load_format"),
    ("draft-load-config-field", dict(EAGLE3, draft_load_config={"format": "auto"}), "0.32.0", "config.draft_load_config", "load_format"),
    # synthetic acceptance (vLLM 0.32 SpeculativeConfig._resolve_synthetic_acceptance_rates / _verify_args)
    ("synthetic-neither", dict(EAGLE3, rejection_sample_method="synthetic"), "0.32.0", "config.rejection_sample_method", "one rate per"),
    ("synthetic-both", dict(EAGLE3, rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.5, 0.4, 0.3],
                            synthetic_acceptance_length=2.0), "0.32.0", "config.rejection_sample_method", "one rate per"),
    ("synthetic-rates-length", dict(EAGLE3, rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.5, 0.4]), "0.32.0",
     "config.synthetic_acceptance_rates", "one rate per drafted position"),
    ("synthetic-rates-range", dict(EAGLE3, rejection_sample_method="synthetic", synthetic_acceptance_rates=[1.5, 0.4, 0.3]), "0.32.0",
     "config.synthetic_acceptance_rates", "probabilities"),
    ("synthetic-rates-order", dict(EAGLE3, rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.3, 0.4, 0.2]), "0.32.0",
     "config.synthetic_acceptance_rates", "cannot grow"),
    ("synthetic-length-range", dict(EAGLE3, rejection_sample_method="synthetic", synthetic_acceptance_length=4.5), "0.32.0",
     "config.synthetic_acceptance_length", "num_speculative_tokens + 1"),
    ("synthetic-rates-without-synthetic", dict(EAGLE3, synthetic_acceptance_rates=[0.5, 0.4, 0.3]), "0.32.0",
     "config.synthetic_acceptance_rates", "rejection_sample_method: synthetic"),
    ("synthetic-length-without-synthetic", dict(EAGLE3, synthetic_acceptance_length=2.0), "0.33.0",
     "config.synthetic_acceptance_length", "rejection_sample_method: synthetic"),
    # cross-field rules of SpeculativeConfig.__post_init__ / _verify_args
    ("adaptive-with-local-argmax", dict(EAGLE3, enable_adaptive_verification=True, use_local_argmax_reduction=True), "0.32.0",
     "config.enable_adaptive_verification", "disable one"),
    ("heterogeneous-vocab-eagle3", dict(EAGLE3, use_heterogeneous_vocab=True), "0.32.0", "config.use_heterogeneous_vocab", "draft_model"),
    ("heterogeneous-vocab-probabilistic", {"method": "draft_model", "model": "/d", "num_speculative_tokens": 3,
                                           "use_heterogeneous_vocab": True, "draft_sample_method": "probabilistic"}, "0.32.0",
     "config.draft_sample_method", "greedy"),
    ("heterogeneous-vocab-local-argmax-033", {"method": "draft_model", "model": "/d", "num_speculative_tokens": 3,
                                              "use_heterogeneous_vocab": True, "use_local_argmax_reduction": True}, "0.33.0",
     "config.use_local_argmax_reduction", "disable one"),
    ("mtp-only-key-under-ngram", dict(NGRAM, index_share_for_mtp_iteration=True), "0.32.0", "config.index_share_for_mtp_iteration", "drop it"),
    ("dspark-only-key-under-eagle3", dict(EAGLE3, dspark_draft_topk=8), "0.32.0", "config.dspark_draft_topk", "drop it"),
    ("fly-one-token-033", dict(EAGLE3, num_speculative_tokens=1, rejection_sample_method="fly"), "0.33.0",
     "config.num_speculative_tokens", "2 or more"),
    # no draft config can supply k (vLLM 0.32 SpeculativeConfig._verify_args)
    ("ngram-no-k", {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}, "0.32.0", "config.num_speculative_tokens", "set it"),
    ("ngram-by-model-no-k", {"model": "ngram"}, "0.32.0", "config.num_speculative_tokens", "set it"),
    ("custom-class-no-k", {"model": "my_pkg.MyProposer"}, "0.32.0", "config.num_speculative_tokens", "custom proposer"),
    ("key-with-spaces", {" method": "ngram", "num_speculative_tokens": 5}, "0.32.0", "config. method", "write it as 'method'"),
    ("not-json", '{"method": "ngram", num_speculative_tokens: 5}', "0.32.0", "config", "double quotes"),
    ("json-list", '["ngram", 5]', "0.32.0", "config", "{...}"),
    ("empty-string", "  ", "0.32.0", "config", "JSON object"),
    ("wrong-type", 5, "0.32.0", "config", "mapping"),
    ("method-not-string", dict(EAGLE3, method=3), "0.32.0", "config.method", "as text"),
    ("bad-version", NGRAM, "latest", "vllm_version", "0.32.0"),
    ("too-old-version", NGRAM, "0.8.5", "vllm_version", "0.10"),
]


@pytest.mark.parametrize("config,version,field,fix", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_field_and_the_fix(config, version, field, fix):
    with pytest.raises(ValidationError) as info:
        core.validate(config, vllm_version=version)
    message = str(info.value)
    assert message.startswith(field + ":"), message
    assert "Fix:" in message, message
    assert fix in message, message


def test_bad_input_corpus_is_large_enough():
    assert len(BAD) >= 40


# --- the coercion policy (docs/speculative-config-validation.md): what pydantic converts is accepted, written as what
# vLLM uses, with a warning naming it; the values below are what vLLM 0.32's pydantic 2 makes of them ---------------

LOOSE = [
    # (id, key, value written, value vLLM uses, a fragment of the warning)
    ("k-string", "num_speculative_tokens", "3", 3, "'3' is a string; vLLM reads it as 3"),
    ("k-whole-float", "num_speculative_tokens", 3.0, 3, "3.0 is a float; vLLM reads it as 3"),
    ("k-bool", "num_speculative_tokens", True, 1, "True is a boolean; vLLM reads it as 1"),
    ("max-model-len-string", "max_model_len", " 2048 ", 2048, "vLLM reads it as 2048"),
    ("enforce-eager-string", "enforce_eager", "true", True, "vLLM reads it as true"),
    ("enforce-eager-yes", "enforce_eager", "yes", True, "vLLM reads it as true"),
    ("enforce-eager-zero", "enforce_eager", 0, False, "vLLM reads it as false"),
]


@pytest.mark.parametrize("key,written,used,note", [c[1:] for c in LOOSE], ids=[c[0] for c in LOOSE])
def test_loose_types_vllm_coerces_are_accepted_with_a_warning_naming_the_value(key, written, used, note):
    result = core.validate(dict(EAGLE3, **{key: written}), vllm_version="0.32.0")
    assert result.config[key] == used and type(result.config[key]) is type(used)
    assert any(note in w and ("config.%s" % key) in w for w in result.warnings), result.warnings
    assert ('"%s":%s' % (key, json.dumps(used))) in result.json


def test_null_for_an_optional_key_is_unset_and_dropped():
    result = core.validate(dict(EAGLE3, draft_tensor_parallel_size=None, quantization=None), vllm_version="0.32.0")
    assert "draft_tensor_parallel_size" not in result.config and "quantization" not in result.config
    assert any("config.quantization is null" in w for w in result.warnings)
    # a key whose vLLM type takes no None stays refused (test_bad_input: k-null)
    with pytest.raises(ValidationError, match="config.parallel_drafting: must not be null"):
        core.validate(dict(EAGLE3, parallel_drafting=None), vllm_version="0.32.0")


def test_two_spellings_of_one_key_the_later_wins_as_in_vllm():
    text = '{"method": "ngram", "num_speculative_tokens": 5, "num-speculative-tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
    result = core.validate(text, vllm_version="0.32.0")
    assert result.config["num_speculative_tokens"] == 4
    assert any("given twice" in w and "'num-speculative-tokens' wins" in w for w in result.warnings), result.warnings


def test_suffix_limits_are_checked_only_under_suffix():
    # vLLM 0.32 checks them in _validate_suffix_decoding, which only method 'suffix' reaches
    result = core.validate(dict(NGRAM, suffix_decoding_max_tree_depth=0, suffix_decoding_min_token_prob=3.0), vllm_version="0.32.0")
    assert result.config["suffix_decoding_max_tree_depth"] == 0
    assert core.validate({"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_spec_factor": 0},
                         vllm_version="0.32.0").config["suffix_decoding_max_spec_factor"] == 0


def test_literal_values_follow_each_release():
    assert core.validate(dict(EAGLE3, rejection_sample_method="fly", num_speculative_tokens=3), vllm_version="0.33.0").config[
        "rejection_sample_method"] == "fly"
    # quantization is `QuantizationMethods | str`: vLLM passes any name on (the draft's ModelConfig checks it)
    assert core.validate(dict(EAGLE3, quantization="my_quant"), vllm_version="0.32.0").config["quantization"] == "my_quant"
    # attention_backend: any case of a member name; 'auto' means unset
    assert core.validate(dict(EAGLE3, attention_backend="cpu_attn"), vllm_version="0.32.0").config["attention_backend"] == "cpu_attn"
    assert "attention_backend" not in core.validate(dict(EAGLE3, attention_backend="auto"), vllm_version="0.32.0").config


# --- the method vLLM runs (vLLM 0.32 SpeculativeConfig.__post_init__) -------------------------------------------------

RUNS = [
    # (id, config, the method vLLM runs, a fragment of the warning naming the rule)
    ("ngram-by-model", {"model": "ngram", "num_speculative_tokens": 5}, "ngram", "'model' is 'ngram'"),
    ("ngram-by-bracket-model", {"model": "[ngram]", "num_speculative_tokens": 5}, "ngram", "'model' is '[ngram]'"),
    ("custom-class-by-path", {"model": "my_pkg.proposers.Mine", "num_speculative_tokens": 3}, "custom_class", "dotted class path"),
    ("eagle3-path-over-draft-model", {"method": "draft_model", "model": "/mnt/models/llama-eagle3-head", "num_speculative_tokens": 3},
     "eagle3", "contains 'eagle3'"),
    ("eagle3-path-over-mtp", {"method": "mtp", "model": "/mnt/models/eagle3", "num_speculative_tokens": 1}, "eagle3", "contains 'eagle3'"),
    ("eagle-path-over-draft-model", {"method": "draft_model", "model": "/m/EAGLE-LLaMA3", "num_speculative_tokens": 3}, "eagle",
     "contains 'eagle-'"),
]


@pytest.mark.parametrize("config,runs,rule", [r[1:] for r in RUNS], ids=[r[0] for r in RUNS])
def test_the_method_vllm_runs_is_reported_with_the_rule(config, runs, rule):
    result = core.validate(config, vllm_version="0.32.0")
    assert result.method == runs
    assert any(rule in w and "'%s'" % runs in w for w in result.warnings), result.warnings


def test_the_written_method_stays_where_vllm_keeps_it():
    # eagle, eagle3, dflash and dspark are kept whatever the path says; a path without a rule keeps draft_model
    assert core.validate({"method": "eagle", "model": "/m/eagle3-head", "num_speculative_tokens": 3}, "0.32.0").method == "eagle"
    result = core.validate({"method": "draft_model", "model": "/mnt/models/draft", "num_speculative_tokens": 3}, "0.32.0")
    assert result.method == "draft_model" and not any("runs" in w for w in result.warnings)
    # a path with a slash is not a class path
    assert core.validate({"model": "org/My.Model", "num_speculative_tokens": 3}, "0.32.0").method == "draft_model"


@pytest.mark.parametrize("preset,overrides,field", [
    ("turbo", None, "preset"),
    ("eagle3", None, "overrides.model"),
    ("eagle3", {"model": "/d", "num_speculative_tokens": 0}, "config.num_speculative_tokens"),
    ("ngram", '{"prompt_lookup_min": 9}', "config.prompt_lookup_min"),
])
def test_bad_presets(preset, overrides, field):
    with pytest.raises(ValidationError) as info:
        core.from_preset(preset, overrides, "0.32.0")
    assert str(info.value).startswith(field), str(info.value)


# --- commands: removed flags and 0.24+ shorthand flags ------------------------------------------------------

GUIDE_SCRIPT = (
    "python3 -m vllm.entrypoints.openai.api_server --port 8080 --model /mnt/models/target \\\n"
    "  --speculative-config '%s'\n" % json.dumps(EAGLE3))


@pytest.mark.parametrize("flag", sorted(core.REMOVED_FLAGS))
def test_removed_flags_are_refused_in_argv_and_scripts(flag):
    with pytest.raises(ValidationError) as info:
        core.check_command(["python3", "-m", "vllm.entrypoints.openai.api_server", flag, "x"])
    assert str(info.value).startswith("command:") and flag in str(info.value)
    with pytest.raises(ValidationError):
        core.check_command(["bash", "-c", "exec vllm serve /m %s=3 --port 8080" % flag])


def test_guide_command_passes_and_lookalikes_do_not_trip():
    assert core.check_command(["bash", "-c", GUIDE_SCRIPT]) == []
    # A path or a value that merely contains the text is not the flag.
    assert core.check_command(["vllm", "serve", "/models/x--speculative-model-y", "--served-model-name", "a"]) == []


def test_check_command_reads_flags_as_words_of_the_vllm_command():
    # text that is not a word of vLLM's command does not trip (the old text regex refused all three)
    assert core.check_command(["bash", "-c", "echo 'no --speculative-model here'\nexec vllm serve /m # --num-speculative-tokens 5"]) == []
    assert core.check_command(["vllm", "serve", "/m", "--override-generation-config", '{"x": "a --spec-method b"}'],
                              vllm_version="0.11.0") == []
    # one shell line: the bash -c script inside it is read too; the registry name is reported for the _ spelling
    with pytest.raises(ValidationError, match=r"^command: uses --ngram-prompt-lookup-max, which vLLM no longer has"):
        core.check_command("bash -c 'exec vllm serve /m --ngram_prompt_lookup_max 4'")
    with pytest.raises(ValidationError, match=r"^extra_args: uses --spec-tokens, which exists only from vLLM 0.22 \(you target 0.11.0,"):
        core.check_command(["--spec_tokens=3"], vllm_version="0.11.0", field="extra_args")


def test_shorthand_flags_need_022_and_must_not_duplicate_json_keys():
    # vLLM 0.22.0 vllm/engine/arg_utils.py add_cli_args: vllm_group.add_argument("--spec-method", **speculative_kwargs["method"])
    cmd = ["vllm", "serve", "/m", "--spec-method", "ngram"]
    with pytest.raises(ValidationError) as info:
        core.check_command(cmd, vllm_version="0.21.0")
    assert "only from vLLM 0.22" in str(info.value)
    assert core.check_command(cmd, vllm_version="0.22.0", config={"num_speculative_tokens": 3}) == []
    with pytest.raises(ValidationError) as info:
        core.check_command(cmd, vllm_version="0.22.0", config={"method": "ngram"})
    assert "--spec-method" in str(info.value) and "'method'" in str(info.value)
