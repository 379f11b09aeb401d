"""The rollback of an LLMInferenceService against presets merged as KServe merges them (kserve/llmisvc/merge.py): an
empty value on the resource never overrides a preset's, so the strip never reports success while a preset's flag would
be in effect, and every refusal's fix is an override KServe's merge keeps (checked by merging it, with the collection's
merge and the test bed's)."""
import copy
import re

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import merge
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from tests.testbed import llmisvc_merge as standin
from tests.unit.plugins.module_utils.test_llmisvc import SPEC_JSON, _apply, _obj, _upstream, main_container

FLAG = "--speculative-config '%s'" % SPEC_JSON
ENV = "VLLM_ADDITIONAL_ARGS"


def _preset(name, container, namespace="ns"):
    return {"kind": "LLMInferenceServiceConfig", "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"containers": [dict(container, name="main")]}}}


def _fix(hint):
    """The YAML block the hint gives (after its colon and newline), parsed."""
    block = re.search(r":\n(spec:\n(?:  .*\n?)+)", hint)
    assert block, hint
    return yaml.safe_load(block.group(1))


def _with_fix(obj, fix):
    """The resource with the fix applied the way a user edits it (the fix's container fields set on the resource's)."""
    out = copy.deepcopy(obj)
    fixed = fix["spec"]["template"]["containers"][0]
    container = main_container(out)
    for key, value in fixed.items():
        if key == "env":
            others = [e for e in container.get("env") or [] if e["name"] not in {v["name"] for v in value}]
            container["env"] = others + value
        elif key != "name":
            container[key] = value
    return out


def _merged_main(preset, obj, merge_specs):
    spec = merge_specs(preset["spec"], obj["spec"])
    return next(c for c in spec["template"]["containers"] if c["name"] == "main")


def _runs_flag(container):
    env = " ".join(e.get("value") or "" for e in container.get("env") or [] if e["name"] == ENV)
    return bool(vllm_command.find_occurrences(list(container.get("command") or []) + list(container.get("args") or []))
                or vllm_command.script_occurrences(env))


@pytest.mark.parametrize("empty", [{"value": ""}, {}])
def test_an_empty_value_on_the_resource_leaves_the_preset_flag_in_effect(empty):
    preset = _preset("spec-args", {"env": [{"name": ENV, "value": "--max-num-seqs 8 " + FLAG}]})
    obj = _obj({"command": ["vllm", "serve", "/mnt/models"], "env": [dict({"name": ENV}, **empty)]}, base_refs=["spec-args"])
    found = llmisvc.flags(obj, {"spec-args": preset})
    assert [(f["source"], f["preset"], f["field"]) for f in found] == [
        ("LLMInferenceServiceConfig/spec-args", "baseRefs", "env[0] %s" % ENV)]
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, {"spec-args": preset})
    assert err.value.field == "spec.baseRefs"
    # the fix overrides with the preset's value minus the flag, never with an empty one
    fix = _fix(err.value.hint)
    assert fix["spec"]["template"]["containers"][0]["env"] == [{"name": ENV, "value": "--max-num-seqs 8"}]
    assert "copy of spec-args without the flag" in err.value.hint and "it ignores an empty value" in err.value.hint
    fixed = _with_fix(obj, fix)
    assert llmisvc.flags(fixed, {"spec-args": preset}) == [] and llmisvc.strip(fixed, {"spec-args": preset}) == ([], [])
    for merge_specs in (merge.merge_specs, standin.merge_specs):
        assert not _runs_flag(_merged_main(preset, fixed, merge_specs))


def test_a_strip_that_would_empty_the_resource_value_is_refused_when_the_preset_carries_the_flag_too():
    """The bug: the resource's VLLM_ADDITIONAL_ARGS (the flag only) hides the preset's; the strip would write "" and
    report success while KServe's merge brings the preset's flag back."""
    preset = _preset("spec-args", {"env": [{"name": ENV, "value": FLAG}]})
    presets = {"spec-args": preset}
    obj = _obj({"command": ["/bin/bash", "-c", 'eval "vllm serve /mnt/models ${VLLM_ADDITIONAL_ARGS}"'],
                "env": [{"name": ENV, "value": FLAG}]}, base_refs=["spec-args"])
    assert [f["source"] for f in llmisvc.flags(obj, presets)] == ["resource"]  # what runs today: the resource's value
    before = copy.deepcopy(obj)
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, presets)
    assert obj == before
    msg = str(err.value)
    assert err.value.field == "spec.template.containers[main].env[%s]" % ENV
    assert "would leave the LLMInferenceService's env[%s] empty" % ENV in msg and "ns/spec-args" in msg
    assert "does not let an empty value" in msg and "nothing was written" in msg
    fix = _fix(err.value.hint)
    assert fix["spec"]["template"]["containers"][0]["env"] == [{"name": ENV, "value": " "}]
    fixed = _with_fix(obj, fix)
    assert llmisvc.flags(fixed, presets) == [] and llmisvc.strip(fixed, presets) == ([], [])
    for merge_specs in (merge.merge_specs, standin.merge_specs):
        merged = _merged_main(preset, fixed, merge_specs)
        assert [e["value"] for e in merged["env"] if e["name"] == ENV] == [" "] and not _runs_flag(merged)
    # the old fix, an empty value, leaves the flag on in KServe's merge, and the collection now says so
    emptied = _with_fix(obj, {"spec": {"template": {"containers": [{"name": "main", "env": [{"name": ENV, "value": ""}]}]}}})
    assert _runs_flag(_merged_main(preset, emptied, standin.merge_specs))
    assert [f["source"] for f in llmisvc.flags(emptied, presets)] == ["LLMInferenceServiceConfig/spec-args"]


