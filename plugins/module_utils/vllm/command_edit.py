# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Strip and set vLLM's speculative-decoding flags in a container's command or args list, on the flag registry and the
occurrence readers of vllm/command_line.py (the reader lives there; this is the editor).

Scripts are edited at the byte level with the bash-compatible lexer (vllm/shell_lexer.py): only the flag and its value
go, plus the whitespace/continuation that held them, so the script stays valid (no dangling ``\\``, no blank line that
ends the command early) and every other byte is unchanged (the removal is vllm/command_strip.py's, one pass over one
scan; a strip without env, and the rollback's checked strip, are vllm/command_line.py's command read once). A flag is
inserted after the last argument of the vLLM invocation, in the script's own continued-line style.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.command_line import (
    config_from_occurrences, container_env, find_occurrences, invokes_vllm, is_shell_script, looks_like_script,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.command_scan import scan_script, scan_variants
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.command_strip import anchor as _anchor
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.command_strip import strip_found, strip_text
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.shell_lexer import ShellSyntaxError, simple_commands, tokenize

# --------------------------------------------------------------------------------------------------
# Stripping
# --------------------------------------------------------------------------------------------------


def strip_script(text, keep_anchor=False, env=None):
    """Remove every speculative flag (and its value) of the vLLM invocation from a shell script. Returns the new text.

    With keep_anchor, the first ``--speculative-config <value>`` stays (set_speculative_config replaces it). ``env``: the
    container's env (a word such as ``"$SPEC_ARGS"`` whose value from the pod spec is a flag goes too).
    """
    occ = scan_script(text, container_env(env) if env is not None else None)
    kept = _anchor(occ) if keep_anchor else None
    return strip_text(text, [o for o in occ if o is not kept], companions=not keep_anchor)


def strip_speculative_config(items, keep_anchor=False, env=None):
    """Return a copy of a command/args list without any speculative flag of the vLLM invocation; a no-op when there is
    none. ``env``: the container's env, for words whose value the pod spec gives."""
    if items is None:
        return None
    if not keep_anchor and env is None:
        return list(command_line.read(tuple(items)).stripped)  # the command read once (cached)
    ((found, _problems),), scripts = scan_variants(items, [(container_env(env) if env is not None else None, False)])
    return strip_found(items, found, scripts, keep_anchor=keep_anchor)


def strip_checked(items, env=None, field="command"):
    """strip_speculative_config for a rollback that must not claim a clean command that is not: refuses (ValidationError
    naming each construct) when the vLLM invocation holds what the strip cannot resolve (an eval string, a run-time
    expansion where vLLM may read an option, a pod-spec variable carrying a flag, a multi-value option that would take
    the positional model once the flag is gone; see vllm/command_scan.py), and checks its own result: no flag left.
    ``env``: the container's env (None: the pod spec sets no variable, every expansion is unknown). The command is
    read once (vllm/command_line.py ``read``)."""
    if items is None:
        return None
    command = command_line.read(tuple(items), command_line.env_key(env if env is not None else {}))
    if command.refusal is not None:
        message, hint = command.refusal
        raise ValidationError(message, field=field, hint=hint)
    return list(command.checked)


# --------------------------------------------------------------------------------------------------
# Setting
# --------------------------------------------------------------------------------------------------

def shell_quote(value, style="'"):
    """Quote a value for a bash script in the given style (``'`` or ``"``)."""
    if style == '"':
        return '"' + re.sub(r'(["\\$`])', r"\\\1", value) + '"'
    return "'" + value.replace("'", "'\\''") + "'"


def _script_insert(text, canonical_json):
    """Insert ``--speculative-config '<json>'`` after the last argument of the vLLM invocation in a script."""
    try:
        tokens = tokenize(text)
    except ShellSyntaxError:
        return None
    for cmd in simple_commands(tokens):
        if not invokes_vllm(tok.value for tok, _is_arg in cmd if tok.kind == "word"):
            continue
        args = [tok for tok, is_arg in cmd if is_arg and tok.kind == "word"]
        last = args[-1]
        flag = "--speculative-config " + shell_quote(canonical_json, "'")
        # continued-line style: the invocation spans lines joined by `\`
        first = cmd[0][0]
        rest = text[last.end:].lstrip(" \t")
        if "\\\n" in text[first.start:last.end] and (not rest or rest[0] in "\n#"):
            line_start = text.rfind("\n", 0, last.start) + 1
            indent = re.match(r"[ \t]*", text[line_start:]).group(0)
            prev_cont = text.rfind("\\\n", first.start, last.start)
            sep = " \\\n" if text[prev_cont - 1:prev_cont] in (" ", "\t") else "\\\n"
            return text[:last.end] + sep + indent + flag + text[last.end:]
        return text[:last.end] + " " + flag + text[last.end:]
    return None


