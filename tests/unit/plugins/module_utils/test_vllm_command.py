"""vllm_command: find / strip / set the speculative flags in argv lists and bash -c scripts.

The property tests generate vLLM start commands from parts (with and without speculative flags in every
form) and check two things against independent oracles:
* the stripped text is byte-identical to the same command rendered without the flag parts;
* bash itself (a real subprocess) parses the stripped script into exactly the original argv minus the
  flag words, and `bash -n` accepts it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit as ve
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

DATA = os.path.join(os.path.dirname(__file__), "data", "rollback")
BASH = shutil.which("bash")

EAGLE3 = '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'
NGRAM = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}'


def sh_single(value):
    return "'" + value.replace("'", "'\\''") + "'"


def sh_double(value):
    out = value
    for ch in ("\\", '"', "$", "`"):
        out = out.replace(ch, "\\" + ch)
    return '"' + out + '"'


# --------------------------------------------------------------------------------------------------
# argv lists
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("items, expected", [
    (["vllm", "serve", "m", "--speculative-config", EAGLE3, "--seed", "0"], ["vllm", "serve", "m", "--seed", "0"]),
    (["--model", "/m", "--speculative-config=" + NGRAM], ["--model", "/m"]),
    (["--model", "/m", "-sc", NGRAM, "--port", "8080"], ["--model", "/m", "--port", "8080"]),
    (["--model", "/m", "-sc=" + NGRAM], ["--model", "/m"]),
    (["--speculative_config", NGRAM, "--model", "/m"], ["--model", "/m"]),
    (["--model", "/m", "--spec-method", "ngram", "--spec-tokens", "5", "--spec-model=/d"], ["--model", "/m"]),
    (["--model", "/m", "--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens=3"], ["--model", "/m"]),
    (["--model", "/m", "--speculative-config", '{\n  "method": "ngram",\n  "num_speculative_tokens": 5\n}'], ["--model", "/m"]),
    # not speculative flags: left alone
    (["--model", "/m", "--served-model-name", "speculative-config", "--override-generation-config", '{"temperature":0.5}'],
     ["--model", "/m", "--served-model-name", "speculative-config", "--override-generation-config", '{"temperature":0.5}']),
    ([], []),
])
def test_strip_argv(items, expected):
    before = list(items)
    assert ve.strip_speculative_config(items) == expected
    assert items == before  # input untouched


def test_strip_is_noop_without_flag_and_keeps_types():
    items = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8080"]
    assert ve.strip_speculative_config(items) == items
    assert ve.strip_speculative_config(None) is None


def test_find_config_argv_and_split_flags():
    assert vc.find_speculative_config(["vllm", "serve", "m", "--speculative-config", EAGLE3]) == json.loads(EAGLE3)
    assert vc.find_speculative_config(["--spec-method", "ngram", "--spec-tokens", "5"]) == {"method": "ngram", "num_speculative_tokens": 5}
    assert vc.find_speculative_config(["-sc", NGRAM, "--speculative-config.num_speculative_tokens", "2"])["num_speculative_tokens"] == 2
    assert vc.find_speculative_config(["--speculative-config", '{"num-speculative-tokens": 2, "method": "ngram"}']) == {
        "num_speculative_tokens": 2, "method": "ngram"}
    assert vc.find_speculative_config(["vllm", "serve", "m"]) is None
    assert vc.find_speculative_config(None) is None
    # command + args are read together
    assert vc.find_speculative_config(["bash", "-c"], ["vllm serve m --speculative-config '%s'" % NGRAM]) == json.loads(NGRAM)


@pytest.mark.parametrize("items, fragment", [
    (["--speculative-config", "{not json"], "not JSON"),
    (["--speculative-config", "[1, 2]"], "not a JSON object"),
    (["--speculative-config"], "has no value"),
])
def test_find_config_unreadable_value_names_field(items, fragment):
    with pytest.raises(ValidationError) as exc:
        vc.find_speculative_config(items)
    assert fragment in str(exc.value)
    assert str(exc.value).startswith("command:")


# --------------------------------------------------------------------------------------------------
# scripts: hand-written cases
# --------------------------------------------------------------------------------------------------

CONT = "python3 -m vllm.entrypoints.openai.api_server \\\n  --port 8080 \\\n"


@pytest.mark.parametrize("script, expected", [
    # own continued line in the middle
    (CONT + "  --speculative-config '%s' \\\n  --seed 0\n" % EAGLE3, CONT + "  --seed 0\n"),
    # own continued line at the end: the previous line's ` \` goes too (no dangling continuation)
    (CONT + "  --seed 0 \\\n  --speculative-config '%s'\necho done\n" % EAGLE3, CONT + "  --seed 0\necho done\n"),
    (CONT + "  --seed 0 \\\n  --speculative-config '%s'" % EAGLE3, CONT + "  --seed 0"),
    # mid-line, double quotes with escaped quotes
    ('vllm serve m --speculative-config "{\\"method\\": \\"ngram\\", \\"num_speculative_tokens\\": 5}" --seed 0',
     "vllm serve m --seed 0"),
    # first on a continued line, more words after it
    (CONT + "  --speculative-config '%s' --seed 0\n" % NGRAM, CONT + "  --seed 0\n"),
    # JSON with newlines inside the quotes
    ("exec vllm serve m \\\n  --speculative-config '{\n    \"method\": \"ngram\",\n    \"num_speculative_tokens\": 5\n  }' \\\n  --seed 0\n",
     "exec vllm serve m \\\n  --seed 0\n"),
    # = form, -sc, split flags, dotted keys
    ("vllm serve m --speculative-config='%s' --seed 0" % NGRAM, "vllm serve m --seed 0"),
    ("vllm serve m -sc '%s'" % NGRAM, "vllm serve m"),
    ("vllm serve m --spec-method ngram --spec-tokens 5 --seed 0", "vllm serve m --seed 0"),
    ("vllm serve m \\\n  --spec-method eagle3 \\\n  --spec-model /mnt/models/draft \\\n  --spec-tokens 3\n", "vllm serve m\n"),
    ("vllm serve m --speculative-config.method=ngram --speculative-config.num_speculative_tokens 4", "vllm serve m"),
    # an expansion as the value
    ('vllm serve m --speculative-config "$SPEC_CONFIG" 2>&1 | tee /tmp/log', "vllm serve m 2>&1 | tee /tmp/log"),
    # comments and strings mentioning the flag are not flags
    ("# --speculative-config '{}'\necho \"no --speculative-config here\"\nvllm serve m", None),
    # tabs for indentation
    ("vllm serve m \\\n\t--speculative-config '%s' \\\n\t--seed 0" % NGRAM, "vllm serve m \\\n\t--seed 0"),
])
def test_strip_script_cases(script, expected):
    expected = script if expected is None else expected
    out = ve.strip_speculative_config(["bash", "-c", script])
    assert out == ["bash", "-c", expected]
    _bash_n(expected)


def test_script_in_args_element_and_flag_in_plain_element():
    assert ve.strip_speculative_config(["vllm serve m --speculative-config '%s' --seed 0" % NGRAM]) == ["vllm serve m --seed 0"]
    # an args element holding "flag value" as one string (a user mistake) is removed whole
    assert ve.strip_speculative_config(["--model", "/m", "--speculative-config '%s'" % NGRAM]) == ["--model", "/m"]


def test_find_config_in_scripts():
    script = CONT + "  --speculative-config \"{\\\"method\\\":\\\"eagle3\\\",\\\"model\\\":\\\"/d\\\",\\\"num_speculative_tokens\\\":3}\"\n"
    assert vc.find_speculative_config(["bash", "-c", script]) == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}
    assert vc.find_speculative_config(["sh", "-c", "vllm serve m --speculative-config=$'{\"method\":\"ngram\"}'"]) == {"method": "ngram"}
    with pytest.raises(ValidationError) as exc:
        vc.find_speculative_config(["bash", "-c", 'vllm serve m --speculative-config "$SPEC"'])
    assert "shell expansion" in str(exc.value) and "$SPEC" in str(exc.value)
    with pytest.raises(ValidationError):
        vc.find_speculative_config(["bash", "-c", 'vllm serve m --speculative-config="${SPEC}"'])
    assert ve.strip_speculative_config(["bash", "-c", 'vllm serve m --speculative-config="${SPEC}" --seed 0']) == ["bash", "-c", "vllm serve m --seed 0"]


# --------------------------------------------------------------------------------------------------
# set
# --------------------------------------------------------------------------------------------------

def test_set_inserts_on_new_continued_line_with_single_quotes():
    script = CONT + "  --seed 0\n"
    cmd = ve.set_speculative_config(["bash", "-c", script], EAGLE3)
    assert cmd[2] == CONT + "  --seed 0 \\\n  --speculative-config '%s'\n" % EAGLE3
    # and strip gives the original back byte for byte
    assert ve.strip_speculative_config(cmd) == ["bash", "-c", script]


def test_set_inserts_before_redirections_and_pipes_on_one_line():
    script = "set -e\nexec vllm serve /mnt/models --port 8080 2>&1 | tee /tmp/log\necho bye\n"
    cmd = ve.set_speculative_config(["sh", "-c", script], NGRAM)
    assert cmd[2] == "set -e\nexec vllm serve /mnt/models --port 8080 --speculative-config '%s' 2>&1 | tee /tmp/log\necho bye\n" % NGRAM
    assert _bash_argv(cmd[2]) == ["serve", "/mnt/models", "--port", "8080", "--speculative-config", NGRAM]


def test_set_replaces_keeping_quote_style_and_form():
    dq = 'vllm serve m --speculative-config "{\\"method\\":\\"ngram\\"}" --seed 0'
    cmd = ve.set_speculative_config(["bash", "-c", dq], EAGLE3)
    assert cmd[2] == "vllm serve m --speculative-config %s --seed 0" % sh_double(EAGLE3)
    eq = "vllm serve m --speculative-config='{\"method\":\"ngram\"}'"
    cmd = ve.set_speculative_config(["bash", "-c", eq], EAGLE3)
    assert cmd[2] == "vllm serve m --speculative-config='%s'" % EAGLE3
    cmd, args = ve.set_speculative_config_in(["vllm", "serve", "m"], ["--speculative-config=" + NGRAM], EAGLE3)
    assert cmd == ["vllm", "serve", "m"] and args == ["--speculative-config=" + EAGLE3]
    # split flags give way to one JSON flag
    cmd, args = ve.set_speculative_config_in(["vllm", "serve", "m"], ["--spec-method", "eagle3", "--spec-tokens", "3", "--seed", "0"], NGRAM)
    assert args == ["--seed", "0", "--speculative-config", NGRAM]
    # a value holding a single quote survives single-quote style
    weird = '{"method":"ngram","note":"it\'s"}'
    cmd = ve.set_speculative_config(["bash", "-c", "vllm serve m --speculative-config '{}'"], weird)
    assert _bash_argv(cmd[2])[-1] == weird


def test_set_is_idempotent_on_equal_config():
    items = ["bash", "-c", "vllm serve m --speculative-config '{\"num_speculative_tokens\": 3, \"method\": \"ngram\"}'"]
    cmd = ve.set_speculative_config(items, '{"method":"ngram","num_speculative_tokens":3}')
    assert cmd == items


def test_set_argv_appends_to_args_or_command_and_refuses_non_vllm():
    assert ve.set_speculative_config(["vllm", "serve", "m"], NGRAM) == ["vllm", "serve", "m", "--speculative-config", NGRAM]
    assert ve.set_speculative_config_in(None, ["--model", "/m"], NGRAM) == (None, ["--model", "/m", "--speculative-config", NGRAM])
    with pytest.raises(ValidationError) as exc:
        ve.set_speculative_config(["sleep", "infinity"], NGRAM)
    assert "no vLLM invocation" in str(exc.value)
    with pytest.raises(ValidationError):
        ve.set_speculative_config(["vllm"], "{not json")


# --------------------------------------------------------------------------------------------------
# reading any option: command_words, find_option, option_value
# --------------------------------------------------------------------------------------------------

def test_option_value_last_wins_and_ignores_lookalikes():
    # moved from test_k8s_pods_http_target.py (http_target.argv_option is now vc.option_value), same assertions
    assert vc.option_value(["--port", "1", "--port=2"], ("--port",)) == "2"
    assert vc.option_value(["--portx", "1", "--ports=3"], ("--port",)) is None
    assert vc.option_value(["--port"], ("--port",)) is None


def test_option_in_a_script_reads_env_and_skips_the_comment():
    # shlex.split (the old http_target reader) kept the comment's words: --port 1
    items = ["bash", "-c", 'exec vllm serve m --port "$PORT" # --port 1']
    assert vc.command_words(items, [{"name": "PORT", "value": "8001"}]) == ["exec", "vllm", "serve", "m", "--port", "8001"]
    assert vc.option_value(items, "--port", {"PORT": "8001"}) == "8001"
    assert vc.option_value(items, "--port") == "$PORT"  # unknown variable: as written, not an empty word


def test_option_forms_spellings_and_line_continuations():
    script = "set -e\nvllm serve /m \\\n  --model x \\\n  --model=y \\\n  --served_model_name a\\\nb \\\n  --dtype\n"
    assert vc.option_value(["sh", "-c", script], "--model") == "y"  # --model x, then --model=y: the last one
    assert vc.find_option(["sh", "-c", script], "--served-model-name") == ("--served_model_name", "ab")  # as bash joins it
    assert vc.option_value(["sh", "-c", script], "--dtype") is None  # no value after it
    assert vc.option_value(["vllm", "serve", "--model", "x", "--model-name", "z", "--model"], "--model") == "x"
    assert vc.option_value(["vllm", "serve", "--port", "--model", "x"], "--port") is None  # argparse: no value


def test_option_inside_quoted_json_or_substitution_is_not_an_option():
    script = "vllm serve m --port 8000 --override-generation-config '{\"stop\": [\"--port 1\"]}' --seed $(cat /etc/seed --port 2)"
    assert vc.command_words(["bash", "-c", script]) == [
        "vllm", "serve", "m", "--port", "8000", "--override-generation-config", '{"stop": ["--port 1"]}', "--seed",
        "$(cat /etc/seed --port 2)"]
    assert vc.option_value(["bash", "-c", script], "--port") == "8000"
    assert vc.option_value(["bash", "-c", script], "--seed") == "$(cat /etc/seed --port 2)"
    # an argv element holding JSON after its flag stays one word (the old reader split every element with a blank)
    argv = ["vllm", "serve", "m", "--port", "8000", "--override-generation-config", '{"a": 1} --port 1']
    assert vc.option_value(argv, "--port") == "8000"


def test_only_the_vllm_command_of_a_script_counts():
    script = "python3 -m http.server --port 9000 &\nexec vllm serve m --port 8000 2>&1 | tee /tmp/log\necho --port 1"
    assert vc.command_words(["/bin/bash", "-lc", script]) == ["exec", "vllm", "serve", "m", "--port", "8000"]
    assert vc.option_value(["/bin/bash", "-lc", script], "--port") == "8000"
    # no vLLM command in the script (a wrapper): every command's words
    assert vc.command_words(["sh", "-ec", "cd /app; ./start --port 7"]) == ["cd", "/app", "./start", "--port", "7"]


def test_option_in_an_eval_string_with_additional_args_from_env():
    # KServe's data-parallel LLMInferenceService preset: bash -c in the command, the script in args, vLLM behind eval
    script = ('START_RANK=0\neval "vllm serve \\\n  /mnt/models \\\n  --port 8001 \\\n  --data-parallel-size 2 \\\n'
              '  ${VLLM_ADDITIONAL_ARGS} \\\n  --trust-remote-code"')
    items = ["/bin/bash", "-c", script]
    env = [{"name": "VLLM_ADDITIONAL_ARGS", "value": "--max-model-len 4096 --port=8002"}]
    assert vc.command_words(items, env) == ["vllm", "serve", "/mnt/models", "--port", "8001", "--data-parallel-size", "2",
                                            "--max-model-len", "4096", "--port=8002", "--trust-remote-code"]
    assert vc.find_option(items, "--port", env) == ("--port", "8002")
    assert vc.find_option(items, "--port") == ("--port", "8001")  # the variable unknown: it stays one word as written


def test_env_defaults_kubernetes_refs_and_shell_line_strings():
    assert vc.option_value(["bash", "-c", "vllm serve m --port ${PORT:-8003}"], "--port") == "8003"
    assert vc.option_value(["bash", "-c", "vllm serve m --port ${PORT:-8003}"], "--port", {"PORT": "9"}) == "9"
    assert vc.option_value(["bash", "-c", "vllm serve m --port ${PORT:-8003}"], "--port", {"PORT": ""}) == "8003"
    assert vc.option_value(["bash", "-c", "vllm serve m --port ${PORT-8003}"], "--port", {"PORT": ""}) == ""
    # a variable set through valueFrom has no value to read: it stays as written (not "None")
    env = [{"name": "PORT", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}, {"name": "M", "value": "/m"},
           {"name": "DIR", "value": "$(M)/draft"}]
    assert vc.container_env(env) == {"M": "/m", "DIR": "/m/draft"}
    assert vc.option_value(["bash", "-c", "vllm serve m --port $PORT"], "--port", env) == "$PORT"
    # Kubernetes expands $(VAR) in command/args elements; $$ is a literal $; the shell never sees $(M)
    assert vc.command_words(["vllm", "serve", "$(M)", "--model=$(DIR)", "--x", "$$(M)", "$(NOPE)"], env) == [
        "vllm", "serve", "/m", "--model=/m/draft", "--x", "$(M)", "$(NOPE)"]
    # one string is a shell line; an args element that is a shell line (its bash -c elsewhere) is opened too
    assert vc.option_value("bash -c 'exec vllm serve /m --served-model-name=x'", "--served-model-name") == "x"
    assert vc.command_words(["vllm serve /m --port 8006"]) == ["vllm", "serve", "/m", "--port", "8006"]
    assert vc.command_words("vllm serve 'unterminated") == ["vllm serve 'unterminated"]
    assert vc.command_words(None) == [] and vc.command_words("  ") == []


def test_shell_script_with_option_cluster_is_a_script_for_the_editor_too():
    scripts = (["bash", "-c", "s"], ["/bin/bash", "-lc", "s"], ["sh", "-e", "-c", "s"], ["python3", "-c", "s"], ["bash", "--port", "s"])
    assert [vc.is_shell_script(items, len(items) - 1) for items in scripts] == [True, True, True, False, False]
    cmd = ve.set_speculative_config(["/bin/bash", "-lc", "exec vllm serve /m --port 8080"], NGRAM)
    assert cmd == ["/bin/bash", "-lc", "exec vllm serve /m --port 8080 --speculative-config '%s'" % NGRAM]


# --------------------------------------------------------------------------------------------------
# the guide's two example manifests
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, config", [("guide_example1_ngram", NGRAM), ("guide_example2_eagle3", EAGLE3)])
def test_guide_examples_roll_back_exactly(name, config):
    with open(os.path.join(DATA, name + ".yaml"), encoding="utf-8") as fh:
        before = yaml.safe_load(fh)
    with open(os.path.join(DATA, name + ".rolled_back.yaml"), encoding="utf-8") as fh:
        expected = yaml.safe_load(fh)
    command = before["spec"]["predictor"]["model"]["command"]
    assert vc.find_speculative_config(command) == json.loads(config)
    stripped = ve.strip_speculative_config(command)
    assert stripped == expected["spec"]["predictor"]["model"]["command"]
    _bash_n(stripped[2])
    # rolling forward with the same JSON gives the original script back, byte for byte
    forward = ve.set_speculative_config(stripped, config)
    if name.endswith("eagle3"):
        # the flag is re-added as the last continued line (after --enable-prefix-caching)
        assert vc.find_speculative_config(forward) == json.loads(config)
        assert forward[2].endswith("--enable-prefix-caching \\\n  --speculative-config '%s'\n" % config)
    else:
        assert forward[2] == stripped[2].replace("--enable-prefix-caching", "--enable-prefix-caching --speculative-config '%s'" % config)


# --------------------------------------------------------------------------------------------------
# property tests
# --------------------------------------------------------------------------------------------------

# Arguments that must survive untouched: (words vLLM receives, how the script spells them)
PLAIN_ARGS = [
    (["--port", "8080"], "--port 8080"),
    (["--model", "/mnt/models/target"], "--model /mnt/models/target"),
    (["--served-model-name", "my model"], '--served-model-name "my model"'),
    (["--served-model-name", "speculative-config"], "--served-model-name speculative-config"),
    (["--dtype", "bfloat16"], "--dtype bfloat16"),
    (["--enforce-eager"], "--enforce-eager"),
    (["--gpu-memory-utilization=0.85"], "--gpu-memory-utilization=0.85"),
    (["--max-model-len", "4096"], "--max-model-len 4096"),
    (["--override-generation-config", '{"temperature": 0.5}'], "--override-generation-config '{\"temperature\": 0.5}'"),
    (["--chat-template", "{% for m in messages %}{{ m['content'] }}{% endfor %}"],
     "--chat-template \"{% for m in messages %}{{ m['content'] }}{% endfor %}\""),
    (["--tool-call-parser", "hermes"], "--tool-call-parser   hermes"),
    (["--seed", "0"], "--seed 0"),
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 100) | st.text(alphabet="ab c'\"\\$`{}-_/\n", max_size=8),
    lambda inner: st.lists(inner, max_size=2), max_leaves=3)
spec_configs = st.fixed_dictionaries(
    {"method": st.sampled_from(["ngram", "eagle3", "draft_model", "mtp", "suffix"]),
     "num_speculative_tokens": st.integers(1, 8)},
    optional={"model": st.sampled_from(["/mnt/models/draft", "/mnt/draft/model"]), "note": json_values})
json_layouts = st.sampled_from([None, 0, 2, "compact"])


def _dump(config, layout):
    if layout == "compact":
        return json.dumps(config, separators=(",", ":"))
    return json.dumps(config, indent=layout)


@st.composite
def spec_pieces(draw):
    """One speculative flag: (argv words, script spelling)."""
    config = draw(spec_configs)
    value = _dump(config, draw(json_layouts))
    form = draw(st.sampled_from(["sq", "dq", "eq_sq", "eq_dq", "sc", "underscore", "split", "dotted", "var", "eq_var", "ansi"]))
    if form == "sq":
        return ["--speculative-config", value], "--speculative-config " + sh_single(value)
    if form == "dq":
        return ["--speculative-config", value], "--speculative-config " + sh_double(value)
    if form == "eq_sq":
        return ["--speculative-config=" + value], "--speculative-config=" + sh_single(value)
    if form == "eq_dq":
        return ["--speculative-config=" + value], '"--speculative-config=' + sh_double(value)[1:]
    if form == "sc":
        return ["-sc", value], "-sc " + sh_single(value)
    if form == "underscore":
        return ["--speculative_config", value], "--speculative_config " + sh_single(value)
    if form == "var":
        return ["--speculative-config", "SPECVALUE"], '--speculative-config "$SPEC"'
    if form == "eq_var":
        return ["--speculative-config=SPECVALUE"], "--speculative-config=${SPEC}"
    if form == "ansi":
        esc = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
        return ["--speculative-config", value], "--speculative-config $'" + esc + "'"
    if form == "split":
        flag = draw(st.sampled_from(["--spec-method ngram", "--spec-tokens 4", "--spec-model /mnt/models/draft", "--spec-method=eagle3"]))
        words = flag.replace("=", " ").split() if "=" not in flag else [flag]
        return words, flag
    key = draw(st.sampled_from(["method", "num_speculative_tokens"]))
    return ["--speculative-config.%s" % key, "3"], "--speculative-config.%s 3" % key


@st.composite
def commands(draw):
    """A vLLM invocation made of plain args with 0-3 speculative flags mixed in, plus the expected results."""
    plain = draw(st.lists(st.sampled_from(PLAIN_ARGS), min_size=0, max_size=6))
    specs = draw(st.lists(spec_pieces(), min_size=0, max_size=3))
    items = [("plain", p) for p in plain]
    for spec in specs:
        pos = draw(st.integers(0, len(items)))
        items.insert(pos, ("spec", spec))
    head_words, head = draw(st.sampled_from([
        (["-m", "vllm.entrypoints.openai.api_server"], "python3 -m vllm.entrypoints.openai.api_server"),
        (["-m", "vllm.entrypoints.openai.api_server"], "exec python3 -m vllm.entrypoints.openai.api_server"),
        (["serve", "/mnt/models"], "vllm serve /mnt/models"),
    ]))
    layout = draw(st.sampled_from(["line", "continued", "continued_tabs", "grouped"]))
    prefix = draw(st.sampled_from(["", "set -e\n", "set -ex\n# start the server\nexport VLLM_LOGGING_LEVEL=INFO\n", "echo 'go'; "]))
    suffix = draw(st.sampled_from(["", "\n", " 2>&1 | cat\n", "\necho done\n", " && echo ok\n", " # end\n"]))
    if layout == "grouped":
        breaks = [draw(st.booleans()) for _item in items]
    else:
        breaks = [layout != "line"] * len(items)
    indent = "\t" if layout == "continued_tabs" else "    "

    def render(keep_spec):
        # Without the flags, a removed flag that started a continued line hands its line to what follows
        # it on that line (the line stays; only the flag and its value go).
        text = head
        carry = False
        for (kind, (_words, spelled)), brk in zip(items, breaks):
            if kind == "spec" and not keep_spec:
                carry = carry or brk
                continue
            text += (" \\\n" + indent if (brk or carry) else " ") + spelled
            carry = False
        tail = suffix
        if carry and suffix.startswith(" ") and not suffix.startswith(" #"):
            tail = " \\\n" + indent + suffix[1:]
        return prefix + text + tail

    def argv(keep_spec):
        out = list(head_words)
        for kind, (words, _spelled) in items:
            if kind == "spec" and not keep_spec:
                continue
            out.extend(words)
        return out

    return render(True), render(False), argv(True), argv(False)


# Run scripts in one bash process: vLLM (python3 / vllm, also behind `exec`) is a shell function that writes
# its argv NUL-separated to a file; each script runs in its own subshell through eval.
_PRELUDE = r"""
_capture() { printf '%s\0' "$@" > "$ARGV_OUT.$N"; }
python3() { _capture "$@"; }
vllm() { _capture "$@"; }
exec() { "$@"; }
"""


def _bash_argvs(*scripts, tmpdir="/tmp"):
    """Run each script with bash and return the argv vLLM would have received from each."""
    import tempfile
    with tempfile.TemporaryDirectory(dir=tmpdir) as tmp:
        out = os.path.join(tmp, "argv")
        driver = _PRELUDE + "".join(
            'N=%d; ( eval "${%d}" ) || exit $((10 + %d))\n' % (i, i + 1, i) for i in range(len(scripts)))
        env = {"PATH": "/usr/bin:/bin", "ARGV_OUT": out, "SPEC": "SPECVALUE"}
        proc = subprocess.run([BASH, "-c", driver, "bash"] + list(scripts), env=env, capture_output=True, text=True,
                              timeout=20, check=False)
        assert proc.returncode == 0, (scripts, proc.stderr)
        result = []
        for i in range(len(scripts)):
            with open("%s.%d" % (out, i), "rb") as fh:
                result.append(fh.read().decode().split("\0")[:-1])
        return result


def _bash_argv(script):
    return _bash_argvs(script)[0]


def _bash_n(script):
    proc = subprocess.run([BASH, "-n", "-c", script], capture_output=True, text=True, timeout=20, check=False)
    assert proc.returncode == 0, (script, proc.stderr)


@pytest.mark.skipif(BASH is None, reason="bash is needed as the oracle")
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands())
def test_property_strip_script_removes_only_the_flags(case):
    script, expected_script, argv_with, argv_without = case
    stripped = ve.strip_speculative_config(["bash", "-c", script])
    # bash: the generator's spelling gives the intended argv, and the stripped script gives it minus the flags
    seen_with, seen_without = _bash_argvs(script, stripped[2])
    assert seen_with == argv_with
    assert seen_without == argv_without
    assert stripped == ["bash", "-c", expected_script]
    assert vc.find_speculative_config(stripped) is None
    # a second strip changes nothing
    assert ve.strip_speculative_config(stripped) == stripped


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands(), st.sampled_from(["command", "args"]))
def test_property_strip_argv_removes_only_the_flags(case, where):
    _script, _expected, argv_with, argv_without = case
    if where == "command":
        items = ["python3"] + argv_with
        assert ve.strip_speculative_config(items) == ["python3"] + argv_without
    else:
        assert ve.strip_speculative_config(argv_with[2:]) == argv_without[2:]


@pytest.mark.skipif(BASH is None, reason="bash is needed as the oracle")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands(), spec_configs)
def test_property_set_then_strip_round_trip(case, config):
    _script, expected_script, _argv_with, argv_without = case
    canonical = json.dumps(config, separators=(",", ":"))
    cmd = ve.set_speculative_config(["bash", "-c", expected_script], canonical)
    assert vc.find_speculative_config(cmd) == config
    argv = _bash_argv(cmd[2])
    # bash sees the flag once, with the exact JSON, and all other words unchanged and in order
    i = argv.index("--speculative-config")
    assert argv[i + 1] == canonical
    assert argv[:i] + argv[i + 2:] == argv_without
    assert ve.strip_speculative_config(cmd) == ["bash", "-c", expected_script]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands())
def test_property_command_words_are_the_argv_bash_gives_vllm(case):
    # argv_with is what bash hands to python3 / vllm for this script: test_property_strip_script_removes_only_the_flags
    # checks that against bash itself for the same generator, so this test needs no bash process of its own
    script, _expected, argv_with, _argv_without = case
    # bash gets the script as written when the pod spec escapes every "$" as "$$" (Kubernetes expands $(VAR) and turns
    # $$ into $ in command/args before bash runs); the oracle ran bash on the script directly
    words = vc.command_words(["bash", "-c", script.replace("$", "$$")], {"SPEC": "SPECVALUE"})  # the env the bash oracle runs with
    # the words of the vLLM command only (not set/export/echo/cat around it), after the program's own name
    program = [w in ("python3", "vllm") for w in words].index(True)
    assert words[program + 1:] == argv_with
    assert words[:program] in ([], ["exec"])


def test_command_words_apply_kubernetes_dollar_escapes_before_the_shell():
    # In a pod spec "$$" is a literal "$" and "$(VAR)" a container variable, both resolved by Kubernetes before bash
    # reads the script; bash then expands "$PORT" itself.
    words = vc.command_words(["bash", "-c", "exec vllm serve m --served-model-name 'a$$b' --port $PORT --dtype $(DTYPE)"],
                             [{"name": "PORT", "value": "8001"}, {"name": "DTYPE", "value": "half"}])
    assert words == ["exec", "vllm", "serve", "m", "--served-model-name", "a$b", "--port", "8001", "--dtype", "half"]


@pytest.mark.parametrize("items, served", [
    (["bash", "-c", "exec vllm serve /mnt/models/spec --port 8080"], "/mnt/models/spec"),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model=/mnt/models/x", "--port", "8080"], "/mnt/models/x"),
    (["vllm", "serve", "/mnt/models/a", "--model", "/mnt/models/b"], "/mnt/models/a"),  # vLLM's serve: the positional wins
    (["vllm", "serve", "--port", "1"], None),
    (["bash", "-c", "vllm serve $(MODEL_DIR)/target"], "/mnt/models/target"),
])
def test_served_model_is_the_model_option_or_the_serve_positional(items, served):
    assert vc.served_model(items, [{"name": "MODEL_DIR", "value": "/mnt/models"}]) == served
