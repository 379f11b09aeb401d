"""The README's LLMInferenceService command: deploy-eagle3 on the embedded default inventory with
`-e spec_decoding_resource_kind=LLMInferenceService` writes a manifest that validates against the real CRD's schema."""
import os

import yaml

from tests.ansible_run import REPO, run_playbook
from tests.testbed import crds
from tests.testbed.llmisvc_standin import schema_errors

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command


def test_deploy_eagle3_gitops_render_of_an_llminferenceservice_validates_against_the_crd(tmp_path):
    out = tmp_path / "gitops"
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", inventory=os.path.join(REPO, "inventories", "local"),
                       extra_vars={"spec_decoding_gitops_dir": str(out), "spec_decoding_resource_kind": "LLMInferenceService"})
    assert run.rc == 0, run.output
    assert sorted(os.listdir(out)) == ["kustomization.yaml", "models-llama-eagle3.llmisvc.yaml"]
    manifest = yaml.safe_load((out / "models-llama-eagle3.llmisvc.yaml").read_text())
    assert manifest["apiVersion"] == "serving.kserve.io/v1alpha2" and manifest["kind"] == "LLMInferenceService"
    assert schema_errors(manifest, crds.resolve()) == []
    assert manifest["spec"]["model"]["uri"] == "pvc://model-store/"
    main = manifest["spec"]["template"]["containers"][0]
    assert main["name"] == "main"
    assert vllm_command.find_speculative_config(main["command"]) == {
        "method": "eagle3", "model": "/mnt/models/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}
    assert yaml.safe_load((out / "kustomization.yaml").read_text())["resources"] == ["models-llama-eagle3.llmisvc.yaml"]
