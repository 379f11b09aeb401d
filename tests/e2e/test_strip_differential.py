"""The rollback's strip held to the installed vLLM's own parser (a differential test, no server).

A few hundred vLLM start commands are generated from parts (seeded, so a failure repeats): argv lists and ``bash -c``
scripts, ``vllm serve`` and the api_server module, with and without speculative settings in every form vLLM 0.32's
parser accepts (``--speculative-config`` / ``=`` / ``_``, ``-sc``, abbreviations ``--speculative`` ``--spec-tok``, the
``--spec-*`` flags, dotted keys ``-sc.method`` ``--speculative.num_speculative_tokens``, a JSON replaced by dotted keys),
beside options that must survive (a multi-value ``--served-model-name``, a JSON value holding a flag's name, ``echo``
and a prefetch script carrying the same words, variables from the pod spec's env) and constructs the strip must refuse
(eval, ``${VAR:+...}``, variables not in the pod spec, a multi-value option before the positional model).

Each command is stripped by the collection (``command_edit.strip_checked`` with the pod spec's env, what the rollback
runs). Scripts are run by bash and by dash with stubs of ``vllm`` and ``python3`` on PATH that record the argv they
get; the argv before and after the strip is parsed by vLLM's own parser (the ``serve`` subcommand of ``vllm``'s CLI,
or the api_server's ``make_arg_parser``) in the vLLM venv (a fork of the session's preloaded vLLM,
tests/e2e/vllm_preload.py). Asserted: zero commands left speculative, zero other fields changed, zero broken, commands
without speculative settings returned byte-identical, and every refusal one the generator planted, with a construct
tests/e2e/data/strip_refusals.yaml accepts.
"""

import json
import os
import random
import shlex
import shutil
import subprocess
import textwrap
import time

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import cli_parser
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit

from tests.paths import REPO

pytestmark = pytest.mark.e2e

SEED = 49
CASES = 320
REFUSALS = os.path.join(REPO, "tests", "e2e", "data", "strip_refusals.yaml")
SHELLS = ("bash", "dash")

# Runs in the vLLM venv: parse each argv as vLLM 0.32 does, print the namespaces (or the error) as JSON.
PARSE = textwrap.dedent('''
    import contextlib, io, json, sys, logging
    logging.disable(logging.CRITICAL)
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def jsonable(value):
        try:
            json.dumps(value)
            return value
        except TypeError:
            return repr(value)

    def parser_for(entry):
        if entry == "serve":
            # vllm/entrypoints/cli/main.py main and cli/serve.py ServeSubcommand.subparser_init, without importing the
            # server (cli.serve imports the engine: 12 s more here)
            top = FlexibleArgumentParser(description="vLLM CLI")
            top.add_argument("-v", "--version", action="version", version="0.32.0")
            subparsers = top.add_subparsers(required=False, dest="subparser")
            make_arg_parser(subparsers.add_parser("serve", usage="vllm serve [model_tag] [options]"))
            return top
        return make_arg_parser(FlexibleArgumentParser())  # vllm/entrypoints/launchers/api_server/entry.py main

    parsers = {entry: parser_for(entry) for entry in ("serve", "api_server")}  # built once: parse_args keeps no state
    out = []
    for entry, argv in json.load(sys.stdin):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parsers[entry].parse_args((["serve"] if entry == "serve" else []) + argv)
            out.append({"ok": True, "ns": {k: jsonable(v) for k, v in sorted(vars(ns).items()) if k != "dispatch_function"}})
        except SystemExit:
            out.append({"ok": False, "error": err.getvalue().strip().splitlines()[-1:]})
        except Exception as exc:  # vLLM raises ValueError for some command lines
            out.append({"ok": False, "error": ["%s: %s" % (type(exc).__name__, exc)]})
    print(json.dumps(out))
''')

# A stub that records its argv (NUL-separated) when it is vLLM: `vllm ...` or `python3 -m vllm.entrypoints...`.
STUB = textwrap.dedent('''\
    #!/bin/sh
    case "$(basename "$0")" in
      python3) case "$1 $2" in "-m vllm.entrypoints"*) ;; *) exit 0 ;; esac ;;
    esac
    printf '%s\\0' "$(basename "$0")" "$@" > "$ARGV_OUT"
''')

JSON = ['{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}', '{"method": "ngram", "num_speculative_tokens": 5}',
        '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":1,"prompt_lookup_max":3}']

