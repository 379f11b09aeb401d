# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""draft_preflight_info in the task's own process when the module would run on the controller anyway (a local connection).

Why: the deploy runs it on every rollout before anything is written, and a PVC location makes it a cluster module (the
claim's GET, the read Job): as a module process it would pay the kubernetes library's import on each deploy, which the
task's process has paid once. When and how: plugin_utils/controller_module.py.
"""

from __future__ import annotations

# controller_module first: it serves the module's imports from the bytecode cache (plugin_utils/bytecode_cache.py)
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import ControllerModuleAction
from ansible_collections.alauda.spec_decoding.plugins.modules import draft_preflight_info


class ActionModule(ControllerModuleAction):
    CONTRACT = draft_preflight_info.CONTRACT
