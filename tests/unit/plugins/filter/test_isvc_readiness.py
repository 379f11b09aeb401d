"""The isvc_readiness filter reads an InferenceService the way isvc_wait does (Ready at the current generation)."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.isvc_readiness import isvc_readiness


def _isvc(generation, observed, ready):
    return {"metadata": {"generation": generation},
            "status": {"observedGeneration": observed, "conditions": [{"type": "Ready", "status": ready, "reason": "x"}]}}


@pytest.mark.parametrize("obj, at_generation", [
    (_isvc(2, 2, "True"), True),
    (_isvc(3, 2, "True"), False),   # Ready is from the previous generation: the wait must still run
    (_isvc(2, 2, "False"), False),
    ({"metadata": {"generation": 1}}, False),  # not reconciled yet
])
def test_ready_at_generation_is_what_isvc_wait_waits_for(obj, at_generation):
    assert isvc_readiness(obj)["ready_at_generation"] is at_generation


def test_not_an_object_is_refused():
    with pytest.raises(AnsibleFilterError, match="expects an InferenceService object"):
        isvc_readiness("llama")