# (words, hazard): speculative settings in the forms vLLM 0.32's parser accepts
SPEC_FORMS = [
    lambda j: ["--speculative-config", j], lambda j: ["--speculative-config=" + j], lambda j: ["--speculative_config", j],
    lambda j: ["-sc", j], lambda j: ["-sc=" + j], lambda j: ["-s", j], lambda j: ["--speculative", j], lambda j: ["--speculative-c", j],
    lambda j: ["--spec-method", "ngram", "--spec-tokens", "3"], lambda j: ["--spec-method=ngram", "--spec-tok", "3"],
    lambda j: ["--spec-meth", "ngram", "--spec_tokens=2"],
    lambda j: ["--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens", "3"],
    lambda j: ["-sc.method=ngram", "-sc.num_speculative_tokens", "3"],
    lambda j: ["--speculative.method", "ngram", "--speculative.num_speculative_tokens=4"],
    lambda j: ["--speculative_config.method", "ngram", "--speculative_config.prompt_lookup_max", "4"],
    lambda j: ["-sc", j, "--speculative-config.num_speculative_tokens", "2", "--speculative-config.method", "ngram"],
]
# options that must come through unchanged
PLAIN = [
    ["--port", "8080"], ["--seed", "0"], ["--dtype", "bfloat16"], ["--max-model-len", "4096"], ["--enforce-eager"],
    ["--enable-prefix-caching"], ["--gpu-memory-utilization=0.85"], ["--max-num-seqs", "16"], ["--trust-remote-code"],
    ["--served-model-name", "alpha", "beta"], ["--served_model_name", "gamma"], ["--disable-log-stats"], ["-tp", "1"],
    ["--override-generation-config", '{"note": "--speculative-config {\\"method\\": \\"ngram\\"} -sc x"}'],
    ["--override-generation-config", '{"temperature": 0.5}'], ["--compilation-config.mode", "0"], ["-O0"], ["--api-key", "key-a", "key-b"],
    ["--max-num-batched-tokens", "2048"], ["--block-size", "16"],
]
MODELS = ["/mnt/models", "/mnt/models/target"]
ENV = {"PORT": "8001", "EXTRA": "--max-num-seqs 8 --seed 1", "SPEC_JSON": JSON[0]}


def _quote(word):
    return shlex.quote(word)


class Case:
    """One generated command: the container's lists, the pod spec's env, whether it sets speculative decoding, and the
    construct it plants (None: the strip must succeed)."""

    def __init__(self, kind, entry, command, args, env, speculative, planted, spec=()):
        self.spec = list(spec)  # the speculative words as generated (the naive removal takes them out of the argv)
        self.kind = kind
        self.entry = entry
        self.command = command
        self.args = args
        self.env = env
        self.speculative = speculative
        self.planted = planted


