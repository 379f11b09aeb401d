"""vllm_command: vLLM's legacy (pre-0.10) speculative flags are found, named and removed exactly.

Each case is a command shape from a published manifest, README or script (source named per case); the expected
result is the same command written without the flag and its value, so every other byte must be unchanged.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit as ve
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

BASH = shutil.which("bash")
API = ["python3", "-m", "vllm.entrypoints.openai.api_server"]

# (source, argv list, expected list, {flag: value} the legacy flags found)
ARGV_CASES = [
    # vLLM docs 0.6 spec_decode.md, "Speculating with a draft model" (server example, underscore spelling)
    ("vllm docs 0.6 spec_decode.md draft model",
     API + ["--host", "localhost", "--port", "8000", "--model", "facebook/opt-6.7b", "--seed", "42", "-tp", "1",
            "--speculative_model", "facebook/opt-125m", "--use-v2-block-manager", "--num_speculative_tokens", "5",
            "--gpu_memory_utilization", "0.8"],
     API + ["--host", "localhost", "--port", "8000", "--model", "facebook/opt-6.7b", "--seed", "42", "-tp", "1",
            "--use-v2-block-manager", "--gpu_memory_utilization", "0.8"],
     {"--speculative-model": "facebook/opt-125m", "--num-speculative-tokens": "5"}),
    # vLLM docs 0.6 spec_decode.md, "Speculating by matching n-grams in the prompt" as CLI flags
    ("vllm docs 0.6 spec_decode.md ngram",
     ["vllm", "serve", "facebook/opt-6.7b", "--speculative-model", "[ngram]", "--num-speculative-tokens", "5",
      "--ngram-prompt-lookup-max", "4", "--use-v2-block-manager"],
     ["vllm", "serve", "facebook/opt-6.7b", "--use-v2-block-manager"],
     {"--speculative-model": "[ngram]", "--num-speculative-tokens": "5", "--ngram-prompt-lookup-max": "4"}),
    # KServe huggingfaceserver README / kserve website docs: the runtime passes --key=value args through to vLLM
    ("KServe huggingfaceserver README args, =value",
     ["--model_name=llama3", "--model_id=meta-llama/meta-llama-3-8b-instruct", "--speculative_model=/mnt/models/draft",
      "--num_speculative_tokens=5"],
     ["--model_name=llama3", "--model_id=meta-llama/meta-llama-3-8b-instruct"],
     {"--speculative-model": "/mnt/models/draft", "--num-speculative-tokens": "5"}),
    # KServe huggingfaceserver README args, dash spelling with separate value items
    ("KServe huggingfaceserver README args, separate items",
     ["--model_name=llama3", "--model_id=meta-llama/meta-llama-3-8b-instruct", "--speculative-model",
      "meta-llama/Llama-3.2-1B-Instruct", "--num-speculative-tokens", "4", "--max-model-len", "8192"],
     ["--model_name=llama3", "--model_id=meta-llama/meta-llama-3-8b-instruct", "--max-model-len", "8192"],
     {"--speculative-model": "meta-llama/Llama-3.2-1B-Instruct", "--num-speculative-tokens": "4"}),
    # KNU-PLML-Lab/ViewPlasticSurgeonBot README: vllm serve with underscore flags (split into argv)
    ("KNU-PLML-Lab README vllm serve 4090x4",
     ["vllm", "serve", "--host", "0.0.0.0", "Qwen/Qwen2.5-72B-Instruct-AWQ", "--speculative_model",
      "Qwen/Qwen2.5-14B-Instruct-AWQ", "--num_speculative_tokens", "16", "--gpu_memory_utilization", "0.95",
      "--tensor-parallel-size", "4", "--max_model_len", "8192"],
     ["vllm", "serve", "--host", "0.0.0.0", "Qwen/Qwen2.5-72B-Instruct-AWQ", "--gpu_memory_utilization", "0.95",
      "--tensor-parallel-size", "4", "--max_model_len", "8192"],
     {"--speculative-model": "Qwen/Qwen2.5-14B-Instruct-AWQ", "--num-speculative-tokens": "16"}),
    # vLLM 0.6 arg_utils: -spec-draft-tp alias and --speculative-draft-tensor-parallel-size
    ("vllm 0.6 arg_utils -spec-draft-tp alias",
     API + ["--model", "/mnt/models", "--speculative-model", "/mnt/models/draft", "-spec-draft-tp", "1",
            "--num-speculative-tokens", "3", "--tensor-parallel-size", "2"],
     API + ["--model", "/mnt/models", "--tensor-parallel-size", "2"],
     {"--speculative-model": "/mnt/models/draft", "--speculative-draft-tensor-parallel-size": "1", "--num-speculative-tokens": "3"}),
    ("vllm 0.6 arg_utils --speculative-draft-tensor-parallel-size",
     API + ["--model", "/mnt/models", "--speculative_draft_tensor_parallel_size=1", "--speculative-model=/d", "--num-speculative-tokens=3"],
     API + ["--model", "/mnt/models"],
     {"--speculative-draft-tensor-parallel-size": "1", "--speculative-model": "/d", "--num-speculative-tokens": "3"}),
    # vLLM docs 0.6 spec_decode.md (MLP speculator / EAGLE drafts) with --speculative-max-model-len and batch-size cut-off
    ("vllm 0.6 engine args: max model len + disable by batch size",
     ["vllm", "serve", "/mnt/models", "--speculative-model", "/mnt/models/eagle", "--num-speculative-tokens", "2",
      "--speculative-max-model-len", "2048", "--speculative-disable-by-batch-size", "4", "--port", "8080"],
     ["vllm", "serve", "/mnt/models", "--port", "8080"],
     {"--speculative-model": "/mnt/models/eagle", "--num-speculative-tokens": "2", "--speculative-max-model-len": "2048",
      "--speculative-disable-by-batch-size": "4"}),
    # vLLM docs 0.6 spec_decode.md: typical acceptance sampler knobs
    ("vllm 0.6 spec_decode.md typical acceptance sampler",
     ["vllm", "serve", "/m", "--speculative-model", "/d", "--num-speculative-tokens", "3", "--spec-decoding-acceptance-method",
      "typical_acceptance_sampler", "--typical-acceptance-sampler-posterior-threshold", "0.09",
      "--typical-acceptance-sampler-posterior-alpha=0.3"],
     ["vllm", "serve", "/m"],
     {"--speculative-model": "/d", "--num-speculative-tokens": "3", "--spec-decoding-acceptance-method": "typical_acceptance_sampler",
      "--typical-acceptance-sampler-posterior-threshold": "0.09", "--typical-acceptance-sampler-posterior-alpha": "0.3"}),
    # vLLM 0.6 arg_utils: store_true --speculative-disable-mqa-scorer takes NO value: the next word stays
    ("vllm 0.6 arg_utils store_true mqa scorer",
     ["vllm", "serve", "/m", "--speculative-model", "/d", "--speculative-disable-mqa-scorer", "/extra-positional-stays"],
     ["vllm", "serve", "/m", "/extra-positional-stays"],
     {"--speculative-model": "/d", "--speculative-disable-mqa-scorer": True}),
    # vLLM 0.6 arg_utils: StoreBoolean nargs='?': the next word is taken only when it is true/false
    ("vllm 0.6 arg_utils --disable-logprobs-during-spec-decoding with value",
     ["vllm", "serve", "/m", "--disable-logprobs-during-spec-decoding", "False", "--port", "8080", "--speculative-model", "/d"],
     ["vllm", "serve", "/m", "--port", "8080"],
     {"--disable-logprobs-during-spec-decoding": "False", "--speculative-model": "/d"}),
    ("vllm 0.6 arg_utils --disable-logprobs-during-spec-decoding bare",
     ["vllm", "serve", "/m", "--disable-logprobs-during-spec-decoding", "--port", "8080"],
     ["vllm", "serve", "/m", "--port", "8080"],
     {"--disable-logprobs-during-spec-decoding": True}),
    # vLLM 0.6 engine args: quantized draft
    ("vllm 0.6 engine args --speculative-model-quantization",
     ["vllm", "serve", "/m", "--quantization", "awq", "--speculative-model", "/d", "--speculative_model_quantization", "awq",
      "--num-speculative-tokens", "4"],
     ["vllm", "serve", "/m", "--quantization", "awq"],
     {"--speculative-model": "/d", "--speculative-model-quantization": "awq", "--num-speculative-tokens": "4"}),
    # --num-lookahead-slots is a scheduler flag (exists without speculative decoding): left alone
    ("vllm 0.6 engine args --num-lookahead-slots stays",
     ["vllm", "serve", "/m", "--num-lookahead-slots", "4", "--speculative-model", "[ngram]", "--ngram-prompt-lookup-min", "2"],
     ["vllm", "serve", "/m", "--num-lookahead-slots", "4"],
     {"--speculative-model": "[ngram]", "--ngram-prompt-lookup-min": "2"}),
]

# (source, script, expected script, {flag: value})
SCRIPT_CASES = [
    # aurickq/vllm run.sh: backslash-continued CLI with '[ngram]' quoted
    ("aurickq/vllm run.sh continuation lines",
     "exec python3 -m vllm.entrypoints.openai.api_server \\\n    --model /mnt/models \\\n    --enforce-eager \\\n"
     "    --speculative-model '[ngram]' \\\n    --num-speculative-tokens 5 \\\n    --ngram-prompt-lookup-max 4 \\\n"
     "    --port 8080\n",
     "exec python3 -m vllm.entrypoints.openai.api_server \\\n    --model /mnt/models \\\n    --enforce-eager \\\n"
     "    --port 8080\n",
     {"--speculative-model": "[ngram]", "--num-speculative-tokens": "5", "--ngram-prompt-lookup-max": "4"}),
    # aurickq/vllm run.sh shape with the flags on the last continued lines
    ("aurickq/vllm run.sh, flags last",
     "vllm serve /mnt/models \\\n  --max-num-seqs 8 \\\n  --speculative-model '[ngram]' \\\n  --num-speculative-tokens 5\n",
     "vllm serve /mnt/models \\\n  --max-num-seqs 8\n",
     {"--speculative-model": "[ngram]", "--num-speculative-tokens": "5"}),
    # KNU-PLML-Lab README one-liner with env prefix, in a bash -c script
    ("KNU-PLML-Lab README one-liner",
     'CUDA_VISIBLE_DEVICES="3" vllm serve --host 0.0.0.0 Qwen/Qwen2.5-14B-Instruct-AWQ  --speculative_model Qwen/Qwen2.5-7B-Instruct-AWQ '
     '--num_speculative_tokens 16 --gpu_memory_utilization 0.95 --tensor-parallel-size 1 --max_model_len 8192',
     'CUDA_VISIBLE_DEVICES="3" vllm serve --host 0.0.0.0 Qwen/Qwen2.5-14B-Instruct-AWQ --gpu_memory_utilization 0.95 '
     '--tensor-parallel-size 1 --max_model_len 8192',
     {"--speculative-model": "Qwen/Qwen2.5-7B-Instruct-AWQ", "--num-speculative-tokens": "16"}),
    # KServe docs (vLLM runtime examples) bash -c start script with =value spelling and "$@"
    ("KServe vLLM runtime bash -c with =value and \"$@\"",
     'python3 -m vllm.entrypoints.openai.api_server --port 8080 --model /mnt/models --speculative-model=/mnt/models/draft '
     '--num-speculative-tokens=3 "$@"',
     'python3 -m vllm.entrypoints.openai.api_server --port 8080 --model /mnt/models "$@"',
     {"--speculative-model": "/mnt/models/draft", "--num-speculative-tokens": "3"}),
    # vLLM 0.6 benchmarks/launch scripts: draft path from an env var, double-quoted
    ("vllm 0.6 benchmark launch script with $DRAFT",
     'set -e\nvllm serve "$MODEL" --speculative-model "$DRAFT" --num-speculative-tokens "${K:-5}" --port 8080 # spec\n',
     'set -e\nvllm serve "$MODEL" --port 8080 # spec\n',
     {"--speculative-model": '"$DRAFT"', "--num-speculative-tokens": '"${K:-5}"'}),
    # vLLM 0.6 spec_decode.md MQA scorer note, in a multi-line script with the store_true flag on its own continued line
    ("vllm 0.6 spec_decode.md mqa scorer, continued line",
     "vllm serve /m \\\n  --speculative-model /d \\\n  --speculative-disable-mqa-scorer \\\n  --port 8080\n",
     "vllm serve /m \\\n  --port 8080\n",
     {"--speculative-model": "/d", "--speculative-disable-mqa-scorer": True}),
    # KServe huggingfaceserver README: python -m huggingfaceserver with --key=value args in a shell script
    ("KServe huggingfaceserver README python -m huggingfaceserver",
     "python -m huggingfaceserver --model_id=meta-llama/meta-llama-3-8b-instruct --model_name=llama3 "
     "--speculative_model=meta-llama/Llama-3.2-1B-Instruct --num_speculative_tokens=4",
     "python -m huggingfaceserver --model_id=meta-llama/meta-llama-3-8b-instruct --model_name=llama3",
     {"--speculative-model": "meta-llama/Llama-3.2-1B-Instruct", "--num-speculative-tokens": "4"}),
]


@pytest.mark.parametrize("source, items, expected, legacy", ARGV_CASES, ids=[c[0] for c in ARGV_CASES])
def test_legacy_argv_detected_and_removed(source, items, expected, legacy):
    occ = vc.find_occurrences(items)
    assert vc.legacy_flags(occ) == legacy, source
    assert vc.has_speculative_config(items)
    assert ve.strip_speculative_config(items) == expected
    assert vc.find_occurrences(expected) == []


@pytest.mark.parametrize("source, script, expected, legacy", SCRIPT_CASES, ids=[c[0] for c in SCRIPT_CASES])
def test_legacy_script_detected_and_removed(source, script, expected, legacy):
    items = ["/bin/bash", "-c", script]
    occ = vc.find_occurrences(items)
    assert {o.form for o in occ} <= {"script", "script_inline"}
    assert vc.legacy_flags(occ) == legacy, source
    assert ve.strip_speculative_config(items) == ["/bin/bash", "-c", expected]
    assert vc.find_occurrences(["/bin/bash", "-c", expected]) == []


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize("source, script, expected, legacy", SCRIPT_CASES, ids=[c[0] for c in SCRIPT_CASES])
def test_legacy_stripped_script_is_valid_bash(source, script, expected, legacy):
    del source, expected, legacy
    stripped = ve.strip_speculative_config(["bash", "-c", script])[2]
    assert subprocess.run([BASH, "-n", "-c", stripped], check=False).returncode == 0


def test_legacy_element_holding_flag_and_value_is_dropped():
    # a published-manifest mistake (KServe issues): "--speculative_model /d" as ONE args element
    items = ["--model_name=m", "--speculative_model /d", "--num_speculative_tokens 5", "--port=8080"]
    assert ve.strip_speculative_config(items) == ["--model_name=m", "--port=8080"]


def test_not_speculative_left_alone():
    items = ["vllm", "serve", "/models/x--speculative-model-y", "--served-model-name", "speculative-model",
             "--num-lookahead-slots", "2", "--max-model-len", "4096"]
    assert vc.find_occurrences(items) == []
    assert ve.strip_speculative_config(items) == items


def test_legacy_value_never_swallows_the_next_option():
    # argparse refuses an option as the value; the next option stays
    assert ve.strip_speculative_config(["vllm", "serve", "/m", "--speculative-model", "--port", "8080"]) == \
        ["vllm", "serve", "/m", "--port", "8080"]


def test_config_refuses_legacy_naming_flags_and_fix():
    items = ["vllm", "serve", "/m", "--speculative-model", "[ngram]", "--num-speculative-tokens", "5", "--ngram-prompt-lookup-max", "4"]
    with pytest.raises(ValidationError) as err:
        vc.find_speculative_config(items)
    msg = str(err.value)
    assert "--speculative-model, --num-speculative-tokens, --ngram-prompt-lookup-max" in msg
    assert '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}' in msg


def test_removed_flags_come_from_the_registry():
    assert core.REMOVED_FLAGS == {name: spec.replacement for name, spec in vc.LEGACY_FLAGS.items()}
    assert "--num-lookahead-slots" not in core.REMOVED_FLAGS
    # the deploy refuses the underscore spelling too, naming the registry name
    with pytest.raises(ValidationError, match="--speculative-model"):
        core.check_command(["bash", "-c", "vllm serve /m --speculative_model=/d"])


def test_set_config_replaces_legacy_flags():
    items = ["vllm", "serve", "/m", "--speculative-model", "[ngram]", "--num-speculative-tokens", "5"]
    out = ve.set_speculative_config(items, '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}')
    assert out == ["vllm", "serve", "/m", "--speculative-config", '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}']


def _isvc(args, command=None):
    model = {"modelFormat": {"name": "huggingface"}, "args": args}
    if command is not None:
        model["command"] = command
    return {"metadata": {"name": "m", "namespace": "ns", "generation": 3, "resourceVersion": "7"},
            "spec": {"predictor": {"model": model}}}


def test_plan_strip_legacy_backup_and_refused_restore():
    args = ["--model_name=llama3", "--speculative_model=/mnt/models/draft", "--num_speculative_tokens=5"]
    isvc = _isvc(args)
    plan = isvc_patch.plan_strip(isvc)
    assert plan.changed and plan.containers == ["model"]
    assert plan.legacy_flags == {"--speculative-model": "/mnt/models/draft", "--num-speculative-tokens": "5"}
    assert plan.previous_config is None
    doc = isvc_patch.backup_document(isvc, plan)
    assert doc["legacy_flags"] == plan.legacy_flags and doc["containers"]["/spec/predictor/model"]["args"] == args
    after = isvc_patch.apply_patch(isvc, isvc_patch.build_patch(isvc, plan))
    assert after["spec"]["predictor"]["model"]["args"] == ["--model_name=llama3"]
    assert isvc_patch.plan_strip(after).changed is False
    with pytest.raises(ValidationError) as err:
        isvc_patch.plan_restore(after, doc)
    assert "--speculative-model" in str(err.value) and '"model":"/mnt/models/draft"' in str(err.value)
