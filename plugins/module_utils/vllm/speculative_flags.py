# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The registry of vLLM's speculative-decoding flags by name (every release's, the legacy pre-0.10 flags included).
(The Occurrence a reader reports and where the vLLM invocation is in a list or script are vllm/command_scan.py's, the
scan that asks them word by word.)

Which word of a command vLLM 0.32 reads as which option (abbreviations, ``-sc``, dotted keys, nargs) is
vllm/cli_parser.py, on the option table taken from vLLM's own parser; this registry names the flags and what each means
(kind, the ``--speculative-config`` key it sets, the legacy flags' replacement). Plain Python, no Ansible imports.
"""

from __future__ import annotations

import re

# --------------------------------------------------------------------------------------------------
# The one registry of vLLM's speculative-decoding flags
# --------------------------------------------------------------------------------------------------

# What a flag takes after it: a value (the next argv word or ``=value``), nothing (argparse store_true),
# or an optional true/false (vLLM's StoreBoolean with nargs='?': the next word only when it is a boolean).
VALUE = "value"
NO_VALUE = "none"
OPTIONAL_BOOL = "optional bool"
_BOOL_WORDS = ("true", "false")


class FlagSpec:
    """One speculative flag of vLLM's command line.

    ``kind``: ``json`` (the whole config), ``split`` (0.22+ shorthand for one key) or ``legacy`` (the separate
    flags of vLLM before 0.10, V0 engine; vLLM 0.10+ exits on them as unrecognized arguments, older images run
    speculative decoding with them). ``key``: the ``--speculative-config`` key it sets or maps to (None: none);
    ``value``: VALUE, NO_VALUE or OPTIONAL_BOOL; ``replacement``: what to write instead (legacy flags);
    ``aliases``: other spellings argparse maps to it. Every ``--`` spelling also matches with ``_`` for ``-``
    (vLLM's FlexibleArgumentParser turns ``--speculative_model`` into ``--speculative-model``).
    """

    __slots__ = ("name", "kind", "key", "value", "replacement", "aliases")

    def __init__(self, name, kind, key, value=VALUE, replacement=None, aliases=()):
        self.name = name
        self.kind = kind
        self.key = key
        self.value = value
        self.replacement = replacement
        self.aliases = tuple(aliases)

    def spellings(self):
        out = []
        for name in (self.name,) + self.aliases:
            out.append(name)
            if name.startswith("--"):
                out.append("--" + name[2:].replace("-", "_"))
        return out


_V0 = "nothing (removed with the V0 engine)"
# vLLM 0.6-0.7 vllm/engine/arg_utils.py (add_cli_args) for the legacy flags; 0.10-0.33 for the others.
# Not here: --num-lookahead-slots (a scheduler setting that exists without speculative decoding and alone enables none).
SPECULATIVE_FLAGS = (
    FlagSpec("--speculative-config", "json", None, aliases=("-sc",)),
    FlagSpec("--spec-method", "split", "method"),
    FlagSpec("--spec-model", "split", "model"),
    FlagSpec("--spec-tokens", "split", "num_speculative_tokens"),
    FlagSpec("--speculative-model", "legacy", "model", replacement="'model' inside --speculative-config"),
    FlagSpec("--num-speculative-tokens", "legacy", "num_speculative_tokens",
             replacement="'num_speculative_tokens' inside --speculative-config"),
    FlagSpec("--ngram-prompt-lookup-max", "legacy", "prompt_lookup_max", replacement="'prompt_lookup_max' inside --speculative-config"),
    FlagSpec("--ngram-prompt-lookup-min", "legacy", "prompt_lookup_min", replacement="'prompt_lookup_min' inside --speculative-config"),
    FlagSpec("--speculative-draft-tensor-parallel-size", "legacy", "draft_tensor_parallel_size",
             replacement="'draft_tensor_parallel_size' inside --speculative-config", aliases=("-spec-draft-tp",)),
    FlagSpec("--speculative-max-model-len", "legacy", "max_model_len", replacement="'max_model_len' inside --speculative-config"),
    FlagSpec("--speculative-disable-by-batch-size", "legacy", "disable_by_batch_size",
             replacement="'disable_by_batch_size' inside --speculative-config"),
    FlagSpec("--speculative-model-quantization", "legacy", "quantization", replacement="'quantization' inside --speculative-config"),
    FlagSpec("--speculative-disable-mqa-scorer", "legacy", None, NO_VALUE, replacement=_V0),
    FlagSpec("--spec-decoding-acceptance-method", "legacy", None, replacement=_V0),
    FlagSpec("--typical-acceptance-sampler-posterior-threshold", "legacy", None, replacement=_V0),
    FlagSpec("--typical-acceptance-sampler-posterior-alpha", "legacy", None, replacement=_V0),
    FlagSpec("--disable-logprobs-during-spec-decoding", "legacy", None, OPTIONAL_BOOL, replacement=_V0),
)
_DOTTED = FlagSpec("--speculative-config.<key>", "dotted", None)
_SPELLINGS = {spelling: spec for spec in SPECULATIVE_FLAGS for spelling in spec.spellings()}
LEGACY_FLAGS = {spec.name: spec for spec in SPECULATIVE_FLAGS if spec.kind == "legacy"}
_DOTTED_PREFIXES = ("--speculative-config.", "--speculative_config.")
DOTTED = _DOTTED


def spec_for_options(option_strings):
    """The FlagSpec of an action of vLLM's parser (``--speculative-config``/``-sc``, ``--spec-*``), by its option strings."""
    for name in option_strings:
        spec = _SPELLINGS.get(name)
        if spec is not None and spec.kind != "legacy":
            return spec
    return None


def flag_spellings():
    """Every spelling of every speculative flag (for leftover searches after a strip)."""
    return tuple(_SPELLINGS)


def classify_flag(word):
    """Return (kind, key, inline_value, spec) for an argv word that is a speculative flag, else None.

    kind is ``json`` (whole config), ``dotted`` (one key of the config), ``split`` (0.22+ flags) or ``legacy``
    (pre-0.10 separate flags); inline_value is the text after ``=`` or None when the value (if any) is the next word.
    """
    if not isinstance(word, str) or not word.startswith("-"):
        return None
    name, sep, value = word.partition("=")
    inline = value if sep else None
    spec = _SPELLINGS.get(name)
    if spec is not None:
        return (spec.kind, spec.key, inline, spec)
    for prefix in _DOTTED_PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return ("dotted", name[len(prefix):].replace("-", "_"), inline, _DOTTED)
    return None


# A word argparse takes for an option, not for the value of the option before it.
OPTION_RE = re.compile(r"--?[A-Za-z]")


def takes_next(spec, word):
    """Does ``spec`` (written without ``=``) take ``word``, the next argv word, as its value?"""
    if spec.value == NO_VALUE:
        return False
    if spec.value == OPTIONAL_BOOL:
        return str(word).strip().lower() in _BOOL_WORDS
    if spec.kind == "legacy" and OPTION_RE.match(str(word)):
        return False  # argparse refuses an option as the value: the next word is the next option, not ours
    return True
