"""Filter alauda.spec_decoding.llmisvc_verify_summary: the shell over llmisvc.verify_summary (tested on real engine reports
and metrics results in tests/unit/plugins/module_utils/test_llmisvc_verify_summary.py). The verify role's use of it runs in
the integration tier (test_llmisvc_testbed, test_llmisvc_multinode, test_rbac_llmisvc)."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.llmisvc_verify_summary import FilterModule, llmisvc_verify_summary

SPEC = {"method": "eagle3", "model": "/mnt/models/draft", "num_spec_tokens": 3}
# llmisvc_engine_config_info's result for a one-pod decode Deployment (the keys the summary reads)
ENGINE = {"changed": False, "problems": [], "speculative_config": SPEC,
          "pools": {"decode": {"workload": {"kind": "Deployment", "name": "m-kserve"}, "pods": [{"name": "m-kserve-0", "found": True}],
                               "engine_pod": "m-kserve-0", "speculative_config": SPEC}}}
ACCEPTANCE = {"changed": False, "results": [{"verify_llmisvc_pod": "m-kserve-0", "ansible_loop_var": "verify_llmisvc_pod",
                                             "mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5, "diagnosis": {"status": "ok"},
                                             "msg": "mean acceptance length 2.50"}]}


def test_registered_name():
    assert FilterModule().filters()["llmisvc_verify_summary"] is llmisvc_verify_summary


def test_summary_of_the_registered_results():
    out = llmisvc_verify_summary(ENGINE, namespace="models", name="m", acceptance=ACCEPTANCE, generation=4)
    assert out["lines"] == ["LLMInferenceService models/m: Ready at generation 4",
                            "pool decode (Deployment m-kserve, 1 pod(s), engine line from m-kserve-0): method=eagle3 model=/mnt/models/draft "
                            "num_spec_tokens=3",
                            "acceptance on m-kserve-0: mean acceptance length 2.50"]
    assert out["metrics"] == {"m-kserve-0": {"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5, "diagnosis": {"status": "ok"},
                                             "msg": "mean acceptance length 2.50"}}


@pytest.mark.parametrize("engine, acceptance, fragment", [
    ("m-kserve-0", None, "expects the registered result of llmisvc_engine_config_info (with pools), got str"),
    ({"changed": False}, None, "expects the registered result of llmisvc_engine_config_info (with pools), got a dictionary without pools"),
    ({"pools": ["decode"]}, None, "llmisvc_verify_summary: pools: is not the pools of an engine report. Fix: pass the registered result "
                                  "of llmisvc_engine_config_info (its pools)"),
    (ENGINE, {"results": [{"msg": "x"}]}, "llmisvc_verify_summary: acceptance.results[0]: names no pod (no loop variable). Fix: register "
                                          "the result of a loop over the decode pods' names"),
], ids=["not-a-dict", "no-pools", "pools-not-a-dict", "item-without-pod"])
def test_bad_input(engine, acceptance, fragment):
    with pytest.raises(AnsibleFilterError) as exc:
        llmisvc_verify_summary(engine, namespace="models", name="m", acceptance=acceptance)
    assert fragment in str(exc.value)
