# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Streaming load generator for OpenAI-compatible servers (vLLM), on the standard library only.

Measures each request the way ``vllm bench serve`` does (``vllm/benchmarks/lib/endpoint_request_func.py``):
the clock starts right before the request is sent; every server-sent event ``data: {...}`` that carries
``choices`` is a chunk: the first one sets TTFT, each later one adds an ITL gap, the last one ends E2EL;
the final ``usage`` event (``stream_options.include_usage``) gives ``completion_tokens`` and, from a vLLM 0.32+ server
started with ``--per-request-spec-decode-metrics``, the request's own ``metrics.speculative_decoding`` block (vLLM
``entrypoints/openai/completion/serving.py`` ``completion_stream_generator``: it rides on that usage chunk, only for
``n == 1``; kept as ``spec_decoding``, None when the chunk has none). Requests run in one asyncio event loop
(bench/stream_client.py: ``concurrency`` workers, each with a keep-alive connection, as ``vllm bench serve`` runs them) and
are released at a target request rate (Poisson arrivals or a fixed interval, seeded) or all at once; warmup requests run
first and are discarded.

Standard library only, but for the /metrics pages around a run: those are read by ``prometheus_text``
(prometheus_client, imported guardedly; the module checks ``prometheus_text.HAS_PROMETHEUS_CLIENT``).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import ssl
import time
from urllib.parse import urlsplit

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stream_client
# still this module's names (ops/verify_classes.py reads a block with it)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench.stream_client import SPEC_DECODING_KEYS, spec_decoding_block  # noqa: F401  pylint: disable=unused-import
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import prometheus_text
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

APIS = ("chat", "completions")
ARRIVALS = ("poisson", "fixed")
_RESERVED_BODY_KEYS = ("model", "messages", "prompt", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                       "temperature", "seed")


class BenchmarkRequestError(SpecDecodingError):
    """Requests to an endpoint failed (every one of them, or the warmup)."""


def split_base_url(url, field="url"):
    """``(scheme, host, port, prefix)`` of an OpenAI-compatible base URL; a trailing ``/v1`` is optional."""
    if not url or not isinstance(url, str):
        raise ValidationError("is empty", field=field, hint="give the server's base URL, e.g. http://127.0.0.1:8000")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError("%r is not an http(s) URL" % (url,), field=field, hint="e.g. http://my-model.ns.svc:8080")
    prefix = parts.path.rstrip("/")
    if prefix.endswith("/v1"):
        prefix = prefix[:-3]
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname, port, prefix


class Endpoint:
    """One OpenAI-compatible server: connections, request bodies, and the streaming measurement."""

    def __init__(self, url, model=None, api="chat", token=None, headers=None, timeout=600.0, validate_certs=True,
                 ca_path=None, field="url"):
        if api not in APIS:
            raise ValidationError("must be one of %s, got %r" % (", ".join(APIS), api), field="api")
        self.url = url
        self.scheme, self.host, self.port, self.prefix = split_base_url(url, field=field)
        self.api = api
        self.token = token
        self.extra_headers = dict(headers or {})
        self.timeout = float(timeout)
        self.field = field
        self._ssl = None
        if self.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=ca_path) if validate_certs else ssl._create_unverified_context()  # pylint: disable=protected-access
        self.model = model

    # -- plumbing ---------------------------------------------------------------------------------------
    def connect(self):
        """A blocking connection (http.client) for the GETs; the streams go through ``stream_connection``."""
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._ssl)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def ssl_context(self):
        """The TLS context of an https endpoint (its CA file, or unverified when validate_certs is off); None for http."""
        return self._ssl

    async def stream_connection(self):
        """A connection of the run's event loop (``run_requests``), not yet connected: bench/stream_client.py ``Connection``."""
        return stream_client.Connection(asyncio.get_running_loop(), self.timeout)

    def headers(self, accept="application/json"):
        out = {"Content-Type": "application/json", "Accept": accept, "User-Agent": "alauda.spec_decoding/spec_benchmark"}
        if self.token:
            out["Authorization"] = "Bearer %s" % self.token
        out.update(self.extra_headers)
        return out

    def get(self, path):
        """GET ``prefix + path``; returns ``(status, text)``. Raises BenchmarkRequestError when unreachable."""
        conn = self.connect()
        try:
            conn.request("GET", self.prefix + path, headers=self.headers(accept="*/*"))
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            raise BenchmarkRequestError("cannot reach %s%s (%s)" % (self.url.rstrip("/"), path, exc), field=self.field,
                                        hint="check the URL, the port and that the server is Ready")
        finally:
            conn.close()

    def resolve_model(self):
        """The served model name: the one given, else the first id of ``GET /v1/models``."""
        if self.model:
            return self.model
        status, text = self.get("/v1/models")
        if status != 200:
            raise BenchmarkRequestError("GET /v1/models answered HTTP %d: %s" % (status, text[:300]), field=self.field,
                                        hint="set the served model name explicitly")
        try:
            self.model = json.loads(text)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise BenchmarkRequestError("GET /v1/models returned no model id", field=self.field, hint="set the model name explicitly")
        return self.model

    def metrics_text(self):
        """The Prometheus exposition text of ``/metrics`` or ``None`` if the server has none."""
        status, text = self.get("/metrics")
        return text if status == 200 else None

    # -- requests -----------------------------------------------------------------------------------------
    def body(self, prompt, params):
        """The JSON body for one prompt; ``params`` are the run's request parameters (same on both sides)."""
        body = {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                "temperature": params.get("temperature", 0.0)}
        if params.get("seed") is not None:
            body["seed"] = params["seed"]
        if self.api == "chat":
            body["messages"] = prompt["messages"]
            body["max_completion_tokens"] = params["max_tokens"]
        else:
            body["prompt"] = prompt["prompt"]
            body["max_tokens"] = params["max_tokens"]
        for key, value in (params.get("extra_body") or {}).items():
            if key in _RESERVED_BODY_KEYS:
                raise ValidationError("%r is set by the benchmark itself" % key, field="extra_body",
                                      hint="use max_tokens, temperature and seed options instead")
            body[key] = value
        return body

    def path(self):
        return self.prefix + ("/v1/chat/completions" if self.api == "chat" else "/v1/completions")


