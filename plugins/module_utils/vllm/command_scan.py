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
multi-value option before the positional model).

One scan reads a whole list at once (``scan_variants``: the same list with and without the pod's env, with or without
the problems), so each file it builds on is asked once per command, not per word: vllm/shell_lexer.py once per script
(``lex_script``), vllm/cli_parser.py once for every invocation's words of every reading (``read_all``, which also reads
the words again without the flags), and the flag registry (vllm/speculative_flags.py) through tables built at import.
Where the vLLM invocation is in a list or a script (``<shell> -c``, ``vllm serve``, the api_server module) and the
Occurrence a scan reports live here, with the scan that needs them word by word. Plain Python, no Ansible imports.
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import cli_parser
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.cli_registry_releases import RELEASES
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.shell_lexer import ShellSyntaxError, lex_script
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_flags import (
    DOTTED, SPECULATIVE_FLAGS, classify_flag, spec_for_options, takes_next,
)

# Programs whose arguments are text to print, never a vLLM command line.
_PRINTERS = ("echo", "printf", "logger", "cat", "tee", ":", "true", "test", "[")
_KUBE_REF_RE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_ALL_ARGS = ('"$@"', "$@", '"${@}"', "${@}")
_PLAIN_NAME_RE = re.compile(r"-[A-Za-z0-9_.+-]*=")
# The registry's answers the scan needs per word, asked once at import: the FlagSpec of each speculative dest of every
# release's option table, and the spellings of the legacy flags (only those words are classified one by one).
_SPEC_OF_DEST = {action.dest: spec_for_options(action.option_strings) for release in RELEASES
                 for action in cli_parser.registry(release).actions if cli_parser.registry(release).speculative(action)}
# vLLM's newest option table, the one a scan reads with unless told otherwise (cli_parser.registry()).
_DEFAULT_REGISTRY = cli_parser.registry()
_LEGACY_SPELLINGS = frozenset(name for spec in SPECULATIVE_FLAGS if spec.kind == "legacy" for name in spec.spellings())

# --------------------------------------------------------------------------------------------------
# Where the vLLM invocation is: a ``<shell> -c`` script, ``vllm serve``, the api_server module
# --------------------------------------------------------------------------------------------------

_SCRIPT_SHELLS = ("bash", "sh", "dash", "zsh", "ksh", "ash")
# ``-c`` alone or in a cluster of the shell's one-letter options (``sh -ec``, ``bash -lc``).
_SHELL_C_RE = re.compile(r"-[A-Za-z]*c[A-Za-z]*")


def script_shell_index(items, index):
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
    return script_shell_index(items, index) is not None


def script_elements(items):
    """``{index of a script: index of its shell}`` for every ``<shell> [options] -c <script>`` of a list."""
    return {index: shell for index, shell in ((i, script_shell_index(items, i)) for i in range(len(items))
                                              if isinstance(items[i], str)) if shell is not None}


def looks_like_script(text):
    """A string with shell separators in it: worth lexing as a script."""
    return isinstance(text, str) and any(c in text for c in " \t\n;&|")


def invokes_vllm(words):
    """True when argv words (strings) run vLLM's OpenAI server: ``-m vllm.entrypoints...``, ``[path/]vllm serve`` or an
    entrypoints ``.py`` file."""
    return invocation_end(words) is not None


def invocation_end(words):
    """The index just after the words that start vLLM's server (``[path/]vllm serve``, ``-m vllm.entrypoints...``, an
    entrypoints ``.py`` file), where vLLM's own arguments begin; None when ``words`` hold no such invocation."""
    words = [str(w) for w in words]
    for i, val in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if val == "-m" and nxt.startswith("vllm.entrypoints"):
            return i + 2
        if val.rsplit("/", 1)[-1] == "vllm" and nxt == "serve":
            return i + 2
        if ("vllm.entrypoints" in val or "vllm/entrypoints/" in val) and val.endswith(".py"):
            return i + 1
    return None


class Occurrence:
    """One speculative flag found in a list: where it is and what it says."""

    __slots__ = ("index", "kind", "key", "raw", "form", "flag_token", "value_token", "has_value", "literal", "flag", "group", "value_index")

    def __init__(self, index, kind, key, raw, form, flag_token=None, value_token=None, has_value=True, literal=True, flag=None,
                 group=None, value_index=None):
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
        self.group = group  # dotted keys: the option as written before the dot (``-sc``, ``--speculative-config``); vLLM
        # gathers each group into one JSON and the last group replaces any --speculative-config JSON
        self.value_index = value_index  # argv: the list index of the value word (None: inline or none)

    def as_dict(self):
        return {"index": self.index, "kind": self.kind, "key": self.key, "value": self.raw, "form": self.form, "flag": self.flag}

    def __repr__(self):  # pragma: no cover - debugging aid
        return "Occurrence(%s, %s, %r, %s)" % (self.index, self.flag, self.raw, self.form)


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


class _Variant:
    """One reading of a list: the pod's env it expands with (None: every expansion unknown), the occurrences found and,
    when asked, the problems of a strip (None: not gathered)."""

    __slots__ = ("env", "found", "problems")

    def __init__(self, env, with_problems):
        self.env = env
        self.found = []
        self.problems = [] if with_problems else None


