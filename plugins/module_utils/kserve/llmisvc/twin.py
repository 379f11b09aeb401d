# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark twin of an LLMInferenceService: the same spec without the speculative flag, under another name, sharing no
router objects with its source.

Plain Python, no Ansible imports. What KServe does with the object is in ``model.py``'s docstring.
"""

from __future__ import annotations

import copy

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc.model import DEFAULT_API_VERSION, GROUP, KIND
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc.flags import flags, strip
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import router as router_rules

# ----------------------------------------------------------------------------------------------------------------
# Benchmark twin

# Router fields that name objects the twin would share with its source (KServe's router.go: routes given as refs are
# used as they are, an InferencePool ref is not reconciled per service), so the twin's URL could reach the candidate.
TWIN_SHARED_ROUTER_FIELDS = (("route", "http", "refs"), ("scheduler", "pool", "ref"))


def baseline_twin(obj, name=None, suffix=None, found_flags=None):
    """The manifest of the baseline twin of the LLMInferenceService ``obj`` (as read from the API server): the same
    spec under another name with every speculative flag of every pool removed token-exact (:func:`strip`), labelled and
    annotated as the InferenceService twin is (``bench_twin``).

    ``found_flags`` is what :func:`flags` found with the baseRefs presets (``llmisvc_speculative`` state=query returns
    it); without it only the resource's own flags are seen. Raises ValidationError, before anything is written, when the
    object runs no speculative flag (it already is a baseline), when a preset supplies the flag (the twin would inherit
    it), when a flag cannot be removed token-exact, or when the router names a shared HTTPRoute or InferencePool."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import baseline_twin as bench_twin  # pylint: disable=import-outside-toplevel
    if not isinstance(obj, dict) or obj.get("kind") not in (None, KIND) or not isinstance(obj.get("spec"), dict):
        raise ValidationError("is not an LLMInferenceService with a spec", field="candidate",
                              hint="pass the LLMInferenceService as read from the cluster (llmisvc_speculative's resource)")
    meta = obj.get("metadata") or {}
    source = meta.get("name")
    if not source:
        raise ValidationError("has no metadata.name", field="candidate", hint="pass the LLMInferenceService as read from the cluster")
    found = flags(obj) if found_flags is None else list(found_flags)
    if not found:
        raise ValidationError("LLMInferenceService %s carries no speculative flag in any pool, so it already is a baseline" % source,
                              field="candidate", hint="benchmark it as the baseline (benchmark_baseline_name) instead of deploying "
                                                      "a twin, or name the speculative-decoding LLMInferenceService")
    foreign = [f for f in found if f.get("source", "resource") != "resource"]
    if foreign:
        raise ValidationError("the speculative flag of pool %s comes from the preset %s, which the twin would inherit (same "
                              "spec.baseRefs), so the twin would not be a baseline" % (foreign[0]["pool"], foreign[0]["source"]),
                              field="spec.baseRefs", hint="deploy a baseline LLMInferenceService without that preset and benchmark "
                                                          "it as benchmark_baseline_name")
    router = obj["spec"].get("router") or {}
    for path in TWIN_SHARED_ROUTER_FIELDS:
        node = router
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node:
            raise ValidationError("names an object the twin would share with %s, so the twin's URL could reach the candidate's "
                                  "pods" % source, field="spec.router." + ".".join(path),
                                  hint="deploy a baseline LLMInferenceService with its own route and benchmark it as "
                                       "benchmark_baseline_name, or give benchmark_baseline_url")
    patch, _changes = strip(obj)
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch  # pylint: disable=import-outside-toplevel
    stripped = isvc_patch.apply_patch(obj, patch)
    # the routing plan's rules stay with the candidate: the twin gets the route KServe manages from its preset
    made = {"apiVersion": obj.get("apiVersion") or "%s/%s" % (GROUP, DEFAULT_API_VERSION), "kind": KIND,
            "metadata": bench_twin.twin_metadata(meta, name, suffix), "spec": copy.deepcopy(stripped["spec"])}
    return router_rules.without_plan(made)
