"""`rollback_remove_draft_artifacts: true` in PVC and Modelcar mode, against the real kube-apiserver (tests/testbed).

PVC: the InferenceService reads `storageUri: pvc://models-pvc/` with the target in `target/` and the draft in
`draft/`, staged for real by the shipped sync script into a temporary directory standing in for the PVC. After
the rollback is Ready and proven, the role's remover Job is played like the stager Job in test_stage_pvc (the
ConfigMap's script runs for real on that directory, its output becomes the pod log, its exit code the Job status).

Modelcar: the image is built and pushed to a real loopback registry (Debian's docker-registry); the rollback pushes
an image without /models/draft from the same blobs and moves storageUri to it; skopeo reads it back.
"""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import tarfile
import urllib.request

import pytest

from tests.ansible_run import run_playbook
from tests.integration.test_rollback import NAME, _api, _capture, _get, _manifest, _rollback_vars, _wait_ready
from tests.integration.test_stage_pvc import StagerPod, _batch, _core, _write_model
from tests.testbed.registry import Registry, ensure_tools

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import artifact_sync
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import modelcar_image
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import oci_blobs
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import modelcar_push
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as oci_registry

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
STAGED = "spec-decoding.alauda.io/staged"
REMOVED = "spec-decoding.alauda.io/draft-removed"
TARGET, DRAFT = "meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
PVC = "models-pvc"
JOB_IMAGE = "registry.internal.example/vllm/vllm-openai:v0.11.0"


def _deploy(k8s_client, kserve, namespace, storage_uri):
    """The guide's EAGLE-3 service, reading target and draft from one storageUri (PVC or Modelcar)."""
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=_capture("baseline"))
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=_capture("eagle3"), generation=1)
    manifest = _manifest("guide_example2_eagle3.yaml", namespace)
    predictor = manifest["spec"]["predictor"]
    del predictor["storageUris"]
    predictor["model"]["storageUri"] = storage_uri
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    return _wait_ready(k8s_client, namespace)


def _vars(namespace, **more):
    return _rollback_vars(namespace, rollback_remove_draft_artifacts=True, rollback_draft_job_poll_interval=1,
                          rollback_draft_job_timeout=120, rollback_draft_job_image=JOB_IMAGE, **more)


