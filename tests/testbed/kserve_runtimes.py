"""The KServe stand-in's runtime half, as plain functions (no cluster): which ServingRuntime a predictor gets, and the
`kserve-container` KServe v0.20 builds from it.

Read from kserve/kserve v0.20.0 and written apart from the collection's plugins/module_utils/kserve/isvc/runtime*.py
(this file must not import them), so the tests compare two readings of KServe rather than one with itself. Both are
pinned to KServe's own test vectors (tests/fixtures/kserve/runtime_merge.yaml, runtime_selection.yaml):

- `choose_runtime(predictor, namespaced, cluster)`: pkg/controller/v1beta1/inferenceservice/components/predictor.go
  `reconcileModel` (a named runtime: GetServingRuntime, then disabled / protocol / model format checks; none named:
  pkg/apis/serving/v1beta1/predictor_model.go `GetSupportingRuntimes`, first hit) and `multiNodeProcess` (a predictor
  workerSpec needs one in the runtime). A refusal comes back as a `Refusal`: the error text KServe returns and the
  status it writes (modelStatus.lastFailureInfo, or the PredictorReady condition).
- `runtime_container(predictor, runtime, meta)`: `MergeServingRuntimeAndInferenceServiceSpecs` ->
  `MergeRuntimeContainers` (pkg/utils/container_merge.go `MergeContainerWithPatch`: a strategic merge patch of both
  containers as json.Marshal writes them, env value/valueFrom settled for the predictor, the runtime's name kept;
  then args = runtime args + predictor args) -> `ReplacePlaceholders` (a Go template over the container's JSON text).
"""
from __future__ import annotations

import copy
import functools
import json
import re

CONTAINER = "kserve-container"
NAMESPACED, CLUSTER = "ServingRuntime", "ClusterServingRuntime"
# corev1.Container's JSON fields: what json.Marshal(corev1.Container) can write.
GO_CONTAINER_FIELDS = {"name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources",
                       "resizePolicy", "restartPolicy", "volumeMounts", "volumeDevices", "livenessProbe",
                       "readinessProbe", "startupProbe", "lifecycle", "terminationMessagePath",
                       "terminationMessagePolicy", "imagePullPolicy", "securityContext", "stdin", "stdinOnce", "tty"}
# patchStrategy=merge lists of corev1.Container and their patchMergeKey.
KEYED_LISTS = {"env": "name", "ports": "containerPort", "volumeMounts": "mountPath", "volumeDevices": "devicePath"}
# omitempty fields that are plain Go bools/ints (false / 0 is left out); pointer fields keep them.
ZERO_OMITTED = {"stdin", "stdinOnce", "tty", "readOnly", "hostPort", "initialDelaySeconds", "timeoutSeconds",
                "periodSeconds", "successThreshold", "failureThreshold"}
PROTOCOL_ORDER = ["v1", "v2", "grpc-v1", "grpc-v2"]  # GetProtocolVersionInt; anything else (or none) ranks after


class Refusal(Exception):
    """KServe stops reconciling the predictor: `error` is what its reconcile returns; `failure` the
    modelStatus.lastFailureInfo it writes (transitionStatus InvalidSpec), or `condition` a PredictorReady=False."""

    def __init__(self, error: str, reason: str, message: str | None = None, condition: bool = False):
        super().__init__(error)
        self.error, self.reason, self.message, self.condition = error, reason, message or error, condition

    def as_dict(self) -> dict:
        return {"error": self.error, "reason": self.reason, "message": self.message, "condition": self.condition}


# -- choosing the runtime -------------------------------------------------------------------------------------------

def protocol_of(model: dict) -> str:
    """ModelSpec.GetProtocol: v1 unless the model says."""
    return model.get("protocolVersion") or "v1"


def _spec(runtime: dict) -> dict:
    return runtime.get("spec") or {}


def _format_labels(spec: dict, every: bool) -> set:
    labels = set()
    for entry in spec.get("supportedModelFormats") or []:
        if every or entry.get("autoSelect") is True:
            labels.add(f"mt:{entry.get('name')}")
            if entry.get("version") is not None:
                labels.add(f"mt:{entry.get('name')}:{entry.get('version')}")
    return labels


def _supports_format(model: dict, spec: dict, named: bool) -> bool:
    fmt = model.get("modelFormat") or {}
    label = f"mt:{fmt.get('name')}" + (f":{fmt['version']}" if fmt.get("version") is not None else "")
    return label in _format_labels(spec, every=named)


