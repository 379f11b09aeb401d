# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight of a draft against its target: the checks vLLM makes (or crashes on) when it loads the pair, run on the
checkpoints' small metadata (config.json, tokenizer_config.json, tensor names) before anything is written.

Every rule names the vLLM function it follows, read in vLLM 0.32.0 (``vllm/config/speculative.py``,
``vllm/model_executor/models/llama_eagle3.py``, ``vllm/v1/worker/gpu_model_runner.py``,
``vllm/transformers_utils/configs/speculators/``); the speculators format is vllm-project/speculators' ``config.json``
(``speculators_model_type``, ``speculators_version``, ``speculators_config``) as vLLM reads it. A checkpoint is a dict:
``{"where": location, "config": config.json, "tokenizer": tokenizer_config.json or None, "tensors": [names] or None,
"total_size": bytes or None}`` (artifacts/model_metadata.py reads them). docs/preflight.md lists the checks.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

RULES_RELEASE = "0.32.0"
MODES = ("require", "warn", "off")
NO_DRAFT_METHODS = ("ngram", "ngram_gpu", "suffix", "custom_class", "extract_hidden_states", "none")
# Methods whose draft rules this preflight has not taken from vLLM yet: said so in the result, never refused.
UNCHECKED_METHODS = ("dflash", "dspark", "medusa", "mlp_speculator")

# vLLM 0.32 model_executor/models/registry.py _SPECULATIVE_DECODING_MODELS: the draft architectures an EAGLE / EAGLE-3
# head may end with after transformers_utils/configs/eagle.py EAGLEConfig renames it.
EAGLE_ARCHITECTURES = ("EagleCohereForCausalLM", "EagleLlamaForCausalLM", "EagleLlama4ForCausalLM", "EagleMiniCPMForCausalLM",
                       "EagleMistralForCausalLM", "EagleMistralLarge3ForCausalLM", "EagleDeepSeekMTPModel")
EAGLE3_ARCHITECTURES = ("Eagle3LlamaForCausalLM", "Eagle3MiniMaxM2ForCausalLM", "LlamaForCausalLMEagle3", "Eagle3Qwen2_5vlForCausalLM",
                        "Eagle3Qwen3vlForCausalLM", "Eagle3Qwen3ForCausalLM", "PEagleDraftModel", "PeagleLlamaForCausalLM",
                        "PeagleQwen3ForCausalLM", "Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
# Target architectures whose vLLM 0.32 model class implements SupportsEagle3 (registry.py entries whose class, or a base
# class, lists SupportsEagle3; the text-generation ones). Another target: gpu_model_runner._setup_eagle3_aux_hidden_state_outputs
# raises "Model does not support EAGLE3 interface".
EAGLE3_TARGETS = frozenset((
    "AfmoeForCausalLM", "ApertusForCausalLM", "Cohere2MoeForCausalLM", "DeepseekForCausalLM", "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM", "Ernie4_5ForCausalLM", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "GlmMoeDsaForCausalLM",
    "GptOssForCausalLM", "GraniteForCausalLM", "InternLM3ForCausalLM", "KimiK25ForConditionalGeneration", "LLaMAForCausalLM",
    "Llama4ForCausalLM", "Llama4ForConditionalGeneration", "LlamaForCausalLM", "LlavaForConditionalGeneration", "MiMoForCausalLM",
    "MiMoV2FlashForCausalLM", "MiniCPM3ForCausalLM", "MiniCPMForCausalLM", "MiniMaxM2ForCausalLM", "Ministral3ForCausalLM",
    "Mistral3ForConditionalGeneration", "MistralForCausalLM", "MistralLarge3ForCausalLM", "NemotronHForCausalLM",
    "Phi3ForCausalLM", "PixtralForConditionalGeneration", "Qwen2ForCausalLM", "Qwen2_5_VLForConditionalGeneration",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "Step1ForCausalLM"))
# vLLM 0.32 transformers_utils/configs/speculators/algos.py SUPPORTED_SPECULATORS_TYPES, and the method
# SpeculatorsConfig.build_vllm_speculative_config makes of each.
SPECULATORS_METHODS = {"eagle3": "eagle3", "peagle": "eagle3", "dflash": "dflash", "dflash2": "dflash", "dspark": "dspark"}
# algos.update_eagle3 / update_peagle: transformer_layer_config.model_type -> the head's architecture.
SPECULATORS_EAGLE3_ARCH = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}

