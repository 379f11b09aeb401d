# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Edit a YAML file of a Git repository so that only the edited lines change: comments, key order, quoting, block
scalar styles and every other byte stay as the author wrote them.

ruamel.yaml's round-trip mode keeps comments, order, quotes and styles, but it writes back with one indentation for the
whole document and may reflow what it does not model. So each document of a file is edited on its own (the others keep
their bytes), and the edit is carried over as a three-way merge: the lines ruamel.yaml changes between its unedited
write-back and its edited one are applied to the original text at the lines that correspond to them. A file whose
edit cannot be carried over that way is written as ruamel.yaml writes it, and the result says so.

Plain Python, no Ansible imports; ruamel.yaml is imported where it is needed (modules report it with missing_required_lib).
"""

from __future__ import annotations

import difflib
import io
import re

RUAMEL_IMPORT_ERROR = None
try:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError  # pylint: disable=unused-import  # what manifest_edit catches
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString, FoldedScalarString, LiteralScalarString, SingleQuotedScalarString
    from ruamel.yaml.tokens import CommentToken
except ImportError as exc:  # pragma: no cover - reported by the module
    RUAMEL_IMPORT_ERROR = exc
    YAMLError = Exception

_SEPARATOR_RE = re.compile(r"^(---|\.\.\.)(?:[ \t].*)?$")
# (mapping indent, sequence indent, sequence dash offset): `- ` flush with its key, and `- ` indented by two.
_INDENTS = ((2, 2, 0), (2, 4, 2), (4, 4, 2), (4, 6, 4), (4, 4, 0), (2, 3, 1))


def _yaml(indent=(2, 2, 0)):
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 1 << 20  # never fold a long line
    yaml.indent(mapping=indent[0], sequence=indent[1], offset=indent[2])
    return yaml


def split_documents(text):
    """``[(separator_text, body_text)]``: each document's own ``---`` line (or "") and its body; joined they are ``text``."""
    chunks, sep, body = [], "", []
    for line in text.splitlines(keepends=True):
        if _SEPARATOR_RE.match(line.rstrip("\r\n")):
            if body or sep:
                chunks.append((sep, "".join(body)))
            sep, body = line, []
            continue
        body.append(line)
    chunks.append((sep, "".join(body)))
    return chunks


def load(body):
    """The round-trip tree of one document's text (None for an empty one). Raises YAMLError."""
    return _yaml().load(body)


def dump(tree, indent):
    out = io.StringIO()
    _yaml(indent).dump(tree, out)
    return out.getvalue()


def best_indent(body, tree):
    """The indentation with which ruamel.yaml writes ``tree`` closest to ``body`` (exactly, for a usual file)."""
    best, best_score = _INDENTS[0], None
    lines = body.splitlines()
    for indent in _INDENTS:
        try:
            written = dump(tree, indent)
        except Exception:  # pylint: disable=broad-except  # an indentation ruamel cannot write this tree with
            continue
        if written == body:
            return indent
        score = sum(1 for tag in difflib.SequenceMatcher(a=lines, b=written.splitlines(), autojunk=False).get_opcodes()
                    if tag[0] != "equal")
        if best_score is None or score < best_score:
            best, best_score = indent, score
    return best


def _indent(line):
    return len(line) - len(line.lstrip(" "))


def _reindent(line, delta):
    if delta > 0 and line.strip():
        return " " * delta + line
    if delta < 0 and line[:-delta].strip() == "":
        return line[-delta:]
    return line


