"""The speculative_config module and filter, run through real ansible-playbook."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def run_playbook(tmp_path, tasks, check=False):
    play = "- hosts: localhost\n  gather_facts: false\n  tasks:\n" + textwrap.indent(textwrap.dedent(tasks), "    ")
    path = tmp_path / "play.yml"
    path.write_text(play)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=%s" % sys.executable, str(path)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        pytest.fail("ansible-playbook printed no JSON:\n%s\n%s" % (proc.stdout, proc.stderr))
    results = [t["hosts"]["localhost"] for p in out["plays"] for t in p["tasks"]]
    return proc.returncode, results


def test_module_returns_canonical_json_warnings_and_is_never_changed(tmp_path):
    rc, results = run_playbook(tmp_path, """
        - alauda.spec_decoding.speculative_config:
            preset: eagle3
            overrides: {model: /mnt/models/draft}
            vllm_version: "0.32.0"
        """)
    assert rc == 0
    res = results[0]
    assert res["json"] == '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'
    assert res["changed"] is False
    assert res["vllm_version"] == "0.32.0"
    assert any("--gpu-memory-utilization" in w for w in res["warnings"])


def test_module_check_mode_gives_the_same_answer(tmp_path):
    rc, results = run_playbook(tmp_path, """
        - alauda.spec_decoding.speculative_config:
            config: '{"num_speculative_tokens": 5, "method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
        """, check=True)
    assert rc == 0
    assert results[0]["json"] == '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}'


def test_module_fails_naming_the_field(tmp_path):
    rc, results = run_playbook(tmp_path, """
        - alauda.spec_decoding.speculative_config:
            config: {method: eagle3, num_speculative_tokens: 3}
            vllm_version: "0.32.0"
        """)
    assert rc != 0
    assert results[0]["failed"] is True
    assert results[0]["msg"].startswith("config.model:")
    assert results[0]["field"] == "config.model"


def test_module_refuses_config_with_preset(tmp_path):
    rc, results = run_playbook(tmp_path, """
        - alauda.spec_decoding.speculative_config:
            config: {method: ngram}
            preset: ngram
        """)
    assert rc != 0 and "mutually exclusive" in results[0]["msg"]


def test_filter_renders_and_fails_with_the_same_message(tmp_path):
    rc, results = run_playbook(tmp_path, """
        - ansible.builtin.debug:
            msg: "{{ {'num_speculative_tokens': 3, 'method': 'eagle3', 'model': '/mnt/models/draft'}
                    | alauda.spec_decoding.speculative_config_json('0.32.0') }}"
        - ansible.builtin.debug:
            msg: "{{ {'method': 'ngram', 'num_speculative_tokens': 0} | alauda.spec_decoding.speculative_config_json }}"
        """)
    assert results[0]["msg"] == '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'
    assert rc != 0
    assert "config.num_speculative_tokens" in results[1]["msg"]


def test_filter_function_directly():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.alauda.spec_decoding.plugins.filter.speculative_config_json import FilterModule

    render = FilterModule().filters()["speculative_config_json"]
    assert render({"method": "mtp", "num_speculative_tokens": 1}, "0.32.0") == '{"method":"mtp","num_speculative_tokens":1}'
    with pytest.raises(AnsibleFilterError, match="config.prompt_lookup_max"):
        render({"method": "ngram", "num_speculative_tokens": 1}, "0.32.0")
