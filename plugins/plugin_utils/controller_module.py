# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A module's ``execute`` run in the task's own process on the controller (the collection's action plugins).

Why: every module task costs a module process (a fork, a Python start, an AnsiballZ payload built, unzipped and
compiled, Ansible's module_utils imported: 0.5-1.5 s here, see docs/DEVELOPING.md "make bench"). A module whose work is
plain Python (isvc_manifest) or a few API reads made on the host the module would run on anyway (kserve_info over a
local connection) gives the same answer from the action plugin's process. The module file keeps the documentation, the
argument spec and ``execute``; `run_execute` validates the arguments with that same spec and calls that same
``execute``, so both answer alike (an error is the same ``msg``/``field``/``fix``).
"""

from __future__ import annotations

import json

from ansible.errors import AnsibleActionFail

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError


class _Failed(Exception):
    def __init__(self, result):
        super().__init__(result.get("msg"))
        self.result = result


class TaskModule:
    """What ``execute`` uses of an AnsibleModule (or the collection's KubeModule): the validated parameters, warn,
    fail_json and, for a cluster module, ``api_client``: kubernetes.core's authenticated client built from the auth
    options (and the ``K8S_AUTH_*`` variables) as KubeModule builds it, on first use."""

    def __init__(self, params):
        self.params = params
        self.warnings = []
        self._api_client = None

    def warn(self, warning):
        self.warnings.append(warning)

    def fail_json(self, **result):
        raise _Failed(result)

    @property
    def api_client(self):
        if self._api_client is None:
            # pylint: disable-next=import-outside-toplevel
            from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client
            self._api_client = get_api_client(**self.params).client.client
        return self._api_client


def run_execute(action, result, argument_spec, execute, unexpected=None, unexpected_types=Exception):
    """`result` (the action's own, from ``ActionBase.run``) updated with what ``execute`` answers, or its failure.
    `unexpected` and `unexpected_types` are the module's ``kube.module.run`` arguments: such an exception fails with
    ``"<unexpected>: <error>"`` as the module does; any other propagates, and Ansible reports it with its traceback, as
    it reports a module's."""
    try:
        dummy, params = action.validate_argument_spec(argument_spec=argument_spec)
    except AnsibleActionFail as exc:
        return dict(result, failed=True, changed=False, msg=str(exc))
    # Plain values, as a module process receives them: the templated strings are Ansible's tagged types, which the
    # manifest's YAML dumper (and anything else that checks types exactly) does not know.
    module = TaskModule(json.loads(json.dumps(params)))
    # kubernetes.core's CoreException (a kubeconfig it cannot load) is reported with its message, as its modules do.
    try:
        # pylint: disable-next=import-outside-toplevel
        from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException
    except ImportError:  # pragma: no cover - kubernetes.core is a dependency of the collection
        CoreException = ()  # pylint: disable=invalid-name
    try:
        result.update(execute(module))
    except SpecDecodingError as exc:
        result.update(exc.result(), failed=True)
    except _Failed as exc:
        result.update(exc.result, failed=True, changed=False)
    except Exception as exc:  # pylint: disable=broad-except
        # the order of kube.module.run: the module's own mapping, then kubernetes.core's CoreException
        if unexpected and isinstance(exc, unexpected_types):
            result.update(failed=True, changed=False, msg="%s: %s" % (unexpected, exc))
        elif isinstance(exc, CoreException):  # pylint: disable=isinstance-second-argument-not-valid-type
            result.update(failed=True, changed=False, msg=str(exc))
        else:
            raise
    if module.warnings:
        result["warnings"] = module.warnings
    return result
