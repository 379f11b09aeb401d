# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight's read of checkpoints on a PVC (``pvc://<claim>/<path>``): a short read-only Job and what it prints.

The controller cannot open a PVC, so a Job mounts each claim read-only and runs ``JOB_SCRIPT`` with the image's
``python3`` (stdlib only, passed inline: no ConfigMap to ship or clean up). The script prints the same small files the
other sources give model_metadata - ``config.json``, ``tokenizer_config.json``, ``model.safetensors.index.json`` and the
first bytes of ``model.safetensors`` up to the end of its header - base64-encoded in one JSON line; ``DumpReader`` then
serves them to model_metadata.read_checkpoint, so a PVC is parsed and checked exactly as a directory or a mirror is.
Never the weights: the safetensors file is read only as far as its 8-byte length and the header that length gives.

This file plans the Job and parses its output; ops/draft_preflight_pvc.py makes the API calls.
Plain Python, stdlib only; no Ansible imports.
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

RESULT_KEY = "spec_decoding_metadata"
MOUNT_ROOT = "/mnt/pvc-preflight"
CONTAINER = "preflight"
COMPONENT = "draft-preflight"
SMALL_FILES = ("config.json", "tokenizer_config.json", "model.safetensors.index.json")
SAFETENSORS = "model.safetensors"
MAX_SMALL_FILE = 8 << 20  # model_metadata.MAX_SMALL_FILE
MAX_HEADER = 100 << 20  # safetensors' own limit on the header (safetensors/src/tensor.rs MAX_HEADER_SIZE)

# Run as ``python3 -c JOB_SCRIPT '<json>'``; the JSON names the directories and the limits. Python 3.6+, stdlib only.
JOB_SCRIPT = r"""
import base64, json, os, struct, sys
req = json.loads(sys.argv[1])
out = {}
for folder in req["dirs"]:
    entry = out.setdefault(folder, {"files": {}})
    if not os.path.isdir(folder):
        entry["error"] = "not a directory on the volume"
        continue
    for name in req["small"]:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                entry["files"][name] = base64.b64encode(fh.read(req["max_small"])).decode("ascii")
    path = os.path.join(folder, req["safetensors"])
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            head = fh.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            # past the limit: only the length, which the controller refuses with safetensors' own limit
            body = fh.read(length) if 0 < length <= req["max_header"] else b""
        entry["files"][req["safetensors"]] = base64.b64encode(head + body).decode("ascii")
print(json.dumps({req["key"]: out}, sort_keys=True))
"""


def parse_pvc_uri(location, field="source"):
    """``(claim, path)`` of ``pvc://<claim>/<path>`` (KServe's form of a PVC storageUri); path "" for the claim's root."""
    text = (location or "").strip()
    if not text.lower().startswith("pvc://"):
        raise ValidationError("%s is not a pvc:// location" % location, field=field, hint="write pvc://<claim>/<path>")
    rest = text[len("pvc://"):]
    claim, _sep, path = rest.partition("/")
    if not claim:
        raise ValidationError("%s names no claim" % location, field=field, hint="write pvc://<claim>/<path>")
    path = posixpath.normpath("/" + path).lstrip("/")
    return claim, "" if path == "." else path


def plan(locations):
    """The Job's volumes and what it reads for ``locations`` ({role: pvc:// location}): ``{"claims": {claim: volume},
    "dirs": {role: directory in the pod}}``; one volume per claim, mounted read-only."""
    claims, dirs = {}, {}
    for role, location in sorted(locations.items()):
        claim, path = parse_pvc_uri(location, field=role)
        volume = claims.setdefault(claim, "pvc-%d" % len(claims))
        dirs[role] = posixpath.join(MOUNT_ROOT, volume, path).rstrip("/")
    return {"claims": claims, "dirs": dirs}


def job_manifest(namespace, locations, image, timeout=120, pull_policy="IfNotPresent", labels=None, annotations=None):
    """The Job that reads the metadata of ``locations`` ({role: pvc:// location}): every claim mounted read-only, the
    script inline, no retries, gone ``ttlSecondsAfterFinished`` after it ends should the caller not delete it."""
    layout = plan(locations)
    request = {"dirs": sorted(set(layout["dirs"].values())), "small": list(SMALL_FILES), "safetensors": SAFETENSORS,
               "max_small": MAX_SMALL_FILE, "max_header": MAX_HEADER, "key": RESULT_KEY}
    digest = hashlib.sha256(json.dumps([namespace, sorted(locations.items())], sort_keys=True).encode("utf-8")).hexdigest()[:10]
    first = sorted(layout["claims"])[0]
    marks = dict(labels or {})
    marks.update({"app.kubernetes.io/managed-by": "alauda.spec_decoding", "app.kubernetes.io/component": COMPONENT})
    container = {
        "name": CONTAINER, "image": image, "imagePullPolicy": pull_policy,
        "command": ["python3", "-c", JOB_SCRIPT, json.dumps(request, sort_keys=True)],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
        # it reads and prints: nothing to write, no privilege (admitted where Pod Security is "baseline" or stricter)
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": volume, "mountPath": posixpath.join(MOUNT_ROOT, volume), "readOnly": True}
                         for _claim, volume in sorted(layout["claims"].items(), key=lambda kv: kv[1])],
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        # generateName: two deploys of the same pair never collide on a leftover Job
        "metadata": {"generateName": "%s-preflight-%s-" % (first[:30].rstrip("-."), digest), "namespace": namespace, "labels": marks},
        "spec": {
            "backoffLimit": 0, "activeDeadlineSeconds": int(timeout), "ttlSecondsAfterFinished": 300,
            "template": {
                "metadata": dict({"labels": marks}, **({"annotations": dict(annotations)} if annotations else {})),
                "spec": {"restartPolicy": "Never", "containers": [container],
                         "volumes": [{"name": volume, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
                                     for claim, volume in sorted(layout["claims"].items(), key=lambda kv: kv[1])]},
            },
        },
    }


def parse_log(text):
    """The Job's result line: ``{directory: {"files": {name: bytes}, "error": ...}}``; None when no line has it."""
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get(RESULT_KEY), dict):
            out = {}
            for folder, entry in data[RESULT_KEY].items():
                files = {name: base64.b64decode(value) for name, value in (entry.get("files") or {}).items()}
                out[folder] = {"files": files, "error": entry.get("error")}
            return out
    return None


class DumpReader:
    """model_metadata's reader interface (``read``, ``read_range``) over the files one directory's Job entry holds."""

    def __init__(self, entry):
        self.files = dict((entry or {}).get("files") or {})

    def read(self, name, limit=MAX_SMALL_FILE):
        data = self.files.get(name)
        return None if data is None else data[:limit]

    def read_range(self, name, start, length):
        data = self.files.get(name)
        return None if data is None else data[start:start + length]
