# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small bash lexer that keeps byte offsets: how the collection reads the ``bash -c`` scripts KServe runtimes and
published manifests start vLLM with.

``tokenize`` turns a script into words, operators and comments with their spans (quotes, ``$'...'``, ``$(...)``,
backticks, heredocs and line continuations as bash reads them; ``$VAR``/``${VAR:-default}`` expanded from an ``env`` when
one is given), ``simple_commands`` groups the words into commands. The spans are what lets ``command_line`` remove a flag
and its value byte-exactly and leave every other byte of the script as it was.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import re

_OPERATORS = sorted(
    [";;&", ";;", ";&", "&&", "||", "|&", "&>>", "&>", ">>", "<<<", "<<-", "<<", "<>", ">&", "<&", ">|",
     ";", "&", "|", "(", ")", "<", ">"],
    key=len, reverse=True)
_CONTROL_OPS = {";;&", ";;", ";&", "&&", "||", "|&", ";", "&", "|", "(", ")", "\n"}
_META = set(" \t\n;&|()<>")


class Token:
    """A lexed shell token with its byte span in the script."""

    __slots__ = ("kind", "start", "end", "value", "literal", "quote", "split")

    def __init__(self, kind, start, end, value=None, literal=True, quote="", split=False):
        self.kind = kind  # "word", "op", "comment"
        self.start = start
        self.end = end
        self.value = value  # unquoted value for words, operator text for ops
        self.literal = literal  # False when the word holds an expansion ($x, $(..), `..`)
        self.quote = quote  # first quoting style used in the word: "'", '"', "$'", "\\" or ""
        self.split = split  # True when an expansion stands outside double quotes: bash splits its value into words

    def __repr__(self):  # pragma: no cover - debugging aid
        return "Token(%s, %d, %d, %r)" % (self.kind, self.start, self.end, self.value)


class ShellSyntaxError(ValueError):
    """The script has an unterminated quote or substitution."""


def _skip_balanced(text, pos, opener, closer):
    """Return the index just after the ``closer`` matching an already consumed ``opener``.

    Quotes, escapes and nested substitutions inside are honoured (well enough for vLLM start scripts). ``opener`` None
    is a backquoted command: bash ends it at the first unescaped ``closer`` and reads no quotes or nesting inside.
    """
    depth = 1
    n = len(text)
    while pos < n:
        ch = text[pos]
        if ch == "\\":
            pos += 2
            continue
        if opener is not None:
            if ch == "'":
                end = text.find("'", pos + 1)
                if end < 0:
                    raise ShellSyntaxError("unterminated single quote")
                pos = end + 1
                continue
            if ch == '"':
                pos = _skip_double(text, pos + 1)[0]
                continue
            if ch == "`":
                pos = _skip_balanced(text, pos + 1, None, "`")
                continue
            if ch == opener:
                depth += 1
        if ch == closer:
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    raise ShellSyntaxError("unterminated %s...%s" % (opener or closer, closer))


_PARAMETER_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])")
_BRACED_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)(.*))?", re.S)


def _skip_double(text, pos, env=None):
    """Inside double quotes from ``pos``; return (index after closing quote, value, literal)."""
    out = []
    literal = True
    n = len(text)
    while pos < n:
        ch = text[pos]
        if ch == '"':
            return pos + 1, "".join(out), literal
        if ch == "\\" and pos + 1 < n:
            nxt = text[pos + 1]
            if nxt == "\n":
                pos += 2
                continue
            if nxt in '"\\$`':
                out.append(nxt)
                pos += 2
                continue
            out.append(ch)
            pos += 1
            continue
        if ch in "$`":
            pos, lit = _skip_substitution(text, pos, out, env)
            literal = literal and lit
            continue
        out.append(ch)
        pos += 1
    raise ShellSyntaxError("unterminated double quote")


