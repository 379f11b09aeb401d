# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Find vLLM's speculative-decoding flags in a container's command or args list, word by word as vLLM's own parser reads
the invocation (vllm/cli_parser.py: abbreviations such as ``--spec-tok``, ``-sc``, dotted keys ``-sc.method``, nargs),
and say what a strip could not vouch for.

Only the vLLM invocation's words count: in a script, the arguments of the simple commands that start vLLM (``echo``,
a prefetch script or ``pip`` beside it keep their words); in an argv list, the elements after ``vllm serve`` or the
api_server module (all of them when the list holds no invocation: KServe's args). A script with no vLLM invocation
is read command by command, except commands that only print (``echo``, ``printf``...).

``problems(items, env)`` lists what a strip cannot resolve, each with its construct: a speculative flag inside an
``eval`` string, a word known only at run time (``$EXTRA``, ``${VAR:+--speculative-config "$VAR"}``, ``$(...)``, a
Kubernetes ``$(VAR)`` not in the pod spec) where vLLM could read it as an option, a variable from the pod spec whose
value carries a speculative flag, and a removal after which another option takes words it did not take before (a
multi-value option before the positional model). Plain Python, no Ansible imports.
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import cli_parser
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.shell_lexer import ShellSyntaxError, simple_commands, tokenize
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_flags import (
    DOTTED, Occurrence, classify_flag, invocation_end, looks_like_script, script_shell_index, spec_for_options,
    takes_next,
)

# Programs whose arguments are text to print, never a vLLM command line.
_PRINTERS = ("echo", "printf", "logger", "cat", "tee", ":", "true", "test", "[")
_KUBE_REF_RE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_ALL_ARGS = ('"$@"', "$@", '"${@}"', "${@}")
_PLAIN_NAME_RE = re.compile(r"-[A-Za-z0-9_.+-]*=")


class _Word:
    """One word of the vLLM invocation: its text, where it came from, and whether its text is known."""

    __slots__ = ("text", "index", "token", "known", "split", "expansion", "value_known")

    def __init__(self, text, index, token=None, known=True, split=False, expansion=None, value_known=True):
        self.text = text
        self.index = index  # list element
        self.token = token  # script token (None: the list element itself)
        self.known = known  # False: an expansion known only at run time
        self.split = split  # bash splits it into words (an unquoted expansion)
        self.expansion = expansion  # the expansion as written, for messages
        self.value_known = value_known  # False: ``--flag=$VALUE``, the option known, its value only at run time


def _reading(words, reg):
    unknown = {i for i, w in enumerate(words) if not w.known}
    return cli_parser.read([w.text for w in words], reg, unknown)


def _value_words(reading, owner):
    return [i for i, role in enumerate(reading.roles) if role is not None and role.owner == owner and role.kind in ("value", "dotted_value")]


def _region(words, reg, found, problems, where, model_first=False):
    """Occurrences of one invocation's words (``found``), and what a strip cannot vouch for in them (``problems``).
    ``model_first``: the words follow ``vllm serve``, whose first word, a quoted ``"$MODEL"``, is the positional model."""
    reading = _reading(words, reg)
    drop = set()
    for i, role in enumerate(reading.roles):
        if role.kind == "option" and reg.speculative(role.action):
            spec = spec_for_options(role.action.option_strings)
            values = _value_words(reading, i)
            value = words[values[0]] if values else None
            raw = role.explicit if role.explicit is not None else (value.text if value else None)
            found.append(_occurrence(words, i, values, spec.kind, spec.key, raw, spec.name, None))
            drop.update([i] + values)
        elif role.kind == "dotted" and reg.speculative(role.action):
            values = _value_words(reading, i)
            raw = words[i].text.split("=", 1)[1] if not values else words[values[0]].text
            found.append(_occurrence(words, i, values, "dotted", role.path.replace("-", "_"), raw, DOTTED.name, role.group))
            drop.update([i] + values)
        elif role.kind == "option" and role.action is None and words[i].known:
            info = classify_flag(words[i].text)
            if info and info[0] == "legacy":
                kind, key, inline, spec = info
                nxt = i + 1 if i + 1 < len(words) and reading.roles[i + 1].kind == "positional" else None
                values = [nxt] if inline is None and nxt is not None and takes_next(spec, words[nxt].text) else []
                raw = inline if inline is not None else (words[values[0]].text if values else None)
                found.append(_occurrence(words, i, values, kind, key, raw, spec.name, None))
                drop.update([i] + values)
    if problems is None:
        return
    for i, word in enumerate(words):
        if word.known and word.split:  # a piece of a pod-spec variable that bash splits into vLLM's words
            if i in drop:
                problems.append(_problem("variable", word, where, "its value from the pod spec carries a speculative flag (%r)"
                                         % word.text[:120]))
            continue
        if i in drop or word.known:
            continue
        role = reading.roles[i]
        owner = reading.roles[role.owner] if role.kind == "value" else None
        single = owner is not None and owner.action is not None and (owner.action.nargs is None or isinstance(owner.action.nargs, int))
        if single and not word.split:
            continue  # one word in a one-value option's place: vLLM takes it as that option's value, whatever it is
        if model_first and i == 0 and not word.split:
            continue  # `vllm serve "$MODEL" ...`: one word, the model (an option there would make no sense of the command)
        construct = "variable" if word.token is None else _construct(word.expansion or word.text)
        problems.append(_problem(construct, word, where, "known only at run time, where vLLM's parser may read it as an option"))
    if drop:
        kept = [w for i, w in enumerate(words) if i not in drop]
        before = [role.key() for i, role in enumerate(reading.roles) if i not in drop]
        after = [role.key() for role in _reading(kept, reg).roles]
        for word, was, now in zip(kept, before, after):
            if was != now:
                problems.append(_problem("multi-value option", word, where, "once the flag is gone vLLM would read %r as %s instead "
                                         "of %s" % (word.text, _describe_key(now), _describe_key(was))))
                break


def _describe_key(key):
    kind, dest, group = key
    if kind == "value":
        return "a value of %s" % dest
    if kind == "dotted":
        return "a dotted key of %s" % group
    return "%s%s" % (kind, " " + dest if dest else "")


def _construct(text):
    if "${" in text and re.search(r"\$\{[^}]*[:]?[+?=#%/^,]", text):
        return "parameter expansion"
    if "$(" in text or "`" in text:
        return "command substitution"
    return "variable"


def _problem(construct, word, where, why):
    return {"construct": construct, "text": (word.expansion or word.text)[:200], "where": where, "why": why}


def _occurrence(words, i, values, kind, key, raw, flag, group):
    word = words[i]
    value = words[values[0]] if values else None
    literal = word.known and word.value_known if value is None else value.known
    if word.token is not None:
        form = "script_inline" if value is None and raw is not None else "script"
        return Occurrence(word.index, kind, key, raw, form, word.token, value.token if value else None, has_value=raw is not None,
                          literal=literal, flag=flag, group=group)
    form = "argv_inline" if value is None and raw is not None else "argv"
    return Occurrence(word.index, kind, key, raw, form, has_value=raw is not None, literal=literal, flag=flag, group=group,
                      value_index=value.index if value else None)


# --------------------------------------------------------------------------------------------------
# scripts
# --------------------------------------------------------------------------------------------------

def _token_word(text, tok, tok_env, index, env):
    """A script token as a vLLM word: its value with the pod spec's env (``tok_env``) when that resolves it."""
    raw = text[tok.start:tok.end]
    if raw in _ALL_ARGS:
        return []  # the words after `<shell> -c script`: KServe's args, a list of its own that is read as vLLM's arguments
    if tok.literal:
        return _Word(tok.value, index, tok)
    if env is not None and tok_env.literal:
        if tok_env.split:  # bash splits an unquoted expansion's value into words (IFS: blanks)
            return [_Word(piece, index, tok, known=True, split=True, expansion=raw) for piece in tok_env.value.split()]
        return _Word(tok_env.value, index, tok, expansion=raw)
    name = _PLAIN_NAME_RE.match(raw)
    if name:  # `--speculative-config="$SPEC"`: the option is plain text, only its value is an expansion
        return _Word(raw, index, tok, expansion=raw, value_known=False)
    return _Word(raw, index, tok, known=False, split=tok.split, expansion=raw)


_ASSIGNMENT_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)


