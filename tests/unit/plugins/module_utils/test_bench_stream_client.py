"""The event-loop client (bench/stream_client.py) on the wire: a raw loopback HTTP/1.1 server that frames its answers the
ways a server or proxy may (events split across chunks and reads, chunk extensions and trailers, Content-Length, read to
close, a stall), keep-alive reuse, TLS with a CA file, without one and unverified, and a caller that already runs a loop."""
from __future__ import annotations

import asyncio
import json
import socket
import socketserver
import ssl
import threading
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from tests.testbed.pki import CertificateAuthority

PARAMS = {"max_tokens": 3, "temperature": 0.0}


def _event(obj):
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


EVENTS = [_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})] + \
    [_event({"choices": [{"index": 0, "delta": {"content": text}}]}) for text in ("a", "bc", "d")] + \
    [b": ping\n\n", _event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}), _event(b"[DONE]")]
GAP = 0.02


class Raw(socketserver.BaseRequestHandler):
    """Answers each request on a connection as its user message says: ``split``, ``length``, ``close``, ``bye`` or ``stall``."""
    connections = []

    def handle(self):
        Raw.connections.append(self.client_address)
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = self.request.makefile("rb")
        while True:
            line = reader.readline()
            if not line:
                return
            headers = {}
            for head in iter(reader.readline, b"\r\n"):
                name, _sep, value = head.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            mode = json.loads(reader.read(int(headers["content-length"])))["messages"][0]["content"]
            if not getattr(self, mode)():
                return

    def send(self, data, pause=0.0):
        self.request.sendall(data)
        if pause:
            time.sleep(pause)

    def split(self):
        """Chunked, with a chunk extension; the first two events in one chunk, the second content event cut in three
        (across HTTP chunks and separate reads), the rest one chunk each; a trailer after the last chunk."""
        self.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        both = EVENTS[0] + EVENTS[1]
        self.send(b"%x;note=1\r\n%s\r\n" % (len(both), both), GAP)
        cut = EVENTS[2]
        self.send(b"%x\r\n%s" % (len(cut[:9]), cut[:9]), GAP)       # half a chunk: its CRLF comes in the next read
        self.send(b"\r\n%x\r\n%s\r\n" % (len(cut[9:]), cut[9:]), GAP)
        for event in EVENTS[3:]:
            self.send(b"%x\r\n%s\r\n" % (len(event), event), GAP if event.startswith(b"data: {\"choices\": [{") else 0.0)
        self.send(b"0\r\nx-trailer: yes\r\n\r\n")
        return True

    def length(self):
        body = b"".join(EVENTS)
        self.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(body))
        for index in range(0, len(body), 40):
            self.send(body[index:index + 40], 0.002)
        return True

    def close(self):
        self.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + b"".join(EVENTS))
        return False

    def bye(self):
        """A whole answer that says keep-alive, then the server drops the connection (an idle timeout, say)."""
        self.length()
        return False

    def stall(self):
        self.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        self.send(b"%x\r\n%s\r\n" % (len(EVENTS[0]), EVENTS[0]), 1.0)
        return False


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def _serve(context=None):
    server = Server(("127.0.0.1", 0), Raw)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def raw_url():
    server = _serve()
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def _prompts(*modes):
    return [{"id": "%s%d" % (mode, index), "messages": [{"role": "user", "content": mode}]} for index, mode in enumerate(modes)]


def _check(record):
    assert record["success"], record
    assert (record["chunks"], len(record["itl"]), record["output_tokens"], record["prompt_tokens"], record["text_chars"]) == (4, 3, 3, 5, 4)
    assert record["latency"] == pytest.approx(record["ttft"] + sum(record["itl"]), rel=1e-9)


def test_framings_and_keep_alive(raw_url):
    endpoint = bench_client.Endpoint(raw_url, model="tiny")
    Raw.connections = []
    records, _duration = bench_client.run_requests(endpoint, _prompts("split", "length", "split", "length"), PARAMS, concurrency=1)
    for record in records:
        _check(record)
    assert len(Raw.connections) == 1  # one worker, one keep-alive connection for all four
    # the split answer: its first two events came in one read (no gap between them), the others GAP apart
    assert records[0]["itl"][0] < GAP / 2 and all(gap >= GAP * 0.8 for gap in records[0]["itl"][1:]), records[0]["itl"]
    Raw.connections = []
    records, _duration = bench_client.run_requests(endpoint, _prompts("close", "bye", "split"), PARAMS, concurrency=1)
    for record in records:
        _check(record)
    assert len(Raw.connections) == 3  # read to close, then a dropped keep-alive: a new connection each time


def test_a_stalled_stream_times_out_and_a_dead_port_fails_to_connect(raw_url):
    endpoint = bench_client.Endpoint(raw_url, model="tiny", timeout=0.3)
    started = time.monotonic()
    [stalled], _duration = bench_client.run_requests(endpoint, _prompts("stall"), PARAMS)
    assert time.monotonic() - started < 0.9
    assert not stalled["success"] and stalled["error"] == "stream broken: timed out: no data for 0.3 s" and stalled["send_lag"] is not None
    dead = bench_client.Endpoint("http://127.0.0.1:9", model="tiny", timeout=2)
    [refused], _duration = bench_client.run_requests(dead, _prompts("split"), PARAMS)
    assert not refused["success"] and refused["error"].startswith("connection failed: ")


def test_a_caller_that_already_runs_an_event_loop(raw_url):
    endpoint = bench_client.Endpoint(raw_url, model="tiny")

    async def inside():
        return bench_client.run_requests(endpoint, _prompts("split", "length"), PARAMS, concurrency=2)

    records, _duration = asyncio.run(inside())
    for record in records:
        _check(record)


def test_tls_with_a_ca_file_without_one_and_unverified(tmp_path):
    authority = CertificateAuthority(str(tmp_path))
    cert, key = authority.issue("server", "127.0.0.1", ips=["127.0.0.1"], server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = _serve(context)
    url = "https://127.0.0.1:%d/v1" % server.server_address[1]
    try:
        trusted = bench_client.Endpoint(url, model="tiny", ca_path=authority.cert_path)
        records, _duration = bench_client.run_requests(trusted, _prompts("split", "length"), PARAMS, concurrency=2)
        for record in records:
            _check(record)
        [unknown], _duration = bench_client.run_requests(bench_client.Endpoint(url, model="tiny"), _prompts("length"), PARAMS)
        assert not unknown["success"] and "CERTIFICATE_VERIFY_FAILED" in unknown["error"], unknown
        [insecure], _duration = bench_client.run_requests(bench_client.Endpoint(url, model="tiny", validate_certs=False),
                                                          _prompts("length"), PARAMS)
        _check(insecure)
    finally:
        server.shutdown()
        server.server_close()
