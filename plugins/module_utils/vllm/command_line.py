# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read vLLM's command line and find its speculative-decoding flags, in a container's command or args list (the
editor that strips and sets them is vllm/command_edit.py, on the same registry and readers).

The one reader of the vLLM command: command_words (the argv vLLM receives, ``bash -c`` scripts opened, variables
expanded from the container's env) and option_value / find_option (the last ``--flag V`` of any option: ``--port``,
``--model``, ``--served-model-name``...). Every other module that needs an option of the command asks these. A caller
with several questions about one command or args list (its flags, their config, the strip, whether it is a shell
script) asks ``read`` once: the Command it returns carries every answer as a plain attribute, and ``read`` is cached
on the words and the env, so the rollback's plan, the runtime merge and the outcome share one reading of each list.

A list element is either one argv word (``--speculative-config``, its value, ``--speculative-config=<json>``,
``-sc``, ``--spec-method``...) or a shell script (the element after ``bash -c``/``sh -c``, or any element that
contains a flag as a shell word among other words). Scripts are edited at the byte level with a small
bash-compatible lexer (vllm/shell_lexer.py): only the flag and its value go, plus the whitespace/continuation that held them, so
the script stays valid (no dangling ``\\``, no blank line that ends the command early) and every other
byte is unchanged.

Which word is which option is decided as vLLM's own parser decides it (vllm/cli_parser.py on vLLM 0.32's option table;
vllm/command_scan.py finds the flags in lists and scripts, only among the vLLM invocation's words):

* ``--speculative-config <json>`` / ``=<json>`` / ``--speculative_config``, its alias ``-sc`` (``-sc=<json>``, ``-s``), and
  every unique prefix argparse accepts (``--speculative``, ``--speculative-c``);
* dotted keys ``--speculative-config.<key> <value>``, ``-sc.<key>=<value>``, ``--speculative.<key>``: vLLM gathers them per
  option into one JSON that replaces, not merges with, a ``--speculative-config`` JSON (config_from_occurrences does too);
* 0.22+ ``--spec-method``, ``--spec-model``, ``--spec-tokens`` and their prefixes (``--spec-tok``);
* the legacy flags of vLLM before 0.10 (``--speculative-model``, ``--num-speculative-tokens``,
  ``--ngram-prompt-lookup-max``... see SPECULATIVE_FLAGS, exact spellings: vLLM 0.32's parser has no such options), still in
  published manifests: older images run speculative decoding with them, so a rollback must remove them too.

SPECULATIVE_FLAGS (vllm/speculative_flags.py) names these flags; speculative_config.REMOVED_FLAGS and SHORTHAND_FLAGS are
derived from it. Releases other than 0.32 are read with 0.32's option table until theirs is taken
(hack/vllm_cli_registry.py).

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import functools
import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.command_scan import scan, scan_script, scan_variants
# a module, not its names: command_strip -> per_request_metrics -> speculative_config -> this file is a cycle at import time
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_strip
# The word predicates (where the vLLM invocation is) and the Occurrence live in vllm/command_scan.py, the flag registry in
# vllm/speculative_flags.py; their names stay importable from here, where the readers always found them.
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.command_scan import (  # noqa: F401  pylint: disable=unused-import
    Occurrence, invocation_end, invokes_vllm, is_shell_script, looks_like_script, script_shell_index,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.shell_lexer import ShellSyntaxError, simple_commands, tokenize
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_flags import (  # noqa: F401  pylint: disable=unused-import
    DOTTED, LEGACY_FLAGS, NO_VALUE, OPTION_RE, OPTIONAL_BOOL, SPECULATIVE_FLAGS, VALUE, FlagSpec, classify_flag, flag_spellings,
)

_OPTION_RE = OPTION_RE


def find_occurrences(items, env=None):
    """Every speculative flag of the vLLM invocation in a command/args list, in order, word by word as vLLM 0.32's parser
    reads it (vllm/command_scan.py)."""
    if not items:
        return []
    return scan(items, container_env(env) if env is not None else None)[0]


def script_occurrences(text):
    """Every speculative flag in one shell text (a script, or an env value such as VLLM_ADDITIONAL_ARGS that a script
    splices into the vLLM invocation); [] when it does not lex."""
    return scan_script(text) if isinstance(text, str) else []


def strip_problems(items, env=None):
    """What a strip of ``items`` cannot vouch for (``[{construct, text, where, why}]``, see vllm/command_scan.py):
    eval strings, run-time expansions where vLLM may read an option, pod-spec variables carrying a flag, a removal after
    which another option takes the positional model. ``env``: the container's env (see container_env)."""
    out = []
    for problem in scan(items or [], container_env(env), with_problems=True)[1]:
        if problem not in out:  # the pieces of one split variable say the same thing
            out.append(problem)
    return out


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


def has_speculative_config(items):
    return bool(find_occurrences(items))


def _parse_value(raw):
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return raw


_HUMAN_INT_RE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}


def _dotted_value(raw):
    """A dotted key's value as FlexibleArgumentParser.parse_args reads it (vLLM 0.32): JSON, else a human-readable integer
    (``2k`` 2000, ``1K`` 1024; vllm/utils/argparse_utils.py human_readable_int), else the text."""
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        pass
    text = str(raw).strip()
    match = _HUMAN_INT_RE.fullmatch(text)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." not in number:
            return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)
        return raw
    try:
        return int(text)
    except ValueError:
        return raw


