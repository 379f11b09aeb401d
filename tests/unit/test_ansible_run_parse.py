"""How tests read ansible-playbook's json callback document out of its stdout (tests/ansible_run.py)."""
import json
import types

from tests.ansible_run import PlaybookRun

DOC = {"plays": [{"play": {"name": "p", "duration": {"start": "2026-12-02T15:00:00.000000Z"}},
                  "tasks": [{"task": {"name": "Apply", "duration": {"start": "2026-12-02T15:00:00.000000Z", "end": "2026-12-02T15:00:01.000000Z"}},
                             "hosts": {"localhost": {"changed": True}}}]}],
       "stats": {"localhost": {"ok": 1, "changed": 1}}}


def _run(stdout):
    return PlaybookRun(types.SimpleNamespace(returncode=0, stdout=stdout, stderr=""))


def test_document_found_after_verbose_lines_a_stray_brace_line_and_before_trailing_text():
    text = json.dumps(DOC, indent=4)
    for stdout in (text, "Using ansible.cfg as config file\n" + text, "{not json\n" + text + "\n[WARNING]: late\n",
                   '{"other": "object"}\n' + text):
        run = _run(stdout)
        assert run.parse_problem is None, stdout
        assert run.result("Apply") == {"changed": True}
        assert run.changed == 1


def test_no_document_says_what_stdout_held():
    run = _run("ERROR! the playbook could not be read\n")
    assert run.tasks == [] and "no line starting with '{'" in run.parse_problem and "ERROR! the playbook" in run.parse_problem
    try:
        run.result("Apply")
    except AssertionError as exc:
        assert "ERROR! the playbook" in str(exc)
    else:
        raise AssertionError("result() of a run without a document did not fail")
