# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's periodic ``SpecDecoding metrics:`` log lines (and the V0 ``Speculative metrics:`` form): one window each, summed
into SpecDecodeCounters.

vLLM 0.10.2 to 0.34 (``SpecDecodingLogging.log`` in ``vllm/v1/spec_decode/metrics.py``) print, every
``VLLM_LOG_STATS_INTERVAL``::

    SpecDecoding metrics: Mean acceptance length: 2.42, Accepted throughput: 25.70 tokens/s, Drafted throughput:
    72.90 tokens/s, Accepted: 257 tokens, Drafted: 729 tokens, Per-position acceptance rate: 0.569, 0.320, 0.249,
    Avg Draft acceptance rate: 35.3%

(one line; 0.8.5 to 0.10.1 printed ``Draft acceptance rate:`` first and a mean without the bonus token). A field this
reader does not know, a known field it cannot read, or a line without the counts it needs is listed with a reason
(not_understood.py): a newer vLLM's line is read as far as it can be.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import math
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood as unknown
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.engine_log import (
    iter_file_chunks,
    iter_needle_lines,
    iter_text_chunks,
    strip_ansi,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.metrics import SpecDecodeCounters

LOG_NEEDLES = (b"SpecDecoding metrics", b"Speculative metrics")
_FLOAT = r"(?:[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|inf|-inf)"
RE_MEAN = re.compile(r"Mean acceptance length:\s*(%s)" % _FLOAT)
RE_ACC_TPUT = re.compile(r"Accepted throughput:\s*(%s)\s*tokens/s" % _FLOAT)
RE_DRAFT_TPUT = re.compile(r"Drafted throughput:\s*(%s)\s*tokens/s" % _FLOAT)
RE_ACCEPTED = re.compile(r"Accepted:\s*(\d+)\s*tokens")
RE_DRAFTED = re.compile(r"Drafted:\s*(\d+)\s*tokens")
RE_PER_POS = re.compile(r"Per-position acceptance rate:\s*\[?\s*(%s(?:\s*,\s*%s)*)" % (_FLOAT, _FLOAT))
RE_RATE_PCT = re.compile(r"(Avg )?Draft acceptance rate:\s*(%s)\s*%%" % _FLOAT)
RE_TIME = re.compile(r"(?:INFO|DEBUG)\s+(\d\d-\d\d \d\d:\d\d:\d\d)")
LINE_MARK = "SpecDecoding metrics:"
# The fields vLLM 0.8.5 to 0.34 print in the line, each with the pattern that reads it (0.34: SpecDecodingLogging.log).
FORMAT_KNOWN = "0.8.5 to 0.34"
FIELDS = {
    "Mean acceptance length": RE_MEAN,
    "Accepted throughput": RE_ACC_TPUT,
    "Drafted throughput": RE_DRAFT_TPUT,
    "Accepted": RE_ACCEPTED,
    "Drafted": RE_DRAFTED,
    "Per-position acceptance rate": RE_PER_POS,
    "Avg Draft acceptance rate": RE_RATE_PCT,
    "Draft acceptance rate": RE_RATE_PCT,
}
# "<Label>: <value>" parts of the line: a label starts the line or follows a comma, begins with a letter and ends at
# ": " (the per-position values are numbers, so their commas start no label).
LABEL_RE = re.compile(r"(?:^|,)\s*([A-Za-z][\w .()/%-]*?)\s*:(?=\s|$)")
# A line of the same family in a form not read here (a qualified SpecDecoding line, or a V0 line RE_V0 does not match).
OTHER_FORM_RE = re.compile(r"SpecDecoding metrics\b[^:,]{1,40}:|Speculative metrics:")
# V0: "Speculative metrics: Draft acceptance rate: 0.712, System efficiency: 0.546, Number of speculative
# tokens: 5, Number of accepted tokens: 123, Number of draft tokens: 456, Number of emitted tokens: 789."
RE_V0 = re.compile(
    r"Speculative metrics:\s*Draft acceptance rate:\s*(?P<rate>%s),\s*System efficiency:\s*(?P<eff>%s),\s*"
    r"Number of speculative tokens:\s*(?P<k>\d+),\s*Number of accepted tokens:\s*(?P<acc>\d+),\s*"
    r"Number of draft tokens:\s*(?P<draft>\d+),\s*Number of emitted tokens:\s*(?P<emit>\d+)" % (_FLOAT, _FLOAT)
)


def _float(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def parse_log_line(line, not_understood=None):
    """Parse one ``SpecDecoding metrics:`` (V1) or ``Speculative metrics:`` (V0) line into a window dict.

    Returns None for other lines. Window keys: ``format`` (v1 = 0.10.2+, v1_legacy = 0.8.5-0.10.1, v0),
    ``num_accepted_tokens``, ``num_draft_tokens``, ``num_drafts`` (derived, see ``num_drafts_estimated``),
    ``accepted_tokens_per_position`` (derived), ``per_position_acceptance_rate`` (as printed),
    ``mean_acceptance_length`` (1 + accepted/drafts, whatever the build printed), ``draft_acceptance_rate``
    (fraction), ``printed_mean_acceptance_length``, throughputs, ``time``, ``cumulative`` (V0 counts are
    since start, V1 windows are per logging interval). What the line holds beyond that (a field of a newer vLLM, a
    field in another form, a line without the counts) is added to the list ``not_understood`` when one is given.
    """
    notes = []
    window = _read_line(strip_ansi(line), notes)
    if not_understood is not None:
        unknown.add(not_understood, notes)
    return window


def _read_line(text, notes):
    v0 = RE_V0.search(text)
    if v0:
        k = int(v0.group("k"))
        accepted, drafted = int(v0.group("acc")), int(v0.group("draft"))
        drafts = int(round(drafted / k)) if k else None
        return _window("v0", text, accepted, drafted, drafts, True, [], _float(v0.group("rate")), None, cumulative=True,
                       extra={"system_efficiency": _float(v0.group("eff")), "num_emitted_tokens": int(v0.group("emit")),
                              "num_speculative_tokens": k})
    idx = text.find(LINE_MARK)
    if idx < 0:
        other = OTHER_FORM_RE.search(text)
        if other:
            notes.append(_item(other.group(0).rstrip(":"), "a line in a form vLLM %s do not print: not read" % FORMAT_KNOWN,
                               text[other.start():other.start() + 200]))
        return None
    body = text[idx + len(LINE_MARK):].strip()
    read = {}
    for label, part in _fields(body).items():
        regex = FIELDS.get(label)
        match = regex.match(part) if regex else None
        value = part.partition(":")[2].strip()
        if regex is None:
            notes.append(_item(label, "SpecDecoding metrics field '%s' unknown (vLLM %s do not print it): not read"
                               % (label, FORMAT_KNOWN), value))
        elif not match or part[match.end():].strip(" ]"):
            notes.append(_item(label, "SpecDecoding metrics field '%s' is not in the form vLLM %s print: not read"
                               % (label, FORMAT_KNOWN), value))
        else:
            read[label] = match
    acc_m, dr_m = read.get("Accepted"), read.get("Drafted")
    if not acc_m or not dr_m:
        notes.append(_item("SpecDecoding metrics", "a line without 'Accepted: N tokens' and 'Drafted: N tokens': its window "
                           "was not read", body[:200]))
        return None
    accepted, drafted = int(acc_m.group(1)), int(dr_m.group(1))
    mean_m, pos_m = read.get("Mean acceptance length"), read.get("Per-position acceptance rate")
    rate_m = read.get("Avg Draft acceptance rate") or read.get("Draft acceptance rate")
    printed_mean = _float(mean_m.group(1)) if mean_m else None
    rates = [_float(v) for v in pos_m.group(1).split(",")] if pos_m else []
    rates = [r if r is not None else 0.0 for r in rates]
    legacy = bool(rate_m and not rate_m.group(1)) and "Accepted throughput" not in read and "Drafted throughput" not in read
    fmt = "v1_legacy" if legacy else "v1"
    # accepted/drafts from the printed numbers: the per-position rates sum to it (3 decimals each, the most
    # precise source); else the printed mean, minus the bonus token if the build counted it.
    ratio = sum(rates) if rates and sum(rates) > 0 else None
    if printed_mean is not None:
        if rates:
            bonus = abs(printed_mean - 1 - sum(rates)) < abs(printed_mean - sum(rates))
        else:
            bonus = not legacy
        mean_excl = printed_mean - 1 if bonus else printed_mean
        if ratio is None and mean_excl > 0:
            ratio = mean_excl
    drafts, estimated = None, True
    if accepted > 0 and ratio:
        drafts = int(round(accepted / ratio))
    elif drafted > 0 and rates:
        drafts = int(math.ceil(drafted / float(len(rates))))   # nothing accepted: a draft proposes up to k tokens
    elif drafted == 0:
        drafts, estimated = 0, False
    rate = accepted / float(drafted) if drafted else (_float(rate_m.group(2)) / 100.0 if rate_m and _float(rate_m.group(2)) is not None else None)
    window = _window(fmt, text, accepted, drafted, drafts, estimated, rates, rate, printed_mean)
    window["accepted_throughput"] = _float(read["Accepted throughput"].group(1)) if "Accepted throughput" in read else None
    window["drafted_throughput"] = _float(read["Drafted throughput"].group(1)) if "Drafted throughput" in read else None
    return window


def _fields(body):
    """``{label: "label: value"}`` of a line's body (after ``SpecDecoding metrics:``), in order; the first of a repeat."""
    marks = list(LABEL_RE.finditer(body))
    parts = {}
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(body)
        parts.setdefault(mark.group(1), body[mark.start(1):end].strip().rstrip(",").strip())
    return parts


def _item(name, reason, value=None):
    return unknown.item(unknown.SPEC_DECODING_LINE, name, reason, value)


def _window(fmt, text, accepted, drafted, drafts, estimated, rates, rate, printed_mean, cumulative=False, extra=None):
    per_pos_accepted = [int(round(r * drafts)) for r in rates] if drafts else [0 for _r in rates]
    time_m = RE_TIME.search(text)
    window = {
        "format": fmt,
        "time": time_m.group(1) if time_m else None,
        "num_accepted_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_drafts": drafts,
        "num_drafts_estimated": estimated,
        "accepted_tokens_per_position": per_pos_accepted,
        "per_position_acceptance_rate": rates,
        "draft_acceptance_rate": rate,
        "mean_acceptance_length": (1 + accepted / float(drafts)) if drafts else None,
        "printed_mean_acceptance_length": printed_mean,
        "cumulative": cumulative,
    }
    if extra:
        window.update(extra)
    return window


def parse_log(chunks, max_windows=1000, not_understood=None):
    """Parse every SpecDecoding/Speculative metrics line of a log stream (chunks of bytes/str).

    Returns ``(counters, windows, windows_total)``. V1 windows are summed (each covers one logging
    interval); V0 lines are cumulative, so the last one is the total. ``windows`` keeps the last
    ``max_windows`` windows (memory stays bounded); ``windows_total`` counts them all. What the lines hold that is not
    understood is added to the list ``not_understood`` when one is given, once per reason with a count of lines.
    """
    acc = dft = drafts = 0
    per_pos = []
    estimated = False
    windows = []
    total = 0
    last_v0 = None
    for line in iter_needle_lines(chunks, LOG_NEEDLES):
        window = parse_log_line(line, not_understood)
        if window is None:
            continue
        total += 1
        windows.append(window)
        if len(windows) > max_windows:
            del windows[0]
        if window["cumulative"]:
            last_v0 = window
            continue
        acc += window["num_accepted_tokens"]
        dft += window["num_draft_tokens"]
        drafts += window["num_drafts"] or 0
        estimated = estimated or (window["num_drafts_estimated"] and window["num_draft_tokens"] > 0)
        for i, value in enumerate(window["accepted_tokens_per_position"]):
            if i >= len(per_pos):
                per_pos.append(0)
            per_pos[i] += value
    if last_v0 is not None and acc == 0 and dft == 0:
        acc, dft, drafts = last_v0["num_accepted_tokens"], last_v0["num_draft_tokens"], last_v0["num_drafts"]
        estimated = True
    counters = SpecDecodeCounters(num_drafts=drafts if total else None, num_draft_tokens=dft if total else None,
                                  num_accepted_tokens=acc if total else None, accepted_per_pos=per_pos,
                                  found=total > 0, source="log", num_drafts_estimated=estimated)
    return counters, windows, total


def parse_log_text(text, **kwargs):
    return parse_log(iter_text_chunks(text), **kwargs)


def parse_log_file(path, **kwargs):
    return parse_log(iter_file_chunks(path), **kwargs)
