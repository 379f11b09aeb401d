"""Filter alauda.spec_decoding.credential_manifests: registration, both targets, errors that name the field."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.credential_manifests import FilterModule, credential_manifests

SETTINGS = {"namespace": "models", "service_account_name": "sa", "hf_token": "hf_secretvalue123456"}


def test_registered_name():
    assert FilterModule().filters()["credential_manifests"] is credential_manifests


def test_cluster_and_gitops():
    cluster = credential_manifests(SETTINGS)
    assert [s["metadata"]["name"] for s in cluster["secrets"]] == ["sa-hf"]
    gitops = credential_manifests(SETTINGS, "gitops")
    assert "hf_secretvalue123456" not in gitops["yaml"] and [m["kind"] for m in gitops["manifests"]] == ["ServiceAccount", "ExternalSecret"]


@pytest.mark.parametrize("settings, target, text", [
    ("not a dict", "cluster", "expects a dict"),
    (dict(SETTINGS, namespace="Bad_NS"), "cluster", "namespace:"),
    (SETTINGS, "helm", "target must be cluster or gitops"),
])
def test_errors(settings, target, text):
    with pytest.raises(AnsibleFilterError) as err:
        credential_manifests(settings, target)
    assert text in str(err.value) and "hf_secretvalue123456" not in str(err.value)
