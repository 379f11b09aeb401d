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

# controller_module first: it serves the module's imports from the bytecode cache (plugin_utils/bytecode_cache.py)
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import module_process_result, run_execute, runs_here
from ansible_collections.alauda.spec_decoding.plugins.modules import gitops_files


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = True
    CONTRACT = gitops_files.CONTRACT

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        if runs_here(self):
            return run_execute(self, result, self.CONTRACT)
        return module_process_result(self, result, task_vars)
