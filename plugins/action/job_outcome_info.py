# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""job_outcome_info in the task's own process when the module would run on the controller anyway (a local connection): the same
argument spec and ``execute``, without a module process. When and why: plugin_utils/controller_module.py."""

from __future__ import annotations

# controller_module first: it serves the module's imports from the bytecode cache (plugin_utils/bytecode_cache.py)
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import ControllerModuleAction
from ansible_collections.alauda.spec_decoding.plugins.modules import job_outcome_info


class ActionModule(ControllerModuleAction):
    CONTRACT = job_outcome_info.CONTRACT
