"""What the roles tell their user, run as users run them (ansible-playbook, no cluster): the GitOps render names the files
it wrote and where, a check-mode render into a directory that does not exist yet warns about nothing, and the
rollback_schedule role's description lists the verbs of the Role it renders (issue #48)."""
import os
import re

import yaml

from tests.ansible_run import REPO, run_playbook

ARGUMENT_SPECS = os.path.join(REPO, "roles", "rollback_schedule", "meta", "argument_specs.yml")


def _warnings(run):
    return [w for _name, _host, res in run.tasks for w in res.get("warnings", [])]


def test_a_gitops_render_says_where_it_wrote_and_check_mode_on_a_new_directory_warns_nothing(tmp_path):
    out = tmp_path / "new" / "gitops"
    inventory = os.path.join(REPO, "inventories", "local")
    check = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", inventory=inventory,
                         extra_vars={"spec_decoding_gitops_dir": str(out)}, check=True)
    assert check.rc == 0, check.output
    assert not out.exists()
    assert not [w for w in _warnings(check) if "not a directory" in w], _warnings(check)
    assert "not a directory" not in check.stdout + check.stderr
    said = check.result("Say where the manifests were written")["msg"]
    assert said == ("Would write (check mode) models-llama-eagle3.yaml, kustomization.yaml in %s (commit the directory, or point "
                    "spec_decoding_gitops_dir elsewhere)" % out), said
    # the kustomization's diff in check mode still lists the manifest the render would write
    written = check.result("and kustomization.yaml")
    assert written["changed"] is True and written["written"] == ["models-llama-eagle3.yaml", "kustomization.yaml"]
    assert written["resources"] == ["models-llama-eagle3.yaml"]

    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", inventory=inventory, extra_vars={"spec_decoding_gitops_dir": str(out)})
    assert run.rc == 0, run.output
    said = run.result("Say where the manifests were written")["msg"]
    assert said.startswith("Wrote models-llama-eagle3.yaml, kustomization.yaml in %s " % out), said
    assert sorted(os.listdir(out)) == ["kustomization.yaml", "models-llama-eagle3.yaml"]


# "C(get)/C(list) on C(pods)": the verbs and the resource of one rule as the role's description writes them.
_RULE_IN_PROSE = re.compile(r"((?:C\([a-z]+\)/)*C\([a-z]+\)) on C\(([a-z/]+)\)")


def _described(text):
    found = {}
    for verbs, resource in _RULE_IN_PROSE.findall(text):
        found.setdefault(resource, set()).update(re.findall(r"C\(([a-z]+)\)", verbs))
    return found


