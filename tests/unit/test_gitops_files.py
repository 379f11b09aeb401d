"""gitops_files: a GitOps render's files and its kustomization.yaml written in one task (module_utils/gitops/render_files.py),
run in-process both ways (the module process's main(), and the action plugin's run_execute)."""
from __future__ import annotations

import functools
import os
import stat
from types import SimpleNamespace

import pytest
import yaml
from ansible.plugins.action import ActionBase

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc_render
from ansible_collections.alauda.spec_decoding.plugins.modules import gitops_files
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import run_execute
from tests.module_run import run_module

ISVC = "apiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\nmetadata:\n  name: llama\n  namespace: models\n"
RULES = "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\n"
SECRET = "apiVersion: v1\nkind: Secret\nstringData:\n  token: hf_very_secret_value\n"


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _in_task_process(args, check_mode=False, diff=False):
    action = SimpleNamespace(_task=SimpleNamespace(args=dict(args), check_mode=check_mode, diff=diff), _load_name="gitops_files")
    action.validate_argument_spec = functools.partial(ActionBase.validate_argument_spec, action)
    return run_execute(action, {}, gitops_files.CONTRACT)


def test_writes_the_files_and_a_kustomization_listing_the_directory(tmp_path):
    out = tmp_path / "gitops"
    out.mkdir()
    (out / "models-other.yaml").write_text("kind: ConfigMap\n")  # written by an earlier deploy: stays listed
    (out / ".hidden.yaml").write_text("x\n")
    (out / "notes.txt").write_text("x\n")
    res = run_module("gitops_files", {"path": str(out), "files": [{"name": "models-llama.yaml", "content": ISVC},
                                                                  {"name": "models-llama-rules.yaml", "content": RULES}]})
    assert not res.failed, res.msg
    assert res["changed"] is True and res["written"] == ["models-llama.yaml", "models-llama-rules.yaml", "kustomization.yaml"]
    assert (out / "models-llama.yaml").read_text() == ISVC and (out / "models-llama-rules.yaml").read_text() == RULES
    kustomization = (out / "kustomization.yaml").read_text()
    # the filter's own text, byte for byte
    assert kustomization == isvc_render.kustomization(["models-llama.yaml", "models-llama-rules.yaml", "models-other.yaml"])
    assert yaml.safe_load(kustomization)["resources"] == ["models-llama-rules.yaml", "models-llama.yaml", "models-other.yaml"]
    assert all(_mode(out / n) == 0o644 for n in ("models-llama.yaml", "models-llama-rules.yaml", "kustomization.yaml"))
    assert not [n for n in os.listdir(out) if ".tmp." in n]

    again = run_module("gitops_files", {"path": str(out), "files": [{"name": "models-llama.yaml", "content": ISVC},
                                                                    {"name": "models-llama-rules.yaml", "content": RULES}]})
    assert again["changed"] is False and again["written"] == [] and [f["changed"] for f in again["files"]] == [False] * 3


def test_changed_only_for_the_byte_or_mode_that_changed(tmp_path):
    out = tmp_path / "gitops"
    args = {"path": str(out), "files": [{"name": "a.yaml", "content": "a: 1\n"}, {"name": "b.yaml", "content": "b: 1\n"}]}
    assert _in_task_process(args)["changed"] is True
    assert _mode(out) == 0o755
    os.chmod(out / "b.yaml", 0o600)
    inode = os.stat(out / "a.yaml").st_ino
    args["files"][0]["content"] = "a: 2\n"
    res = _in_task_process(args)
    assert res["written"] == ["a.yaml", "b.yaml"] and _mode(out / "b.yaml") == 0o644
    # written beside its path and renamed over it: a new inode, never the old file truncated
    assert os.stat(out / "a.yaml").st_ino != inode and (out / "a.yaml").read_text() == "a: 2\n"


def test_check_mode_writes_nothing_and_diffs_each_file(tmp_path):
    out = tmp_path / "new-dir"
    args = {"path": str(out), "files": [{"name": "models-llama.yaml", "content": ISVC}]}
    for res in (run_module("gitops_files", args, check_mode=True, diff=True), _in_task_process(args, check_mode=True, diff=True)):
        assert not res.get("failed"), res
        assert res["changed"] is True and not out.exists()
        # the kustomization lists the manifest the run would write, so its diff shows the final file
        assert res["resources"] == ["models-llama.yaml"]
        assert [d["after_header"] for d in res["diff"]] == [str(out / "models-llama.yaml"), str(out / "kustomization.yaml")]
        assert res["diff"][0] == {"before_header": str(out / "models-llama.yaml"), "after_header": str(out / "models-llama.yaml"),
                                  "before": "", "after": ISVC}


