# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: strip_speculative_config
short_description: Remove vLLM's speculative-decoding flags from a container command or args list
version_added: 0.1.0
description:
  - Takes a list of strings (a container's C(command) or C(args)) and returns the same list without
    C(--speculative-config) and its value, in every form users write it
    (C(--speculative-config <json>), C(--speculative-config=<json>), C(-sc), C(--speculative_config),
    dotted keys such as C(--speculative-config.method), and the vLLM 0.22+ C(--spec-method),
    C(--spec-model), C(--spec-tokens)).
  - Inside a C(bash -c)/C(sh -c) script the flag and its value are cut out at the byte level, with the
    whitespace or the C(\) line continuation that held them, so the script stays valid; every other byte
    is unchanged.
  - Words are read as vLLM's own parser reads them (vLLM 0.32's option table), with abbreviations such as
    C(--speculative) or C(--spec-tok), C(-sc) with dotted keys (C(-sc.method ngram)); only the vLLM
    invocation's words are touched (an C(echo) or a prefetch script beside it keeps its words), and a flag's
    name inside another option's JSON value is text, not a flag.
  - Fails, naming the construct, when the command holds what the strip cannot resolve instead of returning a
    list that still runs speculative decoding - a flag inside an C(eval) string, C(${VAR:+...}), a variable whose
    value is not in O(env) where vLLM may read it as an option, a multi-value option that would take the
    positional model once the flag is gone.
  - A list without the flag comes back unchanged.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The command or args list.
    type: list
    elements: str
    required: true
  env:
    description:
      - The container's C(env) (Kubernetes' list of C(name)/C(value), or a dict), so that variables the script
        expands are read with the values the pod spec gives them.
    type: raw
    required: false
"""

EXAMPLES = r"""
- name: Predictor command without speculative decoding
  ansible.builtin.set_fact:
    rolled_back_command: "{{ isvc.spec.predictor.model.command | alauda.spec_decoding.strip_speculative_config }}"

# ['bash', '-c', "vllm serve /mnt/models --port 8080 --speculative-config '{\"method\":\"ngram\"}'"]
# becomes ['bash', '-c', 'vllm serve /mnt/models --port 8080']

- name: A script that expands container variables
  ansible.builtin.set_fact:
    rolled_back_command: >-
      {{ isvc.spec.predictor.model.command
         | alauda.spec_decoding.strip_speculative_config(env=isvc.spec.predictor.model.env | default([])) }}
"""

RETURN = r"""
_value:
  description: The list without the speculative flags.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit as vllm_edit
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.plain_data import plain_arguments


@plain_arguments  # plain data, not Ansible's lazy containers (plugin_utils/plain_data.py)
def strip_speculative_config(items, env=None):
    """list of str -> the same list without any speculative flag (refused when that cannot be vouched for)."""
    if items is None:
        return []
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise AnsibleFilterError(
            "strip_speculative_config: expects a list of strings (a container's command or args), got %s; "
            "pass the list itself, e.g. isvc.spec.predictor.model.command" % type(items).__name__)
    bad = [i for i, item in enumerate(items) if not isinstance(item, str)]
    if bad:
        raise AnsibleFilterError(
            "strip_speculative_config: element %d is %s, not a string; quote numbers in command/args lists"
            % (bad[0], type(items[bad[0]]).__name__))
    try:
        return vllm_edit.strip_checked([str(i) for i in items], env)
    except SpecDecodingError as exc:
        raise AnsibleFilterError("strip_speculative_config: %s" % exc) from exc


class FilterModule:
    """Command-editing filters."""

    def filters(self):
        return {"strip_speculative_config": strip_speculative_config}
