# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Strip and set vLLM's speculative-decoding flags in a container's command or args list, on the flag registry and the
occurrence readers of vllm/command_line.py (the reader lives there; this is the editor).

Scripts are edited at the byte level with the bash-compatible lexer (vllm/shell_lexer.py): only the flag and its value
go, plus the whitespace/continuation that held them, so the script stays valid (no dangling ``\\``, no blank line that
ends the command early) and every other byte is unchanged. A flag is inserted after the last argument of the vLLM
invocation, in the script's own continued-line style.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.command_line import (
    config_from_occurrences, container_env, find_occurrences, invokes_vllm, is_shell_script, looks_like_script, strip_problems,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.command_scan import scan_script
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import per_request_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.shell_lexer import ShellSyntaxError, simple_commands, tokenize

# --------------------------------------------------------------------------------------------------
# Stripping
# --------------------------------------------------------------------------------------------------


def _removal_span(text, start, end):
    """Span to delete for a flag (+value) at text[start:end] so the script stays valid and tidy."""
    # left context
    left = start
    while left > 0 and text[left - 1] in " \t":
        left -= 1
    at_line_start = left == 0 or text[left - 1] == "\n"
    continued_from_above = at_line_start and left >= 2 and text[left - 2] == "\\" and _escaped_newline(text, left - 1)
    # right context
    right = end
    while right < len(text) and text[right] in " \t":
        right += 1
    cont_after = text.startswith("\\\n", right)
    line_ends_after = right >= len(text) or text[right] == "\n" or text[right] == "#"

    if at_line_start and cont_after:
        # `  --flag value \` on its own continued line: drop the whole line, the previous `\` carries on
        return left, right + 2
    if continued_from_above and (line_ends_after or not cont_after):
        if line_ends_after:
            # last line of a continued command: drop it together with the previous line's ` \`
            p = left - 2
            while p > 0 and text[p - 1] in " \t":
                p -= 1
            return p, end
        # followed by more words on the same line: keep the line, drop flag + value + following blanks
        return start, right
    if at_line_start:
        if right >= len(text):
            # the last line holds only the flag: remove it with the newline before it
            return (left - 1 if left > 0 else left), right
        if text[right] == "\n":
            return left, right + 1
        return start, right
    # mid-line: drop the blanks before the flag, keep what follows
    return left, end


def _escaped_newline(text, nl_index):
    """True when the newline at nl_index is preceded by an odd number of backslashes (a continuation)."""
    count = 0
    i = nl_index - 1
    while i >= 0 and text[i] == "\\":
        count += 1
        i -= 1
    return count % 2 == 1


def strip_script(text, keep_anchor=False, env=None):
    """Remove every speculative flag (and its value) of the vLLM invocation from a shell script. Returns the new text.

    With keep_anchor, the first ``--speculative-config <value>`` stays (set_speculative_config replaces it). ``env``: the
    container's env (a word such as ``"$SPEC_ARGS"`` whose value from the pod spec is a flag goes too).
    """
    env = container_env(env) if env is not None else None
    removed = False
    for _attempt in range(10000):
        occ = scan_script(text, env)
        if keep_anchor:
            anchor = _anchor(occ)
            occ = [o for o in occ if o is not anchor]
        if not occ:
            return _strip_per_request_metrics(text) if removed and not keep_anchor else text
        last = occ[-1]
        start = last.flag_token.start
        end = last.value_token.end if last.value_token is not None else last.flag_token.end
        a, b = _removal_span(text, start, end)
        text = text[:a] + text[b:]
        removed = True
    return text  # pragma: no cover


def _strip_per_request_metrics(text):
    """The script without --per-request-spec-decode-metrics: vLLM refuses it once the speculative config is gone
    (vllm/per_request_metrics.py), so a strip takes it with the speculative flags."""
    try:
        tokens = tokenize(text)
    except ShellSyntaxError:
        return text
    for start, end in per_request_metrics.script_spans(tokens):  # last first: the earlier spans keep their offsets
        a, b = _removal_span(text, start, end)
        text = text[:a] + text[b:]
    return text


def _anchor(occurrences):
    return next((o for o in occurrences if o.kind == "json" and o.has_value), None)


def strip_speculative_config(items, keep_anchor=False, env=None):
    """Return a copy of a command/args list without any speculative flag of the vLLM invocation; a no-op when there is
    none. ``env``: the container's env, for words whose value the pod spec gives."""
    if items is None:
        return None
    items = list(items)
    occ = find_occurrences(items, env)
    anchor = _anchor(occ) if keep_anchor else None
    if not occ or occ == [anchor]:
        return items
    drop = set()
    scripts = set()
    for o in occ:
        if o.form.startswith("script"):
            scripts.add(o.index)
        elif o is anchor:
            continue
        else:
            drop.add(o.index)
            if o.value_index is not None:
                drop.add(o.value_index)
    result = []
    for i, word in enumerate(items):
        if i in drop:
            continue
        if i in scripts:
            keep_here = anchor is not None and anchor.index == i
            new = strip_script(word, keep_anchor=keep_here, env=env)
            if not new.strip() and not is_shell_script(items, i):
                continue  # the element held nothing but the flag and its value
            result.append(new)
            continue
        result.append(word)
    if anchor is None:  # vLLM refuses --per-request-spec-decode-metrics without a speculative config: it goes too
        companions = set(per_request_metrics.argv_spans(result))
        result = [w for i, w in enumerate(result) if i not in companions]
    return result


_REFUSAL_HINTS = {
    "eval": "move the vLLM command out of the eval string (or its flags into literal words of the command), then rerun the rollback",
    "multi-value option": "put the positional model right after `vllm serve` (before any option that takes several values), then "
                          "rerun the rollback",
    "variable": "write the vLLM flags literally in the command, or give the variable its value in the container's env, then rerun "
                "the rollback",
    "parameter expansion": "write the vLLM flags literally in the command instead of the ${VAR:+...} expansion, then rerun the rollback",
    "command substitution": "write the vLLM flags literally in the command instead of the $(...) substitution, then rerun the rollback",
    "script syntax": "fix the script (bash -n shows where), then rerun the rollback",
}


def strip_checked(items, env=None, field="command"):
    """strip_speculative_config for a rollback that must not claim a clean command that is not: refuses (ValidationError
    naming each construct) when the vLLM invocation holds what the strip cannot resolve (an eval string, a run-time
    expansion where vLLM may read an option, a pod-spec variable carrying a flag, a multi-value option that would take
    the positional model once the flag is gone; see vllm/command_scan.py), and checks its own result: no flag left."""
    if items is None:
        return None
    env = env if env is not None else {}  # no env: the pod spec sets no variable, every expansion is unknown
    problems = strip_problems(items, env)
    if problems:
        raise ValidationError(
            "cannot strip the speculative flags word-exact: %s" % "; ".join(
                "%s %r (%s)" % (p["construct"], p["text"][:120], p["why"]) for p in problems[:5]),
            field=field, hint=_REFUSAL_HINTS.get(problems[0]["construct"], _REFUSAL_HINTS["variable"]))
    new = strip_speculative_config(items, env=env)
    left = find_occurrences(new, env)
    if left:  # pragma: no cover - a defect of the editor, never a user error
        raise ValidationError("the strip left %s in place" % ", ".join(o.flag for o in left), field=field,
                              hint="report this command to the collection's maintainers")
    return new


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
