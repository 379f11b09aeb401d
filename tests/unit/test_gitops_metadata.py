"""spec_decoding_annotations / spec_decoding_labels through the inference_service role to the GitOps file: the inventory's
keys land in metadata next to the collection's own, and a collection key with another value is refused, naming the
variable that sets it, before anything is written."""
import os

import yaml

from tests.ansible_run import DID_NOT_FAIL, run_cases


def test_inventory_annotations_and_labels_reach_the_rendered_file(tmp_path):
    out = tmp_path / "gitops"

    def case(name, annotations, labels, **more):
        variables = {"spec_decoding_target": "gitops", "spec_decoding_gitops_dir": str(out), "spec_decoding_namespace": "models",
                     "spec_decoding_isvc_name": name, "spec_decoding_method": "ngram", "spec_decoding_kserve_version": "0.20.0",
                     "spec_decoding_vllm_version": "0.32.0", "spec_decoding_artifacts": {"storage_uri": "pvc://model-store/llama"},
                     "spec_decoding_annotations": annotations, "spec_decoding_labels": labels}
        variables.update(more)
        return (name, {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.inference_service"}, "vars": variables})

    run, results = run_cases(tmp_path, [
        case("mine", {"testbed.alauda.io/run": "process", "example.com/owner": "search-team"}, {"team": "search"}),
        case("knative", {"serving.kserve.io/deploymentMode": "Knative"}, {}),
        case("unquoted", {}, {"canary": True}),
    ])
    assert results["mine"]["msg"] == DID_NOT_FAIL, run.output
    manifest = yaml.safe_load((out / "models-mine.yaml").read_text())
    assert manifest["metadata"]["annotations"] == {"serving.kserve.io/deploymentMode": "Standard", "testbed.alauda.io/run": "process",
                                                   "example.com/owner": "search-team"}
    assert manifest["metadata"]["labels"] == {"aml.cpaas.io/runtime-type": "vllm", "team": "search"}

    knative = results["knative"]["msg"]
    assert knative.startswith("annotations[serving.kserve.io/deploymentMode]:"), knative
    assert "is set by the collection to 'Standard' (from deployment_mode)" in knative and "spec_decoding_deployment_mode" in knative
    unquoted = results["unquoted"]["msg"]
    assert unquoted.startswith("labels[canary]:") and 'canary: "true"' in unquoted, unquoted
    # The refused cases wrote nothing: only the accepted manifest and the kustomization are there.
    assert sorted(os.listdir(out)) == ["kustomization.yaml", "models-mine.yaml"]
