"""isvc_patch: the rollback / roll-forward plan and its guarded JSON patch, on the guide's manifests."""
from __future__ import annotations

import copy
import json
import os

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as ip
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

DATA = os.path.join(os.path.dirname(__file__), "data", "rollback")
EAGLE3 = {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def load(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as fh:
        obj = yaml.safe_load(fh)
    obj["metadata"].update(resourceVersion="41", generation=3)
    return obj


@pytest.mark.parametrize("name, config", [("guide_example1_ngram", NGRAM), ("guide_example2_eagle3", EAGLE3)])
def test_guide_manifest_rolls_back_to_the_expected_manifest(name, config):
    isvc = load(name + ".yaml")
    expected = load(name + ".rolled_back.yaml")
    plan = ip.plan_strip(isvc)
    assert plan.changed and plan.previous_config == config and plan.containers == ["model"]
    doc = ip.backup_document(isvc, plan)
    value, truncated = ip.backup_annotation_value(doc)
    assert not truncated
    ops = ip.build_patch(isvc, plan, annotation_value=value)
    # a test of the exact old command comes before its replacement
    assert ops[0] == {"op": "test", "path": "/spec/predictor/model/command", "value": isvc["spec"]["predictor"]["model"]["command"]}
    assert ops[1]["op"] == "replace"
    after = ip.apply_patch(isvc, ops)
    # the expected manifest plus the backup annotation
    expected["metadata"]["annotations"][ip.BACKUP_ANNOTATION] = value
    assert after == expected
    assert json.loads(value)["config"] == config
    # the rolled-back object plans nothing (idempotent)
    assert not ip.plan_strip(after).changed
    # roll forward from the backup: the exact old command comes back
    restore = ip.plan_restore(after, ip.read_backup(after), json.dumps(config))
    assert ip.apply_patch(after, ip.build_patch(after, restore))["spec"] == isvc["spec"]


def test_concurrent_edit_makes_the_test_op_fail():
    isvc = load("guide_example2_eagle3.yaml")
    ops = ip.build_patch(isvc, ip.plan_strip(isvc))
    edited = copy.deepcopy(isvc)
    edited["spec"]["predictor"]["model"]["command"][2] += "echo edited\n"
    with pytest.raises(ValueError):
        ip.apply_patch(edited, ops)
    assert ip.tests_hold(isvc, ops) and not ip.tests_hold(edited, ops)
    assert not ip.tests_hold({"metadata": {}}, ops)  # a missing path does not hold


def test_resource_version_guard_and_missing_annotations():
    isvc = load("guide_example1_ngram.yaml")
    del isvc["metadata"]["annotations"]
    plan = ip.plan_strip(isvc)
    ops = ip.build_patch(isvc, plan, annotation_value="{}", guard="resource_version")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert ops[-1] == {"op": "add", "path": "/metadata/annotations", "value": {ip.BACKUP_ANNOTATION: "{}"}}


def test_custom_containers_and_args_are_stripped():
    isvc = {"metadata": {"name": "x", "namespace": "n"}, "spec": {"predictor": {"containers": [
        {"name": "sidecar", "command": ["sleep", "infinity"]},
        {"name": "kserve-container", "command": ["vllm", "serve", "/mnt/models"], "args": ["--spec-method", "ngram", "--spec-tokens", "4"]},
    ]}}}
    plan = ip.plan_strip(isvc)
    assert [c.path for c in plan.changes] == ["/spec/predictor/containers/1/args"]
    assert plan.changes[0].new == [] and plan.previous_config == {"method": "ngram", "num_speculative_tokens": 4}
    assert plan.containers == ["kserve-container"]


def test_plan_set_picks_the_vllm_container_and_is_idempotent():
    isvc = {"metadata": {}, "spec": {"predictor": {"containers": [
        {"name": "proxy", "command": ["envoy"]},
        {"name": "kserve-container", "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--port", "8080"]},
    ]}}}
    canonical = json.dumps(NGRAM, separators=(",", ":"))
    plan = ip.plan_set(isvc, canonical)
    assert plan.changes[0].path == "/spec/predictor/containers/1/args"
    assert plan.changes[0].new == ["--port", "8080", "--speculative-config", canonical]
    after = ip.apply_patch(isvc, ip.build_patch(isvc, plan))
    assert not ip.plan_set(after, canonical).changed
    with pytest.raises(ValidationError) as exc:
        ip.plan_set(isvc, canonical, container_name="nope")
    assert "proxy, kserve-container" in str(exc.value)


def test_restore_falls_back_to_config_when_command_changed_since():
    isvc = load("guide_example2_eagle3.yaml")
    plan = ip.plan_strip(isvc)
    doc = ip.backup_document(isvc, plan)
    after = ip.apply_patch(isvc, ip.build_patch(isvc, plan))
    after["spec"]["predictor"]["model"]["command"][2] = after["spec"]["predictor"]["model"]["command"][2].replace("--seed 0", "--seed 1")
    canonical = json.dumps(EAGLE3, separators=(",", ":"))
    restore = ip.plan_restore(after, doc, canonical)
    new = ip.apply_patch(after, ip.build_patch(after, restore))["spec"]["predictor"]["model"]["command"][2]
    assert "--seed 1" in new and "--speculative-config '%s'" % canonical in new
    with pytest.raises(ValidationError):
        ip.plan_restore(after, doc, None)


def test_backup_is_bounded():
    isvc = load("guide_example2_eagle3.yaml")
    isvc["spec"]["predictor"]["model"]["command"][2] += "# " + "x" * 20000 + "\n"
    plan = ip.plan_strip(isvc)
    value, truncated = ip.backup_annotation_value(ip.backup_document(isvc, plan))
    assert truncated and len(value) <= ip.MAX_BACKUP_BYTES
    assert json.loads(value)["config"] == EAGLE3 and "containers" not in json.loads(value)
    with pytest.raises(ValidationError) as exc:
        ip.backup_annotation_value({"format": 1, "config": {"k": "x" * 20000}})
    assert "backup_file" in str(exc.value)


def test_unreadable_backup_annotation():
    isvc = {"metadata": {"annotations": {ip.BACKUP_ANNOTATION: "{oops"}}}
    with pytest.raises(ValidationError) as exc:
        ip.read_backup(isvc)
    assert ip.BACKUP_ANNOTATION in str(exc.value)
    assert ip.read_backup({"metadata": {}}) is None


def test_remove_draft_storage_entry():
    isvc = load("guide_example2_eagle3.yaml")
    rolled = ip.apply_patch(isvc, ip.build_patch(isvc, ip.plan_strip(isvc)))
    ops, removed, _note = ip.plan_remove_draft_storage(rolled, "/mnt/models/draft")
    assert removed["mountPath"] == "/mnt/models/draft"
    assert ip.apply_patch(rolled, ops)["spec"]["predictor"]["storageUris"] == [isvc["spec"]["predictor"]["storageUris"][0]]
    with pytest.raises(ValidationError):
        ip.plan_remove_draft_storage(isvc, "/mnt/models/draft")  # still referenced by the command
    ops, removed, note = ip.plan_remove_draft_storage(load("guide_example1_ngram.yaml"), None)
    assert ops == [] and removed is None and "no draft" in note


def test_strip_limited_to_a_named_container_and_unknown_names_refused():
    isvc = {"spec": {"predictor": {
        "model": {"command": ["vllm", "serve", "m", "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}']},
        "containers": [{"name": "sidecar", "args": ["--speculative-config", '{"method":"ngram","num_speculative_tokens":2}']}]}}}
    only_sidecar = ip.plan_strip(isvc, container_name="sidecar")
    assert [c.path for c in only_sidecar.changes] == ["/spec/predictor/containers/0/args"]
    with pytest.raises(ValidationError) as err:
        ip.plan_strip(isvc, container_name="sidecar-x")
    assert err.value.field == "container" and "sidecar" in str(err.value)
