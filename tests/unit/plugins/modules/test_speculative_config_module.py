"""The speculative_config module and filter, run through real ansible-playbook."""

import pytest

from tests.ansible_run import run_playbook as _run_playbook


def run_playbook(tmp_path, tasks, check=False):
    """(rc, per-task results) of an ad-hoc play run by real ansible-playbook."""
    run = _run_playbook(tmp_path, tasks=tasks, check=check)
    assert run.tasks, "ansible-playbook ran no task:\n" + run.output
    return run.rc, [res for _name, _host, res in run.tasks]


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
    # (vLLM fills ngram's lookup bounds itself, so a window the wrong way round is the refused ngram config)
    with pytest.raises(AnsibleFilterError, match="config.prompt_lookup_min"):
        render({"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 5, "prompt_lookup_max": 2}, "0.32.0")
