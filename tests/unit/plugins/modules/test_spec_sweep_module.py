"""``alauda.spec_decoding.spec_sweep`` in-process against paced loopback servers whose latency grows with load.

The servers' timing is built by the test (tests/paced_server.py), so the break-even the sweep reports can be
compared with the one built in: the candidate's chunk gap is ``GAP * (0.5 + 0.25 * (in_flight - 1))`` against the
baseline's constant ``GAP``, so its TPOT equals the baseline's at 3 requests in flight. Its TTFT is lower at every
load, and its throughput crosses later than its TPOT (its TTFT is shorter), so TPOT crosses first, at 3.
"""
import contextlib
import json
import os
import sys

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_schedule
from tests.loopback_http import serving
from tests.module_run import run_module
from tests.paced_server import paced_handler
from tests.png_file import check_png
from tests.unit.plugins.module_utils.test_spec_sweep_run import engine_line

GAP = 0.010
TOKENS = 8
BUILT_IN_BREAK_EVEN = 3.0
NUM_PROMPTS = 1
PER_SIDE = 3 + 5 * NUM_PROMPTS  # requests per side and load: 3 warmups + 5 runs of each prompt


def candidate_slowdown(in_flight):
    return 0.5 + 0.25 * (max(in_flight, 1) - 1)


@contextlib.contextmanager
def paced_servers(gap):
    """The baseline, the k=3 candidate and the k=1 server, every time (TTFT and chunk gap) a multiple of ``gap``."""
    base = paced_handler("paced-base", 2 * gap, gap)
    # The candidate's TTFT is half the baseline's: a 10 ms margin (at GAP) that thread scheduling on two busy cores (servers
    # and client share this process) cannot close, so TTFT never crosses before TPOT by accident (a 5 ms margin did).
    cand = paced_handler("paced-ngram", gap, gap, candidate_slowdown, spec_rates=[0.9, 0.1, 0.05])
    # the k=1 server is faster than the k=3 one at every load: lower TTFT, 60% of its chunk gap
    k1 = paced_handler("paced-ngram-k1", 0.6 * gap, gap, lambda n: 0.6 * candidate_slowdown(n), spec_rates=[0.9])
    with serving(base) as b_url, serving(cand) as c_url, serving(k1) as k_url:
        yield {"baseline": (b_url, base), "candidate": (c_url, cand), "confirm": (k_url, k1)}


@pytest.fixture(scope="module")
def servers():
    with paced_servers(GAP) as found:
        yield found


# The k confirmation's A/B (k=1 against k=3 at 5 requests/s, about one in flight) is decided by a rank test on 5 requests a
# side, which shows the gain only when nearly every k=1 request beats every k=3 one. At GAP their TPOTs are 3 and 5 ms: a
# stall of a few ms of the client thread (two loaded cores) swapped requests, or left the chunks read in one burst, and the
# run once said `rejected`. At three times GAP they are 9 and 15 ms (42 ms a request apart, chunks 9 ms apart).
CONFIRM_GAP = 3 * GAP


@pytest.fixture(scope="module")
def confirm_servers():
    with paced_servers(CONFIRM_GAP) as found:
        yield found


# What the paced servers stand for, as vLLM prints it in its engine-config line (engine_config_info's result shape).
BASE_ENGINE = {"found": True, "speculative_config": None}
CAND_ENGINE = {"found": True, "speculative_config": {"method": "ngram", "model": None, "num_spec_tokens": 3}}
CONTEXT = {"gpu_model": "none (paced loopback server)", "gpu_count": 0, "model": "paced", "dtype": "none", "vllm_version": "none",
           "image": "none", "baseline_command": ["paced-sse"],
           "candidate_command": ["paced-sse", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']}


def args(servers, tmp_path, **over):
    out = {"baseline_url": servers["baseline"][0], "candidate_url": servers["candidate"][0], "concurrencies": [1, 2, 4, 6],
           "prompts_file": str(prompts_file(tmp_path)), "runs_per_prompt": 5, "warmup": 3, "max_tokens": TOKENS, "temperature": 0.0,
           "seed": 0, "report_dir": str(tmp_path / "report"), "report_context": CONTEXT, "method": "ngram", "k_candidates": [1, 2, 3]}
    out.update(over)
    return out


def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps({"prompt": "p%d " % i * 5}) + "\n" for i in range(NUM_PROMPTS)))
    return path


def posts(servers):
    return {side: handler.state["posts"] for side, (_url, handler) in servers.items()}