class _Job:
    """A piece of a scan's work in the order its findings are reported: an invocation's words to read (``region``), the
    list's own words (``argv``: their reading also finds shell lines among them), a problem already known, an eval."""

    __slots__ = ("kind", "variant", "words", "problems", "where", "model_first", "drop", "lines", "problem")

    def __init__(self, kind, variant, words=None, problems=None, where=None, model_first=False, problem=None):
        self.kind = kind
        self.variant = variant
        self.words = words
        self.problems = problems
        self.where = where
        self.model_first = model_first
        self.drop = set()
        self.lines = None
        self.problem = problem


class _Batch:
    """The jobs of one scan; ``run`` reads every job's words with one call into vllm/cli_parser.py."""

    def __init__(self, reg, items=None):
        self.reg = reg
        self.items = items
        self.jobs = []

    def add(self, kind, variant, **kwargs):
        self.jobs.append(_Job(kind, variant, **kwargs))

    def run(self):
        reading_jobs = [job for job in self.jobs if job.kind in ("region", "argv")]
        regions = [([w.text for w in job.words], {i for i, w in enumerate(job.words) if not w.known}) for job in reading_jobs]
        readings = dict(zip(map(id, reading_jobs), cli_parser.read_all(regions, self.reg, drop=lambda pos, reading: self._found(
            reading_jobs[pos], reading))))
        deferred = []
        for job in self.jobs:
            if job.kind == "problem":
                job.variant.problems.append(job.problem)
            elif job.kind == "eval":
                _eval_problems(job.words, self.reg, job.variant.problems, job.variant.env)
            elif job.lines:
                deferred.append(job)
            elif job.problems is not None:
                _problems(job, readings[id(job)])
        for job in deferred:
            self._lines(job)

    def _found(self, job, reading):
        """The occurrences of a job's reading into its variant; the words a strip removes when its problems are wanted."""
        if job.kind == "argv":
            job.lines = [pos for pos, word in enumerate(job.words) if word.known and word.text == self.items[word.index]
                         and reading.roles[pos].kind == "positional" and looks_like_script(word.text)]
            if job.lines:
                return None  # read again without them (_lines)
        job.drop = _occurrences(job.words, reading, job.variant.found)
        return job.drop if job.problems is not None else None

    def _lines(self, job):
        """An argv element vLLM would take as a positional that is a shell line (the script of ``sh -c`` given in args, as
        KServe's runtimes do; "flag value" written as one element): read as a script, the rest as argv."""
        batch = _Batch(self.reg, self.items)
        for pos in job.lines:
            _script(job.words[pos].text, job.words[pos].index, batch, [job.variant])
        plain = [w for pos, w in enumerate(job.words) if pos not in job.lines]
        if plain:
            batch.add("region", job.variant, words=plain, problems=job.problems, where="argv")
        batch.run()


def _occurrences(words, reading, found):
    """The occurrences of one invocation's words (appended to ``found``); returns the indices of their words."""
    drop = set()
    for i, role in enumerate(reading.roles):
        if role.kind == "option" and role.speculative:
            spec = _SPEC_OF_DEST.get(role.action.dest) or spec_for_options(role.action.option_strings)
            values = _value_words(reading, i)
            value = words[values[0]] if values else None
            raw = role.explicit if role.explicit is not None else (value.text if value else None)
            found.append(_occurrence(words, i, values, spec.kind, spec.key, raw, spec.name, None))
            drop.update([i] + values)
        elif role.kind == "dotted" and role.speculative:
            values = _value_words(reading, i)
            raw = words[i].text.split("=", 1)[1] if not values else words[values[0]].text
            found.append(_occurrence(words, i, values, "dotted", role.path.replace("-", "_"), raw, DOTTED.name, role.group))
            drop.update([i] + values)
        elif role.kind == "option" and role.action is None and words[i].known and words[i].text.partition("=")[0] in _LEGACY_SPELLINGS:
            info = classify_flag(words[i].text)
            if info and info[0] == "legacy":
                kind, key, inline, spec = info
                nxt = i + 1 if i + 1 < len(words) and reading.roles[i + 1].kind == "positional" else None
                values = [nxt] if inline is None and nxt is not None and takes_next(spec, words[nxt].text) else []
                raw = inline if inline is not None else (words[values[0]].text if values else None)
                found.append(_occurrence(words, i, values, kind, key, raw, spec.name, None))
                drop.update([i] + values)
    return drop


def _value_words(reading, owner):
    return [i for i, role in enumerate(reading.roles) if role is not None and role.owner == owner and role.kind in ("value", "dotted_value")]