def merge_edit(original, unedited, edited):
    """Carry the changes from ``unedited`` to ``edited`` (ruamel.yaml's writes) over to ``original``; None when a
    changed line has no counterpart in ``original``. Lines correspond by their text without leading blanks (a file may
    indent one list differently from another); the carried lines take the original's indentation."""
    if unedited == original:
        return edited
    o_lines = original.splitlines(keepends=True)
    n_lines = unedited.splitlines(keepends=True)
    e_lines = edited.splitlines(keepends=True)
    n_to_o = {}
    matcher = difflib.SequenceMatcher(a=[line.strip() for line in n_lines], b=[line.strip() for line in o_lines], autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            n_to_o[block.a + k] = block.b + k
    replacements = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=n_lines, b=e_lines, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if i1 == i2:  # an insertion: after the counterpart of the line before it
            if i1 > 0 and i1 - 1 not in n_to_o:
                return None
            at = n_to_o[i1 - 1] + 1 if i1 > 0 else 0
            delta = _indent(o_lines[at - 1]) - _indent(n_lines[i1 - 1]) if i1 > 0 else 0
            replacements.append((at, at, [_reindent(line, delta) for line in e_lines[j1:j2]]))
            continue
        mapped = [n_to_o.get(i) for i in range(i1, i2)]
        if None in mapped or mapped != list(range(mapped[0], mapped[0] + len(mapped))):
            return None
        delta = _indent(o_lines[mapped[0]]) - _indent(n_lines[i1])
        replacements.append((mapped[0], mapped[-1] + 1, [_reindent(line, delta) for line in e_lines[j1:j2]]))
    for start, end, lines in sorted(replacements, reverse=True):
        o_lines[start:end] = lines
    return "".join(o_lines)


def edit_text(text, edit_document):
    """Apply ``edit_document(tree, index)`` to every document of a YAML text; it edits the tree in place and returns
    a truthy value when it changed something. Returns ``(new_text, results, exact)``: ``results`` the truthy returns,
    ``exact`` False when a document had to be written back as ruamel.yaml formats it. Raises YAMLError."""
    out, results, exact = [], [], True
    for index, (sep, body) in enumerate(split_documents(text)):
        tree = load(body) if body.strip() else None
        result = edit_document(tree, index) if tree is not None else None
        if not result:
            out.append(sep + body)
            continue
        results.append(result)
        # the unedited write-back is of the same (edited) tree's original: load the body again
        indent = best_indent(body, load(body))
        unedited = dump(load(body), indent)
        edited = dump(tree, indent)
        merged = merge_edit(body, unedited, edited)
        if merged is None:
            merged, exact = edited, False
        out.append(sep + merged)
    return "".join(out), results, exact


def same_style(old, new):
    """``new`` (a str) in the scalar style of ``old`` (a literal ``|`` block stays one, quotes stay)."""
    for style in (LiteralScalarString, FoldedScalarString, SingleQuotedScalarString, DoubleQuotedScalarString):
        if isinstance(old, style):
            return style(new)
    return new


def delete_item(seq, index):
    """Delete a sequence item; the full-line comments below it (ruamel.yaml keeps them on the item above) stay, on
    the item before it."""
    items = getattr(getattr(seq, "ca", None), "items", None)
    token = (items.get(index) or [None])[0] if items is not None else None
    below = None
    if token is not None and "\n" in token.value:
        below = token.value.split("\n", 1)[1]
    del seq[index]
    if below and below.strip():
        if index > 0:
            prev = items.setdefault(index - 1, [None, None, None, None])
            if prev[0] is None:
                prev[0] = CommentToken("\n" + below, token.start_mark, None)
            else:
                prev[0].value = prev[0].value.rstrip("\n") + "\n" + below
        elif hasattr(seq.ca, "comment"):
            seq.yaml_set_start_comment(below)  # pragma: no cover - a flag first in its list with comments below it


def _pair(old, new):
    """Which of ``old`` (indices) the items of ``new`` came from, in order: the most similar, keeping the order."""
    chosen, start = [], 0
    for n_index, value in enumerate(new):
        last = len(old) - (len(new) - n_index)
        candidates = range(start, last + 1)
        best = max(candidates, key=lambda i: (difflib.SequenceMatcher(a=old[i], b=value, autojunk=False).ratio(), -i))
        chosen.append(best)
        start = best + 1
    return chosen


def apply_list(seq, new):
    """Make the sequence ``seq`` (ruamel.yaml's, edited in place) hold ``new``, an edit of it that only drops items
    or changes some: the kept items keep their scalar style and comments."""
    old = [str(x) for x in seq]
    ops = difflib.SequenceMatcher(a=old, b=list(new), autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in reversed(ops):
        if tag == "equal":
            continue
        if tag == "insert":
            raise ValueError("the strip added items %r" % (new[j1:j2],))
        kept = [i1 + k for k in _pair(old[i1:i2], list(new[j1:j2]))] if j2 > j1 else []
        for position, value in zip(kept, new[j1:j2]):
            if str(seq[position]) != value:
                seq[position] = same_style(seq[position], value)
        for position in reversed(range(i1, i2)):
            if position not in kept:
                delete_item(seq, position)


# -- edits that add (the canary's Git mode: gitops/canary_edit.py) ---------------------------------------------------------


def sync_list(seq, new):
    """Make the sequence ``seq`` hold ``new``, an edit of it that may also insert items (``--speculative-config`` and
    its value appended to args): kept items keep their scalar style and comments; an inserted item is written plain
    (ruamel.yaml quotes it where YAML needs quotes, e.g. a JSON object)."""
    old = [str(x) for x in seq]
    ops = difflib.SequenceMatcher(a=old, b=list(new), autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in reversed(ops):
        if tag == "equal":
            continue
        if tag == "insert":
            for offset, value in enumerate(new[j1:j2]):
                seq.insert(i1 + offset, value)
            continue
        # replace / delete: pair the new items with the most similar old ones, change those, drop the rest, then
        # insert the new items that had no old one to take the place of
        pairs = min(i2 - i1, j2 - j1)
        kept = [i1 + k for k in _pair(old[i1:i2], list(new[j1:j1 + pairs]))] if pairs else []
        for position, value in zip(kept, new[j1:j1 + pairs]):
            if str(seq[position]) != value:
                seq[position] = same_style(seq[position], value)
        for position in reversed(range(i1, i2)):
            if position not in kept:
                delete_item(seq, position)
        for offset, value in enumerate(new[j1 + pairs:j2]):
            seq.insert(i1 + pairs + offset, value)


def set_key(mapping, key, value, first=True):
    """Set ``mapping[key]`` to a scalar: an existing value keeps its quoting style; a new key goes first in the mapping
    (``canaryTrafficPercent`` above ``model``, as KServe's examples write it), below the mapping's own comment lines,
    which stay above the key they were written for."""
    if key in mapping:
        if mapping[key] != value:
            mapping[key] = same_style(mapping[key], value) if isinstance(value, str) else value
        return
    if not first or not len(mapping):  # pylint: disable=len-as-condition  # a CommentedMap
        mapping[key] = value
        return
    following = next(iter(mapping))
    leading = mapping.ca.comment[1] if mapping.ca.comment and len(mapping.ca.comment) > 1 else None
    mapping.insert(0, key, value)
    if leading:
        mapping.ca.comment[1] = []
        _entry(mapping, following)[1] = leading


def _entry(mapping, key):
    return mapping.ca.items.setdefault(key, [None, None, None, None])


def delete_key(mapping, key):
    """Delete a key; the full-line comments below its value (ruamel.yaml keeps them on the key) stay, above the next key."""
    keys = list(mapping)
    token = (mapping.ca.items.get(key) or [None, None, None, None])[2]
    before = (mapping.ca.items.get(key) or [None, None, None, None])[1]
    below = token.value.split("\n", 1)[1] if token is not None and "\n" in token.value else ""
    following = keys[keys.index(key) + 1] if keys.index(key) + 1 < len(keys) else None
    del mapping[key]
    mapping.ca.items.pop(key, None)
    lines = [line for line in below.splitlines() if line.strip()]
    if following is None:
        return
    if before:
        _entry(mapping, following)[1] = list(before) + list(_entry(mapping, following)[1] or [])
    if lines:
        column = _indent(lines[0])
        for line in lines:
            mapping.yaml_set_comment_before_after_key(following, before=line.strip().lstrip("#").lstrip(" "), indent=column)
