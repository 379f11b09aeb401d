"""KServe v0.20's storage rules as the test bed's stand-ins apply them: plain functions, no API calls.

Read from kserve/kserve at tag v0.20.0 and written here independently of the collection's
plugins/module_utils/kserve/storage.py (nothing under plugins/ is imported), so tests/unit/test_testbed_storage.py runs
KServe's own cases (tests/fixtures/kserve/storage.json) against this reading and test_kserve_storage.py against the
collection's: both are pinned to KServe, not to each other.

- ``oci_model_mode(storage_initializer)``: pkg/types/config.go ResolveOciModelMode ("" = OCI off);
- ``parse_oci_scheme(uri)``: pkg/utils/storage.go ParseOciScheme;
- ``storage_uri_error(uri)``: pkg/controller/v1beta1/inferenceservice/utils/utils.go ValidateStorageURI (the predictor
  reconcile's "StorageURI not supported");
- ``storage_uris_error(storage_uris, storage_initializer, storage_uri)``: the webhook's validateMultipleStorageURIs
  (pkg/apis/serving/v1beta1/inference_service_validation.go), then the pod mutator's OCI checks in
  CommonStorageInitialization (pkg/webhook/admission/pod/storage_initializer_injector.go: MaxOCISourcesPerPod,
  ValidateOCIMountPaths);
- ``model_uri_error(uri, storage_initializer)``: pkg/controller/v1alpha2/llmisvc/workload_storage.go attachModelArtifacts.
Each returns KServe's error text, or None when KServe goes on.
- ``modelcar_args(model_path)``, ``modelcar_init_args(image)``: the Modelcar sidecar's and init container's args
  (pkg/utils/utils.go CreateModelcarContainer, CreateModelcarInitContainer), as the pod spec carries them: the kubelet's
  `$(VAR)` expansion turns their `$$` into `$` before `sh` reads them.
"""
from __future__ import annotations

import json
import os.path
import re

DEFAULT_MODEL_LOCAL_MOUNT_PATH = "/mnt/models"
# SupportedStorageURIPrefixList
SUPPORTED_STORAGE_URI_PREFIX_LIST = ["gs://", "s3://", "pvc://", "file://", "https://", "http://", "hdfs://", "webhdfs://",
                                     "oci://", "oci+native://", "hf://"]
AZURE_BLOB_URL = "blob.core.windows.net"
AZURE_BLOB_URI_REGEX = re.compile(r"https://(.+?).blob.core.windows.net/(.+)")
MAX_OCI_SOURCES_PER_POD = 10
# The storageInitializer KServe installs (config/configmap/inferenceservice.yaml): what the stand-ins use when the
# cluster has no inferenceservice-config.
INSTALLED_STORAGE_INITIALIZER = {"image": "kserve/storage-initializer:v0.20.0", "memoryRequest": "100Mi", "memoryLimit": "1Gi",
                                 "cpuRequest": "100m", "cpuLimit": "1", "enableModelcar": True, "cpuModelcar": "10m",
                                 "memoryModelcar": "15Mi", "uidModelcar": 1010}


def _config_field(config, json_name):
    # encoding/json matches object keys to the struct's JSON names case-insensitively
    if isinstance(config, str):
        config = json.loads(config)
    for key, value in (config or {}).items():
        if key.lower() == json_name.lower():
            return value
    return None


def oci_model_mode(storage_initializer) -> str:
    """ResolveOciModelMode: OciModelMode (explicit) > EnableOciImageSource (json enableModelcar) / EnableOciModelSupport
    (backcompat) > "" (disabled)."""
    explicit = _config_field(storage_initializer, "ociModelMode")
    if explicit:
        return explicit
    if _config_field(storage_initializer, "enableModelcar") is True or _config_field(storage_initializer, "enableOciModelSupport") is True:
        return "modelcar"
    return ""


def parse_oci_scheme(uri: str):
    """(mode, normalizedURI, isOci)."""
    if uri.startswith("oci+"):
        rest = uri[len("oci+"):]
        sep = rest.find("://")
        if sep > 0:
            return rest[:sep], "oci://" + rest[sep + 3:], True
    if uri.startswith("oci://"):
        return "", uri, True
    return "", uri, False


def storage_uri_error(uri: str):
    if not re.search(r"\w+?://", uri):
        return None  # a local path
    if AZURE_BLOB_URL in uri:
        if AZURE_BLOB_URI_REGEX.search(uri):
            return None
    elif any(uri.startswith(prefix) for prefix in SUPPORTED_STORAGE_URI_PREFIX_LIST):
        return None
    return ("storageUri, must be one of: [%s] or match https://{}.blob.core.windows.net/{}/{} or be an absolute or relative "
            "local path. StorageUri [%s] is not supported" % (", ".join(SUPPORTED_STORAGE_URI_PREFIX_LIST), uri))