def _supports_protocol(spec: dict, protocol: str | None) -> bool:
    listed = spec.get("protocolVersions") or []
    return not protocol or not listed or protocol in listed


def _protocol_rank(spec: dict) -> int:
    ranks = [PROTOCOL_ORDER.index(p) if p in PROTOCOL_ORDER else len(PROTOCOL_ORDER) for p in spec.get("protocolVersions") or []]
    return min(ranks) if ranks else len(PROTOCOL_ORDER)


def _list_order(a: dict, b: dict) -> int:
    """sortServingRuntimeList: protocol priority, then the newer first, then the name."""
    ra, rb = _protocol_rank(_spec(a)), _protocol_rank(_spec(b))
    if ra != rb:
        return -1 if ra < rb else 1
    ta, tb = (a.get("metadata") or {}).get("creationTimestamp") or "", (b.get("metadata") or {}).get("creationTimestamp") or ""
    if ta != tb:
        return -1 if ta > tb else 1
    na, nb = a["metadata"]["name"], b["metadata"]["name"]
    return (na > nb) - (na < nb)


def _priority(spec: dict, format_name: str):
    """GetPriority: the first supportedModelFormats entry of that name decides (it may have none)."""
    return next((entry.get("priority") for entry in spec.get("supportedModelFormats") or [] if entry.get("name") == format_name), None)


def _by_priority(runtimes: list, format_name: str) -> list:
    """sortSupportedRuntimeByPriority: a higher priority first, one with a priority before one without, others kept."""
    out = []
    for runtime in runtimes:  # insertion sort: stable, as Go's sort for these few runtimes
        mine = _priority(_spec(runtime), format_name)
        at = len(out)
        while at > 0:
            theirs = _priority(_spec(out[at - 1]), format_name)
            if mine is not None and (theirs is None or mine > theirs):
                at -= 1
            else:
                break
        out.insert(at, runtime)
    return out


def supporting_runtimes(model: dict, namespaced: list, cluster: list, multinode: bool = False) -> list:
    """GetSupportingRuntimes(isMMS=false): [(runtime, kind)] in KServe's order."""
    protocol = protocol_of(model)
    fmt_name = (model.get("modelFormat") or {}).get("name")
    found = []
    for kind, runtimes in ((NAMESPACED, namespaced), (CLUSTER, cluster)):
        group = []
        for runtime in sorted(runtimes or [], key=functools.cmp_to_key(_list_order)):
            spec = _spec(runtime)
            if spec.get("disabled") is True or spec.get("multiModel") is True:
                continue
            if not _supports_format(model, spec, named=False) or not _supports_protocol(spec, protocol):
                continue
            if ("workerSpec" in spec and spec["workerSpec"] is not None) != multinode:
                continue
            group.append(runtime)
        found += [(runtime, kind) for runtime in _by_priority(group, fmt_name)]
    return found


def find_runtime(name: str, namespaced: list, cluster: list):
    """GetServingRuntime: (runtime, kind), the namespace's ServingRuntime before a ClusterServingRuntime; (None, None)."""
    for kind, runtimes in ((NAMESPACED, namespaced), (CLUSTER, cluster)):
        for runtime in runtimes or []:
            if runtime["metadata"]["name"] == name:
                return runtime, kind
    return None, None


def choose_runtime(predictor: dict, namespaced: list, cluster: list):
    """(runtime, kind) KServe reconciles `predictor.model` with; Refusal when it does not."""
    model = predictor.get("model") or {}
    name = model.get("runtime")
    worker = predictor.get("workerSpec") is not None
    if not name:
        found = supporting_runtimes(model, namespaced, cluster, multinode=worker)
        if not found:
            fmt = model.get("modelFormat") or {}
            raise Refusal("no runtime found to support predictor with model type: {%s %s}" % (fmt.get("name"), fmt.get("version", "<nil>")),
                          "NoSupportingRuntime", "No runtime found to support specified framework/version")
        return found[0]
    runtime, kind = find_runtime(name, namespaced, cluster)
    if runtime is None:
        raise Refusal(f"No ServingRuntimes or ClusterServingRuntimes with the name: {name}", "RuntimeNotRecognized",
                      "Waiting for runtime to become available")
    spec = _spec(runtime)
    if spec.get("disabled") is True:
        raise Refusal(f"specified runtime {name} is disabled", "RuntimeDisabled", "Specified runtime is disabled")
    if model.get("protocolVersion") is not None and not _supports_protocol(spec, model["protocolVersion"]):
        raise Refusal(f"specified runtime {name} does not support specified protocol version", "NoSupportingRuntime",
                      "Specified runtime does not support specified protocol version")
    if not _supports_format(model, spec, named=True):
        raise Refusal(f"specified runtime {name} does not support specified framework/version", "NoSupportingRuntime",
                      "Specified runtime does not support specified framework/version")
    if worker and spec.get("workerSpec") is None:
        text = "you cannot set WorkerSpec in the InferenceService if the ServingRuntime does not have a WorkerSpec"
        raise Refusal(text, "InvalidWorkerSpecNotSet", text, condition=True)
    return runtime, kind


