"""The README's main command: deploy-eagle3 on the embedded default inventory renders GitOps files,
golden-tested and byte-identical on rerun, with no cluster."""
import os
import shutil

from tests.ansible_run import REPO, run_playbook

GOLDEN = os.path.join(REPO, "tests", "unit", "golden", "gitops")


def _deploy(tmp_path, playbook, out):
    return run_playbook(tmp_path, playbook, inventory=os.path.join(REPO, "inventories", "local"),
                        extra_vars={"spec_decoding_gitops_dir": str(out)})


def test_deploy_eagle3_default_inventory_matches_golden_and_reruns_identically(tmp_path):
    out = tmp_path / "gitops"
    run = _deploy(tmp_path, "playbooks/deploy-eagle3.yml", out)
    assert run.rc == 0, run.output
    files = sorted(os.listdir(out))
    assert files == ["kustomization.yaml", "models-llama-eagle3.yaml"]
    if os.environ.get("UPDATE_GOLDEN"):
        for name in files:
            shutil.copy(out / name, os.path.join(GOLDEN, name))
    for name in files:
        with open(os.path.join(GOLDEN, name)) as handle:
            assert (out / name).read_text() == handle.read(), "%s differs from the golden file" % name
    first = {name: (out / name).read_bytes() for name in files}
    rerun = _deploy(tmp_path, "playbooks/deploy-eagle3.yml", out)
    assert rerun.rc == 0 and rerun.changed == 0, rerun.output
    assert {name: (out / name).read_bytes() for name in files} == first


def test_baseline_and_ngram_share_everything_but_the_flag(tmp_path):
    out = tmp_path / "gitops"
    assert _deploy(tmp_path, "playbooks/deploy.yml", out).rc == 0
    assert _deploy(tmp_path, "playbooks/deploy-ngram.yml", out).rc == 0
    baseline = (out / "models-llama.yaml").read_text()
    ngram = (out / "models-llama-ngram.yaml").read_text()
    spec_line = [line for line in ngram.splitlines() if "--speculative-config" in line]
    assert len(spec_line) == 1
    assert ngram.replace("llama-ngram", "llama").replace(" \\\n" + spec_line[0] + "\n", "\n") == baseline
    kustomization = (out / "kustomization.yaml").read_text()
    assert "- models-llama-ngram.yaml\n- models-llama.yaml\n" in kustomization


def test_check_mode_writes_no_files(tmp_path):
    out = tmp_path / "gitops"
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", inventory=os.path.join(REPO, "inventories", "local"),
                       extra_vars={"spec_decoding_gitops_dir": str(out)}, check=True)
    assert run.rc == 0, run.output
    assert not out.exists() or os.listdir(out) == []
