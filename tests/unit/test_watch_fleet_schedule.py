"""The watch role's fleet form scheduled (issue 53), run as users run it (ansible-playbook, no cluster): with a label
selector the CronJob gets the selector and the namespaces, so that each run finds the services again, and a Role per
namespace (one playbook run: about 8 CPU s). The fleet form on a cluster is ops/fleet_checks.py's
(tests/unit/test_fleet_checks.py) and its discovery the rollback's."""
import json

import yaml

from tests.ansible_run import run_playbook


def test_a_selector_is_passed_to_the_scheduled_job_with_a_role_per_namespace(tmp_path):
    out = tmp_path / "watch"
    extra = {"watch_names": ["models/llm"], "watch_label_selector": "team=llm", "watch_namespaces": ["team-a", "team-b"],
             "watch_target": "schedule", "watch_schedule_output_dir": str(out), "watch_schedule_namespace": "ops"}
    run = run_playbook(tmp_path, "playbooks/watch.yml", extra_vars=extra)
    assert run.rc == 0, run.output
    docs = [yaml.safe_load(p.read_text()) for p in out.glob("*.yaml") if p.name != "kustomization.yaml"]
    assert sorted(d["metadata"]["namespace"] for d in docs if d["kind"] == "Role") == ["models", "team-a", "team-b"]
    job_vars = json.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["vars.yml"])
    assert job_vars["watch_label_selector"] == "team=llm"
    assert job_vars["watch_namespaces"] == ["team-a", "team-b", "models"] and job_vars["watch_names"] == ["models/llm"]
    assert not [k for k in job_vars if k.startswith("rollback_")]