def test_a_resource_value_that_keeps_other_arguments_still_strips():
    preset = _preset("spec-args", {"env": [{"name": ENV, "value": FLAG}]})
    obj = _obj({"env": [{"name": ENV, "value": "--seed 1 " + FLAG}]}, base_refs=["spec-args"])
    patch, changes = llmisvc.strip(obj, {"spec-args": preset})
    assert [c["after"] for c in changes] == ["--seed 1"]
    assert llmisvc.flags(_apply(obj, patch), {"spec-args": preset}) == []


def test_args_the_strip_would_empty_uncover_the_preset_args():
    preset = _preset("spec-args", {"command": ["vllm", "serve", "/mnt/models"], "args": ["--port", "8000", "--speculative-config", SPEC_JSON]})
    obj = _obj({"args": ["--speculative-config", SPEC_JSON]}, base_refs=["spec-args"])
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, {"spec-args": preset})
    assert err.value.field == "spec.template.containers[main].args" and "args empty" in str(err.value)
    fix = _fix(err.value.hint)
    assert fix["spec"]["template"]["containers"][0]["args"] == ["--port", "8000"]
    fixed = _with_fix(obj, fix)
    assert llmisvc.flags(fixed, {"spec-args": preset}) == []
    for merge_specs in (merge.merge_specs, standin.merge_specs):
        assert _merged_main(preset, fixed, merge_specs)["args"] == ["--port", "8000"]
    # a resource's args: [] does not override either
    main_container(obj)["args"] = []
    assert [f["source"] for f in llmisvc.flags(obj, {"spec-args": preset})] == ["LLMInferenceServiceConfig/spec-args"]


def test_preset_args_that_are_only_the_flag_have_no_override_and_the_hint_says_what_works():
    preset = _preset("spec-args", {"args": ["--speculative-config", SPEC_JSON]})
    obj = _obj({"command": ["vllm", "serve", "/mnt/models"]}, base_refs=["spec-args"])
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, {"spec-args": preset})
    assert "spec:" not in err.value.hint and "empty" not in err.value.hint
    assert "point spec.baseRefs at a copy of spec-args without the flag" in err.value.hint
    assert "remove the flag from LLMInferenceServiceConfig ns/spec-args" in err.value.hint


def test_the_well_known_preset_hint_gives_a_working_override_not_an_empty_one():
    preset = _upstream("kserve-config-llm-template", [("template",)], {
        "command": ["/bin/bash", "-c", 'eval "vllm serve /mnt/models ${VLLM_ADDITIONAL_ARGS}"'], "env": [{"name": ENV, "value": FLAG}]})
    presets = {"kserve-config-llm-template": preset}
    obj = _obj({"env": [{"name": "HOME", "value": "/h"}]})
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, presets)
    assert err.value.field == "spec.template" and "well-known preset" in str(err.value)
    fix = _fix(err.value.hint)
    assert fix["spec"]["template"]["containers"][0]["env"] == [{"name": ENV, "value": " "}]
    assert "copy of" not in err.value.hint  # not named by baseRefs: no copy to point at
    fixed = _with_fix(obj, fix)
    assert llmisvc.flags(fixed, presets) == []


def test_well_known_shape_follows_the_merge_of_resource_and_baserefs():
    """An empty prefill in a baseRefs preset is still a prefill (a pointer to a struct, kept), an empty-string-only
    one is too; the shape is read from the resource merged with its baseRefs as KServe merges them."""
    assert llmisvc.well_known_presets({"spec": {}}, [{"prefill": {}}]) == [
        "kserve-config-llm-prefill-template", "kserve-config-llm-decode-template"]
    assert llmisvc.well_known_presets({"spec": {"worker": {}, "parallelism": {"data": 2}}}, [{"parallelism": {"data": 4}}]) == [
        "kserve-config-llm-worker-data-parallel"]