def _problems(job, reading):
    """What a strip cannot vouch for in one invocation's words (``job.words``, whose occurrences are ``job.drop``).
    ``model_first``: the words follow ``vllm serve``, whose first word, a quoted ``"$MODEL"``, is the positional model."""
    words, drop, problems, where = job.words, job.drop, job.problems, job.where
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
        if job.model_first and i == 0 and not word.split:
            continue  # `vllm serve "$MODEL" ...`: one word, the model (an option there would make no sense of the command)
        construct = "variable" if word.token is None else _construct(word.expansion or word.text)
        problems.append(_problem(construct, word, where, "known only at run time, where vLLM's parser may read it as an option"))
    if drop and reading.shift is not None:
        index, was, now = reading.shift
        word = words[index]
        problems.append(_problem("multi-value option", word, where, "once the flag is gone vLLM would read %r as %s instead "
                                 "of %s" % (word.text, _describe_key(now), _describe_key(was))))


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


def _script(text, index, batch, variants):
    """The jobs of one script (list element ``index``) for each variant into ``batch``; False when bash refuses it."""
    try:
        tokens, commands_of_tokens, expanded = lex_script(text, [v.env for v in variants])
    except ShellSyntaxError:
        return False
    for position, variant in enumerate(variants):
        by_start = {tok.start: tok for tok in expanded.get(position, tokens)}
        commands = []
        for cmd in commands_of_tokens:
            words = []
            for tok, is_arg in cmd:
                if is_arg and tok.kind == "word":
                    word = _token_word(text, tok, by_start.get(tok.start, tok), index, variant.env)
                    words.extend(word if isinstance(word, list) else [word])
            commands.append(words)
        invoked = [(words, invocation_end([w.text for w in words])) for words in commands]
        if any(end is not None for _words, end in invoked):
            for words, end in invoked:
                if end is not None:
                    batch.add("region", variant, words=words[end:], problems=variant.problems, where="script",
                              model_first=words[end - 1].text == "serve")
        else:
            # no vLLM invocation here (an args line, VLLM_ADDITIONAL_ARGS, a wrapper): each command but those that print;
            # only a command that is itself vLLM's arguments (its first word an option) is vouched for
            for words, _end in invoked:
                if words and words[0].text not in _PRINTERS and words[0].text != "eval":
                    batch.add("region", variant, words=words, where="script",
                              problems=variant.problems if words[0].text.startswith("-") else None)
        if variant.problems is not None:
            for words in commands:
                batch.add("eval", variant, words=words)
    return True


def _eval_problems(words, reg, problems, env):
    """``eval ARGS``: bash joins ARGS and runs them as a script, whose words the strip cannot edit."""
    start = next((i for i, w in enumerate(words) if w.text != "exec"), None)
    if start is None or words[start].text != "eval":
        return
    args = words[start + 1:]
    text = " ".join(w.text for w in args)
    nested = _Variant(env, False)
    batch = _Batch(reg)
    _script(text, 0, batch, [nested])
    batch.run()
    if nested.found:
        problems.append({"construct": "eval", "text": text[:200], "where": "script",
                         "why": "%s is inside an eval string, which the strip cannot edit word-exact" % nested.found[0].flag})
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


def scan_variants(items, variants, reg=None):
    """``([(occurrences, problems)] per variant, {script index: shell index})`` of a command or args list (see the
    module's doc), read once for every ``(env, with_problems)`` of ``variants``: ``env`` the container's env as a dict
    (vllm.command_line.container_env), None reading every expansion as unknown and not looking for problems of values it
    cannot see; ``with_problems`` also lists what a strip cannot vouch for."""
    reg = reg or _DEFAULT_REGISTRY
    items = list(items or [])
    out = [_Variant(env, with_problems) for env, with_problems in variants]
    batch = _Batch(reg, items)
    start = invocation_end(items)
    scripts = script_elements(items)
    shells = set()  # `<shell> [options] -c` before a script: the shell's words, not vLLM's
    for index, shell in scripts.items():
        shells.update(range(shell, index))
    plains = [[] for _variant in out]
    for index, word in enumerate(items):
        if not isinstance(word, str) or index in shells:
            continue
        if index in scripts:
            if not _script(word, index, batch, out):
                for variant in out:
                    if variant.problems is not None:
                        batch.add("problem", variant, problem={"construct": "script syntax", "text": word[:200],
                                                               "where": "element %d" % index, "why": "bash refuses the script"})
            continue
        if start is not None and index < start:
            continue
        for variant, plain in zip(out, plains):
            plain.append(_list_word(word, index, variant.env))
    for variant, plain in zip(out, plains):
        if plain:
            batch.add("argv", variant, words=plain, problems=variant.problems, where="argv")
    batch.run()
    for variant in out:
        variant.found.sort(key=lambda o: (o.index, o.flag_token.start if o.flag_token is not None else 0))
    return [(variant.found, variant.problems or []) for variant in out], scripts


def scan(items, env=None, reg=None, with_problems=False):
    """``(occurrences, problems)`` of a command or args list: scan_variants with one variant."""
    return scan_variants(items, [(env, with_problems)], reg)[0][0]


def scan_script(text, env=None, reg=None):
    """The occurrences of one shell text (a script, or an env value such as VLLM_ADDITIONAL_ARGS that a script splices into
    the vLLM invocation), with index 0; [] when it does not lex."""
    variant = _Variant(env, False)
    batch = _Batch(reg or _DEFAULT_REGISTRY)
    _script(text, 0, batch, [variant])
    batch.run()
    return variant.found
