"""The draft preflight's checks (plugins/module_utils/vllm/draft_preflight.py) on the config.json shapes of real model
families, each positive and negative, and on the tiny checkpoints the e2e tier serves with vLLM 0.32.

The configs copy the keys the checks read from the published config.json of each model (Hugging Face hub pages of
meta-llama/Llama-3.1-8B-Instruct, meta-llama/Llama-3.2-1B-Instruct, Qwen/Qwen2.5-7B-Instruct, Qwen/Qwen2.5-0.5B-Instruct,
Qwen/Qwen3-8B, Qwen/Qwen3-0.6B, deepseek-ai/DeepSeek-V3, Qwen/Qwen3-Next-80B-A3B-Instruct, yuhuili/EAGLE3-LLaMA3.1-Instruct-8B,
RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3).
"""

import copy
import glob
import hashlib
import json
import os

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import model_metadata
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import draft_preflight as P

LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
               "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
               "num_hidden_layers": 32, "vocab_size": 128256, "tie_word_embeddings": False}
LLAMA_32_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
               "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
               "num_hidden_layers": 16, "vocab_size": 128256, "tie_word_embeddings": True}
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "bos_token_id": 151643, "eos_token_id": 151645,
             "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
             "num_hidden_layers": 28, "vocab_size": 152064, "tie_word_embeddings": False}
QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "bos_token_id": 151643, "eos_token_id": 151645,
              "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
              "num_hidden_layers": 24, "vocab_size": 151936, "tie_word_embeddings": True}
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "bos_token_id": 151643, "eos_token_id": 151645,
            "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "num_hidden_layers": 36, "vocab_size": 151936, "tie_word_embeddings": False}
QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "bos_token_id": 151643, "eos_token_id": 151645,
             "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "num_hidden_layers": 28, "vocab_size": 151936, "tie_word_embeddings": True}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "intermediate_size": 18432, "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "vocab_size": 129280,
               "first_k_dense_replace": 3, "n_routed_experts": 256}
QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
              "num_hidden_layers": 48, "vocab_size": 151936}
EAGLE3_LLAMA31 = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "bos_token_id": 128000, "eos_token_id": 128001,
                  "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "num_hidden_layers": 1, "vocab_size": 128256, "draft_vocab_size": 32000, "tie_word_embeddings": False}
EAGLE3_TENSORS = ["d2t", "fc.weight", "lm_head.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
                  "midlayer.self_attn.q_proj.weight", "norm.weight", "t2d"]
SPECULATOR_LLAMA31 = {
    "architectures": ["Eagle3Speculator"], "auto_map": {"": "eagle3.Eagle3SpeculatorConfig"}, "draft_vocab_size": 32000,
    "norm_before_residual": True, "target_hidden_size": None, "torch_dtype": "bfloat16",
    "speculators_model_type": "eagle3", "speculators_version": "0.1.0.dev13",
    "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                           "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": 3,
                                                 "verifier_accept_k": 1}],
                           "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}},
    "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                                 "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                                 "num_hidden_layers": 1, "vocab_size": 128256},
}


def ck(config, where, tensors=None, tokenizer=None, total_size=None):
    return P.checkpoint(copy.deepcopy(config), where, tokenizer=tokenizer, tensors=tensors, total_size=total_size)


def status(result, name):
    return [c["status"] for c in result["checks"] if c["check"] == name]


def show(result):
    print(json.dumps({"checks": [(c["check"], c["status"], c["message"]) for c in result["checks"]], "figures": result["figures"]}, indent=1))


# --- draft_model ----------------------------------------------------------------------------------------------------

def test_llama_31_8b_with_llama_32_1b_draft_passes():
    res = P.run("draft_model", ck(LLAMA_31_8B, "/m/target"), ck(LLAMA_32_1B, "/m/draft"), {"num_speculative_tokens": 3})
    show(res)
    assert res["passed"] and res["errors"] == []
    assert status(res, "vocabulary") == ["passed"] and status(res, "size") == ["passed"]
    assert res["figures"]["target"]["vocab_size"] == 128256 and res["figures"]["draft"]["num_hidden_layers"] == 16