def arrival_offsets(count, request_rate=None, arrival="poisson", seed=0):
    """Seconds from the start at which each request is released: all at 0 without a rate (``inf``)."""
    if arrival not in ARRIVALS:
        raise ValidationError("must be one of %s, got %r" % (", ".join(ARRIVALS), arrival), field="arrival")
    if not request_rate or request_rate == float("inf"):
        return [0.0] * count
    if request_rate < 0:
        raise ValidationError("must be positive, got %r" % (request_rate,), field="request_rate")
    rng = random.Random(seed)
    out, now = [], 0.0
    for _index in range(count):
        out.append(now)
        now += rng.expovariate(request_rate) if arrival == "poisson" else 1.0 / request_rate
    return out


def run_requests(endpoint, prompts, params, concurrency=1, request_rate=None, arrival="poisson", seed=0, progress=None,
                 label="run", offsets=None):
    """Run ``prompts`` (already in their fixed order) against ``endpoint``; returns ``(records, duration_s)``.

    ``concurrency`` workers of one event loop each keep one connection; request ``i`` is released at its arrival offset
    and picked up by the first free worker (the same as ``vllm bench serve``'s semaphore; bench/stream_client.py
    ``run_all``). ``progress`` is called as ``progress(label, done, total, record)`` after each request, in the loop's
    thread. ``offsets``: the release times (a load Job shard's part of the whole schedule) instead of those of
    ``request_rate``/``arrival``/``seed``.

    Each record gets ``send_lag``: how late the client sent it against its schedule, from the later of its release
    time and the moment a worker was free to take it (waiting for a free worker is the concurrency limit, part of
    the protocol; anything after that is the client falling behind). None for a request the client itself failed.
    """
    records, duration, _cpu = run_measured(endpoint, prompts, params, concurrency, request_rate, arrival, seed, progress, label, offsets)
    return records, duration


def run_measured(endpoint, prompts, params, concurrency=1, request_rate=None, arrival="poisson", seed=0, progress=None,
                 label="run", offsets=None):
    """``run_requests`` and the CPU seconds its event loop's thread used (``time.thread_time``: the client's own, not
    that of other threads of this process): ``(records, duration_s, cpu_s)``."""
    if concurrency < 1:
        raise ValidationError("must be at least 1, got %r" % (concurrency,), field="concurrency")
    total = len(prompts)
    offsets = arrival_offsets(total, request_rate, arrival, seed) if offsets is None else list(offsets)
    run = stream_client.run_loop(lambda: stream_client.run_all(endpoint, prompts, params, concurrency, offsets, progress, label))
    start, free_at, records = run["start"], run["free_at"], run["records"]
    for index, record in enumerate(records):
        sent = record.pop("start", start)
        failed_here = str(record.get("error") or "").startswith("client error")
        record["send_lag"] = None if failed_here else max(0.0, sent - max(start + offsets[index], free_at[index] or start))
        record["start_offset"] = sent - start
    return records, run["end"] - start, run["cpu_s"]


