# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's command line as vLLM's own parser reads it: which option each word of the invocation belongs to.

Two steps, as vLLM runs them:

1. ``FlexibleArgumentParser.parse_args`` (vLLM 0.32 ``vllm/utils/argparse_utils.py``): ``_`` becomes ``-`` in a ``--``
   word's name (up to the first ``.``), ``-O3`` becomes ``--optimization-level 3``, and every dotted word
   (``--speculative-config.method ngram``, ``-sc.method=ngram``, also ``--speculative.method``) is taken out with its value
   and gathered per option as written into one JSON, appended after all other words: so a dotted group *replaces* an
   explicit ``--speculative-config <json>`` (argparse keeps the last value), it does not merge with it.
2. Python 3.11's argparse (``ArgumentParser._parse_optional`` / ``_get_option_tuples`` / ``consume_optional``): an exact
   option string, ``--opt=value``, a unique prefix of a ``--`` option (allow_abbrev: ``--spec-tok``, ``--speculative``),
   a prefix of a single-dash option (``-s`` for ``-sc`` when unique), ``-scVALUE`` for a two-character option; a
   word with a blank that matches nothing is a positional; each option then takes the following non-option words its
   ``nargs`` allows (``+``/``*`` take all of them, which is how a multi-value option can swallow the positional model).

The option table (names, aliases, nargs, dests) is data taken from the installed vLLM's parser per release
(vllm/cli_registry_releases.py, written by hack/vllm_cli_registry.py). Plain Python, no Ansible imports.
"""

from __future__ import annotations

import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.cli_registry_releases import DEFAULT_RELEASE, RELEASES

# argparse's _negative_number_matcher (Python 3.11)
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
# FlexibleArgumentParser: "everything between the first -- and the first ." gets ``_`` -> ``-``
_NAME_PART = re.compile(r"(?<=--)[^\.]*")


class Action:
    """One argparse action of vLLM's serve parser: its dest, nargs (None: one value) and option strings."""

    __slots__ = ("dest", "nargs", "option_strings")

    def __init__(self, dest, nargs, option_strings):
        self.dest = dest
        self.nargs = nargs
        self.option_strings = tuple(option_strings)

    def __repr__(self):  # pragma: no cover - debugging aid
        return "Action(%s)" % self.dest


class Registry:
    """The option table of one vLLM release's ``vllm serve`` / api_server parser."""

    def __init__(self, release=None):
        self.release = release or DEFAULT_RELEASE
        table = RELEASES[self.release]
        self.vllm = table["vllm"]
        self.allow_abbrev = table["allow_abbrev"]
        self.negative_number_optionals = table["negative_number_optionals"]
        self.speculative_dests = frozenset(table["speculative_dests"])
        self.actions = [Action(dest, nargs, names) for dest, nargs, names in table["options"]]
        self.by_option = {}
        for action in self.actions:
            for name in action.option_strings:
                self.by_option[name] = action

    def speculative(self, action):
        return action is not None and action.dest in self.speculative_dests


_REGISTRIES = {}


def registry(release=None):
    """The Registry of ``release`` (``"0.32"``; None: the newest table). A release with no table of its own is read with
    the newest one (only vLLM 0.32's parser has been taken as data so far)."""
    release = release if release in RELEASES else DEFAULT_RELEASE
    if release not in _REGISTRIES:
        _REGISTRIES[release] = Registry(release)
    return _REGISTRIES[release]


def normalise(word):
    """A word as FlexibleArgumentParser hands it on: ``--a_b.c_d=e_f`` -> ``--a-b.c_d=e_f``."""
    if not word.startswith("--"):
        return word
    key, sep, value = word.partition("=")
    return _NAME_PART.sub(lambda m: m.group(0).replace("_", "-"), key, count=1) + sep + value


def parse_optional(reg, word):
    """Python 3.11 ``ArgumentParser._parse_optional``: None for a positional, else ``(action or None, option_string,
    explicit_arg)``; ``("ambiguous", [option strings])`` where argparse exits with 'ambiguous option'."""
    if not word or word[0] != "-":
        return None
    if word in reg.by_option:
        return reg.by_option[word], word, None
    if len(word) == 1:
        return None
    if "=" in word:
        name, explicit = word.split("=", 1)
        if name in reg.by_option:
            return reg.by_option[name], name, explicit
    tuples = _option_tuples(reg, word)
    if len(tuples) > 1:
        return "ambiguous", [t[1] for t in tuples]
    if len(tuples) == 1:
        return tuples[0]
    if _NEGATIVE_NUMBER.match(word) and not reg.negative_number_optionals:
        return None
    if " " in word:
        return None
    return None, word, None


