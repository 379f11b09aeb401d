# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Find vLLM's engine-config line and the speculative-decoding warnings in a log, in bounded memory.

vLLM prints, once per engine start (see ../shared/reference/facts.md section 1)::

    (EngineCore pid=2539) INFO 11-29 07:44:56 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config:
    model='/mnt/models/tiny-llama', speculative_config=SpeculativeConfig(method='eagle3',
    model='/mnt/models/tiny-eagle3', num_spec_tokens=3), tokenizer=...

(one physical line). The V0 engine says ``Initializing a V0 LLM engine``; builds before 0.8 said
``Initializing an LLM engine``. A process prefix, a timestamp from the log collector or colour codes may
come first, so the scanner searches instead of anchoring. Its ``speculative_config=`` is read by speculative_repr,
which also lists what a vLLM newer than the tables printed there (``not_understood``).

The scanner works on byte chunks of any size (a file read, an HTTP stream from the API server, a string)
and keeps only the unfinished last line between chunks, so a multi-gigabyte log costs a few MiB of memory.
It looks for a handful of fixed byte needles with ``bytes.find`` (C speed) and decodes only the lines that
contain one.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood as unknown
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as spec_core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_rules
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_releases import RELEASES
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_repr import (
    normalize_method,
    normalize_model,
    parse_speculative_repr,
)

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

ENGINE_NEEDLE = b"LLM engine (v"
KNOWN_ENGINES = ("V0", "V1")
WARNING_NEEDLE = b"WARNING"
ENGINE_RE = re.compile(
    r"Initializing an? (?:(?P<engine>V\d+) )?LLM engine \(v?(?P<version>[^)\s]*)\) with config:\s?(?P<config>.*)$"
)

# Lines worth reporting: (kind, needle searched in the raw bytes, regex on the cleaned line).
# Only WARNING/ERROR/CRITICAL lines are reported (vLLM also prints INFO lines that mention speculation).
WARNING_RULES = (
    ("async_scheduling_disabled", b"Async scheduling",
     re.compile(r"Async scheduling (?:not supported with .*speculative decoding|is disabled because .*speculative decoding)")),
    ("min_p_logit_bias", b"min_p and logit_bias", re.compile(r"min_p and logit_bias")),
    ("method_deprecated", b"is deprecated and replaced with",
     re.compile(r"method [`'\"]?(?P<old>[\w.-]+)[`'\"]? is deprecated and replaced with [`'\"]?(?P<new>[\w.-]+)")),
    # vLLM 0.32 vllm/config/vllm.py _maybe_disable_dynamic_sd_for_data_parallel: the k schedule dropped for data parallelism
    ("schedule_disabled_data_parallel", b"num_speculative_tokens_per_batch_size",
     re.compile(r"Disabling num_speculative_tokens_per_batch_size")),
    ("speculative_other", b"peculative", re.compile(r"[Ss]peculative")),
    ("speculative_other", b"draft model", re.compile(r"[Dd]raft model")),
)
LEVEL_RE = re.compile(r"(?<![\w-])(?P<level>WARNING|ERROR|CRITICAL)(?![\w-])")
# After the level: "MM-DD HH:MM:SS[.fff] [file.py:123] message" (vLLM's format); else take the rest.
MESSAGE_RE = re.compile(r"(?:WARNING|ERROR|CRITICAL)\s+(?:\d\d-\d\d\s+\d\d:\d\d:\d\d(?:[.,]\d+)?\s+)?(?:\[[^\]]*\]\s*)?(?P<msg>.*)$")

DEFAULT_MAX_LINE = 1 << 20          # longer lines are cut (the engine line is a few KiB)
DEFAULT_MAX_WARNINGS = 50           # distinct warning messages kept
DEFAULT_CHUNK = 1 << 20

METHOD_GUESS_HINT = (
    "vLLM guesses the method when --speculative-config omits \"method\": a draft path containing 'eagle3' gives eagle3, "
    "'eagle-' gives eagle, anything else draft_model (so /mnt/models/draft silently becomes draft_model); "
    "set \"method\" explicitly in --speculative-config"
)


def strip_ansi(text):
    """Remove terminal colour/control sequences."""
    if "\x1b" not in text:
        return text
    return ANSI_RE.sub("", text)


