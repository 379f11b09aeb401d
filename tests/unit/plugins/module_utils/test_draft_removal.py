"""Unit tests of draft removal: where the draft lives, the refusals, the PVC remover (real files) and the manifest rewrite."""

import copy
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import artifact_sync as S
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync import bundle
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_removal as D
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_location
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_removal_modelcar
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import modelcar_image as L
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import oci_blobs
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import oci_layout
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests import stager

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "rollback")


def _guide(name="guide_example2_eagle3.rolled_back.yaml"):
    with open(os.path.join(DATA, name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _single(uri, script_model="/mnt/models/target", env=None):
    isvc = _guide()
    predictor = isvc["spec"]["predictor"]
    del predictor["storageUris"]
    predictor["model"]["storageUri"] = uri
    predictor["model"]["command"][2] = predictor["model"]["command"][2].replace("/mnt/models/target", script_model)
    if env:
        predictor["model"]["env"].append(env)
    return isvc


# --------------------------------------------------------------------------------------------------
# where the draft lives
# --------------------------------------------------------------------------------------------------
def test_guide_storage_uris_entry_is_dropped_with_a_guarded_patch():
    isvc = _guide()
    loc = draft_location.locate(isvc, "/mnt/models/draft")
    assert loc.mode == "storage_uris"
    entry = isvc["spec"]["predictor"]["storageUris"][1]
    assert loc.details["removed"] == entry
    assert loc.details["ops"] == [{"op": "test", "path": "/spec/predictor/storageUris/1", "value": entry},
                                  {"op": "remove", "path": "/spec/predictor/storageUris/1"}]


def test_pvc_subdirectory_with_prefix_and_kept_target():
    loc = draft_location.locate(_single("pvc://models-pvc/llama31"), "/mnt/models/draft/")
    assert loc.mode == "pvc"
    assert loc.details["pvc"] == "models-pvc" and loc.details["subdir"] == "llama31/draft"
    assert loc.details["keep"] == ["llama31/target"]
    loc = draft_location.locate(_single("pvc://models-pvc/"), "/mnt/models/eagle/head")
    assert loc.details["subdir"] == "eagle/head" and loc.details["keep"] == ["target"]


def test_modelcar_image_path():
    loc = draft_location.locate(_single("oci://reg.local:5000/models/llama@sha256:" + "a" * 64), "/mnt/models/draft")
    assert loc.mode == "modelcar"
    assert loc.details["image_path"] == "models/draft" and loc.details["pointer"] == "/spec/predictor/model/storageUri"
    assert loc.details["image"] == "reg.local:5000/models/llama@sha256:" + "a" * 64
    assert loc.details["scheme"] == "oci://"
    # an ImageVolume (oci+native://) holds the same /models layout: the same rebuild, and the new URI keeps its scheme
    native = D.locate(_single("oci+native://reg.local:5000/models/llama:v1"), "/mnt/models/draft")
    assert native.mode == "modelcar" and native.details["image"] == "reg.local:5000/models/llama:v1"
    assert native.details["scheme"] == "oci+native://" and native.details["storage_uri"] == "oci+native://reg.local:5000/models/llama:v1"


@pytest.mark.parametrize("isvc, draft, words", [
    # the rolled-back command still reads the draft (a tokenizer from the draft's directory)
    (_single("pvc://m/", script_model="/mnt/models/target --tokenizer /mnt/models/draft/tok"), "/mnt/models/draft", "still refers"),
    # an env value names it
    (_single("pvc://m/", env={"name": "DRAFT", "value": "/mnt/models/draft"}), "/mnt/models/draft", "still refers"),
    # the "draft" directory holds the target
    (_single("pvc://m/", script_model="/mnt/models/draft/target"), "/mnt/models/draft", "still refers"),
    # the whole volume
    (_single("pvc://m/draft-only", script_model="/opt/model"), "/mnt/models", "whole volume"),
    # leaving the volume
    (_single("pvc://m/"), "/mnt/models/../../etc", "'..'"),
    (_single("pvc://m/"), "/mnt/models/./draft", "'..'"),
])
def test_refusals(isvc, draft, words):
    with pytest.raises(ValidationError) as exc:
        draft_location.locate(isvc, draft)
    assert words in str(exc.value)


def test_refuses_while_the_predictor_still_has_a_speculative_config():
    isvc = _guide("guide_example2_eagle3.yaml")
    with pytest.raises(ValidationError) as exc:
        draft_location.locate(isvc, "/mnt/models/draft")
    assert "still runs speculative decoding" in str(exc.value)


def test_nothing_to_remove_cases():
    assert draft_location.locate(_single("pvc://m/"), None).mode == "none"
    assert draft_location.locate(_single("pvc://m/"), "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B").mode == "none"
    assert draft_location.locate(_single("pvc://m/"), "/opt/elsewhere").mode == "none"
    assert draft_location.locate(_single("hf://meta-llama/Llama-3.1-8B"), "/mnt/models/draft").mode == "none"
    gone = _guide()
    gone["spec"]["predictor"]["storageUris"].pop(1)
    assert draft_location.locate(gone, "/mnt/models/draft").mode == "none"


def test_draft_path_from_backup_annotation():
    isvc = _guide()
    isvc["metadata"]["annotations"]["spec-decoding.alauda.io/previous-speculative-config"] = json.dumps(
        {"format": 1, "config": {"method": "eagle3", "model": "/mnt/models/draft"}, "containers": {}})
    assert draft_location.draft_path_from(isvc)[0] == "/mnt/models/draft"
    assert draft_location.draft_path_from(isvc, {"model": "/x"})[0] == "/x"
    assert draft_location.draft_path_from(isvc, None, "/y")[0] == "/y"


# --------------------------------------------------------------------------------------------------
# PVC: the remover (the shipped script, on real files)
# --------------------------------------------------------------------------------------------------
def _stage(src_root, dest, name, files):
    os.makedirs(src_root, exist_ok=True)
    for rel, data in files.items():
        path = os.path.join(src_root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    S.Syncer(S.LocalSource(src_root), dest, name=name, fsync=False).run()


@pytest.fixture()
def pvc(tmp_path):
    root = tmp_path / "pvc"
    _stage(str(tmp_path / "src-t"), str(root / "target"), "meta-llama/Llama-3.1-8B", {"config.json": b"{}", "model.safetensors": b"T" * 5000})
    _stage(str(tmp_path / "src-d"), str(root / "draft"), "yuhuili/EAGLE3", {"config.json": b"{}", "sub/head.bin": b"D" * 3000})
    return root


def test_remove_staged_removes_the_draft_and_nothing_else(pvc):
    res = S.remove_staged(str(pvc), "draft", keep=["target"], name="yuhuili/EAGLE3", fsync=False)
    assert res["removed"] is True and res["files"] == 2 and res["bytes"] == 3002 and res["name"] == "yuhuili/EAGLE3"
    assert not os.path.exists(str(pvc / "draft")) and sorted(os.listdir(str(pvc))) == ["target"]
    assert S.check_dest(str(pvc / "target"), name="meta-llama/Llama-3.1-8B")["ok"]
    again = S.remove_staged(str(pvc), "draft", keep=["target"], fsync=False)
    assert again["removed"] is False and again["files"] == 0


def test_remove_staged_updates_an_enclosing_manifest(tmp_path):
    root = tmp_path / "pvc"
    files = {"config.json": b"{}", "w.bin": b"W" * 100, "draft/config.json": b"{}", "draft/h.bin": b"H" * 50}
    _stage(str(tmp_path / "src"), str(root / "llama"), "llama", files)
    before = S.read_manifest(str(root / "llama"))
    assert "draft/h.bin" in before["files"]
    res = S.remove_staged(str(root), "llama/draft", keep=["llama"], fsync=False)
    # the draft lies inside the kept target directory: allowed, and the target's manifest no longer claims it
    assert res["removed"] and str(root / "llama" / S.MANIFEST_NAME) in res["records_updated"]
    after = S.read_manifest(str(root / "llama"))
    assert sorted(after["files"]) == ["config.json", "w.bin"] and after["file_count"] == 2 and after["total_bytes"] == 102
    assert after["tree_sha256"] == S.tree_digest(after["files"]) != before["tree_sha256"]
    assert S.check_dest(str(root / "llama"))["ok"]


@pytest.mark.parametrize("subdir", ["", "/", "/etc", "../x", "a/../../x", "draft/..", "./draft", "a//b", S.MANIFEST_NAME])
def test_remove_staged_refuses_paths_outside(pvc, subdir):
    with pytest.raises(ValidationError):
        S.remove_staged(str(pvc), subdir, fsync=False)
    assert sorted(os.listdir(str(pvc))) == ["draft", "target"]


def test_remove_staged_refuses_kept_symlinked_and_other_models(pvc, tmp_path):
    with pytest.raises(ValidationError, match="still uses"):
        S.remove_staged(str(pvc), "target", keep=["target"], fsync=False)
    with pytest.raises(ValidationError, match="not the draft"):
        S.remove_staged(str(pvc), "draft", name="someone/else", fsync=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keepme").write_text("x")
    os.symlink(str(outside), str(pvc / "link"))
    with pytest.raises(ValidationError, match="symlink"):
        S.remove_staged(str(pvc), "link", fsync=False)
    assert (outside / "keepme").exists() and (pvc / "draft").exists()


def _run_launcher(tmp_path, plan):
    """The remover exactly as the Job runs it: the Job's command (python3 artifact_sync.pyz remove --config plan.json) with
    the zip application the roles ship and the plan where the ConfigMap would mount them."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    mounted = {D.SCRIPT_DIR + "/" + bundle.NAME: stager.zipapp_path(), D.SCRIPT_DIR + "/plan.json": str(path)}
    command = D.pvc_job(draft_location.locate(_single("pvc://models-pvc/"), "/mnt/models/draft"))["command"]
    argv = [sys.executable if arg == "python3" else mounted.get(arg, arg) for arg in command]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=dict(os.environ, PYTHONPATH=""))
    return proc


def test_job_command_runs_the_script_standalone(pvc, tmp_path):
    proc = _run_launcher(tmp_path, {"root": str(pvc), "items": [], "remove": [{"subdir": "draft", "keep": ["target"]}]})
    assert proc.returncode == 0, proc.stderr
    item = D.parse_remover_log(proc.stderr + proc.stdout, "draft")
    assert item["removed"] is True and not (pvc / "draft").exists()
    bad = _run_launcher(tmp_path, {"root": str(pvc), "items": [], "remove": [{"subdir": "../target"}]})
    assert bad.returncode == 2 and (pvc / "target").exists()
    with pytest.raises(ValidationError, match="remover failed"):
        D.parse_remover_log(bad.stdout, "../target")
    with pytest.raises(ValidationError, match="no summary"):
        D.parse_remover_log("Error: ImagePullBackOff", "draft")


def test_pvc_job_plan_is_stable_and_staged_record_is_dropped():
    loc = draft_location.locate(_single("pvc://models-pvc/"), "/mnt/models/draft")
    pvc = {"metadata": {"annotations": {D.STAGED_ANNOTATION: json.dumps({"target": {"name": "t"}, "draft": {"name": "d"}})}}}
    job = D.pvc_job(loc, pvc, "abc")
    assert job == D.pvc_job(loc, copy.deepcopy(pvc), "abc") and job["job"] != D.pvc_job(loc, pvc, "abd")["job"]
    assert job["plan"] == {"root": "/mnt/pvc", "items": [], "remove": [{"subdir": "draft", "keep": ["target"], "name": "d"}]}
    assert job["command"] == ["python3", "/opt/spec-decoding/artifact_sync.pyz", "remove", "--config", "/opt/spec-decoding/plan.json"]
    assert len(job["job"]) <= 63
    text, changed = D.staged_without(pvc, "draft")
    assert changed and json.loads(text) == {"target": {"name": "t"}}
    assert D.staged_without({"metadata": {"annotations": {D.STAGED_ANNOTATION: text}}}, "draft")[1] is False


# --------------------------------------------------------------------------------------------------
# Modelcar: the manifest rewrite, on an image the builder made
# --------------------------------------------------------------------------------------------------
class LayoutBlobs:
    """RemoteImage's read side over an OCI layout directory."""

    def __init__(self, directory):
        self.directory = directory

    def get_blob(self, digest):
        with open(os.path.join(self.directory, "blobs", "sha256", digest.split(":")[1]), "rb") as fh:
            return fh.read()

    def open_blob(self, digest):
        return open(os.path.join(self.directory, "blobs", "sha256", digest.split(":")[1]), "rb")  # pylint: disable=consider-using-with


def _image(tmp_path, max_layers=100):
    def write(rel, data):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    write("t/config.json", b'{"t": 1}')
    write("t/model.safetensors", b"T" * 9000)
    write("t/tokenizer.json", b"{}")
    write("d/config.json", b'{"d": 1}')
    write("d/model.safetensors", b"D" * 7000)
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF fake")
    busybox.chmod(0o755)
    plan = L.build_plan(str(tmp_path / "t"), str(tmp_path / "d"), busybox_path=str(busybox), max_layers=max_layers,
                        labels={draft_removal_modelcar.DRAFT_NAME_KEY: "yuhuili/EAGLE3"}, annotations={draft_removal_modelcar.DRAFT_NAME_KEY: "yuhuili/EAGLE3"})
    layout = tmp_path / "layout"
    oci_layout.write_layout_dir(plan, str(layout), "v1", oci_blobs.DigestCache(enabled=False))
    return plan, LayoutBlobs(str(layout))


def _files_of(blob):
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        return sorted(m.name for m in tar.getmembers() if not m.isdir())


def test_manifest_without_the_draft_reuses_every_other_blob(tmp_path):
    plan, blobs = _image(tmp_path)
    old = plan.manifest_bytes()
    actions, repl, new_manifest, new_config, uploads = draft_removal_modelcar.plan_image(blobs, old, "models/draft", plan.manifest_digest())
    assert actions == ["keep", "drop", "drop", "keep", "keep", "keep"]  # base, draft x2, target x3
    assert repl == {} and [u.media_type for u in uploads] == [oci_blobs.MT_CONFIG]  # only the new config is new
    old_m, new_m = json.loads(old), json.loads(new_manifest)
    kept = [d for d in old_m["layers"] if not d["annotations"][oci_blobs.ANN_TITLE].startswith("models/draft/")]
    assert new_m["layers"] == kept
    assert new_m["annotations"] == {draft_removal_modelcar.REMOVED_FROM_ANNOTATION: plan.manifest_digest()}
    config = json.loads(new_config)
    assert config["rootfs"]["diff_ids"] == [d["digest"] for d in kept]
    assert len([h for h in config["history"] if not h.get("empty_layer")]) == len(kept)
    assert all("models/draft" not in h.get("created_by", "") for h in config["history"])
    assert draft_removal_modelcar.DRAFT_NAME_KEY not in config["config"].get("Labels", {})
    assert new_m["config"] == {"mediaType": oci_blobs.MT_CONFIG, "digest": oci_blobs.sha256_digest(new_config), "size": len(new_config)}
    files = [f for d in new_m["layers"] for f in _files_of(blobs.get_blob(d["digest"]))]
    assert "models/target/model.safetensors" in files and not [f for f in files if f.startswith("models/draft")]


def test_a_layer_mixing_draft_and_target_files_is_rewritten(tmp_path):
    plan, blobs = _image(tmp_path, max_layers=3)  # base + the biggest file + one layer of the 4 smallest files
    mixed = [i for i, layer in enumerate(plan.layers) if oci_blobs.ANN_FILES in (layer.annotations or {})]
    assert len(mixed) == 1
    actions, repl, new_manifest, new_config, uploads = draft_removal_modelcar.plan_image(blobs, plan.manifest_bytes(), "models/draft", plan.manifest_digest())
    assert actions[mixed[0]] == "rewrite"
    desc, diff_id = repl[mixed[0]]
    blob = b"".join(bytes(c) for c in uploads[0].chunks())
    assert desc["digest"] == diff_id == oci_blobs.sha256_digest(blob)
    assert _files_of(blob) == ["models/target/config.json", "models/target/tokenizer.json"]
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        names = [m.name for m in tar.getmembers()]
        assert "models/draft" not in names and all((m.mtime, m.uid) == (0, 0) for m in tar.getmembers())
    assert desc["annotations"][oci_blobs.ANN_FILES] == "models/target/config.json,models/target/tokenizer.json"
    assert json.loads(new_manifest)["layers"][mixed[0]] == desc
    assert json.loads(new_config)["rootfs"]["diff_ids"][mixed[0]] == diff_id
    # reproducible: the same input gives the same bytes
    assert draft_removal_modelcar.plan_image(blobs, plan.manifest_bytes(), "models/draft", plan.manifest_digest())[2] == new_manifest


def test_an_image_without_the_draft_needs_nothing(tmp_path):
    plan, blobs = _image(tmp_path)
    _a, _r, new_manifest, _c, uploads = draft_removal_modelcar.plan_image(blobs, plan.manifest_bytes(), "models/draft", plan.manifest_digest())
    nodraft = json.loads(new_manifest)
    for source in uploads:  # "push" the new config next to the old blobs
        with open(os.path.join(blobs.directory, "blobs", "sha256", source.digest.split(":")[1]), "wb") as fh:
            fh.write(source.data)
    actions, _r, again, _c, uploads = draft_removal_modelcar.plan_image(blobs, new_manifest, "models/draft", oci_blobs.sha256_digest(new_manifest))
    assert set(actions) == {"keep"} and again is None and uploads == [] and len(nodraft["layers"]) == 4


def test_unannotated_layers_are_read_and_the_tag_names():
    manifest = {"layers": [{"digest": "sha256:1"}, {"annotations": {oci_blobs.ANN_TITLE: "models/draft/a"}}]}
    assert draft_removal_modelcar.classify_layers(manifest, "models/draft", {0: ["bin/sh"]}) == [("keep", ["bin/sh"]), ("drop", ["models/draft/a"])]
    assert draft_removal_modelcar.classify_layers(manifest, "models/draft")[0] == ("unknown", None)
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.registry import ImageRef
    assert draft_removal_modelcar.nodraft_tag(ImageRef.parse("r.local/m/x:v1")) == "v1-nodraft"
    assert draft_removal_modelcar.nodraft_tag(ImageRef.parse("r.local/m/x@sha256:" + "b" * 64)) == "nodraft-" + "b" * 12
    assert draft_removal_modelcar.nodraft_tag(ImageRef.parse("r.local/m/x:v1"), "custom") == "custom"


class _NotReadyCluster:
    """Error path: the rolled-back revision has not become Ready; nothing may be written."""

    def __init__(self, isvc):
        self.isvc = isvc
        self.writes = []

    def get_isvc(self):
        return self.isvc

    def patch_isvc(self, ops, dry_run=False):
        self.writes.append(ops)

    def get_pvc(self, name):
        self.writes.append(name)


def test_nothing_is_removed_before_the_rollback_is_ready():
    isvc = _guide()
    isvc["metadata"]["generation"] = 3
    isvc["status"] = {"observedGeneration": 2, "conditions": [{"type": "Ready", "status": "True"}]}
    cluster = _NotReadyCluster(isvc)
    with pytest.raises(ValidationError, match="not Ready at generation 3"):
        D.execute({"draft_path": "/mnt/models/draft"}, cluster)
    assert cluster.writes == []
