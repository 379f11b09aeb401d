# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""isvc_manifest on the controller: the render is plain Python with no cluster, so it runs in the task's own process.

Why an action plugin: the render reads nothing and writes nothing, yet as a module every deploy paid a module process
for it (a fork, a Python start, an AnsiballZ payload unzipped and compiled: about 0.7 CPU s of a no-op redeploy, see
docs/DEVELOPING.md "make bench"). The module file keeps the documentation and its ``CONTRACT`` (argument spec,
``execute``, failure keys); this plugin runs that same ``CONTRACT`` (plugin_utils/controller_module.py), so both answer
alike.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

# controller_module first: it serves the module's imports from the bytecode cache (plugin_utils/bytecode_cache.py)
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import run_execute
from ansible_collections.alauda.spec_decoding.plugins.modules import isvc_manifest


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    CONTRACT = isvc_manifest.CONTRACT
    _VALID_ARGS = frozenset(CONTRACT.argument_spec())

    def run(self, tmp=None, task_vars=None):
        return run_execute(self, super().run(tmp, task_vars), self.CONTRACT)