# The engine config starts with the model the engine serves: ``model='/mnt/models/target', speculative_config=...``.
_SERVED_MODEL_RE = re.compile(r"^\s*model='((?:[^'\\]|\\.)*)'")


def parse_engine_line(line):
    """Parse one log line; returns a dict or None when it is not an engine-config line."""
    text = strip_ansi(line).rstrip("\r\n")
    match = ENGINE_RE.search(text)
    if not match:
        return None
    version = match.group("version") or None
    present, spec, notes = parse_speculative_repr(match.group("config"), version)
    served = _SERVED_MODEL_RE.match(match.group("config"))
    engine = match.group("engine") or "V0"
    if engine not in KNOWN_ENGINES:
        notes.insert(0, unknown.item(unknown.ENGINE_LINE, engine, "engine %s is not one vLLM has printed (%s): its line was "
                                     "read as a V1 line" % (engine, ", ".join(KNOWN_ENGINES))))
    return {
        "engine": engine,
        "vllm_version": version,
        "model": served.group(1) if served else None,
        "speculative_config": spec,
        "speculative_config_printed": present,
        "not_understood": notes,
        "line": text,
    }


def classify_warning(line):
    """Return ``(kind, level, message)`` for a speculative-decoding warning line, else None."""
    text = strip_ansi(line).rstrip("\r\n")
    level = LEVEL_RE.search(text)
    if not level:
        return None
    for kind, _needle, regex in WARNING_RULES:
        if regex.search(text):
            msg = MESSAGE_RE.search(text, level.start())
            message = (msg.group("msg") if msg else text).strip()
            return kind, level.group("level"), message
    return None


class EngineLogScanner:
    """Streaming scanner: ``feed()`` chunks (bytes or str), then ``result()``.

    Memory is bounded by ``max_line`` (the unfinished line carried between chunks) plus the lines that
    matched. Every engine-config line is parsed; the last one describes the engine that runs now (a
    restarted process logs a new one).
    """

    def __init__(self, max_line=DEFAULT_MAX_LINE, max_warnings=DEFAULT_MAX_WARNINGS, collect_warnings=True):
        self.max_line = max_line
        self.max_warnings = max_warnings
        self.collect_warnings = collect_warnings
        self._carry = b""
        self.engines = []           # parsed engine lines, in order
        self._warnings = {}         # (kind, message) -> dict
        self.warnings_dropped = 0
        self.bytes_scanned = 0
        self.lines_cut = 0
        # Two passes of bytes.find per chunk: the engine line and WARNING-level lines (rare in a serving log);
        # the warning rules are then checked on those lines only.
        self._needles = (ENGINE_NEEDLE, WARNING_NEEDLE) if collect_warnings else (ENGINE_NEEDLE,)

    def feed(self, chunk, end=None):
        """Scan the next piece of the log (bytes, bytearray or str); ``end`` limits a reused buffer."""
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", "surrogateescape")
        if end is None:
            end = len(chunk)
        if end <= 0:
            return
        self.bytes_scanned += end
        start = 0
        if self._carry:
            # Finish the line cut at the previous chunk's end (a short copy, not the whole chunk).
            first_nl = chunk.find(b"\n", 0, end)
            if first_nl < 0:
                self._carry += bytes(chunk[:end])
                self._check_carry()
                return
            boundary = self._carry + bytes(chunk[:first_nl + 1])
            self._carry = b""
            self._scan_region(boundary, 0, len(boundary))
            start = first_nl + 1
        last_nl = chunk.rfind(b"\n", start, end)
        if last_nl < 0:
            self._carry = bytes(chunk[start:end])
            self._check_carry()
            return
        self._scan_region(chunk, start, last_nl + 1)
        self._carry = bytes(chunk[last_nl + 1:end])
        self._check_carry()

    def _check_carry(self):
        if len(self._carry) > self.max_line:
            # A line longer than max_line: scan what we have and go on (the rest of that line is cut).
            self.lines_cut += 1
            self._scan_region(self._carry, 0, len(self._carry))
            self._carry = b""

    def _scan_region(self, buf, region_start, region_end):
        """Handle every line of buf[region_start:region_end] holding a needle; the region holds whole lines."""
        seen_starts = set()
        for needle in self._needles:
            pos = buf.find(needle, region_start, region_end)
            while pos >= 0:
                start = buf.rfind(b"\n", region_start, pos) + 1 if pos > region_start else region_start
                start = max(start, region_start)
                end = buf.find(b"\n", pos, region_end)
                if end < 0:
                    end = region_end
                if start not in seen_starts:
                    seen_starts.add(start)
                    self._handle_line(bytes(buf[start:min(end, start + self.max_line)]))
                pos = buf.find(needle, end, region_end)

    def _handle_line(self, raw):
        if len(raw) > self.max_line:
            raw = raw[:self.max_line]
        line = raw.decode("utf-8", "replace")
        if ENGINE_NEEDLE in raw:
            parsed = parse_engine_line(line)
            if parsed:
                self.engines.append(parsed)
                return
        if self.collect_warnings and any(rule[1] in raw for rule in WARNING_RULES):
            found = classify_warning(line)
            if found:
                kind, level, message = found
                key = (kind, message)
                entry = self._warnings.get(key)
                if entry:
                    entry["count"] += 1
                elif len(self._warnings) < self.max_warnings:
                    self._warnings[key] = {"kind": kind, "level": level, "message": message, "count": 1}
                else:
                    self.warnings_dropped += 1

    def close(self):
        if self._carry:
            self._scan_region(self._carry, 0, len(self._carry))
            self._carry = b""

    @property
    def warnings(self):
        return list(self._warnings.values())

    def result(self):
        """Close and summarise: the keys the engine_config module returns."""
        self.close()
        last = self.engines[-1] if self.engines else None
        distinct = []
        for eng in self.engines:
            if eng["speculative_config"] not in distinct:
                distinct.append(eng["speculative_config"])
        return {
            "found": last is not None,
            "vllm_version": last["vllm_version"] if last else None,
            "engine": last["engine"] if last else None,
            "model": last["model"] if last else None,
            "speculative_config": last["speculative_config"] if last else None,
            "speculative_config_printed": last["speculative_config_printed"] if last else None,
            "not_understood": list(last["not_understood"]) if last else [],
            "line": last["line"] if last else None,
            "engine_lines_seen": len(self.engines),
            "configs_seen": distinct if len(distinct) > 1 else [],
            "log_warnings": self.warnings,
            "bytes_scanned": self.bytes_scanned,
        }