# vLLM 0.32 SpeculativeConfig.hf_config_override: the target families it turns into an MTP draft, the key it reads the
# number of MTP layers from (n_predict) and what the MTP model class uses when the key is absent (None: the model reads
# the key unconditionally, e.g. deepseek_mtp.py DeepSeekMultiTokenPredictor, so a config without it cannot load).
# Matched on model_type, or on architectures[0] where vLLM matches the architecture.
MTP_FAMILIES = (
    # (match kind, names, family, key, default when absent)
    ("model_type", ("deepseek_v3", "deepseek_v32", "glm_moe_dsa", "deepseek_mtp", "deepseek_v4"), "DeepSeek MTP", "num_nextn_predict_layers", None),
    ("model_type", ("pangu_ultra_moe", "pangu_ultra_moe_mtp"), "openPangu MTP", "num_nextn_predict_layers", None),
    ("model_type", ("ernie4_5_moe", "ernie_mtp"), "ERNIE MTP", "num_nextn_predict_layers", None),
    ("model_type", ("qwen3_next", "qwen3_next_mtp"), "Qwen3-Next MTP", "num_nextn_predict_layers", 1),
    ("model_type", ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"), "Qwen3.5 MTP", "mtp_num_hidden_layers", 1),
    ("model_type", ("longcat_flash",), "LongCat-Flash MTP", "num_nextn_predict_layers", 1),
    ("model_type", ("exaone_moe", "exaone_moe_mtp"), "EXAONE MoE MTP", "num_nextn_predict_layers", None),
    ("model_type", ("hy_v3", "hy_v3_mtp"), "Hunyuan V3 MTP", "num_nextn_predict_layers", None),
    ("model_type", ("step3p5", "step3p7"), "Step-3.5 MTP", "num_nextn_predict_layers", 1),
    ("model_type", ("nemotron_h", "nemotron_h_puzzle", "nemotron_h_mtp"), "Nemotron-H MTP", "num_nextn_predict_layers", 0),
    ("model_type", ("dots3_note",), "dots3 MTP", "num_nextn_predict_layers", 1),
    ("architecture", ("MiMoForCausalLM",), "MiMo MTP", "num_nextn_predict_layers", None),
    ("architecture", ("Glm4MoeForCausalLM",), "GLM-4.5 MTP", "num_nextn_predict_layers", None),
    ("architecture", ("Glm4MoeLiteForCausalLM",), "GLM-4.5 Lite MTP", "num_nextn_predict_layers", None),
    ("architecture", ("GlmOcrForConditionalGeneration",), "GLM-OCR MTP", "num_nextn_predict_layers", None),
)
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")


def checkpoint(config, where, tokenizer=None, tensors=None, total_size=None):
    """The metadata of one checkpoint as the checks read it."""
    return {"where": where, "config": dict(config or {}), "tokenizer": tokenizer, "tensors": tensors, "total_size": total_size}


def _text(cfg, key, default=None):
    """A key of config.json, or of its ``text_config`` (multimodal checkpoints; vLLM's get_hf_text_config)."""
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    text = cfg.get("text_config")
    if isinstance(text, dict) and text.get(key) is not None:
        return text[key]
    return default


def _arch(cfg):
    archs = cfg.get("architectures") or []
    return archs[0] if archs and isinstance(archs, list) else None


def _file(ckpt, name="config.json"):
    return "%s/%s" % (str(ckpt.get("where") or "?").rstrip("/"), name)


class Preflight:
    """The checks' record: what was checked (with figures), refusals (errors vLLM would refuse or crash on), warnings."""

    def __init__(self, method, k):
        self.method = method
        self.k = k
        self.checks = []
        self.errors = []
        self.warnings = []
        self.figures = {}

    def passed(self, name, message, **figures):
        self.checks.append({"check": name, "status": "passed", "message": message, "figures": figures})

    def note(self, name, message, **figures):
        """A check that did not run, and why."""
        self.checks.append({"check": name, "status": "not checked", "message": message, "figures": figures})

    def refuse(self, name, ckpt, key, message, hint, file_name="config.json"):
        """What vLLM refuses at start or crashes on at the first request: it stops the rollout under ``require``."""
        error = ValidationError(message, field="%s %s" % (_file(ckpt, file_name), key), hint=hint)
        self.errors.append(error)
        self.checks.append({"check": name, "status": "failed", "message": str(error), "figures": {}})

    def warn(self, name, ckpt, key, message, hint, file_name="config.json"):
        """What vLLM runs with but that is likely wrong (no speed-up, low acceptance): never stops the rollout."""
        text = str(ValidationError(message, field="%s %s" % (_file(ckpt, file_name), key), hint=hint))
        self.warnings.append(text)
        self.checks.append({"check": name, "status": "warning", "message": text, "figures": {}})

    def result(self):
        return {"method": self.method, "num_speculative_tokens": self.k, "rules_from_vllm": RULES_RELEASE,
                "checks": self.checks, "figures": self.figures, "errors": [str(e) for e in self.errors],
                "warnings": list(self.warnings), "passed": not self.errors}


def _figures(cfg):
    return {"architecture": _arch(cfg), "model_type": cfg.get("model_type"), "num_hidden_layers": _text(cfg, "num_hidden_layers"),
            "hidden_size": _text(cfg, "hidden_size"), "vocab_size": _text(cfg, "vocab_size")}


def normalized_method(method, draft):
    """The method vLLM runs for the names written: every ``*_mtp`` alias is mtp (SpeculativeConfig.__post_init__); no
    method with a speculators checkpoint is that checkpoint's (maybe_override_with_speculators); else draft_model."""
    if method and method.endswith("_mtp"):
        return "mtp"
    if method in ("[ngram]",):
        return "ngram"
    if not method:
        spec_type = (draft or {}).get("config", {}).get("speculators_model_type") if draft else None
        return SPECULATORS_METHODS.get(spec_type, "draft_model")
    return method


def run(method, target, draft=None, speculative=None, vllm_version=None):
    """Check ``draft`` against ``target`` for ``method``; returns the result dict (``errors`` empty when vLLM would load
    the pair). ``speculative``: the ``--speculative-config`` keys (``num_speculative_tokens``, ``use_heterogeneous_vocab``)."""
    speculative = dict(speculative or {})
    k = speculative.get("num_speculative_tokens")
    method = normalized_method(method, draft)
    pre = Preflight(method, k)
    if vllm_version and not str(vllm_version).startswith(RULES_RELEASE.rsplit(".", 1)[0]):
        pre.warnings.append("the preflight's rules were read from vLLM %s; vLLM %s may differ (checked with the %s rules)"
                            % (RULES_RELEASE, vllm_version, RULES_RELEASE))
    if method in NO_DRAFT_METHODS:
        pre.note("draft", "method %s has no draft checkpoint: nothing to open" % method)
        return pre.result()
    if target is None:
        pre.note("target", "the target's metadata was not read: nothing checked")
        return pre.result()
    pre.figures["target"] = _figures(target["config"])
    if method == "mtp":
        _check_mtp(pre, draft or target, k)
        return pre.result()
    if draft is None:
        pre.note("draft", "the draft's metadata was not read: nothing checked")
        return pre.result()
    pre.figures["draft"] = _figures(draft["config"])
    effective = draft
    if draft["config"].get("speculators_config") is not None or draft["config"].get("speculators_model_type"):
        effective = _check_speculators(pre, target, draft, method, k)
        if effective is None:
            return pre.result()
        pre.figures["draft"].update({key: v for key, v in _figures(effective["config"]).items() if v is not None})
    if method in UNCHECKED_METHODS:
        pre.note(method, "the preflight has no rules for method %s yet: vLLM checks the pair when it starts" % method)
    elif method == "draft_model":
        _check_draft_model(pre, target, draft, speculative)
    elif method in ("eagle", "eagle3"):
        _check_eagle(pre, target, effective, method)
    else:
        pre.note(method, "method %s is not one the preflight knows: nothing checked" % method)
    return pre.result()


def enforce(result, mode):
    """Under ``require``, a ValidationError naming every refusal; under ``warn`` the refusals come back as warnings."""
    if mode not in MODES:
        raise ValidationError("must be one of %s, got %r" % (", ".join(MODES), mode), field="preflight", hint="use require, warn or off")
    if mode == "require" and result["errors"]:
        first = result["errors"][0]
        more = result["errors"][1:]
        anyway = "set spec_decoding_preflight: warn to roll out anyway"
        # One refusal: its own fix is the error's fix (one "Fix:" in the message, not two).
        text, own_fix = first.partition(" Fix: ")[::2]
        if own_fix and not more:
            first, hint = text, "%s; or %s" % (own_fix.rstrip("."), anyway)
        else:
            hint = "fix the checkpoint or the speculative config as each message says, or " + anyway
        raise ValidationError("the draft does not fit its target (preflight, vLLM %s rules): %s%s" % (
            result["rules_from_vllm"], first, "".join("; also: %s" % e for e in more)), field="preflight", hint=hint)
    return list(result["warnings"]) + (list(result["errors"]) if mode == "warn" else [])


# --- draft_model ---------------------------------------------------------------------------------------------------

def _param_estimate(cfg):
    """Parameters of a decoder from its config (embedding + lm head + per layer attention and MLP): only to compare two."""
    h, layers, vocab = _text(cfg, "hidden_size"), _text(cfg, "num_hidden_layers"), _text(cfg, "vocab_size")
    if not all(isinstance(v, int) for v in (h, layers, vocab)):
        return None
    inter = _text(cfg, "intermediate_size") or 4 * h
    heads = _text(cfg, "num_attention_heads") or 1
    kv = _text(cfg, "num_key_value_heads") or heads
    head_dim = _text(cfg, "head_dim") or h // max(heads, 1)
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    return layers * (attn + 3 * h * inter) + vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)


