# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rules of vLLM's ``SpeculativeConfig`` that are code rather than field types, per release, and the coercion
policy: what pydantic makes of a loosely typed value, and which method vLLM really runs.

Each function follows one vLLM function and names it (``vllm/config/speculative.py`` of vLLM 0.32.0, checked against
0.33.0). What differs between releases is data read from each release's source (speculative_releases.RELEASES, from
hack/vllm_speculative_tables.py: ``field_values``, ``method_from_model``, ``detect_keeps``, ``detect_skips``,
``repr_model_none``, ``code_rules``: which of the rules below the release raises); every release 0.10-0.34 carries
them. What a table leaves unknown (0.34's method choice and the checks it moved into per-method speculator configs) is
not guessed: the validator leaves it to vLLM and says so in a warning (``unknown_rule_notes``).
docs/speculative-config-validation.md says what is checked here, what is left to vLLM, and the coercion policy.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

# Type checks, named after the kinds of vLLM field types (speculative_config._kind maps a declared type to one).
INT = "int"
POS_INT = "positive int"
NONNEG_INT = "non-negative int"
STR = "str"
NUM = "number"
BOOL = "bool"
LIST_NUM = "list of numbers"
ANY = "any"

_INT_TEXT = re.compile(r"^\s*[+-]?\d+(?:\.0*)?\s*$")
_FLOAT_TEXT = re.compile(r"^\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*$")
# pydantic 2 (lax mode) reads these strings as booleans (pydantic-core's bool validator, which vLLM 0.32's fields use).
_TRUE = frozenset(("1", "on", "t", "true", "y", "yes"))
_FALSE = frozenset(("0", "off", "f", "false", "n", "no"))

# Keys people copy from old guides; each gets a precise fix instead of "unknown key".
KEY_HINTS = {
    "tensor_parallel_size": "'tensor_parallel_size' is not a valid argument in the speculative_config; "
                            "use 'draft_tensor_parallel_size' (1 or the target's tensor parallel size)",
    "speculative_model": "use 'model' inside --speculative-config",
    "num_spec_tokens": "use 'num_speculative_tokens'",
    "ngram_prompt_lookup_max": "use 'prompt_lookup_max'",
    "ngram_prompt_lookup_min": "use 'prompt_lookup_min'",
    "acceptance_method": "removed with the V0 engine; drop it",
    "typical_acceptance_sampler_posterior_threshold": "removed with the V0 engine; drop it",
    "typical_acceptance_sampler_posterior_alpha": "removed with the V0 engine; drop it",
    "posterior_threshold": "removed with the V0 engine; drop it",
    "posterior_alpha": "removed with the V0 engine; drop it",
    "disable_mqa_scorer": "removed with the V0 engine; drop it",
    "disable_logprobs": "removed with the V0 engine; drop it",
    "disable_log_stats": "set --disable-log-stats on the server instead; drop it here",
}
# What to write instead of a key or method a vLLM release removed (the release itself comes from the tables).
REMOVED_HINTS = {
    "disable_by_batch_size": "drop it (vLLM no longer switches speculation off by batch size from this key)",
    "speculative_token_tree": "drop it (tree drafting is no longer configured here)",
    "disable_logprobs": "drop it",
    "synthetic_acceptance_rate": "use 'synthetic_acceptance_rates' (one rate per position) or 'synthetic_acceptance_length'",
    "medusa": "use eagle3 or draft_model",
    "mlp_speculator": "use eagle3 or draft_model",
    "custom_class": "register the proposer as a custom speculative method (a vLLM plugin) and name it in 'method'",
}


def admits_none(spec):
    """Whether vLLM's declared type of a key takes ``null`` (``X | None``, ``Optional[X]``, ``SkipValidation[...]``)."""
    text = spec.get("type", "")
    return bool(re.search(r"\bNone\b|^Optional\[|^SkipValidation\[|^Any$", text))


def coerce(key, value, kind, field):
    """``(value vLLM uses, note or None)`` for ``value`` of a field of ``kind``, as pydantic's lax mode reads it
    (vLLM's config classes are pydantic dataclasses: ``vllm/config/utils.py`` ``config``), else a ValidationError.

    The policy (docs/speculative-config-validation.md): a value pydantic converts is accepted, written as what vLLM
    will use, with a note naming it; a value it refuses is refused here too."""
    where = "%s.%s" % (field, key)
    if kind in (INT, POS_INT, NONNEG_INT):
        number, note = as_int(value)
        if number is None:
            raise ValidationError("must be an integer, got %r" % (value,), field=where,
                                  hint="write a bare number such as 3 (vLLM refuses a fraction or a word)")
        if kind == POS_INT and number <= 0:
            if key == "num_speculative_tokens":
                raise ValidationError("must be greater than zero, got %d (vLLM: 'Expected num_speculative_tokens to be "
                                      "greater than zero')" % number, field=where,
                                      hint="start with 3 for EAGLE-3 or draft models, 5 for ngram, 1 for mtp")
            raise ValidationError("must be at least 1, got %d" % number, field=where, hint="use a positive integer")
        if kind == NONNEG_INT and number < 0:
            raise ValidationError("must not be negative, got %d" % number, field=where, hint="use 0 or more")
        return number, note and "%s: %s; vLLM reads it as %d (written so in the canonical JSON)" % (where, note, number)
    if kind == NUM:
        if isinstance(value, bool):
            return float(value), "%s: %r is a boolean; vLLM reads it as %r" % (where, value, float(value))
        if isinstance(value, (int, float)):
            return value, None
        if isinstance(value, str) and _FLOAT_TEXT.match(value):
            return float(value), "%s: %r is a string; vLLM reads it as %r (written so in the canonical JSON)" % (where, value, float(value))
        raise ValidationError("must be a number, got %r" % (value,), field=where, hint="write a bare number")
    if kind == LIST_NUM:
        if not isinstance(value, list):
            raise ValidationError("must be a list of numbers, got %r" % (value,), field=where, hint="e.g. [0.8, 0.6, 0.4]")
        items = [coerce("%s[%d]" % (key, i), v, NUM, field) for i, v in enumerate(value)]
        notes = [n for _v, n in items if n]
        return [v for v, _n in items], (notes[0] if len(notes) == 1 else "%s: %s" % (where, "; ".join(notes)) if notes else None)
    if kind == BOOL:
        if isinstance(value, bool):
            return value, None
        flag = None
        if isinstance(value, int) and value in (0, 1):
            flag = bool(value)
        elif isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            flag = value.strip().lower() in _TRUE
        if flag is None:
            raise ValidationError("must be true or false, got %r" % (value,), field=where, hint="write true or false")
        return flag, "%s: %r is not a boolean; vLLM reads it as %s (written so in the canonical JSON)" % (
            where, value, "true" if flag else "false")
    if kind == STR:
        # pydantic takes any str; an empty `model` or `method` is refused here all the same (no draft, no method has it)
        if not isinstance(value, str) or (key in ("model", "method") and not value.strip()):
            raise ValidationError("must be a non-empty string, got %r" % (value,), field=where, hint="give the value as text")
    return value, None


def as_int(value):
    """(int, why it was converted or None), or (None, None) when pydantic refuses it as an integer."""
    if isinstance(value, bool):
        return int(value), "%r is a boolean" % value
    if isinstance(value, int):
        return value, None
    if isinstance(value, float):
        return (int(value), "%r is a float" % value) if value.is_integer() else (None, None)
    if isinstance(value, str) and _INT_TEXT.match(value):
        return int(float(value.strip())), "%r is a string" % value
    return None, None


# --- allowed values of Literal / Enum fields ----------------------------------------------------------------------

def check_field_value(key, value, allowed, field, vtxt):
    """A value of a Literal or Enum field (``rejection_sample_method``, ``draft_sample_method``, ``moe_backend``,
    ``kv_cache_dtype``, ``attention_backend``, ``quantization``) as the release's pydantic reads it; a nested config
    (``draft_load_config``) must be a mapping of that config's fields. Returns the value vLLM keeps (None: unset)."""
    where = "%s.%s" % (field, key)
    if "object" in allowed:
        if not isinstance(value, dict):
            raise ValidationError("must be a mapping of %s fields, got %r" % (allowed["object"], value), field=where,
                                  hint="e.g. {\"load_format\": \"auto\"}, or drop it to load the draft like the target")
        unknown = sorted(set(value) - set(allowed["keys"]))
        if unknown:
            raise ValidationError("%s has no field %s (vLLM %s refuses it: 'Unexpected keyword argument')"
                                  % (allowed["object"], ", ".join(repr(k) for k in unknown), vtxt), field=where,
                                  hint="use only: %s" % ", ".join(allowed["keys"]))
        return value
    values = allowed["values"]
    if "enum" in allowed:
        # vLLM 0.32 SpeculativeConfig._parse_attention_backend: 'auto' means None, else AttentionBackendEnum[value.upper()]
        if isinstance(value, str):
            if value.lower() in allowed.get("none_aliases", []):
                return None
            name = value.upper() if allowed.get("by_name_any_case") else value
            if name in values:
                return value
        raise ValidationError("%r is not a %s of vLLM %s" % (value, allowed["enum"], vtxt), field=where,
                              hint="use one of: %s" % ", ".join(values + allowed.get("none_aliases", [])))
    if value in values or (allowed.get("open") and isinstance(value, str)):
        return value
    raise ValidationError("%r is not one of the values vLLM %s accepts for %s" % (value, vtxt, key), field=where,
                          hint="use one of: %s" % ", ".join(values))


# --- the method vLLM runs -----------------------------------------------------------------------------------------

def is_custom_proposer_path(model):
    """vLLM 0.32 ``SpeculativeConfig._is_custom_proposer_path``: a dotted import path such as ``pkg.MyProposer``."""
    if not isinstance(model, str) or model.startswith(("http://", "https://", "file://")) or "/" in model:
        return False
    parts = model.split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)