def scan_chunks(chunks, **kwargs):
    """Scan an iterable of byte/str chunks (or lines) and return the result dict."""
    scanner = EngineLogScanner(**kwargs)
    for chunk in chunks:
        scanner.feed(chunk)
    return scanner.result()


def scan_text(text, **kwargs):
    """Scan a whole log held in memory (str or bytes), chunk by chunk."""
    scanner = EngineLogScanner(**kwargs)
    for i in range(0, len(text), DEFAULT_CHUNK):
        scanner.feed(text[i:i + DEFAULT_CHUNK])
    return scanner.result()


def scan_file(path, chunk_size=DEFAULT_CHUNK, **kwargs):
    """Scan a log file in fixed-size chunks read into one reused buffer (bounded memory whatever its size)."""
    scanner = EngineLogScanner(**kwargs)
    buf = bytearray(chunk_size)
    try:
        with open(path, "rb", buffering=0) as handle:
            while True:
                count = handle.readinto(buf)
                if not count:
                    break
                scanner.feed(buf, count)
    except OSError as exc:
        raise ValidationError("cannot read %s: %s" % (path, exc.strerror or exc), field="log_path",
                              hint="give a readable log file on the host that runs the module") from exc
    return scanner.result()


def iter_needle_lines(chunks, needles, max_line=DEFAULT_MAX_LINE):
    """Yield the decoded lines (without newline) of a chunk stream that contain any of the byte needles.

    Same bounded-memory splitting as EngineLogScanner (only the unfinished last line is carried); order kept.
    """
    carry = b""
    for chunk in chunks:
        if not chunk:
            continue
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", "surrogateescape")
        start, end = 0, len(chunk)
        if carry:
            first_nl = chunk.find(b"\n")
            if first_nl < 0:
                carry += chunk
                if len(carry) > max_line:
                    yield from _lines_with(carry, 0, len(carry), needles, max_line)
                    carry = b""
                continue
            boundary = carry + chunk[:first_nl + 1]
            carry = b""
            yield from _lines_with(boundary, 0, len(boundary), needles, max_line)
            start = first_nl + 1
        last_nl = chunk.rfind(b"\n", start, end)
        if last_nl < 0:
            carry = chunk[start:]
        else:
            yield from _lines_with(chunk, start, last_nl + 1, needles, max_line)
            carry = chunk[last_nl + 1:]
        if len(carry) > max_line:
            yield from _lines_with(carry, 0, len(carry), needles, max_line)
            carry = b""
    if carry:
        yield from _lines_with(carry, 0, len(carry), needles, max_line)


