# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pvc_stage_plan in the task's own process when the module would run on the controller anyway (a local connection): the same
argument spec and ``execute``, without a module process. When and why: plugin_utils/controller_module.py."""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.modules import pvc_stage_plan
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import ControllerModuleAction


class ActionModule(ControllerModuleAction):
    CONTRACT = pvc_stage_plan.CONTRACT
