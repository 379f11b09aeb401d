"""GitOps renders of the default inventory, with no cluster. The README's main command itself (deploy-eagle3: golden
files, a rerun that changes nothing) is run verbatim on a clean copy by tests/unit/test_first_inventory_guide.py."""
import os

import yaml

from tests.ansible_run import REPO, run_playbook


def _deploy(tmp_path, playbook, out):
    return run_playbook(tmp_path, playbook, inventory=os.path.join(REPO, "inventories", "local"),
                        extra_vars={"spec_decoding_gitops_dir": str(out)})


def test_baseline_and_ngram_share_everything_but_the_flag(tmp_path):
    out = tmp_path / "gitops"
    assert _deploy(tmp_path, "playbooks/deploy.yml", out).rc == 0
    assert _deploy(tmp_path, "playbooks/deploy-ngram.yml", out).rc == 0
    baseline = (out / "models-llama.yaml").read_text()
    ngram = (out / "models-llama-ngram.yaml").read_text()
    spec_line = [line for line in ngram.splitlines() if "--speculative-config" in line]
    # the speculative side also carries --per-request-spec-decode-metrics (spec_decoding_per_request_metrics auto)
    per_request = [line for line in ngram.splitlines() if "--per-request-spec-decode-metrics summary" in line]
    assert len(spec_line) == 1 and len(per_request) == 1
    assert ngram.replace("llama-ngram", "llama").replace(" \\\n" + per_request[0] + "\n" + spec_line[0] + "\n", "\n") == baseline
    kustomization = (out / "kustomization.yaml").read_text()
    assert "- models-llama-ngram.yaml\n- models-llama.yaml\n" in kustomization


def test_check_mode_writes_no_files(tmp_path):
    out = tmp_path / "gitops"
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", inventory=os.path.join(REPO, "inventories", "local"),
                       extra_vars={"spec_decoding_gitops_dir": str(out)}, check=True)
    assert run.rc == 0, run.output
    assert not out.exists() or os.listdir(out) == []


def test_the_oci_mode_variable_reaches_the_storage_rules_of_a_gitops_render(tmp_path):
    """spec_decoding_oci_model_mode (no cluster to read it from): two oci:// storageUris under one parent render for a
    native-mode cluster, and are refused with KServe's words for a modelcar-mode one, or an oci:// one with OCI off."""
    from tests.ansible_run import DID_NOT_FAIL, run_cases  # pylint: disable=import-outside-toplevel
    out = tmp_path / "gitops"
    art = {"target_uri": "oci://registry.local/llama:v1", "draft_uri": "oci://registry.local/eagle3:v1",
           "target_mount_path": "/mnt/models/target", "draft_mount_path": "/mnt/models/draft"}

    def case(name, mode, **more):
        return (name, {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.inference_service"},
                       "vars": dict({"spec_decoding_target": "gitops", "spec_decoding_gitops_dir": str(out), "spec_decoding_namespace": "models",
                                     "spec_decoding_isvc_name": name, "spec_decoding_method": "eagle3", "spec_decoding_kserve_version": "0.20.0",
                                     "spec_decoding_vllm_version": "0.32.0", "spec_decoding_artifact_mode": "storage_uris",
                                     "spec_decoding_artifacts": art, "spec_decoding_oci_model_mode": mode}, **more)})

    per_request_out = tmp_path / "gitops-per-request"
    # the per-request metrics variable reaches the render too: off renders no flag; detailed on a release without it is refused
    run, results = run_cases(tmp_path, [case("native", "native"), case("modelcar", "modelcar"), case("off", "disabled"),
                                        case("per-request-off", "native", spec_decoding_per_request_metrics="off",
                                             spec_decoding_gitops_dir=str(per_request_out)),
                                        case("per-request-old", "native", spec_decoding_per_request_metrics="detailed",
                                             spec_decoding_vllm_version="0.24.0", spec_decoding_gitops_dir=str(per_request_out))])
    assert "--per-request-spec-decode-metrics summary" in (out / "models-native.yaml").read_text()
    assert results["per-request-off"]["msg"] == DID_NOT_FAIL, run.output
    assert "--per-request-spec-decode-metrics" not in (per_request_out / "models-per-request-off.yaml").read_text()
    old = results["per-request-old"]["msg"]
    assert "spec_decoding_per_request_metrics" in old and "0.24" in old and not (per_request_out / "models-per-request-old.yaml").exists(), old
    assert results["native"]["msg"] == DID_NOT_FAIL, run.output
    rendered = yaml.safe_load((out / "models-native.yaml").read_text())
    assert rendered["spec"]["predictor"]["storageUris"] == [{"uri": art["target_uri"], "mountPath": "/mnt/models/target"},
                                                            {"uri": art["draft_uri"], "mountPath": "/mnt/models/draft"}]
    modelcar = results["modelcar"]["msg"]
    assert modelcar.startswith("artifacts.storage_uris[1].mountPath:") and 'share parent directory "/mnt/models"' in modelcar, modelcar
    assert results["off"]["msg"].startswith("artifacts.target_uri:") and "OCI off" in results["off"]["msg"], results["off"]
    assert sorted(os.listdir(out)) == ["kustomization.yaml", "models-native.yaml"]
