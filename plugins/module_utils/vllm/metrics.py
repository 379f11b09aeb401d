# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Speculative-decoding acceptance numbers from vLLM's /metrics page (its ``SpecDecoding metrics:`` log lines are read by
spec_decoding_log into the same SpecDecodeCounters), the summary and the diagnosis.

Reusable pure functions (the benchmark computes /metrics deltas over a run with them)::

    before = parse_prometheus(text_before, model_name="my-model")
    after = parse_prometheus(text_after, model_name="my-model")
    summary = summarize(after.delta(before), method="eagle3")
    summary["mean_acceptance_length"], summary["draft_acceptance_rate"], summary["diagnosis"]["status"]

Definitions (facts.md section 1): draft acceptance rate = accepted / draft tokens (a fraction); mean
acceptance length = 1 + accepted / drafts (counts the bonus token); per-position rate = accepted at
position i / drafts. Series are summed over ``engine`` (data-parallel ranks) and, unless ``model_name``
is given, over served model names.

Plain Python, no Ansible imports; /metrics text is read by ``prometheus_text`` (prometheus_client, imported
guardedly: a module checks ``prometheus_text.HAS_PROMETHEUS_CLIENT``).
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood as unknown
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_repr import normalize_method
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import prometheus_text

# Metric-name prefixes of the spec_decode families (after the ``vllm:`` namespace; see prometheus_text).
SPEC_PREFIXES = ("spec_decode_", "vllm_spec_decode_")
# Counter base names (after stripping the ``vllm:``/``vllm_`` prefix and the ``_total`` suffix).
V1_COUNTERS = {
    "spec_decode_num_drafts": "num_drafts",
    "spec_decode_num_draft_tokens": "num_draft_tokens",
    "spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POS = "spec_decode_num_accepted_tokens_per_pos"
V0_NAMES = {
    "spec_decode_draft_acceptance_rate": "v0_draft_acceptance_rate",
    "spec_decode_efficiency": "v0_efficiency",
    "spec_decode_num_emitted_tokens": "v0_num_emitted_tokens",
}
NAME_RE = re.compile(r"^(?:[a-zA-Z_][a-zA-Z0-9_]*[:_])?(spec_decode_[a-z_]+?)(?:_total)?$")
# Labels vLLM 0.10 to 0.34 put on the spec_decode series (``position`` only on the per-position counter).
KNOWN_LABELS = frozenset(("model_name", "engine"))
# Sample suffixes of a histogram or summary family: an unknown family is listed once, by its family name.
_FAMILY_SUFFIX_RE = re.compile(r"_(?:bucket|count|sum|gcount|gsum)$")

# Methods whose proposals come from a separate model or head: acceptance near zero points at the draft.
DRAFT_BASED_METHODS = frozenset(("eagle", "eagle3", "draft_model", "mtp", "medusa", "mlp_speculator", "dflash", "dspark"))
MODEL_FREE_METHODS = frozenset(("ngram", "ngram_gpu", "suffix"))

DEFAULT_MISMATCH_RATE = 0.05   # draft-based method at or below this acceptance: likely the wrong draft
DEFAULT_COLLAPSE_RATE = 0.10   # per-position rate at slot 2 below this: deeper speculation is wasted

NO_DATA_HINT = (
    "possible causes: no request was served since the engine started (or in the "
    "interval), speculative decoding is off (engine line speculative_config=None), stats are disabled "
    "(--disable-log-stats removes them), or the build names the metrics differently"
)


def _num(value):
    """Counters are floats on the wire; return ints where integral."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class SpecDecodeCounters:
    """Cumulative (or, after delta(), windowed) speculative-decoding counters."""

    FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")

    def __init__(self, num_drafts=None, num_draft_tokens=None, num_accepted_tokens=None, accepted_per_pos=None,
                 found=False, model_names=None, engines=None, source="prometheus", v0=None, reset=False,
                 num_drafts_estimated=False, all_model_names=None):
        self.num_drafts = num_drafts
        self.num_draft_tokens = num_draft_tokens
        self.num_accepted_tokens = num_accepted_tokens
        self.accepted_per_pos = list(accepted_per_pos or [])
        self.found = found
        self.model_names = sorted(model_names or [])
        self.engines = sorted(engines or [])
        self.source = source
        self.v0 = dict(v0 or {})
        self.reset = reset
        self.num_drafts_estimated = num_drafts_estimated
        # Every model_name seen on the page, before the model_name filter (to explain an empty filter).
        self.all_model_names = sorted(all_model_names if all_model_names is not None else self.model_names)

    def delta(self, earlier):
        """Counters over the window between ``earlier`` and this (later) scrape.

        A counter that went down means the server restarted in between: the later values (counted since
        that restart) are returned with ``reset=True``.
        """
        if earlier is None or not earlier.found:
            return self._copy()
        diffs = {}
        reset = False
        for field in self.FIELDS:
            now, then = getattr(self, field), getattr(earlier, field)
            if now is None:
                diffs[field] = None
            else:
                diffs[field] = now - (then or 0)
                reset = reset or diffs[field] < 0
        positions = []
        for i, now in enumerate(self.accepted_per_pos):
            then = earlier.accepted_per_pos[i] if i < len(earlier.accepted_per_pos) else 0
            positions.append(now - then)
            reset = reset or now - then < 0
        if reset:
            out = self._copy()
            out.reset = True
            return out
        v0 = {}
        if "v0_num_emitted_tokens" in self.v0:
            v0["v0_num_emitted_tokens"] = self.v0["v0_num_emitted_tokens"] - earlier.v0.get("v0_num_emitted_tokens", 0)
        return SpecDecodeCounters(found=self.found, model_names=self.model_names, engines=self.engines, source=self.source,
                                  accepted_per_pos=positions, v0=v0, num_drafts_estimated=self.num_drafts_estimated, **diffs)

    def __add__(self, other):
        """Sum two counter sets (e.g. two pods of one InferenceService)."""
        if not other.found:
            return self._copy()
        if not self.found:
            return other._copy()
        sums = {}
        for field in self.FIELDS:
            a, b = getattr(self, field), getattr(other, field)
            sums[field] = None if a is None and b is None else (a or 0) + (b or 0)
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pos = [(self.accepted_per_pos[i] if i < len(self.accepted_per_pos) else 0)
               + (other.accepted_per_pos[i] if i < len(other.accepted_per_pos) else 0) for i in range(n)]
        return SpecDecodeCounters(found=True, model_names=set(self.model_names) | set(other.model_names),
                                  engines=set(self.engines) | set(other.engines), source=self.source, accepted_per_pos=pos,
                                  num_drafts_estimated=self.num_drafts_estimated or other.num_drafts_estimated, **sums)

    def _copy(self):
        return SpecDecodeCounters(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, self.accepted_per_pos,
                                  self.found, self.model_names, self.engines, self.source, self.v0, self.reset,
                                  self.num_drafts_estimated)

    def to_dict(self):
        return {
            "found": self.found,
            "num_drafts": _num(self.num_drafts),
            "num_draft_tokens": _num(self.num_draft_tokens),
            "num_accepted_tokens": _num(self.num_accepted_tokens),
            "accepted_tokens_per_position": [_num(v) for v in self.accepted_per_pos],
            "model_names": list(self.model_names),
            "engines": list(self.engines),
            "reset": self.reset,
        }

    def __repr__(self):
        return "SpecDecodeCounters(%r)" % (self.to_dict(),)


def filter_spec_lines(text):
    """The exposition lines of the spec_decode families: what ``parse_prometheus`` hands to the parser."""
    return prometheus_text.filter_lines(text, SPEC_PREFIXES)


def parse_prometheus(text, model_name=None, not_understood=None):
    """Parse a /metrics page (Prometheus text format) into SpecDecodeCounters.

    Only the spec_decode families are handed to prometheus_client's parser (``prometheus_text.parse_samples``,
    which drops ``_created`` series); values are summed over ``engine`` and over model names unless
    ``model_name`` filters them (then samples without that ``model_name`` label are left out).
    A spec_decode metric or label vLLM 0.10 to 0.34 do not expose is passed over and, when ``not_understood`` is a list,
    added to it (not_understood.py).
    Raises ValidationError (field ``metrics``) when prometheus_client is missing or the page is not valid
    exposition text.
    """
    totals = {}
    per_pos = {}
    v0 = {}
    models, engines = set(), set()
    all_models = set()
    found = False
    notes = []
    for sample in prometheus_text.parse_samples(text, SPEC_PREFIXES, field="metrics"):
        match = NAME_RE.match(sample.name)
        base = match.group(1) if match else None
        labels = sample.labels or {}
        if base not in V1_COUNTERS and base != PER_POS and base not in V0_NAMES:
            family = _FAMILY_SUFFIX_RE.sub("", sample.name)
            notes.append(unknown.item(unknown.METRICS, family, "metric %s unknown (not exposed by vLLM 0.10 to 0.34): not read"
                                      % family))
            continue
        if "model_name" in labels:
            all_models.add(labels["model_name"])
        if model_name is not None and labels.get("model_name") != model_name:
            continue
        known_labels = KNOWN_LABELS | ({"position"} if base == PER_POS else set())
        for label in sorted(set(labels) - known_labels):
            notes.append(unknown.item(unknown.METRICS, label, "label %s on %s unknown: the series were summed over it"
                                      % (label, sample.name)))
        value = sample.value
        if base in V1_COUNTERS:
            key = V1_COUNTERS[base]
            totals[key] = totals.get(key, 0.0) + value
        elif base == PER_POS:
            try:
                position = int(labels.get("position", "0"))
            except ValueError:
                notes.append(unknown.item(unknown.METRICS, "position", "label position=%r on %s is not a number: that series "
                                          "was not read" % (labels.get("position"), sample.name)))
                continue
            per_pos[position] = per_pos.get(position, 0.0) + value
        else:
            key = V0_NAMES[base]
            if key == "v0_num_emitted_tokens":
                v0[key] = v0.get(key, 0.0) + value
            else:
                v0.setdefault(key, []).append(value)
        found = True
        if "model_name" in labels:
            models.add(labels["model_name"])
        if "engine" in labels:
            engines.add(labels["engine"])
    if not_understood is not None:
        unknown.add(not_understood, notes)
    positions = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    for key in ("v0_draft_acceptance_rate", "v0_efficiency"):
        if key in v0:
            vals = v0[key]
            v0[key] = sum(vals) / len(vals)
    counters = SpecDecodeCounters(
        num_drafts=totals.get("num_drafts"),
        num_draft_tokens=totals.get("num_draft_tokens"),
        num_accepted_tokens=totals.get("num_accepted_tokens"),
        accepted_per_pos=positions,
        found=found,
        model_names=models,
        engines=engines,
        v0=v0,
        all_model_names=all_models,
    )
    return counters


# ----------------------------------------------------------------------------------------------------
# Per-request metrics (vLLM 0.32+ --per-request-spec-decode-metrics summary|detailed)

def counters_from_response(body):
    """SpecDecodeCounters from one response's ``metrics.speculative_decoding`` (a dict, JSON text or an SSE ``data:`` line).

    ``acceptance_histogram[i]`` counts steps that accepted exactly i draft tokens, so the tokens accepted at
    position j are the steps that accepted more than j. Returns counters with found=False when the body
    carries no per-request metrics.
    """
    if isinstance(body, (bytes, str)):
        import json  # pylint: disable=import-outside-toplevel
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        text = text.strip()
        if text.startswith("data:"):
            text = text[5:].strip()
        try:
            body = json.loads(text)
        except ValueError:
            return SpecDecodeCounters(source="response")
    spec = ((body or {}).get("metrics") or {}).get("speculative_decoding") if isinstance(body, dict) else None
    if not isinstance(spec, dict):
        return SpecDecodeCounters(source="response")
    hist = list(spec.get("acceptance_histogram") or [])
    k = spec.get("num_spec_tokens") or max(len(hist) - 1, 0)
    per_pos = [sum(hist[j + 1:]) for j in range(k)] if hist else []
    return SpecDecodeCounters(num_drafts=spec.get("num_spec_steps"), num_draft_tokens=spec.get("num_draft_tokens"),
                              num_accepted_tokens=spec.get("num_accepted_draft_tokens"), accepted_per_pos=per_pos,
                              found=True, model_names=[body["model"]] if body.get("model") else [], source="response")


# ----------------------------------------------------------------------------------------------------
# Derived numbers and diagnosis

def _ratio(num, den):
    if num is None or not den:
        return None
    return num / float(den)


def summarize(counters, method=None, mismatch_rate=DEFAULT_MISMATCH_RATE, collapse_rate=DEFAULT_COLLAPSE_RATE):
    """Derived numbers and a diagnosis, with the keys the spec_metrics module returns."""
    method = normalize_method(method)
    drafts, drafted, accepted = counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens
    has_data = bool(counters.found and drafted)
    per_pos_rate = [_ratio(v, drafts) for v in counters.accepted_per_pos] if drafts else []
    summary = {
        "source": counters.source,
        "has_data": has_data,
        "num_drafts": _num(drafts),
        "num_draft_tokens": _num(drafted),
        "num_accepted_tokens": _num(accepted),
        "accepted_tokens_per_position": [_num(v) for v in counters.accepted_per_pos],
        "mean_acceptance_length": (1 + accepted / float(drafts)) if has_data and drafts and accepted is not None else None,
        "draft_acceptance_rate": _ratio(accepted, drafted) if has_data else None,
        "per_position_acceptance_rate": per_pos_rate if has_data else [],
        "num_drafts_estimated": bool(counters.num_drafts_estimated),
        "model_names": list(counters.model_names),
        "counter_reset": counters.reset,
    }
    if counters.v0:
        summary["v0"] = dict(counters.v0)
        if has_data and summary["draft_acceptance_rate"] is None:
            summary["draft_acceptance_rate"] = counters.v0.get("v0_draft_acceptance_rate")
    summary["diagnosis"] = diagnose(summary, method, mismatch_rate, collapse_rate, found=counters.found)
    summary["msg"] = summary["diagnosis"]["reason"] if not has_data else describe(summary)
    return summary


def diagnose(summary, method=None, mismatch_rate=DEFAULT_MISMATCH_RATE, collapse_rate=DEFAULT_COLLAPSE_RATE, found=True):
    """healthy | unsuitable_workload | likely_draft_mismatch | no_data, with the numbers behind it."""
    method = normalize_method(method)
    rate = summary.get("draft_acceptance_rate")
    per_pos = summary.get("per_position_acceptance_rate") or []
    numbers = {
        "method": method,
        "draft_acceptance_rate": rate,
        "mean_acceptance_length": summary.get("mean_acceptance_length"),
        "per_position_acceptance_rate": per_pos,
        "num_draft_tokens": summary.get("num_draft_tokens"),
        "mismatch_rate_threshold": mismatch_rate,
        "collapse_rate_threshold": collapse_rate,
    }
    if not summary.get("has_data"):
        if not found:
            reason = "no speculative-decoding metrics: " + NO_DATA_HINT
        else:
            reason = "speculative-decoding counters are present but zero: " + NO_DATA_HINT
        return dict(numbers, status="no_data", reason=reason)
    if rate is not None and rate <= mismatch_rate:
        if method in MODEL_FREE_METHODS:
            return dict(numbers, status="unsuitable_workload",
                        reason="%s proposals are almost never accepted (%.1f%% of %s draft tokens): the prompts and outputs share "
                               "too little text for %s to predict; use a draft-model method or turn speculation off"
                               % (method, 100 * rate, numbers["num_draft_tokens"], method))
        prefix = "" if method in DRAFT_BASED_METHODS else "if the method uses a draft model or head: "
        return dict(numbers, status="likely_draft_mismatch",
                    reason="%sdraft tokens are almost never accepted (%.1f%% of %s, at or below the %.0f%% threshold): "
                           "the draft model/head probably does not belong to this target (other model, fine-tune, "
                           "tokenizer or revision) or is untrained"
                           % (prefix, 100 * rate, numbers["num_draft_tokens"], 100 * mismatch_rate))
    if per_pos:
        slot = 1 if len(per_pos) >= 2 else 0
        value = per_pos[slot]
        if value is not None and value < collapse_rate:
            return dict(numbers, status="unsuitable_workload", collapse_position=slot + 1,
                        reason="acceptance collapses by slot %d (per-position rates %s, below %.2f): deeper speculation "
                               "is wasted on this workload; lower num_speculative_tokens or drop speculation"
                               % (slot + 1, ", ".join("%.3f" % (v or 0) for v in per_pos), collapse_rate))
    return dict(numbers, status="healthy",
                reason="drafts are accepted: %.1f%% of draft tokens, mean acceptance length %s"
                       % (100 * (rate or 0), "%.2f" % numbers["mean_acceptance_length"] if numbers["mean_acceptance_length"] else "n/a"))


def describe(summary):
    """One human line."""
    parts = ["source=%s" % summary["source"]]
    if summary.get("mean_acceptance_length") is not None:
        parts.append("mean acceptance length %.2f" % summary["mean_acceptance_length"])
    if summary.get("draft_acceptance_rate") is not None:
        parts.append("draft acceptance %.1f%%" % (100 * summary["draft_acceptance_rate"]))
    if summary.get("per_position_acceptance_rate"):
        parts.append("per position %s" % ", ".join("%.3f" % (v or 0) for v in summary["per_position_acceptance_rate"]))
    parts.append("%s accepted of %s draft tokens in %s drafts%s" % (
        summary["num_accepted_tokens"], summary["num_draft_tokens"], summary["num_drafts"],
        " (drafts estimated from the log's rounded numbers)" if summary.get("num_drafts_estimated") else ""))
    parts.append("diagnosis %s" % summary["diagnosis"]["status"])
    return "; ".join(parts)


def check_thresholds(summary, min_mean_acceptance_length=None, min_acceptance_rate=None):
    """Return the list of failed thresholds (empty when all pass or none were given)."""
    if min_acceptance_rate is not None and not 0 <= float(min_acceptance_rate) <= 1:
        raise ValidationError("must be a fraction between 0 and 1, got %r" % (min_acceptance_rate,), field="min_acceptance_rate",
                              hint="write 0.35 for 35%")
    if min_mean_acceptance_length is not None and float(min_mean_acceptance_length) < 1:
        raise ValidationError("must be >= 1 (it counts the bonus token), got %r" % (min_mean_acceptance_length,),
                              field="min_mean_acceptance_length", hint="write e.g. 1.5")
    failures = []
    if min_mean_acceptance_length is None and min_acceptance_rate is None:
        return failures
    if not summary.get("has_data"):
        failures.append("thresholds were given but there is no data: %s" % summary["diagnosis"]["reason"])
        return failures
    mal = summary.get("mean_acceptance_length")
    if min_mean_acceptance_length is not None and (mal is None or mal < float(min_mean_acceptance_length)):
        failures.append("mean_acceptance_length %s is below min_mean_acceptance_length %s"
                        % ("n/a" if mal is None else "%.3f" % mal, min_mean_acceptance_length))
    rate = summary.get("draft_acceptance_rate")
    if min_acceptance_rate is not None and (rate is None or rate < float(min_acceptance_rate)):
        failures.append("draft_acceptance_rate %s is below min_acceptance_rate %s"
                        % ("n/a" if rate is None else "%.4f" % rate, min_acceptance_rate))
    return failures


# Where module spec_metrics reads the counters: a /metrics page (a URL, text, a file, or the predictor pods through the
# API server's pod proxy) or vLLM's log (text, a file, or the pods' logs when the pod proxy gives nothing).
