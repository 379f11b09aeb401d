"""KServe v0.20's LLMInferenceService preset merge (config_merge.go MergeSpecs, WellKnownConfigResolver.Resolve) pinned to
KServe's own test vectors (tests/fixtures/kserve/llmisvc_preset_merge.yaml), run against the collection's merge
(kserve/llmisvc/merge.py, flags.well_known_presets) and, separately, against the test bed's stand-in
(tests/testbed/llmisvc_merge.py), so neither side is pinned only to the other. The stand-in installs no well-known
presets, so the naming vectors run against the collection only."""
from __future__ import annotations

import pytest

from tests.paths import kserve_vectors
from tests.testbed import llmisvc_merge as standin

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import merge

VECTORS = kserve_vectors("llmisvc_preset_merge.yaml")
MERGE_CASES = VECTORS["merge_specs"] + VECTORS["derived"]
IMPLEMENTATIONS = {"collection": merge.merge_specs, "standin": standin.merge_specs}


def test_the_vectors_name_their_origin_and_are_unique():
    ids = [c["id"] for c in MERGE_CASES + VECTORS["well_known_names"]]
    assert len(ids) == len(set(ids)) and len(VECTORS["merge_specs"]) >= 15
    assert VECTORS["source"] == {"repo": "kserve/kserve", "tag": "v0.20.0", "commit": "1fb781055dd1567164358233e1125142ca6ef1fe"}
    for case in VECTORS["merge_specs"] + VECTORS["well_known_names"]:
        assert case["go_test"].startswith("Test") and case["file"].endswith("_test.go"), case["id"]


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("case", MERGE_CASES, ids=[c["id"] for c in MERGE_CASES])
def test_merge_specs_as_kserve(case, implementation):
    assert IMPLEMENTATIONS[implementation](*case["specs"]) == case["want"]


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
def test_the_merge_leaves_its_inputs_alone(implementation):
    case = next(c for c in MERGE_CASES if c["id"] == "merge-requests-and-limits")
    specs = kserve_vectors("llmisvc_preset_merge.yaml")["merge_specs"]
    specs = next(c for c in specs if c["id"] == "merge-requests-and-limits")["specs"]
    IMPLEMENTATIONS[implementation](*specs)
    assert specs == case["specs"]


@pytest.mark.parametrize("case", VECTORS["well_known_names"], ids=[c["id"] for c in VECTORS["well_known_names"]])
def test_well_known_preset_names_as_kserve_resolves_them(case):
    obj = {"spec": {}, "status": {"annotations": case["status_annotations"]} if case["status_annotations"] is not None else {}}
    assert flags.well_known_presets(obj) == [case["want"]]