def _lines_with(buf, region_start, region_end, needles, max_line):
    starts = {}
    for needle in needles:
        pos = buf.find(needle, region_start, region_end)
        while pos >= 0:
            start = max(buf.rfind(b"\n", region_start, pos) + 1, region_start)
            end = buf.find(b"\n", pos, region_end)
            if end < 0:
                end = region_end
            starts[start] = end
            pos = buf.find(needle, end, region_end)
    for start in sorted(starts):
        yield bytes(buf[start:min(starts[start], start + max_line)]).decode("utf-8", "replace").rstrip("\r")


def iter_file_chunks(path, chunk_size=DEFAULT_CHUNK, field="log_path"):
    """Yield a file's bytes in chunks; a clear ValidationError when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            while True:
                chunk = handle.read(chunk_size)
                if not chunk:
                    return
                yield chunk
    except OSError as exc:
        raise ValidationError("cannot read %s: %s" % (path, exc.strerror or exc), field=field,
                              hint="give a readable file on the host that runs the module") from exc


def iter_text_chunks(text, chunk_size=DEFAULT_CHUNK):
    """Yield an in-memory str/bytes in chunks."""
    for i in range(0, len(text), chunk_size):
        yield text[i:i + chunk_size]


# ----------------------------------------------------------------------------------------------------
# Comparing with what was requested

# The tables that carry the name rules of SpeculativeConfig.__post_init__ and its __repr__ (read since the 0.32 table).
_RULE_TABLES = [t for _minor, t in sorted(RELEASES.items(), key=lambda kv: tuple(int(p) for p in kv[0].split(".")))
                if t.get("method_from_model") is not None]
# Methods some release prints with model=None; ngram in every release (facts.md section 1).
_REPR_MODEL_NONE = frozenset(["ngram"] + [m for t in RELEASES.values() for m in t.get("repr_model_none") or ()])


def _rule_table(vllm_version):
    """The release's table when it carries the method rules, else the newest table that does (None: no table does)."""
    table = spec_core.printed_table(vllm_version)[0] if vllm_version else None
    if table is not None and table.get("method_from_model") is not None:
        return table
    return _RULE_TABLES[-1] if _RULE_TABLES else None


def prints_no_model(method, vllm_version=None):
    """Whether vLLM's engine line prints ``model=None`` for ``method`` (SpeculativeConfig.__repr__: the proposers
    without a draft, ngram, suffix, extract_hidden_states and custom_class in 0.32), so a requested model cannot show."""
    table = spec_core.printed_table(vllm_version)[0] if vllm_version else None
    if table is not None and table.get("repr_model_none"):
        return method in table["repr_model_none"]
    return method in _REPR_MODEL_NONE


