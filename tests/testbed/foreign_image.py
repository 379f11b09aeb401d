"""A Modelcar image as another tool would build it: an OCI layout with ONE plain-tarfile layer holding target and draft.

Nothing of the collection is used to write it: the layer is Python's ``tarfile`` adding a directory tree (real
mtimes, uids and modes, ``./models/...`` names, PAX headers), no annotations on the layer, one history entry. Push
it with ``skopeo copy`` (without ``--preserve-digests`` skopeo gzips the layer, so the registry holds a
``tar+gzip`` layer whose digest no builder here produced). Used by the e2e test and the Modelcar bench.
"""
from __future__ import annotations

import hashlib
import json
import os
import tarfile

from tests.digests import sha256_file

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"


def _put_blob(layout, data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest.split(":")[1]), "wb") as fh:
        fh.write(data)
    return digest


def write_foreign_layout(layout, model_root, tag="v1", image_dir="models"):
    """Write ``layout`` (an OCI layout) whose single layer is ``model_root`` added as ``./<image_dir>``; returns the layer's digest."""
    blobs = os.path.join(layout, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    tmp = os.path.join(layout, "layer.tar.part")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(model_root, arcname="./" + image_dir)
    digest = "sha256:" + sha256_file(tmp)
    size = os.path.getsize(tmp)
    os.replace(tmp, os.path.join(blobs, digest.split(":")[1]))
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [digest]},
                         "history": [{"created_by": "python tarfile: add %s as ./%s" % (os.path.basename(model_root), image_dir)}]}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MT_MANIFEST,
                           "config": {"mediaType": MT_CONFIG, "digest": _put_blob(layout, config), "size": len(config)},
                           "layers": [{"mediaType": MT_LAYER_TAR, "digest": digest, "size": size}]}).encode()
    index = {"schemaVersion": 2, "manifests": [{"mediaType": MT_MANIFEST, "digest": _put_blob(layout, manifest), "size": len(manifest),
                                                "annotations": {"org.opencontainers.image.ref.name": tag}}]}
    with open(os.path.join(layout, "index.json"), "w", encoding="utf-8") as fh:
        json.dump(index, fh)
    with open(os.path.join(layout, "oci-layout"), "w", encoding="utf-8") as fh:
        json.dump({"imageLayoutVersion": "1.0.0"}, fh)
    return digest


class StubCluster:
    """draft_removal.execute's cluster side for a rolled-back, Ready InferenceService on ``storage_uri``; records patches."""

    def __init__(self, storage_uri):
        self.isvc = {
            "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "llama", "namespace": "ml", "generation": 3, "annotations": {}},
            "spec": {"predictor": {"model": {
                "modelFormat": {"name": "vLLM"}, "runtime": "vllm", "storageUri": storage_uri,
                "command": ["sh", "-c", "exec python3 -m vllm.entrypoints.openai.api_server --model /mnt/models/target --port 8080"]}}},
            "status": {"observedGeneration": 3, "conditions": [{"type": "Ready", "status": "True"}]},
        }
        self.patches = []

    def get_isvc(self):
        return self.isvc

    def patch_isvc(self, ops, dry_run=False):
        self.patches.append((ops, dry_run))
        return self.isvc

    def wait_ready(self):
        return self.isvc

    def get_pvc(self, name):  # pragma: no cover - not a PVC image
        raise AssertionError("no PVC here: %s" % name)

    def patch_pvc_annotations(self, name, annotations):  # pragma: no cover
        raise AssertionError("no PVC here: %s" % name)
