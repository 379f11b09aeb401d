"""Run one of the collection's modules in the test process, the way ansible's module runner does.

ansible-core's own pattern for module unit tests: the arguments go in through `patch_module_args`, the module's
`exit_json`/`fail_json` print its result and raise SystemExit, and the printed JSON is the result. Against a real
kube-apiserver or a real HTTP server this tests the same code an `ansible-playbook` run would, without an interpreter
start, collection loading and an AnsiballZ payload per call (seconds each on 2 cores).

Use `tests.ansible_run.run_playbook` instead where the playbook, the role, templating or Ansible's own handling of the
result (no_log, check mode of a role, loops) is what the test is about.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json


class ModuleResult(dict):
    """The module's result dict; `failed` is True when it called fail_json."""

    @property
    def failed(self):
        return bool(self.get("failed"))

    @property
    def msg(self):
        return self.get("msg", "")

    @property
    def warning_messages(self):
        """The texts of the module's warnings (ansible-core 2.19 returns each as a dict holding an event)."""
        return [w if isinstance(w, str) else (w.get("event") or {}).get("msg", "") for w in self.get("warnings") or []]


def run_module(name, args, check_mode=False, diff=False):
    """Run `alauda.spec_decoding.<name>` (or a fully qualified `namespace.collection.name`) with `args`; returns a
    ModuleResult. `check_mode`/`diff` set what `--check`/`--diff` set for a task."""
    from ansible.module_utils.testing import patch_module_args  # pylint: disable=import-outside-toplevel
    from ansible.module_utils import _internal  # pylint: disable=import-outside-toplevel
    from ansible.module_utils.common import warnings  # pylint: disable=import-outside-toplevel
    fqcn = name if name.count(".") == 2 else "alauda.spec_decoding." + name
    namespace, collection, short = fqcn.split(".")
    module = importlib.import_module("ansible_collections.%s.%s.plugins.modules.%s" % (namespace, collection, short))
    args = dict(args)
    if check_mode:
        args["_ansible_check_mode"] = True
    if diff:
        args["_ansible_diff"] = True
    out = io.StringIO()
    # A module process starts with no warnings; in this process they would pile up from run to run.
    warnings._global_warnings.clear()  # pylint: disable=protected-access
    warnings._global_deprecations.clear()  # pylint: disable=protected-access
    # Nor is it the controller: once any test has imported controller code (ansible._internal sets is_controller), a
    # module's warn() would go to the controller's display instead of into its result.
    was_controller, _internal.is_controller = _internal.is_controller, False
    try:
        with patch_module_args(args), contextlib.redirect_stdout(out):
            try:
                module.main()
            except SystemExit:
                pass
    finally:
        _internal.is_controller = was_controller
    text = out.getvalue()
    start = text.find("{")
    if start < 0:
        return ModuleResult(failed=True, msg="the module printed no result: %r" % text[-2000:])
    return ModuleResult(json.loads(text[start:]))