def test_qwen25_7b_with_qwen25_05b_draft_is_refused_for_its_vocabulary():
    # The published pair differs: 152064 vs 151936 (vLLM: "Target and draft model should have the same vocabulary size").
    res = P.run("draft_model", ck(QWEN25_7B, "/m/qwen7b"), ck(QWEN25_05B, "/m/qwen05b"), {"num_speculative_tokens": 3})
    assert not res["passed"] and status(res, "vocabulary") == ["failed"]
    msg = res["errors"][0]
    assert "/m/qwen05b/config.json vocab_size" in msg and "151936" in msg and "152064" in msg and "Fix:" in msg, msg
    with pytest.raises(ValidationError) as err:
        P.enforce(res, "require")
    assert "151936" in str(err.value) and err.value.field == "preflight"
    assert any("151936" in w for w in P.enforce(res, "warn"))


def test_heterogeneous_vocab_is_not_compared():
    res = P.run("draft_model", ck(QWEN25_7B, "/t"), ck(QWEN25_05B, "/d"), {"use_heterogeneous_vocab": True})
    assert res["passed"] and status(res, "vocabulary") == ["not checked"]


def test_qwen3_8b_with_qwen3_06b_passes_and_a_draft_as_big_as_its_target_is_a_warning():
    res = P.run("draft_model", ck(QWEN3_8B, "/t"), ck(QWEN3_06B, "/d"))
    assert res["passed"] and status(res, "size") == ["passed"]
    same = P.run("draft_model", ck(QWEN3_8B, "/t"), ck(QWEN3_8B, "/d"))
    assert same["passed"] and status(same, "size") == ["warning"] and "not smaller" in same["warnings"][0]


def test_draft_with_another_tokenizer_is_a_warning():
    draft = dict(QWEN3_06B, vocab_size=151936)
    res = P.run("draft_model", ck(QWEN3_8B, "/t", tokenizer={"tokenizer_class": "Qwen2Tokenizer"}),
                ck(draft, "/d", tokenizer={"tokenizer_class": "LlamaTokenizerFast"}))
    assert res["passed"] and status(res, "tokenizer") == ["warning"] and "LlamaTokenizerFast" in res["warnings"][0]
    res = P.run("draft_model", ck(LLAMA_31_8B, "/t"), ck(dict(LLAMA_32_1B, bos_token_id=1), "/d"))
    assert status(res, "tokenizer") == ["warning"] and "bos_token_id 1" in res["warnings"][0]


# --- EAGLE-3 ---------------------------------------------------------------------------------------------------------

def test_yuhuili_eagle3_head_on_llama_31_8b_uses_the_default_layers_and_its_d2t_map():
    res = P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(EAGLE3_LLAMA31, "/d", tensors=EAGLE3_TENSORS), {"num_speculative_tokens": 3})
    show(res)
    assert res["passed"], res["errors"]
    assert res["figures"]["draft"]["aux_layer_ids"] == [2, 16, 29]  # (2, 32 // 2, 32 - 3)
    assert status(res, "vocabulary maps") == ["passed"] and status(res, "hidden size") == ["passed"]


def test_eagle3_head_without_its_d2t_map_is_refused():
    tensors = [t for t in EAGLE3_TENSORS if t not in ("d2t", "t2d")]
    res = P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(EAGLE3_LLAMA31, "/d", tensors=tensors))
    assert status(res, "vocabulary maps") == ["failed"]
    assert "32000" in res["errors"][0] and "128256" in res["errors"][0] and "d2t" in res["errors"][0]
    unread = P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(EAGLE3_LLAMA31, "/d", tensors=None))
    assert unread["passed"] and status(unread, "vocabulary maps") == ["not checked"]