def test_files_mode_lists_the_written_files_and_resources_only(tmp_path):
    out = tmp_path / "schedule"
    out.mkdir()
    (out / "unrelated.yaml").write_text("x: 1\n")
    res = _in_task_process({"path": str(out), "kustomization": "files", "resources": ["cronjob-a-b.yaml"],
                            "files": [{"name": "role-a-b.yaml", "content": "kind: Role\n"}]})
    assert res["resources"] == ["cronjob-a-b.yaml", "role-a-b.yaml"]
    assert yaml.safe_load((out / "kustomization.yaml").read_text())["resources"] == ["cronjob-a-b.yaml", "role-a-b.yaml"]
    none = _in_task_process({"path": str(tmp_path / "report"), "kustomization": "none",
                             "files": [{"name": "watch.json", "content": "{}\n"}]})
    assert none["resources"] is None and sorted(os.listdir(tmp_path / "report")) == ["watch.json"]


def test_a_secret_file_stays_out_of_the_diff_and_the_output(tmp_path):
    out = tmp_path / "credentials"
    args = {"path": str(out), "files": [{"name": "models-sa-credentials.yaml", "content": SECRET, "secret": True}]}
    for res in (run_module("gitops_files", args, diff=True), _in_task_process(dict(args, path=str(tmp_path / "c2")), diff=True)):
        assert not res.get("failed"), res
        assert "hf_very_secret_value" not in repr(res)
        assert res["diff"][0]["after"] == "(content hidden: models-sa-credentials.yaml may carry a secret)\n"
    assert (out / "models-sa-credentials.yaml").read_text() == SECRET


@pytest.mark.parametrize("args, field", [
    ({"files": [{"name": "../escape.yaml", "content": "x"}]}, "files[0].name"),
    ({"files": [{"name": ".hidden.yaml", "content": "x"}]}, "files[0].name"),
    ({"files": [{"name": "a.yaml", "content": "x"}, {"name": "a.yaml", "content": "y"}]}, "files[1].name"),
    ({"files": [{"name": "kustomization.yaml", "content": "x"}]}, "files[0].name"),
    ({"resources": ["sub/a.yaml"]}, "resources[0]"),
])
def test_refusals_name_the_field(tmp_path, args, field):
    res = _in_task_process(dict(args, path=str(tmp_path / "d")))
    assert res["failed"] is True and res["field"] == field, res
    assert res["fix"] and not (tmp_path / "d").exists()


def test_a_file_where_the_directory_should_be_is_refused(tmp_path):
    (tmp_path / "d").write_text("x")
    res = run_module("gitops_files", {"path": str(tmp_path / "d"), "files": [{"name": "a.yaml", "content": "x"}]})
    assert res.failed and res["field"] == "path" and "not a directory" in res.msg


def test_a_playbook_writes_in_the_task_process_or_through_the_module_with_the_same_answer(tmp_path):
    """The action plugin's two ways in a real ansible-playbook: the local connection writes in the task's process; a task
    ``environment`` runs the module process. Check mode with --diff first (nothing written), then the writes; the secret
    file's text is in neither way's output, not even at -vvv (the module process echoes its arguments there)."""
    from tests.ansible_run import run_playbook  # pylint: disable=import-outside-toplevel
    tasks = """
- name: In the task process
  alauda.spec_decoding.gitops_files:
    path: {out}/inproc
    files:
      - {{name: models-llama.yaml, content: "{isvc}"}}
      - {{name: models-sa-credentials.yaml, content: "{secret}", secret: true}}
- name: As a module process
  alauda.spec_decoding.gitops_files:
    path: {out}/module
    files:
      - {{name: models-llama.yaml, content: "{isvc}"}}
      - {{name: models-sa-credentials.yaml, content: "{secret}", secret: true}}
  environment:
    SPEC_DECODING_TEST: "1"
""".format(out=tmp_path, isvc=ISVC.replace("\n", "\\n"), secret=SECRET.replace("\n", "\\n"))
    check = run_playbook(tmp_path, tasks=tasks, check=True, diff=True, verbosity=3)
    assert check.rc == 0, check.output
    assert not (tmp_path / "inproc").exists() and not (tmp_path / "module").exists()
    run = run_playbook(tmp_path, tasks=tasks, diff=True, verbosity=3)
    assert run.rc == 0, run.output
    for outcome in (check, run):
        inproc, module = outcome.result("In the task process"), outcome.result("As a module process")
        assert "invocation" not in inproc and "invocation" in module  # the two ways really ran
        for res in (inproc, module):
            assert res["changed"] is True and res["written"] == ["models-llama.yaml", "models-sa-credentials.yaml", "kustomization.yaml"]
            assert res["diff"][0]["after"] == ISVC and "may carry a secret" in res["diff"][1]["after"]
        assert "hf_very_secret_value" not in outcome.stdout + outcome.stderr
    for way in ("inproc", "module"):
        assert (tmp_path / way / "models-sa-credentials.yaml").read_text() == SECRET
        assert yaml.safe_load((tmp_path / way / "kustomization.yaml").read_text())["resources"] == [
            "models-llama.yaml", "models-sa-credentials.yaml"]
