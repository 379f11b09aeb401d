"""When the kserve_info action plugin makes the reads in the task's own process and when it runs the module: only when the
module process would run on this machine, as this user, with this environment (the integration test
tests/integration/test_kserve_facts.py compares the two answers on the test bed)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ansible_collections.alauda.spec_decoding.plugins.action import kserve_info


def _action(transport="local", become=False, environment=None, async_val=0):
    return SimpleNamespace(_connection=SimpleNamespace(transport=transport), _play_context=SimpleNamespace(become=become),
                           _task=SimpleNamespace(environment=environment, async_val=async_val))


def test_a_local_connection_reads_in_the_task_process():
    assert kserve_info._same_as_module_process(_action()) is True  # pylint: disable=protected-access
    assert kserve_info._same_as_module_process(_action(environment=[{}])) is True  # pylint: disable=protected-access


@pytest.mark.parametrize("case", [
    dict(transport="ssh"),  # another host (or delegate_to one): its kubeconfig, its library
    dict(become=True),  # another user's kubeconfig
    dict(environment=[{"K8S_AUTH_CONTEXT": "other"}]),  # K8S_AUTH_* set for the module process only
    dict(async_val=30),
])
def test_anything_that_makes_the_module_process_differ_runs_the_module(case):
    assert kserve_info._same_as_module_process(_action(**case)) is False  # pylint: disable=protected-access


def test_without_the_kubernetes_library_on_the_controller_the_module_runs(monkeypatch):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(client, "HAS_KUBERNETES", False)
    assert kserve_info._same_as_module_process(_action()) is False  # pylint: disable=protected-access


def test_an_api_error_the_reads_do_not_handle_is_the_message_in_both_processes():
    """The module maps a dropped connection to "kserve_info: <error>" (kube.module.run's `unexpected`); the in-process
    run does the same with the same mapping, and lets anything else through as Ansible reports a module's traceback."""
    from ansible_collections.alauda.spec_decoding.plugins.modules import kserve_info as module  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import run_execute  # pylint: disable=import-outside-toplevel
    action = SimpleNamespace(validate_argument_spec=lambda argument_spec: (None, {"name": "llama", "namespace": "models"}))

    def refused(_module):
        raise ConnectionRefusedError(111, "Connection refused")

    res = run_execute(action, {}, {}, refused, **module.UNEXPECTED)
    assert res == {"failed": True, "changed": False, "msg": "kserve_info: [Errno 111] Connection refused"}

    def bug(_module):
        raise KeyError("spec")

    with pytest.raises(KeyError):
        run_execute(action, {}, {}, bug, **module.UNEXPECTED)
