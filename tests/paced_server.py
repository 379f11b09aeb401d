"""A paced OpenAI chat stream whose latency grows with load, optionally exposing vLLM's spec-decode counters.

For the sweep tests: the timing is fixed by the test, not by an engine, so the break-even a sweep finds can be
compared with the one built into the server. Each chunk's gap is ``gap_s * slowdown(in_flight)`` where ``in_flight``
is the number of requests being streamed at that moment (a closed loop at concurrency N keeps it at N).
With ``spec_rates`` (vLLM's cumulative per-position acceptance, one value per proposed slot) the server's /metrics
carries ``vllm:spec_decode_*`` counters that advance by one draft per chunk, the way a speculative engine's would;
without them /metrics has none, like a baseline's.
"""
import threading

from tests.loopback_http import OpenAIStream


def paced_handler(name, ttft_s, gap_s, slowdown=lambda n: 1.0, spec_rates=None, tokens_per_chunk=1):
    """A handler class (tests/loopback_http.py's OpenAIStream) for ``tests.loopback_http.serving``; ``.state`` counts
    what it served."""
    state = {"in_flight": 0, "posts": 0, "drafts": 0, "accepted_per_pos": [0.0] * len(spec_rates or ()), "max_in_flight": 0}
    lock = threading.Lock()

    class Handler(OpenAIStream):
        model = name
        nodelay = True

        def do_GET(self):  # pylint: disable=invalid-name
            if self.path.endswith("/v1/models"):
                self.send_payload(200, self.models_payload(), "application/json")
            elif self.path.endswith("/metrics"):
                self.send_payload(200, metrics_text().encode(), "text/plain; version=0.0.4")
            else:
                self.send_payload(200, b"", "text/plain")

        def do_POST(self):  # pylint: disable=invalid-name
            body = self.read_json()
            tokens = int(body.get("max_completion_tokens") or body.get("max_tokens"))
            with lock:
                state["in_flight"] += 1
                state["posts"] += 1
                state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
            try:
                self.stream_chat(tokens, ttft_s, self._gap, (tokens_per_chunk,))
            finally:
                with lock:
                    state["in_flight"] -= 1

        @staticmethod
        def _gap():
            with lock:
                load = state["in_flight"]
            return gap_s * slowdown(load)

        def token_chunk_ready(self, count):
            if spec_rates:
                with lock:
                    state["drafts"] += 1
                    for slot, rate in enumerate(spec_rates):
                        state["accepted_per_pos"][slot] += rate

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