def png_size(path):
    """(width, height) of a valid PNG: its image data, which may span several IDAT chunks, inflates (tests/png_file.py)."""
    return check_png(path)[:2]


def test_concurrency_sweep_finds_the_built_in_break_even_and_resumes(servers, tmp_path):
    before = posts(servers)
    out = run_module("spec_sweep", args(servers, tmp_path, verify_cost_ratio=0.2, baseline_engine_config=BASE_ENGINE,
                                        candidate_engine_config=dict(CAND_ENGINE, changed=False, item="llama-ngram")))
    assert not out.failed, out.msg
    assert out["checks"] == {"baseline": {"engine_line": "speculative_config=None", "metrics": "no vllm:spec_decode_* counters"},
                             "candidate": {"engine_line": "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=3)",
                                           "metrics": "vllm:spec_decode_* counters, 3 per-position series"}}
    be = out["break_even"]
    assert be["kind"] == "concurrency" and be["status"] == "crossed", be
    assert (be["last_keep_load"], be["first_roll_back_load"]) == (2, 4), be["reason"]
    # within one sweep step of what the server was built with, and between the two points that bracket it
    assert be["last_keep_load"] <= be["crossover_load"] <= be["first_roll_back_load"]
    assert abs(be["crossover_load"] - BUILT_IN_BREAK_EVEN) <= 1.0, be
    assert be["crossed_first"] == "tpot", be
    for point in out["points"]:  # speedup is the ratio of the two sides' output tok/s at each point
        assert point["speedup"] == pytest.approx(point["candidate"]["output_throughput"] / point["baseline"]["output_throughput"])
        assert point["candidate"]["acceptance"]["per_position"]
    assert [p["decision"] for p in out["points"]] == ["keep", "keep", "roll_back", "roll_back"]
    # every unit measured once: 4 loads x (3 warmups + 5 measured) per side, nothing on the confirm server
    after = posts(servers)
    assert after["baseline"] - before["baseline"] == 4 * PER_SIDE and after["candidate"] - before["candidate"] == 4 * PER_SIDE
    assert after["confirm"] == before["confirm"]
    # k: a curve that collapses at slot 2 with a verify cost of 0.2 per slot predicts k=1; not confirmed without an A/B
    pred = out["k"]["prediction"]
    assert out["k"]["current_k"] == 3 and pred["predicted_k"] == 1
    assert out["k"]["confirmation"]["status"] == "not_measured" and out["k"]["recommended_k"] is None
    # the report: Markdown, JSON (resumable), two labelled PNGs
    md = open(out["report_markdown"], encoding="utf-8").read()
    for needle in ("## Break-even (concurrency)", "| candidate | SpeculativeConfig(method='ngram', model=None, num_spec_tokens=3) |",
                   "Hardware: GPU model", "Runtime: vLLM version", "Speculative decoding:",
                   "Recommended k: n/a", "-load.png", "-k.png"):
        assert needle in md, needle
    assert png_size(out["plots"]["load"]) == (1200, 500) and png_size(out["plots"]["k"]) == (1200, 500)  # bench_plots.FIGSIZE at 100 dpi
    progress = open(out["progress_file"], encoding="utf-8").read()
    assert "[8/8] concurrency 6 candidate 5/5" in progress, progress[-2000:]

    # Resume: the same sweep from its JSON measures nothing; one more load measures only that load.
    mark = posts(servers)
    again = run_module("spec_sweep", args(servers, tmp_path, verify_cost_ratio=0.2, resume_from=out["report_json"],
                                          report_dir=str(tmp_path / "again"), k_schedule=True))
    assert not again.failed, again.msg
    assert (again["resumed"], again["measured"]) == (8, 0) and posts(servers) == mark
    assert again["break_even"]["crossover_load"] == pytest.approx(be["crossover_load"])
    check_k_schedule(again)
    more = run_module("spec_sweep", args(servers, tmp_path, verify_cost_ratio=0.2, concurrencies=[1, 2, 4, 6, 8],
                                         resume_from=out["report_json"], report_dir=str(tmp_path / "more")))
    assert not more.failed, more.msg
    assert (more["resumed"], more["measured"]) == (8, 2)
    assert posts(servers)["baseline"] - mark["baseline"] == PER_SIDE and posts(servers)["candidate"] - mark["candidate"] == PER_SIDE
    # a different protocol refuses to mix
    bad = run_module("spec_sweep", args(servers, tmp_path, max_tokens=TOKENS + 1, resume_from=out["report_json"],
                                        report_dir=str(tmp_path / "bad")))
    assert bad.failed and bad["field"] == "resume_from" and "max_tokens" in bad.msg


