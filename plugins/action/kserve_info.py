# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kserve_info in the task's own process when the module would run on the controller anyway (a local connection).

Why: a deploy's reads (the CRD's release, the OCI mode, the current object, the runtime) are a few GETs, yet as a module
process they cost a redeploy 1.5-2 s (a Python start, the AnsiballZ payload with the render's module_utils, Ansible's
and kubernetes.core's module_utils): more than the server-side apply itself (docs/DEVELOPING.md "make bench"). Over a
local connection the module would run on this machine, as this user, with the environment ansible-playbook has; the
action plugin makes the same reads with the same kubernetes.core client from the same options and ``K8S_AUTH_*``
variables, through the module's own argument spec and ``execute`` (plugin_utils/controller_module.py).

Anything that would make the module process differ runs the module as before: another connection (a remote host, or
``delegate_to`` one), ``become`` (another user's kubeconfig), a task ``environment`` (``K8S_AUTH_*`` set there), ``async``,
or a controller Python without the kubernetes library.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import run_execute


def _same_as_module_process(action):
    """Whether the module process would run here, as this user, with this environment."""
    task = action._task  # pylint: disable=protected-access
    if (action._connection.transport != "local" or action._play_context.become  # pylint: disable=protected-access
            or any(task.environment or []) or task.async_val):
        return False
    # Imported here, not at the top: the strategy imports this file to look at the class, and a task that runs the
    # module on another host should not load the kubernetes library into ansible-playbook.
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client  # pylint: disable=import-outside-toplevel
    return client.HAS_KUBERNETES


def _module():
    """The module's argument spec and execute (its import reads the kubernetes library: see _same_as_module_process)."""
    from ansible_collections.alauda.spec_decoding.plugins.modules import kserve_info  # pylint: disable=import-outside-toplevel
    return kserve_info.argument_spec(), kserve_info.execute, kserve_info.UNEXPECTED


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        if not _same_as_module_process(self):
            result.update(self._execute_module(task_vars=task_vars))
            return result
        spec, execute, unexpected = _module()
        return run_execute(self, result, spec, execute, **unexpected)
