"""``alauda.spec_decoding.spec_sweep`` with a classed prompts file, in-process against paced loopback servers (the wiring of
bench/sweep_classes.py: per-class figures kept at each measurement, the per-class break-even, the report's section, JSON and
plot). Every class is paced alike here, so each class's break-even brackets the same built-in crossing as the service-wide
one; the statistics themselves are tests/unit/plugins/module_utils/test_sweep_classes.py."""
import json

import pytest

from tests.loopback_http import serving
from tests.module_run import run_module
from tests.paced_server import paced_handler
from tests.png_file import check_png

GAP = 0.010
CONTEXT = {"gpu_model": "none (paced loopback server)", "gpu_count": 0, "model": "paced", "dtype": "none", "vllm_version": "none",
           "image": "none", "baseline_command": ["paced-sse"],
           "candidate_command": ["paced-sse", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']}


@pytest.fixture(scope="module")
def paced():
    # the candidate's chunk gap is GAP * (0.5 + 0.25 * (in_flight - 1)): faster at 1 request in flight, slower at 4
    base = paced_handler("paced-base", 0.020, GAP)
    cand = paced_handler("paced-ngram", 0.010, GAP, lambda n: 0.5 + 0.25 * (max(n, 1) - 1), spec_rates=[0.9, 0.1, 0.05])
    with serving(base) as b_url, serving(cand) as c_url:
        yield b_url, c_url


def test_a_classed_sweep_reports_each_class(paced, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "p%d " % i * 5, "class": name}) + "\n" for i, name in enumerate(("code", "chat"))))
    args = {"baseline_url": paced[0], "candidate_url": paced[1], "concurrencies": [1, 4], "prompts_file": str(prompts),
            "runs_per_prompt": 6, "warmup": 3, "max_tokens": 8, "temperature": 0.0, "seed": 0, "report_dir": str(tmp_path / "r"),
            "report_context": CONTEXT, "method": "ngram"}
    out = run_module("spec_sweep", args)
    assert not out.failed, out.msg
    block = out["classes"]
    assert block["kind"] == "concurrency" and block["target_qps"] is None
    assert [e["class"] for e in block["classes"]] == ["chat", "code"]
    for entry in block["classes"]:
        assert [row["requests"]["candidate"]["completed"] for row in entry["loads"]] == [6, 6]
        assert [row["decision"] for row in entry["loads"]] == ["keep", "roll_back"], entry["loads"]
        assert entry["break_even"]["status"] == "crossed" and abs(entry["break_even"]["crossover_load"] - 3.0) <= 1.0  # built in: 3
        assert entry["guard"] is None  # no target_qps, no guard
        # the paced server sends no metrics.speculative_decoding: not reported, nothing estimated
        assert all(row["acceptance"]["reported"] == 0 for row in entry["loads"])
    saved = json.load(open(out["report_json"], encoding="utf-8"))
    assert all({e["class"] for e in m["classes"]} == {"chat", "code"} for m in saved["measurements"])
    md = open(out["report_markdown"], encoding="utf-8").read()
    assert "## Per request class" in md and "| `code` | 1 | 6 / 6 | not reported | not reported |" in md
    assert check_png(out["plots"]["classes"])[:2] == (800, 450)
    assert "per class: chat about" in open(out["progress_file"], encoding="utf-8").read()
    # resumed from its JSON: nothing measured again, the classes' figures come back from the summaries it kept
    again = run_module("spec_sweep", dict(args, resume_from=out["report_json"], report_dir=str(tmp_path / "again")))
    assert not again.failed, again.msg
    assert again["measured"] == 0 and again["classes"]["classes"] == block["classes"]
    # the classes are part of the prompts' identity: the same texts classed otherwise do not resume that sweep
    prompts.write_text("".join(json.dumps({"prompt": "p%d " % i * 5, "class": name}) + "\n" for i, name in enumerate(("chat", "code"))))
    other = run_module("spec_sweep", dict(args, resume_from=out["report_json"], report_dir=str(tmp_path / "other")))
    assert other.failed and other["field"] == "resume_from" and "prompts_sha256" in other.msg
    print("\nper class: %s" % "; ".join("%s %s" % (e["class"], e["break_even_text"]) for e in block["classes"]))