def _optimization_level(reg, words, i):
    """FlexibleArgumentParser's ``-O3`` / ``-O=3`` / ``-O 3`` (0-3): ``--optimization-level``."""
    word = words[i]
    action = reg.by_option.get("--optimization-level")
    if action is None or not word.startswith("-O"):
        return None
    if word != "-O":
        return action, "--optimization-level", word[3:] if word[2:3] == "=" else word[2:]
    if i + 1 < len(words) and words[i + 1] in ("0", "1", "2", "3"):
        return action, "--optimization-level", None
    return None


def _option_tuples(reg, word):
    """Python 3.11 ``ArgumentParser._get_option_tuples``: the abbreviation rule."""
    result = []
    if word[1:2] == "-":
        if reg.allow_abbrev:
            prefix, explicit = (word.split("=", 1) + [None])[:2] if "=" in word else (word, None)
            result = [(reg.by_option[name], name, explicit) for name in reg.by_option if name.startswith(prefix)]
    else:
        short, short_explicit = word[:2], word[2:]
        for name in reg.by_option:
            if name == short:
                result.append((reg.by_option[name], name, short_explicit))
            elif name.startswith(word):
                result.append((reg.by_option[name], name, None))
    return result


def _values_taken(nargs, following):
    """How many of ``following`` (a run of positional words after an option) the option takes (argparse
    _match_argument for an optional); None when it needs more than there are (argparse exits: expected N arguments)."""
    if nargs is None:
        return 1 if following >= 1 else None
    if nargs == "?":
        return min(following, 1)
    if nargs == "*":
        return following
    if nargs == "+":
        return following if following >= 1 else None
    if isinstance(nargs, int):
        return nargs if following >= nargs else None
    return 0  # argparse.PARSER / REMAINDER do not occur among vLLM's options


class Role:
    """What one word of the invocation is to vLLM's parser.

    ``kind``: ``option`` (an option word; ``action`` None for an unknown one), ``value`` (a value of the option word at
    ``owner``), ``positional``, ``dotted`` (a dotted key word, its group's option ``group`` as written and its ``path``),
    ``dotted_value`` (the value of the dotted word at ``owner``), ``separator`` (``--``), ``error`` (argparse exits on it:
    ambiguous option, missing value). ``explicit`` is the ``=value`` part of an option word. ``speculative``: the word
    sets speculative decoding (an option word of one of its dests, its value, a dotted word resolving to one), set by
    ``read`` once per word so a reader asks an attribute, not this file, per word.
    """

    __slots__ = ("kind", "action", "option", "owner", "explicit", "group", "path", "note", "speculative")

    def __init__(self, kind, action=None, option=None, owner=None, explicit=None, group=None, path=None, note=None):
        self.kind = kind
        self.action = action
        self.option = option
        self.owner = owner
        self.explicit = explicit
        self.group = group
        self.path = path
        self.note = note
        self.speculative = False

    def key(self):
        """What the word means, for comparing two readings of the same words (dest or kind)."""
        dest = self.action.dest if self.action is not None else None
        return (self.kind if self.kind != "dotted_value" else "dotted", dest, self.group)

    def __repr__(self):  # pragma: no cover - debugging aid
        return "Role(%s, %s)" % (self.kind, self.action.dest if self.action else self.option)


class Reading:
    """The roles of a list of words (the arguments after ``vllm serve`` or after the api_server module), and the dotted
    groups in the order vLLM appends them (``[(group as written, action or None, {path: value word index})]``).

    ``shift`` (read_all with ``drop``): the first word whose meaning changes once the dropped words are gone, as
    ``(index in the words, key before, key after)``, or None."""

    def __init__(self, words, roles, groups):
        self.words = words
        self.roles = roles
        self.groups = groups
        self.shift = None

    def speculative_indices(self, reg=None):  # pylint: disable=unused-argument
        """Indices of the words that set speculative decoding: the option words of its dests, their values, and the words
        of dotted groups that resolve to one of them (``reg``: the registry the words were read with; kept for callers)."""
        return [index for index, role in enumerate(self.roles) if role.speculative]


def read_all(regions, reg=None, drop=None):
    """The Readings of several word lists in one call, for a reader that has a whole command (a script's invocations,
    argv, the same words with and without the pod's env): ``regions`` is ``[(words, unknown)]`` as for ``read``, and
    identical regions are read once. ``drop(position, reading)`` (optional) names the words a caller removes from
    ``regions[position]`` (a set of indices, or None): the rest is read again and ``reading.shift`` says the first word
    vLLM would then read differently (a multi-value option taking the positional model once a flag is gone)."""
    reg = reg or registry()
    readings = []
    seen = {}
    for position, (words, unknown) in enumerate(regions):
        unknown = frozenset(unknown)
        key = (tuple(words), unknown)
        reading = seen.get(key)
        if reading is None:
            reading = seen[key] = read(words, reg, unknown)
        gone = drop(position, reading) if drop is not None else None
        if gone:
            reading = _with_shift(reading, words, unknown, gone, reg)
        readings.append(reading)
    return readings