def _check_draft_model(pre, target, draft, speculative):
    tcfg, dcfg = target["config"], draft["config"]
    tv, dv = _text(tcfg, "vocab_size"), _text(dcfg, "vocab_size")
    # SpeculativeConfig.verify_equal_vocab_size_if_draft_model (vLLM 0.32, from _verify_args): ModelConfig.get_vocab_size
    # of both must be equal unless use_heterogeneous_vocab is set.
    if speculative.get("use_heterogeneous_vocab"):
        pre.note("vocabulary", "use_heterogeneous_vocab is set: vLLM does not compare the vocabularies", target_vocab=tv, draft_vocab=dv)
    elif tv is None or dv is None:
        pre.note("vocabulary", "vocab_size missing from %s" % (_file(target) if tv is None else _file(draft)))
    elif tv != dv:
        pre.refuse("vocabulary", draft, "vocab_size",
                   "the draft's vocab_size %s differs from the target's %s (%s); vLLM 0.32 refuses the pair: 'Target and draft "
                   "model should have the same vocabulary size'" % (dv, tv, _file(target)),
                   "use a draft from the target's own family and tokenizer (e.g. Llama-3.2-1B for Llama-3.1-8B), or set "
                   "use_heterogeneous_vocab with greedy draft sampling")
    else:
        pre.passed("vocabulary", "draft and target vocab_size are both %d" % tv, vocab_size=tv)
    # vLLM loads the draft with the target's tokenizer (SpeculativeConfig.__post_init__: tokenizer=target's), so the ids
    # must mean the same tokens: a different tokenizer class or special-token ids run, but accept almost nothing.
    mismatched = [key for key in ("bos_token_id", "eos_token_id") if tcfg.get(key) is not None and dcfg.get(key) is not None
                  and tcfg.get(key) != dcfg.get(key)]
    ttok, dtok = target.get("tokenizer"), draft.get("tokenizer")
    tclass = (ttok or {}).get("tokenizer_class")
    dclass = (dtok or {}).get("tokenizer_class")
    if mismatched:
        key = mismatched[0]
        pre.warn("tokenizer", draft, key, "the draft's %s %s differs from the target's %s: vLLM drafts with the target's tokenizer"
                 % (key, dcfg.get(key), tcfg.get(key)), "use a draft trained with the target's tokenizer")
    elif tclass and dclass and tclass != dclass:
        pre.warn("tokenizer", draft, "tokenizer_class", "the draft's tokenizer_class %s differs from the target's %s" % (dclass, tclass),
                 "use a draft trained with the target's tokenizer", file_name="tokenizer_config.json")
    elif ttok is None or dtok is None:
        pre.passed("tokenizer", "special token ids agree (tokenizer_config.json not read for both)")
    else:
        pre.passed("tokenizer", "special token ids and tokenizer_class agree (%s)" % (tclass or "unnamed"))
    tsize = target.get("total_size") or _param_estimate(tcfg)
    dsize = draft.get("total_size") or _param_estimate(dcfg)
    basis = "bytes of weights" if target.get("total_size") and draft.get("total_size") else "parameters estimated from config.json"
    if tsize and dsize:
        if dsize >= tsize:
            pre.warn("size", draft, "num_hidden_layers", "the draft is not smaller than its target (%s vs %s %s): it cannot speed "
                     "the target up" % (dsize, tsize, basis), "use a draft several times smaller than the target")
        else:
            pre.passed("size", "the draft is %.1fx smaller than its target (%s)" % (tsize / float(dsize), basis),
                       target_size=tsize, draft_size=dsize)
    else:
        pre.note("size", "the sizes could not be read")