def scrape(endpoint, enabled=True):
    """``endpoint``'s /metrics page, or None when ``enabled`` is false or the page cannot be read (a side without
    /metrics is measured all the same)."""
    if not enabled:
        return None
    try:
        return endpoint.metrics_text()
    except SpecDecodingError:
        return None


def request_line(label, done, total, record):
    """One progress line for a finished request (the progress log's, and the in-cluster load Job's log)."""
    if record.get("success"):
        detail = "ttft=%.1fms e2el=%.1fms tokens=%s" % (record["ttft"] * 1000, record["latency"] * 1000, record.get("output_tokens"))
    else:
        detail = "FAILED %s" % (record.get("error") or "")[:200]
    return "%s %d/%d %s %s" % (label, done, total, record.get("prompt_id"), detail)


def schedule(prompts, runs_per_prompt):
    """The measured request list: ``runs_per_prompt`` rounds over the prompts, each round in file order."""
    if runs_per_prompt < 1:
        raise ValidationError("must be at least 1, got %r" % (runs_per_prompt,), field="runs_per_prompt")
    return [p for _round in range(runs_per_prompt) for p in prompts]


def warmup_schedule(prompts, warmup):
    """``warmup`` requests cycling through the prompts in order (discarded after they run)."""
    return [prompts[i % len(prompts)] for i in range(warmup)] if prompts else []


def measure_side(endpoint, prompts, params, runs_per_prompt=5, warmup=3, concurrency=1, request_rate=None,
                 arrival="poisson", seed=0, progress=None, label="side", before_measure=None, shard=None):
    """Warm up, then measure one side. Returns ``{"records", "duration_s", "warmup": {...}}``.

    ``before_measure`` (optional) runs between warmup and the measured requests, e.g. the first /metrics
    scrape, so warmup traffic stays out of the metric deltas. ``shard``: ``(index, count)``, this client sends
    only requests ``index, index + count, ...`` of the schedule, each at its offset in the whole seeded schedule
    (a load Job pod's part); its records carry ``schedule_index``. ``client``: what sending the measured requests cost
    this process, CPU seconds over wall seconds (with the records' send lag, whether the client kept up:
    bench/load_job_merge.py ``client_summary``); the CPU is the event loop thread's (``run_measured``), so the work of
    other threads of this process (a unit test's fake server) is not counted as the client's.
    """
    endpoint.resolve_model()
    warm = warmup_schedule(prompts, warmup)
    warm_records, warm_duration = run_requests(endpoint, warm, params, concurrency, None, arrival, seed, progress,
                                               label="%s warmup" % label)
    warm_failed = [r for r in warm_records if not r["success"]]
    if warm and len(warm_failed) == len(warm_records):
        raise BenchmarkRequestError("every warmup request to %s failed; first error: %s" % (endpoint.url, warm_failed[0]["error"]),
                                    field=endpoint.field, hint="check the URL, model name, token and request parameters")
    extra = before_measure() if before_measure else None
    wall = time.perf_counter()  # the measured requests' wall time, from here
    measured = schedule(prompts, runs_per_prompt)
    offsets = None
    if shard is not None:
        picked = list(range(len(measured)))[shard[0]::shard[1]]
        everyone = arrival_offsets(len(measured), request_rate, arrival, seed)
        measured, offsets = [measured[i] for i in picked], [everyone[i] for i in picked]
    records, duration, cpu = run_measured(endpoint, measured, params, concurrency, request_rate,
                                          arrival, seed, progress, label=label, offsets=offsets)
    wall = time.perf_counter() - wall
    if shard is not None:
        for index, record in zip(picked, records):
            record["schedule_index"] = index
    if records and not any(r["success"] for r in records):
        raise BenchmarkRequestError("every measured request to %s failed; first error: %s" % (endpoint.url, records[0]["error"]),
                                    field=endpoint.field, hint="check the server logs and the request parameters")
    return {"records": records, "duration_s": duration, "before": extra,
            "warmup": {"requests": len(warm_records), "failed": len(warm_failed), "duration_s": warm_duration},
            "client": {"cpu_s": round(cpu, 4), "wall_s": round(wall, 4), "cpu_ratio": round(cpu / wall, 4) if wall > 0 else None}}


