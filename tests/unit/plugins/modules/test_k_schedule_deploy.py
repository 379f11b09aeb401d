"""The k schedule through the deploy path: ``isvc_manifest`` (what roles/inference_service renders with
``inference_service_speculative``) carries num_speculative_tokens_per_batch_size in the rendered --speculative-config
for vLLM 0.24 and newer, and refuses it before, naming the field and the fix. In-process module runs."""
import json

import pytest

from tests.module_run import run_module

SCHEDULE = [[2, 64, 1], [1, 1, 3]]  # unsorted, as a user may write it; vLLM sorts it
ARGS = dict(name="llama-draft", namespace="models", method="draft_model", artifact_mode="pvc", artifacts={"pvc_name": "store"},
            runtime="aml-vllm-0.32.0", kserve_version="0.20.0", command_style="args",
            speculative={"num_speculative_tokens_per_batch_size": SCHEDULE})


def rendered_config(result):
    args = result["manifest"]["spec"]["predictor"]["model"]["args"]
    return json.loads(args[args.index("--speculative-config") + 1])


@pytest.mark.parametrize("version", ["0.24.0", "0.32.0"])
def test_the_rendered_speculative_config_carries_the_schedule(version):
    result = run_module("isvc_manifest", dict(ARGS, vllm_version=version))
    assert not result.failed, result.msg
    config = rendered_config(result)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 64, 1]]
    assert config["num_speculative_tokens"] == 3 and config["method"] == "draft_model"
    assert json.loads(result["speculative_json"]) == config


def test_a_release_before_0_24_is_refused_naming_the_field_and_the_fix():
    result = run_module("isvc_manifest", dict(ARGS, vllm_version="0.23.0"))
    assert result.failed
    assert result["field"] == "speculative.num_speculative_tokens_per_batch_size"
    assert "was added in vLLM 0.24 (you target 0.23.0)" in result.msg
    assert result["fix"] == "upgrade the runtime image to vLLM 0.24 or newer, or drop it"


def test_a_schedule_vllm_would_refuse_at_start_up_is_refused_before_the_rollout():
    result = run_module("isvc_manifest", dict(ARGS, vllm_version="0.32.0", speculative={"num_speculative_tokens_per_batch_size": [[1, 8, 3], [8, 64, 1]]}))
    assert result.failed and result["field"] == "speculative.num_speculative_tokens_per_batch_size"
    assert "overlap" in result.msg and result["fix"] == "start the second range at 9"


@pytest.mark.parametrize("extra_args", [["--data-parallel-size", "2"], ["-dp=4"]])
def test_a_schedule_with_data_parallelism_warns_that_vllm_drops_it(extra_args):
    """vLLM 0.32 (vllm/config/vllm.py, _maybe_disable_dynamic_sd_for_data_parallel) drops the schedule when the data-parallel
    size is above 1 and drafts the fixed k: rendered, with a warning naming the key and the size."""
    result = run_module("isvc_manifest", dict(ARGS, vllm_version="0.32.0", extra_args=extra_args))
    assert not result.failed, result.msg
    assert "num_speculative_tokens_per_batch_size" in rendered_config(result)
    size = extra_args[-1].split("=")[-1]
    notes = [w for w in warning_texts(result) if "data-parallel size %s" % size in w]
    assert len(notes) == 1 and notes[0].startswith("speculative.num_speculative_tokens_per_batch_size:"), result["warnings"]
    plain = run_module("isvc_manifest", dict(ARGS, vllm_version="0.32.0", extra_args=["--data-parallel-size", "1"]))
    assert not [w for w in warning_texts(plain) if "data-parallel" in w]


def warning_texts(result):
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings") or []]