def method_vllm_runs(method, model, table, aliases_to_mtp=True):
    """``(method, rule)``: the method vLLM's ``SpeculativeConfig.__post_init__`` (vllm/config/speculative.py) ends with
    for the ``method`` and ``model`` written, by the rules that read only names; ``rule`` says why when it differs from
    ``method`` (None when it does not). ``(None, None)`` when the release's table has no such data (older run of the
    generator, or 0.34, whose per-method speculator configs are not read). Rules that read the draft's config.json
    (model_type, architectures) are not applied here."""
    from_model = table.get("method_from_model")
    if from_model is None:
        return None, None
    written = method
    rule = None
    if method is None:
        if from_model.get("custom_class_path") and is_custom_proposer_path(model):
            method, rule = "custom_class", "'model' %r is a dotted class path, so vLLM runs the custom_class proposer it names" % model
        elif model in from_model.get("names", {}):
            method = from_model["names"][model]
            rule = "'model' is %r, which vLLM reads as method '%s'" % (model, method)
        else:
            method = table["detect_fallback"]
    if aliases_to_mtp and method in table["mtp_aliases"]:
        method = "mtp"
    if method == "[ngram]":
        method = "ngram"
    skips, keeps = table.get("detect_skips") or [], table.get("detect_keeps") or []
    if model is not None and method not in skips and method not in keeps:
        path = str(model).lower()
        for detect in table["detect_rules"]:
            hit = next((c[1] for c in detect["when"] if c[0] == "name_contains" and c[1] in path), None)
            if hit is not None:
                if detect["method"] != method:
                    rule = ("the draft path %r contains %r: vLLM runs %s whatever 'method' says, unless 'method' is one of %s"
                            % (model, hit, detect["method"], ", ".join(keeps) or "none"))
                method = detect["method"]
                break
    return method, (rule if method != written else None)


