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


def test_a_crd_rule_the_render_breaks_stops_the_deploy_before_anything_is_written(tmp_path):
    """spec_decoding_kserve_crds points at the cluster's own CRDs (here one with a rule KServe 0.20 lacks): the render refuses
    with the rule's message and field, and the GitOps directory stays empty."""
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "llminferenceservices.serving.kserve.io"},
           "spec": {"group": "serving.kserve.io", "names": {"kind": "LLMInferenceService", "plural": "llminferenceservices"},
                    "scope": "Namespaced", "versions": [{"name": "v1alpha2", "served": True, "storage": True, "schema": {
                        "openAPIV3Schema": {"type": "object", "properties": {"spec": {
                            "type": "object", "x-kubernetes-validations": [
                                {"rule": "!has(self.replicas) || self.replicas >= 2", "fieldPath": ".replicas",
                                 "message": "at least 2 replicas (a PodDisruptionBudget keeps one)"}]}}}}}]}}
    (tmp_path / "crds").mkdir()
    (tmp_path / "crds" / "llmisvc.yaml").write_text(yaml.safe_dump(crd))
    out = tmp_path / "gitops"
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", inventory=os.path.join(REPO, "inventories", "local"),
                       extra_vars={"spec_decoding_gitops_dir": str(out), "spec_decoding_resource_kind": "LLMInferenceService",
                                   "spec_decoding_kserve_crds": str(tmp_path / "crds")})
    assert run.rc != 0
    assert "spec.replicas: at least 2 replicas (a PodDisruptionBudget keeps one) (x-kubernetes-validations rule " \
           "`!has(self.replicas) || self.replicas >= 2` of the CRDs in %s, LLMInferenceService v1alpha2)" % (tmp_path / "crds") \
           in run.output
    assert not out.exists() or os.listdir(out) == []
