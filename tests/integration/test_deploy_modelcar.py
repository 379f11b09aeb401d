"""Deploy's `modelcar` mode builds and pushes the Modelcar image to a real loopback registry, then applies an
InferenceService that references it by digest (a re-pushed tag would not roll the pods)."""
from __future__ import annotations

import json
import subprocess

from tests.ansible_run import run_playbook
from tests.integration.test_deploy import _get, _vars
from tests.testbed.registry import Registry, ensure_tools


def test_modelcar_build_push_and_apply_by_digest(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    ensure_tools()
    target, draft = tmp_path / "target", tmp_path / "draft"
    for directory, name in ((target, "model.safetensors"), (draft, "draft.safetensors")):
        directory.mkdir()
        (directory / name).write_bytes(name.encode() * 4096)
        (directory / "config.json").write_text(json.dumps({"name": name}))
    with Registry(str(tmp_path / "registry"), auth="htpasswd", users={"alice": "canary-Registry-Pa55"}) as registry:
        image = "%s/models/llama-eagle3:v1" % registry.host
        kserve.set_behaviour(namespace, "llama-eagle3", ready_after=0.5)
        extra = _vars(namespace, "llama-eagle3", spec_decoding_artifact_mode="modelcar",
                      spec_decoding_artifacts={"modelcar_image": image},
                      spec_decoding_modelcar_build={"target_dir": str(target), "draft_dir": str(draft), "username": "alice",
                                                    "password": "canary-Registry-Pa55", "tls_verify": False})
        run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=extra, kubeconfig=kubeconfig, verbosity=3)
        assert run.rc == 0, run.output
        pushed = run.result("Build and push the Modelcar image")
        assert pushed["changed"] is True and pushed["layers_pushed"] >= 4
        isvc = _get(k8s_client, namespace, "llama-eagle3")
        uri = isvc["spec"]["predictor"]["model"]["storageUri"]
        assert uri == "oci://%s/models/llama-eagle3@%s" % (registry.host, pushed["digest"])
        script = isvc["spec"]["predictor"]["model"]["command"][2]
        assert '"model":"/mnt/models/draft"' in script and "--model /mnt/models/target " in script
        raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--creds", "alice:canary-Registry-Pa55",
                              "docker://" + image], capture_output=True, text=True, check=True).stdout
        titles = {layer.get("annotations", {}).get("org.opencontainers.image.title") for layer in json.loads(raw)["layers"]}
        assert {"/models/target/model.safetensors", "/models/draft/draft.safetensors"} <= titles or \
            any(t and t.endswith("draft/draft.safetensors") for t in titles), titles
        # The password never shows, even at -vvv.
        assert "canary-Registry-Pa55" not in run.stdout + run.stderr

        rerun = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=extra, kubeconfig=kubeconfig)
        assert rerun.rc == 0, rerun.output
        assert rerun.result("Build and push the Modelcar image")["bytes_pushed"] == 0
        assert rerun.changed == 0, rerun.output
