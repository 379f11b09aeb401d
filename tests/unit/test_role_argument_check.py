"""Issue 48 through ansible-playbook, as a user's own playbook calls the roles (no inventory_check first): every role's
argument failure is one line naming the variable (the inventory's spec_decoding_* name when the value came from it), the
value, what is allowed and the nearest choice - the role argument_check, each role's first dependency, says it before
Ansible's own check, which names the role's variable and prints the role's whole argument spec.

One ansible-playbook run: one case per role through include_role and import_role, then a play that lists a role under
`roles:`."""
import json

import yaml

from tests.ansible_run import DID_NOT_FAIL, cases_play, run_playbook

CHECK_TASK = "Validating arguments against arg spec 'main' of the role, one line per problem"
ROLE = "alauda.spec_decoding."


def _include(role, how="include_role"):
    return {"ansible.builtin." + how: {"name": ROLE + role}}


# (case, task, vars, what the line must start with, what it must hold)
CASES = [
    ("include-inventory-method", _include("inference_service"), {"spec_decoding_method": "eagle-3"},
     "spec_decoding_method: 'eagle-3' must be one of none, ngram, eagle3,",
     ["(read by alauda.spec_decoding.inference_service as inference_service_method)", "Fix: set spec_decoding_method: eagle3"]),
    ("import-stage-verify", _include("stage_pvc", "import_role"), {"stage_pvc_verify": "deep"},
     "stage_pvc_verify: 'deep' must be one of auto, full, quick (read by alauda.spec_decoding.stage_pvc)", ["Fix: set stage_pvc_verify to one of them"]),
    ("include-verify-kind", _include("verify"), {"verify_resource_kind": "InferenceServce"},
     "verify_resource_kind: 'InferenceServce' must be one of InferenceService, LLMInferenceService", ["Fix: set verify_resource_kind: InferenceService"]),
    ("include-rollback-backup", _include("rollback"), {"rollback_backup": "annotations"},
     "rollback_backup: 'annotations' must be one of annotation, file, both, none", ["Fix: set rollback_backup: annotation"]),
    ("include-watch-target", _include("watch"), {"spec_decoding_target": "gitops"},
     "spec_decoding_target: 'gitops' must be one of cluster, schedule (read by alauda.spec_decoding.watch as watch_target)", []),
    ("include-tune-load", _include("tune"), {"tune_load_from": "clusters"},
     "tune_load_from: 'clusters' must be one of auto, controller, cluster", ["Fix: set tune_load_from: cluster"]),
    ("include-benchmark-api", _include("benchmark"), {"benchmark_api": "chats"},
     "benchmark_api: 'chats' must be one of chat, completions", ["Fix: set benchmark_api: chat"]),
    ("include-schedule-policy", _include("rollback_schedule"), {"rollback_schedule_image_pull_policy": "always"},
     "rollback_schedule_image_pull_policy: 'always' must be one of Always, IfNotPresent, Never", ["Fix: set rollback_schedule_image_pull_policy: Always"]),
    ("include-troubleshoot-type", _include("troubleshoot"), {"troubleshoot_tail_lines": "many"},
     "troubleshoot_tail_lines: 'many' is not a valid int (", ["Fix: give a int"]),
    ("include-credentials-secret", _include("artifact_credentials"),
     {"artifact_credentials_registries": [{"username": "robot", "password": "hunter2"}]},
     "artifact_credentials_registries: '********' is not a valid list of dict (missing required arguments: server", []),
    ("include-inventory-check", _include("inventory_check"), {"spec_decoding_unknown_variables": "warnn"},
     "spec_decoding_unknown_variables: 'warnn' must be one of refuse, warn (read by alauda.spec_decoding.inventory_check as "
     "inventory_check_unknown_variables)", ["Fix: set spec_decoding_unknown_variables: warn"]),
]


def test_a_users_playbook_gets_one_line_per_bad_variable_from_every_role(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {"ansible_connection": "local"},
                                                           "roles-play": {"ansible_connection": "local"}}}}))
    roles_play = {"name": "roles", "hosts": "roles-play", "gather_facts": False,
                  "roles": [{"role": ROLE + "canary", "vars": {"canary_target": "gitop"}}]}
    cases = [(cid, dict(task, vars=variables)) for cid, task, variables, _start, _holds in CASES]
    # a role with good variables: the check passes and the role runs
    cases.append(("good", dict(_include("inventory_check"), vars={"spec_decoding_unknown_variables": "warn"})))
    # the `roles:` play last: its only host fails, which ends the run
    play = cases_play(cases) + [roles_play]
    path = tmp_path / "user.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False, width=1000))
    run = run_playbook(tmp_path, str(path), inventory=str(inventory))
    print("%d roles' bad variables, one ansible-playbook run: %.1f s wall, %.1f s CPU" % (len(CASES) + 1, run.wall, run.cpu))
    results = run.result("cases results")["cases_out"]

    for cid, _task, _vars, start, holds in CASES:
        got = results[cid]
        print("%s (%d characters): %s" % (cid, len(got["msg"]), got["msg"]))
        assert got["task"] == CHECK_TASK, (cid, got)
        assert got["msg"].startswith(start) and all(h in got["msg"] for h in holds), (cid, got["msg"])
        assert "\n" not in got["msg"] and len(got["msg"]) < 300, (cid, got["msg"])
    assert "hunter2" not in run.stdout + run.stderr
    # the failed results carry the message only: no argument spec
    failed = [res for name, _host, res in run.tasks if res.get("failed")]
    assert len(failed) == len(CASES) + 1 and all(len(json.dumps(res)) < 600 and "argument_spec_data" not in res for res in failed), failed
    # Ansible's own check never ran for a refused role, only for the good one
    ansible_checks = [n for n, _h, _r in run.tasks
                      if "Validating arguments against arg spec 'main' - " in n and not n.startswith(ROLE + "argument_check")]
    assert ansible_checks == [ROLE + "inventory_check : Validating arguments against arg spec 'main' - Check the inventory's variables "
                                     "before anything is read or written"], ansible_checks

    assert results["good"]["msg"] == DID_NOT_FAIL, run.output
    assert run.case_tasks("good")[:3] == ["Validating arguments against arg spec 'main' - Check the dependent role's variables in one line "
                                          "each, before Ansible's own argument check", CHECK_TASK,
                                          "Validating arguments against arg spec 'main' - Check the inventory's variables before anything "
                                          "is read or written"], run.case_tasks("good")

    (canary,) = [res for _n, host, res in run.tasks if host == "roles-play" and res.get("failed")]
    print("roles: canary (%d characters): %s" % (len(canary["msg"]), canary["msg"]))
    assert canary["msg"] == ("canary_target: 'gitop' must be one of cluster, gitops, schedule (read by alauda.spec_decoding.canary). "
                             "Fix: set canary_target: gitops"), canary["msg"]
