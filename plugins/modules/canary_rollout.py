#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: canary_rollout
short_description: Put speculative decoding on a canary revision of a KServe InferenceService, promote it or remove it
version_added: 0.2.0
description:
  - O(state=present) rolls the speculative config out as a canary revision on O(percent) of the traffic, the rest
    staying on the current revision. Standard mode (KServe v0.20+) writes C(spec.canary) (one entry named
    O(canary_name) whose predictor is the current one plus C(--speculative-config)); Knative mode sets the flag and
    C(canaryTrafficPercent) on the predictor. Then it waits until both revisions are ready at the current generation
    and the canary carries O(percent) (C(status.canaryStatuses), or the predictor's traffic in Knative mode).
  - O(state=promoted) moves the canary to 100% the way KServe does it (Standard - the canary's predictor, with its
    name, becomes C(spec.predictor) and C(spec.canary) goes, so KServe keeps the canary's Deployment and deletes the old
    one; Knative - C(canaryTrafficPercent) is removed, 100% goes to the latest revision and the previous one scales to
    zero).
  - O(state=absent) removes the canary and waits until 100% is back on the previous revision and no canary pod serves;
    the previous revision is not touched. Knative mode does it KServe's way, C(canaryTrafficPercent=0) (100% on the
    revision tagged C(prev)), with the flag removed from the predictor (the revision made of that spec gets 0%).
  - With O(definition) (a manifest) nothing is read or written on a cluster; the module returns the manifest of the
    step (GitOps).
  - Bad input (a percent outside 1..99, Standard mode on KServe older than 0.20, a revision that already runs
    speculative decoding) fails before anything is written.
author:
  - Alauda Platform Team (@alauda)
options:
  name:
    description: InferenceService name (ignored with O(definition)).
    type: str
  namespace:
    description: Namespace (ignored with O(definition)).
    type: str
  state:
    description: C(present) - canary at O(percent); C(promoted) - canary to 100%; C(absent) - canary removed.
    type: str
    choices: [present, promoted, absent]
    default: present
  speculative_config:
    description:
      - The speculative config of the canary (dict or JSON string), validated and made canonical as the
        M(alauda.spec_decoding.speculative_config) module does. Required with O(state=present), and with
        O(state=promoted) when O(definition) is given.
    type: raw
  vllm_version:
    description: vLLM version the config is checked against (default the newest the collection knows).
    type: str
  percent:
    description: Traffic share of the canary, 1 to 99. Required with O(state=present).
    type: int
  steps:
    description:
      - The whole plan (rising percents 1..99, a trailing 100 meaning the promotion), checked at once so that a bad later
        step fails before the first one is written. O(percent) must be one of them.
    type: list
    elements: int
  canary_name:
    description: Name of the canary predictor (Standard mode; its Deployment is C(<name>-predictor-<canary_name>)).
    type: str
    default: spec
  kserve_version:
    description: KServe release (as M(alauda.spec_decoding.kserve_info) reports it); read from the CRD when omitted.
    type: str
  definition:
    description: An InferenceService manifest to render the step for, without any cluster access.
    type: dict
  wait:
    description: Wait until the step has taken effect.
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait; a canary that is not ready by then fails the task (the previous revision untouched).
    type: int
    default: 1200
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
"""

EXAMPLES = r"""
- name: Speculative decoding on 10% of the traffic
  alauda.spec_decoding.canary_rollout:
    name: llama
    namespace: models
    speculative_config: {method: ngram, num_speculative_tokens: 3, prompt_lookup_max: 4}
    percent: 10
    wait_timeout: 900

- name: Promote
  alauda.spec_decoding.canary_rollout:
    name: llama
    namespace: models
    state: promoted

- name: Render the 50% step for a GitOps repository
  alauda.spec_decoding.canary_rollout:
    definition: "{{ lookup('file', 'gitops/llama.yaml') | from_yaml }}"
    speculative_config: {method: ngram, num_speculative_tokens: 3}
    percent: 50
    kserve_version: "0.20.0"
"""

RETURN = r"""
manifest:
  description: The InferenceService manifest of the step (without server-side fields).
  returned: always
  type: dict
patch:
  description: The JSON merge patch of the step.
  returned: always
  type: dict
mode:
  description: Deployment mode, C(Standard) or C(Knative).
  returned: always
  type: str
rollout:
  description: Where the step stands (C(done), C(stable_ready), C(canary_ready), C(traffic), C(why)).
  returned: when a cluster was read
  type: dict
selectors:
  description: Label selectors of the pods of each revision (C(stable), C(canary)).
  returned: always
  type: dict
resource:
  description: The InferenceService as read last.
  returned: when a cluster was read
  type: dict
already_promoted:
  description:
    - True when O(state=present) found no canary and the serving revision already passing O(speculative_config)
      (a rerun after the promotion); nothing was changed.
  returned: when a cluster was read and that is the case
  type: bool
msg:
  description: What the module found, when there was nothing to do.
  returned: when RV(already_promoted) is true
  type: str
