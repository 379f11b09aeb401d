"""Build tiny random checkpoints for the real-vLLM end-to-end tests, offline and deterministically.

Runs inside the vLLM venv (it needs torch, transformers, tokenizers, safetensors), never touches a hub:

    <vllm-venv>/bin/python tests/e2e/make_tiny_checkpoints.py OUT_DIR

writes three model folders under OUT_DIR:

- ``target/``  ``LlamaForCausalLM``, 2 layers, hidden 256, vocab 4096, float32, random weights (seed 1234), and
  a byte-level BPE tokenizer trained here with ``tokenizers`` on a generated corpus, plus a chat template;
- ``draft/``   an exact copy of ``target/`` (a ``draft_model`` drafter that always agrees with the target:
  greedy acceptance is 100%);
- ``eagle3/``  a random EAGLE-3 head (``LlamaForCausalLMEagle3``, one decoder layer whose attention takes
  2 x hidden, ``fc`` fusing 3 target hidden states, own ``lm_head``), so greedy acceptance is about 0%.
  For a 2-layer target, vLLM 0.32 needs ``eagle_config.eagle_aux_hidden_state_layer_ids = [0, 1, 2]``,
  else the first request kills the engine (facts.md section 4).

The harness (tests/e2e/vllm_harness.py) caches the result under ``~/.cache/alauda-spec-decoding/`` keyed by
this file's content, so any edit here rebuilds. A ``.complete`` marker is written last.
"""
import json
import os
import random
import shutil
import sys

SEED = 1234
HIDDEN = 256
INTERMEDIATE = 512
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
VOCAB = 4096
MAX_POS = 2048
DTYPE = "float32"  # bf16 gave 167/168 for an exact-copy draft (rounding differs between 1-token and k+1-token passes)
SPECIALS = ["<s>", "<unk>", "</s>"]  # ids 0, 1, 2: bos 0, unk 1, eos 2
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORDS = (
    "the quick brown fox jumps over lazy dog speculative decoding draft target model token accept reject "
    "engine server request response latency throughput batch cache memory kernel tensor layer hidden "
    "attention head vocabulary prompt output stream metric counter gauge histogram label value window "
    "def return class import from self none true false if else elif for while in not and or with as "
    "print len range list dict set tuple int str float bool open read write close yield lambda pass"
).split()
_SYLLABLES = "ka ri to mu ne so la pe di vo zu ha ki ta ro me na si lu po de va zo hu".split()


