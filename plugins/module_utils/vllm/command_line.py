# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read vLLM's command line and find its speculative-decoding flags, in a container's command or args list (the
editor that strips and sets them is vllm/command_edit.py, on the same registry and readers).

The one reader of the vLLM command: command_words (the argv vLLM receives, ``bash -c`` scripts opened, variables
expanded from the container's env) and option_value / find_option (the last ``--flag V`` of any option: ``--port``,
``--model``, ``--served-model-name``...). Every other module that needs an option of the command asks these.

A list element is either one argv word (``--speculative-config``, its value, ``--speculative-config=<json>``,
``-sc``, ``--spec-method``...) or a shell script (the element after ``bash -c``/``sh -c``, or any element that
contains a flag as a shell word among other words). Scripts are edited at the byte level with a small
bash-compatible lexer (vllm/shell_lexer.py): only the flag and its value go, plus the whitespace/continuation that held them, so
the script stays valid (no dangling ``\\``, no blank line that ends the command early) and every other
byte is unchanged.

Forms recognised (vLLM 0.10 to 0.33):

* ``--speculative-config <json>`` / ``--speculative-config=<json>`` (also ``--speculative_config``),
  the short alias ``-sc <json>`` / ``-sc=<json>``;
* dotted keys ``--speculative-config.<key> <value>`` / ``--speculative-config.<key>=<value>``;
* 0.22+ ``--spec-method``, ``--spec-model``, ``--spec-tokens`` (space or ``=`` form, ``_`` spelling too; which release has
  them is each table's shorthand_flags in speculative_releases);
* the legacy flags of vLLM before 0.10 (``--speculative-model``, ``--num-speculative-tokens``,
  ``--ngram-prompt-lookup-max``... see SPECULATIVE_FLAGS), still in published manifests: older images run
  speculative decoding with them, so a rollback must remove them too.

SPECULATIVE_FLAGS is the one list of these flags (spellings, value arity); speculative_config.REMOVED_FLAGS and SHORTHAND_FLAGS
are derived from it.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.shell_lexer import ShellSyntaxError, simple_commands, tokenize

_SCRIPT_SHELLS = ("bash", "sh", "dash", "zsh", "ksh", "ash")

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
# Substrings that make an argv element worth lexing as a script (a flag as one of its shell words).
_FLAG_HINTS = ("--spec", "-sc") + tuple(s for s in _SPELLINGS if "--spec" not in s and "-sc" not in s)


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
_OPTION_RE = re.compile(r"--?[A-Za-z]")


def _takes_next(spec, word):
    """Does ``spec`` (written without ``=``) take ``word``, the next argv word, as its value?"""
    if spec.value == NO_VALUE:
        return False
    if spec.value == OPTIONAL_BOOL:
        return str(word).strip().lower() in _BOOL_WORDS
    if spec.kind == "legacy" and _OPTION_RE.match(str(word)):
        return False  # argparse refuses an option as the value: the next word is the next option, not ours
    return True


# --------------------------------------------------------------------------------------------------
# Occurrences
# --------------------------------------------------------------------------------------------------

class Occurrence:
    """One speculative flag found in a list: where it is and what it says."""

    __slots__ = ("index", "kind", "key", "raw", "form", "flag_token", "value_token", "has_value", "literal", "flag")

    def __init__(self, index, kind, key, raw, form, flag_token=None, value_token=None, has_value=True, literal=True, flag=None):
        self.index = index  # list element holding the flag
        self.kind = kind  # json | dotted | split | legacy
        self.key = key
        self.raw = raw  # the value text as vLLM receives it (None: no value)
        self.form = form  # argv | argv_inline | script | script_inline
        self.flag_token = flag_token
        self.value_token = value_token
        self.has_value = has_value
        self.literal = literal  # False: the value is a shell expansion ($VAR, $(...)) known only at run time
        self.flag = flag  # the flag's registry name (``--speculative-model`` for ``--speculative_model=x`` too)

    def as_dict(self):
        return {"index": self.index, "kind": self.kind, "key": self.key, "value": self.raw, "form": self.form, "flag": self.flag}


# ``-c`` alone or in a cluster of the shell's one-letter options (``sh -ec``, ``bash -lc``).
_SHELL_C_RE = re.compile(r"-[A-Za-z]*c[A-Za-z]*")


def _script_shell_index(items, index):
    """The index of the shell when items[index] is the script of ``<shell> [options] -c`` in the same list, else None."""
    if index < 2 or not _SHELL_C_RE.fullmatch(str(items[index - 1])):
        return None
    shell = index - 2
    while shell > 0 and str(items[shell]).startswith("-"):
        shell -= 1
    name = str(items[shell]).rsplit("/", 1)[-1]
    return shell if name in _SCRIPT_SHELLS or name.startswith("bash") else None


def is_shell_script(items, index):
    """True when items[index] is the script of ``<shell> -c`` (``bash -c``, ``sh -ec``, ``/bin/bash -lc``) in the same list."""
    return _script_shell_index(items, index) is not None


def looks_like_script(text):
    """A string with shell separators in it: worth lexing as a script."""
    return isinstance(text, str) and any(c in text for c in " \t\n;&|")


def _script_occurrences(text, index):
    try:
        tokens = tokenize(text)
    except ShellSyntaxError:
        return None
    found = []
    for cmd in simple_commands(tokens):
        words = list(cmd)
        i = 0
        while i < len(words):
            tok, is_arg = words[i]
            info = classify_flag(tok.value) if (tok.kind == "word" and is_arg) else None
            if info and not tok.literal:
                # `--speculative-config="$SPEC"`: fine when the expansion is only in the value
                rawtok = text[tok.start:tok.end]
                if info[2] is None or "=" not in rawtok or any(c in rawtok[:rawtok.index("=")] for c in "$`"):
                    info = None
            if info:
                kind, key, inline, spec = info
                if inline is not None:
                    if not tok.literal:
                        rawtok = text[tok.start:tok.end]
                        inline = rawtok[rawtok.index("=") + 1:]
                    found.append(Occurrence(index, kind, key, inline, "script_inline", tok, None, literal=tok.literal, flag=spec.name))
                    i += 1
                    continue
                nxt = words[i + 1] if i + 1 < len(words) else None
                if nxt is not None and nxt[1] and nxt[0].kind == "word" and _takes_next(spec, nxt[0].value):
                    raw = nxt[0].value if nxt[0].literal else _expansion_text(text, nxt[0])
                    found.append(Occurrence(index, kind, key, raw, "script", tok, nxt[0], literal=nxt[0].literal, flag=spec.name))
                    i += 2
                    continue
                found.append(Occurrence(index, kind, key, None, "script", tok, None, has_value=False, flag=spec.name))
            i += 1
    return found


def _expansion_text(text, tok):
    return text[tok.start:tok.end]


def find_occurrences(items):
    """Every speculative flag in a command/args list, in order."""
    if not items:
        return []
    found = []
    i = 0
    items = list(items)
    while i < len(items):
        word = items[i]
        if not isinstance(word, str):
            i += 1
            continue
        if is_shell_script(items, i) or (classify_flag(word) is None and _FLAG_HINT_IN(word) and looks_like_script(word)):
            occ = _script_occurrences(word, i)
            if occ:
                found.extend(occ)
            i += 1
            continue
        info = classify_flag(word)
        if info:
            kind, key, inline, spec = info
            if inline is not None:
                found.append(Occurrence(i, kind, key, inline, "argv_inline", flag=spec.name))
                i += 1
                continue
            if i + 1 < len(items) and _takes_next(spec, items[i + 1]):
                found.append(Occurrence(i, kind, key, str(items[i + 1]), "argv", flag=spec.name))
                i += 2
                continue
            found.append(Occurrence(i, kind, key, None, "argv", has_value=False, flag=spec.name))
        i += 1
    return found


def script_occurrences(text):
    """Every speculative flag in one shell text (a script, or an env value such as VLLM_ADDITIONAL_ARGS that a script
    splices into the vLLM invocation); [] when it does not lex."""
    return _script_occurrences(text, 0) or []


def script_errors(items):
    """Why each ``<shell> -c`` script in a command/args list does not lex (``["unterminated single quote", ...]``), in order.

    find_occurrences finds no flag in such a script, which is true of what runs (the shell refuses the script before vLLM
    starts, so the pod crash-loops) but would read as "no speculative flag" to someone who expects one: readers say why."""
    out = []
    items = list(items or [])
    for index, word in enumerate(items):
        if isinstance(word, str) and is_shell_script(items, index):
            try:
                tokenize(word)
            except ShellSyntaxError as exc:
                out.append(str(exc))
    return out


def _FLAG_HINT_IN(word):  # pylint: disable=invalid-name
    return any(hint in word for hint in _FLAG_HINTS)


def has_speculative_config(items):
    return bool(find_occurrences(items))


def _parse_value(raw):
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return raw


def config_from_occurrences(occurrences, field="command"):
    """Merge occurrences the way vLLM does (JSON object, then dotted keys and split flags override)."""
    if not occurrences:
        return None
    legacy = legacy_flags(occurrences)
    if legacy:
        names = ", ".join(legacy)
        raise ValidationError(
            "carries vLLM's legacy speculative flag(s) %s, which only vLLM before 0.10 reads (speculative decoding is on there; "
            "vLLM 0.10+ exits on them as unrecognized arguments)" % names, field=field,
            hint="roll back (isvc_speculative state=absent removes them), or replace them with --speculative-config %s"
            % legacy_replacement_json(legacy))
    config = {}
    for occ in occurrences:
        if occ.raw is None:
            raise ValidationError("%s has no value" % _describe(occ), field=field,
                                  hint="give the flag a JSON value or remove it")
        if not occ.literal:
            raise ValidationError(
                "the %s value is a shell expansion (%s), known only inside the running container" % (_describe(occ), occ.raw[:200]),
                field=field, hint="write the JSON inline in the command, or read what the engine runs with the engine_config_info module")
        if occ.kind == "json":
            try:
                value = json.loads(occ.raw)
            except ValueError as exc:
                raise ValidationError(
                    "the --speculative-config value is not JSON (%s): %r" % (exc, occ.raw[:200]), field=field,
                    hint="write the value as a JSON object, e.g. '{\"method\":\"ngram\",\"num_speculative_tokens\":5}'"
                ) from None
            if not isinstance(value, dict):
                raise ValidationError("the --speculative-config value is not a JSON object: %r" % occ.raw[:200],
                                      field=field, hint="use a JSON object such as {\"method\": \"ngram\", ...}")
            config = dict(value)
        elif occ.kind == "split" and occ.key == "num_speculative_tokens":
            try:
                config[occ.key] = int(occ.raw)
            except ValueError:
                config[occ.key] = occ.raw
        elif occ.kind == "split":
            config[occ.key] = occ.raw
        else:
            config[occ.key] = _parse_value(occ.raw)
    return {str(k).replace("-", "_"): v for k, v in config.items()}


def _describe(occ):
    return {"json": "--speculative-config", "split": "--spec-*", "dotted": "--speculative-config.<key>"}.get(occ.kind, occ.flag)


def legacy_flags(occurrences):
    """``{flag: value}`` of the legacy (pre-0.10) flags among ``occurrences``, by registry name, in order.

    A flag without a value (``--speculative-disable-mqa-scorer``) maps to True; a repeated flag keeps the last value
    (argparse does the same).
    """
    out = {}
    for occ in occurrences:
        if occ.kind == "legacy":
            out[occ.flag] = occ.raw if occ.raw is not None else True
    return out


def flag_names(occurrences):
    """The registry names of the flags among ``occurrences``, in order, without repeats (for messages)."""
    out = []
    for occ in occurrences:
        name = occ.flag or _describe(occ)
        if name not in out:
            out.append(name)
    return out


def legacy_replacement_json(legacy):
    """The ``--speculative-config`` JSON that says what ``legacy`` ({flag: value}) said, as far as it can be said.

    ``--speculative-model '[ngram]'`` becomes ``"method": "ngram"``; flags of the V0 engine with no key are dropped.
    """
    config = {}
    for flag, value in legacy.items():
        spec = LEGACY_FLAGS.get(flag)
        if spec is None or spec.key is None or value is True:
            continue
        config[spec.key] = _parse_value(value) if spec.key != "model" else value
    if config.get("model") == "[ngram]":
        del config["model"]
        config = dict({"method": "ngram"}, **config)
    return json.dumps(config, separators=(",", ":"))


def find_speculative_config(command_list, args_list=None):
    """Return the speculative config a vLLM command line passes (a dict), or None when it has none.

    ``command_list`` may be a container's command and ``args_list`` its args (both are searched, in
    the order the container sees them). Raises ValidationError when the flag is present but its value
    cannot be read (not JSON, or missing).
    """
    occ = find_occurrences(command_list or []) + find_occurrences(args_list or [])
    return config_from_occurrences(occ)


# --------------------------------------------------------------------------------------------------
# Reading any option of the vLLM invocation (--port, --model, --served-model-name, --dtype...)
# --------------------------------------------------------------------------------------------------

# Kubernetes expands ``$(NAME)`` in a container's command and args from its env (``$$`` is a literal ``$``), before
# any shell runs; an unknown name stays as written.
_KUBE_REF_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def container_env(env):
    """A container's environment as ``{name: value}``: a dict, or Kubernetes' list of ``{name, value}`` (as KServe's
    predictor and pod specs have it), where a value may use ``$(EARLIER)``. A variable set through valueFrom has no
    value here, so it stays unknown rather than becoming ``"None"``."""
    if isinstance(env, dict):
        return {str(k): str(v) for k, v in env.items() if v is not None}
    out = {}
    for item in env or []:
        if isinstance(item, dict) and item.get("name") and item.get("value") is not None:
            out[str(item["name"])] = _kube_expand(str(item["value"]), out)
    return out


def _kube_expand(word, env):
    return _KUBE_REF_RE.sub(lambda m: "$" if m.group(1) is None else env.get(m.group(1), m.group(0)), word)


def _shell_words(text, env):
    """The argv words of a shell line or script, or None when bash could not run it (unterminated quote).

    When one of its simple commands (or what it evals) runs vLLM, only those commands' words (``echo --port 1`` or a ``pip install``
    before ``exec vllm serve`` is not vLLM's command line); else every command's. Comments, redirections, line
    continuations and quotes are read as bash reads them; variables the script itself sets are not followed.
    """
    try:
        tokens = tokenize(text, env)
    except ShellSyntaxError:
        return None
    commands = [[tok.value for tok, is_arg in cmd if is_arg and tok.kind == "word"] for cmd in simple_commands(tokens)]
    # eval joins its arguments with blanks and runs them as a script: KServe's LLMInferenceService presets start vLLM
    # with eval "vllm serve ... ${VLLM_ADDITIONAL_ARGS}", so the variable's words become options.
    commands = [(_shell_words(" ".join(cmd[1:]), env) or cmd) if cmd[:1] == ["eval"] else cmd for cmd in commands]
    vllm = [cmd for cmd in commands if invokes_vllm(cmd)]
    return _open_scripts([word for cmd in (vllm or commands) for word in cmd], env, lines=False)


def _open_scripts(argv, env, lines):
    """argv with the script of each ``<shell> -c`` (the shell and its options included) replaced by the script's words.

    ``lines``: also open an element that is itself a shell line (words separated by blanks, e.g. an LLMInferenceService's
    args whose ``bash -c`` is in a preset's command), unless it is the value of the option before it (a JSON value with
    blanks). Words that came out of a shell lexer are never re-split: bash passes a quoted word as one argument.
    """
    groups = [[word] for word in argv]
    for index, word in enumerate(argv):
        shell = _script_shell_index(argv, index)
        if shell is None and not (lines and looks_like_script(word) and not _awaits_value(argv, index)):
            continue
        words = _shell_words(word, env)
        if words is None:
            continue
        for opened in range(index if shell is None else shell, index):
            groups[opened] = []
        groups[index] = words
    return [word for group in groups for word in group]


def _awaits_value(argv, index):
    prev = str(argv[index - 1]) if index > 0 else ""
    return prev.startswith("-") and prev not in ("-", "--") and "=" not in prev


def command_words(items, env=None):
    """The words vLLM receives as argv, from a container's command + args (a list) or from one shell line (a string).

    The script of ``bash -c``/``sh -c`` (and a list element that is itself a shell line) is read with this module's
    bash lexer: comments, line continuations, quotes and redirections as bash reads them, so a ``--port`` inside a
    comment or a quoted JSON value is not an option. ``env`` is the container's environment (see container_env):
    ``$(VAR)`` in list elements is expanded as Kubernetes does, ``$VAR``/``${VAR}``/``${VAR:-default}`` in scripts as
    bash does; unknown variables and ``$(...)`` command substitutions stay as written.
    """
    env = container_env(env)
    if items is None:
        return []
    if isinstance(items, str):
        words = _shell_words(items, env)
        return [items] if words is None else words
    return _open_scripts([_kube_expand(str(word), env) for word in items], env, lines=True)


def _option_name(flag):
    # vLLM's FlexibleArgumentParser reads ``--served_model_name`` as ``--served-model-name``.
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag


def find_option(items, flags, env=None):
    """``(flag as written, value)`` of the last ``--flag V`` / ``--flag=V`` among ``flags`` (one spelling or several;
    ``_`` and ``-`` are the same in a long option, as vLLM reads them), or None. argparse keeps the last value of a
    repeated option. A flag followed by another option or by nothing has no value and is skipped.
    ``items`` and ``env`` as for command_words."""
    names = {_option_name(flag) for flag in ((flags,) if isinstance(flags, str) else flags)}
    words = command_words(items, env)
    found = None
    for index, word in enumerate(words):
        name, sep, value = word.partition("=")
        if _option_name(name) not in names:
            continue
        if sep:
            found = (name, value)
        elif index + 1 < len(words) and not _OPTION_RE.match(words[index + 1]):
            found = (name, words[index + 1])
    return found


def served_model(items, env=None):
    """The model vLLM is asked to serve: the positional model of ``vllm serve <model>`` (vLLM's ``serve`` puts it over
    ``--model``: ``vllm/entrypoints/cli/serve.py``), else the value of ``--model`` (None when neither is there).
    ``items`` and ``env`` as for command_words."""
    words = command_words(items, env)
    for index, word in enumerate(words[:-1]):
        if word.rsplit("/", 1)[-1] == "vllm" and words[index + 1] == "serve":
            following = words[index + 2:]
            if following and not _OPTION_RE.match(following[0]):
                return following[0]
    return option_value(words, "--model")


def option_value(items, flags, env=None):
    """The value of the last ``--flag V`` / ``--flag=V`` for any spelling in ``flags`` (None when absent): what vLLM
    (or KServe's model server) runs with, e.g. ``option_value(command + args, "--port", container["env"])``."""
    found = find_option(items, flags, env)
    return None if found is None else found[1]


def invokes_vllm(words):
    """True when argv words (strings) run vLLM's OpenAI server: ``-m vllm.entrypoints...``, ``[path/]vllm serve`` or an
    entrypoints ``.py`` file."""
    words = [str(w) for w in words]
    for i, val in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if val == "-m" and nxt.startswith("vllm.entrypoints"):
            return True
        if val.rsplit("/", 1)[-1] == "vllm" and nxt == "serve":
            return True
        if ("vllm.entrypoints" in val or "vllm/entrypoints/" in val) and val.endswith(".py"):
            return True
    return False
