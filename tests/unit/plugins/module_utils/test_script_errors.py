"""command_line.script_errors and runtime_readers.unreadable_scripts: a ``bash -c`` script the shell cannot parse is
named (container and why), and the verdict is the shell's own: ``bash -n`` refuses exactly the scripts flagged here."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vc

BASH = shutil.which("bash")
GOOD = ("set -e\nexec python3 -m vllm.entrypoints.openai.api_server --model /mnt/models/target "
        "--speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":3}'\n")
# (script, the lexer's reason or None)
CASES = [
    (GOOD, None),
    (GOOD.rstrip()[:-1] + "\n", "unterminated single quote"),           # the closing quote of the JSON dropped
    ('exec python3 -m vllm.entrypoints.openai.api_server --model "/mnt/models/target\n', "unterminated double quote"),
    ("exec python3 -m vllm.entrypoints.openai.api_server --dtype $(printf %s float16\n", "unterminated"),
    ("exec python3 -m vllm.entrypoints.openai.api_server --dtype \"${DTYPE}\" --port 8080\n", None),
]


@pytest.mark.parametrize("script,why", CASES)
def test_script_errors_name_what_the_shell_refuses(script, why):
    errors = vc.script_errors(["bash", "-c", script])
    if why is None:
        assert errors == []
    else:
        assert len(errors) == 1 and errors[0].startswith(why), errors
    if BASH:  # the shell agrees: it refuses exactly the scripts named here
        refused = subprocess.run([BASH, "-n", "-c", script], capture_output=True, check=False).returncode != 0
        assert refused == (why is not None), (script, why)


def test_only_shell_scripts_are_lexed():
    # an argv word with a stray quote is not a script: vLLM gets it as it is
    assert vc.script_errors(["python3", "-m", "vllm.entrypoints.openai.api_server", "--served-model-name", "it's"]) == []
    assert vc.script_errors(None) == []


def test_unreadable_scripts_name_the_container():
    isvc = {"spec": {"predictor": {"model": {"command": ["bash", "-c", GOOD.rstrip()[:-1]]},
                                   "containers": [{"name": "sidecar", "command": ["sh", "-c", "echo 'x"]},
                                                  {"name": "fine", "command": ["bash", "-c", GOOD]}]}}}
    found = runtime_readers.unreadable_scripts(isvc)
    assert [line.split(" (")[0] for line in found] == ["kserve-container: the shell script does not parse",
                                                       "sidecar: the shell script does not parse"], found
    assert all("unterminated single quote at offset" in line for line in found), found