def _generate(rng):
    cases = []
    for number in range(CASES):
        entry = "serve" if rng.random() < 0.7 else "api_server"
        speculative = rng.random() < 0.75
        opts = rng.sample(PLAIN, rng.randint(1, 5))
        model = rng.choice(MODELS)
        spec = rng.choice(SPEC_FORMS)(rng.choice(JSON)) if speculative else []
        planted = None
        words = [w for opt in opts for w in opt]
        at = rng.randint(0, len(opts))
        before = [w for opt in opts[:at] for w in opt]
        after = [w for opt in opts[at:] for w in opt]
        if entry == "serve":
            # the positional model first, or after the options (argparse takes it there too), or as --model
            place = rng.choice(["first", "first", "last", "option"])
            if any(opt[0] in ("--served-model-name", "--served_model_name") for opt in opts):
                place = "first"  # vLLM 0.32's FlexibleArgumentParser refuses --served-model-name before the positional model
            head = [model] if place == "first" else []
            tail = [model] if place == "last" else (["--model", model] if place == "option" else [])
            argv = head + before + spec + after + tail
            program = ["vllm", "serve"]
        else:
            argv = ["--model", model] + before + spec + after
            program = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        form = rng.choice(["argv", "argv_split", "script", "script", "script"])
        env = {}
        if form.startswith("argv"):
            if form == "argv":
                cases.append(Case("argv", entry, program + argv, None, env, speculative, planted, spec))
            else:
                cases.append(Case("argv", entry, program, argv, env, speculative, planted, spec))
            continue
        twist = rng.choice([None, None, None, "env_port", "env_extra", "echo", "prefetch", "eval", "plus", "unset", "env_spec"])
        script_words = [_quote(w) for w in program + argv]
        if twist == "env_port":
            env = {"PORT": ENV["PORT"]}
            script_words += ["--port", '"$PORT"']
        elif twist == "env_extra":
            env = {"EXTRA": ENV["EXTRA"]}
            script_words += ["$EXTRA"]
        elif twist == "unset":
            script_words += ["$UNSET_ARGS"]
            planted = planted or "variable"
        elif twist == "plus":
            env = {"SPEC_JSON": ENV["SPEC_JSON"]}
            script_words += ['${SPEC_JSON:+--speculative-config "$SPEC_JSON"}']
            planted = planted or "parameter expansion"
        elif twist == "env_spec":
            env = {"SPEC_ARGS": "-sc " + JSON[1].replace(" ", "")}
            script_words += ["$SPEC_ARGS"]
            planted = planted or "variable"
        layout = rng.choice(["line", "continued"])
        sep = " \\\n    " if layout == "continued" else " "
        body = sep.join(script_words)
        prefix = rng.choice(["", "set -e\n", "set -ex\n# start vLLM\nexport VLLM_LOGGING_LEVEL=INFO\n"])
        if twist == "echo":
            prefix += "echo starting with --speculative-config %s -sc x\n" % _quote(JSON[0])
        elif twist == "prefetch":
            prefix += "python3 /opt/prefetch.py --speculative-config %s --model %s\n" % (_quote(JSON[0]), model)
        if twist == "eval":
            body = "eval %s" % _quote(" ".join(script_words))
            planted = "eval" if speculative else planted
        script = prefix + ("exec " if rng.random() < 0.5 and twist != "eval" else "") + body + rng.choice(["", "\n"])
        # the script in the command (`sh -c SCRIPT`) or, as KServe's runtimes have it, `sh -c` in the command and the script in args
        command, args = (["/bin/sh", "-c", script], None) if rng.random() < 0.6 else (["/bin/sh", "-c"], [script])
        cases.append(Case("script", entry, command, args, env, speculative or twist in ("plus", "env_spec"), planted, spec))
        del number
    return cases


def _naive(argv, spec):
    """argv without the generated speculative words (the first run of them): what a strip that ignores the parser gives."""
    for start in range(len(argv) - len(spec) + 1):
        if spec and argv[start:start + len(spec)] == spec:
            return argv[:start] + argv[start + len(spec):]
    return argv


def _run_script(shell, script, env, workdir, name):
    out = os.path.join(workdir, "argv-%s" % name)
    if os.path.exists(out):
        os.remove(out)
    run = subprocess.run([shell, "-c", script], env=dict(env, PATH=workdir + ":/usr/bin:/bin", ARGV_OUT=out), capture_output=True,
                         text=True, timeout=30, check=False)
    assert run.returncode == 0, (shell, script, run.stderr)
    with open(out, "rb") as handle:
        return handle.read().decode().split("\0")[:-1]


def _vllm_args(argv):
    """The arguments after the program: after ``serve`` for the vllm CLI, after the module for python3 -m."""
    if argv[0] == "vllm":
        assert argv[1] == "serve", argv
        return argv[2:]
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], argv
    return argv[3:]


def _argvs(case, lists, workdir):
    """The argv vLLM receives for a container's lists, per shell for a script (they must agree)."""
    if case.kind == "argv":
        return _vllm_args(lists[0] + (lists[1] or []))
    script = (lists[0] + (lists[1] or []))[2]
    seen = [_run_script(shell, script, case.env, workdir, shell) for shell in SHELLS]
    assert seen[0] == seen[1], ("bash and dash disagree", script, seen)
    return _vllm_args(seen[0])


def _other_fields(was, now, reg):
    """The fields other than the speculative ones that differ between two parses (an error counts as all of them)."""
    if not now["ok"]:
        return {"error": now["error"]}
    return {k: (was["ns"].get(k), now["ns"].get(k)) for k in set(was["ns"]) | set(now["ns"])
            if k not in reg.speculative_dests and was["ns"].get(k) != now["ns"].get(k)}


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("strip-stubs")
    for name in ("vllm", "python3"):
        stub = path / name
        stub.write_text(STUB)
        stub.chmod(0o755)
    for shell in SHELLS:
        assert shutil.which(shell), "%s is needed to run the generated scripts (apt-get install %s)" % (shell, shell)
    return str(path)


