"""Filter alauda.spec_decoding.strip_speculative_config: directly and through a real ansible-playbook run."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.strip_speculative_config import (
    FilterModule, strip_speculative_config)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
EAGLE3 = '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'
SCRIPT = ("python3 -m vllm.entrypoints.openai.api_server \\\n  --port 8080 \\\n"
          "  --speculative-config '%s' \\\n  --seed 0\n" % EAGLE3)


def test_registered_name():
    assert FilterModule().filters()["strip_speculative_config"] is strip_speculative_config


@pytest.mark.parametrize("items, expected", [
    (["bash", "-c", SCRIPT], ["bash", "-c", "python3 -m vllm.entrypoints.openai.api_server \\\n  --port 8080 \\\n  --seed 0\n"]),
    (["--model", "/mnt/models", "--speculative-config", EAGLE3, "--port", "8080"], ["--model", "/mnt/models", "--port", "8080"]),
    (["--model", "/mnt/models", "--spec-method=ngram", "--spec-tokens", "4"], ["--model", "/mnt/models"]),
    (["--model", "/mnt/models"], ["--model", "/mnt/models"]),
    ([], []),
    (None, []),
])
def test_strip(items, expected):
    assert strip_speculative_config(items) == expected


def test_env_resolves_variables_and_unresolvable_constructs_fail_naming_them():
    script = "exec vllm serve /m $EXTRA -sc '%s'" % EAGLE3
    env = [{"name": "EXTRA", "value": "--seed 0 --max-num-seqs 8"}]
    assert strip_speculative_config(["bash", "-c", script], env=env) == ["bash", "-c", "exec vllm serve /m $EXTRA"]
    with pytest.raises(AnsibleFilterError) as exc:
        strip_speculative_config(["bash", "-c", script])  # $EXTRA unknown: it may carry a flag
    assert "variable '$EXTRA'" in str(exc.value)
    with pytest.raises(AnsibleFilterError) as exc:
        strip_speculative_config(["bash", "-c", "eval \"vllm serve /m -sc '%s'\"" % EAGLE3])
    assert ": eval " in str(exc.value)


@pytest.mark.parametrize("bad, fragment", [
    ("vllm serve m --speculative-config '{}'", "expects a list of strings"),
    ({"command": []}, "expects a list of strings"),
    (["--port", 8080], "element 1 is int"),
])
def test_bad_input(bad, fragment):
    with pytest.raises(AnsibleFilterError) as exc:
        strip_speculative_config(bad)
    assert fragment in str(exc.value)


def test_through_ansible_playbook(tmp_path):
    """The filter resolves by its FQCN in a real playbook run and returns the stripped list."""
    vars_file = tmp_path / "vars.json"
    vars_file.write_text(json.dumps({"cmd": ["bash", "-c", SCRIPT]}))
    out = tmp_path / "out.json"
    playbook = tmp_path / "pb.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.copy:\n"
        "        content: \"{{ cmd | alauda.spec_decoding.strip_speculative_config | to_json }}\"\n"
        "        dest: %s\n" % out)
    env = dict(os.environ)
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, ".build", "collections")
    env.pop("ANSIBLE_CONFIG", None)
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "@%s" % vars_file, "-e", "ansible_python_interpreter=%s" % sys.executable, str(playbook)],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(out.read_text()) == ["bash", "-c", "python3 -m vllm.entrypoints.openai.api_server \\\n  --port 8080 \\\n  --seed 0\n"]
