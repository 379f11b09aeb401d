"""A role's variables against its argument spec, one line each (issue 48): on this collection's own roles, read the way the
argument_check role reads them (roles/<role>/meta/argument_specs.yml and defaults/main.yml)."""
import os

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import role_arguments as ra
from tests.ansible_run import REPO

ROLES = sorted(r for r in os.listdir(os.path.join(REPO, "roles")) if os.path.isdir(os.path.join(REPO, "roles", r)))


def _problems(role, values, untemplated=None):
    options, sources = ra.role_spec(REPO, role)
    return [str(p) for p in ra.role_problems(role, values, options, sources, untemplated)]


def test_the_spec_and_the_inventory_variable_behind_each_role_variable():
    options, sources = ra.role_spec(REPO, "inference_service")
    assert options["inference_service_method"]["choices"][:3] == ["none", "ngram", "eagle3"]
    assert "description" not in options["inference_service_method"]
    assert sources["inference_service_method"] == "spec_decoding_method"
    assert ra.role_spec(REPO, "no_such_role") == ({}, {})


def test_a_value_from_the_inventory_is_named_by_the_inventory_variable():
    (line,) = _problems("inference_service", {"spec_decoding_method": "eagle-3", "inference_service_method": "eagle-3"})
    assert line == ("spec_decoding_method: 'eagle-3' must be one of none, ngram, eagle3, eagle, draft_model, mtp, suffix, custom_class "
                    "(read by alauda.spec_decoding.inference_service as inference_service_method). Fix: set spec_decoding_method: eagle3")


def test_a_role_variable_set_directly_is_named_by_itself():
    # spec_decoding_method says eagle3, but the play set the role's own variable, which wins
    (line,) = _problems("inference_service", {"spec_decoding_method": "eagle3", "inference_service_method": "eagl3"})
    assert line.startswith("inference_service_method: 'eagl3' must be one of ") and line.endswith(
        "(read by alauda.spec_decoding.inference_service). Fix: set inference_service_method: eagle3"), line


def test_a_wrong_type_says_the_type_and_an_example():
    (line,) = _problems("inference_service", {"inference_service_max_model_len": "8k"})
    assert line.startswith("inference_service_max_model_len: '8k' is not a valid int (") and "Fix: give a int" in line, line


def test_a_secret_is_never_shown():
    lines = _problems("artifact_credentials", {"artifact_credentials_registries": [{"username": "u", "password": "hunter2"}]})
    assert lines and all("hunter2" not in line for line in lines), lines
    assert lines[0].startswith("artifact_credentials_registries: '********' is not a valid list of dict (missing required arguments: server"), lines


def test_what_cannot_be_templated_and_what_is_required():
    lines = _problems("inference_service", {}, untemplated={"inference_service_namespace": "'ns' is undefined"})
    assert lines == ["inference_service_namespace: cannot be templated ('ns' is undefined) (read by alauda.spec_decoding.inference_service). "
                     "Fix: define what it refers to (spec_decoding_namespace), or give a plain value"], lines
    required = [name for name, rules in ra.role_spec(REPO, "canary")[0].items() if rules.get("required")]
    assert required, "canary has a required variable"
    assert _problems("canary", {})[0].startswith("%s: is required by alauda.spec_decoding.canary and not set. Fix: set %s" % (
        required[0], required[0]))


@pytest.mark.parametrize("role", [r for r in ROLES if r != "argument_check"])
def test_every_role_runs_the_argument_check_first(role):
    with open(os.path.join(REPO, "roles", role, "meta", "main.yml")) as handle:
        meta = yaml.safe_load(handle)
    first = meta["dependencies"][0]
    assert first == {"role": "alauda.spec_decoding.argument_check", "vars": {"argument_check_role": role}}, first
    assert ra.role_spec(REPO, role)[0], "%s has no argument spec to check" % role


def test_the_argument_check_runs_for_every_role_and_include():
    with open(os.path.join(REPO, "roles", "argument_check", "meta", "main.yml")) as handle:
        meta = yaml.safe_load(handle)
    assert meta["allow_duplicates"] is True and meta["dependencies"] == []


class _LazyLike(dict):
    """Stands for a variable's value as Ansible hands it over (a lazy container): deep-copying it copies its templar with
    every variable of the play, which the check must never do."""

    def __deepcopy__(self, memo):
        raise AssertionError("the value was deep-copied as it is, not as plain data")


class _LazyList(list):
    def __deepcopy__(self, memo):
        raise AssertionError("the list was deep-copied as it is, not as plain data")


def test_a_value_is_checked_as_plain_data_not_deep_copied_as_handed_over():
    rules = {"type": "dict", "options": {"pvc_name": {"type": "str"}, "items": {"type": "list", "elements": "int"}}}
    good = _LazyLike(pvc_name="models", items=_LazyList([1, 2]))
    assert ra.value_problem("spec_decoding_artifacts", "inference_service_artifacts", rules, good) is None
    bad = _LazyLike(pvc_name="models", items=_LazyList([1, "many"]))
    problem = ra.value_problem("spec_decoding_artifacts", "inference_service_artifacts", rules, bad)
    assert problem is not None and str(problem).startswith("spec_decoding_artifacts: ")
    plain = ra.plain(_LazyLike(a=_LazyList([1, (2, _LazyLike(b="c"))])))
    assert plain == {"a": [1, (2, {"b": "c"})]}
    # plain dicts and lists, not the containers handed over
    assert not isinstance(plain, _LazyLike) and not isinstance(plain["a"], _LazyList) and not isinstance(plain["a"][1][1], _LazyLike)