"""

import copy
import json

from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as spec_config
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError


def _plan(params, isvc, kserve_version):
    """(mode, patch, canary predictor) of the step, validated; nothing is written here."""
    mode = canary.check_mode(canary.deployment_mode(isvc), kserve_version)
    name = canary.check_canary_name(params["canary_name"])
    state = params["state"]
    spec = isvc.get("spec") or {}
    entry = next((c for c in spec.get("canary") or [] if (c.get("predictor") or {}).get("name") == name), None)
    canary_pred = None
    if params.get("speculative_config") is not None:
        json_text = spec_config.canonical_json(params["speculative_config"], vllm_version=params.get("vllm_version"))[0]
        if state == "present" and entry is None and canary.already_promoted(isvc, json.loads(json_text)):
            return mode, None, None  # a rerun after the promotion: the serving revision already runs this config
        stable = spec.get("predictor") or {}
        if mode == canary.KNATIVE and stable.get("canaryTrafficPercent") is not None:
            stable = canary.rollback_source(isvc)
        canary_pred = canary.canary_predictor(stable, json_text, name) if not (state != "present" and entry) else None
    if canary_pred is None and entry is not None:
        canary_pred = copy.deepcopy(entry["predictor"])
    if state == "present":
        percent = canary.check_percent(params.get("percent"))
        return mode, canary.step_patch(isvc, mode, percent, canary_pred), canary_pred
    if state == "promoted":
        if canary_pred is None and mode == canary.STANDARD:
            raise ValidationError("there is no canary %r to promote" % name, field="canary_name",
                                  hint="start the canary first (state: present), or give speculative_config to render the promotion")
        if mode == canary.KNATIVE:
            canary.check_knative_promotion(isvc)
        return mode, canary.promote_patch(isvc, mode, canary_pred), canary_pred
    return mode, canary.rollback_patch(isvc, mode, canary.rollback_source(isvc)), canary_pred


def main():
    spec = dict(
        name=dict(type="str"),
        namespace=dict(type="str"),
        state=dict(type="str", default="present", choices=["present", "promoted", "absent"]),
        speculative_config=dict(type="raw"),
        vllm_version=dict(type="str"),
        percent=dict(type="int"),
        steps=dict(type="list", elements="int"),
        canary_name=dict(type="str", default="spec"),
        kserve_version=dict(type="str"),
        definition=dict(type="dict"),
        wait=dict(type="bool", default=True),
        wait_timeout=dict(type="int", default=1200),
    )
    spec.update(AUTH_ARG_SPEC)
    module = AnsibleK8SModule(argument_spec=spec, supports_check_mode=True,
                              required_if=[("state", "present", ("speculative_config", "percent"))],
                              required_one_of=[("definition", "name")],
                              required_together=[("name", "namespace")])
    params = module.params
    try:
        if params.get("steps"):
            plan = canary.check_steps(params["steps"])
            if params["state"] == "present" and params.get("percent") not in plan:
                raise ValidationError("percent %s is not one of the steps %s" % (params.get("percent"), plan), field="percent",
                                      hint="give one of the steps as the percent")
        if params["state"] == "present":
            canary.check_percent(params["percent"])
    except ValidationError as exc:
        module.fail_json(msg=str(exc))
    if params.get("definition"):
        isvc = params["definition"]
        try:
            mode, patch, _pred = _plan(params, isvc, params.get("kserve_version"))
            patch = patch or {}
            out = canary.manifest(isvc, patch)
            selectors = canary.revision_selectors(out, mode, params["canary_name"]) if mode == canary.STANDARD else {}
        except SpecDecodingError as exc:
            module.fail_json(msg=str(exc))
        module.exit_json(changed=False, manifest=out, patch=patch, mode=mode, selectors=selectors)

    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import facts as kserve_facts  # pylint: disable=import-outside-toplevel
    api_client = get_api_client(module=module).client.client
    ns, name = params["namespace"], params["name"]
    try:
        isvc = k8s_pods.get_inference_service(api_client, ns, name)
        version = params.get("kserve_version") or kserve_facts.kserve_release(api_client).get("kserve_version")
        mode, patch, _pred = _plan(params, isvc, version)
        if patch is None:
            module.exit_json(changed=False, already_promoted=True, mode=mode, resource=isvc, selectors={}, patch={},
                             manifest=canary.manifest(isvc, {}),
                             msg="%s/%s already serves this speculative config without a canary: nothing to do" % (ns, name))
        read = isvc
        before = canary.manifest(isvc, {})
        after = canary.manifest(isvc, patch)
        changed = before["spec"] != after["spec"]
        selectors = canary.revision_selectors(after, mode, params["canary_name"]) if mode == canary.STANDARD else {}
        result = {"changed": changed, "manifest": after, "patch": patch, "mode": mode, "selectors": selectors}
        if module._diff:
            result["diff"] = {"before": before, "after": after}
        if changed:
            isvc = canary.apply_merge_patch(api_client, ns, name, patch, dry_run=module.check_mode)
        result["resource"] = isvc
        if params["wait"] and not module.check_mode:
            retired, stable_revision = None, None
            if mode == canary.STANDARD and params["state"] != "present":
                retired = canary.revision_selectors(before, mode, params["canary_name"])["stable" if params["state"] == "promoted" else "canary"]
            elif mode == canary.KNATIVE and params["state"] != "present" and changed:
                # the revisions as they were before this write: the one that goes out of the traffic is retired
                stable_revision, retired = canary.knative_retired(read, params["state"])
            isvc, _elapsed, rollout = canary.wait_step(api_client, ns, name, params["state"], mode, params["canary_name"],
                                                       params.get("percent"), params["wait_timeout"], retired=retired,
                                                       stable_revision=stable_revision)
            result.update(resource=isvc, rollout=rollout)
            if mode == canary.KNATIVE and params["state"] == "present":
                result["selectors"] = canary.revision_selectors(isvc, mode, params["canary_name"])
    except isvc_wait.WaitTimeout as exc:
        module.fail_json(msg=str(exc), resource=exc.isvc, pods=exc.pods, rollout={"done": False})
    except SpecDecodingError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
