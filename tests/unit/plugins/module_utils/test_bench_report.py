"""Benchmark report: golden Markdown/JSON, refusal of incomplete reports, decision rules (the plots: test_bench_plots.py)."""
import json
import os

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import decision as bench_decision
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.paths import read_capture

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "golden")
REGENERATE = os.environ.get("ALAUDA_REGENERATE_GOLDEN") == "1"

CONTEXT = {
    "gpu_model": "NVIDIA-A100-SXM4-80GB", "gpu_count": 1, "model": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "bfloat16",
    "vllm_version": "0.32.0", "image": "vllm/vllm-openai:v0.32.0",
    "baseline_command": ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/mnt/models", "--dtype", "bfloat16"],
    "candidate_command": ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/mnt/models", "--dtype", "bfloat16",
                          "--speculative-config", '{"method":"eagle3","model":"/mnt/draft/model","num_speculative_tokens":3}'],
    "speculative_config": {"method": "eagle3", "model": "/mnt/draft/model", "num_speculative_tokens": 3},
}
REQUEST = {"api": "chat", "workload": "code_refactor", "num_prompts": 2, "temperature": 0.0, "max_tokens": 1024, "seed": 0,
           "concurrency": 4, "request_rate": None, "arrival": None, "runs_per_prompt": 5, "warmup_requests": 3,
           "sampling": {"seed": 0, "temperature": 0.0}}
ACCEPTANCE = {"mean_acceptance_length": 2.4, "acceptance_rate": 0.4667, "per_position": [0.7, 0.45, 0.25],
              "num_drafts": 1000, "num_draft_tokens": 3000, "num_accepted_tokens": 1400}


def records(ttft, gap, chunks, tokens_per_chunk, n=10):
    """Deterministic request records: TTFT and chunk gaps grow slightly with the request index."""
    out = []
    for i in range(n):
        itl = [gap * (1 + 0.01 * ((i + j) % 7)) for j in range(chunks - 1)]
        t0 = ttft * (1 + 0.02 * i)
        out.append({"success": True, "prompt_id": "p%d" % (i % 2), "ttft": t0, "itl": itl, "latency": t0 + sum(itl),
                    "output_tokens": 1 + (chunks - 1) * tokens_per_chunk, "prompt_tokens": 500})
    return out


def sides():
    base_rec = records(0.050, 0.020, 200, 1)
    cand_rec = records(0.048, 0.030, 90, 2)
    base = {"url": "http://base:8080", "model": "llama", "api": "chat", "warmup": {"requests": 3, "failed": 0},
            "summary": bench_stats.summarize_run(base_rec, 12.0),
            "prefix_cache": {"hits": 0, "queries": 5000, "hit_rate": 0.0, "enabled": True}}
    cand = {"url": "http://cand:8080", "model": "llama", "api": "chat", "warmup": {"requests": 3, "failed": 0},
            "summary": bench_stats.summarize_run(cand_rec, 8.0),
            "prefix_cache": {"hits": 0, "queries": 5000, "hit_rate": 0.0, "enabled": True}}
    return base, cand, base_rec, cand_rec


def make_report(context=None, tolerances=None):
    base, cand, _b, _c = sides()
    ctx = bench_report.build_context(CONTEXT if context is None else context, REQUEST)
    return bench_report.build_report(base, cand, ctx, tolerances=tolerances, acceptance=ACCEPTANCE, generated_at="2025-01-01T00:00:00Z")


def _check_golden(name, text):
    path = os.path.join(GOLDEN_DIR, name)
    if REGENERATE:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    with open(path, encoding="utf-8") as handle:
        assert text == handle.read(), "%s differs from the golden file (ALAUDA_REGENERATE_GOLDEN=1 rewrites it after review)" % name


