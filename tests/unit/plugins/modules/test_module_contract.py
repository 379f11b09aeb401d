"""Every module file follows the one contract (kube/module.py ``ModuleContract``, docs/module_template.py): an
``argument_spec()`` of fresh dicts, an ``execute(module)``, one ``CONTRACT`` naming both with its constraints and
failure keys, and a ``main()`` that is ``CONTRACT.main()``; and one failure raised by ``execute`` comes back as the same
result from the module process's path (``CONTRACT.main()``, run as tests/module_run.py runs a module) and from the
task-process path (plugin_utils/controller_module.run_execute, with ActionBase's own argument validation)."""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import os
from types import SimpleNamespace

import pytest
import yaml
from ansible.plugins.action import ActionBase
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import run_execute
from tests.module_run import run_module

MODULES_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "plugins", "modules")
NAMES = sorted(f[:-3] for f in os.listdir(MODULES_DIR) if f.endswith(".py") and f != "__init__.py")
# docs/module_template.py is held to the same contract, so what a newcomer copies is what the modules do.
TEMPLATE = "module_template"
TEMPLATE_PATH = os.path.join(MODULES_DIR, "..", "..", "docs", "module_template.py")
CONSTRAINT_KEYS = {"mutually_exclusive", "required_together", "required_one_of", "required_if", "required_by"}
FAILURE_KEYS = {"failed", "timed_out", "unexpected", "unexpected_types"}
# What a module process adds that the task's process does not: the arguments echoed back.
MODULE_PROCESS_ONLY = ("invocation",)

# The fewest arguments each module's validation accepts (its required options and constraints met); execute is
# replaced by one that raises, so nothing is read or written.
VALID_ARGS = {
    "canary_observe_info": {"name": "a", "namespace": "b"},
    "canary_rollout": {"name": "a", "namespace": "b", "state": "absent"},
    "draft_artifacts": {"name": "a", "namespace": "b"},
    "draft_preflight_info": {"method": "ngram"},
    "engine_config_info": {"log_text": "no engine line"},
    "fleet_speculative_info": {},
    "gitops_files": {"path": "/nonexistent"},
    "gitops_owner_info": {"name": "a", "namespace": "b"},
    "gitops_publish": {"repo_url": "https://git.example/r.git", "branch": "main", "src": "/nonexistent"},
    "gitops_speculative": {"repo_url": "https://git.example/r.git", "branch": "main", "name": "a", "namespace": "b"},
    "gitops_sync": {"state": "resumed", "name": "a", "namespace": "b"},
    "isvc_manifest": {"name": "a", "namespace": "b", "runtime": "vllm"},
    "isvc_speculative": {"name": "a", "namespace": "b"},
    "isvc_wait": {"name": "a", "namespace": "b"},
    "job_outcome_info": {"name": "a", "namespace": "b"},
    "kserve_info": {"name": "a", "namespace": "b"},
    "llmisvc_engine_config_info": {"name": "a", "namespace": "b"},
    "llmisvc_speculative": {"name": "a", "namespace": "b"},
    "modelcar_image": {"target_dir": "/nonexistent"},
    "object_info": {"kind": "Pod", "name": "a", "namespace": "b"},
    "object_state": {"state": "absent", "kind": "Pod", "name": "a", "namespace": "b"},
    "pvc_stage_plan": {"pvc_name": "models", "items": []},
    "request_class_routing_info": {"gateway_url": "http://a", "route": {}},
    "server_side_apply": {"definition": {}, "field_manager": "m"},
    "serving_runtime_info": {"namespace": "b", "name": "vllm"},
    "spec_benchmark": {"report_dir": "/nonexistent", "baseline_url": "http://a", "candidate_url": "http://b"},
    "spec_sweep": {"report_dir": "/nonexistent", "baseline_url": "http://a", "candidate_url": "http://b", "request_rates": [1.0]},
    "speculative_config": {"config": {"method": "ngram"}},
    "speculative_metrics_info": {"log_text": "no metrics"},
    "speculative_watchdog": {"name": "a", "namespace": "b"},
    "troubleshoot_bundle": {"names": ["a"], "dest": "/nonexistent"},
}