def test_llama_eagle3_head_on_qwen3_8b_is_refused_for_hidden_size_then_fine_on_its_own_target():
    head = dict(EAGLE3_LLAMA31, hidden_size=4096)
    res = P.run("eagle3", ck(QWEN25_7B, "/t"), ck(head, "/d", tensors=EAGLE3_TENSORS))
    assert status(res, "hidden size") == ["failed"]
    assert "4096" in res["errors"][0] and "3584" in res["errors"][0], res["errors"]


def test_aux_layer_ids_beyond_the_target_are_refused_and_within_pass():
    head = dict(EAGLE3_LLAMA31, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 23, 44]})
    res = P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(head, "/d", tensors=EAGLE3_TENSORS))
    assert status(res, "aux layers") == ["failed"]
    msg = res["errors"][0]
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in msg and "[44]" in msg and "32 layers" in msg and "0..32" in msg, msg
    head = dict(EAGLE3_LLAMA31, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 16, 32]})
    assert P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(head, "/d", tensors=EAGLE3_TENSORS))["passed"]


def test_top_level_aux_ids_win_over_eagle_config_as_vllms_runner_reads_them():
    head = dict(EAGLE3_LLAMA31, eagle_aux_hidden_state_layer_ids=[2, 18, 33],
                eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 16, 29]})
    res = P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(head, "/d", tensors=EAGLE3_TENSORS))
    assert status(res, "aux layers") == ["failed"] and "[33]" in res["errors"][0]


def test_duplicate_aux_ids_give_fewer_states_than_the_fc_takes():
    head = dict(EAGLE3_LLAMA31, eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 2, 29]})
    res = P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(head, "/d", tensors=EAGLE3_TENSORS))
    assert status(res, "aux layers") == ["failed"] and "3 hidden states" in res["errors"][0]


def test_eagle3_architecture_vllm_does_not_know_is_refused():
    head = dict(EAGLE3_LLAMA31, architectures=["Qwen2ForCausalLM"])
    res = P.run("eagle3", ck(QWEN25_7B, "/t"), ck(dict(head, hidden_size=3584, vocab_size=152064, draft_vocab_size=None), "/d"))
    assert status(res, "architecture") == ["failed"] and "Eagle3Qwen2ForCausalLM" in res["errors"][0]
    # Qwen3 heads are known (Eagle3Qwen3ForCausalLM)
    head = dict(head, architectures=["Qwen3ForCausalLM"], hidden_size=4096, vocab_size=151936)
    assert P.run("eagle3", ck(QWEN3_8B, "/t"), ck(head, "/d"))["passed"]


def test_eagle1_method_on_an_eagle3_head_is_refused():
    res = P.run("eagle", ck(LLAMA_31_8B, "/t"), ck(EAGLE3_LLAMA31, "/d", tensors=EAGLE3_TENSORS))
    assert status(res, "architecture") == ["failed"] and "EagleLlamaForCausalLMEagle3" in res["errors"][0]


# --- speculators format ------------------------------------------------------------------------------------------------

def test_redhat_speculator_on_llama_31_8b_passes_with_its_trained_k():
    res = P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(SPECULATOR_LLAMA31, "/d", tensors=EAGLE3_TENSORS), {"num_speculative_tokens": 3})
    show(res)
    assert res["passed"], res["errors"]
    assert res["figures"]["draft"]["trained_k"] == 3 and res["figures"]["draft"]["speculators_version"] == "0.1.0.dev13"
    assert res["figures"]["draft"]["hidden_size"] == 4096 and res["figures"]["draft"]["aux_layer_ids"] == [2, 16, 29]
    assert status(res, "speculators format") == ["passed"] and status(res, "verifier") == ["passed"]


def test_speculator_k_above_trained_is_a_warning_not_a_refusal_in_032():
    res = P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(SPECULATOR_LLAMA31, "/d", tensors=EAGLE3_TENSORS), {"num_speculative_tokens": 5})
    assert res["passed"] and status(res, "trained k") == ["warning"] and "exceeds the 3" in res["warnings"][0]


