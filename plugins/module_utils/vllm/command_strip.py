# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The removal of speculative flags a scan found (vllm/command_scan.py) from a command or args list, in one pass.

Scripts are edited at the byte level on the scan's token spans (vllm/shell_lexer.py): only the flag and its value go,
plus the whitespace/continuation that held them, so the script stays valid (no dangling ``\\``, no blank line that
ends the command early) and every other byte is unchanged. The flags of a script are removed last first, so the spans
of those before stay where the scan found them: one scan per list, not one per removed flag. vLLM refuses
``--per-request-spec-decode-metrics`` without a speculative config (vllm/per_request_metrics.py), so a strip takes it too.

Used by the editor (vllm/command_edit.py) and by the command read once (vllm/command_line.py ``read``). Plain Python, no
Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import per_request_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.shell_lexer import ShellSyntaxError, tokenize


def removal_span(text, start, end):
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


def anchor(occurrences):
    """The first ``--speculative-config <value>`` (the one a set replaces in place), or None."""
    return next((o for o in occurrences if o.kind == "json" and o.has_value), None)


def strip_text(text, occurrences, companions=True):
    """``text`` (one script) without the flags of ``occurrences`` (its scan's, of this text), removed last first; with
    ``companions`` and something removed, without --per-request-spec-decode-metrics too."""
    spans = sorted(((o.flag_token.start, o.value_token.end if o.value_token is not None else o.flag_token.end) for o in occurrences),
                   reverse=True)
    for start, end in spans:
        a, b = removal_span(text, start, end)
        text = text[:a] + text[b:]
    return _strip_per_request_metrics(text) if spans and companions else text


def _strip_per_request_metrics(text):
    """The script without --per-request-spec-decode-metrics: vLLM refuses it once the speculative config is gone
    (vllm/per_request_metrics.py), so a strip takes it with the speculative flags."""
    try:
        tokens = tokenize(text)
    except ShellSyntaxError:
        return text
    for start, end in per_request_metrics.script_spans(tokens):  # last first: the earlier spans keep their offsets
        a, b = removal_span(text, start, end)
        text = text[:a] + text[b:]
    return text


def strip_found(items, occurrences, scripts, keep_anchor=False):
    """A copy of ``items`` without the flags of ``occurrences`` (its scan's; ``scripts`` the scan's ``{script index:
    shell index}``). With ``keep_anchor`` the first ``--speculative-config <value>`` stays (a set replaces it)."""
    items = list(items)
    kept = anchor(occurrences) if keep_anchor else None
    if not occurrences or list(occurrences) == [kept]:
        return items
    drop = set()
    in_scripts = {}
    for occ in occurrences:
        if occ.form.startswith("script"):
            in_scripts.setdefault(occ.index, []).append(occ)
        elif occ is not kept:
            drop.add(occ.index)
            if occ.value_index is not None:
                drop.add(occ.value_index)
    result = []
    for i, word in enumerate(items):
        if i in drop:
            continue
        if i in in_scripts:
            keep_here = kept is not None and kept.index == i
            new = strip_text(word, [o for o in in_scripts[i] if o is not kept], companions=not keep_here)
            if not new.strip() and i not in scripts:
                continue  # the element held nothing but the flag and its value
            result.append(new)
            continue
        result.append(word)
    if kept is None:  # vLLM refuses --per-request-spec-decode-metrics without a speculative config: it goes too
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


def refusal(problems):
    """``(message, hint)`` of a checked strip refused for ``problems`` (vllm/command_scan.py's, without repeats)."""
    return ("cannot strip the speculative flags word-exact: %s" % "; ".join(
        "%s %r (%s)" % (p["construct"], p["text"][:120], p["why"]) for p in problems[:5]),
        _REFUSAL_HINTS.get(problems[0]["construct"], _REFUSAL_HINTS["variable"]))
