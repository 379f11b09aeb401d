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
  - O(write_mode=git) makes each step where Argo CD or Flux takes the truth from, in the file of O(repo_url) that defines
    the InferenceService (a manifest, a kustomize overlay's strategic-merge, inline or JSON 6902 patch). Knative mode -
    C(canaryTrafficPercent) set and C(--speculative-config) added at the start, the share changed at a step, the share
    removed at the promotion, the share and the flag removed in one commit at the abort (the Git rollback's edit).
    Standard mode - a C(spec.canary) entry added (its predictor made from the predictor in Git; a full manifest only),
    its C(trafficPercent) changed, the flag and the canary's name given to the predictor with C(spec.canary) removed at
    the promotion, C(spec.canary) removed at the abort. Every other byte of the file is kept; the commit is pushed, the
    owner's sync of it is waited for (O(git_sync_timeout)), then the step's effect as in live mode. The plan of the step
    is the same in both modes.
  - O(write_mode=live) on an InferenceService that Argo CD, Flux or Helm manages is refused before any write (see
    O(gitops_owner)), naming the owner and both fixes, O(write_mode=git) and O(gitops_owner=ignore).
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
  wait_crash_loop_restarts:
    description:
      - With O(state=present), a container of the canary revision's pods restarted this many times fails the wait at
        once, with the container's previous log tail (secrets redacted), instead of at O(wait_timeout). KServe's
        C(modelStatus) describes the stable revision during a canary, so the revision's own pods are read.
      - V(0) waits for O(wait_timeout).
    type: int
    default: 2
  write_mode:
    description:
      - C(live) merge-patches the InferenceService; C(git) commits the step to the Git repository that its Argo CD
        Application or Flux Kustomization syncs, pushes it and waits for the sync (the role's C(canary_mode)).
    type: str
    choices: [live, git]
    default: live
  repo_url:
    description:
      - O(write_mode=git) - the Git repository; default the owner's source (the Application's C(spec.source.repoURL),
        the Flux GitRepository's C(spec.url)). SSH URLs need O(ssh_key_file) and O(known_hosts_file); HTTPS takes O(token).
    type: str
  branch:
    description: O(write_mode=git) - the branch to push the step to; default the owner's (C(targetRevision), C(ref.branch)).
    type: str
  path:
    description: O(write_mode=git) - the directory the owner applies; default the owner's (C(spec.source.path), C(spec.path)).
    type: str
  ssh_key_file:
    description: O(write_mode=git) - private SSH key (a deploy key with write access), used through C(GIT_SSH_COMMAND) only.
    type: path
  known_hosts_file:
    description: O(write_mode=git) - the server's pinned host key (C(known_hosts) format); host key checking is strict.
    type: path
  token:
    description: O(write_mode=git) - token for an C(https://) O(repo_url), sent through git's environment only.
    type: str
  git_username:
    description: The user name that goes with O(token) (O(username) is the API server's).
    type: str
    default: git
  author_name:
    description: Author and committer name of the step's commit.
    type: str
    default: alauda.spec_decoding
  author_email:
    description: Author and committer e-mail of the step's commit.
    type: str
    default: spec-decoding@alauda.io
  commit_message:
    description: The commit message; default one that says the step and what changed.
    type: str
  workdir:
    description: Directory where the clone is made (a new directory in it, removed at the end).
    type: path
  timeout:
    description: Seconds each git command may take.
    type: int
    default: 120
  git_sync_timeout:
    description: O(write_mode=git) - seconds to wait for the owner to sync the step's commit (Argo CD C(status.sync.revision),
      Flux C(status.lastAppliedRevision)).
    type: int
    default: 600
  git_sync_sleep:
    description: Seconds between two reads of the owner while waiting for its sync.
    type: float
    default: 2.0
extends_documentation_fragment:
  - alauda.spec_decoding.gitops_owner
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
  - ruamel.yaml >= 0.17 and git 2.31 or newer (O(write_mode=git))
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

- name: The canary in the repository Argo CD syncs (repository, branch and path read from the Application)
  alauda.spec_decoding.canary_rollout:
    name: llama
    namespace: models
    write_mode: git
    token: "{{ lookup('ansible.builtin.env', 'GIT_TOKEN') }}"
    speculative_config: {method: ngram, num_speculative_tokens: 3}
    percent: 10

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
git:
  description:
    - O(write_mode=git) - the step's commit (C(commit), null when Git already said it; C(base)), C(repo_url), C(branch),
      C(path), the edited C(files) with their diffs, C(changes) ({file, field, change, value}), C(commit_message), the
      C(owner) in one line and C(synced_in) (seconds until the owner had synced the commit).
  returned: with O(write_mode=git)
  type: dict
msg:
  description: What the module found, when there was nothing to do.
  returned: when RV(already_promoted) is true
  type: str
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops.owner import GITOPS_OWNER_ARG_SPEC
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary_git, canary_steps


def argument_spec():
    return argspec(
        GITOPS_OWNER_ARG_SPEC,
        canary_git.GIT_ARG_SPEC,
        write_mode=dict(type="str", choices=list(canary_git.WRITE_MODES), default="live"),
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
        wait_crash_loop_restarts=dict(type="int", default=2),
    )


def execute(module):
    params = module.params
    canary_steps.check_step_params(params)
    if params.get("definition"):
        return canary_steps.render_step(params)
    return canary_steps.apply_step(module.api_client, params, dry_run=module.check_mode, diff=module._diff,  # pylint: disable=protected-access
                                   warn=module.warn)


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        required_if=[("state", "present", ("speculative_config", "percent"))],
        required_one_of=[("definition", "name")],
        required_together=[("name", "namespace"), ("ssh_key_file", "known_hosts_file")],
        mutually_exclusive=[("ssh_key_file", "token")],
    ),
    failure=dict(
        timed_out={"rollout": {"done": False}},
    ),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