def methods_from_draft_files(table):
    """The methods vLLM's ``SpeculativeConfig.__post_init__`` (vllm/config/speculative.py, 0.32) may still pick from the
    draft's config.json (architectures, model_type) when neither ``method`` nor the draft path names one, before its
    fallback (draft_model): dflash, dspark, medusa, mlp_speculator and mtp in 0.32."""
    return sorted({rule["method"] for rule in table.get("detect_rules") or () if any(c[0] != "name_contains" for c in rule["when"])})


def printed_model_is_none(method, table):
    """Whether the engine line's ``SpeculativeConfig.__repr__`` prints ``model=None`` for ``method`` (vLLM prints no
    model for the proposers without one: ngram, suffix, extract_hidden_states, custom_class in 0.32)."""
    return method in (table.get("repr_model_none") or ("ngram",))


# --- cross-field rules --------------------------------------------------------------------------------------------

def has_rule(table, rule):
    """Whether the release refuses what ``rule`` refuses (hack/vllm_speculative_tables.py CODE_RULES, read per release
    from the SpeculativeConfig method it names): True, False, or None when unknown (a table not read for the rules, or
    a release that raises it in code the generator does not read, such as 0.34's per-method speculator configs)."""
    found = table.get("code_rules")
    if found is None or rule in (table.get("code_rules_unread") or {}):
        return None
    return rule in found