def _module(name):
    if name == TEMPLATE:
        spec = importlib.util.spec_from_file_location("module_template", TEMPLATE_PATH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module("ansible_collections.alauda.spec_decoding.plugins.modules." + name)


def _top_level(name):
    with open(TEMPLATE_PATH if name == TEMPLATE else os.path.join(MODULES_DIR, name + ".py"), encoding="utf-8") as handle:
        return ast.parse(handle.read()).body


def test_every_module_is_in_the_table_of_valid_arguments():
    assert sorted(VALID_ARGS) == NAMES


@pytest.mark.parametrize("name", NAMES + [TEMPLATE])
def test_the_module_declares_the_contract(name):
    module = _module(name)
    contract = module.CONTRACT
    assert isinstance(contract, ModuleContract)
    assert contract.argument_spec is module.argument_spec and contract.execute is module.execute
    first, second = module.argument_spec(), module.argument_spec()
    assert first == second and first is not second, "argument_spec() returns fresh dicts on every call"
    assert all(first[k] is not second[k] for k in first if isinstance(first[k], dict))
    assert set(contract.constraints) <= CONSTRAINT_KEYS, sorted(contract.constraints)
    assert set(contract.failure) <= FAILURE_KEYS, sorted(contract.failure)
    assert contract.failure.get("unexpected") in (None, name), "an unexpected error is named after its module"
    if name == TEMPLATE:
        # validate-modules checks a module's documentation against its spec; the template is not a module, so here:
        # the options it documents itself are options of its spec, and its EXAMPLES and RETURN parse
        documented = yaml.safe_load(module.DOCUMENTATION)
        assert set(documented["options"]) <= set(module.argument_spec())
        assert yaml.safe_load(module.EXAMPLES) and yaml.safe_load(module.RETURN)
    assert set(contract.module_options) <= {"check_k8s", "check_pyyaml"} and (contract.cluster or not contract.module_options)
    # the option names a constraint speaks of are options of the spec
    named = set()
    for key, rules in contract.constraints.items():
        for rule in (rules.items() if key == "required_by" else rules):
            if key == "required_if":
                named.update([rule[0], *rule[2]])
            elif key == "required_by":
                named.update([rule[0], *rule[1]])
            else:
                named.update(rule)
    assert named <= set(first), sorted(named - set(first))


@pytest.mark.parametrize("name", NAMES + [TEMPLATE])
def test_the_module_file_has_one_shape(name):
    """No second way: no CONSTRAINTS/RUN/ARGUMENT_SPEC beside the contract, no module object built outside it, and a
    main() that is CONTRACT.main()."""
    body = _top_level(name)
    assigned = {t.id for node in body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    assert "CONTRACT" in assigned and not assigned & {"CONSTRAINTS", "RUN", "ARGUMENT_SPEC"}
    functions = {node.name: node for node in body if isinstance(node, ast.FunctionDef)}
    assert {"argument_spec", "execute", "main"} <= set(functions)
    assert ast.unparse(functions["main"].body[-1]) == "CONTRACT.main()" and len(functions["main"].body) == 1
    calls = {ast.unparse(node.func) for node in ast.walk(ast.Module(body=body, type_ignores=[])) if isinstance(node, ast.Call)}
    assert not calls & {"AnsibleModule", "KubeModule", "run"}, name


def _raise(exc):
    def execute(_module):
        raise exc
    return execute


def _failures(contract):
    """One exception of each kind the contract maps, and the key facts each must come back with."""
    cases = [
        ("refusal", ValidationError("must be a mapping", field="config", hint="give a dict")),
        ("timeout", isvc_wait.WaitTimeout("InferenceService b/a not Ready at generation 2 after 5 s",
                                          {"metadata": {"name": "a", "generation": 2}}, [{"name": "a-pod", "phase": "Pending"}])),
        ("kubeconfig", CoreException("Could not create API client: Invalid kube-config file")),
    ]
    if contract.failure.get("unexpected"):
        types = contract.failure.get("unexpected_types", Exception)
        if not isinstance(types, tuple):
            types = (types,)
        # OSError is one of kserve_info's API errors and the load generators' (a report file), RuntimeError any other's
        cases.append(("unexpected", OSError(28, "No space left on device") if any(issubclass(OSError, t) for t in types)
                      else RuntimeError("socket closed")))
    return cases


def _in_task_process(name, contract, args):
    """run_execute with ActionBase's own validate_argument_spec, as a collection action plugin runs it."""
    action = SimpleNamespace(_task=SimpleNamespace(args=dict(args), check_mode=False, diff=False), _load_name=name)
    action.validate_argument_spec = functools.partial(ActionBase.validate_argument_spec, action)
    return run_execute(action, {}, contract)


@pytest.mark.parametrize("name", NAMES)
def test_one_failure_maps_to_the_same_result_in_both_processes(name, monkeypatch):
    module = _module(name)
    args = VALID_ARGS[name]
    for kind, exc in _failures(module.CONTRACT):
        contract = module.CONTRACT.with_execute(_raise(exc))
        monkeypatch.setattr(module, "CONTRACT", contract)
        as_module = dict(run_module(name, args))
        in_process = _in_task_process(name, contract, args)
        assert as_module["failed"] is True and in_process["failed"] is True, (name, kind, as_module, in_process)
        comparable = {k: v for k, v in as_module.items() if k not in MODULE_PROCESS_ONLY}
        assert comparable == in_process, (name, kind)
        if kind == "refusal":
            assert in_process["field"] == "config" and in_process["fix"] == "give a dict"
            assert in_process["msg"] == "config: must be a mapping. Fix: give a dict"
        if kind == "timeout":
            assert in_process["pods"] == [{"name": "a-pod", "phase": "Pending"}] and in_process["resource"]["metadata"]["generation"] == 2
        if kind == "unexpected":
            assert in_process["msg"].startswith(name + ": ")
        if kind == "kubeconfig":
            # kubernetes.core's message; a module whose `unexpected` takes any exception names itself first
            unexpected = module.CONTRACT.failure.get("unexpected_types", Exception) is Exception and module.CONTRACT.failure.get("unexpected")
            assert in_process["msg"] == ("%s: " % name if unexpected else "") + "Could not create API client: Invalid kube-config file"
    monkeypatch.undo()


def test_a_bug_propagates_from_both_paths(monkeypatch):
    """An exception the contract does not map is a bug: a traceback from both, never a made-up message."""
    module = _module("isvc_wait")
    contract = module.CONTRACT.with_execute(_raise(KeyError("spec")))
    with pytest.raises(KeyError):
        _in_task_process("isvc_wait", contract, VALID_ARGS["isvc_wait"])
    monkeypatch.setattr(module, "CONTRACT", contract)
    with pytest.raises(KeyError):
        run_module("isvc_wait", VALID_ARGS["isvc_wait"])


def test_an_invalid_argument_is_refused_before_execute_in_both_paths(monkeypatch):
    """The constraints are the contract's in both paths: speculative_config's config and preset together."""
    module = _module("speculative_config")
    ran = []
    contract = module.CONTRACT.with_execute(lambda m: ran.append(m) or {"changed": False})
    monkeypatch.setattr(module, "CONTRACT", contract)
    args = {"config": {"method": "ngram"}, "preset": sorted(module.core.PRESETS)[0]}
    as_module = run_module("speculative_config", args)
    in_process = _in_task_process("speculative_config", contract, args)
    assert as_module.failed and in_process["failed"] and not ran
    assert "mutually exclusive: config|preset" in as_module.msg and "mutually exclusive: config|preset" in in_process["msg"]
