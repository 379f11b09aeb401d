# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""isvc_manifest on the controller: the render is plain Python with no cluster, so it runs in the task's own process.

Why an action plugin: the render reads nothing and writes nothing, yet as a module every deploy paid a module process
for it (a fork, a Python start, an AnsiballZ payload unzipped and compiled: about 0.7 CPU s of a no-op redeploy, see
docs/DEVELOPING.md "make bench"). The module file keeps the documentation, the argument spec and ``execute``; this
plugin validates the arguments with that same spec and calls that same ``execute``, so both answer alike.
"""

from __future__ import annotations

import json

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.modules.isvc_manifest import ARGUMENT_SPEC, execute


class _Failed(Exception):
    def __init__(self, result):
        super().__init__(result.get("msg"))
        self.result = result


class _TaskModule:
    """What ``execute`` uses of an AnsibleModule: the validated parameters, warn and fail_json."""

    def __init__(self, params):
        self.params = params
        self.warnings = []

    def warn(self, warning):
        self.warnings.append(warning)

    def fail_json(self, **result):
        raise _Failed(result)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        try:
            dummy, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        except AnsibleActionFail as exc:
            return dict(result, failed=True, changed=False, msg=str(exc))
        # Plain values, as a module process receives them: the templated strings are Ansible's tagged types, which the
        # manifest's YAML dumper (and anything else that checks types exactly) does not know.
        module = _TaskModule(json.loads(json.dumps(params)))
        try:
            result.update(execute(module))
        except SpecDecodingError as exc:
            result.update(exc.result(), failed=True)
        except _Failed as exc:
            result.update(exc.result, failed=True, changed=False)
        if module.warnings:
            result["warnings"] = module.warnings
        return result