def unknown_rule_notes(cfg, table, vtxt, field):
    """Warnings for the rules a release has but the tables could not read, where the config sets their key: the
    validator then leaves that rule to vLLM and says so."""
    notes = []
    if table.get("code_rules") is None:
        return ["%s: the cross-field rules of vLLM %s were not read from its source (its table predates them); vLLM checks "
                "them at start-up" % (field, vtxt)]
    for rule, where in sorted((table.get("code_rules_unread") or {}).items()):
        key = _RULE_KEYS.get(rule)
        if rule == "suffix_limits":
            if any(k.startswith("suffix_decoding_") for k in cfg):
                notes.append("%s: vLLM %s checks the suffix_decoding_* limits in %s, which the release tables do not read; "
                             "left to vLLM" % (field, vtxt, where))
        elif key is None or cfg.get(key) is not None:
            notes.append("%s: vLLM %s checks '%s' in %s, which the release tables do not read; left to vLLM" % (field, vtxt, rule, where))
    if table.get("method_from_model") is None and cfg.get("model") is not None:
        notes.append("%s: how vLLM %s picks the method from the names (per-method speculator configs) was not read from its "
                     "source; the method it runs is not checked against the draft path here" % (field, vtxt))
    return notes


# The key a rule is about: an unknown rule is worth a warning only when the config sets it (None: always).
_RULE_KEYS = {"index_share_only_mtp": "index_share_for_mtp_iteration",
              "dspark_topk_only_dspark": "dspark_draft_topk", "adaptive_not_local_argmax": "enable_adaptive_verification",
              "adaptive_only_dspark": "enable_adaptive_verification", "heterogeneous_vocab_draft_model": "use_heterogeneous_vocab",
              "heterogeneous_vocab_greedy": "use_heterogeneous_vocab", "heterogeneous_vocab_local_argmax": "use_heterogeneous_vocab",
              "synthetic_exactly_one": "rejection_sample_method", "synthetic_keys_need_synthetic": "rejection_sample_method",
              "fly_not_extract_hidden_states": "rejection_sample_method", "fly_min_tokens": "rejection_sample_method",
              "fly_window_below_k": "rejection_sample_method", "k_required_without_draft_config": None}


