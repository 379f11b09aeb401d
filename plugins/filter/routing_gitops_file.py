# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: routing_gitops_file
short_description: The routing plan's HTTPRoute as a file of the deploy's GitOps directory
version_added: 0.2.0
description:
  - Takes the HTTPRoute the C(alauda.spec_decoding.routing_plan) filter returns and gives its file name next to the
    InferenceService's manifest (C(<namespace>-<name>.httproute.yaml) beside the deploy's C(<namespace>-<name>.yaml)) and
    its text in the deploy's deterministic YAML (sorted keys, block style), so a rerun with the same decisions writes the
    same bytes.
  - For an LLMInferenceService (what the routing_plan filter returns with C(render=llmisvc)) the rules belong in the resource
    itself - a second file of the same object would make kustomize refuse the directory - so the file is the deploy's own
    manifest of that LLMInferenceService (C(<namespace>-<name>.llmisvc.yaml)), given as O(manifest), with
    C(spec.router.route) set and the plan's summary annotation; the rest of the file keeps its bytes.
  - Fails naming the option and the fix when the input is not an HTTPRoute or its name or namespace is not a Kubernetes one,
    when O(manifest) is not that LLMInferenceService's, or when its router names its own HTTPRoutes (C(http.refs)).
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description: The HTTPRoute manifest, or the LLMInferenceService route object.
    type: dict
    required: true
  manifest:
    description: For an LLMInferenceService route, the text of the deploy's manifest of that LLMInferenceService.
    type: str
"""

EXAMPLES = r"""
- name: Write the HTTPRoute next to the InferenceService's manifest
  ansible.builtin.copy:
    content: "{{ (class_route | alauda.spec_decoding.routing_gitops_file).content }}"
    dest: "gitops-out/{{ (class_route | alauda.spec_decoding.routing_gitops_file).filename }}"
    mode: "0644"
"""

RETURN = r"""
_value:
  description: C(filename) (relative to the GitOps directory) and C(content) (the YAML text).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_gitops
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError


def routing_gitops_file(route, manifest=None):
    """HTTPRoute -> {filename, content}; LLMInferenceService route + its manifest text -> the manifest with the route."""
    try:
        if isinstance(route, dict) and route.get("kind") == "LLMInferenceService":
            return routing_gitops.llmisvc_manifest(route, manifest)
        return {"filename": routing_gitops.route_filename(route), "content": routing_gitops.manifest_yaml(route)}
    except SpecDecodingError as exc:
        raise AnsibleFilterError("routing_gitops_file: %s" % exc) from exc


class FilterModule:
    """GitOps file of the routing plan."""

    def filters(self):
        return {"routing_gitops_file": routing_gitops_file}
