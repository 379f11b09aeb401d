"""A paced OpenAI chat stream whose latency grows with load, optionally exposing vLLM's spec-decode counters.

For the sweep tests: the timing is fixed by the test, not by an engine, so the break-even a sweep finds can be
compared with the one built into the server. Each chunk's gap is ``gap_s * slowdown(in_flight)`` where ``in_flight``
is the number of requests being streamed at that moment (a closed loop at concurrency N keeps it at N).
With ``spec_rates`` (vLLM's cumulative per-position acceptance, one value per proposed slot) the server's /metrics
carries ``vllm:spec_decode_*`` counters that advance by one draft per chunk, the way a speculative engine's would;
without them /metrics has none, like a baseline's.
"""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler


def paced_handler(name, ttft_s, gap_s, slowdown=lambda n: 1.0, spec_rates=None, tokens_per_chunk=1):
    """A BaseHTTPRequestHandler class for ``tests.loopback_http.serving``; ``.state`` counts what it served."""
    state = {"in_flight": 0, "posts": 0, "drafts": 0, "accepted_per_pos": [0.0] * len(spec_rates or ()), "max_in_flight": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def setup(self):
            super().setup()
            # each chunk leaves at once (no Nagle wait for the client's delayed ACK), as from vLLM's server
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _send(self, status, payload, ctype="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self):
            if self.path.endswith("/v1/models"):
                self._send(200, json.dumps({"object": "list", "data": [{"id": name, "object": "model"}]}).encode())
            elif self.path.endswith("/metrics"):
                self._send(200, metrics_text().encode(), "text/plain; version=0.0.4")
            else:
                self._send(200, b"", "text/plain")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            tokens = int(body.get("max_completion_tokens") or body.get("max_tokens"))
            with lock:
                state["in_flight"] += 1
                state["posts"] += 1
                state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
            try:
                self._stream(tokens)
            finally:
                with lock:
                    state["in_flight"] -= 1

        def _stream(self, tokens):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def event(obj):
                data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def chunk(delta, finish=None):
                return {"id": "x", "object": "chat.completion.chunk", "model": name,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

            time.sleep(ttft_s)
            event(chunk({"role": "assistant", "content": ""}))
            sent, index = 0, 0
            while sent < tokens:
                if index:
                    with lock:
                        load = state["in_flight"]
                    time.sleep(gap_s * slowdown(load))
                count = min(tokens_per_chunk, tokens - sent)
                sent += count
                if spec_rates:
                    with lock:
                        state["drafts"] += 1
                        for slot, rate in enumerate(spec_rates):
                            state["accepted_per_pos"][slot] += rate
                event(chunk({"content": " tok" * count}, "length" if sent == tokens else None))
                index += 1
            event({"id": "x", "object": "chat.completion.chunk", "model": name, "choices": [],
                   "usage": {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": tokens + 12}})
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def metrics_text():
        if not spec_rates:
            return "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n" \
                   'vllm:num_requests_running{engine="0",model_name="%s"} 0.0\n' % name
        with lock:
            drafts = state["drafts"]
            per_pos = [round(v) for v in state["accepted_per_pos"]]
        labels = 'engine="0",model_name="%s"' % name
        lines = []
        for metric, value in (("num_drafts", drafts), ("num_draft_tokens", drafts * len(spec_rates)), ("num_accepted_tokens", sum(per_pos))):
            lines += ["# TYPE vllm:spec_decode_%s counter" % metric, "vllm:spec_decode_%s_total{%s} %.1f" % (metric, labels, value)]
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
        for slot, value in enumerate(per_pos):
            lines.append('vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position="%d"} %.1f' % (labels, slot, value))
        return "\n".join(lines) + "\n"

    Handler.state = state
    Handler.metrics_text = staticmethod(metrics_text)
    return Handler
