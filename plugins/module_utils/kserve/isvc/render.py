# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""InferenceService rendering for vLLM with (or without) speculative decoding, and KServe's rules.

Plain Python: the role's `isvc_manifest` module and the tests call `render()`; nothing here talks to a
cluster. KServe's storage rules (which URIs, which mount paths, the OCI mode) are in `kserve/storage.py`; here the
artifact modes are turned into storage fields: `spec.predictor.storageUris` (since 0.16), a Modelcar image or a PVC
mounted at /mnt/models as `storageUri`.
"""

from __future__ import annotations

import posixpath
import re
import shlex

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError, optional_import
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as spec_core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import per_request_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as oci_registry
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import crd_rules, releases, storage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime as serving_runtime
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers

yaml = optional_import("yaml")[0]  # reported by the calling module (isvc_manifest)
HAS_YAML = yaml is not None

API_VERSION = "serving.kserve.io/v1beta1"
KIND = "InferenceService"
DEPLOYMENT_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
PROGRESS_DEADLINE_ANNOTATION = "serving.knative.dev/progress-deadline"
MODEL_REPO_ANNOTATION = "aml-model-repo"
RUNTIME_TYPE_LABEL = "aml.cpaas.io/runtime-type"
# The predictor fields KServe checks a named runtime against, and the option (role variable) the render sets them from.
RENDER_OPTIONS = {"spec.predictor.model.modelFormat": "model_format, role variable spec_decoding_model_format",
                  "spec.predictor.model.protocolVersion": "protocol_version, role variable spec_decoding_protocol_version"}
DEFAULT_MOUNT = storage.DEFAULT_MOUNT
# KServe rewrites the legacy names since v0.17; comparing through this map keeps reapplies quiet.
LEGACY_DEPLOYMENT_MODES = {"RawDeployment": "Standard", "Serverless": "Knative"}
DEPLOYMENT_MODES = ("Standard", "Knative")
# custom_class: vLLM 0.22-0.33 load a proposer class by import path (speculative.model), no weights to mount; the release
# tables refuse it outside those releases (vllm/config/speculative.py SpeculativeMethod).
METHODS = ("none", "ngram", "eagle3", "eagle", "draft_model", "mtp", "suffix", "custom_class")
ARTIFACT_MODES = ("auto", "storage_uris", "modelcar", "pvc", "single")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# k8s.io/apimachinery pkg/util/validation/validation.go: dns1123SubdomainFmt and qualifiedNameFmt.
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def normalise_deployment_mode(mode):
    """'RawDeployment' -> 'Standard', 'Serverless' -> 'Knative'; other values unchanged."""
    return LEGACY_DEPLOYMENT_MODES.get(mode, mode)


def check_dns1123(name, field, max_len=63):
    if not isinstance(name, str) or not name:
        raise ValidationError("is required", field=field, hint="give a lowercase DNS-1123 name such as 'llama-eagle3'")
    if len(name) > max_len or not _DNS1123.match(name):
        raise ValidationError("'%s' is not a valid DNS-1123 label (lowercase letters, digits and '-', starting and ending "
                              "with a letter or digit, at most %d characters)" % (name, max_len), field=field,
                              hint="use e.g. '%s'" % (re.sub(r"[^a-z0-9-]+", "-", str(name).lower()).strip("-")[:max_len] or "my-model"))


def _path_under(path, mounts):
    path = posixpath.normpath(path)
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


class Artifacts:
    """Where target and draft come from and where vLLM finds them."""

    def __init__(self, mode, target_path, draft_path, storage_uri=None, storage_uris=None, reason=""):
        self.mode = mode
        self.target_path = target_path
        self.draft_path = draft_path
        self.storage_uri = storage_uri
        self.storage_uris = storage_uris
        self.reason = reason

    @property
    def mounts(self):
        if self.storage_uris:
            return [e["mountPath"] for e in self.storage_uris]
        return [DEFAULT_MOUNT]


def _default_storage_uri_mounts(target_uri, draft_uri):
    both_oci = target_uri.startswith("oci://") and draft_uri.startswith("oci://")
    if both_oci:
        # v0.20: several oci:// entries need different parent directories.
        return "/mnt/target/model", "/mnt/draft/model"
    return "/mnt/models/target", "/mnt/models/draft"


# What a draft method loads beside the target, said when its draft is missing (vLLM's SpeculativeConfig takes the draft's
# weights from speculative_config.model for eagle, eagle3 and draft_model: vllm/config/speculative.py, __post_init__).
DRAFT_REASONS = {
    "eagle3": "EAGLE-3 loads a draft head trained for the target",
    "eagle": "EAGLE loads a draft head trained for the target",
    "draft_model": "a smaller model with the target's vocabulary runs beside it",
}
# An example URI longer than this is shortened to its scheme and last segment, so the message stays one short line.
_EXAMPLE_MAX = 64


def draft_uri_example(target_uri, method):
    """A draft location in the target's scheme, for a message: the target's last path segment with ``-<method>-draft``
    (``s3://m/llama`` -> ``s3://m/llama-eagle3-draft``, an OCI tag kept; ``-draft`` for draft_model); None for a value
    without a scheme."""
    uri = str(target_uri or "").rstrip("/")
    scheme, sep, rest = uri.partition("://")
    if not sep or not rest:
        return None
    tag = ""
    if scheme.startswith("oci") and ":" in rest.rsplit("/", 1)[-1]:
        rest, tag = rest.rsplit(":", 1)
        tag = ":" + tag
    suffix = "-draft" if method == "draft_model" else "-%s-draft" % method
    return "%s://%s%s%s" % (scheme, rest, suffix, tag)


def _short_example(example):
    if example is None or len(example) <= _EXAMPLE_MAX:
        return example
    scheme, _sep, rest = example.partition("://")
    return "%s://.../%s" % (scheme, rest.rsplit("/", 1)[-1][-(_EXAMPLE_MAX - len(scheme) - 7):])


def missing_draft(method, art, mode, kind=KIND):
    """A ValidationError when draft ``method`` has nothing in ``art`` that can hold its draft for artifact ``mode`` (auto or
    storage_uris), in one line under 300 characters naming the method, why it needs a draft and an example in the
    scheme of the target given; else None. Without it the render says only ``cannot choose an artifact mode`` or
    ``draft_uri is required``."""
    if method not in DRAFT_REASONS or mode not in ("auto", "storage_uris") or art.get("draft_uri"):
        return None
    if mode == "auto" and (art.get("modelcar_image") or art.get("pvc_name")):
        return None
    key = "target_uri" if art.get("target_uri") else "storage_uri" if art.get("storage_uri") else None
    why = "method %s needs a draft (%s)" % (method, DRAFT_REASONS[method])
    named = "llama-draft" if method == "draft_model" else "llama-" + method
    if kind != KIND:
        # An LLMInferenceService has one spec.model.uri: the draft cannot be a storage URI of its own.
        return ValidationError("%s and an LLMInferenceService mounts one artifact%s" % (why, ", here %s only" % key if key else ""),
                               field="artifacts", hint="put target/ and draft/ in one modelcar_image (e.g. oci://registry/models/%s:v1) "
                                                       "or on one PVC (pvc_name)" % named)
    if not key:
        return ValidationError("%s and a target; artifacts sets neither" % why, field="artifacts",
                               hint="set target_uri and draft_uri (e.g. hf://org/llama and hf://org/%s-draft), or modelcar_image, or "
                                    "pvc_name" % named)
    example = _short_example(draft_uri_example(art[key], method))
    return ValidationError("%s and artifacts has %s only" % (why, key), field="artifacts.draft_uri",
                           hint="set draft_uri%s, or put both in one modelcar_image or pvc_name"
                                % (", e.g. " + example if example else " to the draft's location"))


def choose_artifact_mode(art, needs_draft, kserve_version, oci_mode=storage.DEFAULT_OCI_MODE):
    """`artifact_mode: auto`: pick A/B/C from what the cluster supports and what the inventory provides; say why."""
    has_uris = bool(art.get("target_uri")) and bool(art.get("draft_uri"))
    has_modelcar = bool(art.get("modelcar_image"))
    # oci+native:// mounts an ImageVolume whatever the cluster's mode.
    oci_works = oci_mode != storage.OCI_DISABLED or storage.parse_oci_scheme(art.get("modelcar_image"))[0] == "native"
    has_pvc = bool(art.get("pvc_name"))
    if not needs_draft:
        return "single", "the method needs no draft artifact"
    reasons = []
    if has_uris:
        if kserve_version >= (0, 16, 0):
            return "storage_uris", ("target_uri and draft_uri are set and KServe %s supports spec.predictor.storageUris"
                                    % spec_core.format_version(kserve_version))
        reasons.append("storageUris needs KServe 0.16+ (found %s)" % spec_core.format_version(kserve_version))
    if has_modelcar:
        if oci_works:
            return "modelcar", "a Modelcar image is set and the storage initializer mounts OCI images (%s mode)" % (
                "native" if oci_mode == storage.OCI_DISABLED else oci_mode)
        reasons.append("OCI images are off in the inferenceservice-config storageInitializer (oci_model_mode disabled)")
    if has_pvc:
        return "pvc", "a PVC is set (works on every KServe version)"
    raise ValidationError("cannot choose an artifact mode for a draft%s" % (": " + "; ".join(reasons) if reasons else ""),
                          field="artifacts", hint="set target_uri + draft_uri (storage_uris), modelcar_image (modelcar) or "
                                                  "pvc_name (pvc)")


def resolve_artifacts(mode, art, needs_draft, kserve_version=(0, 20, 0), oci_mode=storage.DEFAULT_OCI_MODE, kind=KIND, method=None):
    """Derive storage fields and the --model / draft paths from the artifact mode, so no path is typed twice. ``kind``
    says whose storage rules the URIs follow (InferenceService or LLMInferenceService), ``oci_mode`` the cluster's;
    ``method`` (a draft method) is named when nothing holds its draft."""
    art = dict(art or {})
    reason = ""
    storage.check_oci_mode(oci_mode)
    missing = missing_draft(method, art, mode, kind) if needs_draft else None
    if missing is not None:
        raise missing
    if mode == "auto":
        mode, reason = choose_artifact_mode(art, needs_draft, kserve_version, oci_mode)
    if mode not in ARTIFACT_MODES:
        raise ValidationError("'%s' is not an artifact mode" % mode, field="artifact_mode", hint="use one of %s" % ", ".join(ARTIFACT_MODES))
    layout_target = art.get("target_subdir") or "target"
    layout_draft = art.get("draft_subdir") or "draft"
    for key, value in (("target_subdir", layout_target), ("draft_subdir", layout_draft)):
        if value.startswith("/") or ".." in value.split("/") or value.strip("/.") == "":
            raise ValidationError("'%s' must be a relative directory name without '..'" % value, field="artifacts." + key,
                                  hint="use a plain name such as 'draft'")
    if mode == "storage_uris":
        if art.get("storage_uri"):
            raise ValidationError("storage_uri and storage_uris are both set (KServe: 'Setting both StorageURI and StorageURIs "
                                  "is not supported.')", field="artifacts.storage_uri",
                                  hint="remove storage_uri and list every artifact in target_uri/draft_uri")
        target_uri = storage.check_storage_uri(art.get("target_uri"), "artifacts.target_uri", "storageUris", oci_mode)
        entries = [{"uri": target_uri}]
        if needs_draft:
            draft_uri = storage.check_storage_uri(art.get("draft_uri"), "artifacts.draft_uri", "storageUris", oci_mode)
            default_t, default_d = _default_storage_uri_mounts(target_uri, draft_uri)
            entries = [{"uri": target_uri, "mountPath": art.get("target_mount_path") or default_t},
                       {"uri": draft_uri, "mountPath": art.get("draft_mount_path") or default_d}]
        else:
            entries[0]["mountPath"] = art.get("target_mount_path") or DEFAULT_MOUNT
        storage.check_storage_uris(entries, kserve_version, field="artifacts.storage_uris", oci_mode=oci_mode)
        result = Artifacts(mode, entries[0]["mountPath"], entries[1]["mountPath"] if needs_draft else None,
                           storage_uris=entries, reason=reason)
    elif mode == "modelcar":
        image = art.get("modelcar_image")
        if not image:
            raise ValidationError("is required for artifact_mode modelcar", field="artifacts.modelcar_image",
                                  hint="set the image reference, e.g. registry.local/models/llama-eagle3:v1")
        _explicit, normalised, is_oci = storage.parse_oci_scheme(image)
        oci_registry.ImageRef.parse(normalised if is_oci else image, field="artifacts.modelcar_image")
        uri = storage.check_storage_uri(image if is_oci else "oci://" + image, "artifacts.modelcar_image", kind, oci_mode)
        result = Artifacts(mode, posixpath.join(DEFAULT_MOUNT, layout_target),
                           posixpath.join(DEFAULT_MOUNT, layout_draft) if needs_draft else None, storage_uri=uri, reason=reason)
    elif mode == "pvc":
        pvc = art.get("pvc_name")
        check_dns1123(pvc, "artifacts.pvc_name", max_len=253)
        result = Artifacts(mode, posixpath.join(DEFAULT_MOUNT, layout_target),
                           posixpath.join(DEFAULT_MOUNT, layout_draft) if needs_draft else None,
                           storage_uri="pvc://%s/" % pvc, reason=reason)
    else:  # single
        if needs_draft:
            raise ValidationError("%s needs a draft artifact but artifact_mode is 'single' (one artifact)"
                                  % ("method " + method if method else "the method"), field="artifact_mode",
                                  hint="use storage_uris, modelcar or pvc (or auto)")
        if art.get("target_uri") and art.get("storage_uri"):
            raise ValidationError("target_uri and storage_uri are both set", field="artifacts.storage_uri", hint="keep one")
        uri = storage.check_storage_uri(art.get("storage_uri") or art.get("target_uri"), "artifacts.storage_uri", kind, oci_mode)
        sub = art.get("target_subdir")
        target_path = posixpath.join(DEFAULT_MOUNT, sub) if sub else DEFAULT_MOUNT
        result = Artifacts("single", target_path, None, storage_uri=uri, reason=reason)
    # An explicit draft path (e.g. a subdirectory inside the draft artifact) must stay inside what is mounted.
    if needs_draft and art.get("draft_path"):
        draft_path = storage.check_mount_path(art["draft_path"], "artifacts.draft_path")
        if not _path_under(draft_path, result.mounts):
            raise ValidationError("'%s' is outside what is mounted (%s)" % (draft_path, ", ".join(result.mounts)),
                                  field="artifacts.draft_path", hint="point it under one of the mounted paths or drop it to use the default")
        result.draft_path = draft_path
    if art.get("target_path"):
        target_path = storage.check_mount_path(art["target_path"], "artifacts.target_path")
        if not _path_under(target_path, result.mounts):
            raise ValidationError("'%s' is outside what is mounted (%s)" % (target_path, ", ".join(result.mounts)),
                                  field="artifacts.target_path", hint="point it under one of the mounted paths or drop it")
        result.target_path = target_path
    return result


def _qualified_name_problem(key):
    """Kubernetes' IsQualifiedName (k8s.io/apimachinery pkg/util/validation/validation.go): `[prefix/]name`, the name at
    most 63 characters of alphanumerics, '-', '_', '.' starting and ending alphanumeric, the prefix a DNS-1123 subdomain."""
    parts = key.split("/")
    if len(parts) > 2:
        return "has more than one '/'"
    name = parts[-1]
    if len(parts) == 2 and (not parts[0] or len(parts[0]) > 253 or not _DNS1123_SUBDOMAIN.match(parts[0])):
        return "prefix '%s' is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')" % parts[0]
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return ("name part '%s' must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter "
                "or digit" % name)
    return None


def metadata_maps(own_annotations, user_annotations, user_labels):
    """metadata.annotations and metadata.labels: the collection's own keys plus the inventory's (``annotations``,
    ``labels``; role variables spec_decoding_annotations / spec_decoding_labels).

    ``own_annotations`` maps each annotation the collection sets to (value, the option that sets it). A user key that
    names one of them with another value is refused, naming that option: the collection's value wins because the rest of
    the loop reads it (the deploymentMode check against the cluster, the Knative progress deadline from the startup
    window); the same value is accepted. The same holds for the runtime-type label, which the collection always sets.
    Keys and values follow Kubernetes' ValidateAnnotations (k8s.io/apimachinery pkg/api/validation/objectmeta.go: the key
    lower-cased is a qualified name, 256 KiB in all) and ValidateLabels (pkg/apis/meta/v1/validation/validation.go: a
    qualified-name key, IsValidLabelValue), so a GitOps render never holds an object the API server refuses."""
    own_labels = {RUNTIME_TYPE_LABEL: ("vllm", "the collection (its runtime-type label, always 'vllm')")}
    maps = []
    for option, own, given in (("annotations", own_annotations, user_annotations), ("labels", own_labels, user_labels)):
        if given is not None and not isinstance(given, dict):
            raise ValidationError("must be a mapping of %s, got %r" % (option[:-1] + " keys to strings", given), field=option,
                                  hint="write e.g. {example.com/team: search}")
        merged = {key: value for key, (value, _source) in own.items()}
        for key in sorted(given or {}, key=str):
            value = given[key]
            field = "%s[%s]" % (option, key)
            if not isinstance(key, str):
                raise ValidationError("key %r is not a string" % (key,), field=field, hint="quote the key")
            problem = _qualified_name_problem(key.lower() if option == "annotations" else key)
            if problem:
                raise ValidationError("'%s' is not a Kubernetes %s key: %s" % (key, option[:-1], problem), field=field,
                                      hint="use a key such as example.com/team")
            if isinstance(value, bool) or not isinstance(value, str):
                raise ValidationError("value %r is not a string (Kubernetes %s are strings)" % (value, option), field=field,
                                      hint="quote the value in the inventory: %s: \"%s\"" % (key, str(value).lower() if isinstance(value, bool) else value))
            if option == "labels" and (len(value) > 63 or (value and not _QUALIFIED_NAME.match(value))):
                raise ValidationError("label value '%s' must be at most 63 characters of letters, digits, '-', '_' or '.', starting "
                                      "and ending with a letter or digit (or empty)" % value, field=field,
                                      hint="shorten it, or put free text in spec_decoding_annotations instead")
            if key in own and own[key][0] != value:
                raise ValidationError("'%s' is set by the collection to '%s' (from %s); the inventory's '%s' would differ from "
                                      "what the deploy checks and reads" % (key, own[key][0], own[key][1], value), field=field,
                                      hint="drop %s from spec_decoding_%s%s" % (key, option, "" if own[key][1].startswith("the collection")
                                                                                else " and set spec_decoding_%s" % own[key][1]))
            merged[key] = value
        maps.append(merged)
    if sum(len(k) + len(v) for k, v in maps[0].items()) > 256 * 1024:
        raise ValidationError("the annotations total more than 256 KiB (Kubernetes' TotalAnnotationSizeLimitB)", field="annotations",
                              hint="keep large data out of annotations (a ConfigMap)")
    return maps[0], maps[1]


def speculative_for(method, speculative, draft_path, vllm_version):
    """The validated speculative config for `method` (None for the baseline), with the draft path filled in."""
    if method == "none":
        if speculative:
            raise ValidationError("is set but method is 'none' (the baseline)", field="speculative",
                                  hint="drop speculative or choose a method")
        return None
    config = dict(spec_core.PRESETS.get(method) or {"method": method})
    if method in ("suffix",) and "num_speculative_tokens" not in (speculative or {}):
        config.setdefault("num_speculative_tokens", 8)
    config.update(speculative or {})
    if config.get("method") != method:
        raise ValidationError("speculative.method '%s' differs from method '%s'" % (config.get("method"), method),
                              field="speculative.method", hint="drop it from speculative (method is set once)")
    if draft_path:
        if config.get("model") and posixpath.normpath(config["model"]) != posixpath.normpath(draft_path):
            raise ValidationError("speculative.model '%s' differs from the mounted draft path '%s'" % (config["model"], draft_path),
                                  field="speculative.model", hint="drop speculative.model: it is derived from the artifact mode")
        config["model"] = draft_path
    return spec_core.validate(config, vllm_version=vllm_version, field="speculative")


def _fmt_number(value):
    return ("%g" % value) if isinstance(value, float) else str(value)


def server_args(p, target_path, spec):
    """vLLM OpenAI server flags, in the guide's order; the speculative flag is last so stripping it leaves no gap."""
    args = ["--port", "8080",
            "--served-model-name", p["served_model_name"],
            "--model", target_path,
            "--dtype", p["dtype"],
            "--gpu-memory-utilization", _fmt_number(p["gpu_memory_utilization"]),
            "--max-model-len", str(p["max_model_len"]),
            "--max-num-seqs", str(p["max_num_seqs"]),
            "--seed", str(p["seed"])]
    if p.get("kv_cache_memory_bytes"):
        args += ["--kv-cache-memory-bytes", str(p["kv_cache_memory_bytes"])]
    args += [str(a) for a in (p.get("extra_args") or [])]
    if spec is not None:
        # before the speculative flag; vLLM refuses it without one, so the strip takes it too (vllm/per_request_metrics.py)
        args += [str(a) for a in (p.get("per_request_args") or [])]
        args += ["--speculative-config", spec.json]
    return args