# --- EAGLE / EAGLE-3 -------------------------------------------------------------------------------------------------

def eagle_architecture(arch, method):
    """transformers_utils/configs/eagle.py EAGLEConfig.__init__: the name vLLM looks the head up by."""
    if method == "eagle":
        return arch if arch.startswith("Eagle") else "Eagle" + arch
    return arch if arch.startswith("Eagle3") or arch.endswith("Eagle3") else "Eagle3" + arch


def aux_layer_ids(dcfg):
    """(ids, where) the runner reads: gpu_model_runner._get_eagle3_aux_layers_from_config (vLLM 0.32, the runner the CPU
    build runs): top-level eagle_aux_hidden_state_layer_ids, else dflash_config.target_layer_ids + 1, else (winning)
    eagle_config.eagle_aux_hidden_state_layer_ids; (None, None) when none is set."""
    ids = dcfg.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return list(ids), "eagle_aux_hidden_state_layer_ids"
    found, where = None, None
    dflash = dcfg.get("dflash_config")
    if isinstance(dflash, dict) and dflash.get("target_layer_ids"):
        found, where = [i + 1 for i in dflash["target_layer_ids"]], "dflash_config.target_layer_ids"
    eagle = dcfg.get("eagle_config")
    if isinstance(eagle, dict) and eagle.get("eagle_aux_hidden_state_layer_ids"):
        found, where = list(eagle["eagle_aux_hidden_state_layer_ids"]), "eagle_config.eagle_aux_hidden_state_layer_ids"
    return (found, where) if found else (None, None)