def _with_assignments(tokens, env):
    """The pod spec's env plus the script's own literal assignments (``MODEL=/mnt/models``, ``export PORT=8080``): a
    command of nothing but assignments sets shell variables the vLLM command can expand."""
    out = dict(env)
    for cmd in simple_commands(tokens):
        words = [tok for tok, _is_arg in cmd if tok.kind == "word"]
        if words and words[0].value in ("export", "readonly", "declare", "local"):
            words = words[1:]
        matches = [_ASSIGNMENT_RE.fullmatch(tok.value) if tok.literal else None for tok in words]
        if words and all(matches):
            out.update(m.groups() for m in matches)
    return out


def _script(text, index, reg, found, problems, env):
    try:
        tokens = tokenize(text)
        tokens_env = tokenize(text, _with_assignments(tokens, env)) if env is not None else tokens
    except ShellSyntaxError:
        return False
    by_start = {tok.start: tok for tok in tokens_env}
    commands = []
    for cmd in simple_commands(tokens):
        words = []
        for tok, is_arg in cmd:
            if is_arg and tok.kind == "word":
                word = _token_word(text, tok, by_start.get(tok.start, tok), index, env)
                words.extend(word if isinstance(word, list) else [word])
        commands.append(words)
    invoked = [(words, invocation_end([w.text for w in words])) for words in commands]
    if any(end is not None for _words, end in invoked):
        for words, end in invoked:
            if end is not None:
                _region(words[end:], reg, found, problems, "script", model_first=words[end - 1].text == "serve")
    else:
        # no vLLM invocation here (an args line, VLLM_ADDITIONAL_ARGS, a wrapper): each command but those that print; only
        # a command that is itself vLLM's arguments (its first word an option) is vouched for
        for words, _end in invoked:
            if words and words[0].text not in _PRINTERS and words[0].text != "eval":
                _region(words, reg, found, problems if words[0].text.startswith("-") else None, "script")
    if problems is not None:
        for words in commands:
            _eval_problems(words, reg, problems, env)
    return True


