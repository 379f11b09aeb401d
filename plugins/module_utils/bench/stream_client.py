# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every stream of a run in ONE asyncio event loop (issue 53), on the standard library only.

A thread per stream (http.client) made the threads contend for the GIL as streams grew: one load Job pod reached
0.47x the chunks a second of ``vllm bench serve`` at 256 streams, at 54 us of CPU a chunk. ``vllm bench serve`` runs
every request in one asyncio loop with aiohttp (vLLM 0.32 ``vllm/benchmarks/serve.py`` ``benchmark``: a task per
request, released at its arrival time, under an ``asyncio.Semaphore(max_concurrency)``); the load Job pod and the
controller have no aiohttp, so this is the same shape over asyncio's transports: ``concurrency`` workers in one loop,
each with one keep-alive HTTP/1.1 connection (``loop.create_connection``, TLS through the Endpoint's ssl context), a
request ``i`` released at its arrival offset into a FIFO queue and taken by the first free worker (the semaphore's
order), and a protocol per connection that parses the response as its bytes arrive (status line and headers, then a
chunked, Content-Length or read-to-close body, then the server-sent events): no coroutine step per chunk, so a chunk
costs what its JSON costs.

Each chunk is measured as ``vllm bench serve`` measures it (vLLM 0.32 ``vllm/benchmarks/lib/endpoint_request_func.py``
``async_request_openai_chat_completions``: the clock starts right before the request, a ``data:`` event with
``choices`` is a chunk, the first sets TTFT, each later one an ITL gap): ``EventReader``. The client's CPU is the loop thread's ``time.thread_time()`` over the
run: its own, not that of other threads in the process (a unit test's fake server, the module's other work).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

# The summary keys of vLLM's per-request block (vLLM 0.32 ``entrypoints/generate/base/protocol.py``,
# ``SpeculativeDecodingMetrics``); the ``detailed`` level's per-step arrays are not kept: the reports and the /metrics
# check use the sums.
SPEC_DECODING_KEYS = ("mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram", "num_spec_steps",
                      "num_draft_tokens", "num_accepted_draft_tokens", "num_spec_tokens")
# A response head larger than this is not an OpenAI-compatible server's (uvicorn sends a few hundred bytes).
MAX_HEAD_BYTES = 64 * 1024
# The first bytes of an error response's body kept for its message.
MAX_ERROR_BODY = 4096


def spec_decoding_block(data):
    """The summary keys of a response's ``metrics.speculative_decoding`` (a dict), or None when it carries none."""
    block = (data.get("metrics") or {}).get("speculative_decoding") if isinstance(data.get("metrics"), dict) else None
    if not isinstance(block, dict):
        return None
    return {key: block.get(key) for key in SPEC_DECODING_KEYS if key in block}


def new_record(prompt):
    """A request's record before it is sent (the fields every record has)."""
    return {"prompt_id": prompt.get("id"), "request_class": prompt.get("class"), "success": False, "error": None, "ttft": None,
            "itl": [], "latency": None, "output_tokens": None, "prompt_tokens": None, "chunks": 0, "text_chars": 0,
            "spec_decoding": None}


def client_error_record(prompt, exc):
    """The record of a request this client failed itself (a bug or a resource of its own): no send lag is taken from it."""
    return {"prompt_id": prompt.get("id"), "request_class": prompt.get("class"), "success": False, "error": "client error: %r" % (exc,),
            "itl": [], "ttft": None, "latency": None, "output_tokens": None, "start": time.perf_counter()}


class EventReader:
    """The server-sent events of one streaming response, measured into its record."""

    __slots__ = ("record", "start", "completions", "most_recent", "first")

    def __init__(self, record, start, completions):
        self.record = record
        self.start = start
        self.completions = completions
        self.most_recent = start
        self.first = False

    def line(self, raw):
        """One line of the body (bytes); a ValueError when an event is not JSON."""
        chunk = raw.strip()
        if not chunk or chunk.startswith(b":"):
            return
        if chunk.startswith(b"data:"):
            chunk = chunk[5:].strip()
        if chunk == b"[DONE]":
            return
        data = json.loads(chunk)
        timestamp = time.perf_counter()
        record = self.record
        if data.get("choices"):
            choice = data["choices"][0]
            text = choice.get("text") if self.completions else (choice.get("delta") or {}).get("content")
            if not self.first:
                self.first = True
                record["ttft"] = timestamp - self.start
            else:
                record["itl"].append(timestamp - self.most_recent)
            self.most_recent = timestamp
            record["chunks"] += 1
            record["text_chars"] += len(text or "")
        elif data.get("usage"):
            usage = data["usage"]
            record["output_tokens"] = usage.get("completion_tokens")
            record["prompt_tokens"] = usage.get("prompt_tokens")
            record["spec_decoding"] = spec_decoding_block(data)
        elif data.get("error") or data.get("object") == "error":
            record["error"] = "stream error: %s" % json.dumps(data)[:500]

    def finish(self):
        """The end of a stream that was read to its end: latency, success, or why not."""
        record = self.record
        record["latency"] = self.most_recent - self.start
        if self.first and record["error"] is None:
            record["success"] = True
            if record["output_tokens"] is None:
                record["error"] = "no usage in the stream (server ignores stream_options.include_usage?)"
                record["success"] = False
        elif record["error"] is None:
            record["error"] = "the stream carried no choices"


class StreamBroken(Exception):
    """The connection failed or closed in the middle of a response, or the response was not HTTP."""


# the body framing of a response (RFC 9112 section 6)
_HEAD, _SIZE, _DATA, _CRLF, _TRAILER, _LENGTH, _TO_CLOSE = range(7)


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one response at a time, parsed as its bytes arrive (``data_received``)."""

    def __init__(self, loop, timeout):
        self.loop = loop
        self.timeout = timeout
        self.transport = None
        self.closed = False
        self.last_data = 0.0
        self._buf = b""
        self._state = None  # None: no response expected
        self._waiter = None
        self._timer = None
        self._reader = None
        self._lines = b""
        self._error_body = []
        self._remaining = 0
        self.status = None
        self.keep_alive = False
        self.got_bytes = False

    # -- asyncio.Protocol --------------------------------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.last_data = self.loop.time()
        if self._state is None:  # bytes nobody asked for: this connection cannot carry another request
            self.closed = True
            self.transport.close()
            return
        self.got_bytes = True
        self._buf = self._buf + data if self._buf else data
        try:
            self._parse()
        except Exception as exc:  # pylint: disable=broad-except
            # to the request's coroutine (a ValueError: a broken stream; anything else: the client's own error), not to asyncio
            self._fail(exc)

    def connection_lost(self, exc):
        self.closed = True
        if self._state == _TO_CLOSE:
            self._done()
        elif self._state is not None:
            self._fail(StreamBroken("the server closed the connection mid-response" + ("" if exc is None else " (%s)" % exc)))

    # -- one request ---------------------------------------------------------------------------------------------
    async def exchange(self, request_bytes, reader):
        """Send ``request_bytes`` and read the answer: a 200's body into ``reader`` (``EventReader``), another status's
        body kept for its message. Returns ``(status, error body text or None)``; raises StreamBroken or ValueError."""
        if self.transport.is_closing():  # closed under us: no answer would ever come on it
            raise StreamBroken("the connection is closed")
        self._waiter = self.loop.create_future()
        self._state, self._buf, self._lines, self._reader, self._error_body = _HEAD, b"", b"", reader, []
        self.status, self.got_bytes = None, False
        self.last_data = self.loop.time()
        self._timer = self.loop.call_at(self.last_data + self.timeout, self._check_timeout)
        self.transport.write(request_bytes)
        try:
            await self._waiter
        finally:
            self._timer.cancel()
            self._waiter = None
        if self.status != 200:
            return self.status, b"".join(self._error_body)[:MAX_ERROR_BODY].decode("utf-8", "replace")
        return self.status, None

    async def open(self, endpoint):
        """Connect to ``endpoint`` (TLS with its ssl context when https), within its timeout."""
        secure = endpoint.ssl_context()
        await asyncio.wait_for(self.loop.create_connection(lambda: self, endpoint.host, endpoint.port, ssl=secure,
                                                           server_hostname=endpoint.host if secure is not None else None),
                               endpoint.timeout)

    def close(self):
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _check_timeout(self):
        # one timer per request, moved on while bytes arrive (resetting a timer on every chunk would cost more)
        if self._waiter is None or self._waiter.done():
            return
        due = self.last_data + self.timeout
        if self.loop.time() >= due:
            self._fail(StreamBroken("timed out: no data for %g s" % self.timeout))
        else:
            self._timer = self.loop.call_at(due, self._check_timeout)

    def _done(self):
        self._state = None
        if not self.keep_alive:
            self.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc):
        self._state = None
        self.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def _body(self, data):
        if self.status != 200:
            if sum(len(part) for part in self._error_body) < MAX_ERROR_BODY:
                self._error_body.append(data)
            return
        lines = (self._lines + data if self._lines else data).split(b"\n")
        self._lines = lines.pop()
        line = self._reader.line
        for raw in lines:
            if raw:
                line(raw)

    def _head(self, head):
        lines = head.decode("latin-1").split("\r\n")
        version, _sep, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise StreamBroken("not an HTTP/1.x answer: %r" % lines[0][:80])
        status = int(rest.split(" ", 1)[0])
        headers = {}
        for text in lines[1:]:
            name, _sep, value = text.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        if 100 <= status < 200:
            return _HEAD  # an interim answer (100 Continue): the real one follows
        self.status = status
        tokens = [token.strip() for token in headers.get("connection", "").split(",")]
        self.keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
        if "chunked" in headers.get("transfer-encoding", ""):
            return _SIZE
        if "content-length" in headers:
            self._remaining = int(headers["content-length"])
            return _LENGTH
        if status in (204, 304):
            self._remaining = 0
            return _LENGTH
        self.keep_alive = False
        return _TO_CLOSE

    def _parse(self):  # pylint: disable=too-many-branches
        buf, pos, size = self._buf, 0, len(self._buf)
        while self._state is not None:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    if size - pos > MAX_HEAD_BYTES:
                        raise StreamBroken("the answer's head is over %d bytes" % MAX_HEAD_BYTES)
                    break
                self._state = self._head(buf[pos:end])
                pos = end + 4
            elif state == _SIZE:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                self._remaining = int(buf[pos:end].split(b";", 1)[0], 16)
                pos = end + 2
                self._state = _DATA if self._remaining else _TRAILER
            elif state in (_DATA, _LENGTH):
                take = min(self._remaining, size - pos)
                if take:
                    self._body(buf[pos:pos + take] if (pos or take != size) else buf)
                    pos += take
                    self._remaining -= take
                if self._remaining:
                    break
                if state == _DATA:
                    self._state = _CRLF
                else:
                    self._done()
            elif state == _CRLF:
                if size - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise StreamBroken("a chunk of the answer does not end with CRLF")
                pos += 2
                self._state = _SIZE
            elif state == _TRAILER:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                last = end == pos
                pos = end + 2
                if last:
                    self._done()
            else:  # _TO_CLOSE: the body is every byte until the server closes
                if size > pos:
                    self._body(buf[pos:])
                pos = size
                break
        self._buf = buf[pos:] if pos < size else b""


def request_bytes(endpoint, payload):
    """The request's bytes: what http.client sends for ``POST`` with these headers (Host, Accept-Encoding, Content-Length)."""
    default_port = 443 if endpoint.scheme == "https" else 80
    host = endpoint.host if ":" not in endpoint.host else "[%s]" % endpoint.host
    lines = ["POST %s HTTP/1.1" % endpoint.path(), "Host: %s" % (host if endpoint.port == default_port else "%s:%d" % (host, endpoint.port)),
             "Accept-Encoding: identity", "Content-Length: %d" % len(payload)]
    lines += ["%s: %s" % (name, value) for name, value in endpoint.headers(accept="text/event-stream").items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


async def stream(endpoint, prompt, params, conn=None):
    """Send one streaming request to ``endpoint`` and measure it: ``(record, conn)`` (``conn`` reusable or None)."""
    payload = request_bytes(endpoint, json.dumps(endpoint.body(prompt, params)).encode("utf-8"))
    record = new_record(prompt)
    reader = None
    reused = conn is not None and not conn.closed
    for attempt in (0, 1):
        if conn is None or conn.closed:
            # the client's own set-up, before the clock (as http.client's connect(), which connects on the first request)
            conn = await endpoint.stream_connection()
        start = time.perf_counter()
        record["start"] = start
        reader = EventReader(record, start, endpoint.api == "completions")
        try:
            if conn.transport is None:
                await conn.open(endpoint)  # the TCP (and TLS) handshake: inside TTFT, as in vllm bench serve
            status, text = await conn.exchange(payload, reader)
        except (OSError, asyncio.TimeoutError, StreamBroken, ValueError) as exc:
            got_bytes = conn.got_bytes
            conn.close()
            conn = None
            if reused and attempt == 0 and not got_bytes and not isinstance(exc, ValueError):
                reused = False  # a keep-alive connection the server closed before answering: once more, on a fresh one
                continue
            why = str(exc) or type(exc).__name__  # asyncio.TimeoutError says nothing
            record["error"] = ("stream broken: %s" if reader.first or got_bytes else "connection failed: %s") % why
            return record, None
        break
    if status != 200:
        record["error"] = "HTTP %d: %s" % (status, text[:500])
        return record, (None if conn.closed else conn)
    reader.finish()
    return record, (None if conn.closed else conn)


def run_loop(main):
    """``main()`` (a coroutine function) run to its end in an event loop of its own: ``asyncio.run`` in this thread, or in
    a thread of its own when this thread already runs a loop (a caller inside asyncio cannot nest one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    box = {}

    def target():
        try:
            box["result"] = asyncio.run(main())
        except BaseException as exc:  # pylint: disable=broad-except
            box["error"] = exc

    thread = threading.Thread(target=target, name="bench-loop", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


async def run_all(endpoint, prompts, params, concurrency, offsets, progress, label):
    """Every request of a run in this loop: ``{"records", "free_at", "start", "end", "cpu_s"}``.

    ``concurrency`` workers each keep one connection; request ``i`` goes into the queue at ``start + offsets[i]`` and the
    first free worker takes it (``free_at[i]``: when that worker was free). ``cpu_s``: this loop thread's CPU over the run.
    """
    cpu = time.thread_time()
    total = len(prompts)
    free_at = [None] * total
    records = [None] * total
    work = asyncio.Queue()  # FIFO, and its waiting getters are served in the order they came: the semaphore's order
    done = [0]

    async def worker():
        conn = None
        while True:
            free = time.perf_counter()
            item = await work.get()
            if item is None:
                break
            index, prompt = item
            free_at[index] = free
            try:
                record, conn = await stream(endpoint, prompt, params, conn)
            except Exception as exc:  # pylint: disable=broad-except
                if conn is not None:
                    conn.close()
                record, conn = client_error_record(prompt, exc), None
            records[index] = record
            done[0] += 1
            if progress is not None:
                try:
                    progress(label, done[0], total, record)
                except Exception:  # pylint: disable=broad-except
                    pass
        if conn is not None:
            conn.close()

    workers = [asyncio.ensure_future(worker()) for _index in range(min(concurrency, max(total, 1)))]
    start = time.perf_counter()
    for index, prompt in enumerate(prompts):
        delay = start + offsets[index] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        work.put_nowait((index, prompt))
    for _worker in workers:
        work.put_nowait(None)
    await asyncio.gather(*workers)
    end = time.perf_counter()
    return {"records": records, "free_at": free_at, "start": start, "end": end, "cpu_s": time.thread_time() - cpu}
