# -*- coding: utf-8 -*-
# Copyright: Alauda
# Apache License 2.0 (see LICENSE)
"""Plan a PVC staging run (the stage_pvc role): sizes, PVC decision, ownership of subdirectories, the stager's plan.

Plain Python. Everything here runs on the controller before anything is written to the cluster, so bad
input (missing source, PVC too small, a subdirectory holding another model, an absent storage class)
fails with a message that names the field and the fix.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import urllib.parse

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import artifact_sync
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

STAGED_ANNOTATION = "spec-decoding.alauda.io/staged"
MOUNT_PATH = "/mnt/pvc"
SOURCE_MOUNT = "/mnt/source"
SCRIPT_DIR = "/opt/spec-decoding"
GI = 1 << 30

_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|m)?\s*$")
_FACTORS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
            "k": 10 ** 3, "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18, "m": 0.001}
_SUBDIR = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
_PVC_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def parse_quantity(value, field="size"):
    """Kubernetes quantity ('100Gi', '1.5T', '500M', 1024) -> bytes (int, rounded up)."""
    if isinstance(value, bool):
        raise ValidationError("%r is not a storage quantity" % (value,), field=field)
    if isinstance(value, (int, float)):
        return int(math.ceil(value))
    match = _QUANTITY.match(str(value or ""))
    if not match:
        raise ValidationError("%r is not a storage quantity" % (value,), field=field, hint="use e.g. 100Gi, 500Mi or 1Ti")
    return int(math.ceil(float(match.group(1)) * _FACTORS[match.group(2)]))


def format_gi(num_bytes):
    """Bytes -> whole Gi quantity, rounded up ('17Gi')."""
    return "%dGi" % max(1, int(math.ceil(num_bytes / float(GI))))


def source_kind(source):
    """'controller' (a directory on the controller), 'volume', 'http', 'hf' or 's3'."""
    if not isinstance(source, str) or not source.strip():
        raise ValidationError("is empty", field="source", hint="give a directory, volume:<path>, http(s)://, hf://<repo> or s3:// source")
    scheme = urllib.parse.urlsplit(source).scheme.lower()
    if source.startswith("volume:"):
        return "volume"
    if scheme in ("", "file"):
        return "controller"
    if scheme in ("http", "https"):
        return "http"
    if scheme in ("hf", "s3"):
        return scheme
    raise ValidationError("unsupported source %r" % source, field="source",
                          hint="use a directory, volume:<path>, http(s)://, hf://<repo>[@rev] or s3://bucket/prefix")


def _item_field(index, key):
    return "stage_pvc_items[%d].%s" % (index, key)


def normalize_items(items):
    """Validate the items (name, subdir, source, ...) and return clean copies."""
    if not items:
        raise ValidationError("is empty", field="stage_pvc_items", hint="list the target model and the draft to stage")
    out, subdirs = [], {}
    for i, raw in enumerate(items):
        if not isinstance(raw, dict):
            raise ValidationError("must be a mapping", field="stage_pvc_items[%d]" % i)
        item = dict(raw)
        for key in ("name", "subdir", "source"):
            if not item.get(key) or not isinstance(item.get(key), str):
                raise ValidationError("is required", field=_item_field(i, key),
                                      hint="each item needs name (model id), subdir (directory on the PVC) and source")
        subdir = item["subdir"].strip("/")
        if not _SUBDIR.match(subdir) or ".." in subdir.split("/"):
            raise ValidationError("%r is not a safe relative directory" % item["subdir"], field=_item_field(i, "subdir"),
                                  hint="use letters, digits, '.', '_', '-' and '/', e.g. Meta-Llama-3.1-8B-Instruct")
        if subdir in subdirs:
            raise ValidationError("%r is used by items %d and %d" % (subdir, subdirs[subdir], i), field=_item_field(i, "subdir"),
                                  hint="give every model its own subdirectory")
        for other, j in subdirs.items():
            if other.startswith(subdir + "/") or subdir.startswith(other + "/"):
                raise ValidationError("%r and %r (item %d) nest inside each other" % (subdir, other, j), field=_item_field(i, "subdir"))
        subdirs[subdir] = i
        item["subdir"] = subdir
        try:
            item["kind"] = source_kind(item["source"])
        except ValidationError as exc:
            raise ValidationError("unsupported source %r" % item["source"], field=_item_field(i, "source"), hint=exc.hint) from exc
        for key in ("include", "exclude"):
            item[key] = list(item.get(key) or [])
        out.append(item)
    return out


def list_item(item, index, air_gapped=False, hf_endpoint=None, s3_endpoint=None, token=None, insecure=False):
    """Size of one item as seen from the controller: {'bytes', 'files', 'listed'}; raises on a bad source."""
    kind = item["kind"]
    if item.get("size_bytes") and kind in ("volume",):
        return {"bytes": int(item["size_bytes"]), "files": None, "listed": False}
    if kind == "volume":
        return {"bytes": int(item.get("size_bytes") or 0), "files": None, "listed": False}
    source = item["source"]
    try:
        src = artifact_sync.make_source(source, air_gapped=air_gapped, hf_endpoint=item.get("hf_endpoint") or hf_endpoint,
                                        revision=item.get("revision"), s3_endpoint=item.get("s3_endpoint") or s3_endpoint,
                                        index_url=item.get("index_url"), token=token, insecure=insecure)
        files = artifact_sync.select_files(src.list_files(), item["include"], item["exclude"])
    except artifact_sync.SpecDecodingError as exc:
        raise ValidationError(str(exc), field=_item_field(index, "source")) from exc
    if not files:
        raise ValidationError("%s has no files to stage (after include/exclude)" % source, field=_item_field(index, "source"),
                              hint="check the path and the include/exclude patterns")
    return {"bytes": sum(f.size or 0 for f in files), "files": len(files), "listed": True}


def staged_annotation(pvc):
    """The subdir -> {name, ...} map recorded on the PVC by earlier runs."""
    ann = ((pvc or {}).get("metadata") or {}).get("annotations") or {}
    try:
        data = json.loads(ann.get(STAGED_ANNOTATION) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def check_inputs(params):
    """The PVC name, access modes and mirror endpoints, checked before anything is listed or written."""
    name = params.get("pvc_name")
    if not isinstance(name, str) or len(name) > 44 or not _PVC_NAME.match(name):
        raise ValidationError("%r is not a valid PVC name (a DNS-1123 label of at most 44 characters, so the stager Job's name fits)"
                              % (name,), field="stage_pvc_name",
                              hint="use lowercase letters, digits and '-', e.g. '%s'" % (
                                  re.sub(r"[^a-z0-9-]+", "-", str(name).lower()).strip("-")[:44] or "model-store"))
    for mode in params.get("access_modes") or []:
        if mode not in ACCESS_MODES:
            raise ValidationError("%r is not a PVC access mode" % (mode,), field="stage_pvc_access_modes", hint="use %s" % ", ".join(ACCESS_MODES))
    for key in ("hf_endpoint", "s3_endpoint"):
        value = params.get(key)
        if value and urllib.parse.urlsplit(value).scheme not in ("http", "https"):
            raise ValidationError("%r is not an http(s) URL" % (value,), field="stage_pvc_" + key,
                                  hint="give the mirror's URL with its scheme, e.g. https://%s" % value.split("://")[-1])


def plan(params):  # pylint: disable=too-many-locals,too-many-branches,too-many-statements
    """Compute everything the role needs; raise ValidationError on bad input. ``params`` mirrors the module options."""
    name = params["pvc_name"]
    check_inputs(params)
    items = normalize_items(params.get("items"))
    air_gapped = bool(params.get("air_gapped"))
    force = bool(params.get("force"))
    warnings = []

    # Sources and sizes (controller side).
    serve = []
    controller_address = params.get("controller_address")
    for i, item in enumerate(items):
        if air_gapped and item["kind"] in ("http", "hf", "s3"):
            try:
                if item["kind"] == "hf":
                    endpoint = item.get("hf_endpoint") or params.get("hf_endpoint") or artifact_sync.DEFAULT_HF_ENDPOINT
                    artifact_sync.check_url_allowed(endpoint, True, field=_item_field(i, "source"))
                    if artifact_sync.is_public_hub(urllib.parse.urlsplit(endpoint).hostname):
                        raise ValidationError("air-gapped", field=_item_field(i, "source"))
                elif item["kind"] == "s3":
                    artifact_sync.check_url_allowed(item.get("s3_endpoint") or params.get("s3_endpoint") or "", True, field=_item_field(i, "source"))
                else:
                    artifact_sync.check_url_allowed(item["source"], True, field=_item_field(i, "source"))
            except ValidationError as exc:
                raise ValidationError(
                    "air-gapped inventory: %s would reach a public hub (%s)" % (item["source"], exc), field=_item_field(i, "source"),
                    hint="set stage_pvc_hf_endpoint to the internal mirror or use an internal http/s3 mirror or a directory") from exc
        if item["kind"] == "volume" and not params.get("source_volume"):
            raise ValidationError("volume: sources need stage_pvc_source_volume (the volume the stager mounts at %s)" % SOURCE_MOUNT,
                                  field=_item_field(i, "source"))
        if item["kind"] == "controller":
            path = urllib.parse.urlsplit(item["source"]).path if item["source"].startswith("file:") else item["source"]
            if not os.path.isdir(path):
                raise ValidationError("the controller directory %s does not exist" % path, field=_item_field(i, "source"),
                                      hint="give an existing directory on the Ansible controller")
            if not controller_address:
                raise ValidationError("a controller directory needs stage_pvc_controller_address", field=_item_field(i, "source"),
                                      hint="set stage_pvc_controller_address to an address of this controller that pods can reach, "
                                      "or stage from a volume:/http/s3/hf source")
        listed = {"bytes": int(item.get("size_bytes") or 0), "files": None, "listed": False}
        if item["kind"] == "controller" or (params.get("list_sources", True) and item["kind"] != "volume"):
            listed = list_item(item, i, air_gapped=air_gapped, hf_endpoint=params.get("hf_endpoint"), s3_endpoint=params.get("s3_endpoint"),
                               insecure=params.get("insecure", False))
        item.update(listed)

    # Size.
    explicit = parse_quantity(params["size"], field="stage_pvc_size") if params.get("size") else None
    data_bytes = sum(item["bytes"] for item in items)
    unknown = [it["subdir"] for it in items if not it["bytes"]]
    if unknown and explicit is None:
        raise ValidationError("the size of %s is unknown" % ", ".join(unknown), field="stage_pvc_size",
                              hint="set stage_pvc_size, or size_bytes on volume: items (the controller cannot list them)")
    headroom = float(params.get("headroom_percent", 10))
    minimum = parse_quantity(params.get("min_size") or "1Gi", field="stage_pvc_min_size")
    required = max(int(math.ceil(data_bytes * (1 + headroom / 100.0))), minimum)
    if explicit is not None and explicit < data_bytes:
        raise ValidationError("%s is smaller than the %s of model files" % (params["size"], artifact_sync.human_bytes(data_bytes)),
                              field="stage_pvc_size", hint="use at least %s (files + %g%% headroom)" % (format_gi(required), headroom))
    wanted = explicit if explicit is not None else required
    wanted_quantity = params["size"] if explicit is not None else format_gi(required)

    # Storage class.
    sc_name = params.get("storage_class_name")
    sc = params.get("storage_class")
    if sc_name and not sc:
        raise ValidationError("StorageClass %r does not exist" % sc_name, field="stage_pvc_storage_class",
                              hint="list them with kubectl get storageclass, or leave it empty for the cluster default")

    # The existing PVC.
    pvc = params.get("existing_pvc") or None
    action = "create"
    size_quantity = wanted_quantity
    current = None
    if pvc:
        spec = pvc.get("spec") or {}
        cur_q = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
        current = parse_quantity(cur_q, field="existing PVC size") if cur_q else 0
        capacity_q = ((pvc.get("status") or {}).get("capacity") or {}).get("storage")
        capacity = parse_quantity(capacity_q) if capacity_q else current
        have = max(current, capacity)
        if explicit is not None and explicit < current:
            raise ValidationError("PVC %s requests %s; stage_pvc_size %s would shrink it" % (name, cur_q, params["size"]),
                                  field="stage_pvc_size", hint="PVCs cannot shrink: use a size >= %s or a new PVC name" % cur_q)
        if sc_name and spec.get("storageClassName") and spec.get("storageClassName") != sc_name:
            warnings.append("PVC %s uses storage class %s, not %s; a PVC's class cannot change, keeping it" % (
                name, spec.get("storageClassName"), sc_name))
        modes = params.get("access_modes") or []
        if modes and sorted(spec.get("accessModes") or []) != sorted(modes):
            warnings.append("PVC %s has access modes %s, not %s; keeping them" % (name, spec.get("accessModes"), modes))
        if have >= wanted:
            action = "reuse"
            size_quantity = cur_q
        else:
            cls_name = spec.get("storageClassName")
            expandable = bool(sc and (sc.get("metadata") or {}).get("name") == cls_name and sc.get("allowVolumeExpansion"))
            if params.get("existing_storage_class") is not None:
                expandable = bool(params["existing_storage_class"].get("allowVolumeExpansion"))
            if not expandable:
                raise ValidationError(
                    "PVC %s is %s but the models need %s (%s of files + %g%% headroom) and its storage class %s does not allow expansion" % (
                        name, cur_q, wanted_quantity, artifact_sync.human_bytes(data_bytes), headroom, cls_name or "(none)"),
                    field="stage_pvc_name", hint="use a new PVC name with a larger size, or a storage class with allowVolumeExpansion")
            phase = (pvc.get("status") or {}).get("phase")
            if phase != "Bound":
                raise ValidationError(
                    "PVC %s is %s but the models need %s, and it is %s: Kubernetes expands only bound claims" % (
                        name, cur_q, wanted_quantity, phase or "not bound"),
                    field="stage_pvc_name", hint="wait until the PVC is Bound and rerun, or use a new PVC name")
            action = "expand"

    # Ownership of the subdirectories (recorded on the PVC by earlier runs).
    staged = staged_annotation(pvc)
    replaced = []
    for i, item in enumerate(items):
        prev = staged.get(item["subdir"])
        if prev and prev.get("name") and prev.get("name") != item["name"]:
            if not force:
                raise ValidationError(
                    "subdirectory %s of PVC %s holds the model %r, not %r" % (item["subdir"], name, prev.get("name"), item["name"]),
                    field=_item_field(i, "subdir"), hint="use another subdir, or set stage_pvc_force: true to replace it")
            replaced.append(item["subdir"])

    # The stager's plan (JSON in the ConfigMap).
    plan_items = []
    for i, item in enumerate(items):
        job_source = item["source"]
        if item["kind"] == "volume":
            job_source = SOURCE_MOUNT + "/" + item["source"][len("volume:"):].lstrip("/")
        elif item["kind"] == "controller":
            port = int(params.get("controller_port") or 8765) + len(serve)
            path = urllib.parse.urlsplit(item["source"]).path if item["source"].startswith("file:") else item["source"]
            serve.append({"dir": os.path.abspath(path), "port": port, "subdir": item["subdir"]})
            job_source = "http://%s:%d/" % (controller_address, port)
        entry = {"name": item["name"], "source": job_source, "dest": "%s/%s" % (MOUNT_PATH, item["subdir"])}
        for key in ("revision", "hf_endpoint", "s3_endpoint", "index_url", "include", "exclude"):
            if item.get(key):
                entry[key] = item[key]
        if item["subdir"] in replaced or force:
            entry["force"] = True
        plan_items.append(entry)
    job_plan = {"items": plan_items, "root": MOUNT_PATH, "verify": params.get("verify") or "auto"}
    if air_gapped:
        job_plan["air_gapped"] = True
    if params.get("hf_endpoint"):
        job_plan["hf_endpoint"] = params["hf_endpoint"]
    if params.get("s3_endpoint"):
        job_plan["s3_endpoint"] = params["s3_endpoint"]
    if params.get("workers"):
        job_plan["workers"] = params["workers"]
    plan_json = json.dumps(job_plan, sort_keys=True, indent=1)
    digest = hashlib.sha256(plan_json.encode("utf-8") + (params.get("script_sha256") or "").encode("utf-8")).hexdigest()

    return {
        "pvc_name": name,
        "pvc_action": action,
        "size": size_quantity,
        "required_bytes": required,
        "data_bytes": data_bytes,
        "current_bytes": current,
        "items": [{k: item.get(k) for k in ("name", "subdir", "source", "kind", "bytes", "files", "listed")} for item in items],
        "replaced": replaced,
        "plan": job_plan,
        "plan_json": plan_json,
        "plan_sha256": digest,
        "serve": serve,
        "paths": {item["subdir"]: "%s/%s" % (params.get("model_mount_path") or "/mnt/models", item["subdir"]) for item in items},
        "storage_uri": "pvc://%s/" % name,
        "warnings": warnings,
    }


def _summary_item(summary, subdir):
    """The summary item whose dest is ``.../<subdir>`` (the pod mounts the PVC at /mnt/pvc)."""
    for item in summary.get("items") or []:
        dest = (item.get("dest") or "").rstrip("/")
        if dest == "%s/%s" % (MOUNT_PATH, subdir) or dest.endswith("/" + subdir):
            return item
    return None


def staged_record(items, summary, existing_pvc=None):
    """JSON for the PVC annotation: earlier records plus what this run staged (subdir -> name, source, digest)."""
    staged = staged_annotation(existing_pvc)
    for item in normalize_items(items):
        got = _summary_item(summary, item["subdir"])
        if got is not None:
            staged[item["subdir"]] = {"name": got.get("name"), "source": item["source"], "files": got.get("files"),
                                      "bytes": got.get("bytes"), "tree_sha256": got.get("tree_sha256")}
    return json.dumps(staged, sort_keys=True)


def parse_stager_log(text, expected_subdirs=None, expected_names=None):
    """Read the stager's last JSON line and check it covers every expected item; return the summary."""
    summary = None
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if line.startswith("{") and artifact_sync.RESULT_KEY in line:
            try:
                summary = json.loads(line)[artifact_sync.RESULT_KEY]
            except (ValueError, KeyError, TypeError):
                summary = None
            break
    if summary is None:
        raise ValidationError("the stager's log has no summary line", field="stager log",
                              hint="the Job did not run artifact_sync.pyz to the end; read its pod log")
    if not summary.get("ok"):
        errors = [it.get("error") for it in summary.get("items") or [] if it.get("error")]
        raise ValidationError("the stager failed: %s" % "; ".join(errors or ["unknown error"]), field="stager log")
    missing = [sub for sub in (expected_subdirs or []) if _summary_item(summary, sub) is None]
    if missing:
        raise ValidationError("the stager's summary lacks %s" % ", ".join(missing), field="stager log")
    layout = summary.get("layout")
    if layout is not None:
        absent = [s.split("/")[0] for s in (expected_subdirs or []) if s.split("/")[0] not in layout]
        if absent:
            raise ValidationError("the PVC root lists %s, missing %s" % (layout, ", ".join(absent)), field="stager log")
    for sub, name in zip(expected_subdirs or [], expected_names or []):
        got = _summary_item(summary, sub)
        if name and got.get("name") != name:
            raise ValidationError("%s holds %r, expected %r" % (sub, got.get("name"), name), field="stager log")
        if not got.get("verified_layout") and summary.get("mode") == "sync":
            raise ValidationError("%s was not checked against its manifest" % sub, field="stager log")
    return summary
