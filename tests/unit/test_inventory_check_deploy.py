"""Issue 48 through ansible-playbook, as users run it: the inventory_check role first in every playbook (a wrong choice in one
short line naming the inventory variable, a misspelt variable refused or only warned about), and the air gap on an
LLMInferenceService's image in a GitOps render."""
import json
import os
import shutil

import yaml

from tests.ansible_run import DID_NOT_FAIL, REPO, run_cases, run_playbook

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command

CHECK = "alauda.spec_decoding.inventory_check"
ARGUMENT_CHECK = "argument_check : Validating arguments against arg spec 'main' of the role, one line per problem"
FORCED = {"deploy-eagle3.yml": "eagle3", "deploy-ngram.yml": "ngram", "deploy-draft-model.yml": "draft_model"}


def test_every_playbook_checks_the_inventory_first():
    for name in sorted(os.listdir(os.path.join(REPO, "playbooks"))):
        with open(os.path.join(REPO, "playbooks", name)) as handle:
            (play,) = yaml.safe_load(handle)
        first = play["roles"][0]
        assert first["role"] == CHECK, "%s: first role is %s" % (name, first["role"])
        assert not play.get("pre_tasks"), name
        if name in FORCED:
            assert first["vars"]["inventory_check_method"] == FORCED[name] == play["roles"][1]["vars"]["inference_service_method"]


def test_a_wrong_choice_fails_first_in_one_short_line(tmp_path):
    out = tmp_path / "gitops"
    run = run_playbook(tmp_path, "playbooks/deploy.yml", inventory=os.path.join(REPO, "inventories", "local"),
                       extra_vars={"spec_decoding_gitops_dir": str(out), "spec_decoding_method": "eagle-3"})
    assert run.rc != 0
    failed = run.failed[-1]
    line = json.dumps(failed)
    print("eagle-3 through deploy.yml: the failed result is %d characters of JSON: %s" % (len(line), failed["msg"]))
    assert len(failed["msg"]) < 300 and "spec_decoding_method" in failed["msg"] and "eagle3" in failed["msg"], failed
    assert "inference_service_method" not in line and "argument_spec_data" not in failed and len(line) < 400, line
    ran = [name for name, _host, _res in run.tasks]
    assert ran[-1] == CHECK + " : Refuse values the roles would refuse (one line each), before anything is read or written", ran
    assert not any("Render" in n for n in ran), ran
    assert not out.exists()


def test_a_misspelt_variable_is_refused_or_with_the_setting_only_warned_about(tmp_path):
    """Two hosts, one batch each: `warned` sets spec_decoding_unknown_variables: warn and renders (k stays 3: the misspelt
    variable changes nothing, as the warning says); `misspelt` is refused before anything is written."""
    inventory = tmp_path / "inventory"
    shutil.copytree(os.path.join(REPO, "inventories", "local", "group_vars"), inventory / "group_vars")
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    hosts = {"warned": dict(local, spec_decoding_method="eagle3", spec_decoding_num_speculative_tokens=5,
                            spec_decoding_unknown_variables="warn"),
             "misspelt": dict(local, spec_decoding_method="eagle3", spec_decoding_num_speculative_tokens=5)}
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"spec_decoding_targets": {"hosts": hosts}}}}, sort_keys=False))
    out = tmp_path / "gitops"
    run = run_playbook(tmp_path, "playbooks/deploy.yml", inventory=str(inventory), extra_vars={"spec_decoding_gitops_dir": str(out)})
    assert run.rc != 0
    results = {(name.split(" : ", 1)[-1], host): res for name, host, res in run.tasks}
    warning = results[("Warn about variables nothing reads", "warned")]["msg"]
    assert warning.startswith("WARNING: spec_decoding_num_speculative_tokens: no role or playbook") and \
        "spec_decoding_speculative: {num_speculative_tokens: 5}" in warning, warning
    assert sorted(os.listdir(out)) == ["kustomization.yaml", "models-warned-eagle3.yaml"]
    # The roles' own argument check (their dependency argument_check): inventory_check's runs (nothing checked it yet) and
    # finds nothing; inference_service's is not run again, the playbook's inventory_check having checked it.
    checks = [res for name, host, res in run.tasks if host == "warned" and name.endswith(ARGUMENT_CHECK)]
    assert [c.get("skipped") for c in checks] == [True, True], checks
    assert checks[0]["false_condition"] == "__argument_check_problems | length > 0", checks[0]
    assert checks[1]["false_condition"].startswith("not (__inventory_check_checked is defined"), checks[1]
    model = yaml.safe_load((out / "models-warned-eagle3.yaml").read_text())["spec"]["predictor"]["model"]
    assert vllm_command.find_speculative_config(model["command"] + model.get("args", []))["num_speculative_tokens"] == 3
    refused = results[("Refuse variables nothing reads (a misspelt name changes nothing)", "misspelt")]
    assert refused["failed"] and refused["msg"].startswith("spec_decoding_num_speculative_tokens: "), refused
    assert not any(host == "misspelt" and "Render" in name for name, host, _res in run.tasks)


def test_an_air_gapped_llminferenceservice_needs_an_internal_image(tmp_path):
    """The issue's case: spec_decoding_llmisvc.image on docker.io rendered without a word, and no image at all (KServe's
    presets' public image) was only warned about. Both are refused by the role's first task; an internal image renders."""
    out = tmp_path / "gitops"
    common = {"spec_decoding_target": "gitops", "spec_decoding_gitops_dir": str(out), "spec_decoding_namespace": "models",
              "spec_decoding_resource_kind": "LLMInferenceService", "spec_decoding_air_gapped": True,
              "spec_decoding_artifact_mode": "pvc", "spec_decoding_artifacts": {"pvc_name": "model-store"},
              "inference_service_method": "ngram"}
    images = {"docker-hub": {"image": "docker.io/vllm/vllm-openai:v0.30.0"}, "preset": {},
              "internal": {"image": "registry.internal.example:5000/vllm/vllm-openai:v0.32.0"}}
    cases = [(cid, {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.inference_service"},
                    "vars": dict(common, spec_decoding_isvc_name="airgap-" + cid, spec_decoding_llmisvc=llmisvc)})
             for cid, llmisvc in images.items()]
    run, results = run_cases(tmp_path, cases)
    for cid in ("docker-hub", "preset"):
        msg = results[cid]["msg"]
        assert results[cid]["task"].startswith("Refuse sources that need the internet"), (cid, results[cid])
        assert msg.startswith("spec_decoding_llmisvc.image: spec_decoding_air_gapped: true refuses"), msg
        fix = msg.split(". Fix: ", 1)[1]
        assert "set spec_decoding_llmisvc.image to" in fix and "registry.internal.example:5000/vllm/vllm-openai" in fix, msg
    assert "docker.io" in results["docker-hub"]["msg"] and "well-known presets" in results["preset"]["msg"]
    assert results["internal"]["msg"] == DID_NOT_FAIL, run.output
    assert sorted(os.listdir(out)) == ["kustomization.yaml", "models-airgap-internal.llmisvc.yaml"]
