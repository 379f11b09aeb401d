# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The base the collection's modules run on, and the contract every module file declares (docs/module_template.py).

A module file declares its ``argument_spec()`` (fresh dicts on every call), its ``execute(module)`` and one
``CONTRACT = ModuleContract(argument_spec, execute, constraints=..., failure=..., cluster=...)``; its ``main()`` is
``CONTRACT.main()``. The collection's action plugins import that same ``CONTRACT`` to run ``execute`` in the task's own
process (plugin_utils/controller_module.py), so both ways a module runs read one declaration, and an exception from
``execute`` becomes the same failed result either way (`failure_result`).

The model is community.okd's ``AnsibleOpenshiftModule`` over kubernetes.core: ``KubeModule`` takes kubernetes.core's
auth options (doc fragment ``kubernetes.core.k8s_auth_options``) and builds the authenticated client from them once,
through kubernetes.core's ``get_api_client``, so kubeconfig, context, host, api_key, validate_certs, proxy and the
``K8S_AUTH_*`` variables behave exactly as in kubernetes.core's own modules. A module without a cluster
(``cluster=False``) runs on a plain ``AnsibleModule``.

Unlike the rest of module_utils this file imports Ansible: it is the seam between Ansible and the plain-Python logic.
"""

from __future__ import annotations

import copy
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError

_ISVC_WAIT = "ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.wait"

# The options of doc fragment alauda.spec_decoding.inference_service (an InferenceService the module reads or changes).
INFERENCE_SERVICE_ARG_SPEC = dict(
    name=dict(type="str", required=True),
    namespace=dict(type="str", required=True),
)


def wait_arg_spec(wait=False):
    """The options of doc fragment alauda.spec_decoding.inference_service.WAIT (Ready at the generation after a change);
    `wait` is the default of the option of that name (a module that documents another default says so in its own doc)."""
    return dict(
        wait=dict(type="bool", default=wait),
        wait_timeout=dict(type="int", default=1200),
        wait_sleep=dict(type="int", default=5),
        wait_crash_loop_restarts=dict(type="int", default=2),
    )


def plain_argspec(*blocks, **options):
    """A module's argument spec without kubernetes.core's auth options: the shared blocks (copied: each call returns
    fresh dicts, as ``ModuleContract.argument_spec`` must), then the module's own options."""
    spec = {}
    for block in blocks:
        spec.update(copy.deepcopy(block))
    spec.update(options)
    return spec


def argspec(*blocks, **options):
    """A cluster module's argument spec: the shared blocks, the module's own options, then kubernetes.core's auth options.

    The auth options come last, as every cluster module of the collection has always had them (an own option of the same
    name, such as a registry ``password``, is the auth option there). Each call returns fresh dicts.
    """
    spec = plain_argspec(*blocks, **options)
    spec.update(copy.deepcopy(AUTH_ARG_SPEC))
    return spec


def failure(exc, failed=None, timed_out=None):
    """fail_json's keys for a SpecDecodingError: the message (it already names the field and says the fix), ``field``,
    ``fix`` (when the error has one), ``changed=False``, then `failed`'s keys. An InferenceService that did not become
    Ready in time (isvc_wait.WaitTimeout) also returns the object as last read (``resource``) and its ``pods``, then
    `timed_out`'s keys."""
    out = exc.result()
    out.update(failed or {})
    # A WaitTimeout comes only from an imported isvc_wait; importing it here would import the kubernetes library into
    # every failing module, also those that never talk to a cluster.
    wait = sys.modules.get(_ISVC_WAIT)
    if wait is not None and isinstance(exc, wait.WaitTimeout):
        out.update(resource=exc.isvc, pods=exc.pods)
        out.update(timed_out or {})
    return out


def failure_result(exc, failed=None, timed_out=None, unexpected=None, unexpected_types=Exception):
    """The failed result an exception raised by a module's ``execute`` maps to: the one mapping of both ways a module
    runs (`run` in a module process, plugin_utils/controller_module.run_execute in the task's process). None for an
    exception that is a bug: it propagates, and Ansible reports it with its traceback.

    - SpecDecodingError: see `failure` (`failed` and `timed_out` add keys to it).
    - `unexpected` (the module's name): any other exception of `unexpected_types` fails with ``"<name>: <error>"`` and
      `failed`'s keys.
    - kubernetes.core's CoreException (a kubeconfig it cannot load): its message, as kubernetes.core's modules report it.
    """
    if isinstance(exc, SpecDecodingError):
        out = failure(exc, failed, timed_out)
    elif unexpected and isinstance(exc, unexpected_types):
        out = dict({"changed": False}, **(failed or {}))
        out["msg"] = "%s: %s" % (unexpected, to_text(exc))
    elif isinstance(exc, CoreException):
        out = {"changed": False, "msg": to_text(exc)}
    else:
        return None
    out["failed"] = True
    return out