def find_common_parent_path(paths: list) -> str:
    if not paths:
        return ""
    if len(paths) == 1:
        return paths[0]
    components = []
    min_length = -1
    for path in paths:
        clean = path.strip("/")
        if clean == "":
            components.append([])
            continue
        parts = clean.split("/")
        components.append(parts)
        min_length = len(parts) if min_length == -1 else min(min_length, len(parts))
    common = []
    for i in range(max(min_length, 0)):
        level = {parts[i] for parts in components}
        if len(level) != 1:
            break
        common.append(components[-1][i])
    return "/" + "/".join(common) if common else "/"


def _validate_storage_uri_spec(entry: dict):
    if entry.get("uri", "") == "":
        return "storage URI cannot be empty"
    mount_path = entry.get("mountPath", DEFAULT_MODEL_LOCAL_MOUNT_PATH)
    if mount_path == "/":
        return "storage path cannot be empty"
    if not mount_path.startswith("/"):
        return "storage path must be absolute: %s" % mount_path
    if ".." in mount_path:
        return "storage path cannot contain '..' for security reasons: %s" % mount_path
    return None


def _validate_multiple_storage_uris_spec(storage_uris: list):
    paths, pvc_paths = [], []
    for entry in storage_uris:
        err = _validate_storage_uri_spec(entry)
        if err:
            return err
        if entry["uri"].startswith("pvc://"):
            pvc_paths.append(entry.get("mountPath", DEFAULT_MODEL_LOCAL_MOUNT_PATH))
        else:
            paths.append(entry.get("mountPath", DEFAULT_MODEL_LOCAL_MOUNT_PATH))
    if len(paths) <= 1:
        return None
    if len(pvc_paths) > 1 and len(set(pvc_paths)) != len(pvc_paths):
        return "PVC storage paths must be unique"
    if find_common_parent_path(paths) == "/":
        return ("storage paths must have a common parent directory. Current paths: [%s] have no common parent beyond root"
                % " ".join(paths))
    return None


def _get_parent_directory(path: str) -> str:
    parent = os.path.dirname(path)
    parent = os.path.normpath(parent) if parent else "."
    return "/" if parent in (".", "/") else parent


def validate_oci_mount_paths(mount_paths: list, mode: str):
    if len(mount_paths) <= 1:
        return None
    if mode == "native":
        seen = set()
        for mount_path in mount_paths:
            if mount_path in seen:
                return ('OCI mount path "%s" is specified more than once; each native ImageVolume must have a unique mount path'
                        % mount_path)
            seen.add(mount_path)
        return None
    parent_dir_seen = {}
    for mount_path in mount_paths:
        parent_dir = _get_parent_directory(mount_path)
        if parent_dir in parent_dir_seen:
            return ('OCI mount paths "%s" and "%s" share parent directory "%s", which would cause volume mount shadowing; '
                    "use mount paths with distinct parent directories" % (parent_dir_seen[parent_dir], mount_path, parent_dir))
        parent_dir_seen[parent_dir] = mount_path
    return None


def storage_uris_error(storage_uris, storage_initializer=None, storage_uri=None):
    if storage_uri is not None and storage_uris is not None:
        return "Setting both StorageURI and StorageURIs is not supported."
    storage_uris = storage_uris or []
    err = _validate_multiple_storage_uris_spec(storage_uris)
    if err:
        return err
    config_mode = oci_model_mode(storage_initializer or {})
    has_oci_uri = False
    for entry in storage_uris:
        parsed_mode, _uri, is_oci = parse_oci_scheme(entry["uri"])
        if is_oci and (parsed_mode or config_mode):
            has_oci_uri = True
            break
    if not has_oci_uri:
        return None
    oci_mount_paths = [e.get("mountPath", DEFAULT_MODEL_LOCAL_MOUNT_PATH) for e in storage_uris if e["uri"].startswith("oci://")]
    if len(oci_mount_paths) > MAX_OCI_SOURCES_PER_POD:
        return "too many OCI sources (%d); maximum is %d per pod" % (len(oci_mount_paths), MAX_OCI_SOURCES_PER_POD)
    return validate_oci_mount_paths(oci_mount_paths, config_mode)


def model_uri_error(uri: str, storage_initializer=None):
    schema, sep, _rest = uri.partition("://")
    if not sep:
        return "invalid model URI: %s" % uri
    prefix = schema + "://"
    if prefix in ("pvc://", "oci+native://", "hf://", "s3://"):
        return None
    if prefix == "oci://":
        return None if oci_model_mode(storage_initializer or {}) else "OCI modelcars is not enabled"
    return "unsupported schema in model URI: %s" % uri


def modelcar_args(model_path: str = DEFAULT_MODEL_LOCAL_MOUNT_PATH) -> list:
    # "$$$$ gets escaped by YAML to $$, which is the current PID" (KServe's comment): the kubelet's expansion makes it $$
    return ["sh", "-c", "ln -sf /proc/$$$$/root/models %s && sleep infinity" % model_path]


def modelcar_init_args(image: str) -> list:
    return ["sh", "-c", "echo 'Pre-fetching modelcar " + image + ": ' && [ -d /models ] && [ \"$$(ls -A /models)\" ] && "
            "echo 'OK ... Prefetched and valid (/models exists)' || (echo 'NOK ... Prefetched but modelcar is invalid "
            "(/models does not exist or is empty)' && exit 1)"]
