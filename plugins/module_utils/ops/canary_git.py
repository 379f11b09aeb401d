# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How a canary step is written (canary_rollout ``write_mode``): ``live`` merge-patches the InferenceService (refused on
an object that Argo CD, Flux or Helm manages, naming the canary's Git mode); ``git`` commits the step to the repository
the owner syncs (gitops/canary_edit.py edits the file that defines the object), pushes, and waits until the owner has
synced that commit (gitops/owner_info.wait_revision, as the Git rollback waits). The step itself - what the object must
look like - is the one plan of ``canary_steps.plan_step`` in both modes; the wait for the step to take effect after the
write is the same too (``canary_wait``).

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import canary_edit, git_repo, owner_info
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner as gitops_owner
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command

LIVE, GIT = "live", "git"
WRITE_MODES = (LIVE, GIT)
SYNCING_OWNERS = ("argocd", "flux")
LIVE_REFUSED_HINT = (
    "run the canary where the truth is: canary_mode: git (role variable; module option write_mode: git) commits each step "
    "to the owner's repository and waits for its sync; set canary_gitops_owner: ignore (module option gitops_owner) only "
    "when the owner is gone or does not self-heal")

# Options of canary_rollout's Git mode: gitops/git_repo.py's, with the repository, branch and path read from the owner's
# source when left out (so none is required), no review branch (a step must reach the cluster to be observed), and
# git_username for git's username, which is one of kubernetes.core's auth options in a cluster module.
GIT_ARG_SPEC = dict(
    {key: dict(value, required=False) for key, value in git_repo.ARG_SPEC.items() if key not in ("push_branch", "username")},
    branch=dict(type="str"), path=dict(type="str"), git_username=dict(type="str", default=git_repo.DEFAULT_USERNAME),
    git_sync_timeout=dict(type="int", default=600),
    git_sync_sleep=dict(type="float", default=2.0),
)


def _flag_value(predictor):
    """The raw ``--speculative-config`` value of a predictor's vLLM container (the canonical JSON the plan set), or None."""
    container = predictor.get("model") if isinstance(predictor.get("model"), dict) else (predictor.get("containers") or [{}])[0]
    found = vllm_command.find_occurrences(list(container.get("command") or []) + list(container.get("args") or []))
    return next((o.raw for o in found if o.flag == "--speculative-config"), None)


def git_intent(mode, patch, canary_name):
    """The step's plan (the merge patch ``canary_steps.plan_step`` made of the live object) as what the definition in Git
    must say (gitops/canary_edit.py). Knative: ``{"canaryTrafficPercent": N or None, "speculative_config": "<json>" or
    None}``, a key left out where the step leaves it; KServe's live abort (``canaryTrafficPercent: 0`` on the predictor
    without the flag) is, in Git, the share and the flag removed in one commit, the Git rollback's edit: the owner then
    applies the spec without a canary. Standard: ``{"canary": {name, trafficPercent, make}}`` (``make`` builds the canary's
    predictor from the predictor in Git, as the live plan builds it from the live one: ops/canary.canary_predictor),
    ``{"canary": None}`` (the abort), ``{"promote": {name, speculative_config}}`` (the predictor in Git gets the flag and the
    canary's name, ``spec.canary`` goes)."""
    spec = (patch or {}).get("spec") or {}
    if mode == canary.STANDARD:
        if "canary" not in spec:
            return {}
        if spec["canary"] is None and spec.get("predictor"):
            return {"promote": {"name": canary_name, "speculative_config": _flag_value(spec["predictor"])}}
        if spec["canary"] is None:
            return {"canary": None}
        entry = spec["canary"][0]
        json_text = _flag_value(entry["predictor"])
        return {"canary": {"name": canary_name, "trafficPercent": entry["trafficPercent"],
                           "make": lambda stable: canary.canary_predictor(stable, json_text, canary_name)}}
    predictor = spec.get("predictor")
    if not predictor:
        return {}
    intent = {}
    if "canaryTrafficPercent" in predictor:
        intent["canaryTrafficPercent"] = predictor["canaryTrafficPercent"] or None
    if set(predictor) - {"canaryTrafficPercent"}:  # the whole predictor: the canary's (with the flag) or the stable one
        intent["speculative_config"] = _flag_value(predictor)
    return intent