# --------------------------------------------------------------------------------------------------
# PVC
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def pvc_service(tmp_path, k8s_client, kserve, namespace):
    """A PVC (its stand-in directory staged by artifact_sync for real) and the service reading it."""
    root = tmp_path / "pvc"
    staged = {}
    for subdir, name, seed in (("target", TARGET, 1), ("draft", DRAFT, 2)):
        src = _write_model(str(tmp_path / ("src-" + subdir)), seed=seed, shards=1, mib=1)
        summary = artifact_sync.Syncer(artifact_sync.LocalSource(src), str(root / subdir), name=name, fsync=False).run()
        staged[subdir] = {"name": name, "tree_sha256": summary["tree_sha256"]}
    _core(k8s_client).create_namespaced_persistent_volume_claim(namespace, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": PVC, "annotations": {STAGED: json.dumps(staged, sort_keys=True)}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    isvc = _deploy(k8s_client, kserve, namespace, "pvc://%s/" % PVC)
    return {"root": root, "isvc": isvc}


def _remover_jobs(k8s_client, namespace):
    return _batch(k8s_client).list_namespaced_job(namespace, label_selector="spec-decoding.alauda.io/task=remove-draft").items


def _pvc_annotations(k8s_client, namespace):
    return _core(k8s_client).read_namespaced_persistent_volume_claim(PVC, namespace).metadata.annotations or {}


def test_pvc_draft_subdirectory_removed_by_a_job_after_the_proof_then_rerun_is_a_noop(tmp_path, kubeconfig, k8s_client, kubelet,
                                                                                      pvc_service, namespace):
    root = pvc_service["root"]
    with StagerPod(k8s_client, kubelet, namespace, str(root)) as pod:
        run = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=_vars(namespace), kubeconfig=kubeconfig, timeout=900)
    assert run.rc == 0, run.output
    # the order: stripped, Ready, proven by the engine line, and only then the draft goes
    assert run.result("Prove the engine runs without a proposer")["speculative_config"] is None
    planned = run.result("Remove the draft (storageUris entry or Modelcar layers)")
    assert planned["mode"] == "pvc" and planned["run_job"] is True and planned["draft_path"] == "/mnt/models/draft"

    jobs = _remover_jobs(k8s_client, namespace)
    assert [j.metadata.name for j in jobs] == [planned["pvc_job"]["job"]]
    spec = jobs[0].spec.template.spec
    container = spec.containers[0]
    assert container.image == JOB_IMAGE
    assert container.command == ["python3", "/opt/spec-decoding/artifact_sync.pyz", "remove", "--config", "/opt/spec-decoding/plan.json"]
    volumes = {v.name: v for v in spec.volumes}
    assert volumes["models"].persistent_volume_claim.claim_name == PVC
    assert {m.name: m.mount_path for m in container.volume_mounts} == {"models": "/mnt/pvc", "stager": "/opt/spec-decoding"}
    cm = _core(k8s_client).read_namespaced_config_map(volumes["stager"].config_map.name, namespace)
    assert json.loads(cm.data["plan.json"]) == {"root": "/mnt/pvc", "items": [],
                                                "remove": [{"subdir": "draft", "keep": ["target"], "name": DRAFT}]}
    assert jobs[0].metadata.owner_references[0].name == PVC

    rc, output = pod.played[jobs[0].metadata.name]
    assert rc == 0, output
    # the draft is gone from the volume, the target is intact and still verified by its manifest
    assert sorted(os.listdir(str(root))) == ["target"]
    assert artifact_sync.check_dest(str(root / "target"), name=TARGET)["ok"]
    annotations = _pvc_annotations(k8s_client, namespace)
    assert sorted(json.loads(annotations[STAGED])) == ["target"]
    assert json.loads(annotations[REMOVED]) == {"draft": jobs[0].metadata.name}
    record = run.result("Check the remover's summary and record the removal on the PVC")
    assert record["changed"] is True and record["removed"]["removed"] is True and record["removed"]["files"] == 2
    isvc = _get(k8s_client, namespace)
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "pvc://%s/" % PVC
    assert "--speculative-config" not in isvc["spec"]["predictor"]["model"]["command"][2]

    with StagerPod(k8s_client, kubelet, namespace, str(root)) as pod:
        rerun = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=_vars(namespace), kubeconfig=kubeconfig, timeout=900)
    assert rerun.rc == 0, rerun.output
    assert rerun.changed == 0, rerun.output
    assert not pod.played and [j.metadata.uid for j in _remover_jobs(k8s_client, namespace)] == [jobs[0].metadata.uid]
    assert "removed earlier" in rerun.result("Remove the draft (storageUris entry or Modelcar layers)")["note"]


