"""--per-request-spec-decode-metrics per release: the render's option (auto / summary / detailed / off), the refusal on a
release without the flag, the speculative side only, the baseline twin and the rollback's strip without it, the report's
note when the candidate's release lacks it."""
import shlex
import subprocess

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import request_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import baseline_twin as bench_twin
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import render as llmisvc_render
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import twin as llmisvc_twin
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import cli_registry_releases
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import per_request_metrics as prm
from tests.module_run import run_module
from tests.unit.plugins.module_utils.test_bench_request_classes import _records
from tests.unit.plugins.module_utils.test_llmisvc import main_container, params as llmisvc_params

FLAG = "--per-request-spec-decode-metrics"
P = dict(name="llama-ngram", namespace="models", method="ngram", artifact_mode="pvc", artifacts={"pvc_name": "store"},
         runtime="aml-vllm", vllm_version="0.32.0", kserve_version="0.20.0", dtype="bfloat16", gpu_memory_utilization=0.9,
         max_model_len=2048, max_num_seqs=8, seed=42)


def _render(**over):
    return isvc.render(dict(P, **over))


def _argv(rendered):
    model = rendered["manifest"]["spec"]["predictor"]["model"]
    if "args" in model:
        return list(model["args"])
    return shlex.split(model["command"][2].replace("\\\n", " "))


def test_which_releases_have_the_flag():
    # the 0.32 option table, taken from vLLM 0.32's own parser, lists it with one value
    table = {dest: (nargs, names) for dest, nargs, names in cli_registry_releases.RELEASES["0.32"]["options"]}
    assert table[prm.DEST] == (None, (FLAG,))
    assert prm.release_has_flag("0.32.0") == (True, "0.32.0")
    assert prm.release_has_flag("0.33.1") == (True, "0.33.1")  # no table of its own: read as the newest table, as cli_parser does
    assert prm.release_has_flag("0.31.2") == (False, "0.31.2")
    assert prm.release_has_flag("0.24.0") == (False, "0.24.0")
    assert prm.release_has_flag(None)[0] is True  # not given: the newest release the collection knows


@pytest.mark.parametrize("style", ["bash", "args"])
def test_auto_renders_summary_on_a_release_with_the_flag(style, tmp_path):
    out = _render(command_style=style)
    argv = _argv(out)
    assert argv.count(FLAG) == 1 and argv[argv.index(FLAG) + 1] == "summary"
    # right before the speculative flag, so the strip leaves no gap
    assert argv[argv.index(FLAG) + 2] == "--speculative-config"
    assert out["per_request_metrics"] == {"mode": "summary", "note": None}
    if style == "bash":
        script = out["manifest"]["spec"]["predictor"]["model"]["command"][2]
        (tmp_path / "s.sh").write_text(script)
        assert subprocess.run(["bash", "-n", str(tmp_path / "s.sh")], check=False).returncode == 0


@pytest.mark.parametrize("mode", ["summary", "detailed"])
def test_an_explicit_mode_is_rendered(mode):
    argv = _argv(_render(per_request_metrics=mode, command_style="args"))
    assert argv[argv.index(FLAG) + 1] == mode


def test_off_renders_nothing():
    out = _render(per_request_metrics="off", command_style="args")
    assert FLAG not in _argv(out) and out["per_request_metrics"] == {"mode": None, "note": None}
    assert _argv(out)[-2] == "--speculative-config"


def test_auto_on_a_release_without_the_flag_renders_nothing_and_says_so():
    out = _render(vllm_version="0.24.0", command_style="args")
    assert FLAG not in _argv(out) and "--speculative-config" in _argv(out)
    assert out["per_request_metrics"]["mode"] is None
    note = out["per_request_metrics"]["note"]
    assert "vLLM 0.24.0 has no %s" % FLAG in note and "from vLLM 0.32" in note and "one benchmark run per class" in note


