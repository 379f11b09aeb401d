"""The engine_config_info module, run through real ansible-playbook on the real captures (local sources).

Cluster reads are covered by tests/integration/test_verify.py on the API-server test bed.
"""

import json

from tests.ansible_run import run_playbook as _run_playbook

from tests.paths import CAPTURES, read_capture  # noqa: E402  pylint: disable=wrong-import-position


def run_playbook(tmp_path, tasks, check=False):
    """(rc, per-task results) of an ad-hoc play run by real ansible-playbook."""
    run = _run_playbook(tmp_path, tasks=tasks, check=check)
    assert run.tasks, "ansible-playbook ran no task:\n" + run.output
    return run.rc, [res for _name, _host, res in run.tasks]


def test_matches_expected_on_real_eagle3_log(tmp_path):
    rc, res = run_playbook(tmp_path, """
        - alauda.spec_decoding.engine_config_info:
            log_path: %s/eagle3/startup.log
            expected: {method: eagle3, model: /mnt/models/tiny-eagle3, num_speculative_tokens: 3}
        """ % CAPTURES, check=True)
    assert rc == 0
    r = res[0]
    assert r["changed"] is False and r["found"] is True
    assert r["speculative_config"] == {"method": "eagle3", "model": "/mnt/models/tiny-eagle3", "num_spec_tokens": 3}
    assert (r["vllm_version"], r["engine"]) == ("0.32.0", "V1")
    assert r["differences"] == []
    assert [w["kind"] for w in r["log_warnings"]].count("min_p_logit_bias") == 1


def test_mismatch_prints_both_sides(tmp_path):
    rc, res = run_playbook(tmp_path, """
        - alauda.spec_decoding.engine_config_info:
            log_path: %s/ngram/startup.log
            expected: {method: eagle3, num_speculative_tokens: 3}
        """ % CAPTURES)
    assert rc != 0 and res[0]["failed"] is True and res[0]["changed"] is False
    msg = res[0]["msg"]
    assert "method: expected 'eagle3', engine runs 'ngram'" in msg
    assert "num_speculative_tokens: expected 3, engine runs 5" in msg
    assert "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5)" in msg


def test_baseline_after_rollback_expect_disabled(tmp_path):
    text = read_capture("baseline", "startup.log")
    path = tmp_path / "vars.json"
    path.write_text(json.dumps({"log": text}))
    rc, res = run_playbook(tmp_path, """
        - ansible.builtin.include_vars: {file: %s, name: cap}
        - alauda.spec_decoding.engine_config_info:
            log_text: "{{ cap.log }}"
            expected: {enabled: false}
        - alauda.spec_decoding.engine_config_info:
            log_text: "{{ cap.log }}"
            expected: {method: ngram}
        """ % path)
    assert res[1]["found"] is True and res[1]["speculative_config"] is None
    assert rc != 0 and "engine runs without speculative decoding" in res[2]["msg"]


def test_missing_line_fails_with_hint(tmp_path):
    rc, res = run_playbook(tmp_path, """
        - alauda.spec_decoding.engine_config_info:
            log_text: "(APIServer pid=1) INFO 11-29 07:38:32 [api_server.py:1] vLLM API server version 0.32.0"
        """)
    assert rc != 0
    assert "no engine-config line" in res[0]["msg"] and "still be starting" in res[0]["msg"] and "container" in res[0]["msg"]
    assert res[0]["found"] is False


def test_missing_file_names_the_field(tmp_path):
    rc, res = run_playbook(tmp_path, """
        - alauda.spec_decoding.engine_config_info:
            log_path: /nonexistent/vllm.log
        """)
    assert rc != 0 and res[0]["msg"].startswith("log_path: cannot read")


def test_sources_are_exclusive(tmp_path):
    rc, res = run_playbook(tmp_path, """
        - alauda.spec_decoding.engine_config_info:
            log_text: x
            name: svc
        """)
    assert rc != 0 and "mutually exclusive" in res[0]["msg"]