def test_scheduled_rollback_service_account_removes_a_pvc_draft_with_the_rendered_role(
        tmp_path, kubeconfig, k8s_client, kubelet, controlplane, pvc_service, namespace):
    """rollback_schedule with rollback_schedule_remove_draft_artifacts: the Role it renders is enough for the CronJob's
    service account to run the whole rollback and the PVC draft removal (remover Job included); without the flag the
    Role has no Job rules and the same run is refused by the API server after the proof, leaving the draft in place."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    from tests.integration.test_rollback import cron_job_vars, render_schedule  # pylint: disable=import-outside-toplevel

    def schedule(remove):
        # applied only (no files: the job's variables come from the rendered ConfigMap in the run)
        run = render_schedule(tmp_path, kubeconfig, namespace, None, rollback_schedule_remove_draft_artifacts=remove)
        return cron_job_vars(run, namespace, rollback_draft_job_poll_interval=1, rollback_draft_job_timeout=120,
                             rollback_draft_job_image=JOB_IMAGE)

    root = pvc_service["root"]
    job_sa = controlplane.kubeconfig_for_service_account(namespace, "spec-decoding-rollback")
    # without the flag's rules: the rollback itself works, removing the draft is forbidden and nothing is removed
    job_vars = dict(schedule(remove=False), rollback_remove_draft_artifacts=True)
    with StagerPod(k8s_client, kubelet, namespace, str(root)) as pod:
        refused = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=job_vars, kubeconfig=job_sa, timeout=900)
    assert refused.rc != 0 and "forbidden" in refused.output.lower(), refused.output
    assert not pod.played and sorted(os.listdir(str(root))) == ["draft", "target"]

    job_vars = schedule(remove=True)
    assert job_vars["rollback_remove_draft_artifacts"] is True
    rules = client.RbacAuthorizationV1Api(k8s_client).read_namespaced_role("spec-decoding-rollback", namespace).rules
    assert (("batch",), ("jobs",), ("create", "delete", "get", "list")) in [
        (tuple(r.api_groups), tuple(r.resources), tuple(sorted(r.verbs))) for r in rules]
    with StagerPod(k8s_client, kubelet, namespace, str(root)) as pod:
        done = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=job_vars, kubeconfig=job_sa, timeout=900)
    assert done.rc == 0, done.output
    assert [rc for rc, _output in pod.played.values()] == [0]
    assert sorted(os.listdir(str(root))) == ["target"]
    assert sorted(json.loads(_pvc_annotations(k8s_client, namespace)[STAGED])) == ["target"]
    assert "--speculative-config" not in _get(k8s_client, namespace)["spec"]["predictor"]["model"]["command"][2]


def test_pvc_remover_failure_fails_the_run_with_its_log_and_a_rerun_finishes(tmp_path, kubeconfig, k8s_client, kubelet,
                                                                             pvc_service, namespace):
    root = pvc_service["root"]
    draft = root / "draft"
    shutil.rmtree(str(draft))
    draft.write_text("not a directory any more")  # the script refuses to remove a file it did not stage
    with StagerPod(k8s_client, kubelet, namespace, str(root)) as pod:
        run = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=_vars(namespace), kubeconfig=kubeconfig, timeout=900)
    assert run.rc != 0
    failed = run.result("Report a failed remover Job with its log")
    assert "remover Job %s/" % namespace in failed["msg"] and "failed" in failed["msg"]
    assert "is not a directory" in failed["msg"]  # the script's own error line, from the pod log
    assert [rc for rc, _out in pod.played.values()] == [2]
    assert draft.read_text() == "not a directory any more" and (root / "target").is_dir()
    assert sorted(json.loads(_pvc_annotations(k8s_client, namespace)[STAGED])) == ["draft", "target"]  # nothing recorded
    # the rollback itself stands
    assert "--speculative-config" not in _get(k8s_client, namespace)["spec"]["predictor"]["model"]["command"][2]

    draft.unlink()
    with StagerPod(k8s_client, kubelet, namespace, str(root)) as pod:
        again = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=_vars(namespace), kubeconfig=kubeconfig, timeout=900)
    assert again.rc == 0, again.output
    assert [rc for rc, _out in pod.played.values()] == [0]  # the failed Job was replaced and ran again
    assert sorted(json.loads(_pvc_annotations(k8s_client, namespace)[STAGED])) == ["target"]


# --------------------------------------------------------------------------------------------------
# Modelcar
# --------------------------------------------------------------------------------------------------
USER, PASSWORD = "alice", "draft-Removal-Pa55"


def _push_image(tmp_path, registry):
    """target + draft pushed as the builder lays them out (one layer per file); returns (repository ref, digest)."""
    files = {"target/config.json": b'{"architectures": ["LlamaForCausalLM"]}', "target/model.safetensors": os.urandom(3 << 20),
             "target/tokenizer.json": b"{}", "draft/config.json": b'{"architectures": ["LlamaForCausalLMEagle3"]}',
             "draft/model.safetensors": os.urandom(1 << 20)}
    for rel, data in files.items():
        path = tmp_path / "models" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    plan = modelcar_image.build_plan(str(tmp_path / "models" / "target"), str(tmp_path / "models" / "draft"),
                                     annotations={"io.alauda.spec-decoding.draft-name": DRAFT})
    ref = oci_registry.ImageRef.parse("%s/models/llama-eagle3:v1" % registry.host)
    client = oci_registry.RegistryClient(ref, USER, PASSWORD, tls_verify=False)
    try:
        pushed = modelcar_push.push_plan(plan, client, oci_blobs.DigestCache(enabled=False))
    finally:
        client.close()
    return ref, pushed["digest"], files


def _blob_count(registry):
    root = os.path.join(registry.storage, "docker", "registry", "v2", "blobs")
    return sum(len(files) for _d, _s, files in os.walk(root))


def _registry_get(registry, path):
    req = urllib.request.Request(registry.url + path, headers={
        "Authorization": "Basic " + base64.b64encode(("%s:%s" % (USER, PASSWORD)).encode()).decode(),
        "Accept": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # nosec - loopback test registry
        return resp.read()


def test_modelcar_image_rebuilt_without_the_draft_from_the_same_blobs(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    ensure_tools()
    with Registry(str(tmp_path / "registry"), auth="htpasswd", users={USER: PASSWORD}) as registry:
        ref, digest, files = _push_image(tmp_path, registry)
        old_uri = "oci://%s/%s@%s" % (ref.registry, ref.repository, digest)
        _deploy(k8s_client, kserve, namespace, old_uri)
        blobs_before = _blob_count(registry)
        extra = _vars(namespace, rollback_registry_username=USER, rollback_registry_password=PASSWORD,
                      rollback_registry_tls_verify=False)
        run = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=extra, kubeconfig=kubeconfig, timeout=900)
        assert run.rc == 0, run.output
        assert PASSWORD not in run.stdout + run.stderr
        removed = run.result("Remove the draft (storageUris entry or Modelcar layers)")
        assert removed["changed"] is True and removed["mode"] == "modelcar"
        image = removed["image"]
        tag = "nodraft-" + digest.split(":")[1][:12]
        assert image["to"] == "%s/%s:%s" % (ref.registry, ref.repository, tag)
        assert (image["layers_dropped"], image["layers_rewritten"]) == (2, 0)
        # no weights went up again: only the new config is a new blob (plus the manifest the registry stores as one)
        assert image["blobs"]["uploaded"] == 1 and image["blobs"]["present"] == image["layers_kept"]
        assert _blob_count(registry) == blobs_before + 2

        isvc = _get(k8s_client, namespace)
        new_uri = isvc["spec"]["predictor"]["model"]["storageUri"]
        assert new_uri == "oci://%s/%s@%s" % (ref.registry, ref.repository, image["digest"]) != old_uri
        assert isvc["status"]["observedGeneration"] == isvc["metadata"]["generation"]
        assert json.loads(isvc["metadata"]["annotations"][REMOVED])["previous_storage_uri"] == old_uri

        # the registry: both tags, each manifest complete (every blob it names is there), no partial manifest
        tags = json.loads(_registry_get(registry, "/v2/%s/tags/list" % ref.repository))["tags"]
        assert sorted(tags) == sorted(["v1", tag])
        for name in tags:
            manifest = json.loads(_registry_get(registry, "/v2/%s/manifests/%s" % (ref.repository, name)))
            for desc in manifest["layers"] + [manifest["config"]]:
                assert len(_registry_get(registry, "/v2/%s/blobs/%s" % (ref.repository, desc["digest"]))) == desc["size"]

        # skopeo reads the new image back: no /models/draft, the target byte for byte
        out = tmp_path / "pulled"
        subprocess.run(["skopeo", "copy", "--src-tls-verify=false", "--src-creds", "%s:%s" % (USER, PASSWORD),
                        "--dest-oci-accept-uncompressed-layers", "docker://%s/%s@%s" % (ref.registry, ref.repository, image["digest"]),
                        "oci:%s:pulled" % out], check=True, capture_output=True)
        index = json.loads((out / "index.json").read_text())
        manifest = json.loads((out / "blobs" / "sha256" / index["manifests"][0]["digest"].split(":")[1]).read_bytes())
        tree = {}
        for desc in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO((out / "blobs" / "sha256" / desc["digest"].split(":")[1]).read_bytes())) as tar:
                for member in tar.getmembers():
                    tree[member.name] = tar.extractfile(member).read() if member.isfile() else None
        assert not [name for name in tree if name.startswith("models/draft")]
        for rel, data in files.items():
            if rel.startswith("target/"):
                assert tree["models/" + rel] == data
        assert "bin/busybox" in tree

        rerun = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=extra, kubeconfig=kubeconfig, timeout=900)
        assert rerun.rc == 0, rerun.output
        assert rerun.changed == 0, rerun.output
        assert _get(k8s_client, namespace)["spec"]["predictor"]["model"]["storageUri"] == new_uri
        assert "holds no /models/draft" in rerun.result("Remove the draft (storageUris entry or Modelcar layers)")["note"]
