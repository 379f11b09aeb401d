"""A test HTTP server on the loopback address; a static model mirror that honours ranges (``mirror_handler``); and the one
fake OpenAI-compatible streaming server the tests stand in for an endpoint with (``OpenAIStream``: the paced server of the
sweep tests, the scripted one of the client tests and the paced one of the e2e agreement check are its subclasses)."""
import contextlib
import json
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def serving(handler):
    """Serve ``handler`` (a BaseHTTPRequestHandler class) on 127.0.0.1 at a free port in a daemon thread.

    Yields the base URL (``http://127.0.0.1:PORT``); the server is shut down and its socket closed on exit.
    """
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield "http://127.0.0.1:%d" % httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def mirror_handler(root, log=None):
    """A static file mirror of ``root`` that honours ``Range: bytes=a-b`` (python's http.server does not), as a model
    mirror does; each request is appended to ``log`` as (path, Range header, bytes sent) when a list is given."""
    log = [] if log is None else log

    class Mirror(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=root, **kwargs)

        def do_GET(self):  # noqa: N802
            path = self.translate_path(self.path)
            rng = self.headers.get("Range")
            if not os.path.isfile(path):
                log.append((self.path, rng, 0))
                self.send_error(404)
                return
            size = os.path.getsize(path)
            start, end = 0, size - 1
            if rng:
                found = re.match(r"bytes=(\d+)-(\d*)", rng)
                start, end = int(found.group(1)), min(int(found.group(2) or size - 1), size - 1)
            with open(path, "rb") as handle:
                handle.seek(start)
                body = handle.read(end - start + 1)
            self.send_response(206 if rng else 200)
            if rng:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            log.append((self.path, rng, len(body)))

        def log_message(self, *args):  # pylint: disable=arguments-differ
            pass
    return Mirror


class OpenAIStream(BaseHTTPRequestHandler):
    """A fake OpenAI-compatible server's request handler: responses with a length, and streamed completions as vLLM's
    server sends them (Server-Sent Events, one ``data:`` event per HTTP chunk, ``[DONE]`` last). Subclasses say what a GET
    answers and what a POST streams; ``stream_chat`` is vLLM's chat stream paced by the caller."""

    protocol_version = "HTTP/1.1"
    model = "tiny"
    nodelay = False  # True: each chunk leaves at once (no Nagle wait for the client's delayed ACK), as from vLLM's server

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass  # keep pytest output clean

    def setup(self):
        super().setup()
        if self.nodelay:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def read_json(self):
        """The request's JSON body."""
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def send_payload(self, status, payload, ctype=None):
        """A whole response with its Content-Length (and Content-Type when given)."""
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def models_payload(self):
        """``GET /v1/models``: this server's one model."""
        return json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]}).encode()

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def write_chunk(self, data):
        """One HTTP chunk, flushed."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def event(self, obj):
        """One SSE event (a dict as JSON, or bytes such as ``[DONE]``) in its own HTTP chunk."""
        self.write_chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

    def end_stream(self):
        """``[DONE]`` and the last (empty) HTTP chunk."""
        self.event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def chat_chunk(self, delta, finish=None):
        return {"id": "x", "object": "chat.completion.chunk", "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def token_chunk_ready(self, count):
        """Called before a chunk of ``count`` tokens is written (a subclass counts what it serves)."""

    def choice_written(self):
        """Called after each chunk with a choice (the role chunk and the token chunks) was written."""

    def stream_chat(self, tokens, ttft_s, gap_s, chunk_tokens=(1,)):
        """vLLM's chat stream of ``tokens`` tokens: after ``ttft_s`` the role chunk, then token chunks of ``chunk_tokens``
        tokens in turn, ``gap_s`` seconds apart (a number, or a function giving each gap), the last with finish_reason
        ``length``, the usage chunk (``choices: []``) and ``[DONE]``."""
        self.start_stream()
        time.sleep(ttft_s)
        self.event(self.chat_chunk({"role": "assistant", "content": ""}))
        self.choice_written()
        sent, index = 0, 0
        while sent < tokens:
            if index:
                time.sleep(gap_s() if callable(gap_s) else gap_s)
            count = min(chunk_tokens[index % len(chunk_tokens)], tokens - sent)
            sent += count
            self.token_chunk_ready(count)
            self.event(self.chat_chunk({"content": " tok" * count}, "length" if sent == tokens else None))
            self.choice_written()
            index += 1
        self.event({"id": "x", "object": "chat.completion.chunk", "model": self.model, "choices": [],
                    "usage": {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": tokens + 12}})
        self.end_stream()