def bash_script(args):
    """The guide's `bash -c` script: one flag per continued line, env-driven dtype/memory, JSON in single quotes."""
    lines = ["set -ex", "exec python3 -m vllm.entrypoints.openai.api_server \\"]
    pairs = []
    i = 0
    env_refs = {"--dtype": "${DTYPE}", "--gpu-memory-utilization": "${GPU_MEMORY_UTILIZATION}", "--served-model-name": "${MODEL_NAME}"}
    while i < len(args):
        flag = args[i]
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
            quoted = env_refs.get(flag) or (("'%s'" % value) if flag == "--speculative-config" else shlex.quote(value))
            pairs.append("%s %s" % (flag, quoted))
            i += 2
        else:
            pairs.append(flag)
            i += 1
    for n, pair in enumerate(pairs):
        lines.append("  " + pair + (" \\" if n < len(pairs) - 1 else ""))
    return "\n".join(lines) + "\n"


def engine_sizing(p, spec, warnings):
    """The vLLM sizing options both resources render: ``gpu_memory_utilization`` in (0, 1], lowered by
    ``draft_memory_headroom`` when a draft's weights load outside vLLM's budget (a warning says so), and positive
    ``max_model_len``/``max_num_seqs`` and a non-negative ``seed``. Returns the GPU memory utilization to pass."""
    gmu = float(p.get("gpu_memory_utilization", 0.9))
    if not 0 < gmu <= 1:
        raise ValidationError("must be in (0, 1], got %r" % gmu, field="gpu_memory_utilization", hint="use e.g. 0.9")
    if spec is not None and spec.has_draft_weights:
        headroom = float(p.get("draft_memory_headroom", 0.05))
        if headroom > 0:
            lowered = round(gmu - headroom, 4)
            if lowered <= 0:
                raise ValidationError("draft_memory_headroom %.2f leaves no GPU memory (gpu_memory_utilization %.2f)" % (headroom, gmu),
                                      field="draft_memory_headroom", hint="lower the headroom")
            warnings.append("gpu_memory_utilization lowered from %g to %g: draft weights are outside vLLM's budget" % (gmu, lowered))
            gmu = lowered
        else:
            warnings.append("draft weights are not counted in --gpu-memory-utilization (%g) and draft_memory_headroom is 0: "
                            "the pod may run out of GPU memory" % gmu)
    for key in ("max_model_len", "max_num_seqs", "seed"):
        value = p.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "seed" else 1):
            raise ValidationError("must be a %s integer, got %r" % ("non-negative" if key == "seed" else "positive", value),
                                  field=key, hint="write a bare number")
    return gmu