def default_aux_layer_ids(num_layers):
    """interfaces.SupportsEagle3.get_eagle3_default_aux_hidden_state_layers (and deepseek_v2, qwen3_5): the default."""
    return [2, num_layers // 2, num_layers - 3]


def suggested_aux_layer_ids(num_layers):
    """vLLM's default when it fits the target (three distinct existing ids), else the last three ids that exist."""
    ids = default_aux_layer_ids(num_layers)
    if len(set(ids)) == 3 and all(0 <= i <= num_layers for i in ids):
        return ids
    return list(range(num_layers + 1))[-3:]


def _check_eagle(pre, target, draft, method):
    tcfg, dcfg = target["config"], draft["config"]
    # Architecture: EAGLEConfig renames the head's architecture, the registry must know the result.
    arch = _arch(dcfg)
    known = EAGLE3_ARCHITECTURES if method == "eagle3" else EAGLE_ARCHITECTURES
    if arch is None:
        pre.note("architecture", "%s names no architectures: the head's architecture was not checked" % _file(draft))
    else:
        looked_up = eagle_architecture(arch, method)
        if looked_up in known:
            pre.passed("architecture", "the head's %s is vLLM's %s" % (arch, looked_up), architecture=looked_up)
        else:
            pre.refuse("architecture", draft, "architectures", "%s (looked up as %s for method %s) is not an %s head vLLM %s knows"
                       % (arch, looked_up, method, method.upper(), RULES_RELEASE),
                       "use a head whose architecture is one of %s, or the method it was trained for" % ", ".join(known))
    tarch = _arch(tcfg)
    if method == "eagle3":
        if tarch in EAGLE3_TARGETS:
            pre.passed("target architecture", "the target %s supports EAGLE-3 (SupportsEagle3)" % tarch)
        else:
            pre.warn("target architecture", target, "architectures", "vLLM %s lists no EAGLE-3 support for %s (the engine raises 'Model "
                     "does not support EAGLE3 interface' if it has none)" % (RULES_RELEASE, tarch),
                     "serve EAGLE-3 with a target architecture vLLM supports, or use draft_model")
    # Hidden size: llama_eagle3.LlamaModel sizes fc from target_hidden_size (else the head's hidden_size) times the number
    # of aux states; llama_eagle.py feeds the target's hidden states to the head as they are.
    th = _text(tcfg, "hidden_size")
    dh = dcfg.get("target_hidden_size") if method == "eagle3" and dcfg.get("target_hidden_size") is not None else dcfg.get("hidden_size")
    key = "target_hidden_size" if method == "eagle3" and dcfg.get("target_hidden_size") is not None else "hidden_size"
    if th is None or dh is None:
        pre.note("hidden size", "hidden_size missing from %s" % (_file(target) if th is None else _file(draft)))
    elif th != dh:
        pre.refuse("hidden size", draft, key, "the head reads hidden states of size %s, the target's hidden_size is %s (%s)"
                   % (dh, th, _file(target)), "use the head trained for this target (its hidden size must be %s)" % th)
    else:
        pre.passed("hidden size", "the head reads the target's hidden size %d" % th, hidden_size=th)
    tv = _text(tcfg, "vocab_size")
    dv = dcfg.get("draft_vocab_size") or dcfg.get("vocab_size")
    pre.figures["draft"]["draft_vocab_size"] = dv
    if method == "eagle3":
        _check_vocab_maps(pre, draft, tv, dv)
        _check_aux_layers(pre, target, draft)


def _check_vocab_maps(pre, draft, tv, dv):
    # llama_eagle3.Eagle3LlamaForCausalLM: a draft vocabulary other than the target's gets draft_id_to_target_id, loaded
    # from the checkpoint's d2t tensor (load_weights); without it the map stays zeros and every drafted id is wrong.
    if tv is None or dv is None:
        pre.note("vocabulary maps", "vocab sizes not known")
    elif tv == dv:
        pre.passed("vocabulary maps", "the head drafts over the target's vocabulary (%d): no d2t map needed" % tv, vocab_size=tv)
    elif draft.get("tensors") is None:
        pre.note("vocabulary maps", "draft_vocab_size %s differs from the target's %s; the weight names were not read, so the d2t "
                 "map was not looked for" % (dv, tv))
    elif any("d2t" in name for name in draft["tensors"]):
        pre.passed("vocabulary maps", "draft vocabulary %s of the target's %s, with its d2t map" % (dv, tv),
                   draft_vocab_size=dv, target_vocab_size=tv)
    else:
        pre.refuse("vocabulary maps", draft, "draft_vocab_size", "the head drafts over %s tokens, the target has %s, and its weights "
                   "carry no d2t map (%d tensors read): vLLM leaves the map at zeros and every drafted token is wrong"
                   % (dv, tv, len(draft["tensors"])), "use the checkpoint with its d2t/t2d tensors (as published)")


def _check_aux_layers(pre, target, draft):
    tcfg, dcfg = target["config"], draft["config"]
    layers = _text(tcfg, "num_hidden_layers")
    ids, where = aux_layer_ids(dcfg)
    if layers is None:
        pre.note("aux layers", "num_hidden_layers missing from %s" % _file(target))
        return
    source = "set in the head's %s" % where
    if ids is None:
        ids, where = default_aux_layer_ids(layers), "eagle_aux_hidden_state_layer_ids"
        source = "vLLM's default for a %d-layer target, (2, layers // 2, layers - 3)" % layers
    eagle = dcfg.get("eagle_config") if isinstance(dcfg.get("eagle_config"), dict) else {}
    # llama_eagle3.LlamaModel.__init__: fc expects num_aux_hidden_states, else len(eagle_config ids), else 3 states.
    expected = dcfg.get("num_aux_hidden_states") or len(eagle.get("eagle_aux_hidden_state_layer_ids") or ()) or 3
    pre.figures["draft"]["aux_layer_ids"] = ids
    # EagleModelMixin._maybe_add_hidden_state (interfaces.py): id 0 is the embedding output, id i the output of layer i-1,
    # so the ids that exist are 0..num_hidden_layers; an id outside never fires and the head gets fewer states than its fc
    # expects, which kills the engine at the first request.
    bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or i < 0 or i > layers]
    if bad:
        pre.refuse("aux layers", draft, where, "the head reads target layers %s (%s); %s do not exist in the target's %d layers "
                   "(valid: 0..%d, %s)" % (ids, source, bad, layers, layers, _file(target)),
                   "set eagle_aux_hidden_state_layer_ids to ids within 0..%d (for this target e.g. %s), or use the head trained "
                   "for this target" % (layers, suggested_aux_layer_ids(layers)))
    elif len(set(ids)) != expected:
        pre.refuse("aux layers", draft, where, "the head's fc takes %d hidden states, the ids %s give %d distinct ones (%s)"
                   % (expected, ids, len(set(ids)), source), "list %d distinct layer ids" % expected)
    else:
        pre.passed("aux layers", "the head reads target layers %s (%s) of %d" % (ids, source, layers), aux_layer_ids=ids,
                   target_layers=layers)


