"""Inventory variables against what the collection reads (issue 48): unknown names with the nearest known one, the
inventory variable behind each role variable, a draft method without a draft. On a small collection made here, and on
this collection itself (every variable its example inventories set is known)."""
import glob
import json
import os
import re

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import inventory_variables as iv
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import role_arguments
from tests.ansible_run import REPO

SPEC = """---
argument_specs:
  main:
    short_description: x
    options:
      inference_service_method:
        type: str
        choices: [none, ngram, eagle3]
        description: The method.
      inference_service_max_model_len:
        type: int
        default: 8192
        description: Context.
"""
DEFAULTS = """---
inference_service_method: "{{ spec_decoding_method | default('none') }}"
inference_service_max_model_len: "{{ spec_decoding_max_model_len | default(8192) }}"
# the variable a default falls back from is its source, whatever the fallback
inference_service_name: "{{ spec_decoding_isvc_name | default(inventory_hostname ~ '-' ~ inference_service_method) }}"
"""


@pytest.fixture()
def small(tmp_path):
    """A collection with two roles and a playbook."""
    for path, text in {"roles/inference_service/meta/argument_specs.yml": SPEC, "roles/inference_service/defaults/main.yml": DEFAULTS,
                       "roles/canary/defaults/main.yml": "---\ncanary_steps: [10, 50, 100]\n",
                       "roles/canary/tasks/main.yml": "- ansible.builtin.set_fact:\n    canary_report: \"{{ canary_steps }}\"\n",
                       "playbooks/deploy.yml": "- hosts: \"{{ spec_decoding_hosts | default('all') }}\"\n"}.items():
        full = tmp_path / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)
    iv.catalog.cache_clear()
    return iv.catalog(str(tmp_path), cache=None)


def test_the_catalog_reads_names_sources_and_specs(small):
    assert small.prefixes == ("spec_decoding", "canary", "inference_service")
    assert {"spec_decoding_method", "spec_decoding_hosts", "canary_steps", "canary_report", iv.SETTING} <= small.known
    assert small.sources == {"spec_decoding_method": ["inference_service_method"], "spec_decoding_max_model_len": ["inference_service_max_model_len"],
                             "spec_decoding_isvc_name": ["inference_service_name"]}
    assert small.options["inference_service_method"] == ("inference_service", {"type": "str", "choices": ["none", "ngram", "eagle3"]})
    assert small.governed("canary_stepz") and not small.governed("ansible_host") and not small.governed("__canary_x")


def test_a_misspelt_variable_names_the_nearest_known_one(small):
    found = iv.unknown_variables(["spec_decoding_methd", "canary_stepz", "canary_steps", "ansible_host", "unrelated_name"], small)
    assert [p.field for p in found] == ["canary_stepz", "spec_decoding_methd"]
    assert all(isinstance(p, ValidationError) for p in found)
    assert "rename it to canary_steps" in str(found[0]) and "rename it to spec_decoding_method" in str(found[1]), found
    assert "spec_decoding_unknown_variables: warn" in str(found[1])
    # nothing close: no guess, still refused
    lone = iv.unknown_variables(["canary_zzzzzzzzzzzz"], small)
    assert "no known variable is close" in str(lone[0]) and "rename" not in str(lone[0])


def test_a_speculative_config_key_as_a_variable_points_at_spec_decoding_speculative(small):
    """The issue's case: spec_decoding_num_speculative_tokens: 5 changed nothing (the render kept k=3)."""
    (problem,) = iv.unknown_variables(["spec_decoding_num_speculative_tokens"], small, {"spec_decoding_num_speculative_tokens": 5})
    assert str(problem).startswith("spec_decoding_num_speculative_tokens: no role or playbook")
    assert "set spec_decoding_speculative: {num_speculative_tokens: 5}" in str(problem)