def check_k_schedule(out):
    """The candidate's verify cost grows with load (chunk gap x 0.5, 0.75, 1.25, 1.75 at 1, 2, 4, 6 in flight) while its
    curve stays 0.9, 0.1, 0.05 (mean acceptance length 2.05): from 2 in flight on, k=1 beats k=3 by 20% or more
    (2: 1.61 against 1.33), and at 6 k=1 (1.02) still beats no drafts (1.0), so the schedule holds k=1 from 2 on."""
    per_load = out["k"]["per_load"]
    assert [r["batch_size"] for r in per_load] == [1, 2, 4, 6]
    assert [r["best_k"] for r in per_load][1:] == [1, 1, 1], per_load
    sched = out["k"]["schedule"]
    assert sched["num_speculative_tokens"] == 3 and sched["schedule"][0][0] == 1 and sched["schedule"][-1][1] == 6
    assert [speculative_schedule.k_at(sched["schedule"], b, 3) for b in (2, 3, 4, 5, 6)] == [1, 1, 1, 1, 1], sched
    assert max(entry[2] for entry in sched["schedule"]) <= 3
    md = open(out["report_markdown"], encoding="utf-8").read()
    assert "## A k for each load" in md and "**num_speculative_tokens_per_batch_size: `%s`**" % json.dumps(sched["schedule"]) in md
    assert "-k-schedule.png" in md and png_size(out["plots"]["k_schedule"]) == (1200, 500)


def test_predicted_k_is_confirmed_by_a_measured_ab(confirm_servers, tmp_path):
    servers = confirm_servers
    first = run_module("spec_sweep", args(servers, tmp_path, concurrencies=None, request_rates=[5.0, 10.0], target_qps=5.0,
                                          verify_cost_ratio=0.2))
    assert not first.failed, first.msg
    assert first["k"]["prediction"]["predicted_k"] == 1 and first["decision"]["load"] == 5.0
    mark = posts(servers)
    # open-loop rates: both sides' output tok/s follow the offered load, equal within noise, hence the throughput tolerance
    out = run_module("spec_sweep", args(servers, tmp_path, concurrencies=None, request_rates=[5.0, 10.0], target_qps=5.0,
                                        verify_cost_ratio=0.2, confirm_url=servers["confirm"][0], confirm_k=1,
                                        resume_from=first["report_json"], tolerances={"throughput": 0.05}))
    assert not out.failed, out.msg
    assert (out["resumed"], out["measured"]) == (4, 2)
    after = posts(servers)
    assert after["baseline"] == mark["baseline"]  # the sweep was not measured again
    assert after["confirm"] - mark["confirm"] == PER_SIDE and after["candidate"] - mark["candidate"] == PER_SIDE
    conf = out["k"]["confirmation"]
    assert conf["status"] == "confirmed" and out["k"]["recommended_k"] == 1, conf
    assert conf["load"] == 5.0
    saved = json.load(open(out["report_json"], encoding="utf-8"))
    cur, rec = [m for m in saved["measurements"] if m["side"] in ("confirm_current", "confirm")]
    assert (cur["k"], rec["k"]) == (3, 1)
    assert conf["measured_speedup_vs_current"] == pytest.approx(rec["summary"]["output_throughput"] / cur["summary"]["output_throughput"])
    tpot = next(c for c in conf["decision"]["checks"] if c["metric"] == "tpot")
    assert tpot["passed"] and tpot["candidate"] < 0.8 * tpot["baseline"], tpot
    assert conf["predicted_speedup_vs_current"] == pytest.approx(
        out["k"]["prediction"]["table"][0]["expected_gain"] / out["k"]["prediction"]["table"][2]["expected_gain"])
    md = open(out["report_markdown"], encoding="utf-8").read()
    assert "**Recommended k: 1**" in md and "Measured speedup vs current k" in md and "Decision at the target load" in md


