"""When a collection action plugin runs its module's ``execute`` in the task's own process and when it runs the module:
only when the module process would run on this machine, as this user, with this environment; and that the in-process
run answers as the module does (constraints, error keys, check and diff mode, no_log masking). The integration tests
compare the two answers on the test bed (tests/integration/test_kserve_facts.py, test_controller_actions.py)."""
from __future__ import annotations

import importlib
import os
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract
from ansible_collections.alauda.spec_decoding.plugins.modules import isvc_speculative, isvc_wait, kserve_info
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils import controller_module
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import run_execute

ACTIONS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "plugins", "action")


def _action(transport="local", become=False, environment=None, async_val=0):
    return SimpleNamespace(_connection=SimpleNamespace(transport=transport), _play_context=SimpleNamespace(become=become),
                           _task=SimpleNamespace(environment=environment, async_val=async_val))


def test_a_local_connection_reads_in_the_task_process():
    assert controller_module.same_as_module_process(_action()) is True
    assert controller_module.same_as_module_process(_action(environment=[{}])) is True


@pytest.mark.parametrize("case", [
    dict(transport="ssh"),  # another host (or delegate_to one): its kubeconfig, its library
    dict(become=True),  # another user's kubeconfig
    dict(environment=[{"K8S_AUTH_CONTEXT": "other"}]),  # K8S_AUTH_* set for the module process only
    dict(async_val=30),
])
def test_anything_that_makes_the_module_process_differ_runs_the_module(case):
    assert controller_module.same_as_module_process(_action(**case)) is False


def test_without_the_kubernetes_library_on_the_controller_the_module_runs(monkeypatch):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(client, "HAS_KUBERNETES", False)
    assert controller_module.same_as_module_process(_action()) is False


class _Validating:
    """An action whose validate_argument_spec is Ansible's own validator, as ActionBase's is."""

    def __init__(self, args, check_mode=False, diff=False):
        self.args = args
        self._task = SimpleNamespace(check_mode=check_mode, diff=diff)

    def validate_argument_spec(self, argument_spec, **constraints):
        validation = ArgumentSpecValidator(argument_spec, **constraints).validate(self.args)
        if validation.error_messages:
            raise AnsibleActionFail("Validation of arguments failed:\n%s" % "\n".join(validation.error_messages))
        return validation, validation.validated_parameters


def test_an_api_error_the_reads_do_not_handle_is_the_message_in_both_processes():
    """The module maps a dropped connection to "kserve_info: <error>" (its CONTRACT's failure keys); the in-process
    run does the same with the same mapping, and lets anything else through as Ansible reports a module's traceback."""
    action = _Validating({"name": "llama", "namespace": "models"})

    def refused(_module):
        raise ConnectionRefusedError(111, "Connection refused")

    res = run_execute(action, {}, kserve_info.CONTRACT.with_execute(refused))
    assert res == {"failed": True, "changed": False, "msg": "kserve_info: [Errno 111] Connection refused"}

    def bug(_module):
        raise KeyError("spec")

    with pytest.raises(KeyError):
        run_execute(action, {}, kserve_info.CONTRACT.with_execute(bug))


def test_the_modules_constraints_refuse_in_the_task_process_as_in_the_module():
    """isvc_speculative's mutually_exclusive and required_if (its CONTRACT's constraints) reach the in-process
    validation, before execute runs."""
    ran = []
    contract = isvc_speculative.CONTRACT.with_execute(lambda m: ran.append(m) or {})
    res = run_execute(_Validating({"name": "a", "namespace": "b", "config": {"method": "ngram"}, "restore_backup": "x"}), {}, contract)
    assert res["failed"] and "mutually exclusive: config|restore_backup" in res["msg"] and not ran
    res = run_execute(_Validating({"name": "a", "namespace": "b", "backup": "file"}), {}, isvc_speculative.CONTRACT)
    assert res["failed"] and "backup is file but all of the following are missing: backup_file" in res["msg"]


def test_a_refusal_and_a_timeout_carry_the_modules_own_keys():
    """isvc_wait's failure keys: a refusal returns ready false and an empty resource, as the module's fail_json does."""
    def refuse(_module):
        raise SpecDecodingError("not found", field="name", hint="create it")

    res = run_execute(_Validating({"name": "a", "namespace": "b"}), {}, isvc_wait.CONTRACT.with_execute(refuse))
    assert res == {"failed": True, "changed": False, "msg": "name: not found. Fix: create it", "field": "name", "fix": "create it",
                   "ready": False, "resource": {}}


def test_check_and_diff_mode_reach_execute_and_no_log_values_are_masked():
    seen = {}
    spec = {"name": {"type": "str"}, "password": {"type": "str", "no_log": True}}

    def execute(module):
        seen.update(check=module.check_mode, diff=module._diff)  # pylint: disable=protected-access
        module.no_log_values.add("read-at-run-time")
        module.warn("the password is s3cret")
        return {"changed": False, "echo": "s3cret", "file": "read-at-run-time"}

    res = run_execute(_Validating({"name": "a", "password": "s3cret"}, check_mode=True, diff=True), {},
                      ModuleContract(lambda: spec, execute))
    assert seen == {"check": True, "diff": True}
    assert "s3cret" not in repr(res) and "read-at-run-time" not in repr(res)
    assert res["echo"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" and res["warnings"] == ["the password is ********"]


def test_every_action_plugin_runs_the_contract_its_module_file_declares():
    """Each action plugin imports its module file and runs that file's CONTRACT, the one main() runs: a
    ControllerModuleAction by the module of its own name; isvc_manifest's plugin always in-process, gitops_files's on a
    local connection (no cluster: it does not import the kubernetes library)."""
    names = sorted(f[:-3] for f in os.listdir(ACTIONS) if f.endswith(".py") and f != "__init__.py")
    checked = 0
    for name in names:
        action = importlib.import_module("ansible_collections.alauda.spec_decoding.plugins.action." + name).ActionModule
        module = importlib.import_module("ansible_collections.alauda.spec_decoding.plugins.modules." + name)
        assert action.CONTRACT is module.CONTRACT, name
        assert issubclass(action, controller_module.ControllerModuleAction) == (name not in ("isvc_manifest", "gitops_files")), name
        checked += 1
    assert checked >= 19


def test_a_controller_action_without_a_contract_is_refused_when_defined():
    with pytest.raises(TypeError, match="CONTRACT"):
        type("ActionModule", (controller_module.ControllerModuleAction,), {})