def _replace_value_in_script(text, occ, canonical_json):
    """Replace one script occurrence's value, keeping its quoting style (single quotes when unquoted)."""
    tok = occ.flag_token if occ.form == "script_inline" else occ.value_token
    style = '"' if tok.quote == '"' else "'"
    new = shell_quote(canonical_json, style)
    if occ.form == "script_inline":
        new = tok.value.partition("=")[0] + "=" + new
    return text[:tok.start] + new + text[tok.end:]


def set_speculative_config(command_list, canonical_json):
    """Set the speculative config in one command (or args) list; returns the new list.

    See set_speculative_config_in for the rules; use that one when the container has both command and args.
    """
    return set_speculative_config_in(command_list, None, canonical_json)[0]


def set_speculative_config_in(command_list, args_list, canonical_json):
    """Set the speculative config to ``canonical_json`` in a container's command and args.

    Replaces the first ``--speculative-config`` value (keeping its form and quoting style) and removes every
    other speculative flag (``--spec-*`` and dotted keys would override or conflict with the JSON); when
    there is none, inserts ``--speculative-config '<json>'`` after the vLLM invocation's last argument in a
    ``bash -c`` script, or appends ``--speculative-config <json>`` to an argv list (to args when the
    container has args). Returns ``(command, args)``; lists come back unchanged when the same config (as
    parsed JSON) is already the only speculative flag.
    """
    try:
        wanted = json.loads(canonical_json)
    except (TypeError, ValueError):
        raise ValidationError("is not JSON: %r" % (canonical_json,), field="config",
                              hint="pass the canonical JSON from the speculative_config module") from None
    command = list(command_list) if command_list is not None else None
    args = list(args_list) if args_list is not None else None
    occ_cmd = find_occurrences(command or [])
    occ_args = find_occurrences(args or [])
    occ_all = occ_cmd + occ_args
    if not occ_all:
        return _insert(command, args, canonical_json)
    try:
        current = config_from_occurrences(occ_all)
    except ValidationError:
        current = None
    if current == wanted and len(occ_all) == 1 and occ_all[0].kind == "json":
        return command, args
    anchor = _anchor(occ_all)
    if anchor is None:
        command = strip_speculative_config(command)
        args = strip_speculative_config(args)
        return _insert(command, args, canonical_json)
    if anchor in occ_cmd:
        command = _set_anchor(command, canonical_json)
        args = strip_speculative_config(args)
    else:
        command = strip_speculative_config(command)
        args = _set_anchor(args, canonical_json)
    return command, args


def _set_anchor(items, canonical_json):
    """Strip every flag but the first JSON one, then give that one the new value (same form and quoting)."""
    items = strip_speculative_config(items, keep_anchor=True)
    anchor = _anchor(find_occurrences(items))
    if anchor.form == "argv":
        items[anchor.index + 1] = canonical_json
    elif anchor.form == "argv_inline":
        items[anchor.index] = items[anchor.index].partition("=")[0] + "=" + canonical_json
    else:
        items[anchor.index] = _replace_value_in_script(items[anchor.index], anchor, canonical_json)
    return items


def _insert(command, args, canonical_json):
    for name, items in (("command", command), ("args", args)):
        if not items:
            continue
        for i, word in enumerate(items):
            if isinstance(word, str) and (is_shell_script(items, i) or (name == "args" and looks_like_script(word) and "vllm" in word)):
                new = _script_insert(word, canonical_json)
                if new is not None:
                    items = list(items)
                    items[i] = new
                    return (items, args) if name == "command" else (command, items)
    # argv style: append to args when there are args, else to the command
    if args:
        return command, list(args) + ["--speculative-config", canonical_json]
    if command:
        if not invokes_vllm(command) and not any("vllm" in str(w) for w in command):
            raise ValidationError("no vLLM invocation found to add --speculative-config to", field="command",
                                  hint="the predictor must run `python3 -m vllm.entrypoints.openai.api_server` or `vllm serve`")
        return list(command) + ["--speculative-config", canonical_json], args
    raise ValidationError("the container has neither command nor args to add --speculative-config to", field="command",
                          hint="set the vLLM command in spec.predictor.model.command or args first")