# -- building the container -----------------------------------------------------------------------------------------

def go_marshal(value, field: str | None = None):
    """What json.Marshal of a corev1 object writes: omitempty fields at their zero value are left out."""
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            if field is None and key not in GO_CONTAINER_FIELDS:
                continue  # not a corev1.Container field: the ModelSpec's own (modelFormat, runtime, storageUri, ...)
            item = go_marshal(item, key)
            if item in (None, "", [], {}) or (key in ZERO_OMITTED and item in (0, False) and item is not True):
                continue
            kept[key] = item
        return kept
    if isinstance(value, list):
        return [go_marshal(item, field or "") for item in value]
    return value


def _patch_list(original: list, patch: list, key: str) -> list:
    """apimachinery mergeSlice for a list of maps with a merge key, then its element order (normalizeElementOrder):
    the patch's entries in the patch's order, the original-only ones merged in by their original positions."""
    merged = {item[key]: copy.deepcopy(item) for item in original}
    for item in patch:
        merged[item[key]] = _patch_map(merged[item[key]], item) if item[key] in merged else copy.deepcopy(item)
    position = {item[key]: i for i, item in enumerate(original)}
    in_patch = [item[key] for item in patch]
    server_only = [item[key] for item in original if item[key] not in in_patch]
    result, left = [], 0
    for k in in_patch:
        # an original-only entry goes before this patch entry when both were in the original and it came first
        while left < len(server_only) and k in position and position[server_only[left]] < position[k]:
            result.append(server_only[left])
            left += 1
        result.append(k)
    result += server_only[left:]
    return [merged[k] for k in result]


def _patch_map(original: dict, patch: dict) -> dict:
    out = copy.deepcopy(original)
    for key, value in patch.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            out[key] = _patch_map(old, value)
        elif isinstance(value, list) and isinstance(old, list) and key in KEYED_LISTS:
            out[key] = _patch_list(old, value, KEYED_LISTS[key])
        else:
            out[key] = copy.deepcopy(value)
    return out


def merge_container_with_patch(base: dict, overlay: dict) -> dict:
    """MergeContainerWithPatch: strategic merge patch of `overlay` over `base` (args and command replaced as lists)."""
    patch = go_marshal(overlay or {})
    merged = _patch_map(go_marshal(base or {}), patch)
    wanted = {e["name"]: e for e in patch.get("env") or []}
    for entry in merged.get("env") or []:
        if entry.get("value") and entry.get("valueFrom") and entry["name"] in wanted:
            if wanted[entry["name"]].get("valueFrom"):
                del entry["value"]
            elif wanted[entry["name"]].get("value"):
                del entry["valueFrom"]
    merged["name"] = merged.get("name") or (base or {}).get("name") or ""
    return merged


def merge_runtime_containers(runtime_side: dict, predictor_side: dict) -> dict:
    """MergeRuntimeContainers: the patch merge, then args = runtime args followed by the predictor's."""
    merged = merge_container_with_patch(runtime_side, predictor_side)
    merged.pop("args", None)
    args = list((runtime_side or {}).get("args") or []) + list((predictor_side or {}).get("args") or [])
    if args:
        merged["args"] = args
    return merged


_META = {"Name": "name", "Namespace": "namespace", "GenerateName": "generateName", "UID": "uid",
         "ResourceVersion": "resourceVersion", "SelfLink": "selfLink"}
_TEMPLATE_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)