def test_golden_report(tmp_path):
    report = make_report()
    _b, _c, base_rec, cand_rec = sides()
    paths = bench_report.write_report(report, str(tmp_path), records={"baseline": base_rec, "candidate": cand_rec})
    with open(paths["markdown"], encoding="utf-8") as handle:
        _check_golden("bench_report.md", handle.read())
    with open(paths["json"], encoding="utf-8") as handle:
        data = json.load(handle)
    _check_golden("bench_report.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    # The numbers a reader checks first, independent of the golden text.
    assert data["decision"]["decision"] == "keep"
    assert data["comparison"]["speedup"] == pytest.approx((10 * 179 / 8.0) / (10 * 200 / 12.0))
    assert data["comparison"]["ceiling_conversion"] == pytest.approx(data["comparison"]["speedup"] / 2.4)
    assert data["comparison"]["wall_time"]["delta_s"] == pytest.approx(-4.0)
    assert set(data["plots"]) == {"acceptance", "latency"}


@pytest.mark.parametrize("key,label", [
    ("gpu_model", "Hardware: GPU model"), ("gpu_count", "Hardware: GPU count"), ("model", "Model: identifier"),
    ("dtype", "Model: dtype"), ("vllm_version", "Runtime: vLLM version"), ("image", "Runtime: image"),
    ("baseline_command", "Baseline command"), ("candidate_command", "Speculative-decoding command"),
])
def test_refuses_report_missing_a_required_field(tmp_path, key, label):
    for blank in (None, "", "  ", []):
        context = dict(CONTEXT, **{key: blank})
        if key in ("model", "dtype"):  # else they are read from the command's --model / --dtype
            context["candidate_command"] = "vllm serve /mnt/models --speculative-config '{\"method\": \"ngram\"}'"
        report = make_report(context)
        with pytest.raises(ValidationError) as err:
            bench_report.write_report(report, str(tmp_path / "out"))
        assert label in str(err.value) and "refusing" in str(err.value)
        assert err.value.field == "report_context"
        assert not os.path.exists(str(tmp_path / "out")), "nothing may be written for an incomplete report"


@pytest.mark.parametrize("key,label", [
    ("temperature", "temperature"), ("max_tokens", "max_tokens"), ("concurrency", "concurrency"),
    ("sampling", "sampling switches"), ("runs_per_prompt", "runs per prompt"),
])
def test_refuses_missing_request_parameters(key, label):
    request = dict(REQUEST)
    del request[key]
    ctx = bench_report.build_context(CONTEXT, request)
    with pytest.raises(ValidationError, match="Request parameters: %s" % label):
        bench_report.require_complete(ctx)


def test_refusal_lists_every_missing_field_and_zero_gpus_is_a_value():
    ctx = bench_report.build_context({"gpu_count": 0}, REQUEST)
    missing = [label for label, _src in bench_report.missing_fields(ctx)]
    assert "Hardware: GPU count" not in missing  # 0 GPUs (a CPU run) is an answer, not a gap
    assert missing == ["Hardware: GPU model", "Model: identifier", "Model: dtype", "Runtime: vLLM version", "Runtime: image",
                       "Baseline command", "Speculative-decoding command"]
    with pytest.raises(ValidationError, match="missing 7 required field"):
        bench_report.require_complete(ctx)


def _summary(ttft, tpot, tput, failed=0):
    return {"ttft_ms": {"median": ttft}, "tpot_ms": {"median": tpot}, "output_throughput": tput, "completed": 10, "failed": failed}


def test_decision_keep_only_when_all_three_improve():
    base = _summary(50.0, 20.0, 100.0)
    assert bench_decision.decide(base, _summary(45.0, 10.0, 180.0))["decision"] == "keep"
    worse_ttft = bench_decision.decide(base, _summary(55.0, 10.0, 180.0))
    assert worse_ttft["decision"] == "roll_back"
    assert len(worse_ttft["reasons"]) == 1 and "median TTFT got worse" in worse_ttft["reasons"][0] and "+10.0%" in worse_ttft["reasons"][0]
    assert bench_decision.decide(base, _summary(45.0, 21.0, 180.0))["reasons"][0].startswith("median TPOT")
    dropped = bench_decision.decide(base, _summary(45.0, 10.0, 90.0))
    assert dropped["decision"] == "roll_back" and "output throughput dropped" in dropped["reasons"][0]
    all_bad = bench_decision.decide(base, _summary(60.0, 30.0, 50.0))
    assert len(all_bad["reasons"]) == 3


def test_decision_tolerances():
    base = _summary(50.0, 20.0, 100.0)
    cand = _summary(52.0, 19.0, 120.0)  # TTFT 4% worse
    assert bench_decision.decide(base, cand)["decision"] == "roll_back"
    assert bench_decision.decide(base, cand, {"ttft": 0.05})["decision"] == "keep"
    assert bench_decision.decide(base, _summary(45.0, 19.0, 97.0), {"throughput": 0.05})["decision"] == "keep"
    with pytest.raises(ValidationError, match="unknown tolerance"):
        bench_decision.decide(base, cand, {"latency": 0.1})
    with pytest.raises(ValidationError, match="fraction"):
        bench_decision.decide(base, cand, {"ttft": 5})


def test_decision_unmeasured_and_failures_roll_back():
    base = _summary(50.0, 20.0, 100.0)
    assert "not measured" in bench_decision.decide(base, _summary(45.0, None, 120.0))["reasons"][0]
    failing = bench_decision.decide(base, _summary(45.0, 10.0, 180.0, failed=2))
    assert failing["decision"] == "roll_back" and "failed 2 of 12" in failing["reasons"][0]


def test_prefix_cache_difference_is_flagged():
    notes = bench_report.prefix_cache_notes({"hits": 10, "queries": 100, "hit_rate": 0.10}, {"hits": 60, "queries": 100, "hit_rate": 0.60})
    assert any("differ" in n for n in notes)
    notes = bench_report.prefix_cache_notes(None, {"hits": 0, "queries": 10, "hit_rate": 0.0})
    assert any("baseline exposes no" in n for n in notes)


OFF = {"hits": 0, "queries": 0, "hit_rate": None, "enabled": False}


def _on(rate, queries=1000):
    return {"hits": int(rate * queries), "queries": queries, "hit_rate": rate, "enabled": True}


def test_prefix_caching_off_on_both_sides():
    notes = bench_report.prefix_cache_notes(OFF, dict(OFF))
    assert notes == ["prefix caching is off on both sides (vllm:cache_config_info enable_prefix_caching=False), so cache "
                     "effects cannot be mistaken for speculative-decoding gains"]
    # Off, and the counters missing too: off is known, so no "hit rate unknown" note.
    assert bench_report.prefix_cache_notes({"hits": None, "queries": None, "hit_rate": None, "enabled": False}, OFF) == notes


@pytest.mark.parametrize("on_side", ["baseline", "candidate"])
def test_prefix_caching_on_one_side_only_is_named_with_the_fix(on_side):
    caches = {"baseline": OFF, "candidate": OFF, on_side: _on(0.375)}
    off_side = "candidate" if on_side == "baseline" else "baseline"
    notes = bench_report.prefix_cache_notes(caches["baseline"], caches["candidate"])
    assert len(notes) == 1
    note = notes[0]
    assert note.startswith("prefix caching is on for the %s (hit rate 37.5%%) and off for the %s" % (on_side, off_side))
    assert "mixes cache effects into the difference" in note
    assert "`--enable-prefix-caching` on both, or `--no-enable-prefix-caching` on both" in note and "InferenceServices" in note
    assert "off on both sides" not in note
    # The side that is off needs no hit rate: its counters missing adds no "hit rate unknown" note.
    caches[off_side] = {"hits": None, "queries": None, "hit_rate": None, "enabled": False}
    assert bench_report.prefix_cache_notes(caches["baseline"], caches["candidate"]) == notes


def test_prefix_caching_on_both_sides_keeps_the_hit_rate_notes():
    assert bench_report.prefix_cache_notes(_on(0.10), _on(0.12)) == []  # within 5 points: nothing to say
    [note] = bench_report.prefix_cache_notes(_on(0.10), _on(0.60))
    assert note.startswith("prefix cache hit rates differ (baseline 10.0%, candidate 60.0%)")
    assert not any("prefix caching is" in n for n in bench_report.prefix_cache_notes(_on(0.10), _on(0.60)))


def test_prefix_caching_unknown_keeps_todays_notes():
    unknown = {"hits": 0, "queries": 10, "hit_rate": 0.0, "enabled": None}
    older = {"hits": 0, "queries": 10, "hit_rate": 0.0}  # a baseline phase saved before "enabled" existed
    assert bench_report.prefix_cache_notes(unknown, older) == []
    # Unknown on one side, off on the other: no on/off verdict, the unknown side's missing counters are noted.
    notes = bench_report.prefix_cache_notes(None, OFF)
    assert notes == ["prefix cache: the baseline exposes no vllm:prefix_cache_* metrics; its hit rate is unknown"]
    notes = bench_report.prefix_cache_notes(_on(0.5), None)
    assert notes == ["prefix cache: the candidate exposes no vllm:prefix_cache_* metrics; its hit rate is unknown"]
    assert [n.split(" (", 1)[0] for n in bench_report.prefix_cache_notes(
        {"hits": 10, "queries": 100, "hit_rate": 0.10}, {"hits": 60, "queries": 100, "hit_rate": 0.60})] == ["prefix cache hit rates differ"]


def _prefix_table(report):
    section = bench_report.render_markdown(report).split("## Prefix cache", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_markdown_prefix_cache_column():
    base, cand, _b, _c = sides()
    base["prefix_cache"] = _on(0.25, 4000)
    cand["prefix_cache"] = OFF
    ctx = bench_report.build_context(CONTEXT, REQUEST)
    report = bench_report.build_report(base, cand, ctx, acceptance=ACCEPTANCE)
    assert _prefix_table(report) == ["| Side | Prefix caching | Hits / queries (tokens) | Hit rate |", "|---|---|---|---|",
                                     "| baseline | on | 1000 / 4000 | 25.0% |", "| candidate | off | 0 / 0 | n/a |"]
    assert any(n.startswith("prefix caching is on for the baseline") for n in report["notes"])
    base["prefix_cache"] = None
    cand["prefix_cache"] = {"hits": 3, "queries": 10, "hit_rate": 0.3}  # saved before "enabled" existed
    report = bench_report.build_report(base, cand, ctx, acceptance=ACCEPTANCE)
    assert _prefix_table(report)[2:] == ["| baseline | unknown | n/a / n/a | n/a |", "| candidate | unknown | 3 / 10 | 30.0% |"]


def test_acceptance_from_a_real_metrics_capture():
    """The module's acceptance block is spec_metrics' deltas: check it against the ngram capture's counters."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run
    text = read_capture("ngram", "metrics.txt")
    empty = "# no counters yet\n"
    acc = bench_run.acceptance(empty, text, "t-ngram")
    # metrics.txt: drafts 229, draft tokens 1002, accepted 655, per position 190, 152, 126, 99, 88
    assert acc["num_drafts"] == 229 and acc["num_draft_tokens"] == 1002 and acc["num_accepted_tokens"] == 655
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 655 / 229)
    assert acc["acceptance_rate"] == pytest.approx(655 / 1002)
    assert acc["per_position"] == pytest.approx([190 / 229, 152 / 229, 126 / 229, 99 / 229, 88 / 229])
    assert bench_run.acceptance(text, text, "t-ngram")["num_drafts"] == 0
    baseline_text = read_capture("baseline", "metrics.txt")
    assert bench_run.acceptance(baseline_text, baseline_text, "t-baseline") is None
    assert spec_metrics.parse_prometheus(text).found


def test_model_and_dtype_read_from_the_guide_command():
    import yaml
    path = os.path.join(HERE, "data", "rollback", "guide_example2_eagle3.yaml")
    with open(path, encoding="utf-8") as handle:
        model = yaml.safe_load(handle)["spec"]["predictor"]["model"]
    context = dict(CONTEXT, model=None, dtype="", candidate_command=model["command"], candidate_env=model["env"])
    ctx = bench_report.build_context(context, REQUEST)
    # bash -c script, flag on a continued line, --dtype ${DTYPE} from the container env
    assert ctx["model"] == {"id": "llama31-8b-eagle3", "dtype": "bfloat16"}
    # the command reader is vllm.command_line's now (bench_report.command_words / flag_value were folded into it)
    command = "vllm serve /m --dtype=half"
    assert vllm_command.option_value(command, "--dtype") == "half" and vllm_command.option_value(command, "--served-model-name") is None
    ctx = bench_report.build_context(dict(CONTEXT, model=None, dtype=None, candidate_command="vllm serve /mnt/models"), REQUEST)
    assert ctx["model"]["id"] is None and ctx["model"]["dtype"] is None  # `vllm serve X` positional: not guessed
    assert [label for label, _src in bench_report.missing_fields(ctx)] == ["Model: identifier", "Model: dtype"]


# -- burst-delivered streams ---------------------------------------------------------------------------------
def _stream_records(n, bursts, ttft, gap, chunks=161):
    """``n`` requests, the first ``bursts`` of them burst-delivered (real vLLM: TTFT 450-520 ms, gaps 4 us)."""
    out = []
    for i in range(n):
        if i < bursts:
            t0, itl = 0.450 + 0.010 * i, [0.000004] * (chunks - 1)
        else:
            t0, itl = ttft * (1 + 0.01 * i), [gap * (1 + 0.01 * (j % 5)) for j in range(chunks - 1)]
        out.append({"success": True, "ttft": t0, "itl": itl, "latency": t0 + sum(itl), "output_tokens": chunks, "prompt_tokens": 100})
    return out


def _burst_sides(baseline_bursts=0, candidate_bursts=0, n=20):
    """A candidate that pays (TTFT 10 vs 12 ms, TPOT about 3 vs 6 ms, more tok/s), with some requests burst-delivered."""
    base = {"url": "http://base:8080", "model": "llama", "summary": bench_stats.summarize_run(
        _stream_records(n, baseline_bursts, 0.012, 0.006), 20.0), "prefix_cache": {"hits": 0, "queries": 10, "hit_rate": 0.0}}
    cand = {"url": "http://cand:8080", "model": "llama", "summary": bench_stats.summarize_run(
        _stream_records(n, candidate_bursts, 0.010, 0.003), 10.0), "prefix_cache": {"hits": 0, "queries": 10, "hit_rate": 0.0}}
    return base, cand


def _burst_report(baseline_bursts=0, candidate_bursts=0):
    base, cand = _burst_sides(baseline_bursts, candidate_bursts)
    ctx = bench_report.build_context(CONTEXT, REQUEST)
    return bench_report.build_report(base, cand, ctx, acceptance=ACCEPTANCE, generated_at="2025-01-01T00:00:00Z")


def _burst_notes(report):
    return [n for n in report["notes"] if "arrived in bursts" in n]


def test_no_burst_no_note_and_keep():
    report = _burst_report()
    assert report["decision"]["decision"] == "keep"
    assert _burst_notes(report) == []
    assert report["baseline"]["summary"]["burst_delivered"] == 0 and report["candidate"]["summary"]["burst_delivered"] == 0


def test_one_of_twenty_burst_delivered_gets_a_note_but_keeps_the_decision():
    clean = _burst_report()
    report = _burst_report(candidate_bursts=1)
    assert report["candidate"]["summary"]["burst_delivered"] == 1
    assert report["decision"]["decision"] == "keep"
    assert report["decision"]["reasons"] == clean["decision"]["reasons"]
    [note] = _burst_notes(report)
    assert note.startswith("burst delivery on the candidate: 1 of 20 requests' streams arrived in bursts")
    assert "median gap between their chunks 0.004 ms" in note
    for words in ("ingress, proxy or service mesh with response buffering", "starved of CPU", "`proxy_buffering off`",
                  "`X-Accel-Buffering: no`", "on its own cores, then measure again", "the decision is not refused"):
        assert words in note, words
    assert "- " + note in bench_report.render_markdown(report).split("## Notes", 1)[1]


def test_five_of_twenty_burst_delivered_rolls_back():
    report = _burst_report(candidate_bursts=5)
    dec = report["decision"]
    # The medians still favour the candidate (15 of 20 requests are paced): only the burst rule refuses keep.
    assert all(check["passed"] for check in dec["checks"])
    assert dec["decision"] == "roll_back"
    assert len(dec["reasons"]) == 1
    reason = dec["reasons"][0]
    assert reason.startswith("TTFT, ITL and TPOT were not measured per token on the candidate: 5 of 20 streams arrived in bursts")
    assert "median gap between their chunks 0.004 ms" in reason and "`proxy_buffering off`" in reason
    [note] = _burst_notes(report)
    assert "5 of 20" in note and "so the decision is roll_back" in note
    markdown = bench_report.render_markdown(report)
    decision_part, notes_part = markdown.split("## Context", 1)[0], markdown.split("## Notes", 1)[1]
    assert "**Decision: `roll_back`**" in decision_part and "- " + reason in decision_part
    assert "- " + note in notes_part


def test_burst_rule_threshold_is_more_than_ten_percent_of_either_side():
    assert _burst_report(candidate_bursts=2)["decision"]["decision"] == "keep"        # 10%: note only
    assert _burst_report(candidate_bursts=3)["decision"]["decision"] == "roll_back"   # 15%
    base_side = _burst_report(baseline_bursts=3)
    assert base_side["decision"]["decision"] == "roll_back"
    assert base_side["decision"]["reasons"][0].startswith("TTFT, ITL and TPOT were not measured per token on the baseline: 3 of 20")
    assert [n.split(":", maxsplit=1)[0] for n in _burst_notes(base_side)] == ["burst delivery on the baseline"]
    both = _burst_report(baseline_bursts=4, candidate_bursts=5)
    assert [r.split(":", maxsplit=1)[0] for r in both["decision"]["reasons"][:2]] == [
        "TTFT, ITL and TPOT were not measured per token on the baseline", "TTFT, ITL and TPOT were not measured per token on the candidate"]
    assert len(_burst_notes(both)) == 2


def test_summaries_without_the_burst_count_are_treated_as_zero():
    """Baseline phases saved before the count existed have no burst_delivered key."""
    base, cand = _burst_sides(candidate_bursts=5)
    for key in ("burst_delivered", "burst_delivered_median_gap_ms"):
        del base["summary"][key]
    ctx = bench_report.build_context(CONTEXT, REQUEST)
    report = bench_report.build_report(base, cand, ctx, acceptance=ACCEPTANCE)
    assert [n.split(":", maxsplit=1)[0] for n in _burst_notes(report)] == ["burst delivery on the candidate"]
    assert report["decision"]["decision"] == "roll_back" and "on the candidate: 5 of 20" in report["decision"]["reasons"][0]
    for key in ("burst_delivered", "burst_delivered_median_gap_ms"):
        del cand["summary"][key]
    assert bench_decision.decide(base["summary"], cand["summary"])["decision"] == "keep"
    assert _burst_notes(bench_report.build_report(base, cand, ctx, acceptance=ACCEPTANCE)) == []
    assert bench_decision.decide(_summary(50.0, 20.0, 100.0), _summary(45.0, 10.0, 180.0))["decision"] == "keep"
