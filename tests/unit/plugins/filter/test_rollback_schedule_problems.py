"""Filter alauda.spec_decoding.rollback_schedule_problems: directly, and through the rollback_schedule role in a real
ansible-playbook run (GitOps output only, so no cluster: the role's single check runs the filter, then renders and writes)."""
from __future__ import annotations

import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.rollback_schedule_problems import FilterModule, rollback_schedule_problems
from tests.ansible_run import DID_NOT_FAIL, run_cases

GOOD = {"name": "spec-decoding-rollback", "namespace": "models", "target_namespaces": ["models"], "names": ["models/llama-eagle3"],
        "label_selector": "", "cron": "0 3 * * *", "output_dir": "out", "apply": False}


def test_registered_name():
    assert FilterModule().filters()["rollback_schedule_problems"] is rollback_schedule_problems


def test_good_settings_have_no_problems_and_bad_ones_are_listed():
    assert rollback_schedule_problems(GOOD) == []
    assert rollback_schedule_problems(dict(GOOD, names=["Bad_Name"], cron="61 3 * * *")) == [
        "rollback_schedule_names[0]: Bad_Name is not an InferenceService name or namespace/name. Fix: use lowercase DNS-1123 names, "
        "e.g. llama-eagle3 or models/llama-eagle3",
        'rollback_schedule_cron: minute field 61 is outside 0-59. Fix: write a standard 5-field cron expression, e.g. "0 3 * * *"']


@pytest.mark.parametrize("bad, fragment", [
    ("0 3 * * *", "expects a dictionary of the rollback_schedule settings (name, namespace, target_namespaces, names, cron, ...), got str"),
    (None, "expects a dictionary of the rollback_schedule settings (name, namespace, target_namespaces, names, cron, ...), got NoneType"),
    (dict(GOOD, names="llama-eagle3"), "rollback_schedule_problems: names must be a list, got str"),
    (dict(GOOD, target_namespaces="models"), "rollback_schedule_problems: target_namespaces must be a list, got str"),
])
def test_bad_input(bad, fragment):
    with pytest.raises(AnsibleFilterError) as exc:
        rollback_schedule_problems(bad)
    assert fragment in str(exc.value)


def _role(out_dir, **settings):
    role_vars = {"rollback_schedule_namespace": "models", "rollback_schedule_names": ["models/llama-eagle3"],
                 "rollback_schedule_output_dir": out_dir}
    role_vars.update(("rollback_schedule_" + k, v) for k, v in settings.items())
    return {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.rollback_schedule"}, "vars": role_vars}


@pytest.fixture(scope="module")
def role_runs(tmp_path_factory):
    """One ansible-playbook run of the role: a schedule that renders, and wrong settings refused before anything is written."""
    tmp = tmp_path_factory.mktemp("rollback_schedule")
    cases = [
        ("renders", _role(str(tmp / "renders"), cron="30 2 * * MON-FRI", target_namespaces=["models", "team-a"])),
        ("bad-name-and-cron", _role(str(tmp / "bad-name-and-cron"), names=["Bad_Name"], cron="61 3 * * *")),
        ("four-fields", _role(str(tmp / "four-fields"), cron="0 3 * *")),
        ("nowhere", _role("", apply=False)),
        ("llmisvc-kserve-namespace", _role(str(tmp / "llmisvc"), resource_kind="LLMInferenceService", kserve_namespace="KServe")),
    ]
    run, results = run_cases(tmp, cases)
    assert run.tasks, run.output
    return tmp, run, results


def _tasks(run, case):
    """The role's tasks one case ran (ansible's own argument-spec validation left out)."""
    return [t for t in run.case_tasks(case) if not t.startswith("Validating arguments against arg spec")]


def test_the_role_renders_a_good_schedule(role_runs):
    tmp, run, results = role_runs
    assert results["renders"]["msg"] == DID_NOT_FAIL, results["renders"]
    assert _tasks(run, "renders")[0] == "Check the schedule settings before anything is written or applied"
    written = sorted(os.listdir(tmp / "renders"))
    assert "kustomization.yaml" in written and "cronjob-models-spec-decoding-rollback.yaml" in written
    assert {"role-models-spec-decoding-rollback.yaml", "role-team-a-spec-decoding-rollback.yaml"} <= set(written)
    cronjob = yaml.safe_load((tmp / "renders" / "cronjob-models-spec-decoding-rollback.yaml").read_text())
    assert cronjob["spec"]["schedule"] == "30 2 * * MON-FRI"


@pytest.mark.parametrize("case, messages", [
    ("bad-name-and-cron", ["rollback_schedule_names[0]: Bad_Name is not an InferenceService name or namespace/name. Fix: use lowercase "
                           "DNS-1123 names, e.g. llama-eagle3 or models/llama-eagle3",
                           'rollback_schedule_cron: minute field 61 is outside 0-59. Fix: write a standard 5-field cron expression, '
                           'e.g. "0 3 * * *"']),
    ("four-fields", ["rollback_schedule_cron: '0 3 * *' has 4 field(s), a CronJob schedule has 5 (minute hour day-of-month month "
                     'day-of-week). Fix: write a standard 5-field cron expression, e.g. "0 3 * * *"']),
    ("nowhere", ["rollback_schedule_output_dir: is empty and rollback_schedule_apply is false: the manifests would go nowhere. Fix: set "
                 "rollback_schedule_output_dir and/or rollback_schedule_apply: true (where the manifests go)"]),
    ("llmisvc-kserve-namespace", ["rollback_schedule_kserve_namespace: 'KServe' is not a valid DNS-1123 label (lowercase letters, digits "
                                  "and '-', starting and ending with a letter or digit, at most 63 characters). Fix: use e.g. 'kserve'"]),
])
def test_the_role_refuses_wrong_settings_before_writing(role_runs, case, messages):
    tmp, run, results = role_runs
    assert results[case]["msg"] == "; ".join(messages)
    assert results[case]["task"] == "Check the schedule settings before anything is written or applied"
    assert _tasks(run, case) == ["Check the schedule settings before anything is written or applied"]
    assert not os.path.exists(tmp / case)
