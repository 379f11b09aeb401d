"""The baseline twin of an LLMInferenceService (llmisvc_twin.baseline_twin, through the baseline_twin filter): the same spec
with the flag removed from every pool token-exact; refusals name the field."""
import copy

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.baseline_twin import baseline_twin as twin_filter
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import baseline_twin as bench_twin
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import render as llmisvc_render
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import twin as llmisvc_twin
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.testbed import crds
from tests.testbed.llmisvc_standin import schema_errors
from tests.unit.plugins.module_utils.test_llmisvc import DP_SCRIPT, SPEC_JSON, main_container, params


def _candidate(**llmisvc_over):
    obj = llmisvc_render.render(params(llmisvc=dict({"prefill": {"replicas": 1}}, **llmisvc_over)))["manifest"]
    # as read from the API server: server-set metadata, an annotation of its own history, status
    obj["metadata"].update(uid="u-1", resourceVersion="42", generation=3, annotations={
        "kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "llm"})
    obj["status"] = {"url": "http://gw.example/models/llama-eagle3", "observedGeneration": 3}
    return obj


def test_twin_is_the_candidate_without_the_flag_and_validates_against_the_crd():
    source = _candidate()
    before = copy.deepcopy(source)
    twin = twin_filter(source)  # the filter the role calls dispatches on kind
    assert source == before  # the input is not modified
    assert (twin["apiVersion"], twin["kind"]) == ("serving.kserve.io/v1alpha2", "LLMInferenceService")
    assert set(twin) == {"apiVersion", "kind", "metadata", "spec"}
    assert twin["metadata"] == {
        "name": "llama-eagle3-baseline", "namespace": "models",
        "labels": dict(source["metadata"]["labels"], **{bench_twin.TWIN_LABEL: "true"}),
        "annotations": {"team": "llm", bench_twin.TWIN_OF_ANNOTATION: "models/llama-eagle3"}}
    assert bench_twin.is_twin(twin) and not bench_twin.is_twin(source)
    # token-exact: the decode command is the prefill pool's (rendered without the flag) byte for byte; nothing else moved
    decode = main_container(twin)["command"]
    assert decode == main_container(source, "prefill")["command"] and vllm_command.find_speculative_config(decode) is None
    expected = copy.deepcopy(source["spec"])
    main_container({"spec": expected})["command"] = decode
    assert twin["spec"] == expected
    assert llmisvc.flags(twin) == []
    assert schema_errors(twin, crds.resolve()) == []


def test_flag_in_every_pool_and_form_is_removed():
    source = _candidate(speculative_pools=["decode", "prefill"])
    env_form = {"command": ["/bin/bash", "-c"], "args": [DP_SCRIPT],
                "env": [{"name": "VLLM_ADDITIONAL_ARGS", "value": "--max-num-seqs 8 --speculative-config '%s'" % SPEC_JSON}]}
    source["spec"]["prefill"]["template"]["containers"][0].update(env_form)
    assert sorted(f["pool"] for f in llmisvc.flags(source)) == ["decode", "prefill"]
    twin = llmisvc_twin.baseline_twin(source, name="llama-plain")
    assert twin["metadata"]["name"] == "llama-plain" and llmisvc.flags(twin) == []
    assert main_container(twin, "prefill")["env"] == [{"name": "VLLM_ADDITIONAL_ARGS", "value": "--max-num-seqs 8"}]
    assert main_container(twin, "prefill")["args"] == [DP_SCRIPT]


def test_refusals_name_the_field():
    baseline = llmisvc_render.render(params(method="none", artifacts={"pvc_name": "model-store"}))["manifest"]
    with pytest.raises(ValidationError) as err:
        llmisvc_twin.baseline_twin(baseline)
    assert err.value.field == "candidate" and "already is a baseline" in str(err.value)
    with pytest.raises(AnsibleFilterError, match="candidate: LLMInferenceService llama-eagle3 carries no speculative flag"):
        twin_filter(baseline)
    # a flag a baseRefs preset supplies (as llmisvc_speculative reports it) would be inherited by the twin
    preset_flag = [{"pool": "decode", "container": "main", "source": "LLMInferenceServiceConfig/spec-args"}]
    with pytest.raises(ValidationError) as err:
        llmisvc_twin.baseline_twin(baseline, found_flags=preset_flag)
    assert err.value.field == "spec.baseRefs" and "spec-args" in str(err.value)
    # the resource's own flags as the module found them are accepted the same way as without them
    source = _candidate()
    assert llmisvc_twin.baseline_twin(source, found_flags=llmisvc.flags(source)) == llmisvc_twin.baseline_twin(source)
    # a shared HTTPRoute or InferencePool would let the twin's URL reach the candidate
    for router, field in (({"route": {"http": {"refs": [{"name": "shared"}]}}}, "spec.router.route.http.refs"),
                          ({"scheduler": {"pool": {"ref": {"name": "pool"}}}}, "spec.router.scheduler.pool.ref")):
        shared = copy.deepcopy(source)
        shared["spec"]["router"] = router
        with pytest.raises(ValidationError) as err:
            llmisvc_twin.baseline_twin(shared)
        assert err.value.field == field
    own_route = copy.deepcopy(source)
    own_route["spec"]["router"] = {"route": {}, "gateway": {"refs": [{"name": "gw", "namespace": "gw"}]}}
    assert llmisvc_twin.baseline_twin(own_route)["spec"]["router"] == own_route["spec"]["router"]
    # a flag inside the eval string cannot be removed token-exact: refused, not half-stripped
    quoted = copy.deepcopy(source)
    quoted["spec"]["template"]["containers"][0].update(
        command=["/bin/bash", "-c"], args=[DP_SCRIPT.replace("${VLLM_ADDITIONAL_ARGS}", "--speculative-config '%s'" % SPEC_JSON)])
    with pytest.raises(ValidationError) as err:
        llmisvc_twin.baseline_twin(quoted)
    assert err.value.field == "spec.template"
    with pytest.raises(ValidationError) as err:
        llmisvc_twin.baseline_twin(source, name="Not_A_Name")
    assert err.value.field == "name"
    with pytest.raises(ValidationError) as err:
        llmisvc_twin.baseline_twin({"kind": "LLMInferenceService", "metadata": {"name": "x"}})
    assert err.value.field == "candidate"