def replace_placeholders(container: dict, meta: dict, runtime_name: str | None = None) -> dict:
    """ReplacePlaceholders: the container as JSON text (Go escapes <, > and & too) through text/template with the
    InferenceService's ObjectMeta, read back. The forms runtimes use; any other action is a Refusal here."""
    text = json.dumps(container, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    fail = f"failed to replace placeholders in serving runtime {runtime_name} Container {container.get('name')}"

    def action(body: str) -> str:
        body = body.strip()
        if "\\" in body:
            raise Refusal(f"{fail}: template: unexpected \"\\\\\" in operand", "InvalidPredictorSpec", fail)
        parts = body.split()
        if len(parts) == 3 and parts[0] == "index" and parts[1] in (".Labels", ".Annotations") and parts[2][:1] == parts[2][-1:] == "`":
            return str((meta.get(parts[1][1:].lower()) or {}).get(parts[2][1:-1], ""))
        if len(parts) == 1 and parts[0].startswith("."):
            path = parts[0][1:].split(".")
            if len(path) == 2 and path[0] in ("Labels", "Annotations"):
                got = (meta.get(path[0].lower()) or {}).get(path[1])
                return "<no value>" if got is None else str(got)
            if len(path) == 1 and path[0] in _META:
                return str(meta.get(_META[path[0]]) or "")
            if len(path) == 1 and path[0] == "Generation":
                return str(meta.get("generation") or 0)
            if len(path) == 1:
                raise Refusal(f"{fail}: can't evaluate field {path[0]} in type v1.ObjectMeta", "InvalidPredictorSpec", fail)
        raise Refusal(f"{fail}: the stand-in does not run the template action {{{{{body}}}}}", "InvalidPredictorSpec", fail)

    pieces, at = [], 0
    for match in _TEMPLATE_ACTION.finditer(text):
        before = text[at:match.start()]
        pieces.append(before.rstrip() if match.group(1) else before)
        pieces.append(action(match.group(2)))
        at = match.end()
        if match.group(3):
            while at < len(text) and text[at].isspace():
                at += 1
    pieces.append(text[at:])
    try:
        return json.loads("".join(pieces))
    except ValueError as exc:
        raise Refusal(f"{fail}: {exc}", "InvalidPredictorSpec", fail) from exc


def runtime_container(predictor: dict, runtime: dict, meta: dict | None = None, target: str = CONTAINER) -> dict:
    """The predictor's `kserve-container` as KServe v0.20 builds it from the runtime (Refusal: InvalidPredictorSpec)."""
    containers = _spec(runtime).get("containers") or []
    if not containers:
        raise Refusal("no container configuration found in selected serving runtime", "InvalidPredictorSpec")
    own = next((c for c in containers if c.get("name") == target), None)
    if own is None:
        raise Refusal(f"failed to find {target} in ServingRuntime containers", "InvalidPredictorSpec")
    model = {k: v for k, v in (predictor.get("model") or {}).items() if k in GO_CONTAINER_FIELDS}
    merged = merge_runtime_containers(own, model)
    return replace_placeholders(merged, meta or {}, (runtime.get("metadata") or {}).get("name"))


# ServingRuntimePodSpec fields MergePodSpec takes from the runtime, and the keyed lists among them (patchMergeKey name).
RUNTIME_POD_FIELDS = ("nodeSelector", "affinity", "tolerations", "volumes", "imagePullSecrets", "schedulerName")
POD_KEYED_LISTS = {"volumes": "name", "imagePullSecrets": "name"}


def merge_pod_spec(runtime: dict, pod_spec: dict) -> dict:
    """MergePodSpec: the runtime's nodeSelector, affinity, tolerations, volumes, imagePullSecrets and schedulerName,
    with the predictor's pod spec patched over them (volumes and imagePullSecrets by name, maps key by key)."""
    merged = {k: copy.deepcopy(v) for k, v in _spec(runtime).items() if k in RUNTIME_POD_FIELDS and v not in (None, "", [], {})}
    for key, value in pod_spec.items():
        old = merged.get(key)
        if key in POD_KEYED_LISTS and isinstance(old, list) and isinstance(value, list):
            merged[key] = _patch_list(old, value, POD_KEYED_LISTS[key])
        elif isinstance(old, dict) and isinstance(value, dict):
            merged[key] = _patch_map(old, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def sidecars(runtime: dict, predictor: dict) -> list:
    """buildPodSpec's other containers: the runtime's besides kserve-container and transformer-container, then the
    predictor's besides transformer-container (the stand-in runs no transformer)."""
    skip = (CONTAINER, "transformer-container")
    return [copy.deepcopy(c) for c in _spec(runtime).get("containers") or [] if c.get("name") not in skip] + \
        [copy.deepcopy(c) for c in predictor.get("containers") or [] if c.get("name") != "transformer-container"]