def expected_from_flag(config, vllm_version=None):
    """Map a parsed ``--speculative-config`` dict (keys as the user wrote them) to an ``expected`` dict.

    Without a written method, ``method`` is the one vLLM picks from the names (a dotted class path or "ngram" as
    ``model``, a draft path containing 'eagle3'; speculative_rules.method_vllm_runs) and ``method_rule`` says why: the
    flag asked for no method, so that is no difference. For a draft path naming no method it is vLLM's fallback,
    draft_model, and ``method_from_files`` lists the methods the draft's config.json may still give. A written method vLLM overrides (a draft path containing
    'eagle3' under method draft_model) stays the expected one and ``method_rule`` explains the difference: the engine
    does not run what the flag asks (issue #49: a method vLLM overrides is a mismatch, never a match)."""
    if config is None:
        return {"enabled": False}
    cfg = {str(k).replace("-", "_"): v for k, v in dict(config).items()}
    expected = {"enabled": True}
    if cfg.get("method") is not None:
        expected["method"] = cfg["method"]
    if cfg.get("model") is not None:
        expected["model"] = cfg["model"]
    if cfg.get("num_speculative_tokens") is not None:
        # as vLLM's pydantic reads it ("3", 3.0 -> 3); a value it refuses is compared as written
        number = speculative_rules.as_int(cfg["num_speculative_tokens"])[0]
        expected["num_speculative_tokens"] = cfg["num_speculative_tokens"] if number is None else number
    expected["method_given"] = cfg.get("method") is not None
    table = _rule_table(vllm_version)
    method = cfg.get("method") if isinstance(cfg.get("method"), str) else None
    model = cfg.get("model") if isinstance(cfg.get("model"), str) else None
    if table is not None and (method is not None or model is not None):
        runs, rule = speculative_rules.method_vllm_runs(method, model, table)
        if method is None and runs is not None:
            # the flag names no method: the one vLLM picks for it from the names is the one it asks for
            expected["method"] = runs
            from_files = speculative_rules.methods_from_draft_files(table) if rule is None and model is not None else []
            if from_files:
                # a draft path naming no method: draft_model, unless the draft's config.json names one of these
                expected["method_from_files"] = from_files
        if rule:
            expected["method_rule"] = rule
    return expected


def compare_expected(found, expected, vllm_version=None):
    """Compare a parsed speculative_config (or None) with an ``expected`` dict.

    expected keys (all optional): ``enabled`` (False: the engine must run without speculative decoding),
    ``method``, ``model``, ``num_speculative_tokens``, ``method_given`` (False when the request omitted
    ``method``, so a vLLM guess is explained rather than blamed), ``method_rule`` (from expected_from_flag: why vLLM
    picks the method, or overrides the one written), ``method_from_files`` (the methods the draft's config.json may
    still give where the flag names no method). ``vllm_version``: the release that printed ``found``.
    Returns a list of human-readable differences (empty: it matches) and a list of notes.
    """
    diffs, notes = [], []
    expected = dict(expected or {})
    want_method = normalize_method(expected.get("method"))
    want_model = normalize_model(expected.get("model"))
    want_num = expected.get("num_speculative_tokens")
    enabled = expected.get("enabled")
    if enabled is None:
        enabled = any(v is not None for v in (want_method, want_model, want_num)) or None
    if enabled is False:
        if found is not None:
            diffs.append("expected no speculative decoding (speculative_config=None), engine runs %s" % format_config(found))
        return diffs, notes
    if enabled is None:
        return diffs, notes
    if found is None:
        diffs.append("expected %s, engine runs without speculative decoding (speculative_config=None)" % format_expected(expected))
        return diffs, notes
    got_method = normalize_method(found.get("method"))
    if want_method is not None and got_method != want_method and got_method in expected.get("method_from_files", ()):
        notes.append("the request omitted \"method\" and vLLM chose %r, from the draft's config.json (vLLM reads its "
                     "model_type and architectures; the path alone gives %r)" % (got_method, want_method))
    elif want_method is not None and got_method != want_method:
        msg = "method: expected %r, engine runs %r" % (want_method, got_method)
        if expected.get("method_given") is False:
            if got_method in ("draft_model", "eagle", "eagle3"):
                msg += " (%s)" % METHOD_GUESS_HINT
        elif expected.get("method_rule"):
            msg += " (vLLM overrides the method written: %s)" % expected["method_rule"]
        diffs.append(msg)
    elif expected.get("method_given") is False and got_method in ("draft_model", "eagle", "eagle3"):
        notes.append("the request omitted \"method\" and vLLM chose %r: %s" % (got_method, METHOD_GUESS_HINT))
    if expected.get("method") is not None and want_method != str(expected.get("method")).strip().lower():
        notes.append("method %r is an alias that vLLM normalises to %r" % (expected.get("method"), want_method))
    if expected.get("method_rule") and got_method == want_method:
        notes.append("vLLM runs %r, a method the flag does not name: %s" % (want_method, expected["method_rule"]))
    if want_model is not None and found.get("model") is None and prints_no_model(
            got_method if want_method is None else want_method, vllm_version):
        # SpeculativeConfig.__repr__ prints model=None for these methods: the requested model cannot show in the line.
        # The method asked decides: a draft asked for and an engine running ngram (model=None) is a difference.
        notes.append("model %r is not compared: vLLM prints model=None for method %r" % (want_model, got_method))
    elif want_model is not None and normalize_model(found.get("model")) != want_model:
        diffs.append("model: expected %r, engine runs %r" % (want_model, found.get("model")))
    if want_num is not None:
        try:
            want_int = int(want_num)
        except (TypeError, ValueError):
            raise ValidationError("must be an integer, got %r" % (want_num,), field="expected.num_speculative_tokens",
                                  hint="give the number of speculative tokens, e.g. 3") from None
        if found.get("num_spec_tokens") != want_int:
            diffs.append("num_speculative_tokens: expected %d, engine runs %r" % (want_int, found.get("num_spec_tokens")))
    return diffs, notes


