# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark statistics with the same definitions as ``vllm bench serve``, in pure Python.

``vllm bench serve`` (``vllm/benchmarks/serve.py``, ``calculate_metrics``) reports, per run:

- TTFT: time from sending the request to the first streamed chunk that carries ``choices``;
- ITL: the gap between consecutive streamed chunks (per chunk, not per token: with speculative decoding
  several tokens share a chunk, so ITL and TPOT diverge). All requests' gaps are pooled;
- E2EL: time from sending the request to the last chunk;
- TPOT: ``(E2EL - TTFT) / (output_tokens - 1)`` for requests with more than one output token, with
  ``output_tokens`` from ``usage.completion_tokens``;
- medians and percentiles with ``numpy.percentile``'s default (``linear``) interpolation, means, std
  (population, ``ddof=0``);
- ``request_throughput = completed / duration``, ``output_throughput = sum(output_tokens) / duration``,
  ``total_token_throughput = (sum(input) + sum(output)) / duration``.

Times are kept in seconds inside and reported in milliseconds, like the reference tool.

On top of the reference definitions, ``burst_delivered`` flags requests whose stream reached the client in
bursts (a buffering proxy, or a CPU-starved client): their TTFT, ITL and TPOT are not per-token timings.
"""

from __future__ import annotations

import math

DEFAULT_PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")

# Burst delivery. No real engine emits chunk after chunk 100 us apart at steady state: even a small model on a
# fast GPU needs about 1-2 ms per decode step, and speculative decoding and vLLM's --stream-interval only make
# chunks fewer and the gaps between them longer. Bytes that sat in a buffer (an ingress, proxy or service mesh
# with response buffering, or a client starved of CPU) are read microseconds apart. So a stream whose median
# gap between chunks is under 0.1 ms was not timed per token. At least 8 chunks (7 gaps), so that one or two
# chunks sent together (the role chunk with the first token, the last token with the finish chunk) cannot
# make the median.
BURST_MIN_CHUNKS = 8
BURST_MAX_MEDIAN_GAP_S = 0.0001


def percentile(values, pct):
    """``numpy.percentile(values, pct)`` with the default linear interpolation; ``None`` for no values.

    The rank is ``(n - 1) * pct / 100``; the result interpolates between the two neighbouring order
    statistics (numpy's ``method='linear'``, Hyndman and Fan type 7).
    """
    data = sorted(float(v) for v in values)
    if not data:
        return None
    if pct < 0 or pct > 100:
        raise ValueError("percentile must be within 0..100, got %r" % (pct,))
    rank = (len(data) - 1) * (float(pct) / 100.0)
    low = int(math.floor(rank))
    high = min(low + 1, len(data) - 1)
    frac = rank - low
    if frac == 0 or low == high:
        return data[low]
    # numpy's _lerp: a + (b - a) * t, switched to b - (b - a) * (1 - t) for t >= 0.5 (exact at the ends)
    lo_v, hi_v = data[low], data[high]
    diff = hi_v - lo_v
    if frac >= 0.5:
        return hi_v - diff * (1.0 - frac)
    return lo_v + diff * frac


def median(values):
    """``numpy.median``: the 50th percentile (mean of the middle two for an even count)."""
    return percentile(values, 50)


def mean(values):
    data = [float(v) for v in values]
    if not data:
        return None
    return math.fsum(data) / len(data)


def std(values):
    """Population standard deviation (``numpy.std`` with ``ddof=0``)."""
    data = [float(v) for v in values]
    if not data:
        return None
    avg = math.fsum(data) / len(data)
    return math.sqrt(math.fsum((v - avg) ** 2 for v in data) / len(data))


def distribution(values, percentiles=DEFAULT_PERCENTILES, scale=1000.0):
    """Summary of one latency series in milliseconds (``scale`` converts seconds).

    Returns ``{"count", "mean", "median", "std", "min", "max", "p<N>"...}``; all ``None`` but count for an
    empty series (the reference tool prints 0 there; ``None`` keeps "no data" distinct from "zero").
    """
    data = [float(v) * scale for v in values]
    out = {"count": len(data)}
    if not data:
        out.update({"mean": None, "median": None, "std": None, "min": None, "max": None})
        for pct in percentiles:
            out[_pct_key(pct)] = None
        return out
    out.update({
        "mean": mean(data),
        "median": median(data),
        "std": std(data),
        "min": min(data),
        "max": max(data),
    })
    for pct in percentiles:
        out[_pct_key(pct)] = percentile(data, pct)
    return out


def _pct_key(pct):
    text = ("%g" % float(pct)).replace(".", "_")
    return "p%s" % text


def tpot_of(record):
    """TPOT in seconds of one request record, or ``None`` when it has at most one output token."""
    tokens = record.get("output_tokens") or 0
    if tokens > 1 and record.get("latency") is not None and record.get("ttft") is not None:
        return (record["latency"] - record["ttft"]) / (tokens - 1)
    return None


def burst_delivered(record):
    """Whether one request record's stream arrived in bursts, not as the server produced it.

    True for a successful record with at least ``BURST_MIN_CHUNKS`` chunks (``len(itl) >= BURST_MIN_CHUNKS - 1``)
    whose median gap between chunks is under ``BURST_MAX_MEDIAN_GAP_S``. Failed and short records are never flagged.
    """
    if not record.get("success"):
        return False
    gaps = record.get("itl") or []
    if len(gaps) < BURST_MIN_CHUNKS - 1:
        return False
    return median(gaps) < BURST_MAX_MEDIAN_GAP_S


def summarize_run(records, duration, percentiles=DEFAULT_PERCENTILES):
    """Aggregate one side's measured requests the way ``vllm bench serve`` does.

    ``records``: dicts with ``success``, ``ttft``, ``itl`` (list), ``latency`` (E2EL), ``output_tokens``,
    ``prompt_tokens`` (seconds for times). ``duration``: wall time of the measured phase in seconds.

    Beyond the reference tool's numbers: ``samples``, the per-request TTFT, TPOT and output rate the keep rule's noise
    tests rank; ``burst_delivered``, how many completed requests arrived in bursts
    (``burst_delivered(record)``), and ``burst_delivered_median_gap_ms``, the median gap between those requests'
    chunks (pooled; ``None`` when there are none). They are counted in the statistics like every other request.
    """
    ok = [r for r in records if r.get("success")]
    ttfts = [r["ttft"] for r in ok]
    e2els = [r["latency"] for r in ok]
    itls = [gap for r in ok for gap in (r.get("itl") or [])]
    tpots = [t for t in (tpot_of(r) for r in ok) if t is not None]
    output_tokens = sum(int(r.get("output_tokens") or 0) for r in ok)
    input_tokens = sum(int(r.get("prompt_tokens") or 0) for r in ok)
    bursts = [r for r in ok if burst_delivered(r)]
    burst_gaps = [gap for r in bursts for gap in r["itl"]]
    duration = float(duration)
    rate = (lambda n: n / duration) if duration > 0 else (lambda n: None)
    return {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": rate(len(ok)),
        "output_throughput": rate(output_tokens),
        "total_token_throughput": rate(input_tokens + output_tokens),
        "ttft_ms": distribution(ttfts, percentiles),
        "tpot_ms": distribution(tpots, percentiles),
        "itl_ms": distribution(itls, percentiles),
        "e2el_ms": distribution(e2els, percentiles),
        "mean_output_tokens": mean([r.get("output_tokens") or 0 for r in ok]),
        "burst_delivered": len(bursts),
        "burst_delivered_median_gap_ms": median(burst_gaps) * 1000.0 if burst_gaps else None,
        # the per-request values the keep rule's noise tests rank (bench/noise.py): seconds, and tokens per second of
        # request time
        "samples": {"ttft": ttfts, "tpot": tpots,
                    "output_rate": [int(r.get("output_tokens") or 0) / r["latency"] for r in ok if r.get("latency")]},
    }


def is_number(value):
    """A finite int or float, not a bool (a measured figure or a numeric option)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def side_summary(side):
    """The summary of one measured side, given as ``summarize_run``'s dict or as ``spec_benchmark``'s side dict
    (``{"summary": {...}, ...}``)."""
    side = side or {}
    return side["summary"] if isinstance(side.get("summary"), dict) else side


def without_samples(side):
    """A side (or a summary) without the per-request samples: what module results and reports show."""
    side = dict(side or {})
    if isinstance(side.get("summary"), dict):
        side["summary"] = {k: v for k, v in side["summary"].items() if k != "samples"}
    side.pop("samples", None)
    return side


def relative_change(baseline, candidate):
    """``candidate / baseline - 1`` or ``None`` when it is undefined."""
    if baseline in (None, 0) or candidate is None:
        return None
    return float(candidate) / float(baseline) - 1.0


def ratio(numerator, denominator):
    if numerator is None or denominator in (None, 0):
        return None
    return float(numerator) / float(denominator)


def spread(values):
    """Relative spread ``(max - min) / median`` of repeated measurements; ``None`` with fewer than 2."""
    data = [float(v) for v in values if v is not None]
    if len(data) < 2:
        return None
    mid = median(data)
    if not mid:
        return None
    return (max(data) - min(data)) / mid