def config_from_occurrences(occurrences, field="command"):
    """The speculative config these occurrences give vLLM, combined as vLLM 0.32 combines them: the last
    ``--speculative-config`` JSON, replaced as a whole by the dotted keys (FlexibleArgumentParser gathers each option's
    dotted keys into one JSON appended after every other word, so argparse keeps it over any explicit JSON: the two are
    not merged; of two groups, ``-sc.x`` and ``--speculative-config.y``, the one whose first word comes later wins), then
    the ``--spec-*`` shorthand flags set their keys."""
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
    groups = {}
    split = {}
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
                split[occ.key] = int(occ.raw)
            except ValueError:
                split[occ.key] = occ.raw
        elif occ.kind == "split":
            split[occ.key] = occ.raw
        else:
            _set_path(groups.setdefault(occ.group or "--speculative-config", {}), occ.key, _dotted_value(occ.raw))
    if groups:
        config = list(groups.values())[-1]
    both = sorted(key for key in split if key in config)
    if both:  # vLLM 0.32 EngineArgs.create_speculative_config raises ValueError on these
        raise ValidationError("the --spec-* flag for %s and the same key of --speculative-config are mutually exclusive: vLLM refuses "
                              "the command" % ", ".join(both), field=field, hint="give each key once, in the JSON or as a --spec-* flag")
    config.update(split)
    return {str(k).replace("-", "_"): v for k, v in config.items()}


def _set_path(node, path, value):
    """``--speculative-config.a.b 1`` -> ``{"a": {"b": 1}}`` (FlexibleArgumentParser's create_nested_dict)."""
    keys = path.split(".")
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = value


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
        shell = script_shell_index(argv, index)
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


# --------------------------------------------------------------------------------------------------
# One command read once: what every caller asks of it, as plain attributes
# --------------------------------------------------------------------------------------------------

def env_key(env):
    """The key ``read`` takes for a container's env (Kubernetes' list of ``{name, value}``, or a dict): its JSON text with
    sorted keys, None without one. A caller outside vllm/ writes ``json.dumps(env, sort_keys=True)`` at the call itself,
    so that a read already made costs it no call into this district (``read`` is a cache)."""
    return None if env is None else json.dumps(env, sort_keys=True)


class Command:
    """One command or args list (``items``, a tuple of words) read once, with its container's env (``env``: env_key's
    text; None: no env). What a caller asks of it is a plain attribute, all of it computed here from one scan of the
    list (vllm/command_scan.py ``scan_variants``: expansions unknown, and with the env and the strip's problems):

    ``occurrences`` the speculative flags of the vLLM invocation, word by word as vLLM's parser reads them, expansions
    unknown (find_occurrences(items)); ``config`` the speculative config they give vLLM (config_from_occurrences) or
    None, ``config_error`` the ValidationError that reading raises instead (None when it reads); ``raws`` each flag's
    value text; ``legacy`` the legacy flags (legacy_flags); ``shell_script`` the script of the list's first
    ``<shell> -c`` (None: no shell script); ``stripped`` the list without any speculative flag (strip_speculative_config
    without env); ``env_occurrences`` the flags with the env's values known; ``checked`` the rollback's strip with the env
    (command_edit.strip_checked), or None and ``refusal`` (``(message, hint)``) when the strip cannot vouch for the
    result (vllm/command_scan.py's problems) or its result still holds a flag.

    Shared through ``read``'s cache by every caller: nothing here is changed after it is built (tuples, not lists)."""

    def __init__(self, items, env=None):
        self.items = items
        env_dict = container_env(json.loads(env) if env is not None else None)  # no env: no variable is set
        ((plain, _none), (found, problems)), scripts = scan_variants(items, [(None, False), (env_dict, True)])
        self.occurrences = tuple(plain)
        self.env_occurrences = tuple(found)
        self.raws = tuple(o.raw or "" for o in plain)
        self.legacy = legacy_flags(plain)
        self.config, self.config_error = None, None
        try:
            self.config = config_from_occurrences(plain)
        except ValidationError as exc:
            self.config_error = exc
        self.shell_script = items[min(scripts)] if scripts else None
        self.stripped = tuple(command_strip.strip_found(items, plain, scripts)) if plain else items
        self.checked, self.refusal = items, None
        unique = []
        for problem in problems:
            if problem not in unique:  # the pieces of one split variable say the same thing
                unique.append(problem)
        if unique:
            self.checked, self.refusal = None, command_strip.refusal(unique)
        elif found:
            checked = self.stripped if _removals(found) == _removals(plain) else tuple(command_strip.strip_found(items, found, scripts))
            # the result read as the next caller will read it (the same cached Command): no flag may be left
            left = found if checked == items else read(checked, env).env_occurrences if checked else ()
            if left:  # pragma: no cover - a defect of the editor, never a user error
                self.checked, self.refusal = None, ("the strip left %s in place" % ", ".join(o.flag for o in left),
                                                    "report this command to the collection's maintainers")
            else:
                self.checked = checked


def _removals(occurrences):
    """What a strip of ``occurrences`` removes: two scans with the same removals strip to the same list."""
    return [(o.index, o.form, o.value_index, o.flag_token.start if o.flag_token is not None else None,
             o.value_token.end if o.value_token is not None else None) for o in occurrences]


@functools.lru_cache(maxsize=512)
def read(items, env=None):
    """The Command of ``items`` (a tuple of words: a container's command or args) with ``env`` (env_key's text of the
    container's env, None without one), read once: a later read of the same words and env is answered from the cache
    without running any of this district's code. The one entry point for a caller that asks several questions of one
    command (its flags, their config, the strip, where the script is)."""
    return Command(items, env)