def post_init_rules(cfg, method, table, vtxt, field):
    """The cross-field refusals at the end of vLLM 0.32 ``SpeculativeConfig.__post_init__`` that need no model files,
    each applied where the release's table says it has it (``has_rule``)."""
    if has_rule(table, "index_share_only_mtp") and cfg.get("index_share_for_mtp_iteration") is not None and method != "mtp":
        raise ValidationError("index_share_for_mtp_iteration is only supported with method='mtp' (vLLM %s), not '%s'"
                              % (vtxt, method), field="%s.index_share_for_mtp_iteration" % field, hint="drop it")
    # vLLM 0.28-0.29 SpeculativeConfig.__post_init__: 'Adaptive verification only supported with DSpark'
    if has_rule(table, "adaptive_only_dspark") and method != "dspark" and cfg.get("enable_adaptive_verification"):
        raise ValidationError("enable_adaptive_verification is only supported with method 'dspark' in vLLM %s, not '%s'"
                              % (vtxt, method), field="%s.enable_adaptive_verification" % field,
                              hint="drop it, or use a newer vLLM (0.30+ allows it with other methods)")
    if has_rule(table, "adaptive_not_local_argmax") and method != "dspark" and cfg.get("enable_adaptive_verification") \
            and cfg.get("use_local_argmax_reduction"):
        raise ValidationError("enable_adaptive_verification and use_local_argmax_reduction cannot both be on (vLLM %s: "
                              "'Adaptive verification estimates per-position acceptance from the draft logits, which "
                              "use_local_argmax_reduction never materializes')" % vtxt,
                              field="%s.enable_adaptive_verification" % field, hint="disable one of them")
    # Inside the branch that builds the draft's ModelConfig (a method with draft weights and a `model`).
    if has_rule(table, "dspark_topk_only_dspark") and cfg.get("dspark_draft_topk") is not None and method != "dspark" \
            and cfg.get("model") is not None \
            and method not in (table.get("detect_skips") or ()):
        raise ValidationError("dspark_draft_topk is only supported by DSpark (vLLM %s), not '%s'" % (vtxt, method),
                              field="%s.dspark_draft_topk" % field, hint="drop it")


def verify_args(cfg, method, _version, table, vtxt, field):
    """vLLM 0.32 ``SpeculativeConfig._verify_args`` (the model validator after ``__post_init__``) and
    ``_resolve_synthetic_acceptance_rates``; 0.33 adds the FLy and the vocabulary/argmax rules. Each is applied where
    the release's table says it has it (``has_rule``; the version is no longer consulted); the rules it could not read are
    named in the warnings returned."""
    notes = unknown_rule_notes(cfg, table, vtxt, field)
    if "rejection_sample_method" in table["keys"]:
        k = cfg.get("num_speculative_tokens")
        rates, length = cfg.get("synthetic_acceptance_rates"), cfg.get("synthetic_acceptance_length")
        sample = cfg.get("rejection_sample_method", "standard")
        if sample == "synthetic" and has_rule(table, "synthetic_exactly_one"):
            _resolve_synthetic_acceptance_rates(k, rates, length, field)
        elif sample != "synthetic" and (rates is not None or length is not None) and has_rule(table, "synthetic_keys_need_synthetic"):
            raise ValidationError("synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
                                  "rejection_sample_method='synthetic' (vLLM %s)" % vtxt,
                                  field="%s.%s" % (field, "synthetic_acceptance_rates" if rates is not None else "synthetic_acceptance_length"),
                                  hint="set rejection_sample_method: synthetic, or drop it")
        if sample == "fly":
            if method == "extract_hidden_states" and has_rule(table, "fly_not_extract_hidden_states"):
                raise ValidationError("FLy is not compatible with method='extract_hidden_states' (vLLM %s)" % vtxt,
                                      field="%s.rejection_sample_method" % field, hint="use 'standard'")
            if isinstance(k, int) and k < 2 and has_rule(table, "fly_min_tokens"):
                raise ValidationError("FLy requires num_speculative_tokens to be at least 2 (vLLM %s)" % vtxt,
                                      field="%s.num_speculative_tokens" % field, hint="raise it to 2 or more")
            window = cfg.get("fly_window_size")
            if isinstance(window, int) and isinstance(k, int) and window >= k and has_rule(table, "fly_window_below_k"):
                raise ValidationError("FLy requires fly_window_size (%d) to be smaller than num_speculative_tokens (%d) "
                                      "(vLLM %s)" % (window, k, vtxt), field="%s.fly_window_size" % field,
                                      hint="use at most %d" % (k - 1))
    hetero = cfg.get("use_heterogeneous_vocab")
    if hetero and method != "draft_model" and has_rule(table, "heterogeneous_vocab_draft_model"):
        raise ValidationError("use_heterogeneous_vocab only works with method='draft_model' (vLLM %s runs '%s')" % (vtxt, method),
                              field="%s.use_heterogeneous_vocab" % field, hint="drop it, or use a draft_model")
    if hetero and cfg.get("draft_sample_method", "greedy") != "greedy" and has_rule(table, "heterogeneous_vocab_greedy"):
        raise ValidationError("use_heterogeneous_vocab currently only supports greedy draft sampling (vLLM %s)" % vtxt,
                              field="%s.draft_sample_method" % field, hint="set draft_sample_method: greedy (the default) or omit it")
    if hetero and cfg.get("use_local_argmax_reduction") and has_rule(table, "heterogeneous_vocab_local_argmax"):
        raise ValidationError("use_heterogeneous_vocab is not compatible with use_local_argmax_reduction (vLLM %s: the "
                              "token-level intersection needs the full draft logits)" % vtxt,
                              field="%s.use_local_argmax_reduction" % field, hint="disable one of them")
    return notes


