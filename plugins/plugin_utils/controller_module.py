# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A module's ``execute`` run in the task's own process on the controller (the collection's action plugins).

Why: every module task costs a module process (a fork, a Python start, an AnsiballZ payload built, unzipped and
compiled, Ansible's, kubernetes.core's and the collection's module_utils imported: 0.5-1.5 s here, see
docs/DEVELOPING.md "make bench"). A deploy, verify or rollback is a handful of such tasks, each a few API calls. A
module whose work is plain Python (isvc_manifest), or API calls made from the host the module would run on anyway (a
cluster module over a local connection), gives the same answer from the action plugin's process. The module file keeps
the documentation and its one ``CONTRACT`` (kube/module.py ``ModuleContract``: argument spec, constraints, failure
keys, ``execute``); `run_execute` validates the arguments with that same spec and constraints, calls that same
``execute`` and maps its failures with the same ``kube.module.failure_result``, so both answer alike (an error is the
same ``msg``/``field``/``fix``, no_log values are masked alike).

A cluster module's action plugin is `ControllerModuleAction` with the ``CONTRACT`` it imports from its module file
(``from ...plugins.modules import NAME`` then ``CONTRACT = NAME.CONTRACT``). Anything that would make the
module process differ runs the module as before (`same_as_module_process`): another connection (a remote host, or
``delegate_to`` one), ``become`` (another user's kubeconfig), a task ``environment`` (``K8S_AUTH_*`` set there),
``async``, or a controller Python without the kubernetes library.
"""

from __future__ import annotations

import gc
import importlib
import json

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.module_utils.common.parameters import remove_values
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import filter_loader, test_loader
from ansible.utils.vars import merge_hash

from ansible_collections.alauda.spec_decoding.plugins.plugin_utils import bytecode_cache

# The collection's files imported from here on (the module file, module_utils, filters, kubernetes.core's client) are read
# from their .pyc instead of compiled from source in every process (plugin_utils/bytecode_cache.py). An action plugin
# imports this file before its module file, so that its module is among them.
bytecode_cache.install()
# One filter of this collection: asking for it loads them all (load_jinja_plugins).
COLLECTION_FILTER = "alauda.spec_decoding.isvc_readiness"
_JINJA_PLUGINS_LOADED = []


class _Failed(Exception):
    def __init__(self, result):
        super().__init__(result.get("msg"))
        self.result = result


class TaskModule:
    """What ``execute`` uses of an AnsibleModule (or the collection's KubeModule): the validated parameters, check and
    diff mode, the no_log values, warn, fail_json and, for a cluster module, ``api_client``: kubernetes.core's
    authenticated client built from the auth options (and the ``K8S_AUTH_*`` variables) as KubeModule builds it, on
    first use, and ``cluster``, the cluster service over it."""

    def __init__(self, params, check_mode=False, diff=False, no_log_values=()):
        self.params = params
        self.check_mode = check_mode
        self._diff = diff
        # A value read at run time (a registry password from a file) is added here and masked in the result, as
        # AnsibleModule.no_log_values is.
        self.no_log_values = set(no_log_values)
        self.warnings = []
        self._api_client = None
        self._cluster = None

    def warn(self, warning):
        self.warnings.append(warning)

    def fail_json(self, **result):
        raise _Failed(result)

    @property
    def api_client(self):
        if self._api_client is None:
            # pylint: disable-next=import-outside-toplevel
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import authenticated_api_client
            self._api_client = authenticated_api_client(**self.params)
        return self._api_client

    @property
    def cluster(self):
        """The cluster service over ``api_client`` (kube/service.py), built once per task as KubeModule's."""
        # pylint: disable-next=import-outside-toplevel
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.service import of_module
        return of_module(self)


def run_execute(action, result, contract):
    """`result` (the action's own, from ``ActionBase.run``) updated with what the module's ``execute`` answers, or its
    failure.

    `contract` is the module's ``CONTRACT``: its arguments are validated with its argument spec and ``constraints``, and
    an exception from ``execute`` becomes the result ``kube.module.failure_result`` maps it to with the module's
    ``failure`` keys, as the module process's ``run`` does; any other propagates, and Ansible reports it with its
    traceback, as it reports a module's."""
    try:
        validation, params = action.validate_argument_spec(argument_spec=contract.argument_spec(), **contract.constraints)
    except AnsibleActionFail as exc:
        return dict(result, failed=True, changed=False, msg=str(exc))
    task = action._task  # pylint: disable=protected-access
    # Plain values, as a module process receives them: the templated strings are Ansible's tagged types, which the
    # manifest's YAML dumper (and anything else that checks types exactly) does not know.
    module = TaskModule(json.loads(json.dumps(params)), check_mode=bool(task.check_mode), diff=bool(task.diff),
                        no_log_values=validation._no_log_values)  # pylint: disable=protected-access
    try:
        result.update(contract.execute(module))
    except _Failed as exc:
        result.update(exc.result, failed=True, changed=False)
    except Exception as exc:  # pylint: disable=broad-except
        out = contract.failure_result(exc)
        if out is None:
            raise
        result.update(out)
    if module.warnings:
        result["warnings"] = module.warnings
    # AnsibleModule masks no_log values in everything it returns (exit_json and fail_json alike)
    return remove_values(result, module.no_log_values) if module.no_log_values else result


def load_jinja_plugins():
    """Load the collection's filters and ansible-core's own filters and tests in this process, once.

    Why: ansible-core 2.19 answers the first collection filter a process templates by importing every file of the
    collection's plugins/filter/ with the module_utils they import (ansible/plugins/loader.py,
    Jinja2Loader.get_with_context: a file may hold several filters, so it walks them all), and the first builtin filter
    or test by wrapping every one of them (Jinja2Loader._ensure_non_collection_wrappers). A task's worker is a fork of
    ansible-playbook and what it loads dies with it: each task whose template names a collection filter (the deploy's
    apply ``failed_when``, its wait condition) paid 0.1-0.25 s for that again, and a ``| bool`` or ``is skipped`` the
    wrappers. Called from `ControllerModuleAction` when ansible-playbook's strategy loads the first such action plugin,
    before it forks that task's worker: every later worker inherits them. Only a speed-up: when this process cannot
    load them (no collection loader: a plain Python import of the plugin), the worker loads them as before."""
    if _JINJA_PLUGINS_LOADED:
        return
    _JINJA_PLUGINS_LOADED.append(True)
    try:
        filter_loader.get(COLLECTION_FILTER)
        filter_loader.get("ansible.builtin.bool")
        test_loader.get("ansible.builtin.skipped")
    except (AnsibleError, KeyError, ImportError):
        pass


def runs_here(action):
    """Whether the module process would run on this machine, as this user, with this environment, synchronously."""
    task = action._task  # pylint: disable=protected-access
    return (action._connection.transport == "local" and not action._play_context.become  # pylint: disable=protected-access
            and not any(task.environment or []) and not task.async_val)


def module_process_result(action, result, task_vars):
    """``result`` merged with the module process's: what ansible.builtin.normal does for a module without an action
    plugin (the task goes elsewhere, as another user, with its own environment, or async)."""
    wrap_async = action._task.async_val and not action._connection.has_native_async  # pylint: disable=protected-access
    result = merge_hash(result, action._execute_module(task_vars=task_vars, wrap_async=wrap_async))  # pylint: disable=protected-access
    if not wrap_async:
        action._remove_tmp_path(action._connection._shell.tmpdir)  # pylint: disable=protected-access
    return result


def same_as_module_process(action):
    """Whether the module process would run here, as this user, with this environment, and could import kubernetes."""
    if not runs_here(action):
        return False
    # Imported here, not at the top: isvc_manifest's plugin imports this file too, and a render needs no kubernetes
    # library (a cluster module's plugin has imported it already, see ControllerModuleAction).
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client  # pylint: disable=import-outside-toplevel
    return client.HAS_KUBERNETES


class ControllerModuleAction(ActionBase):
    """A cluster module's action plugin: ``CONTRACT``'s ``execute`` in the task's process when the module process would
    run on this machine anyway, the module otherwise.

    The module file (and with it the kubernetes library and kubernetes.core's client, 0.6-0.9 CPU s) is imported with
    the action plugin, which imports its ``CONTRACT``: the strategy imports an action plugin in ansible-playbook's own
    process before it forks the task's worker, so every later task of the run inherits those imports instead of paying
    them again. A run whose tasks all go to remote hosts pays that once, in ansible-playbook."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = True  # an async task runs the module, as ansible.builtin.normal runs it
    CONTRACT = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.CONTRACT is None:
            raise TypeError("%s: a ControllerModuleAction names its module's CONTRACT (CONTRACT = <module>.CONTRACT)" % cls.__module__)
        # TaskModule.api_client's (it imports the kubernetes library's dynamic client)
        importlib.import_module("ansible_collections.kubernetes.core.plugins.module_utils.k8s.client")
        load_jinja_plugins()
        # What ansible-playbook has loaded up to here (the module file, the kubernetes library, the filters) lives as long
        # as the process: gc.freeze() moves it out of the cyclic collector's generations, so that neither ansible-playbook's
        # own full collections nor those of each worker it forks walk those objects again (the fork case of Python's
        # gc.freeze documentation). A no-op redeploy used 0.45 CPU s less (2.83 -> 2.36, 5 interleaved runs on the test bed).
        # Frozen objects are still freed by reference counting; a reference cycle among them is kept until the process exits.
        gc.freeze()

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        if not same_as_module_process(self):
            return module_process_result(self, result, task_vars)
        return run_execute(self, result, self.CONTRACT)
