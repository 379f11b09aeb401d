"""Benchmark report: golden Markdown/JSON, refusal of incomplete reports, decision rules, plots."""
import json
import os
import struct
import zlib

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils import bench_report, bench_stats, spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "golden")
CAPTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))),
                        "shared", "vllm-captures")
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
            "summary": bench_stats.summarize_run(base_rec, 12.0), "prefix_cache": {"hits": 0, "queries": 5000, "hit_rate": 0.0}}
    cand = {"url": "http://cand:8080", "model": "llama", "api": "chat", "warmup": {"requests": 3, "failed": 0},
            "summary": bench_stats.summarize_run(cand_rec, 8.0), "prefix_cache": {"hits": 0, "queries": 5000, "hit_rate": 0.0}}
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
    assert bench_report.decide(base, _summary(45.0, 10.0, 180.0))["decision"] == "keep"
    worse_ttft = bench_report.decide(base, _summary(55.0, 10.0, 180.0))
    assert worse_ttft["decision"] == "roll_back"
    assert len(worse_ttft["reasons"]) == 1 and "median TTFT got worse" in worse_ttft["reasons"][0] and "+10.0%" in worse_ttft["reasons"][0]
    assert bench_report.decide(base, _summary(45.0, 21.0, 180.0))["reasons"][0].startswith("median TPOT")
    dropped = bench_report.decide(base, _summary(45.0, 10.0, 90.0))
    assert dropped["decision"] == "roll_back" and "output throughput dropped" in dropped["reasons"][0]
    all_bad = bench_report.decide(base, _summary(60.0, 30.0, 50.0))
    assert len(all_bad["reasons"]) == 3


def test_decision_tolerances():
    base = _summary(50.0, 20.0, 100.0)
    cand = _summary(52.0, 19.0, 120.0)  # TTFT 4% worse
    assert bench_report.decide(base, cand)["decision"] == "roll_back"
    assert bench_report.decide(base, cand, {"ttft": 0.05})["decision"] == "keep"
    assert bench_report.decide(base, _summary(45.0, 19.0, 97.0), {"throughput": 0.05})["decision"] == "keep"
    with pytest.raises(ValidationError, match="unknown tolerance"):
        bench_report.decide(base, cand, {"latency": 0.1})
    with pytest.raises(ValidationError, match="fraction"):
        bench_report.decide(base, cand, {"ttft": 5})


def test_decision_unmeasured_and_failures_roll_back():
    base = _summary(50.0, 20.0, 100.0)
    assert "not measured" in bench_report.decide(base, _summary(45.0, None, 120.0))["reasons"][0]
    failing = bench_report.decide(base, _summary(45.0, 10.0, 180.0, failed=2))
    assert failing["decision"] == "roll_back" and "failed 2 of 12" in failing["reasons"][0]


def test_prefix_cache_difference_is_flagged():
    notes = bench_report.prefix_cache_notes({"hits": 10, "queries": 100, "hit_rate": 0.10}, {"hits": 60, "queries": 100, "hit_rate": 0.60})
    assert any("differ" in n for n in notes)
    notes = bench_report.prefix_cache_notes(None, {"hits": 0, "queries": 10, "hit_rate": 0.0})
    assert any("baseline exposes no" in n for n in notes)


def _png_info(path):
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    # Walk the chunks and check every CRC: a valid PNG, not just a valid header.
    pos = 8
    kinds = []
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body) & 0xFFFFFFFF
        kinds.append(kind)
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    return width, height, len(data)


@pytest.mark.parametrize("use_matplotlib", [True, False])
def test_plots_are_valid_pngs(tmp_path, monkeypatch, use_matplotlib):
    if use_matplotlib and not bench_report.HAS_MATPLOTLIB:
        pytest.skip("matplotlib not installed")
    monkeypatch.setattr(bench_report, "HAS_MATPLOTLIB", use_matplotlib)
    _b, _c, base_rec, cand_rec = sides()
    lat = bench_report.plot_latency(base_rec, cand_rec, str(tmp_path / "lat.png"))
    acc = bench_report.plot_acceptance([0.7, 0.45, 0.25], str(tmp_path / "acc.png"))
    for path in (lat, acc):
        width, height, size = _png_info(path)
        assert width >= 300 and height >= 200 and size > 1000


def test_fallback_png_draws_both_series(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_report, "HAS_MATPLOTLIB", False)
    _b, _c, base_rec, cand_rec = sides()
    path = bench_report.plot_latency(base_rec, cand_rec, str(tmp_path / "lat.png"))
    with open(path, "rb") as handle:
        data = handle.read()
    idat = b"".join(data[i + 8:i + 8 + struct.unpack(">I", data[i:i + 4])[0]] for i in _chunk_offsets(data) if data[i + 4:i + 8] == b"IDAT")
    raw = zlib.decompress(idat)
    for color in bench_report.COLORS.values():
        assert bytes(color) in raw


def _chunk_offsets(data):
    pos = 8
    while pos < len(data):
        yield pos
        pos += 12 + struct.unpack(">I", data[pos:pos + 4])[0]


def test_acceptance_from_a_real_metrics_capture():
    """The module's acceptance block is spec_metrics' deltas: check it against the ngram capture's counters."""
    from ansible_collections.alauda.spec_decoding.plugins.modules import spec_benchmark
    path = os.path.join(CAPTURES, "ngram", "metrics.txt")
    if not os.path.exists(path):
        pytest.skip("captures not present")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    empty = "# no counters yet\n"
    acc = spec_benchmark._acceptance(empty, text, "t-ngram")
    # metrics.txt: drafts 254, draft tokens 1024, accepted 403, per position 155, 94, 75, 41, 38
    assert acc["num_drafts"] == 254 and acc["num_draft_tokens"] == 1024 and acc["num_accepted_tokens"] == 403
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 403 / 254)
    assert acc["acceptance_rate"] == pytest.approx(403 / 1024)
    assert acc["per_position"] == pytest.approx([155 / 254, 94 / 254, 75 / 254, 41 / 254, 38 / 254])
    assert spec_benchmark._acceptance(text, text, "t-ngram")["num_drafts"] == 0
    baseline_text = open(os.path.join(CAPTURES, "baseline", "metrics.txt"), encoding="utf-8").read()
    assert spec_benchmark._acceptance(baseline_text, baseline_text, "t-baseline") is None
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
    words = bench_report.command_words("vllm serve /m --dtype=half", None)
    assert bench_report.flag_value(words, "--dtype") == "half" and bench_report.flag_value(words, "--served-model-name") is None
    ctx = bench_report.build_context(dict(CONTEXT, model=None, dtype=None, candidate_command="vllm serve /mnt/models"), REQUEST)
    assert ctx["model"]["id"] is None and ctx["model"]["dtype"] is None  # `vllm serve X` positional: not guessed
    assert [label for label, _src in bench_report.missing_fields(ctx)] == ["Model: identifier", "Model: dtype"]
