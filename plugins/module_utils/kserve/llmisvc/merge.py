# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How KServe merges an LLMInferenceService with its presets (``pkg/controller/v1alpha2/llmisvc/config_merge.go``,
``MergeSpecs`` / ``mergeSpecs``, KServe v0.20).

Plain Python, no Ansible imports. KServe merges the layers in order (well-known presets, baseRefs presets, the resource
itself), each over the result so far, with a strategic merge patch built from a *zero* spec to the layer
(``strategicpatch.CreateTwoWayMergePatch(zero, layer)``, then ``StrategicMergePatch(base, patch)``). What users see:

* **An empty value never overrides.** The layer is marshalled by Go's encoding/json first, which leaves out every
  ``omitempty`` field holding its zero value: an env variable with ``value: ""``, ``args: []``, ``command: []``,
  ``tolerations: []`` keep what the layer below set. A non-empty value does override: ``value: " "`` (one space),
  ``args: [""]``. Pointer fields keep their zero (``replicas: 0`` overrides).
* Maps merge key by key (resources, labels, selectors, ``parallelism``), objects field by field.
* The PodSpec and Container lists Kubernetes declares with a patch merge key merge item by item (``containers`` by
  ``name``, ``env`` by ``name``, ``volumeMounts`` by ``mountPath`` ...); an item merges field by field, so a layer's
  ``{name: X, valueFrom: ...}`` over ``{name: X, value: ...}`` keeps both (a Deployment the API server then refuses).
  The result follows the layer's order, with the items only the lower layers have kept where they stood
  (apimachinery's ``mergeSlice`` / ``normalizeElementOrder``). Every other list (``args``, ``command``, ``envFrom``,
  ``tolerations``, ``baseRefs``, router refs, LoRA adapters) is replaced as a whole.

KServe's own test vectors for this (``config_merge_test.go`` ``TestMergeSpecs``) and the ones that pin the empty-value
rule are in ``tests/fixtures/kserve/llmisvc_preset_merge.yaml``; what is not modelled (``*string`` fields such as
``model.name`` keep an empty string; non-omitempty scalars under an absent pointer) is listed in
``tests/fixtures/kserve/not_modelled.yaml``.
"""

from __future__ import annotations

import copy

# patchMergeKey of the lists of corev1.PodSpec and corev1.Container (k8s.io/api core/v1 types.go); other lists are atomic.
LIST_MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "volumes": "name",
    "imagePullSecrets": "name", "hostAliases": "ip", "topologySpreadConstraints": "topologyKey", "resourceClaims": "name",
    "schedulingGates": "name",
    "env": "name", "ports": "containerPort", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
}
# Fields that are Go maps: their entries are kept as written (an entry "" is a value, not an empty field).
_MAP_FIELDS = frozenset(("labels", "annotations", "nodeSelector", "requests", "limits", "overhead", "matchLabels", "inline"))
# Non-pointer omitempty scalars of corev1 (a false / 0 there is left out, so it never overrides).
_OMITEMPTY_FALSE = frozenset(("stdin", "stdinOnce", "tty", "hostNetwork", "hostPID", "hostIPC", "readOnly"))
_OMITEMPTY_ZERO = frozenset(("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold",
                             "hostPort"))


def omitted(key, value):
    """True when Go's json.Marshal leaves ``key: value`` out of a layer (so the layer does not set it)."""
    if value is None or value == "" or (isinstance(value, list) and not value):
        return True
    if isinstance(value, bool):
        return value is False and key in _OMITEMPTY_FALSE
    if isinstance(value, dict):
        return not value and key in _MAP_FIELDS
    return isinstance(value, int) and value == 0 and key in _OMITEMPTY_ZERO


def marshal(value, key=None):
    """``value`` as KServe's controller sees it after json.Marshal: omitted fields dropped at every depth."""
    if isinstance(value, dict):
        if key in _MAP_FIELDS:
            return {k: copy.deepcopy(v) for k, v in value.items() if v is not None}
        return {k: marshal(v, k) for k, v in value.items() if not omitted(k, v)}
    if isinstance(value, list):
        return [marshal(item, key) for item in value]
    return value


def _merge(base, layer, key=None):
    if isinstance(base, dict) and isinstance(layer, dict):
        out = dict(base)
        for k, v in layer.items():
            out[k] = _merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(layer, list) and key in LIST_MERGE_KEYS:
        return _merge_list(base, layer, LIST_MERGE_KEYS[key])
    return copy.deepcopy(layer)


def _merge_list(base, layer, merge_key):
    """A keyed list: the layer's items merged into the base's of the same key, in the layer's order, the base-only items
    slotted in where the base had them (apimachinery's normalizeElementOrder / mergeSortedSlice)."""
    def key_of(item):
        return item.get(merge_key) if isinstance(item, dict) else item
    base_keys = [key_of(item) for item in base]
    by_key = {}
    for item in base:
        by_key.setdefault(key_of(item), item)
    patched = [_merge(by_key[key_of(item)], item) if key_of(item) in by_key else copy.deepcopy(item) for item in layer]
    layer_keys = {key_of(item) for item in layer}
    base_only = [item for item in base if key_of(item) not in layer_keys]
    out, i, j = [], 0, 0
    while i < len(base_only) or j < len(patched):
        if j >= len(patched):
            out.append(base_only[i])
            i += 1
        elif i >= len(base_only):
            out.append(patched[j])
            j += 1
        else:
            left, right = key_of(base_only[i]), key_of(patched[j])
            if left in base_keys and right in base_keys and base_keys.index(left) < base_keys.index(right):
                out.append(base_only[i])
                i += 1
            else:
                out.append(patched[j])
                j += 1
    return out


def merge_specs(*specs):
    """KServe's ``MergeSpecs``: the first spec, then each next one merged over it (later wins). Returns the merged spec."""
    if not specs:
        return {}
    out = marshal(specs[0] or {})
    for spec in specs[1:]:
        out = _merge(out, marshal(spec or {}))
    return out