@pytest.mark.parametrize("mode", ["summary", "detailed"])
def test_an_explicit_mode_on_a_release_without_the_flag_is_refused(mode):
    with pytest.raises(ValidationError) as err:
        _render(vllm_version="0.31.0", per_request_metrics=mode)
    assert err.value.field == "per_request_metrics"
    assert "role variable spec_decoding_per_request_metrics" in err.value.message
    assert "vLLM 0.31.0 has no %s" % FLAG in err.value.message and "Nothing was written" in err.value.message
    assert "spec_decoding_per_request_metrics to auto or off" in err.value.hint and "0.32 or newer" in err.value.hint


def test_the_baseline_never_carries_it():
    assert FLAG not in _argv(_render(method="none", command_style="args"))
    out = _render(method="none", per_request_metrics="detailed", command_style="args")
    assert FLAG not in _argv(out) and out["per_request_metrics"]["mode"] is None
    assert "vLLM refuses %s without --speculative-config" % FLAG in out["per_request_metrics"]["note"]


def test_extra_args_that_set_it_win_over_auto_and_clash_with_a_mode():
    out = _render(extra_args=[FLAG, "detailed"], command_style="args")
    assert _argv(out).count(FLAG) == 1 and "extra_args" in out["per_request_metrics"]["note"]
    with pytest.raises(ValidationError) as err:
        _render(extra_args=["--per_request_spec_decode_metrics=detailed"], per_request_metrics="summary")
    assert err.value.field == "per_request_metrics" and "spec_decoding_extra_args" in err.value.hint
    with pytest.raises(ValidationError) as err:
        _render(per_request_metrics="sometimes")
    assert err.value.field == "per_request_metrics" and "auto, summary, detailed, off" in err.value.hint


def test_the_module_returns_what_it_rendered():
    args = dict(P, gpu_count=0, vllm_version="0.24.0")
    out = run_module("isvc_manifest", args)
    assert not out.failed, out.msg
    assert out["per_request_metrics"]["mode"] is None and "0.24.0" in out["per_request_metrics"]["note"]
    refused = run_module("isvc_manifest", dict(args, per_request_metrics="summary"))
    assert refused.failed and "spec_decoding_per_request_metrics" in refused.msg
    out = run_module("isvc_manifest", dict(args, vllm_version="0.32.0", command_style="args"))
    assert out["per_request_metrics"] == {"mode": "summary", "note": None}
    assert out["manifest"]["spec"]["predictor"]["model"]["args"][-4:-2] == [FLAG, "summary"]


@pytest.mark.parametrize("style", ["bash", "args"])
def test_the_baseline_twin_and_the_rollback_strip_take_it_with_the_speculative_flag(style):
    # vLLM 0.32 vllm/config/vllm.py VllmConfig.__post_init__ refuses the flag without a speculative config: the server of a
    # twin or a rolled-back service that kept it would not start
    candidate = _render(command_style=style)["manifest"]
    baseline = _render(command_style=style, method="none")["manifest"]
    twin = bench_twin.baseline_twin(candidate)
    twin_model, base_model = twin["spec"]["predictor"]["model"], baseline["spec"]["predictor"]["model"]
    assert FLAG not in _argv({"manifest": twin}) and "--speculative-config" not in _argv({"manifest": twin})
    # byte for byte the baseline's render: nothing else moved
    assert twin_model.get("command") == base_model.get("command") and twin_model.get("args") == base_model.get("args")
    # the rollback's own strip (the same editor) and a set that keeps the anchor
    model = candidate["spec"]["predictor"]["model"]
    words = model.get("args") or model["command"]
    assert FLAG not in " ".join(command_edit.strip_checked(words, model["env"]))
    new_json = '{"method":"ngram","num_speculative_tokens":3}'
    kept = command_edit.set_speculative_config(list(words), new_json)
    assert FLAG in " ".join(kept) and new_json in " ".join(kept)


