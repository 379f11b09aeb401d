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

An LLMInferenceService (``llmisvc_pair_of``) has one storage, ``spec.model.uri``, which KServe mounts at /mnt/models
(``workload_storage.go`` ``attachModelArtifacts``: a PVC with the URI's path as subPath, a Modelcar image's /models, or the
storage initializer's download); its flag is the decode pool's after the presets' merge (kserve/llmisvc/flags.py), and
the served model the merged container's ``vllm serve <path>`` / ``--model`` - else /mnt/models itself, the directory
KServe's ``config-llm-*`` presets serve.
Plain Python, no Ansible imports.
"""

from __future__ import annotations

import posixpath

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import storage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc_flags
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import merge as llmisvc_merge
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
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


def _llmisvc_mounts(obj):
    uri = (((obj or {}).get("spec") or {}).get("model") or {}).get("uri")
    return [(uri, storage.DEFAULT_MOUNT)] if uri else []


def source_of(isvc, path, mounts=None):
    """``(location, modelcar subdir or None)`` of ``path`` in the predictor (or in ``mounts``: ``[(uri, mountPath)]``),
    or ``(None, reason)``."""
    if not path:
        return None, "no path"
    if not path.startswith("/"):
        return "hf://" + path, None  # a hub id: vLLM downloads it (air-gapped inventories refuse hf:// in the preflight)
    path = posixpath.normpath(path)
    for uri, mount in _mounts(isvc) if mounts is None else mounts:
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


def _empty_pair():
    return {"method": None, "speculative": {}, "target": None, "draft": None, "target_subdir": "", "draft_subdir": "", "skipped": None}


def _locate(out, config, target_path, locate):
    """``out`` with the method, the config and the storage of target and draft (``locate(path)`` as source_of)."""
    config = dict(config)
    out["method"] = config.get("method")
    out["speculative"] = config
    for role, path in (("target", target_path), ("draft", config.get("model"))):
        if role == "draft" and not path:
            continue
        location, detail = locate(path)
        if location is None:
            out["skipped"] = "the %s %s" % (role, detail if path else "path is not on the command line")
            return out
        out[role] = location
        out[role + "_subdir"] = detail or ""
    return out


def pair_of(isvc):
    """``{"method", "speculative", "target", "draft", "target_subdir", "draft_subdir", "skipped"}`` of the predictor."""
    out = _empty_pair()
    containers = {name: command + args for name, command, args in isvc_readers.predictor_containers(isvc)}
    flags = [flag for flag in isvc_readers.isvc_speculative_flags(isvc) if flag["present"]]
    if not flags:
        out["skipped"] = "the predictor carries no --speculative-config"
        return out
    if flags[0]["config"] is None:
        out["skipped"] = "the predictor's --speculative-config is unreadable: %s" % flags[0]["error"]
        return out
    target_path = command_line.served_model(containers.get(flags[0]["container"]) or [])
    return _locate(out, flags[0]["config"], target_path, lambda path: source_of(isvc, path))


def llmisvc_pair_of(obj, presets=None):
    """pair_of for an LLMInferenceService: the decode pool's flag (``spec.template``, or ``spec.worker`` for a multi-node
    pool without one) after KServe's merge with ``presets`` (kserve/llmisvc/cluster.read_presets' result), its paths
    mapped back to ``spec.model.uri``. The prefill pool never drafts."""
    out = _empty_pair()
    found = [f for f in llmisvc_flags.flags(obj, presets) if f["pool"] in ("decode", "worker") and f.get("forms")]
    if not found:
        out["skipped"] = "the decode pool carries no --speculative-config"
        return out
    flag = found[0]
    if flag["config"] is None:
        out["skipped"] = "the decode pool's --speculative-config is unreadable: %s" % (flag.get("error") or flag.get("opaque"))
        return out
    merged = llmisvc_merge.merge_specs(*[layer["spec"] for layer in llmisvc_flags.preset_layers(obj, presets)])
    podspec = llmisvc_model._dig(merged, llmisvc_model.POOLS[flag["pool"]]["path"]) or {}  # pylint: disable=protected-access
    container = next((c for c in podspec.get("containers") or [] if isinstance(c, dict) and c.get("name") == flag["container"]), {})
    words = list(container.get("command") or []) + list(container.get("args") or [])
    target_path = command_line.served_model(words, container.get("env")) or storage.DEFAULT_MOUNT
    mounts = _llmisvc_mounts(obj)
    return _locate(out, flag["config"], target_path, lambda path: source_of(None, path, mounts))
