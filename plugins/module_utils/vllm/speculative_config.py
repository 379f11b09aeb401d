# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What vLLM's ``--speculative-config`` accepts, per vLLM version, and its canonical rendering.

Plain Python (no Ansible imports) so modules, filters, roles and tests share one source of truth.
Facts come from vLLM 0.10 to 0.33 (``vllm/config/speculative.py``, ``vllm/engine/arg_utils.py``).
Where this table only knows the ends of a version range, a method or key seen at one end but not
the other is reported as a warning ("not verified for this version"), never silently accepted or
wrongly refused.
"""

from __future__ import annotations

import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

# The newest vLLM release this table was checked against; used when no version is given.
NEWEST_KNOWN = (0, 33, 0)
OLDEST_KNOWN = (0, 10, 0)

# Methods: (first version known to have it, last version known NOT to have it, version that removed it).
# A version between "known absent" and "since" gets a warning, not an error.
_METHODS = {
    "ngram": ((0, 10, 0), None, None),
    "eagle": ((0, 10, 0), None, None),
    "eagle3": ((0, 10, 0), None, None),
    "medusa": ((0, 10, 0), None, (0, 33, 0)),
    "mlp_speculator": ((0, 10, 0), None, (0, 33, 0)),
    "mtp": ((0, 10, 0), None, None),
    "deepseek_mtp": ((0, 10, 0), None, None),
    "ernie_mtp": ((0, 11, 0), (0, 10, 99), None),
    "qwen3_next_mtp": ((0, 11, 0), (0, 10, 99), None),
    "mimo_mtp": ((0, 11, 0), (0, 10, 99), None),
    "longcat_flash_mtp": ((0, 11, 0), (0, 10, 99), None),
    # "not supported yet" in 0.10 and 0.11; present in 0.24.
    "draft_model": ((0, 24, 0), (0, 11, 99), None),
    # 0.11.0 lacks it; 0.24 has it (needs the arctic-inference package).
    "suffix": ((0, 24, 0), (0, 11, 0), None),
    "custom_class": ((0, 24, 0), (0, 11, 99), None),
    "extract_hidden_states": ((0, 24, 0), (0, 11, 99), None),
    "ngram_gpu": ((0, 24, 0), (0, 11, 99), None),
    "dflash": ((0, 24, 0), (0, 11, 99), None),
    "dspark": ((0, 33, 0), (0, 24, 99), None),
}

# Newer vLLM releases carry many model-specific `*_mtp` aliases (28 in 0.33), all printed as 'mtp'.
# The known ones are validated; another `*_mtp` name on 0.24+ is passed on with a warning.
_MTP_ALIASES_024 = (
    "glm4_moe_mtp", "pangu_ultra_moe_mtp", "qwen3_5_mtp", "step3p5_mtp", "minimax_m2_mtp",
    "exaone_moe_mtp", "openpangu_mtp", "glm4_moe_lite_mtp", "bailing_mtp", "hunyuan_mtp",
)
for _alias in _MTP_ALIASES_024:
    _METHODS.setdefault(_alias, ((0, 24, 0), (0, 11, 99), None))

METHOD_NAMES = frozenset(_METHODS)

# Methods that load separate draft weights from `model`.
DRAFT_WEIGHT_METHODS = frozenset(("eagle", "eagle3", "draft_model", "medusa", "mlp_speculator", "dflash", "dspark"))
# Methods that need no `model` at all (the proposer is the prompt, the target itself, or a suffix tree).
MODEL_FREE_METHODS = frozenset(("ngram", "ngram_gpu", "suffix"))
NGRAM_METHODS = frozenset(("ngram", "ngram_gpu"))

# Keys: name -> (type check, first version, last version known absent).
_INT = "int"
_POS_INT = "positive int"
_NONNEG_INT = "non-negative int"
_STR = "str"
_NUM = "number"
_BOOL = "bool"
_ANY = "any"
_KEYS = {
    "method": (_STR, (0, 10, 0), None),
    "model": (_STR, (0, 10, 0), None),
    "num_speculative_tokens": (_POS_INT, (0, 10, 0), None),
    "draft_tensor_parallel_size": (_POS_INT, (0, 10, 0), None),
    "quantization": (_STR, (0, 10, 0), None),
    "max_model_len": (_POS_INT, (0, 10, 0), None),
    "revision": (_STR, (0, 10, 0), None),
    "code_revision": (_STR, (0, 10, 0), None),
    "disable_by_batch_size": (_POS_INT, (0, 10, 0), None),
    "prompt_lookup_max": (_POS_INT, (0, 10, 0), None),
    "prompt_lookup_min": (_POS_INT, (0, 10, 0), None),
    "speculative_token_tree": (_STR, (0, 10, 0), None),
    "disable_padded_drafter_batch": (_BOOL, (0, 11, 0), (0, 10, 99)),
    "enforce_eager": (_BOOL, (0, 24, 0), (0, 11, 99)),
    "suffix_decoding_max_tree_depth": (_POS_INT, (0, 24, 0), (0, 11, 0)),
    "suffix_decoding_max_cached_requests": (_NONNEG_INT, (0, 24, 0), (0, 11, 0)),
    "suffix_decoding_max_spec_factor": (_NUM, (0, 24, 0), (0, 11, 0)),
    "suffix_decoding_min_token_prob": (_NUM, (0, 24, 0), (0, 11, 0)),
}

# Keys people copy from old guides; each gets a precise fix instead of "unknown key".
_KEY_HINTS = {
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

# Separate flags that older vLLM had and that no longer exist; they make the server refuse to start.
# Derived from vllm_command.SPECULATIVE_FLAGS (the one registry of speculative flags): flag -> what to write instead.
REMOVED_FLAGS = {name: spec.replacement for name, spec in vllm_command.LEGACY_FLAGS.items()}
# 0.24+ shorthand flags (flag -> the JSON key it sets, from the same registry); each is mutually exclusive with that key in the JSON.
SHORTHAND_FLAGS = {spec.name: spec.key for spec in vllm_command.SPECULATIVE_FLAGS if spec.kind == "split"}
SHORTHAND_SINCE = (0, 24, 0)

PRESETS = {
    # The guide's conservative starting points.
    "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    "eagle3": {"method": "eagle3", "num_speculative_tokens": 3},
    "draft_model": {"method": "draft_model", "num_speculative_tokens": 3},
    "mtp": {"method": "mtp", "num_speculative_tokens": 1},
}

_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(version):
    """'0.32.0', 'v0.11.1rc2', '0.32.0+cpu', '0.24' -> (major, minor, patch)."""
    if isinstance(version, (tuple, list)):
        parts = tuple(int(p) for p in version) + (0, 0, 0)
        return parts[:3]
    match = _VERSION_RE.match(str(version))
    if not match:
        raise ValidationError(
            "%r is not a vLLM version" % (version,), field="vllm_version",
            hint="give a release such as '0.32.0' (what `python3 -c 'import vllm; print(vllm.__version__)'` prints)")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def format_version(version):
    return "%d.%d.%d" % tuple(version)


def printed_method(method):
    """The method name vLLM prints in its engine line: every `*_mtp` alias prints as 'mtp'."""
    if method is None:
        return None
    method = str(method)
    if method == "mtp" or method.endswith("_mtp"):
        return "mtp"
    return method


def guessed_method(model_path):
    """The method vLLM picks when `method` is omitted, from the draft model path (as vLLM 0.10-0.33 do)."""
    path = str(model_path or "").lower()
    if "eagle3" in path:
        return "eagle3"
    if "eagle-" in path:
        return "eagle"
    return "draft_model"


class SpeculativeConfig:
    """A validated speculative config: canonical JSON, normalised dict and warnings."""

    def __init__(self, config, warnings, vllm_version):
        self.config = config
        self.warnings = warnings
        self.vllm_version = vllm_version

    @property
    def json(self):
        return canonical_dumps(self.config)

    @property
    def method(self):
        return self.config.get("method") or guessed_method(self.config.get("model"))

    @property
    def has_draft_weights(self):
        return self.method in DRAFT_WEIGHT_METHODS

    def as_dict(self):
        return {"json": self.json, "config": self.config, "warnings": list(self.warnings),
                "vllm_version": format_version(self.vllm_version)}


def _canonical_value(value):
    if isinstance(value, dict):
        return {k: _canonical_value(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical_value(v) for v in value]
    return value


def canonical_dumps(config):
    """Compact JSON with a stable key order: method, model, num_speculative_tokens, then the rest sorted."""
    head = [k for k in ("method", "model", "num_speculative_tokens") if k in config]
    ordered = {k: _canonical_value(config[k]) for k in head}
    for key in sorted(k for k in config if k not in ordered):
        ordered[key] = _canonical_value(config[key])
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=True)


def _load(config, field):
    if isinstance(config, dict):
        return dict(config)
    if isinstance(config, (str, bytes)):
        text = config.decode("utf-8") if isinstance(config, bytes) else config
        if not text.strip():
            raise ValidationError("is empty", field=field,
                                  hint='give a JSON object such as {"method":"ngram","num_speculative_tokens":5,...}')
        try:
            loaded = json.loads(text)
        except ValueError as exc:
            raise ValidationError("is not valid JSON (%s)" % exc, field=field,
                                  hint="vLLM parses --speculative-config with json.loads: use double quotes and no trailing commas")
        if not isinstance(loaded, dict):
            raise ValidationError("must be a JSON object, got %s" % type(loaded).__name__, field=field,
                                  hint='wrap the settings in {...}')
        return loaded
    raise ValidationError("must be a dict or a JSON string, got %s" % type(config).__name__, field=field,
                          hint="pass a mapping of speculative-config keys")


def _normalise_keys(raw, field):
    """vLLM turns hyphens in keys into underscores; two spellings of one key are ambiguous."""
    out = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise ValidationError("key %r is not a string" % (key,), field=field, hint="use string keys")
        norm = key.strip().replace("-", "_")
        if norm in out:
            raise ValidationError("key '%s' is given twice (as '%s' and another spelling)" % (norm, key),
                                  field="%s.%s" % (field, norm), hint="keep one of them")
        out[norm] = value
    return out


def _check_type(key, value, kind, field):
    where = "%s.%s" % (field, key)
    if kind in (_INT, _POS_INT, _NONNEG_INT):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError("must be an integer, got %r" % (value,), field=where,
                                  hint="write a bare number such as 3 (not a string or a float)")
        if kind == _POS_INT and value <= 0:
            if key == "num_speculative_tokens":
                raise ValidationError("must be greater than zero, got %d (vLLM: 'Expected num_speculative_tokens to be "
                                      "greater than zero')" % value, field=where,
                                      hint="start with 3 for EAGLE-3 or draft models, 5 for ngram, 1 for mtp")
            raise ValidationError("must be at least 1, got %d" % value, field=where, hint="use a positive integer")
        if kind == _NONNEG_INT and value < 0:
            raise ValidationError("must not be negative, got %d" % value, field=where, hint="use 0 or more")
    elif kind == _STR:
        if not isinstance(value, str) or not value.strip():
            raise ValidationError("must be a non-empty string, got %r" % (value,), field=where,
                                  hint="give the value as text")
    elif kind == _NUM:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValidationError("must be a number, got %r" % (value,), field=where, hint="write a bare number")
    elif kind == _BOOL:
        if not isinstance(value, bool):
            raise ValidationError("must be true or false, got %r" % (value,), field=where, hint="write true or false")


def _resolve_version(vllm_version, warnings):
    if vllm_version in (None, ""):
        warnings.append("vllm_version not given: validated against vLLM %s, the newest version this collection knows; "
                        "set vllm_version to the runtime image's vLLM release" % format_version(NEWEST_KNOWN))
        return NEWEST_KNOWN
    version = parse_version(vllm_version)
    if version > (NEWEST_KNOWN[0], NEWEST_KNOWN[1], 999):
        warnings.append("vLLM %s is newer than %s, the newest version this collection knows: validated as %s"
                        % (format_version(version), format_version(NEWEST_KNOWN), format_version(NEWEST_KNOWN)))
    if version < OLDEST_KNOWN:
        raise ValidationError(
            "vLLM %s is older than %s; its --speculative-config keys differ (V0 engine)" % (format_version(version), format_version(OLDEST_KNOWN)),
            field="vllm_version", hint="use a runtime image with vLLM 0.10 or newer")
    return version


def _gate(name, since, absent_until, removed, version, what, field, warnings):
    """Error when `version` is known to lack `name`; warning when the table cannot tell."""
    vtxt = format_version(version)
    if removed and version >= removed:
        hint = "use eagle3 or draft_model" if what == "method" else "drop it"
        raise ValidationError("%s '%s' was removed in vLLM %s (you target %s)" % (what, name, format_version(removed), vtxt),
                              field=field, hint=hint)
    if version >= since:
        return
    if absent_until is None or version <= absent_until:
        if name == "draft_model":
            raise ValidationError("method 'draft_model' is not supported by vLLM %s (it raises 'not supported yet' in 0.10 "
                                  "and 0.11)" % vtxt, field=field,
                                  hint="upgrade the runtime to vLLM 0.24 or newer, or use eagle3 with an EAGLE-3 head")
        raise ValidationError("%s '%s' does not exist in vLLM %s (first seen in %s)" % (what, name, vtxt, format_version(since)),
                              field=field, hint="upgrade the runtime image or pick another %s" % what)
    warnings.append("%s '%s' is not verified for vLLM %s (known from %s on): check that the runtime accepts it"
                    % (what, name, vtxt, format_version(since)))


def validate(config, vllm_version=None, field="config"):
    """Validate a speculative config for a vLLM version. Returns a SpeculativeConfig or raises ValidationError."""
    warnings = []
    version = _resolve_version(vllm_version, warnings)
    cfg = _normalise_keys(_load(config, field), field)

    # Keys first: a misspelt key explains most other failures.
    for key in list(cfg):
        if key in _KEY_HINTS:
            if key == "tensor_parallel_size":
                raise ValidationError(_KEY_HINTS[key], field="%s.%s" % (field, key), hint="rename it to draft_tensor_parallel_size")
            raise ValidationError("'%s' is not a speculative-config key" % key, field="%s.%s" % (field, key), hint=_KEY_HINTS[key])
        if key not in _KEYS:
            known = ", ".join(sorted(_KEYS))
            if version >= (0, 24, 0):
                raise ValidationError("unknown key '%s': vLLM %s refuses it ('Unexpected keyword argument')" % (key, format_version(version)),
                                      field="%s.%s" % (field, key), hint="remove it or use one of: %s" % known)
            warnings.append("%s.%s: unknown key; vLLM %s silently drops it, so it has no effect (known keys: %s)"
                            % (field, key, format_version(version), known))
            continue
        kind, since, absent_until = _KEYS[key]
        _gate(key, since, absent_until, None, version, "key", "%s.%s" % (field, key), warnings)
        _check_type(key, cfg[key], kind, field)

    method = cfg.get("method")
    model = cfg.get("model")
    if method is not None:
        if method not in _METHODS:
            if method.endswith("_mtp") and version >= (0, 24, 0):
                warnings.append("method '%s' is not among the *_mtp aliases this collection knows; vLLM %s accepts "
                                "only its own aliases (printed as 'mtp')" % (method, format_version(version)))
            else:
                known = sorted(m for m, (since, _a, removed) in _METHODS.items()
                               if version >= since and not (removed and version >= removed))
                raise ValidationError("unknown method '%s' (vLLM: 'Unsupported speculative method')" % method,
                                      field="%s.method" % field, hint="use one of: %s" % ", ".join(known))
        else:
            since, absent_until, removed = _METHODS[method]
            _gate(method, since, absent_until, removed, version, "method", "%s.method" % field, warnings)
        effective = method
    else:
        if model is None:
            raise ValidationError("neither 'method' nor 'model' is set (vLLM: 'num_speculative_tokens was provided but "
                                  "without speculative model.')", field="%s.method" % field,
                                  hint="set method, e.g. 'ngram' with prompt_lookup_min/max, or 'eagle3' with the draft 'model' path")
        effective = guessed_method(model)
        warnings.append("%s.method is omitted: vLLM will guess '%s' from the draft path '%s'. Set method explicitly "
                        "(a path like /mnt/models/draft silently becomes draft_model)" % (field, effective, model))
        if effective == "draft_model":
            _gate("draft_model", *_METHODS["draft_model"], version=version, what="method", field="%s.method" % field,
                  warnings=warnings)

    if "num_speculative_tokens" not in cfg:
        raise ValidationError("is missing", field="%s.num_speculative_tokens" % field,
                              hint="set it explicitly: 3 for eagle3/draft_model, 5 for ngram, 1 for mtp")

    if effective in DRAFT_WEIGHT_METHODS and model is None:
        raise ValidationError("method '%s' needs the draft 'model' (a path under the mounted artifacts)" % effective,
                              field="%s.model" % field, hint="set model, e.g. /mnt/models/draft")
    if effective in MODEL_FREE_METHODS and model is not None:
        warnings.append("%s.model is ignored by method '%s' (it has no draft weights)" % (field, effective))

    if effective in NGRAM_METHODS:
        lo, hi = cfg.get("prompt_lookup_min"), cfg.get("prompt_lookup_max")
        if lo is None and hi is None:
            raise ValidationError("method '%s' needs lookup bounds" % effective, field="%s.prompt_lookup_max" % field,
                                  hint="set prompt_lookup_min and prompt_lookup_max, e.g. 2 and 4")
        if lo is None or hi is None:
            given, other = ("prompt_lookup_min", "prompt_lookup_max") if lo is not None else ("prompt_lookup_max", "prompt_lookup_min")
            warnings.append("%s.%s is not set: vLLM copies %s=%s to it; set both to make the window explicit"
                            % (field, other, given, cfg[given]))
        elif lo > hi:
            raise ValidationError("prompt_lookup_min=%d must be <= prompt_lookup_max=%d" % (lo, hi),
                                  field="%s.prompt_lookup_min" % field, hint="swap them or lower prompt_lookup_min")
    elif "prompt_lookup_min" in cfg or "prompt_lookup_max" in cfg:
        warnings.append("%s.prompt_lookup_min/max only apply to ngram; method '%s' ignores them" % (field, effective))

    if effective == "suffix":
        prob = cfg.get("suffix_decoding_min_token_prob")
        if prob is not None and not 0 <= prob <= 1:
            raise ValidationError("must be between 0 and 1, got %r" % prob, field="%s.suffix_decoding_min_token_prob" % field,
                                  hint="the default is 0.1")
        factor = cfg.get("suffix_decoding_max_spec_factor")
        if factor is not None and factor <= 0:
            raise ValidationError("must be greater than 0, got %r" % factor, field="%s.suffix_decoding_max_spec_factor" % field,
                                  hint="the default is 1.0")
        warnings.append("method 'suffix' needs the 'arctic-inference' package in the runtime image")
    elif any(k.startswith("suffix_decoding_") for k in cfg):
        warnings.append("%s.suffix_decoding_* keys only apply to method 'suffix'" % field)

    if effective in ("ngram", "suffix"):
        warnings.append("method '%s' turns async scheduling off in vLLM ('Async scheduling not supported with %s-based "
                        "speculative decoding and will be disabled')" % (effective, effective))
    if printed_method(effective) == "mtp" and cfg["num_speculative_tokens"] > 1:
        warnings.append("mtp with num_speculative_tokens=%d > 1 reuses the model's MTP layer(s) repeatedly; acceptance "
                        "usually drops after position 1: start with 1" % cfg["num_speculative_tokens"])
    if effective in DRAFT_WEIGHT_METHODS:
        warnings.append("draft weights are not counted in --gpu-memory-utilization: leave headroom for the draft model")
    tp = cfg.get("draft_tensor_parallel_size")
    if tp is not None and tp != 1:
        warnings.append("%s.draft_tensor_parallel_size=%d must be 1 or the target's tensor parallel size" % (field, tp))
    if version >= (0, 24, 0):
        warnings.append("requests with min_p > 0 or logit_bias get HTTP 400 under speculative decoding in vLLM %s"
                        % format_version(version))
    else:
        warnings.append("min_p and logit_bias are ignored under speculative decoding in vLLM %s" % format_version(version))

    return SpeculativeConfig(cfg, warnings, version)


def from_preset(preset, overrides=None, vllm_version=None):
    """A preset from the guide merged under `overrides`, then validated."""
    if preset not in PRESETS:
        raise ValidationError("unknown preset '%s'" % preset, field="preset", hint="use one of: %s" % ", ".join(sorted(PRESETS)))
    merged = dict(PRESETS[preset])
    if overrides:
        merged.update(_normalise_keys(_load(overrides, "overrides"), "overrides"))
    if preset == "eagle3" and "model" not in merged:
        raise ValidationError("preset 'eagle3' needs the draft model path", field="overrides.model",
                              hint="set overrides: {model: /mnt/models/draft} (the mounted EAGLE-3 head)")
    return validate(merged, vllm_version=vllm_version)


def canonical_json(config, vllm_version=None):
    """(canonical JSON string, normalised dict, warnings) for a config dict or JSON string."""
    result = validate(config, vllm_version=vllm_version)
    return result.json, result.config, result.warnings


def check_command(command, vllm_version=None, config=None, field="command"):
    """Refuse a server command that uses removed speculative flags, or a 0.24+ shorthand flag that duplicates a JSON key.

    `command` is a list of argv strings (a container's command + args, including `bash -c` scripts) or one shell line.
    Read with vllm_command's lexer: a flag counts as a word of the command (any spelling, ``--speculative_model=x``
    too), not as text inside a quoted value, a path or a comment. Returns a list of warnings.
    """
    used = {occ.flag for occ in vllm_command.find_occurrences(vllm_command.command_words(command))}
    for flag, repl in REMOVED_FLAGS.items():
        if flag in used:
            raise ValidationError("uses %s, which vLLM no longer has (the server exits on an unrecognized argument)" % flag,
                                  field=field, hint="remove it and put %s" % repl)
    warnings = []
    for flag, key in SHORTHAND_FLAGS.items():
        if flag not in used:
            continue
        version = parse_version(vllm_version) if vllm_version else NEWEST_KNOWN
        if version < SHORTHAND_SINCE:
            raise ValidationError("uses %s, which exists only from vLLM 0.24 (you target %s)" % (flag, format_version(version)),
                                  field=field, hint="put '%s' inside --speculative-config instead" % key)
        if config is not None and key in config:
            raise ValidationError("sets %s and '%s' inside --speculative-config; vLLM refuses both at once" % (flag, key),
                                  field=field, hint="keep one of them")
    return warnings