def corpus(seed=SEED, lines=6000):
    """A generated, deterministic text corpus: English-like words, code-like lines and random syllable words."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        kind = i % 3
        if kind == 0:
            out.append(" ".join(rng.choice(_WORDS) for _i in range(rng.randint(6, 16))) + ".")
        elif kind == 1:
            name = "".join(rng.choice(_SYLLABLES) for _i in range(rng.randint(1, 3)))
            out.append("def %s(a, b):\n    return a %s b  # %d" % (name, rng.choice("+-*/%"), rng.randint(0, 999)))
        else:
            out.append(" ".join("".join(rng.choice(_SYLLABLES) for _j in range(rng.randint(1, 4)))
                                for _i in range(rng.randint(4, 12))))
    return out


def build_tokenizer(out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # pylint: disable=import-outside-toplevel
    from transformers import PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1, show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    size = tok.get_vocab_size()
    if size != VOCAB:
        raise SystemExit("tokenizer: trained vocabulary has %d tokens, the model needs exactly %d; enlarge the corpus" % (size, VOCAB))
    for want, token in enumerate(SPECIALS):
        if tok.token_to_id(token) != want:
            raise SystemExit("tokenizer: special token %s got id %s, expected %d" % (token, tok.token_to_id(token), want))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = MAX_POS
    fast.save_pretrained(out_dir)
    # Some transformers versions keep the template only in tokenizer_config.json, others only in
    # chat_template.jinja; write both so any loader finds it.
    with open(os.path.join(out_dir, "chat_template.jinja"), "w", encoding="utf-8") as handle:
        handle.write(CHAT_TEMPLATE)
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as handle:
        cfg = json.load(handle)
    cfg["chat_template"] = CHAT_TEMPLATE
    with open(cfg_path, "w", encoding="utf-8") as handle:
        json.dump(cfg, handle, indent=2, sort_keys=True)


def llama_config_dict():
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "vocab_size": VOCAB,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "tie_word_embeddings": False,
        "torch_dtype": DTYPE,
        "initializer_range": 0.02,
    }


def build_target(out_dir):
    import torch  # pylint: disable=import-outside-toplevel
    from transformers import LlamaConfig, LlamaForCausalLM  # pylint: disable=import-outside-toplevel

    torch.manual_seed(SEED)
    config = LlamaConfig(**{k: v for k, v in llama_config_dict().items() if k not in ("architectures", "model_type", "torch_dtype")})
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).to(getattr(torch, DTYPE))
    model.save_pretrained(out_dir, safe_serialization=True)
    # Pin the config exactly (transformers versions differ in what they write, e.g. dtype vs torch_dtype).
    cfg = llama_config_dict()
    cfg["dtype"] = DTYPE
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(cfg, handle, indent=2, sort_keys=True)
    build_tokenizer(out_dir)


def eagle3_config_dict():
    cfg = llama_config_dict()
    cfg.update({
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "draft_vocab_size": VOCAB,
        # Layer ids whose hidden states the target hands to the head; [0, 1, 2] for a 2-layer target.
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
    })
    return cfg


def eagle3_state_dict():
    """Weights named as EAGLE-3 checkpoints name them (vLLM maps ``midlayer.`` to its single layer)."""
    import torch  # pylint: disable=import-outside-toplevel

    gen = torch.Generator().manual_seed(SEED + 3)
    dtype = getattr(torch, DTYPE)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(dtype)

    def ones(n):
        return torch.ones(n, dtype=dtype)

    q_out, kv_out = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    return {
        "fc.weight": rand(HIDDEN, 3 * HIDDEN),
        "midlayer.hidden_norm.weight": ones(HIDDEN),
        "midlayer.input_layernorm.weight": ones(HIDDEN),
        "midlayer.self_attn.q_proj.weight": rand(q_out, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": rand(kv_out, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": rand(kv_out, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": rand(HIDDEN, q_out),
        "midlayer.post_attention_layernorm.weight": ones(HIDDEN),
        "midlayer.mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN),
        "midlayer.mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN),
        "midlayer.mlp.down_proj.weight": rand(HIDDEN, INTERMEDIATE),
        "norm.weight": ones(HIDDEN),
        "lm_head.weight": rand(VOCAB, HIDDEN),
    }


def build_eagle3(out_dir):
    from safetensors.torch import save_file  # pylint: disable=import-outside-toplevel

    os.makedirs(out_dir, exist_ok=True)
    save_file(eagle3_state_dict(), os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(eagle3_config_dict(), handle, indent=2, sort_keys=True)


def build_all(out_root):
    target = os.path.join(out_root, "target")
    build_target(target)
    shutil.copytree(target, os.path.join(out_root, "draft"))
    build_eagle3(os.path.join(out_root, "eagle3"))
    with open(os.path.join(out_root, ".complete"), "w", encoding="utf-8") as handle:
        json.dump({"seed": SEED, "vocab": VOCAB, "hidden": HIDDEN, "layers": LAYERS, "dtype": DTYPE}, handle)


def main(argv):
    if len(argv) != 2:
        raise SystemExit("usage: make_tiny_checkpoints.py OUT_DIR")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out_root = argv[1]
    if os.path.exists(out_root) and os.listdir(out_root):
        raise SystemExit("refusing to build into non-empty %s" % out_root)
    os.makedirs(out_root, exist_ok=True)
    build_all(out_root)
    print(out_root)


if __name__ == "__main__":
    main(sys.argv)