def _resolve_synthetic_acceptance_rates(k, rates, length, field):
    """vLLM 0.32 ``SpeculativeConfig._resolve_synthetic_acceptance_rates``: exactly one of the rates (length k, each in
    [0, 1], non-increasing) or the length (in [1, k + 1])."""
    if (rates is None) == (length is None):
        raise ValidationError("rejection_sample_method='synthetic' requires exactly one of synthetic_acceptance_rates or "
                              "synthetic_acceptance_length", field="%s.rejection_sample_method" % field,
                              hint="give one rate per position (synthetic_acceptance_rates) or a mean acceptance length")
    if not isinstance(k, int):
        return  # vLLM fills k from the draft's config first; the checks below need it
    if rates is not None:
        where = "%s.synthetic_acceptance_rates" % field
        if not isinstance(rates, list):
            raise ValidationError("must be a list of rates, got %r" % (rates,), field=where, hint="e.g. [0.8, 0.6, 0.4]")
        if len(rates) != k:
            raise ValidationError("must have length %d (num_speculative_tokens), got %d rates" % (k, len(rates)), field=where,
                                  hint="give one rate per drafted position")
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ValidationError("entries must be in [0, 1], got %r" % (rates,), field=where, hint="write probabilities")
        if any(rates[i] > rates[i - 1] for i in range(1, len(rates))):
            raise ValidationError("must be non-increasing, got %r" % (rates,), field=where,
                                  hint="rate i is the chance the first i+1 drafts are all accepted, so it cannot grow")
    elif not 1.0 <= length <= float(k + 1):
        raise ValidationError("must be in [1, %d], got %r" % (k + 1, length), field="%s.synthetic_acceptance_length" % field,
                              hint="the mean acceptance length counts the bonus token: at most num_speculative_tokens + 1")


def suffix_limits(cfg, field):
    """vLLM 0.32 ``SpeculativeConfig._validate_suffix_decoding``: checked only under method 'suffix'."""
    checks = (("suffix_decoding_max_tree_depth", lambda v: v >= 1, ">= 1", "the default is 24"),
              ("suffix_decoding_max_cached_requests", lambda v: v >= 0, ">= 0", "0 turns the global tree off"),
              ("suffix_decoding_max_spec_factor", lambda v: v >= 0, ">= 0", "the default is 1.0"),
              ("suffix_decoding_min_token_prob", lambda v: 0 <= v <= 1, "in [0, 1]", "the default is 0.1"))
    for key, good, text, hint in checks:
        value = cfg.get(key)
        if value is not None and not good(value):
            raise ValidationError("must be %s, got %r" % (text, value), field="%s.%s" % (field, key), hint=hint)