def test_speculator_for_another_verifier_and_method_and_structure():
    res = P.run("eagle3", ck(QWEN3_8B, "/t"), ck(SPECULATOR_LLAMA31, "/d", tensors=EAGLE3_TENSORS))
    assert status(res, "verifier") == ["warning"] and status(res, "hidden size") == ["passed"]
    assert status(res, "vocabulary maps") == ["passed"]  # 32000 with d2t
    wrong_method = P.run("draft_model", ck(LLAMA_31_8B, "/t"), ck(SPECULATOR_LLAMA31, "/d"))
    assert status(wrong_method, "speculators method") == ["failed"] and "set method: eagle3" in wrong_method["errors"][0]
    broken = copy.deepcopy(SPECULATOR_LLAMA31)
    del broken["speculators_config"]["verifier"]
    res = P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(broken, "/d"))
    assert status(res, "speculators format") == ["failed"] and "Invalid speculators config structure" in res["errors"][0]
    unknown = dict(copy.deepcopy(SPECULATOR_LLAMA31), speculators_model_type="medusa")
    assert "speculators_model_type" in P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(unknown, "/d"))["errors"][0]
    mistral = copy.deepcopy(SPECULATOR_LLAMA31)
    mistral["transformer_layer_config"]["model_type"] = "mistral"
    assert "Unsupported model_type" in P.run("eagle3", ck(LLAMA_31_8B, "/t"), ck(mistral, "/d"))["errors"][0]


def test_no_method_with_a_speculator_is_the_speculators_method():
    res = P.run(None, ck(LLAMA_31_8B, "/t"), ck(SPECULATOR_LLAMA31, "/d", tensors=EAGLE3_TENSORS))
    assert res["method"] == "eagle3" and res["passed"]


# --- MTP -------------------------------------------------------------------------------------------------------------

def test_deepseek_v3_mtp_k_within_and_beyond_its_layers():
    res = P.run("deepseek_mtp", ck(DEEPSEEK_V3, "/t"), None, {"num_speculative_tokens": 1})
    assert res["method"] == "mtp" and res["passed"] and res["figures"]["target_mtp"]["mtp_layers"] == 1
    # k=3 > n_predict=1 and divisible: vLLM runs the one layer three times, with a warning
    res = P.run("mtp", ck(DEEPSEEK_V3, "/t"), None, {"num_speculative_tokens": 3})
    assert res["passed"] and status(res, "mtp layers") == ["warning"]
    two = dict(DEEPSEEK_V3, num_nextn_predict_layers=2)
    res = P.run("mtp", ck(two, "/t"), None, {"num_speculative_tokens": 3})
    assert status(res, "mtp layers") == ["failed"] and "divisible by n_predict=2" in res["errors"][0]


def test_deepseek_v3_without_mtp_layers_and_a_llama_target_are_refused():
    stripped = {k: v for k, v in DEEPSEEK_V3.items() if k != "num_nextn_predict_layers"}
    res = P.run("mtp", ck(stripped, "/t"), None, {"num_speculative_tokens": 1})
    assert status(res, "mtp layers") == ["failed"] and "num_nextn_predict_layers is absent" in res["errors"][0]
    res = P.run("mtp", ck(LLAMA_31_8B, "/t"), None, {"num_speculative_tokens": 1})
    assert status(res, "mtp layers") == ["failed"] and "Unsupported speculative method" in res["errors"][0]


def test_qwen3_next_mtp_defaults_to_one_layer():
    res = P.run("qwen3_next_mtp", ck(QWEN3_NEXT, "/t"), None, {"num_speculative_tokens": 2})
    assert res["passed"] and res["figures"]["target_mtp"] == {"family": "Qwen3-Next MTP", "key": "num_nextn_predict_layers", "mtp_layers": 1}