@pytest.mark.parametrize("over, field, needle", [
    ({"request_rates": [2.0, 1.0], "concurrencies": None}, "request_rates", "not strictly increasing"),
    ({"request_rates": [], "concurrencies": None}, "request_rates", "is empty"),
    ({"request_rates": [0.0, 1.0], "concurrencies": None}, "request_rates", "greater than 0"),
    ({"k_candidates": [1, 11]}, "num_speculative_tokens", "outside 1..10"),
    ({"k_candidates": [4, 5]}, "k_candidates", "above the candidate's k=3"),
    ({"swap": True}, "baseline_url", "not a baseline"),
    ({"candidate_is_baseline": True}, "candidate_url", "shows no speculative decoding"),
    ({"report_context": dict(CONTEXT, baseline_command=CONTEXT["candidate_command"])}, "report_context.baseline_command", "baseline"),
    ({"target_qps": 4.0}, "target_qps", "needs request_rates"),
    ({"confirm_url": "http://127.0.0.1:9", "confirm_k": 2, "k_candidates": [1, 2, 3]}, "confirm_url", "not the k=2"),
    # what the engines logged (real vLLM 0.32 lines): a baseline that runs ngram, a candidate without a proposer or with
    # another method, a log of another server than the URL
    ({"baseline_engine_config": {"line": "ngram"}}, "baseline_engine_config", "so it is no baseline"),
    ({"candidate_engine_config": {"line": "baseline"}}, "candidate_engine_config", "speculative_config=None"),
    ({"candidate_engine_config": {"line": "eagle3"}}, "method", "runs method 'eagle3'"),
    ({"candidate_engine_config": {"line": "ngram"}}, "candidate_engine_config", "different servers"),
    ({"candidate_engine_config": CAND_ENGINE, "current_k": 2}, "current_k", "runs num_spec_tokens=3"),
])
def test_bad_input_is_refused_before_any_request(servers, tmp_path, over, field, needle):
    over = dict(over)
    a = args(servers, tmp_path)
    if over.pop("swap", False):
        a["baseline_url"], a["candidate_url"] = a["candidate_url"], a["baseline_url"]
    if over.pop("candidate_is_baseline", False):
        a["candidate_url"] = a["baseline_url"]
    if "confirm_url" in over:
        over["confirm_url"] = servers["confirm"][0]  # serves k=1
    for key in ("baseline_engine_config", "candidate_engine_config"):
        if "line" in over.get(key, {}):
            over[key] = {"line": engine_line(over[key]["line"])}
    a.update(over)
    before = posts(servers)
    out = run_module("spec_sweep", a)
    assert out.failed and out.get("field") == field and needle in out.msg, out
    assert posts(servers) == before
    assert not os.path.exists(os.path.join(a["report_dir"], "sweep.json"))


def test_plots_without_matplotlib_are_refused_before_any_request(servers, tmp_path, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # a host without matplotlib
    before = posts(servers)
    out = run_module("spec_sweep", args(servers, tmp_path))
    assert out.failed and out.get("field") == "plots", out
    assert "need the Python package matplotlib" in out.msg and "pip install 'matplotlib>=3.8'" in out.msg and "plots: false" in out.msg
    assert posts(servers) == before and not os.path.exists(args(servers, tmp_path)["report_dir"])


def test_confirm_url_needs_confirm_k(servers, tmp_path):
    out = run_module("spec_sweep", args(servers, tmp_path, confirm_url=servers["confirm"][0]))
    assert out.failed and "confirm_k" in out.msg


def test_an_interrupted_sweep_resumes_without_measuring_finished_points(servers, tmp_path, monkeypatch):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run
    real, calls = bench_run.measure, []

    def interrupted(*a, **kw):
        if len(calls) == 3:
            raise OSError("the connection to the runner was lost")
        calls.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(bench_run, "measure", interrupted)
    out = run_module("spec_sweep", args(servers, tmp_path, concurrencies=[1, 2]))
    assert out.failed and "connection to the runner was lost" in out.msg
    assert calls == ["[1/4] concurrency 1 baseline", "[2/4] concurrency 1 candidate", "[3/4] concurrency 2 baseline"]
    partial = json.load(open(tmp_path / "report" / "sweep.json", encoding="utf-8"))
    assert partial["complete"] is False and [(m["load"], m["side"]) for m in partial["measurements"]] == [
        (1, "baseline"), (1, "candidate"), (2, "baseline")]
    monkeypatch.setattr(bench_run, "measure", real)
    mark = posts(servers)
    again = run_module("spec_sweep", args(servers, tmp_path, concurrencies=[1, 2], resume_from=str(tmp_path / "report" / "sweep.json")))
    assert not again.failed, again.msg
    assert (again["resumed"], again["measured"]) == (3, 1)
    after = posts(servers)
    assert (after["baseline"] - mark["baseline"], after["candidate"] - mark["candidate"]) == (0, PER_SIDE)
    assert [p["load"] for p in again["points"]] == [1, 2]
    progress = open(again["progress_file"], encoding="utf-8").read()
    assert "3 measurement(s) resumed from" in progress and "[4/4] concurrency 2 candidate" in progress