def render(p, existing=None):
    """Render the InferenceService for parameters `p` (the role's variables without prefix).

    Returns dict(manifest=..., speculative=SpeculativeConfig|None, artifacts=Artifacts, warnings=[...], runtime_check=...,
    cel_rules=crd_rules.check(...)). `existing` is the object on the cluster (or None): a deploymentMode change is refused
    before any write. A manifest that breaks a CEL rule of its CRD (`p["kserve_crds"]` or the shipped release) is refused.
    """
    warnings = []
    check_dns1123(p.get("name"), "name")
    check_dns1123(p.get("namespace"), "namespace")
    mode = normalise_deployment_mode(p.get("deployment_mode") or "Standard")
    if mode not in DEPLOYMENT_MODES:
        raise ValidationError("'%s' is not a KServe deployment mode" % p.get("deployment_mode"), field="deployment_mode",
                              hint="use Standard or Knative (RawDeployment/Serverless are the legacy names)")
    if existing:
        current = normalise_deployment_mode(((existing.get("metadata") or {}).get("annotations") or {}).get(DEPLOYMENT_MODE_ANNOTATION) or "Standard")
        if current != mode:
            raise ValidationError("InferenceService %s/%s runs in %s mode; KServe refuses to change the deployment mode after "
                                  "creation (asked: %s)" % (p["namespace"], p["name"], current, mode), field="deployment_mode",
                                  hint="keep deployment_mode %s, or delete and recreate the InferenceService under a new name" % current)
    method = p.get("method") or "none"
    if method not in METHODS:
        raise ValidationError("'%s' is not a supported method" % method, field="method", hint="use one of %s" % ", ".join(METHODS))
    needs_draft = method in ("eagle3", "eagle", "draft_model")
    if p.get("kserve_version"):
        kserve_version, newer = releases.rules_release(spec_core.parse_version(p["kserve_version"]))
        if newer:
            warnings.append(newer)
    elif p.get("kserve_crd"):
        kserve_version, evidence = releases.kserve_version_from_crd(p["kserve_crd"])
        warnings.append("KServe version detected: %s" % evidence)
    else:
        kserve_version = (0, 20, 0)
        warnings.append("kserve_version not given and no cluster to read it from: rendering for KServe 0.20")
    artifacts = resolve_artifacts(p.get("artifact_mode") or "auto", p.get("artifacts") or {}, needs_draft,
                                  kserve_version, storage.oci_mode_of(p), method=method)
    if artifacts.reason:
        warnings.append("artifact_mode auto chose %s: %s" % (artifacts.mode, artifacts.reason))
    spec = speculative_for(method, p.get("speculative"), artifacts.draft_path, p.get("vllm_version"))
    if spec is not None:
        warnings.extend(w for w in spec.warnings if "--gpu-memory-utilization" not in w)

    gmu = engine_sizing(p, spec, warnings)
    served = p.get("served_model_name") or p["name"]
    per_request = per_request_metrics.resolve(p.get("per_request_metrics"), p.get("vllm_version"), spec, p.get("extra_args"))
    q = dict(p, served_model_name=served, gpu_memory_utilization=gmu, per_request_args=per_request["args"])
    args = server_args(q, artifacts.target_path, spec)
    warnings += spec_core.check_command(args, vllm_version=p.get("vllm_version"), config=spec.config if spec else None, field="extra_args")

    env = [{"name": "DTYPE", "value": str(p["dtype"])},
           {"name": "GPU_MEMORY_UTILIZATION", "value": _fmt_number(gmu)},
           {"name": "MODEL_NAME", "value": served}]
    env += [{"name": k, "value": str(v)} for k, v in sorted((p.get("env") or {}).items())]
    model = {"modelFormat": {"name": p.get("model_format") or "transformers"},
             "protocolVersion": p.get("protocol_version") or "v2",
             "runtime": p["runtime"],
             "env": env}
    if p.get("command_style", "bash") == "args":
        model["command"] = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        model["args"] = args
    else:
        model["command"] = ["bash", "-c", bash_script(args)]
    resources = {"limits": {}, "requests": {}}
    for key, value in sorted((p.get("resources") or {}).items()):
        resources["limits"][key] = str(value)
        resources["requests"][key] = str(value)
    gpus = p.get("gpu_count", 1)
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    model["resources"] = {k: v for k, v in resources.items() if v}
    if artifacts.storage_uri:
        model["storageUri"] = artifacts.storage_uri
    startup_seconds = int(p.get("startup_timeout_seconds", 1800))
    if mode == "Standard":
        # A draft's cold start takes ~5 minutes: give the container a startup window that tolerates it.
        model["startupProbe"] = {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10,
                                 "failureThreshold": max(1, startup_seconds // 10), "timeoutSeconds": 5}
    predictor = {"minReplicas": int(p.get("min_replicas", 1)), "maxReplicas": int(p.get("max_replicas", 1)), "model": model,
                 "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}
    if predictor["minReplicas"] > predictor["maxReplicas"]:
        raise ValidationError("min_replicas %d is larger than max_replicas %d" % (predictor["minReplicas"], predictor["maxReplicas"]),
                              field="min_replicas", hint="lower min_replicas or raise max_replicas")
    if artifacts.storage_uris:
        predictor["storageUris"] = artifacts.storage_uris
    if p.get("service_account_name"):
        predictor["serviceAccountName"] = p["service_account_name"]
    own_annotations = {DEPLOYMENT_MODE_ANNOTATION: (mode, "deployment_mode")}
    if p.get("model_repo"):
        own_annotations[MODEL_REPO_ANNOTATION] = (p["model_repo"], "model_repo")
    if mode == "Knative":
        own_annotations[PROGRESS_DEADLINE_ANNOTATION] = ("%ds" % startup_seconds, "startup_timeout_seconds")
    annotations, labels = metadata_maps(own_annotations, p.get("annotations"), p.get("labels"))
    manifest = {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": p["name"], "namespace": p["namespace"], "annotations": annotations, "labels": labels},
                "spec": {"predictor": predictor}}
    cel_rules = crd_rules.check(manifest, p.get("kserve_crds"), existing=existing, kserve_version=kserve_version)
    warnings.extend(cel_rules["warnings"])
    runtime_check = None
    if p.get("runtimes") is not None:
        # KServe merges the runtime's kserve-container with this predictor (its args first): a --speculative-config in the
        # runtime reaches vLLM too. The runtimes were read from the cluster by kserve_facts; refuse a double here, before
        # anything (an image push, a PVC copy, the apply) is written.
        try:
            runtime_check, more, problem, _effective = serving_runtime.resolve(
                manifest, runtime_readers.SnapshotReader(p["runtimes"]), p.get("runtime_flag") or "refuse", missing_runtime="warn")
        except ValidationError as exc:
            # KServe refuses this runtime for this predictor (format, protocol): name the option that set the field.
            option = RENDER_OPTIONS.get(exc.field)
            if option is None:
                raise
            raise ValidationError(exc.message.replace(exc.field, "%s (%s)" % (exc.field, option)) + ". Nothing was written",
                                  field=option.split(",")[0]) from exc
        warnings.extend(more)
        if problem:
            raise ValidationError(problem, field="runtime_flag")
        runtime_check.pop("runtime_object", None)
    return {"manifest": manifest, "speculative": spec, "artifacts": artifacts, "warnings": warnings, "runtime_check": runtime_check,
            "cel_rules": cel_rules, "per_request_metrics": {k: v for k, v in per_request.items() if k != "args"}}


def to_yaml(obj):
    """Deterministic YAML for GitOps files: sorted keys, block style, multi-line scripts as literal blocks."""

    class _Dumper(yaml.SafeDumper):  # pylint: disable=too-many-ancestors
        pass

    def _str(dumper, value):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    return yaml.dump(obj, Dumper=_Dumper, default_flow_style=False, sort_keys=True, allow_unicode=False, width=1000)


def manifest_filename(manifest):
    meta = manifest["metadata"]
    return "%s-%s.yaml" % (meta["namespace"], meta["name"])


def kustomization(resource_files):
    """A kustomization.yaml listing the manifests, sorted so reruns are byte-identical."""
    names = []
    for i, name in enumerate(resource_files or []):
        name = str(name)
        if not name or name.startswith("/") or ".." in name.split("/"):
            raise ValidationError("%r is not a file name inside the GitOps directory" % name, field="resources[%d]" % i,
                                  hint="list manifest files relative to kustomization.yaml, e.g. models-llama.yaml")
        names.append(name)
    return to_yaml({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": sorted(set(names))})
