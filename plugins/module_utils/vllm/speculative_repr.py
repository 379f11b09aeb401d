# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``speculative_config=...`` field of vLLM's engine-config line: what it says, and what it says that the tables
do not know.

vLLM 0.8.5 to 0.34 print ``speculative_config=None`` or
``SpeculativeConfig(method='eagle3', model='/mnt/models/draft', num_spec_tokens=3)`` (``SpeculativeConfig.__repr__``;
0.34 prints a plugin's custom method by its own name there). Older builds printed ``draft_model=`` and
``num_speculative_tokens=``. A newer vLLM may print more fields or a method no table has: the known part is read as
before, fields the release's table knows are kept as printed, and the rest is listed (not_understood.py). An unknown
method still means speculative decoding is on.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import ast
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood as unknown
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as spec_core

MTP_ALIAS_RE = re.compile(r"^[a-z0-9_.-]+_mtp$")
# The fields of the repr read into method / model / num_spec_tokens (the older spellings too).
READ_FIELDS = frozenset(("method", "model", "draft_model", "num_spec_tokens", "num_speculative_tokens"))
CLASS_NAME = "SpeculativeConfig"


def normalize_method(method):
    """Lower-case a method name and map every ``*_mtp`` alias to ``mtp`` as vLLM prints it."""
    if method is None:
        return None
    text = str(method).strip().lower()
    if not text or text in ("none", "null"):
        return None
    if MTP_ALIAS_RE.match(text):
        return "mtp"
    return text


def normalize_model(model):
    """A draft path as compared: None for an empty or ``None`` model, no trailing slash."""
    if model is None:
        return None
    text = str(model).strip()
    if text in ("", "None"):
        return None
    if len(text) > 1:
        text = text.rstrip("/")
    return text


def _literal(raw):
    raw = raw.strip()
    if not raw:
        return None
    if raw[0] in "'\"":
        try:
            return ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            return raw.strip("'\"")
    if raw == "None":
        return None
    if raw in ("True", "False"):
        return raw == "True"
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def _unquoted(text, start=0):
    """Yield ``(index, char)`` for the characters outside '...' and "..." quotes (backslash escapes inside)."""
    quote, i = None, start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        else:
            yield i, ch
        i += 1


def _split_top_level(text):
    """Split ``a='x, y', b=Foo(c=1, d=2), e=3`` at top-level commas, honouring quotes and brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in _unquoted(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _matching_paren(text, open_index):
    """Index of the ``)`` closing the ``(`` at open_index, or -1 (the line was cut)."""
    depth = 0
    for i, ch in _unquoted(text, open_index):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def parse_speculative_repr(config_text, vllm_version=None):
    """Parse the ``speculative_config=...`` field out of the engine line's config text.

    Returns ``(present, config, not_understood)``: present is False when the field is missing; config is None for
    ``speculative_config=None``, else a dict with ``method``, ``model`` and ``num_spec_tokens`` (None where the repr omits
    them) and any other field the table of ``vllm_version`` knows, as printed; not_understood lists the rest
    (not_understood.item dicts).
    """
    marker = "speculative_config="
    idx = config_text.find(marker)
    if idx < 0:
        return False, None, [_item("speculative_config", "the engine line prints no speculative_config field: whether "
                                   "speculative decoding is on cannot be read from it")]
    rest = config_text[idx + len(marker):]
    if rest.startswith("None"):
        return True, None, []
    paren = rest.find("(")
    if paren < 0 or paren > 64:
        return True, {"method": None, "model": None, "num_spec_tokens": None, "raw": rest[:200]}, [
            _item("speculative_config", "printed in a form other than %s(...): read as speculative decoding on, its method "
                  "unknown" % CLASS_NAME, rest[:200])]
    notes = []
    if rest[:paren] != CLASS_NAME:
        notes.append(_item(rest[:paren], "printed instead of %s(...): its fields were read the same way" % CLASS_NAME))
    end = _matching_paren(rest, paren)
    if end < 0:
        notes.append(_item("speculative_config", "the line was cut before %s(...) closed: the fields after the cut are "
                           "missing" % CLASS_NAME))
    inner = rest[paren + 1:end if end >= 0 else len(rest)]
    fields, printed = {}, {}
    for part in _split_top_level(inner):
        if "=" not in part:
            notes.append(_item(part[:60], "a part of %s(...) that is not name=value" % CLASS_NAME, part))
            continue
        key, _sep, value = part.partition("=")
        fields[key.strip()] = _literal(value)
        printed[key.strip()] = value.strip()
    model = fields.get("model", fields.get("draft_model"))
    method = fields.get("method")
    # vLLM 0.6/0.7 printed ngram as draft_model='[ngram]'.
    if method is None and isinstance(model, str) and model.strip("[]").lower() == "ngram":
        method, model = "ngram", None
    num = fields.get("num_spec_tokens", fields.get("num_speculative_tokens"))
    config = {
        "method": normalize_method(method) if method is not None else None,
        "model": normalize_model(model),
        "num_spec_tokens": num if isinstance(num, int) else (int(num) if isinstance(num, float) else num),
    }
    table, label, newer = spec_core.printed_table(vllm_version)
    for key in fields:
        if key in READ_FIELDS:
            continue
        if key in table["keys"] or key in table["engine_keys"]:
            config.setdefault(key, fields[key])
        else:
            notes.append(_item(key, _not_in_table("%s field '%s'" % (CLASS_NAME, key), label, newer, vllm_version,
                                                  spec_core.releases_with(key, "key")), printed[key]))
    if config["num_spec_tokens"] is not None and not isinstance(config["num_spec_tokens"], int):
        as_printed = printed.get("num_spec_tokens", printed.get("num_speculative_tokens"))
        notes.append(_item("num_spec_tokens", "printed as %s, not a number of tokens" % as_printed, as_printed))
    method = config["method"]
    if method is not None and method not in {normalize_method(m) for m in table["methods"]}:
        reason = _not_in_table("method '%s'" % method, label, newer, vllm_version, spec_core.releases_with(method, "method"))
        notes.append(_item(method, reason + ": speculative decoding is on with it"))
    return True, config, notes


def _item(name, reason, value=None):
    return unknown.item(unknown.ENGINE_LINE, name, reason, value)


def _not_in_table(what, label, newer, vllm_version, history):
    """'<what> is not in vLLM 0.32's table (newest known 0.34)', with why that table and which releases have it."""
    if not history and what.startswith("method"):
        return "%s is unknown to the tables (vLLM %s to %s)" % (what, spec_core.OLDEST_TABLE, spec_core.NEWEST_TABLE)
    why = []
    if newer:
        why.append("the engine is %s, newer than the newest table" % vllm_version)
    elif label != spec_core.NEWEST_TABLE:
        why.append("newest known %s" % spec_core.NEWEST_TABLE)
    if history:
        why.append("vLLM %s had it" % (history[0] if len(history) == 1 else "%s to %s" % (history[0], history[-1])))
    return "%s is not in vLLM %s's table%s" % (what, label, " (%s)" % "; ".join(why) if why else "")
