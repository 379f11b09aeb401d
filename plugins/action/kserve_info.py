# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kserve_info in the task's own process when the module would run on the controller anyway (a local connection).

Why: a deploy's reads (the CRD's release, the OCI mode, the current object, the runtime) are a few GETs, yet as a module
process they cost a redeploy 1.5-2 s, more than the server-side apply itself. When and how: plugin_utils/controller_module.py.
"""

from __future__ import annotations

# controller_module first: it serves the module's imports from the bytecode cache (plugin_utils/bytecode_cache.py)
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.controller_module import ControllerModuleAction
from ansible_collections.alauda.spec_decoding.plugins.modules import kserve_info


class ActionModule(ControllerModuleAction):
    CONTRACT = kserve_info.CONTRACT