def test_a_command_without_a_speculative_flag_is_left_as_it_is():
    words = ["vllm", "serve", "m", FLAG, "summary", "--seed", "1"]
    assert command_edit.strip_speculative_config(words) == words
    script = "set -e\nexec vllm serve m \\\n  %s summary \\\n  --seed 1\n" % FLAG
    assert command_edit.strip_script(script) == script


def test_the_strip_keeps_the_script_valid_wherever_the_flag_stands(tmp_path):
    script = ("exec python3 -m vllm.entrypoints.openai.api_server \\\n  --port 8080 \\\n  --per_request_spec_decode_metrics=detailed \\\n"
              "  --speculative-config '{\"method\":\"ngram\"}' \\\n  --seed 1\n")
    out = command_edit.strip_script(script)
    assert out == "exec python3 -m vllm.entrypoints.openai.api_server \\\n  --port 8080 \\\n  --seed 1\n"
    argv = ["vllm", "serve", "m", FLAG, "detailed", "--speculative-config", "{}", "--seed", "1", FLAG + "=summary"]
    assert command_edit.strip_speculative_config(argv) == ["vllm", "serve", "m", "--seed", "1"]


def test_llminferenceservice_decode_pool_only_and_its_twin():
    obj = llmisvc_render.render(llmisvc_params(llmisvc={"prefill": {"replicas": 1}}))
    decode, prefill = main_container(obj["manifest"])["command"], main_container(obj["manifest"], "prefill")["command"]
    assert FLAG + " summary" in decode[-1] and FLAG not in prefill[-1]
    assert obj["per_request_metrics"] == {"mode": "summary", "note": None}
    twin = llmisvc_twin.baseline_twin(obj["manifest"])
    assert main_container(twin)["command"] == prefill and vllm_command.find_speculative_config(main_container(twin)["command"]) is None
    old = llmisvc_render.render(llmisvc_params(vllm_version="0.24.0"))
    assert FLAG not in main_container(old["manifest"])["command"][-1] and "0.24.0" in old["per_request_metrics"]["note"]
    with pytest.raises(ValidationError) as err:
        llmisvc_render.render(llmisvc_params(vllm_version="0.24.0", per_request_metrics="detailed"))
    assert err.value.field == "per_request_metrics"


def _report(vllm_version):
    baseline = {"records": _records("code", 0.020) + _records("chat", 0.020)}
    candidate = {"records": _records("code", 0.011) + _records("chat", 0.021)}  # no per-request block in any response
    for side in (baseline, candidate):
        side.update(url="http://x", model="m", api="chat", warmup={}, prefix_cache=None,
                    summary=bench_stats.summarize_run(side["records"], 10.0))
    context = {"hardware": {"gpu_model": "cpu", "gpu_count": 0}, "model": {"id": "m", "dtype": "bf16"},
               "runtime": {"vllm_version": vllm_version, "image": "i"}, "commands": {"baseline": ["vllm"], "candidate": ["vllm"]},
               "request": {"concurrency": 1, "request_rate": None}}
    acceptance = {"num_drafts": 5, "num_draft_tokens": 15, "num_accepted_tokens": 7, "counter_reset": False}
    return bench_report.build_report(baseline, candidate, context, acceptance=acceptance)


def test_the_report_says_when_the_candidates_release_lacks_the_flag():
    report = _report("0.24.0")
    block = report["classes"]
    assert [e["acceptance"]["note"].startswith("not reported: the candidate runs vLLM 0.24.0, which has no %s" % FLAG)
            for e in block["classes"]] == [True, True]
    assert "0.24.0" in block["counters_check"]["reason"] and any("vLLM 0.24.0" in n for n in report["notes"])
    assert "one benchmark per class" in bench_report.render_markdown(report)
    # a release with the flag: the generic reason (the flag off, n > 1, streams without usage), never the release's
    block = _report("0.32.0")["classes"]
    assert all(e["acceptance"]["note"] == request_classes.NOT_REPORTED for e in block["classes"])
    assert request_classes.release_note("not a version") is None and request_classes.release_note(None) is None