# -- /metrics around a measured run ---------------------------------------------------------------------------
# Metric-name prefixes (after the ``vllm:`` namespace, see prometheus_text): V1 (0.10+) and 0.8-0.9 counters.
# ``external_prefix_cache_*`` (KV connector) does not match them: it is not the local prefix cache.
PREFIX_CACHE_PREFIXES = ("prefix_cache_", "gpu_prefix_cache_")
CACHE_CONFIG_INFO = "cache_config_info"


def _samples(text, prefixes):
    """The wanted samples of a /metrics page; none when the page is absent or its selected lines do not parse.

    The benchmark's numbers are already measured when the page is read, so a garbled page makes the prefix
    cache unknown (the report says so) instead of failing the run.
    """
    if not text:
        return []
    try:
        return prometheus_text.parse_samples(text, prefixes)
    except ValidationError:
        return []


def _other_model(labels, model_name):
    """Whether a sample names a served model other than ``model_name`` (series without the label always count)."""
    return model_name is not None and "model_name" in labels and labels["model_name"] != model_name


def prefix_cache_counters(text, model_name=None):
    """``{"hits", "queries"}`` (token counts) from a /metrics page, or ``None`` when the server has no such counters.

    vLLM V1 (0.10+) exposes ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``; 0.8-0.9
    named them ``vllm:gpu_prefix_cache_hits_total`` / ``..._queries_total``. Summed over engines; the
    ``external_`` (KV connector) series are not the local prefix cache and are ignored.
    """
    totals = {}
    for sample in _samples(text, PREFIX_CACHE_PREFIXES):
        base = sample.name.rpartition(":")[2]
        if base.startswith("gpu_"):
            base = base[4:]
        if base.endswith("_total"):
            base = base[:-6]
        if base not in ("prefix_cache_hits", "prefix_cache_queries") or _other_model(sample.labels or {}, model_name):
            continue
        key = "hits" if base == "prefix_cache_hits" else "queries"
        totals[key] = totals.get(key, 0.0) + sample.value
    if "queries" not in totals:
        return None
    return {"hits": totals.get("hits", 0.0), "queries": totals["queries"]}


def prefix_caching_enabled(text, model_name=None):
    """Whether the server caches prefixes: the ``enable_prefix_caching`` label of ``vllm:cache_config_info``.

    True or False; None when the page, the gauge or the label is absent (vLLM before the gauge carried it, a
    server that is not vLLM) or its value is neither True nor False.
    """
    seen = []
    for sample in _samples(text, (CACHE_CONFIG_INFO,)):
        labels = sample.labels or {}
        if sample.name.rpartition(":")[2] != CACHE_CONFIG_INFO or _other_model(labels, model_name):
            continue
        seen.append({"true": True, "false": False}.get(str(labels.get("enable_prefix_caching", "")).strip().lower()))
    # One gauge per engine (data-parallel rank). They cannot be summed, and vLLM gives every rank the same
    # CacheConfig, so disagreement means a page we do not understand. The safe answer is the one that keeps
    # the warning: on if any engine caches (that side's timings can hold cache effects, so the report keeps
    # its hit rate and flags an on/off mismatch); off only if every engine says off; else unknown.
    if True in seen:
        return True
    if seen and all(value is False for value in seen):
        return False
    return None


def prefix_cache_window(before_text, after_text, model_name=None):
    """A side's ``prefix_cache`` block from the /metrics pages read before and after its measured requests.

    ``hits``, ``queries`` and ``hit_rate`` over the window (``prefix_cache_delta``; null when either page lacks
    the counters) and ``enabled`` (``prefix_caching_enabled`` of the later page). ``None`` when neither is
    known (not scraped, or not a vLLM server).
    """
    enabled = prefix_caching_enabled(after_text, model_name)
    cache = prefix_cache_delta(prefix_cache_counters(before_text, model_name), prefix_cache_counters(after_text, model_name))
    if cache is None:
        if enabled is None:
            return None
        cache = {"hits": None, "queries": None, "hit_rate": None}
    cache["enabled"] = enabled
    return cache


def prefix_cache_delta(before, after):
    """Hits, queries and hit rate over a window from two ``prefix_cache_counters`` results."""
    if before is None or after is None:
        return None
    hits = after["hits"] - before["hits"]
    queries = after["queries"] - before["queries"]
    if hits < 0 or queries < 0:  # the server restarted in between: the later counts are since that restart
        hits, queries = after["hits"], after["queries"]
    return {"hits": int(hits), "queries": int(queries), "hit_rate": (hits / queries) if queries > 0 else None}
