"""The draft removal on a Modelcar image another tool built, against Debian's docker-registry on loopback (integration tier: a
real registry and skopeo, no vLLM).

The image is written with plain ``tarfile`` (target and draft in ONE layer, no annotations) and pushed with
``skopeo copy``, which gzips the layer: nothing of the collection made it. The registry uses token auth, so the
streamed blob reads carry a Bearer token. What is asserted comes from outside the code under test: the registry's
tags and ``skopeo inspect --raw``, and a ``skopeo copy`` pull-back whose files are compared byte for byte with the
sources.
"""

import hashlib
import json
import os
import subprocess
import tarfile
import time

import pytest

from tests.testbed.foreign_image import StubCluster, write_foreign_layout
from tests.testbed.registry import Registry, ensure_tools

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_removal
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_removal_modelcar
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as oci_registry

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "s3cret-Pa55"


def _write(base, rel, data):
    path = os.path.join(base, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def _skopeo(*args):
    proc = subprocess.run(["skopeo", "--insecure-policy"] + list(args), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _tags(reg, repository):
    out = _skopeo("list-tags", "--tls-verify=false", "--creds", "%s:%s" % (USER, PASSWORD), "docker://%s/%s" % (reg.host, repository))
    return sorted(json.loads(out)["Tags"])


def _sha(data):
    return hashlib.sha256(data).hexdigest()


def test_foreign_gzip_single_layer_image_is_rebuilt_without_its_draft(tmp_path):
    ensure_tools()
    model = str(tmp_path / "model")
    files = {
        "target/config.json": b'{"architectures": ["LlamaForCausalLM"]}',
        "target/tokenizer.json": b'{"model": {"type": "BPE"}}' * 400,
        "target/model-00001-of-00001.safetensors": os.urandom(3 * 1024 * 1024 + 5),
        "target/nested/" + "long-directory-name-" * 6 + "/generation_config.json": b"{}",
        "draft/config.json": b'{"architectures": ["LlamaForCausalLMEagle3"]}',
        "draft/model.safetensors": os.urandom(1024 * 1024 + 3),
    }
    for rel, data in files.items():
        _write(model, rel, data)
    os.symlink("model-00001-of-00001.safetensors", os.path.join(model, "target", "model.safetensors"))
    layout = str(tmp_path / "layout")
    write_foreign_layout(layout, model)

    with Registry(str(tmp_path / "registry"), auth="token", users={USER: PASSWORD}) as reg:
        repo = "foreign/llama"
        _skopeo("copy", "--dest-tls-verify=false", "--dest-creds", "%s:%s" % (USER, PASSWORD), "oci:%s:v1" % layout,
                "docker://%s/%s:v1" % (reg.host, repo))
        pushed = json.loads(_skopeo("inspect", "--raw", "--tls-verify=false", "--creds", "%s:%s" % (USER, PASSWORD),
                                    "docker://%s/%s:v1" % (reg.host, repo)))
        assert [d["mediaType"] for d in pushed["layers"]] == ["application/vnd.oci.image.layer.v1.tar+gzip"]  # skopeo's writing, gzipped
        assert "annotations" not in pushed["layers"][0]

        cluster = StubCluster("oci://%s/%s:v1" % (reg.host, repo))

        def open_registry(ref):
            return oci_registry.RegistryClient(ref, USER, PASSWORD, tls_verify=False)

        params = {"previous_config": {"model": "/mnt/models/draft"}, "wait": False}
        planned = draft_removal.execute(params, cluster, open_registry, check_mode=True)
        assert planned["mode"] == "modelcar" and planned["image"]["layers_rewritten"] == 1
        assert _tags(reg, repo) == ["v1"]  # check mode pushed nothing
        t0 = time.monotonic()
        done = draft_removal.execute(params, cluster, open_registry)
        seconds = time.monotonic() - t0
        print("removal of the draft from a %d-byte gzip layer: %.2f s" % (pushed["layers"][0]["size"], seconds))
        assert done["image"]["digest"] == planned["image"]["digest"] and done["image"]["blobs"]["uploaded"] == 2  # layer + config
        assert _tags(reg, repo) == ["v1", "v1-nodraft"]
        new_uri = "oci://%s/%s@%s" % (reg.host, repo, done["image"]["digest"])
        (ops, dry_run), = [p for p in cluster.patches if not p[1]]
        assert not dry_run and {"op": "replace", "path": "/spec/predictor/model/storageUri", "value": new_uri} in ops

        ref = "docker://%s/%s@%s" % (reg.host, repo, done["image"]["digest"])
        manifest = json.loads(_skopeo("inspect", "--raw", "--tls-verify=false", "--creds", "%s:%s" % (USER, PASSWORD), ref))
        assert [d["mediaType"] for d in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar"]
        old_digest = _skopeo("inspect", "--format", "{{.Digest}}", "--tls-verify=false", "--creds", "%s:%s" % (USER, PASSWORD),
                             "docker://%s/%s:v1" % (reg.host, repo)).strip()
        assert manifest["annotations"][draft_removal_modelcar.REMOVED_FROM_ANNOTATION] == old_digest
        pulled = str(tmp_path / "pulled")
        _skopeo("copy", "--src-tls-verify=false", "--src-creds", "%s:%s" % (USER, PASSWORD), "--dest-oci-accept-uncompressed-layers",
                ref, "oci:%s:pulled" % pulled)  # skopeo checks every blob against its digest

    with open(os.path.join(pulled, "index.json"), encoding="utf-8") as fh:
        mdesc = json.load(fh)["manifests"][0]
    with open(os.path.join(pulled, "blobs", "sha256", mdesc["digest"].split(":")[1]), encoding="utf-8") as fh:
        layer = json.load(fh)["layers"][0]
    seen = {}
    with tarfile.open(os.path.join(pulled, "blobs", "sha256", layer["digest"].split(":")[1]), "r:") as tar:
        for member in tar.getmembers():
            if member.isfile():
                seen[member.name] = _sha(tar.extractfile(member).read())
            elif member.issym():
                seen[member.name] = "-> " + member.linkname
    want = {"models/" + rel: _sha(data) for rel, data in files.items() if rel.startswith("target/")}
    want["models/target/model.safetensors"] = "-> model-00001-of-00001.safetensors"
    assert seen == want  # the target byte for byte, the symlink kept, nothing of the draft