# --- speculators format --------------------------------------------------------------------------------------------

def _check_speculators(pre, target, draft, method, k):
    """The checks of vLLM 0.32 SpeculatorsConfig (transformers_utils/configs/speculators/base.py) and the verifier; returns
    the checkpoint with the config vLLM builds from it (extract_transformers_pre_trained_config), or None when unusable."""
    cfg = draft["config"]
    spec = cfg.get("speculators_config")
    stype = cfg.get("speculators_model_type")
    version = cfg.get("speculators_version")
    pre.figures["draft"]["speculators_version"] = version
    # SpeculatorsConfig.validate_speculators_config: the structure vLLM indexes without checking.
    try:
        trained_k = spec["proposal_methods"][0]["speculative_tokens"]
        verifier = spec["verifier"]
        verifier_name = verifier["name_or_path"]
    except (KeyError, IndexError, TypeError):
        pre.refuse("speculators format", draft, "speculators_config", "is not the speculators structure vLLM reads (proposal_methods[0]"
                   ".speculative_tokens, verifier.name_or_path); vLLM: 'Invalid speculators config structure'",
                   "re-export the checkpoint with vllm-project/speculators")
        return None
    if not isinstance(cfg.get("transformer_layer_config"), dict):
        pre.refuse("speculators format", draft, "transformer_layer_config", "is missing or not a mapping (vLLM: 'Must provide "
                   "transformer_layer_config')", "re-export the checkpoint with vllm-project/speculators")
        return None
    if stype not in SPECULATORS_METHODS:
        pre.refuse("speculators format", draft, "speculators_model_type", "%r is not one vLLM %s loads (%s)"
                   % (stype, RULES_RELEASE, ", ".join(sorted(SPECULATORS_METHODS))), "use a speculator of a supported algorithm")
        return None
    # vLLM 0.32 reads no format version (only speculators_model_type and the fields above): reported, never refused.
    pre.passed("speculators format", "speculators_model_type %s, format version %s (vLLM %s reads no version field)"
               % (stype, version, RULES_RELEASE), speculators_model_type=stype, speculators_version=version)
    algorithm = spec.get("algorithm")
    if algorithm and algorithm != stype:
        pre.warn("speculators algorithm", draft, "speculators_config.algorithm", "%r differs from speculators_model_type %r, which "
                 "vLLM follows" % (algorithm, stype), "re-export the checkpoint with vllm-project/speculators")
    runs = SPECULATORS_METHODS[stype]
    if method != runs:
        pre.refuse("speculators method", draft, "speculators_model_type", "the checkpoint is a %s speculator (vLLM runs it as %s), the "
                   "speculative config asks for method %s" % (stype, runs, method), "set method: %s" % runs)
    # verifier: the target the head was trained on.
    varchs = verifier.get("architectures") or []
    tarch = _arch(target["config"])
    pre.figures["draft"]["verifier"] = {"name_or_path": verifier_name, "architectures": varchs}
    if varchs and [a for a in varchs if a] and tarch not in varchs:
        pre.warn("verifier", draft, "speculators_config.verifier.architectures", "the head was trained for %s (%s), the target is %s"
                 % (varchs, verifier_name, tarch), "use the head trained for this target")
    else:
        pre.passed("verifier", "trained for %s (%s); the target is %s" % (verifier_name, varchs or "any", tarch))
    # maybe_override_with_speculators applies the user's --speculative-config over the checkpoint's, so vLLM 0.32 takes any
    # k; above the trained k the extra positions are drafted by a head never trained for them.
    pre.figures["draft"]["trained_k"] = trained_k
    if k is None:
        pre.passed("trained k", "num_speculative_tokens not set: vLLM uses the trained %s" % trained_k, trained_k=trained_k)
    elif isinstance(trained_k, int) and k > trained_k:
        pre.warn("trained k", draft, "speculators_config.proposal_methods[0].speculative_tokens", "num_speculative_tokens %s exceeds "
                 "the %s the head was trained for (vLLM %s takes it; acceptance falls at the extra positions)" % (k, trained_k, RULES_RELEASE),
                 "set num_speculative_tokens to %s or less" % trained_k)
    else:
        pre.passed("trained k", "num_speculative_tokens %s within the trained %s (vLLM %s does not require equality)" % (k, trained_k, RULES_RELEASE),
                   trained_k=trained_k, num_speculative_tokens=k)
    if runs != "eagle3":
        return dict(draft, config=dict(cfg["transformer_layer_config"]))
    # algos.update_eagle3: the config vLLM builds for the head.
    layer = dict(cfg["transformer_layer_config"])
    model_type = layer.get("model_type", "llama")
    if model_type not in SPECULATORS_EAGLE3_ARCH:
        pre.refuse("speculators format", draft, "transformer_layer_config.model_type", "%r is not one vLLM %s builds an EAGLE-3 head for "
                   "(%s); vLLM: 'Unsupported model_type'" % (model_type, RULES_RELEASE, ", ".join(SPECULATORS_EAGLE3_ARCH)),
                   "use a llama or qwen3 speculator")
        return None
    layer["draft_vocab_size"] = cfg.get("draft_vocab_size")
    if cfg.get("target_hidden_size") is not None:
        layer["target_hidden_size"] = cfg["target_hidden_size"]
    layer["architectures"] = [SPECULATORS_EAGLE3_ARCH[model_type]]
    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        layer["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]
    return dict(draft, config=layer)


# --- MTP -------------------------------------------------------------------------------------------------------------

def mtp_family(cfg):
    """(family, key, default) of MTP_FAMILIES for a config, or None."""
    arch = _arch(cfg)
    for kind, names, family, key, default in MTP_FAMILIES:
        if (kind == "model_type" and cfg.get("model_type") in names) or (kind == "architecture" and arch in names):
            return family, key, default
    return None


def _check_mtp(pre, ckpt, k):
    cfg = ckpt["config"]
    if cfg.get("model_type") == "deepseek_v41":
        pre.refuse("mtp layers", ckpt, "model_type", "DeepSeek V4.1 has no classic-MTP draft (vLLM %s refuses method mtp for it)"
                   % RULES_RELEASE, "use method dspark")
        return
    found = mtp_family(cfg)
    if found is None:
        present = {key: _text(cfg, key) for key in MTP_KEYS if _text(cfg, key)}
        if present:
            pre.warn("mtp layers", ckpt, "model_type", "%r (%s) is not in the preflight's table of MTP families (read from vLLM %s "
                     "SpeculativeConfig.hf_config_override) though it has %s" % (cfg.get("model_type"), _arch(cfg), RULES_RELEASE, present),
                     "check that your vLLM release serves MTP for this model")
            return
        pre.refuse("mtp layers", ckpt, "model_type", "%r (%s) carries no MTP layers vLLM %s knows (no %s): vLLM raises 'Unsupported "
                   "speculative method: mtp'" % (cfg.get("model_type"), _arch(cfg), RULES_RELEASE, "/".join(MTP_KEYS)),
                   "use a target published with MTP layers (DeepSeek-V3, Qwen3-Next, MiMo, GLM-4.5) or another method")
        return
    family, key, default = found
    value = _text(cfg, key)
    n = value if value is not None else default
    pre.figures["target_mtp"] = {"family": family, "key": key, "mtp_layers": n}
    if n is None or not isinstance(n, int) or n <= 0:
        written = "absent" if value is None else repr(value)
        pre.refuse("mtp layers", ckpt, key, "%s is %s: the %s model has no MTP layer to draft with" % (key, written, family),
                   "use the checkpoint published with its MTP weights (%s >= 1)" % key)
        return
    # SpeculativeConfig.__post_init__: n_predict from hf_config_override; k defaults to it, and a larger k must be a
    # multiple of it (ValueError 'num_speculative_tokens:... must be divisible by n_predict=...'); a larger multiple runs
    # the same MTP layers again (vLLM warns of lower acceptance).
    if k is None:
        pre.passed("mtp layers", "%s: %s = %d; num_speculative_tokens not set, vLLM uses %d" % (family, key, n, n), mtp_layers=n)
    elif k > n and k % n:
        pre.refuse("mtp layers", ckpt, key, "num_speculative_tokens %d is above the %d MTP layers and not a multiple of them "
                   "(vLLM: 'num_speculative_tokens:%d must be divisible by n_predict=%d')" % (k, n, k, n),
                   "set num_speculative_tokens to %d (or a multiple of it)" % n)
    elif k > n:
        pre.warn("mtp layers", ckpt, key, "num_speculative_tokens %d runs the %d MTP layer(s) %d times (vLLM warns: lower acceptance)"
                 % (k, n, k // n), "set num_speculative_tokens to %d" % n)
    else:
        pre.passed("mtp layers", "%s: %s = %d, num_speculative_tokens %d within them" % (family, key, n, k), mtp_layers=n,
                   num_speculative_tokens=k)
