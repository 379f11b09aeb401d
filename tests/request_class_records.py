"""Benchmark records of one request class and vLLM's per-request ``metrics.speculative_decoding`` block, as the load
client keeps them (bench/client.py): the test doubles of the per-class A/B (tests/unit/.../test_bench_request_classes.py)
and the per-class sweep (test_sweep_classes.py)."""


def class_records(klass, tpot, n=12, tokens=60, block=None, ttft=0.05):
    """``n`` successful requests of class ``klass`` streaming ``tokens`` tokens ``tpot`` s apart (a little spread)."""
    out = []
    for i in range(n):
        gap = tpot * (1 + 0.03 * (i % 5))
        t0 = ttft * (1 + 0.02 * (i % 3))
        out.append({"success": True, "prompt_id": "%s/%d" % (klass, i % 2), "request_class": klass, "ttft": t0,
                    "itl": [gap] * (tokens - 1), "latency": t0 + gap * (tokens - 1), "output_tokens": tokens,
                    "prompt_tokens": 100, "spec_decoding": block})
    return out


def spec_decoding_block(steps, drafted, accepted, k=3):
    """A per-request block with ``accepted`` tokens over ``steps`` steps: ``accepted // k`` full accepts, the rest one each."""
    full, rest = divmod(accepted, k)
    hist = [steps - full - rest, rest] + [0] * (k - 2) + [full]
    return {"num_spec_steps": steps, "num_draft_tokens": drafted, "num_accepted_draft_tokens": accepted, "num_spec_tokens": k,
            "acceptance_histogram": hist, "mean_acceptance_length": 1 + accepted / steps, "draft_acceptance_rate": accepted / drafted}