def _skip_substitution(text, pos, out, env=None):
    """A ``$...`` or backquoted command at ``pos``: returns (index after it, literal), literal False for a runtime expansion.

    A lone ``$`` is literal text. Without ``env`` nothing is appended for an expansion (the editors keep its bytes from
    the token's span); with ``env`` (a dict, for the readers) ``$NAME``, ``${NAME}``, ``${NAME:-default}`` and
    ``${NAME-default}`` append their value, and any other expansion (unknown variable, ``$(...)``, ``$1``) appends
    itself as written, so a reader sees ``$PORT`` rather than an empty word.
    """
    value = None
    nxt = text[pos + 1:pos + 2]
    if text[pos] == "`":
        end = _skip_balanced(text, pos + 1, None, "`")
    elif nxt and nxt in "({":
        end = _skip_balanced(text, pos + 2, nxt, ")" if nxt == "(" else "}")
        if nxt == "{" and env is not None:
            value = _braced_value(text[pos + 2:end - 1], env)
    else:
        m = _PARAMETER_RE.match(text, pos)
        if not m:
            out.append("$")
            return pos + 1, True
        end = m.end()
        value = None if env is None else env.get(m.group(1))
    if env is None:
        return end, False
    out.append(text[pos:end] if value is None else value)
    return end, value is not None


def _braced_value(inner, env):
    """The value of ``${inner}`` from ``env``, or None (not set and no default, or an operator other than ``-``/``:-``)."""
    m = _BRACED_RE.fullmatch(inner)
    if not m:
        return None
    name, operator, default = m.groups()
    value = env.get(name)
    if operator is None or (value is not None and (value or operator == "-")):
        return value
    try:  # the default is a shell word of its own: quotes removed, variables expanded
        return " ".join(tok.value for tok in tokenize(default, env) if tok.kind == "word")
    except ShellSyntaxError:
        return default


_ANSI_C = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b",
           "e": "\x1b", "E": "\x1b", "f": "\f", "v": "\v", "?": "?"}


def _skip_ansi_c(text, pos):
    """Inside ``$'...'`` from ``pos``; return (index after the closing quote, value)."""
    out = []
    n = len(text)
    while pos < n:
        ch = text[pos]
        if ch == "'":
            return pos + 1, "".join(out)
        if ch == "\\" and pos + 1 < n:
            nxt = text[pos + 1]
            out.append(_ANSI_C.get(nxt, "\\" + nxt))
            pos += 2
            continue
        out.append(ch)
        pos += 1
    raise ShellSyntaxError("unterminated $'...' quote")


def tokenize(text, env=None):
    """Lex a bash script into word/op/comment tokens with byte spans.

    Backslash-newline outside quotes is a line continuation (removed, as bash does). Heredoc bodies are
    skipped. Raises ShellSyntaxError on unterminated quotes. ``env`` (a dict) expands variables in the word
    values (see _skip_substitution); the spans stay those of the text as written.
    """
    tokens = []
    pos = 0
    n = len(text)
    heredocs = []  # pending (delimiter, strip_tabs)
    while pos < n:
        ch = text[pos]
        if ch in " \t":
            pos += 1
            continue
        if ch == "\\" and text[pos + 1:pos + 2] == "\n":
            pos += 2
            continue
        if ch == "\n":
            tokens.append(Token("op", pos, pos + 1, "\n"))
            pos += 1
            if heredocs:
                pos = _skip_heredocs(text, pos, heredocs)
                heredocs = []
            continue
        if ch == "#":
            end = text.find("\n", pos)
            end = n if end < 0 else end
            tokens.append(Token("comment", pos, end, text[pos:end]))
            pos = end
            continue
        op = _match_operator(text, pos)
        if op:
            tokens.append(Token("op", pos, pos + len(op), op))
            pos += len(op)
            if op in ("<<", "<<-"):
                heredocs.append((None, op == "<<-"))
            continue
        pos = _lex_word(text, pos, tokens, env)
        # a word right after << is the heredoc delimiter
        if len(tokens) >= 2 and tokens[-2].kind == "op" and tokens[-2].value in ("<<", "<<-") and heredocs \
                and heredocs[-1][0] is None:
            heredocs[-1] = (tokens[-1].value, heredocs[-1][1])
    return tokens


def _match_operator(text, pos):
    for op in _OPERATORS:
        if text.startswith(op, pos):
            return op
    return None