def test_strip_against_vllms_own_parser(vllm_preloaded, stub_dir):
    with open(REFUSALS, encoding="utf-8") as handle:
        accepted = {item["construct"] for item in yaml.safe_load(handle)}
    reg = cli_parser.registry()
    started = time.monotonic()
    rng = random.Random(SEED)
    cases = _generate(rng)
    plan = []  # (case, before argv, stripped lists or None, refusal)
    for case in cases:
        before = _argvs(case, (case.command, case.args), stub_dir)
        try:
            command = command_edit.strip_checked(case.command, case.env)
            args = command_edit.strip_checked(case.args, case.env, field="args") if case.args is not None else None
            plan.append((case, before, (command, args), None))
        except ValidationError as exc:
            plan.append((case, before, None, str(exc)))
    after_argvs = {i: _argvs(case, stripped, stub_dir) for i, (case, _b, stripped, _r) in enumerate(plan) if stripped}
    # a multi-value refusal is right when taking the words out naively changes what vLLM reads: the oracle says so
    naive = {i: _naive(before, case.spec) for i, (case, before, _s, refusal) in enumerate(plan) if refusal and "multi-value" in refusal}
    batch = [(case.entry, before) for case, before, _s, _r in plan] + [(plan[i][0].entry, argv) for i, argv in sorted(after_argvs.items())] \
        + [(plan[i][0].entry, argv) for i, argv in sorted(naive.items())]
    shells_done = time.monotonic()
    # python -c PARSE with the batch on stdin, in a fork of the session's preloaded vLLM (tests/e2e/vllm_preload.py): its
    # import ran beside the shells above when this module is its first user
    run = vllm_preloaded.run(PARSE, input=json.dumps(batch), env=dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", PYTHONWARNINGS="ignore"),
                             timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    parsed = json.loads(run.stdout.strip().splitlines()[-1])
    parsed_before = parsed[:len(plan)]
    parsed_after = dict(zip(sorted(after_argvs), parsed[len(plan):len(plan) + len(after_argvs)]))
    parsed_naive = dict(zip(sorted(naive), parsed[len(plan) + len(after_argvs):]))

    figures = {"cases": len(plan), "scripts": sum(c.kind == "script" for c in cases), "speculative": 0, "stripped": 0,
               "identical": 0, "refused": {}, "invalid_before": 0}
    failures = []
    for i, (case, before, stripped, refusal) in enumerate(plan):
        was = parsed_before[i]
        label = "case %d (%s %s): %r %r env=%r" % (i, case.kind, case.entry, case.command, case.args, case.env)
        if not was["ok"]:
            figures["invalid_before"] += 1
            failures.append("%s: vLLM refuses the generated command itself: %s" % (label, was["error"]))
            continue
        speculative = any(was["ns"].get(dest) is not None for dest in reg.speculative_dests)
        figures["speculative"] += speculative
        if refusal is not None:
            construct = next((c for c in sorted(accepted, key=len, reverse=True) if ": %s " % c in refusal), None)
            figures["refused"][construct or "?"] = figures["refused"].get(construct or "?", 0) + 1
            print("refused case %d [%s]: %s" % (i, construct, refusal.split(": ", 2)[-1][:160]))
            if construct == "multi-value option":
                other = _other_fields(was, parsed_naive[i], reg)
                if not other:
                    failures.append("%s: refused as multi-value, yet vLLM reads the naive removal the same: %s" % (label, refusal))
            elif construct is None or case.planted is None:
                failures.append("%s: refused without a planted construct: %s" % (label, refusal))
            continue
        if case.planted is not None:
            failures.append("%s: the planted %s was not refused" % (label, case.planted))
        now = parsed_after[i]
        if not now["ok"]:
            failures.append("%s: broken by the strip: %s -> %s" % (label, stripped, now["error"]))
            continue
        left = {dest: now["ns"].get(dest) for dest in reg.speculative_dests if now["ns"].get(dest) is not None}
        if left:
            failures.append("%s: left speculative: %s (stripped: %r)" % (label, left, stripped))
        changed = _other_fields(was, now, reg)
        if changed:
            failures.append("%s: other fields changed: %s (stripped: %r)" % (label, changed, stripped))
        if not speculative:
            if stripped != (case.command, case.args):
                failures.append("%s: no speculative setting, yet the strip changed it to %r" % (label, stripped))
            else:
                figures["identical"] += 1
        else:
            figures["stripped"] += 1
    figures["seconds"] = {"strip_and_shells": round(shells_done - started, 1), "total": round(time.monotonic() - started, 1)}
    print("strip differential:", json.dumps(figures, sort_keys=True))
    assert not failures, "%d of %d commands failed:\n%s" % (len(failures), len(plan), "\n".join(failures[:25]))
    assert figures["speculative"] >= CASES // 2 and figures["identical"] >= CASES // 10
    assert set(figures["refused"]) <= accepted
