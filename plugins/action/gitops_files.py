# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gitops_files on the controller: the files are written in the task's own process when the module would write them on
this machine, as this user, anyway.

Why: the roles wrote each GitOps file with ``ansible.builtin.copy`` (two module processes per file: stat, then copy) and
listed the directory with ``find``; one module process per file write is about 0.5 CPU s on the test bed's two cores.
The module file keeps the documentation and its ``CONTRACT``; this plugin runs that same ``CONTRACT``
(plugin_utils/controller_module.run_execute), so both answer alike. Not ``ControllerModuleAction``: that one imports the
kubernetes library for its cluster modules, and writing files needs none.

Another connection (the files belong on that host), ``become`` (another user's files and umask), a task
``environment`` or ``async`` run the module process, as ``ansible.builtin.normal`` would.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash

# controller_module first: it serves the module's imports from the bytecode cache (plugin_utils/bytecode_cache.py)
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import run_execute
from ansible_collections.alauda.spec_decoding.plugins.modules import gitops_files


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = True
    CONTRACT = gitops_files.CONTRACT

    def _on_controller(self):
        task = self._task
        return (self._connection.transport == "local" and not self._play_context.become
                and not any(task.environment or []) and not task.async_val)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        if self._on_controller():
            return run_execute(self, result, self.CONTRACT)
        wrap_async = self._task.async_val and not self._connection.has_native_async
        result = merge_hash(result, self._execute_module(task_vars=task_vars, wrap_async=wrap_async))
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)  # pylint: disable=protected-access
        return result
