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

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.strategic_merge import marshal, merge


def merge_specs(*specs):
    """KServe's ``MergeSpecs``: the first spec, then each next one merged over it (later wins). Returns the merged spec."""
    if not specs:
        return {}
    out = marshal(specs[0] or {})
    for spec in specs[1:]:
        out = merge(out, marshal(spec or {}))
    return out