def test_each_value_is_checked_under_the_name_it_was_given(small):
    # an inventory variable through the role variable it feeds, a role variable set directly against its own spec
    assert iv.option_checks(["spec_decoding_method", "spec_decoding_max_model_len", "canary_steps"], small) == [
        ("spec_decoding_max_model_len", "inference_service_max_model_len"), ("spec_decoding_method", "inference_service_method")]
    # the role variable set too: the inventory variable feeds nothing, the role variable is checked
    assert iv.option_checks(["spec_decoding_method", "inference_service_method"], small) == [
        ("inference_service_method", "inference_service_method")]
    # only the roles the play runs
    assert iv.option_checks(["spec_decoding_method"], small, roles=["alauda.spec_decoding.canary"]) == []
    assert iv.option_checks(["spec_decoding_method"], small, roles=["alauda.spec_decoding.inference_service"]) == [
        ("spec_decoding_method", "inference_service_method")]


def test_one_line_messages():
    choice = str(role_arguments.choice_problem("spec_decoding_method", "eagle-3", ["none", "ngram", "eagle3", "eagle", "draft_model"]))
    assert choice == ("spec_decoding_method: 'eagle-3' must be one of none, ngram, eagle3, eagle, draft_model. "
                      "Fix: set spec_decoding_method: eagle3")
    typed = str(role_arguments.type_problem("spec_decoding_max_model_len", "8k", {"type": "int", "default": 8192}, "cannot be converted to an int"))
    assert typed == ("spec_decoding_max_model_len: '8k' is not a valid int (cannot be converted to an int). "
                     "Fix: give a int, e.g. spec_decoding_max_model_len: 8192")
    long_value = str(role_arguments.choice_problem("spec_decoding_method", "x" * 500, ["none"]))
    assert len(long_value) < 200 and "..." in long_value


@pytest.mark.parametrize("target,example", [
    ("s3://models/llama-3.1-8b", "s3://models/llama-3.1-8b-eagle3-draft"),
    ("pvc://model-store/llama/", "pvc://model-store/llama-eagle3-draft"),
    ("oci://registry.internal.example:5000/models/llama:v1", "oci://registry.internal.example:5000/models/llama-eagle3-draft:v1"),
    ("https://minio.internal.example/models/llama", "https://minio.internal.example/models/llama-eagle3-draft"),
])
def test_a_draft_method_without_a_draft_says_why_with_an_example_in_the_targets_scheme(target, example):
    problem = iv.draft_problem("eagle3", "spec_decoding_method", {"target_uri": target})
    text = str(problem)
    assert problem.field == "spec_decoding_method" and "eagle3 needs a draft (EAGLE-3 proposes tokens with a draft head" in text, text
    assert "no draft_uri" in text and "set spec_decoding_artifacts.draft_uri" in text and "e.g. %s," % example in text, text


def test_a_draft_is_not_asked_for_when_one_is_there_or_the_method_needs_none():
    assert iv.draft_problem("ngram", "spec_decoding_method", {"target_uri": "s3://m/llama"}) is None
    assert iv.draft_problem("eagle3", "m", {"target_uri": "s3://m/llama", "draft_uri": "s3://m/eagle3"}) is None
    assert iv.draft_problem("eagle3", "m", {"target_uri": "s3://m/llama", "pvc_name": "store"}) is None  # auto picks the PVC
    assert iv.draft_problem("eagle3", "m", {"target_uri": "s3://m/llama"}, staged=True) is None
    assert iv.draft_problem("eagle3", "m", {"target_uri": "s3://m/llama"}, built=True) is None
    assert iv.draft_problem("eagle3", "m", {"target_uri": "s3://m/llama"}, artifact_mode="pvc") is None
    assert iv.draft_problem("eagle3", "m", {"target_uri": "s3://m/llama"}, resource_kind="LLMInferenceService") is None
    assert iv.draft_problem("eagle3", "m", {"modelcar_image": "registry.internal.example/m:1"}) is None


def _inventory_names():
    names = set()
    for folder, _dirs, files in os.walk(os.path.join(REPO, "inventories")):
        for name in files:
            with open(os.path.join(folder, name)) as handle:
                data = yaml.safe_load(handle) or {}
            stack = [data]
            while stack:
                item = stack.pop()
                if isinstance(item, dict):
                    names.update(k for k in item if isinstance(k, str))
                    stack.extend(v for v in item.values() if isinstance(v, dict) and not any(k.startswith("spec_decoding_") for k in item))
    return names


