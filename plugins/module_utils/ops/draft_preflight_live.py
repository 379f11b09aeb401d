# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pair a live InferenceService serves, as the preflight reads it (draft_preflight_info ``name``; verify re-runs the
preflight read-only with it): the method and keys of its ``--speculative-config``, the target vLLM serves (``vllm
serve <path>`` or ``--model``) and the draft (the config's ``model``), each path in the container mapped back to the
storage it is mounted from (KServe's layout: ``spec.predictor.storageUris`` entries at their mountPath, else the one
storageUri at /mnt/models; ops/draft_location.py reads mounts the same way) - ``pvc://claim/prefix/rel``, the Modelcar
image and its ``/models/rel`` directory, or ``uri/rel`` for an http(s), s3 or hf store. A path no storage mounts is
said so; a relative name is a hub id (vLLM loads it from the hub: ``hf://``).
Plain Python, no Ansible imports.
"""

from __future__ import annotations

import posixpath

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import storage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line


def _mounts(isvc):
    """[(uri, mountPath)], the longest mountPath first."""
    predictor = ((isvc or {}).get("spec") or {}).get("predictor") or {}
    found = [((e or {}).get("uri") or "", (e or {}).get("mountPath") or storage.DEFAULT_MOUNT) for e in predictor.get("storageUris") or []]
    model = predictor.get("model") if isinstance(predictor.get("model"), dict) else {}
    single = model.get("storageUri") or predictor.get("storageUri")
    if single and not found:
        found = [(single, storage.DEFAULT_MOUNT)]
    return sorted(((u, posixpath.normpath(m)) for u, m in found if u), key=lambda um: -len(um[1]))


def source_of(isvc, path):
    """``(location, modelcar subdir or None)`` of ``path`` in the predictor, or ``(None, reason)``."""
    if not path:
        return None, "no path"
    if not path.startswith("/"):
        return "hf://" + path, None  # a hub id: vLLM downloads it (air-gapped inventories refuse hf:// in the preflight)
    path = posixpath.normpath(path)
    for uri, mount in _mounts(isvc):
        if path != mount and not path.startswith(mount.rstrip("/") + "/"):
            continue
        rel = "" if path == mount else posixpath.relpath(path, mount)
        _mode, normalised, is_oci = storage.parse_oci_scheme(uri)
        if is_oci:
            return normalised, rel  # the image's /models is mounted at mountPath
        if uri.startswith("pvc://"):
            claim, _sep, prefix = uri[len("pvc://"):].partition("/")
            return "pvc://%s/%s" % (claim, posixpath.join(prefix.strip("/"), rel).strip("/") if rel else prefix.strip("/")), None
        return uri.rstrip("/") + ("/" + rel if rel else ""), None
    return None, "%s is not under a storage URI's mount" % path


def pair_of(isvc):
    """``{"method", "speculative", "target", "draft", "target_subdir", "draft_subdir", "skipped"}`` of the predictor."""
    out = {"method": None, "speculative": {}, "target": None, "draft": None, "target_subdir": "", "draft_subdir": "", "skipped": None}
    containers = {name: command + args for name, command, args in isvc_readers.predictor_containers(isvc)}
    flags = [flag for flag in isvc_readers.isvc_speculative_flags(isvc) if flag["present"]]
    if not flags:
        out["skipped"] = "the predictor carries no --speculative-config"
        return out
    if flags[0]["config"] is None:
        out["skipped"] = "the predictor's --speculative-config is unreadable: %s" % flags[0]["error"]
        return out
    config = dict(flags[0]["config"])
    out["method"] = config.get("method")
    out["speculative"] = config
    target_path = command_line.served_model(containers.get(flags[0]["container"]) or [])
    for role, path in (("target", target_path), ("draft", config.get("model"))):
        if role == "draft" and not path:
            continue
        location, detail = source_of(isvc, path)
        if location is None:
            out["skipped"] = "the %s %s" % (role, detail if path else "path is not on the command line")
            return out
        out[role] = location
        out[role + "_subdir"] = detail or ""
    return out