def check_live_write(api_client, isvc, params, warn=None):
    """Before a live step: the refusal of a managed object (gitops/owner.py's text, the canary's fixes), or the ignore
    warning. Returns the owner."""
    owner = gitops_owner.owner_of(isvc)
    if owner["kind"] == "none":
        return owner
    owner = gitops_owner.read_owner(api_client, isvc, owner=owner)
    what = "InferenceService %s/%s" % (params["namespace"], params["name"])
    text = gitops_owner.refuse_live_write(owner, "ignore", what)[len("gitops_owner=ignore: "):]
    if params.get("gitops_owner", "refuse") == "ignore":
        if warn is not None:
            warn("gitops_owner=ignore: %s" % text)
        return owner
    raise ValidationError("%s; nothing was written (found by %s)" % (text, "; ".join(owner.get("evidence") or []) or "its metadata"),
                          field="gitops_owner", hint=LIVE_REFUSED_HINT)


def _source(params, owner):
    """(repo_url, branch, path): the options, else the owner's source."""
    source = owner.get("source") or {}
    repo_url = params.get("repo_url") or source.get("repo_url")
    branch = params.get("branch") or source.get("revision")
    path = params.get("path") or source.get("path") or "."
    if not repo_url or not branch:
        raise ValidationError(
            "no Git repository is known for InferenceService %s/%s: %s" % (
                params["namespace"], params["name"], "it has no Argo CD or Flux owner" if owner["kind"] == "none" else
                "%s's source could not be read (%s)" % (gitops_owner.describe(owner), owner.get("read_error") or "no Git source")),
            field="repo_url", hint="set canary_git_repo_url, canary_git_branch and canary_git_path (module options repo_url, branch, "
                                   "path), or grant the reads in %s" % gitops_owner.RBAC_FILE)
    return repo_url, branch, path


def _message(params):
    what = {"present": "canary on %s%%" % params.get("percent"), "promoted": "promote the canary", "absent": "abort the canary"}
    return lambda result: "Canary of speculative decoding on %s/%s: %s (%s)" % (
        params["namespace"], params["name"], what[params["state"]], canary_edit.changes_summary(result["removed"]))


def write_step(api_client, params, isvc, mode, patch, dry_run=False):
    """The step's plan committed to Git and pushed; then, with ``wait``, the owner's sync of that commit waited for (the
    branch head when Git already said it). Returns ``{changed, commit, base, files, changes, commit_message, owner,
    synced_in}``; nothing is pushed in check mode."""
    intent = git_intent(mode, patch, params["canary_name"])
    owner = gitops_owner.read_owner(api_client, isvc)
    if owner["kind"] not in SYNCING_OWNERS and params["wait"]:
        raise ValidationError("InferenceService %s/%s has %s: nothing syncs a commit into the cluster, so the step would never "
                              "take effect" % (params["namespace"], params["name"], gitops_owner.describe(owner)), field="canary_mode",
                              hint="use canary_mode: live for an object no Argo CD Application or Flux Kustomization syncs")
    repo_url, branch, path = _source(params, owner)
    git_params = dict(params, repo_url=repo_url, branch=branch, path=path, push_branch="", username=params.get("git_username"))
    messages = []
    message = _message(params)

    def edit(repo):
        return canary_edit.edit_canary_in_directory(repo.root, path, params["name"], params["namespace"], intent,
                                                    default_namespace=params["namespace"], owner_kind=owner["kind"])

    def commit_message(result):
        messages.append(params.get("commit_message") or message(result))
        return messages[-1]
    out = git_repo.change_in_clone(git_params, edit, commit_message, check_mode=dry_run)
    result = out["edit"]
    synced_in = None
    if not dry_run and params["wait"]:
        owner, synced_in = owner_info.wait_revision(
            api_client, isvc, owner, out["commit"] or out["base"],
            {"fetched": False, "wait_timeout": params["git_sync_timeout"], "wait_sleep": params["git_sync_sleep"],
             "argocd_namespace": gitops_owner.ARGOCD_NAMESPACE})
    return {"changed": out["commit"] is not None or (dry_run and bool(result["files"])), "commit": out["commit"], "base": out["base"],
            "repo_url": repo_url, "branch": branch, "path": path, "retried": out["retried"], "files": result["files"],
            "changes": result["removed"], "defined_in": result["defined_in"],
            "commit_message": messages[-1] if messages else (message(result) if result["files"] else None),
            "owner": gitops_owner.summary(owner), "synced_in": round(synced_in, 1) if synced_in is not None else None}
