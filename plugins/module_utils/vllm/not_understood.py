# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a reader of vLLM's output did not understand, listed beside what it read.

A vLLM newer than the collection's tables (speculative_releases.RELEASES) may print fields, methods or metrics this
collection has never seen. The readers (the engine line in engine_log/speculative_repr, the ``SpecDecoding metrics:``
lines in spec_decoding_log, the /metrics page in metrics) read what they know, never crash on the rest and never drop it
silently: each thing they pass over becomes one item here, and the modules return the list as ``not_understood`` and
warn once.

An item: ``{"source": "engine_line" | "spec_decoding_line" | "metrics", "name": what was not understood (field, method,
metric or label name), "reason": one short sentence, "count": how many lines or series carried it}``, plus ``"value"`` (as
printed) where there is one, and ``"pod"`` when the modules read pods.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

ENGINE_LINE = "engine_line"
SPEC_DECODING_LINE = "spec_decoding_line"
METRICS = "metrics"

MAX_VALUE = 200        # characters of a printed value kept in an item
WARNING_NAMES = 4      # names spelt out in the one warning; the rest are counted


def item(source, name, reason, value=None):
    """One thing a reader passed over."""
    out = {"source": source, "name": name, "reason": reason, "count": 1}
    if value is not None:
        text = value if isinstance(value, str) else repr(value)
        out["value"] = text if len(text) <= MAX_VALUE else text[:MAX_VALUE] + "..."
    return out


def add(items, new, **extra):
    """Add the items of ``new`` to the list ``items`` (in place) with ``extra`` keys (e.g. pod=...): one item per
    (source, name, reason and extra), counts summed, first value kept. Returns ``items``."""
    for entry in new or ():
        entry = dict(entry, **extra)
        key = _key(entry)
        same = next((old for old in items if _key(old) == key), None)
        if same is None:
            items.append(entry)
        else:
            same["count"] = same.get("count", 1) + entry.get("count", 1)
    return items


def _key(entry):
    return tuple(sorted((k, str(v)) for k, v in entry.items() if k not in ("count", "value")))


def warning(items):
    """The one short warning a module gives for ``items`` (None when empty)."""
    if not items:
        return None
    names = []
    for entry in items:
        label = "%s %s" % (_NOUNS.get(entry["source"], entry["source"]), entry["name"])
        if label not in names:
            names.append(label)
    shown = ", ".join(names[:WARNING_NAMES]) + (" and %d more" % (len(names) - WARNING_NAMES) if len(names) > WARNING_NAMES else "")
    return ("vLLM printed what this collection does not know (a vLLM newer than its tables?): %s. What is known was read; "
            "see not_understood for each reason" % shown)


def summary_line(items):
    """The verify summary's line for ``items`` (None when empty): each reason once, in the order first seen."""
    reasons = []
    for entry in items or ():
        if isinstance(entry, dict) and entry.get("reason") and entry["reason"] not in reasons:
            reasons.append(entry["reason"])
    return "not understood: " + " | ".join(reasons) if reasons else None


_NOUNS = {ENGINE_LINE: "engine line", SPEC_DECODING_LINE: "SpecDecoding line", METRICS: "/metrics"}
