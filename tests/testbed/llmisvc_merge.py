"""The LLMInferenceService stand-in's preset merge: KServe's ``MergeSpecs`` (pkg/controller/v1alpha2/llmisvc/
config_merge.go, v0.20), written after the two apimachinery calls it makes, independently of the collection's code.

``mergeSpecs(base, override)`` marshals both specs with Go's encoding/json (``omitempty`` fields holding a zero value
are left out), builds ``CreateTwoWayMergePatch(zero, override)`` - against the zero spec that is the marshalled
override itself - and applies it with ``StrategicMergePatch(base, patch, LLMInferenceServiceSpec{})``: maps merge,
lists whose Go field carries ``patchStrategy:"merge"`` merge by their ``patchMergeKey`` (``mergeSlice``: the patch's
order, base-only items slotted in by their base position), every other value is replaced. The Go types the patch meta
comes from are the TYPES table below (field -> type, or (list item type, merge key) for merge lists).

Pinned to KServe's test vectors by tests/unit/test_llmisvc_preset_merge_vectors.py
(tests/fixtures/kserve/llmisvc_preset_merge.yaml).
"""
from __future__ import annotations

import copy

# Go types of LLMInferenceServiceSpec that matter to the patch: a field -> its type name; a merge list ->
# (item type, merge key); "map" for map[string]... fields (entries kept as written). Fields not named are atomic values.
TYPES = {
    "LLMInferenceServiceSpec": {"template": "PodSpec", "worker": "PodSpec", "prefill": "WorkloadSpec",
                                "router": "RouterSpec", "labels": "map", "annotations": "map"},
    "WorkloadSpec": {"template": "PodSpec", "worker": "PodSpec", "labels": "map", "annotations": "map"},
    "RouterSpec": {"scheduler": "SchedulerSpec"},
    "SchedulerSpec": {"template": "PodSpec", "labels": "map", "annotations": "map", "pool": "InferencePool"},
    "InferencePool": {"spec": "InferencePoolSpec"},
    "InferencePoolSpec": {"selector": "LabelSelector"},
    "LabelSelector": {"matchLabels": "map"},
    "PodSpec": {"containers": ("Container", "name"), "initContainers": ("Container", "name"),
                "ephemeralContainers": ("Container", "name"), "volumes": ("Volume", "name"),
                "imagePullSecrets": ("LocalObjectReference", "name"), "hostAliases": ("HostAlias", "ip"),
                "topologySpreadConstraints": ("TopologySpreadConstraint", "topologyKey"),
                "resourceClaims": ("PodResourceClaim", "name"), "schedulingGates": ("PodSchedulingGate", "name"),
                "nodeSelector": "map", "overhead": "map"},
    "Container": {"env": ("EnvVar", "name"), "ports": ("ContainerPort", "containerPort"),
                  "volumeMounts": ("VolumeMount", "mountPath"), "volumeDevices": ("VolumeDevice", "devicePath"),
                  "resources": "ResourceRequirements"},
    "ResourceRequirements": {"requests": "map", "limits": "map"},
}
# omitempty fields of a non-pointer bool / int32 type: false / 0 is not marshalled.
OMITEMPTY_ZERO = {"Container": ("stdin", "stdinOnce", "tty"), "PodSpec": ("hostNetwork", "hostPID", "hostIPC"),
                  "VolumeMount": ("readOnly",)}


def _field_type(type_name, field):
    return (TYPES.get(type_name) or {}).get(field)


def go_marshal(value, type_name="LLMInferenceServiceSpec"):
    """json.Marshal of a spec decoded into KServe's Go types: nil, "", empty slices and zero omitempty scalars vanish."""
    if type_name == "map":
        return copy.deepcopy(value)
    if isinstance(value, list):
        return [go_marshal(item, type_name) for item in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for field, item in value.items():
        if item is None or item == "" or item == []:
            continue
        if item in (False, 0) and not isinstance(item, float) and field in OMITEMPTY_ZERO.get(type_name, ()):
            continue
        sub = _field_type(type_name, field)
        if sub == "map" and item == {}:
            continue
        out[field] = go_marshal(item, sub[0] if isinstance(sub, tuple) else sub)
    return out


def two_way_patch_from_zero(override: dict) -> dict:
    """CreateTwoWayMergePatch(json(zero spec), json(override)): every field the override's JSON carries is a change
    from the zero spec (which carries only model.uri "", itself left out here), so the patch is that JSON."""
    return go_marshal(override)


def _merge_slice(original: list, patch: list, item_type: str, key: str) -> list:
    merged = [copy.deepcopy(item) for item in original]
    for item in patch:  # mergeSliceWithoutSpecialElements
        at = next((i for i, old in enumerate(merged) if isinstance(old, dict) and old.get(key) == item.get(key)), None)
        if at is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[at] = _merge_map(merged[at], item, item_type)
    patch_keys = [item.get(key) for item in patch]
    server_order = [item.get(key) for item in original]
    patch_items = sorted((m for m in merged if m.get(key) in patch_keys), key=lambda m: patch_keys.index(m.get(key)))
    server_only = [m for m in merged if m.get(key) not in patch_keys]
    # normalizeElementOrder -> mergeSortedSlice(serverOnly, patch, serverOrder)
    out = []
    while server_only or patch_items:
        if not patch_items or (server_only and server_only[0].get(key) in server_order and patch_items[0].get(key) in server_order
                               and server_order.index(server_only[0].get(key)) < server_order.index(patch_items[0].get(key))):
            out.append(server_only.pop(0))
        else:
            out.append(patch_items.pop(0))
    return out


def _merge_map(original: dict, patch: dict, type_name: str) -> dict:
    out = copy.deepcopy(original)
    for field, value in patch.items():
        sub = _field_type(type_name, field)
        if field not in out or out[field] is None:
            out[field] = copy.deepcopy(value)
        elif isinstance(sub, tuple) and isinstance(value, list) and isinstance(out[field], list):
            out[field] = _merge_slice(out[field], value, sub[0], sub[1])
        elif isinstance(value, dict) and isinstance(out[field], dict):
            out[field] = _merge_map(out[field], value, sub if isinstance(sub, str) else "")
        else:
            out[field] = copy.deepcopy(value)
    return out


def merge_specs(*specs: dict) -> dict:
    """MergeSpecs(ctx, specs...): the first spec, each next one applied as the patch from zero to it."""
    if not specs:
        return {}
    out = go_marshal(specs[0] or {})
    for spec in specs[1:]:
        out = go_marshal(_merge_map(out, two_way_patch_from_zero(spec or {}), "LLMInferenceServiceSpec"))
    return out


def merge_spec(presets: list, spec: dict) -> dict:
    """The resource over its baseRefs presets, in baseRefs order (combineBaseRefsConfig's MergeSpecs call, without the
    well-known presets: the test bed installs none)."""
    return merge_specs(*([p.get("spec") or {} for p in presets] + [spec]))
