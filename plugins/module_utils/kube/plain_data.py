# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plain Python data from what Ansible hands a plugin: the one place that turns it into builtin types.

Why: ansible-core 2.19 passes a filter its variables as lazy template containers (``_AnsibleLazyTemplateDict`` and
``_AnsibleLazyTemplateList``, with tagged ``str`` subclasses inside). ``copy.deepcopy`` of such a container copies its
templating context too: the baseline twin of a small LLMInferenceService made 1.4 million deepcopy calls and took 2-5 s
(14 s on a loaded machine) in ansible-playbook, against 0.1 s for the same object as plain dicts; and YAML's SafeDumper
does not represent the tagged subclasses at all. The collection's code deep-copies and dumps the objects it edits, so the
filters (plugin_utils/plain_data.plain_arguments) and the module_utils that take templated values (ops/alert_rules,
bench/routing_gitops) convert them with :func:`plain`. It sits in kube/, the lowest package district, so every district
may use it.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from collections.abc import Mapping


def plain(value):
    """``value`` as builtin dicts, lists, str, int, float, bool and None (a tuple becomes a list, as in JSON)."""
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or type(value) in (bool, int, float, str):  # pylint: disable=unidiomatic-typecheck
        return value
    for kind in (bool, str, int, float):  # bool before int: True is an int too
        if isinstance(value, kind):
            return kind(value)
    return value