def format_config(cfg):
    if cfg is None:
        return "speculative_config=None"
    return "SpeculativeConfig(method=%r, model=%r, num_spec_tokens=%r)" % (cfg.get("method"), cfg.get("model"), cfg.get("num_spec_tokens"))


def format_expected(expected):
    parts = []
    for key in ("method", "model", "num_speculative_tokens"):
        if expected.get(key) is not None:
            value = normalize_method(expected[key]) if key == "method" else expected[key]
            parts.append("%s=%r" % (key, value))
    return "{%s}" % ", ".join(parts) if parts else "speculative decoding enabled"


NOT_FOUND_HINT = (
    "the engine may still be starting (the line appears once the engine core starts, after the API server's "
    "first lines), the log may be from the wrong container (vLLM runs in kserve-container by default; set "
    "container), or the log window was cut (raise tail_lines/since_seconds, or set previous for a restarted "
    "container). From vLLM 0.24 only data-parallel rank 0 prints it"
)


def flagless_source(found, command_items, env=None):
    """Where speculative decoding comes from when the engine runs a proposer and the container's command carries no
    speculative flag, or None when a flag explains it (or the engine runs none).

    vLLM (``maybe_override_with_speculators`` in ``vllm/transformers_utils/config.py``, 0.32) reads the ``config.json``
    of the model it is asked to serve; when it carries ``speculators_config``, the checkpoint is a speculator: vLLM serves
    the verifier it names as the target and turns speculative decoding on with the checkpoint as the draft, without any
    flag. The engine line then shows ``model='<verifier>'`` and ``speculative_config=SpeculativeConfig(..., model=
    '<the served path>')``. ``found`` is a scan result (``model``, ``speculative_config``); ``command_items`` the
    container's command + args, ``env`` its environment (for ``$(VAR)``/``$VAR`` in them)."""
    spec = (found or {}).get("speculative_config")
    if not spec:
        return None
    if vllm_command.find_occurrences(list(command_items or [])):
        return None
    served = vllm_command.served_model(command_items, env)
    draft = spec.get("model")
    if served and draft and _same_path(served, draft) and not _same_path(served, found.get("model") or ""):
        return {"kind": "speculators_checkpoint", "checkpoint": served, "verifier": found.get("model"),
                "message": "speculative decoding comes from the speculators-format checkpoint %s served as the model (its "
                           "config.json carries speculators_config: vLLM serves its verifier %s with the checkpoint as the "
                           "draft, with no flag to remove)" % (served, found.get("model")),
                "fix": "serve the target model %s directly (set the model path or storageUri to it); then nothing proposes"
                       % (found.get("model") or "(the checkpoint's verifier)")}
    return {"kind": "unexplained", "checkpoint": None, "verifier": None,
            "message": "the engine runs %s but the container's command carries no speculative flag (a ServingRuntime, an "
                       "environment variable or a wrapper script may add it)" % format_config(spec),
            "fix": "find where the flag comes from (serving_runtime_info shows the merged command) and remove it there"}


def _same_path(left, right):
    return str(left).rstrip("/") == str(right).rstrip("/")


# What module engine_config reads and compares: a log (text or file), or every predictor pod's log of an InferenceService
# through the API server, against what was asked for or what the InferenceService's flag says.