def _lex_word(text, pos, tokens, env=None):
    start = pos
    out = []
    literal = True
    quote = ""
    split = False
    n = len(text)
    while pos < n:
        ch = text[pos]
        if ch in _META:
            if ch in "<>" and out and "".join(out).isdigit() and literal and not quote:
                # ``2>`` style redirection: the digits belong to the operator
                op = _match_operator(text, pos)
                tokens.append(Token("op", start, pos + len(op), text[start:pos] + op))
                return pos + len(op)
            break
        if ch == "\\":
            if text[pos + 1:pos + 2] == "\n":
                pos += 2
                continue
            if pos + 1 < n:
                out.append(text[pos + 1])
                quote = quote or "\\"
                pos += 2
                continue
            out.append(ch)
            pos += 1
            continue
        if ch == "'":
            end = text.find("'", pos + 1)
            if end < 0:
                raise ShellSyntaxError("unterminated single quote at offset %d" % pos)
            out.append(text[pos + 1:end])
            quote = quote or "'"
            pos = end + 1
            continue
        if ch == '"':
            pos, val, lit = _skip_double(text, pos + 1, env)
            out.append(val)
            literal = literal and lit
            quote = quote or '"'
            continue
        if ch == "$" and text[pos + 1:pos + 2] == "'":
            pos, val = _skip_ansi_c(text, pos + 2)
            out.append(val)
            quote = quote or "$'"
            continue
        if ch in "$`":
            before = pos
            pos, lit = _skip_substitution(text, pos, out, env)
            literal = literal and lit
            split = split or pos - before > 1  # a lone `$` is text
            continue
        out.append(ch)
        pos += 1
    tokens.append(Token("word", start, pos, "".join(out), literal, quote, split))
    return pos


def _skip_heredocs(text, pos, heredocs):
    for delim, strip_tabs in heredocs:
        if delim is None:
            continue
        while pos < len(text):
            end = text.find("\n", pos)
            line_end = len(text) if end < 0 else end
            line = text[pos:line_end]
            pos = line_end + 1 if end >= 0 else len(text)
            if (line.lstrip("\t") if strip_tabs else line) == delim:
                break
    return pos


def simple_commands(tokens):
    """Group word tokens into simple commands: list of lists of (token, is_argument).

    Redirection targets are marked is_argument=False; so is the command word itself.
    """
    commands = []
    current = []
    expect_target = False
    for tok in tokens:
        if tok.kind == "comment":
            continue
        if tok.kind == "op":
            if tok.value in _CONTROL_OPS:
                if current:
                    commands.append(current)
                current = []
                expect_target = False
            else:
                expect_target = True
                current.append((tok, False))
            continue
        if expect_target:
            current.append((tok, False))
            expect_target = False
            continue
        current.append((tok, True))
    if current:
        commands.append(current)
    return commands


_ASSIGNMENT_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)


def with_assignments(tokens, env):
    """``env`` plus the script's own literal assignments (``MODEL=/mnt/models``, ``export PORT=8080``): a command of
    nothing but assignments sets shell variables a later command can expand."""
    out = dict(env)
    for cmd in simple_commands(tokens):
        words = [tok for tok, _is_arg in cmd if tok.kind == "word"]
        if words and words[0].value in ("export", "readonly", "declare", "local"):
            words = words[1:]
        matches = [_ASSIGNMENT_RE.fullmatch(tok.value) if tok.literal else None for tok in words]
        if words and all(matches):
            out.update(m.groups() for m in matches)
    return out


def lex_script(text, envs=()):
    """One script read for a reader that needs it whole: ``(tokens, commands, {env position: tokens})`` - the tokens as
    written (``tokenize`` without env), their simple commands, and for each env of ``envs`` that is not None the tokens
    with that env and the script's own assignments expanded (``with_assignments``). Raises ShellSyntaxError."""
    tokens = tokenize(text)
    expanded = {}
    for position, env in enumerate(envs):
        if env is not None:
            expanded[position] = tokenize(text, with_assignments(tokens, env))
    return tokens, simple_commands(tokens), expanded
