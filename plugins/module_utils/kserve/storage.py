# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""KServe's storage rules, in one place: which storage URIs and mount paths KServe v0.20 accepts, for an
InferenceService and an LLMInferenceService, and the cluster's OCI mode they depend on.

Read from kserve/kserve at tag v0.20.0 (1fb78105); the cases of its Go tests are in tests/fixtures/kserve/storage.json
and run against the functions here. Plain Python, no Ansible imports, no API calls.

Two levels:

* ``*_problem`` functions give KServe's own verdict (None, or KServe's message): the InferenceService's single
  ``storageUri`` (``ValidateStorageURI``), ``storageUris`` (the webhook's ``validateMultipleStorageURIs`` and the pod
  injector's OCI checks), an LLMInferenceService's ``spec.model.uri`` (``attachModelArtifacts``), the OCI mode of the
  ``storageInitializer`` settings (``ResolveOciModelMode``).
* ``check_*`` functions are what the renders call: KServe's verdict raised as a ValidationError naming the field and the
  fix, plus what KServe accepts but leaves unmounted (a local path, a bare ``oci://`` while OCI is off, two PVC entries
  at one mountPath: KServe mounts only the first).
"""

from __future__ import annotations

import json
import posixpath
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

DEFAULT_MOUNT = "/mnt/models"
CONFIG_MAP = "inferenceservice-config"
CONFIG_KEY = "storageInitializer"
# ResolveOciModelMode: "modelcar" (a sidecar, the default), "native" (a Kubernetes ImageVolume), "fetch" (runs the modelcar
# path in v0.20); "" means OCI is off, which the collection calls "disabled".
OCI_MODES = ("modelcar", "native", "fetch")
OCI_DISABLED = "disabled"
OCI_MODE_CHOICES = OCI_MODES + (OCI_DISABLED,)
# What KServe installs (config/configmap/inferenceservice.yaml: enableModelcar true, no ociModelMode).
DEFAULT_OCI_MODE = "modelcar"
# SupportedStorageURIPrefixList (pkg/controller/v1beta1/inferenceservice/utils/utils.go).
ISVC_URI_PREFIXES = ("gs://", "s3://", "pvc://", "file://", "https://", "http://", "hdfs://", "webhdfs://", "oci://", "oci+native://", "hf://")
# attachModelArtifacts (pkg/controller/v1alpha2/llmisvc/workload_storage.go): the schemes of its switch.
LLMISVC_URI_PREFIXES = ("pvc://", "oci+native://", "oci://", "hf://", "s3://")
MAX_OCI_SOURCES = 10  # MaxOCISourcesPerPod (pkg/utils/storage.go)
_AZURE_BLOB = "blob.core.windows.net"
_AZURE_BLOB_RE = re.compile(r"https://(.+?).blob.core.windows.net/(.+)")
_HAS_PROTOCOL = re.compile(r"\w+?://")
_UNSUPPORTED = ("storageUri, must be one of: [%s] or match https://{}.blob.core.windows.net/{}/{} or be an absolute or relative "
                "local path. StorageUri [%s] is not supported")


# ----------------------------------------------------------------------------------------------------------------
# The OCI mode


def parse_oci_scheme(uri):
    """ParseOciScheme: ``(mode, oci:// URI, is_oci)``; ``oci+native://x`` -> ``("native", "oci://x", True)``, a bare
    ``oci://`` has mode "" (the cluster's mode applies)."""
    uri = uri or ""
    if uri.startswith("oci+"):
        mode, sep, rest = uri[len("oci+"):].partition("://")
        if sep and mode:
            return mode, "oci://" + rest, True
    if uri.startswith("oci://"):
        return "", uri, True
    return "", uri, False


def _flag(value):
    # KServe's JSON has booleans; a string "true" is read as the user meant it rather than failing the deploy.
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def resolve_oci_mode(settings):
    """ResolveOciModelMode of the ``storageInitializer`` settings (a dict, or its JSON text): ``ociModelMode`` when set,
    else ``modelcar`` when ``enableModelcar`` or ``enableOciModelSupport`` is true, else ``disabled``. Keys match
    case-insensitively, as Go's encoding/json matches them. Returns ``(mode, why)``."""
    if isinstance(settings, str):
        settings = json.loads(settings or "{}")
    if not isinstance(settings, dict):
        settings = {}
    keys = {str(k).lower(): v for k, v in settings.items()}
    explicit = keys.get("ocimodelmode")
    if isinstance(explicit, str) and explicit:
        if explicit in OCI_MODES:
            return explicit, "ociModelMode: %s" % explicit
        # KServe keeps the value and its injector's default branch runs the modelcar path.
        return "modelcar", "ociModelMode: %s is not a mode KServe v0.20 knows; its injector then runs the modelcar path" % explicit
    for key, name in (("enablemodelcar", "enableModelcar"), ("enableocimodelsupport", "enableOciModelSupport")):
        if _flag(keys.get(key)):
            return "modelcar", "%s: true (no ociModelMode)" % name
    return OCI_DISABLED, "no ociModelMode and neither enableModelcar nor enableOciModelSupport is true"


def settings_for(oci_mode):
    """The storageInitializer settings that resolve to ``oci_mode``."""
    check_oci_mode(oci_mode)
    return {} if oci_mode == OCI_DISABLED else {"ociModelMode": oci_mode}


def oci_mode_of(params):
    """The OCI mode a render works with: ``oci_model_mode`` when given (the cluster's, or the inventory's for GitOps), else
    ``disabled`` when the older ``modelcar_enabled`` is false, else what KServe installs."""
    mode = params.get("oci_model_mode")
    if mode:
        return check_oci_mode(mode)
    return OCI_DISABLED if params.get("modelcar_enabled") is False else DEFAULT_OCI_MODE


def check_oci_mode(oci_mode, field="oci_model_mode"):
    if oci_mode not in OCI_MODE_CHOICES:
        raise ValidationError("'%s' is not an OCI model mode" % (oci_mode,), field=field,
                              hint="use one of %s (the inferenceservice-config storageInitializer.ociModelMode, or disabled when "
                                   "OCI images are off)" % ", ".join(OCI_MODE_CHOICES))
    return oci_mode


# ----------------------------------------------------------------------------------------------------------------
# KServe's verdicts (None or KServe's message)


def isvc_storage_uri_problem(uri):
    """ValidateStorageURI for ``spec.predictor.model.storageUri`` (no ClusterStorageContainer): a local path (no
    ``<word>://``) passes, an Azure Blob URL must match its pattern, anything else needs a supported prefix."""
    uri = "" if uri is None else str(uri)
    if not _HAS_PROTOCOL.search(uri):
        return None
    if _AZURE_BLOB in uri:
        if _AZURE_BLOB_RE.search(uri):
            return None
    elif uri.startswith(ISVC_URI_PREFIXES):
        return None
    return _UNSUPPORTED % (", ".join(ISVC_URI_PREFIXES), uri)


def common_parent(paths):
    """FindCommonParentPath (pkg/utils/storage.go): the longest shared leading directories, "/" when none."""
    if not paths:
        return ""
    if len(paths) == 1:
        return paths[0]
    parts = [path.strip("/").split("/") if path.strip("/") else [] for path in paths]
    shortest = min((len(p) for p in parts if p), default=0)
    common = []
    for i in range(shortest):
        level = {p[i] for p in parts}
        if len(level) != 1:
            break
        common.append(parts[0][i])
    return "/" + "/".join(common) if common else "/"


def parent_directory(path):
    """GetParentDirectory (pkg/utils/utils.go): Go's filepath.Dir, "/" for a top-level path."""
    parent = posixpath.normpath(posixpath.dirname(path) or ".")
    parent = "/" + parent.lstrip("/") if parent.startswith("/") else parent
    return "/" if parent in (".", "/") else parent


def _mount_path_problem(path):
    """validateStorageURISpec's mountPath rules (the empty-URI rule is checked by the caller)."""
    if path == "/":
        return "storage path cannot be empty"
    if not path.startswith("/"):
        return "storage path must be absolute: %s" % path
    if ".." in path:
        return "storage path cannot contain '..' for security reasons: %s" % path
    return None


def isvc_storage_uris_problems(entries, settings=None, storage_uri=None):
    """KServe's verdict on ``spec.predictor.storageUris`` (``storage_uri``: a ``storageUri`` beside them), as
    ``(message, index, key)`` or None; ``index``/``key`` say which entry and field (None: the list).

    The webhook (validateMultipleStorageURIs): not both storageUri and storageUris; each entry a URI and an absolute
    mountPath, not ``/``, without ``..``; with two or more non-PVC entries, PVC mountPaths unique and the non-PVC ones
    sharing a parent other than ``/``. Then the pod injector (CommonStorageInitialization), when an entry is OCI with a
    mode: at most MAX_OCI_SOURCES ``oci://`` entries, and ValidateOCIMountPaths over their mountPaths with the cluster's
    mode: native refuses only the same path twice, every other mode two paths with the same parent directory."""
    if storage_uri is not None and entries is not None:
        return "Setting both StorageURI and StorageURIs is not supported.", None, None
    entries = list(entries or [])
    paths, pvc_paths = [], []
    for index, entry in enumerate(entries):
        uri, path = entry.get("uri") or "", entry.get("mountPath", DEFAULT_MOUNT)
        if not uri:
            return "storage URI cannot be empty", index, "uri"
        problem = _mount_path_problem(path)
        if problem:
            return problem, index, "mountPath"
        (pvc_paths if uri.startswith("pvc://") else paths).append((index, path))
    if len(paths) > 1:
        seen = set()
        for index, path in pvc_paths:
            if path in seen:
                return "PVC storage paths must be unique", index, "mountPath"
            seen.add(path)
        if common_parent([p for _i, p in paths]) == "/":
            return ("storage paths must have a common parent directory. Current paths: [%s] have no common parent beyond root"
                    % " ".join(p for _i, p in paths), paths[-1][0], "mountPath")
    config_mode, _why = resolve_oci_mode(settings)
    config_mode = "" if config_mode == OCI_DISABLED else config_mode
    if not any(parse_oci_scheme(e.get("uri"))[2] and (parse_oci_scheme(e.get("uri"))[0] or config_mode) for e in entries):
        return None
    oci = [(i, e.get("mountPath", DEFAULT_MOUNT)) for i, e in enumerate(entries) if (e.get("uri") or "").startswith("oci://")]
    if len(oci) > MAX_OCI_SOURCES:
        return "too many OCI sources (%d); maximum is %d per pod" % (len(oci), MAX_OCI_SOURCES), None, None
    seen = {}
    for index, path in oci:
        key = path if config_mode == "native" else parent_directory(path)
        if key in seen and config_mode == "native":
            return ('OCI mount path "%s" is specified more than once; each native ImageVolume must have a unique mount path'
                    % path, index, "mountPath")
        if key in seen:
            return ('OCI mount paths "%s" and "%s" share parent directory "%s", which would cause volume mount shadowing; use '
                    "mount paths with distinct parent directories" % (seen[key], path, key), index, "mountPath")
        seen[key] = path
    return None


def llmisvc_model_uri_problem(uri, settings=None):
    """attachModelArtifacts for ``spec.model.uri``: ``pvc://``, ``oci+native://``, ``hf://``, ``s3://``, and ``oci://``
    when the cluster's OCI mode is not off."""
    uri = "" if uri is None else str(uri)
    scheme, sep, _rest = uri.partition("://")
    if not sep:
        return "invalid model URI: %s" % uri
    prefix = scheme + "://"
    if prefix == "oci://":
        return "OCI modelcars is not enabled" if resolve_oci_mode(settings)[0] == OCI_DISABLED else None
    if prefix in LLMISVC_URI_PREFIXES:
        return None
    return "unsupported schema in model URI: %s" % uri


# ----------------------------------------------------------------------------------------------------------------
# What the renders call: KServe's verdict as a ValidationError with the field and the fix


_OCI_OFF_HINT = ("turn OCI on in the inferenceservice-config storageInitializer (enableModelcar: true, or ociModelMode: "
                 "modelcar or native); if the cluster has it on, set spec_decoding_oci_model_mode to its mode; or use "
                 "oci+native:// (Kubernetes 1.31+ ImageVolume) or a PVC")
_MOUNT_HINTS = (
    ("cannot be empty", "mount under a directory such as /mnt/models (KServe refuses '/')"),
    ("must be absolute", "start it with /, e.g. /mnt/models/draft"),
    ("'..'", "write the path without '..' (KServe refuses it anywhere in the path)"),
    ("PVC storage paths must be unique", "give each PVC entry its own mountPath"),
    ("common parent", "mount under one parent, e.g. /mnt/models/target and /mnt/models/draft"),
    ("shadowing", "give each oci:// entry its own parent directory, e.g. /mnt/target/model and /mnt/draft/model (in the "
                  "native OCI mode siblings such as /mnt/models/target and /mnt/models/draft work)"),
    ("more than once", "give each oci:// entry its own mountPath"),
    ("too many OCI sources", "put target and draft into one Modelcar image (artifact_mode modelcar)"),
    ("Setting both", "remove storage_uri and list every artifact in target_uri/draft_uri"),
    ("storage URI cannot be empty", "give the entry's uri, e.g. pvc://models/draft"),
)


def _hint(message):
    return next((hint for needle, hint in _MOUNT_HINTS if needle in message), None)


def check_mount_path(path, field):
    """A mountPath as KServe's webhook takes it (also used for paths inside what is mounted); returns it normalised."""
    problem = _mount_path_problem(path) if isinstance(path, str) else "storage path must be absolute: %s" % (path,)
    if problem:
        raise ValidationError("'%s' is refused by KServe (%s)" % (path, problem), field=field, hint=_hint(problem))
    return posixpath.normpath(path)


def check_storage_uri(uri, field, kind="InferenceService", oci_mode=DEFAULT_OCI_MODE):
    """A storage URI the render writes (``storageUri``, ``spec.model.uri``, or a ``storageUris`` entry with
    kind ``storageUris``), for a cluster whose OCI mode is ``oci_mode``. Returns the URI."""
    check_oci_mode(oci_mode)
    if not isinstance(uri, str) or not uri.strip():
        raise ValidationError("is required", field=field, hint="give a storage URI such as pvc://models/ or oci://registry/repo:tag")
    explicit, _normalised, is_oci = parse_oci_scheme(uri)
    if kind == "LLMInferenceService":
        problem = llmisvc_model_uri_problem(uri, settings_for(oci_mode))
        if problem:
            raise ValidationError("'%s' is refused by KServe's LLMInferenceService controller (%s)" % (uri, problem), field=field,
                                  hint=_OCI_OFF_HINT if "not enabled" in problem else
                                  "use one of %s; stage the model onto a PVC (pvc://) or into a Modelcar image (oci://)"
                                  % ", ".join(LLMISVC_URI_PREFIXES))
        return uri
    if "://" not in uri:
        # KServe takes it as a path inside the model server's own image and mounts nothing at /mnt/models.
        raise ValidationError("'%s' is a local path, not a storage URI: KServe would mount nothing for it" % uri, field=field,
                              hint="give a storage URI such as pvc://models/llama or oci://registry/repo:tag")
    if kind == "storageUris":
        if not is_oci and not uri.startswith(ISVC_URI_PREFIXES):
            raise ValidationError("'%s' has no scheme KServe's storage initializer or OCI injection takes" % uri, field=field,
                                  hint="use one of %s" % ", ".join(ISVC_URI_PREFIXES))
    else:
        problem = isvc_storage_uri_problem(uri)
        if problem:
            raise ValidationError("'%s' is refused by KServe (%s)" % (uri, problem), field=field,
                                  hint="use one of %s, or an https://<account>.blob.core.windows.net/ URL" % ", ".join(ISVC_URI_PREFIXES))
    if is_oci and not explicit and oci_mode == OCI_DISABLED:
        raise ValidationError("'%s' is an oci:// image but the cluster's storage initializer has OCI off, so KServe mounts nothing "
                              "for it" % uri, field=field, hint=_OCI_OFF_HINT)
    return uri


def check_storage_uris(entries, kserve_version=(0, 20, 0), field="storage_uris", oci_mode=DEFAULT_OCI_MODE):
    """KServe's rules for ``spec.predictor.storageUris`` on a cluster of release ``kserve_version`` with OCI mode
    ``oci_mode``, checked before anything is written."""
    if kserve_version < (0, 16, 0):
        raise ValidationError("needs KServe 0.16 or newer (this cluster's InferenceService CRD has no storageUris)",
                              field=field, hint="use artifact_mode modelcar or pvc, or upgrade KServe")
    found = isvc_storage_uris_problems(entries, settings_for(oci_mode))
    if found:
        message, index, key = found
        where = field if index is None else "%s[%d].%s" % (field, index, key)
        raise ValidationError("KServe refuses this list: %s" % message, field=where, hint=_hint(message))
    for index, entry in enumerate(entries):
        check_storage_uri(entry.get("uri"), "%s[%d].uri" % (field, index), kind="storageUris", oci_mode=oci_mode)
        if parse_oci_scheme(entry.get("uri"))[2] and kserve_version < (0, 19, 0):
            raise ValidationError("OCI images inside storageUris need KServe 0.19 or newer", field="%s[%d].uri" % (field, index),
                                  hint="use artifact_mode modelcar (one image with target and draft) or upgrade KServe")
    if len([e for e in entries if parse_oci_scheme(e.get("uri"))[2]]) > 1 and kserve_version < (0, 20, 0):
        raise ValidationError("several OCI entries need KServe 0.20 or newer", field=field,
                              hint="put target and draft in one Modelcar image (artifact_mode modelcar)")
    pvc_paths = {}
    for index, entry in enumerate(entries):
        if entry["uri"].startswith("pvc://"):
            path = posixpath.normpath(entry.get("mountPath", DEFAULT_MOUNT))
            if path in pvc_paths:
                # KServe accepts it with fewer than two other entries, then mounts only the first PVC there.
                raise ValidationError("mountPath '%s' is used by entries %d and %d: KServe mounts only the first PVC at a path"
                                      % (path, pvc_paths[path], index), field="%s[%d].mountPath" % (field, index),
                                      hint="give each PVC entry its own mountPath")
            pvc_paths[path] = index