def _eval_problems(words, reg, problems, env):
    """``eval ARGS``: bash joins ARGS and runs them as a script, whose words the strip cannot edit."""
    start = next((i for i, w in enumerate(words) if w.text != "exec"), None)
    if start is None or words[start].text != "eval":
        return
    args = words[start + 1:]
    text = " ".join(w.text for w in args)
    nested = []
    _script(text, 0, reg, nested, None, env)
    if nested:
        problems.append({"construct": "eval", "text": text[:200], "where": "script",
                         "why": "%s is inside an eval string, which the strip cannot edit word-exact" % nested[0].flag})
    elif any(not w.known for w in args):
        unknown = [w.expansion for w in args if not w.known]
        problems.append({"construct": "eval", "text": text[:200], "where": "script",
                         "why": "the eval string holds text known only at run time (%s), which may carry a flag" % ", ".join(unknown)[:120]})


# --------------------------------------------------------------------------------------------------
# lists
# --------------------------------------------------------------------------------------------------

def _list_word(word, index, env):
    if env is not None:
        word = _KUBE_REF_RE.sub(lambda m: env.get(m.group(1), m.group(0)), word)
    if _KUBE_REF_RE.search(word) and "$$" not in word:
        return _Word(word, index, known=False, expansion=word)
    return _Word(word, index)


def scan(items, env=None, reg=None, with_problems=False):
    """``(occurrences, problems)`` of a command or args list (see the module's doc). ``env``: the container's env as a
    dict (vllm.command_line.container_env); None reads every expansion as unknown and does not look for problems of
    values it cannot see."""
    reg = reg or cli_parser.registry()
    items = list(items or [])
    found = []
    problems = [] if with_problems else None
    start = invocation_end(items)
    shells = set()  # `<shell> [options] -c` before a script: the shell's words, not vLLM's
    for index in range(len(items)):
        shell = script_shell_index(items, index) if isinstance(items[index], str) else None
        if shell is not None:
            shells.update(range(shell, index))
    plain = []
    for index, word in enumerate(items):
        if not isinstance(word, str) or index in shells:
            continue
        if script_shell_index(items, index) is not None:
            if not _script(word, index, reg, found, problems, env) and problems is not None:
                problems.append({"construct": "script syntax", "text": word[:200], "where": "element %d" % index,
                                 "why": "bash refuses the script"})
            continue
        if start is not None and index < start:
            continue
        plain.append(_list_word(word, index, env))
    reading = _reading(plain, reg) if plain else None
    lines = set()
    for pos, word in enumerate(plain):
        role = reading.roles[pos]
        # an element vLLM would take as a positional that is a shell line (the script of `sh -c` given in args, as KServe's
        # runtimes do; "flag value" written as one element)
        if word.known and word.text == items[word.index] and role.kind == "positional" and looks_like_script(word.text):
            lines.add(pos)
    if lines:
        for pos in sorted(lines):
            _script(plain[pos].text, plain[pos].index, reg, found, problems, env)
        plain = [w for pos, w in enumerate(plain) if pos not in lines]
    if plain:
        _region(plain, reg, found, problems, "argv")
    found.sort(key=lambda o: (o.index, o.flag_token.start if o.flag_token is not None else 0))
    return found, problems or []


def scan_script(text, env=None, reg=None):
    """The occurrences of one shell text (a script, or an env value such as VLLM_ADDITIONAL_ARGS that a script splices into
    the vLLM invocation), with index 0; [] when it does not lex."""
    found = []
    _script(text, 0, reg or cli_parser.registry(), found, None, env)
    return found