# --- methods without a draft, modes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_methods_without_a_draft_open_nothing(method):
    res = P.run(method, None, None)
    assert res["passed"] and res["checks"][0]["status"] == "not checked" and "nothing to open" in res["checks"][0]["message"]


def test_enforce_modes_and_other_releases():
    res = P.run("draft_model", ck(QWEN25_7B, "/t"), ck(QWEN25_05B, "/d"), vllm_version="0.33.0")
    assert any("read from vLLM 0.32.0" in w for w in res["warnings"])
    with pytest.raises(ValidationError):
        P.enforce(res, "sometimes")


def test_one_refusal_carries_its_own_fix_once():
    """A single refusal's fix is the error's fix (one "Fix:" in the message); several refusals keep each fix in its text."""
    one = {"errors": ["a.json x: 3 is not 4. Fix: set x to 4."], "warnings": [], "rules_from_vllm": "0.32.0"}
    with pytest.raises(ValidationError) as exc:
        P.enforce(one, "require")
    assert str(exc.value).count("Fix:") == 1 and exc.value.hint == "set x to 4; or set spec_decoding_preflight: warn to roll out anyway"
    two = dict(one, errors=one["errors"] + ["b.json y: 1. Fix: set y."])
    with pytest.raises(ValidationError) as exc:
        P.enforce(two, "require")
    assert "Fix: set x to 4.; also: b.json y: 1. Fix: set y." in str(exc.value) and "as each message says" in exc.value.hint


# --- the tiny checkpoints the e2e tier serves with vLLM 0.32 ---------------------------------------------------------

def _tiny():
    script = os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e", "make_tiny_checkpoints.py")
    with open(script, "rb") as fh:
        key = hashlib.sha256(fh.read()).hexdigest()[:16]
    root = os.path.expanduser("~/.cache/alauda-spec-decoding/tiny-checkpoints-%s" % key)
    if not os.path.exists(os.path.join(root, ".complete")):
        pytest.skip("the tiny checkpoints are not built (the e2e tier builds them: tests/e2e/vllm_harness.ensure_checkpoints); "
                    "found: %s" % glob.glob(os.path.expanduser("~/.cache/alauda-spec-decoding/tiny-checkpoints-*")))
    return root


def test_tiny_checkpoints_good_pair_passes_and_a_head_reading_a_missing_layer_is_refused(tmp_path):
    root = _tiny()
    target = model_metadata.read_location(os.path.join(root, "target"))
    head = model_metadata.read_location(os.path.join(root, "eagle3"))
    draft = model_metadata.read_location(os.path.join(root, "draft"))
    assert target["files_read"] == ["config.json", "tokenizer_config.json", "model.safetensors (header)"]
    good = P.run("eagle3", target, head, {"num_speculative_tokens": 3})
    show(good)
    assert good["passed"] and good["figures"]["draft"]["aux_layer_ids"] == [0, 1, 2]
    assert P.run("draft_model", target, draft, {"num_speculative_tokens": 3})["passed"]
    # The head as facts.md says it kills vLLM 0.32's engine at the first request: ids beyond the 2-layer target.
    bad_dir = tmp_path / "eagle3-bad"
    bad_dir.mkdir()
    config = dict(head["config"])
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}
    (bad_dir / "config.json").write_text(json.dumps(config))
    bad = P.run("eagle3", target, model_metadata.read_location(str(bad_dir)), {"num_speculative_tokens": 3})
    assert not bad["passed"] and "[3] do not exist in the target's 2 layers" in bad["errors"][0], bad["errors"]
    # No ids at all: vLLM's default (2, 1, -1) for 2 layers, -1 does not exist.
    del config["eagle_config"]
    (bad_dir / "config.json").write_text(json.dumps(config))
    default = P.run("eagle3", target, model_metadata.read_location(str(bad_dir)))
    assert not default["passed"] and "[2, 1, -1]" in default["errors"][0]