def run(module, execute, failed=None, timed_out=None, unexpected=None, unexpected_types=Exception):
    """``exit_json(**execute(module))``; an exception `failure_result` maps ends in ``fail_json`` with that result
    instead of a traceback. `execute` may itself end the run with ``module.fail_json`` or ``module.exit_json``."""
    try:
        result = execute(module)
    except Exception as exc:  # pylint: disable=broad-except
        out = failure_result(exc, failed, timed_out, unexpected, unexpected_types)
        if out is None:
            raise
        # inside the except: ansible-core's fail_json takes the traceback of the exception being handled when its
        # tracebacks are on (as kubernetes.core's fail_from_exception gives it), so a module process adds nothing else
        module.fail_json(**out)
    module.exit_json(**result)


class ModuleContract:
    """What a module file declares once, read by both ways the module runs: its ``main()`` (``CONTRACT.main()``) and
    the action plugin that runs it in the task's process (``ControllerModuleAction`` with ``CONTRACT``).

    - `argument_spec`: a function returning the argument spec, fresh dicts on every call (one process may validate
      many tasks with it); `argspec(...)` for a module that takes kubernetes.core's auth options.
    - `execute(module)`: the module's one call into module_utils; returns the result dict.
    - `constraints`: AnsibleModule's keyword arguments between options (mutually_exclusive, required_if,
      required_one_of, required_together, required_by); the in-process path validates with them too.
    - `failure`: `failure_result`'s keyword arguments (failed, timed_out, unexpected, unexpected_types).
    - `cluster`: run on `KubeModule` (the auth options, ``api_client``, ``cluster``); False for a plain AnsibleModule.
    - `module_options`: KubeModule's own switches (check_k8s, check_pyyaml), for the module process only.
    Every module supports check mode (``supports_check_mode=True``), as its documentation's attributes say.
    """

    def __init__(self, argument_spec, execute, constraints=None, failure=None, cluster=True, module_options=None):
        self.argument_spec = argument_spec
        self.execute = execute
        self.constraints = dict(constraints or {})
        self.failure = dict(failure or {})
        self.cluster = cluster
        self.module_options = dict(module_options or {})

    def with_execute(self, execute):
        """The same contract around another ``execute`` (tests: one failure through both paths)."""
        return ModuleContract(self.argument_spec, execute, constraints=self.constraints, failure=self.failure,
                              cluster=self.cluster, module_options=self.module_options)

    def failure_result(self, exc):
        """`failure_result` with this module's keys."""
        return failure_result(exc, **self.failure)

    def ansible_module(self):
        """The module object of a module process: KubeModule or AnsibleModule, options validated."""
        if self.cluster:
            return KubeModule(self.argument_spec(), supports_check_mode=True, **dict(self.module_options, **self.constraints))
        return AnsibleModule(argument_spec=self.argument_spec(), supports_check_mode=True, **self.constraints)

    def main(self):
        """The module process: validate, ``execute``, exit with its result or the failure it maps to."""
        run(self.ansible_module(), self.execute, **self.failure)


class KubeModule(AnsibleK8SModule):
    """kubernetes.core's AnsibleK8SModule with the client built once, on first use, and the collection's error mapping.

    The client is not built in ``__init__`` (as community.okd does) but when ``api_client`` is first read: the options
    are checked and a run that needs no cluster (a log file, a definition given inline) neither imports the kubernetes
    library nor needs a kubeconfig.
    """

    def __init__(self, argument_spec, **kwargs):
        super().__init__(argument_spec=argument_spec, **kwargs)
        self._api_client = None
        self._cluster = None

    @property
    def api_client(self):
        """kubernetes.core's authenticated ``kubernetes.client.ApiClient`` for this run (the same one on every read)."""
        if self._api_client is None:
            if not self.settings["check_k8s"]:
                self.requires("kubernetes")  # checked in __init__ otherwise
            # pylint: disable-next=import-outside-toplevel
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import authenticated_api_client
            self._api_client = authenticated_api_client(module=self)
        return self._api_client

    @property
    def cluster(self):
        """The cluster service (kube/service.py) over ``api_client``: built once, the one way this run reaches the cluster."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.service import of_module  # pylint: disable=import-outside-toplevel
        return of_module(self)

    @property
    def no_log_values(self):
        """AnsibleModule's set of values masked in every output (a password read from a file at run time goes in it)."""
        return self._module.no_log_values

    def run(self, execute, failed=None, timed_out=None, unexpected=None, unexpected_types=Exception):
        """See the module-level `run`."""
        run(self, execute, failed=failed, timed_out=timed_out, unexpected=unexpected, unexpected_types=unexpected_types)