def _with_shift(reading, words, unknown, gone, reg):
    """A copy of ``reading`` whose ``shift`` compares each kept word's meaning before and after ``gone`` is removed."""
    kept = [i for i in range(len(words)) if i not in gone]
    position = {old: new for new, old in enumerate(kept)}
    after = read([words[i] for i in kept], reg, {position[i] for i in unknown if i in position})
    out = Reading(reading.words, reading.roles, reading.groups)
    for old, role in zip(kept, after.roles):
        was, now = reading.roles[old].key(), role.key()
        if was != now:
            out.shift = (old, was, now)
            break
    return out


def read(words, reg=None, unknown=()):
    """The Reading of ``words`` (strings; the indices in ``unknown`` are words whose text is known only at run time and are
    read as positionals here, the caller decides what they may be)."""
    reg = reg or registry()
    normalised = [normalise(w) if i not in unknown else w for i, w in enumerate(words)]
    roles = [None] * len(words)
    # 1. FlexibleArgumentParser: dotted words and their values are taken out (vLLM does not look at what the word
    # before a dotted word is: the dotted word and the word after it go, whatever they are)
    groups = {}
    skip = set()
    for index, word in enumerate(normalised):
        if index in skip or index in unknown or not word.startswith("-"):
            continue
        name = word.split("=", 1)[0]
        if "." not in name:
            continue
        explicit = "=" in word
        if not explicit and index + 1 >= len(words):
            roles[index] = Role("error", note="dotted option without a value")
            continue
        if name.endswith("+"):
            name = name[:-1]
        group, path = name.split(".", 1)
        roles[index] = Role("dotted", group=group, path=path)
        if not explicit:
            skip.add(index + 1)
            roles[index + 1] = Role("dotted_value", owner=index, group=group, path=path)
        groups.setdefault(group, {})[path] = index
    # the groups are appended as `group <json>` and read by argparse like any option word
    resolved = []
    for group, paths in groups.items():
        found = parse_optional(reg, group)
        action = found[0] if isinstance(found, tuple) and found[0] not in (None, "ambiguous") else None
        resolved.append((group, action, paths))
    actions = {group: action for group, action, _paths in resolved}
    for role in roles:
        if role is not None and role.kind in ("dotted", "dotted_value"):
            role.action = actions[role.group]
    # 2. argparse over the remaining words: the pattern of O (option) and A (argument) words, then consumption
    rest = [i for i in range(len(words)) if roles[i] is None]
    parsed = {}
    separator = None
    for i in rest:
        if separator is not None:
            parsed[i] = None
            continue
        if normalised[i] == "--" and i not in unknown:
            separator = i
            roles[i] = Role("separator")
            continue
        parsed[i] = None if i in unknown else _optimization_level(reg, normalised, i) or parse_optional(reg, normalised[i])
    order = [i for i in rest if i != separator]
    pos = 0
    while pos < len(order):
        index = order[pos]
        found = parsed.get(index)
        if found is None or (separator is not None and index > separator):
            roles[index] = Role("positional")
            pos += 1
            continue
        if found[0] == "ambiguous":
            roles[index] = Role("error", note="ambiguous option: %s could match %s" % (words[index], ", ".join(found[1])))
            pos += 1
            continue
        action, option, explicit = found
        roles[index] = Role("option", action, option, explicit=explicit)
        if action is None or explicit is not None:
            pos += 1
            continue
        run = 0
        while pos + 1 + run < len(order) and parsed.get(order[pos + 1 + run]) is None \
                and (separator is None or order[pos + 1 + run] < separator):
            run += 1
        taken = _values_taken(action.nargs, run)
        if taken is None:
            roles[index].note = "expected a value"
            taken = run
        for k in range(taken):
            roles[order[pos + 1 + k]] = Role("value", action, option, owner=index)
        pos += 1 + taken
    for role in roles:
        role.speculative = role.kind in ("option", "value", "dotted", "dotted_value") and reg.speculative(role.action)
    return Reading(list(words), roles, resolved)


def dotted_config(paths, value_of):
    """The JSON object vLLM builds from one dotted group (``{path: word index}``), as
    ``FlexibleArgumentParser.parse_args`` does: each value ``json.loads``-ed when it parses, else kept as text, nested by
    the path's dots (a later value of the same path wins). ``value_of(index)`` gives a dotted word's value text."""
    out = {}
    for path, index in paths.items():
        raw = value_of(index)
        try:
            value = json.loads(raw)
        except (TypeError, ValueError):
            value = raw
        keys = path.split(".")
        node = out
        for key in keys[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[keys[-1]] = value
    return out