def test_the_rollback_schedule_description_lists_the_verbs_of_the_role_it_renders(tmp_path):
    with open(ARGUMENT_SPECS, encoding="utf-8") as handle:
        spec = yaml.safe_load(handle)["argument_specs"]["main"]
    isvc_text, llmisvc_text = spec["description"][0], spec["description"][1]
    draft_text = " ".join(spec["options"]["rollback_schedule_remove_draft_artifacts"]["description"])
    tasks = ""
    for kind, draft in (("InferenceService", False), ("LLMInferenceService", False), ("InferenceService", True)):
        tasks += """
- name: Render {kind} {draft}
  ansible.builtin.include_role:
    name: alauda.spec_decoding.rollback_schedule
  vars:
    rollback_schedule_namespace: ops
    rollback_schedule_target_namespaces: [models]
    rollback_schedule_names: [llama-eagle3]
    rollback_schedule_resource_kind: {kind}
    rollback_schedule_remove_draft_artifacts: {draft}
    rollback_schedule_output_dir: {out}
""".format(kind=kind, draft=str(draft).lower(), out=tmp_path / ("out-%s-%s" % (kind, draft)))
    # The Git modes' job (issue #47): its credentials Secret by name only, and the owners read (and patched, in emergency mode)
    # where they live.
    tasks += """
- name: Render the emergency mode
  ansible.builtin.include_role:
    name: alauda.spec_decoding.rollback_schedule
  vars:
    rollback_schedule_namespace: ops
    rollback_schedule_target_namespaces: [models]
    rollback_schedule_names: [llama-eagle3]
    rollback_schedule_mode: emergency
    rollback_schedule_git_credentials_secret: deploy-key
    rollback_schedule_gitops_namespaces: [argocd]
    rollback_schedule_output_dir: {out}
""".format(out=tmp_path / "out-emergency")
    run = run_playbook(tmp_path, tasks=tasks)
    assert run.rc == 0, run.output
    renders = [res["ansible_facts"]["rollback_schedule_manifests"] for name, _h, res in run.tasks if "Render the CronJob" in name]
    assert len(renders) == 4, run.output
    emergency = {(m["kind"], m["metadata"]["namespace"], m["metadata"]["name"]): m for m in renders[3]}
    job_vars = yaml.safe_load(emergency[("ConfigMap", "ops", "spec-decoding-rollback-vars")]["data"]["vars.yml"])
    assert (job_vars["rollback_mode"], job_vars["rollback_git_credentials_secret"], job_vars["rollback_git_credentials_namespace"]) == (
        "emergency", "deploy-key", "ops"), job_vars
    assert emergency[("Role", "ops", "spec-decoding-rollback-git-credentials")]["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["deploy-key"], "verbs": ["get"]}]
    owner_rules = {r["resources"][0]: r["verbs"] for r in emergency[("Role", "argocd", "spec-decoding-rollback-gitops-owner")]["rules"]}
    assert owner_rules == {"applications": ["get", "patch"], "kustomizations": ["get", "patch"], "gitrepositories": ["get"],
                           "helmreleases": ["get"]}, owner_rules

    def rules(index):
        role = [m for m in renders[index] if m["kind"] == "Role" and m["metadata"]["namespace"] == "models"]
        assert len(role) == 1, renders[index]
        found = {}
        for rule in role[0]["rules"]:
            for resource in rule["resources"]:
                found.setdefault(resource, set()).update(rule["verbs"])
        return found

    isvc, llmisvc, with_draft = rules(0), rules(1), rules(2)
    assert _described(isvc_text) == isvc, (isvc_text, isvc)
    # the LLMInferenceService paragraph also names the presets Role in KServe's namespace (get on the same resource)
    assert _described(llmisvc_text) == llmisvc, (llmisvc_text, llmisvc)
    added = {resource: verbs - isvc.get(resource, set()) for resource, verbs in with_draft.items()}
    added = {resource: verbs for resource, verbs in added.items() if verbs}
    described = _described(draft_text)
    assert added == {resource: described[resource] - isvc.get(resource, set()) for resource in added}, (draft_text, added)
    assert {"persistentvolumeclaims", "configmaps", "jobs", "llminferenceservices"} <= set(described), described


def test_a_modelcar_build_from_a_remote_source_says_the_files_must_be_local_first(tmp_path):
    """Option B packs local directories: an s3:// target_dir is refused naming the key, why, and both ways to go on
    (copy the files first, or option C's in-cluster stager), before anything is built or pushed."""
    from tests.ansible_run import DID_NOT_FAIL, run_cases  # pylint: disable=import-outside-toplevel
    out = tmp_path / "gitops"
    local = tmp_path / "draft"
    local.mkdir()
    role_vars = {"spec_decoding_target": "gitops", "spec_decoding_gitops_dir": str(out), "spec_decoding_namespace": "models",
                 "spec_decoding_isvc_name": "llama-eagle3", "spec_decoding_method": "eagle3", "spec_decoding_kserve_version": "0.20.0",
                 "spec_decoding_vllm_version": "0.32.0", "spec_decoding_artifact_mode": "modelcar",
                 "spec_decoding_artifacts": {"modelcar_image": "registry.internal:5000/models/llama-eagle3:v1"},
                 "spec_decoding_modelcar_build": {"target_dir": "s3://models/llama", "draft_dir": str(local)}}
    run, results = run_cases(tmp_path, [("s3", {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.inference_service"},
                                                "vars": role_vars})])
    msg = results["s3"]["msg"]
    assert msg != DID_NOT_FAIL, run.output
    assert results["s3"]["task"].endswith("Refuse a remote source for the Modelcar build (its files must be local first)"), results
    assert msg.startswith("spec_decoding_modelcar_build.target_dir: s3://models/llama is not a local directory."), msg
    assert "the files must be local first" in msg and "aws s3 sync" in msg and "spec_decoding_stage_pvc" in msg, msg
    assert not out.exists()
