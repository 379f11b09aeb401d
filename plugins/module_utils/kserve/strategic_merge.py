# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes' strategic merge of Go-marshalled objects, as KServe uses it in two places: a ServingRuntime's container
merged with the InferenceService's (``MergeContainerWithPatch``, isvc/runtime.py) and an LLMInferenceService merged
with its presets (``MergeSpecs``, llmisvc/merge.py). One implementation, pinned by both sets of KServe's vectors
(tests/fixtures/kserve/runtime_merge.yaml and llmisvc_preset_merge.yaml).

Two steps, as KServe's Go code takes them:

* ``marshal``: what Go's encoding/json writes of a layer. Every ``omitempty`` field at its zero value is left out (an
  env variable's ``value: ""``, ``args: []``, ``stdin: false``), so an empty value never overrides; a non-empty one
  does. Map fields (labels, resources.requests ...) keep their entries as written.
* ``merge``: apimachinery's ``StrategicMergePatch``. Maps and objects merge key by key; the lists Kubernetes declares
  with a patch merge key (``containers``/``env`` by ``name``, ``volumeMounts`` by ``mountPath`` ...) merge item by
  item, in the layer's order with the items only the base has kept where they stood (``mergeSlice`` /
  ``normalizeElementOrder``); every other list (``args``, ``command``, ``envFrom``, ``tolerations``) is replaced.

Plain Python, no Ansible imports.
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


def merge(base, layer, key=None):
    """``layer`` strategic-merge-patched over ``base`` (both already marshalled): maps and objects key by key, keyed
    lists item by item in the layer's order, every other list and value replaced. ``key`` is the field holding them."""
    if isinstance(base, dict) and isinstance(layer, dict):
        out = dict(base)
        for k, v in layer.items():
            out[k] = merge(base[k], v, k) if k in base else copy.deepcopy(v)
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
    patched = [merge(by_key[key_of(item)], item) if key_of(item) in by_key else copy.deepcopy(item) for item in layer]
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
