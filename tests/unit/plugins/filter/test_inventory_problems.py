"""Filter alauda.spec_decoding.inventory_problems (issue 48): values checked by Ansible's own argument-spec validator
against the role variable they feed, said in one line under the inventory's name; unknown names; a draft method without a
draft. In-process, on this collection's roles."""
from __future__ import annotations

import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.inventory_problems import FilterModule, inventory_problems
from tests.ansible_run import REPO


def test_registered_name():
    assert FilterModule().filters()["inventory_problems"] is inventory_problems


def test_a_wrong_choice_is_one_short_line_naming_the_inventory_variable_and_the_nearest_choice():
    """The issue's case: `spec_decoding_method: eagle-3` failed with a 14.8 KB line naming inference_service_method."""
    found = inventory_problems({"spec_decoding_method": "eagle-3"})
    assert found["unknown"] == []
    (message,) = found["invalid"]
    print("eagle-3: %d characters: %s" % (len(message), message))
    assert len(message) < 300, message
    assert message.startswith("spec_decoding_method: 'eagle-3' must be one of none, ngram, eagle3,") and message.endswith(
        "Fix: set spec_decoding_method: eagle3"), message
    assert "inference_service_method" not in message


@pytest.mark.parametrize("name,value,mentions", [
    ("spec_decoding_max_model_len", "8k", ["'8k' is not a valid int", "spec_decoding_max_model_len: 8192"]),
    ("spec_decoding_deployment_mode", "RawDeploymnet", ["'RawDeploymnet' must be one of Standard, Knative, RawDeployment, Serverless",
                                                        "set spec_decoding_deployment_mode: RawDeployment"]),
    ("spec_decoding_extra_args", "--enforce-eager --seed=1", None),  # a string is a list of its comma-separated parts to Ansible
    ("canary_steps", "ten", ["canary_steps: 'ten' is not a valid list of int"]),
    ("spec_decoding_artifact_mode", "storage-uris", ["set spec_decoding_artifact_mode: storage_uris"]),
])
def test_values_are_checked_as_the_role_checks_them(name, value, mentions):
    found = inventory_problems({name: value})
    if mentions is None:
        assert found == {"unknown": [], "invalid": []}
        return
    (message,) = found["invalid"]
    assert message.startswith(name + ": ") and "\n" not in message and len(message) < 300, message
    for text in mentions:
        assert text in message, message


def test_values_are_checked_against_the_roles_the_play_runs():
    """spec_decoding_target feeds inference_service (gitops, cluster) and watch (cluster, schedule)."""
    deploy = inventory_problems({"spec_decoding_target": "gitops"}, roles=["alauda.spec_decoding.inference_service"])
    assert deploy["invalid"] == []
    (watch,) = inventory_problems({"spec_decoding_target": "gitops"}, roles=["alauda.spec_decoding.watch"])["invalid"]
    assert watch == "spec_decoding_target: 'gitops' must be one of cluster, schedule. Fix: set spec_decoding_target to one of them", watch
    # watch_target set as well: spec_decoding_target feeds nothing in that play
    assert inventory_problems({"spec_decoding_target": "gitops", "watch_target": "schedule"}, roles=["alauda.spec_decoding.watch"]) == {
        "unknown": [], "invalid": []}


def test_a_misspelt_variable_is_unknown_with_the_nearest_name():
    found = inventory_problems({"spec_decoding_num_speculative_tokens": 5, "spec_decoding_nmespace": "models", "ansible_host": "x"})
    assert found["invalid"] == []
    assert [m.split(":", 1)[0] for m in found["unknown"]] == ["spec_decoding_nmespace", "spec_decoding_num_speculative_tokens"]
    assert "rename it to spec_decoding_namespace" in found["unknown"][0]
    assert "spec_decoding_speculative: {num_speculative_tokens: 5}" in found["unknown"][1]


def test_eagle3_without_a_draft_from_s3_gets_an_s3_example():
    found = inventory_problems({"spec_decoding_artifacts": {"target_uri": "s3://models/llama-3.1-8b"}},
                               method="eagle3", method_source="playbooks/deploy-eagle3.yml (method eagle3)")
    (message,) = found["invalid"]
    assert message.startswith("playbooks/deploy-eagle3.yml (method eagle3): eagle3 needs a draft (EAGLE-3"), message
    assert "e.g. s3://models/llama-3.1-8b-eagle3-draft" in message, message
    # the method from the inventory when the playbook sets none
    found = inventory_problems({"spec_decoding_method": "draft_model", "spec_decoding_artifacts": {"target_uri": "pvc://store/llama"}})
    assert found["invalid"][0].startswith("spec_decoding_method: draft_model needs a draft"), found


@pytest.mark.parametrize("inventory", ["local", "example-airgapped", "example-connected"])
def test_the_example_inventories_pass(inventory):
    host_vars = {}
    for folder, _dirs, files in os.walk(os.path.join(REPO, "inventories", inventory, "group_vars")):
        for name in sorted(files):
            with open(os.path.join(folder, name)) as handle:
                host_vars.update(yaml.safe_load(handle) or {})
    assert host_vars
    # the deploy playbooks' roles: spec_decoding_target: gitops is right for them (watch.yml would refuse it, as its role does)
    assert inventory_problems(host_vars, roles=["alauda.spec_decoding.inventory_check", "alauda.spec_decoding.inference_service"]) == {
        "unknown": [], "invalid": []}


def test_not_hostvars_is_an_error():
    with pytest.raises(AnsibleFilterError, match="hostvars"):
        inventory_problems(["spec_decoding_method"])