def test_this_collection_knows_every_variable_its_inventories_and_docs_set():
    iv.catalog.cache_clear()
    cat = iv.catalog(REPO, cache=None)
    assert {"spec_decoding", "canary", "tune", "benchmark", "watch", "verify", "rollback", "stage_pvc"} <= set(cat.prefixes)
    assert cat.sources["spec_decoding_method"] == ["inference_service_method"]
    assert cat.options["inference_service_method"][1]["choices"][:3] == ["none", "ngram", "eagle3"]
    governed = sorted(n for n in _inventory_names() if cat.governed(n))
    assert governed, "no inventory variable found"
    assert [n for n in governed if n not in cat.known] == []
    # docs/playbooks.md's `name: value` examples
    with open(os.path.join(REPO, "docs", "playbooks.md")) as handle:
        documented = set(re.findall(r"^\s*(spec_decoding_[a-z0-9_]+):", handle.read(), re.M))
    assert documented and sorted(documented - cat.known) == []


def test_every_documented_inventory_variable_reaches_its_role_variable():
    """Each `spec_decoding_<x>` the README and docs name is read, and where the deploy role has `inference_service_<x>`,
    that role variable defaults to it (spec_decoding_wait was once documented and hard-coded in the role's defaults)."""
    iv.catalog.cache_clear()
    cat = iv.catalog(REPO, cache=None)
    documented = set()
    user_docs = [p for p in sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))) if not p.endswith("DEVELOPING.md")]  # code map
    for path in [os.path.join(REPO, "README.md")] + user_docs:
        with open(path, encoding="utf-8") as handle:
            documented |= set(re.findall(r"\b(spec_decoding_[a-z0-9_]+)\b", handle.read()))
    documented.discard("spec_decoding_num_speculative_tokens")  # docs/playbooks.md's example of a misspelt variable
    assert {"spec_decoding_method", "spec_decoding_wait", "spec_decoding_annotations"} <= documented
    assert sorted(n for n in documented if n not in cat.known) == []
    unmapped = []
    for name in sorted(documented):
        role_var = "inference_service_" + name[len("spec_decoding_"):]
        if role_var in cat.options and role_var not in (cat.sources.get(name) or []):
            unmapped.append((name, role_var))
    assert unmapped == []


def test_the_catalog_is_kept_until_one_of_its_files_changes(small, tmp_path):
    """The catalog comes from the cache only while every file it is read from is as it was: a planted entry under the
    stamp is what comes back; an edited role is read again."""
    root, cache = str(tmp_path), str(tmp_path / "cache" / "catalog.json")
    iv.catalog.cache_clear()
    first = iv.catalog(root, cache=cache)
    assert "canary_steps" in first.known and oct(os.stat(cache).st_mode & 0o777) == "0o600"
    (stamp,) = json.load(open(cache, encoding="utf-8"))
    kept = json.load(open(cache, encoding="utf-8"))[stamp]
    with open(cache, "w", encoding="utf-8") as handle:
        json.dump({stamp: dict(kept, known=kept["known"] + ["canary_planted"])}, handle)
    iv.catalog.cache_clear()
    assert "canary_planted" in iv.catalog(root, cache=cache).known  # not read again: the files did not change
    (tmp_path / "roles" / "canary" / "tasks" / "main.yml").write_text(
        "- ansible.builtin.set_fact:\n    canary_report: \"{{ canary_steps }} {{ canary_window }}\"\n")
    iv.catalog.cache_clear()
    again = iv.catalog(root, cache=cache)
    assert "canary_window" in again.known and "canary_planted" not in again.known
    assert again.options == first.options and again.sources == first.sources
    # an entry that is not what this code writes is read again from the files, not trusted
    (stamp,) = json.load(open(cache, encoding="utf-8"))
    with open(cache, "w", encoding="utf-8") as handle:
        json.dump({stamp: {"known": ["canary_planted"]}}, handle)
    iv.catalog.cache_clear()
    assert iv.catalog(root, cache=cache).known == again.known
