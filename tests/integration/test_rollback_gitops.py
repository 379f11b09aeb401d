"""The rollback where Git is the source of truth (issue #47), through rollback.yml as users run it, on the test bed: the
real kube-apiserver with the real KServe, Argo CD and Flux CRDs, the loopback Git server, and the Argo CD / Flux
stand-ins (tests/testbed/argocd_standin.py, flux_standin.py) that sync the repository into the cluster and correct
drift as their docs say. The KServe stand-in's pods log vLLM 0.32's real engine lines (EAGLE-3 for the generations the
test marks, the baseline's otherwise); the same loop with real vLLM in process-mode pods is tests/e2e/test_full_loop_e2e.py.

- a live rollback of an Argo CD managed InferenceService is refused, nothing written, the Application and both fixes named;
- rollback_mode git: one commit that removes only the flag's lines, the Application synced to it, the new generation
  proven by its engine line, a later self-heal pass leaves it off, a rerun commits nothing;
- the same under Flux, with the flag in a strategic-merge patch of a kustomize overlay;
- rollback_mode emergency, whole and killed after each of its steps (pause / live strip / commit) and run again: the flag
  is off live and in Git, and the Application's syncPolicy is byte-for-byte what it was, with no pause record left.
"""
# pylint: disable=redefined-outer-name  # pytest fixtures are parameters named like the fixture functions
from __future__ import annotations

import json
import os
import uuid

import pytest
import yaml

from tests.ansible_run import run_playbook
from tests.e2e import gitops_loops
from tests.module_run import run_module
from tests.paths import read_capture
from tests.testbed.gitops_standin import wait_for
from tests.testbed.rest import ApiError

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(HERE), "unit", "plugins", "module_utils", "data", "rollback")
NAME = "llama31-8b-eagle3"
ISVC = "/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices/%s"
ARGO = "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications"
FLAG_LINE = "--speculative-config '{\"method\":\"eagle3\",\"model\":\"/mnt/models/draft\",\"num_speculative_tokens\":3}'"
# Argo CD's own sync policy shape, with a key order of its own: resume must give back these bytes, not an equal dict.
SYNC_POLICY = {"syncOptions": ["ServerSideApply=true"], "automated": {"selfHeal": True, "prune": False},
               "retry": {"limit": 2}}


def _manifest_text(namespace):
    with open(os.path.join(DATA, "guide_example2_eagle3.yaml"), encoding="utf-8") as fh:
        return fh.read().replace("namespace: llm-demo", "namespace: " + namespace)


@pytest.fixture
def api(controlplane):
    client = controlplane.rest()
    yield client
    client.close()


def _command(api, namespace):
    return api.get(ISVC % (namespace, NAME))["spec"]["predictor"]["model"]["command"][2]


def _ready_at(api, namespace, generation):
    isvc = api.get(ISVC % (namespace, NAME))
    conditions = {c["type"]: c["status"] for c in (isvc.get("status") or {}).get("conditions") or []}
    return (isvc["metadata"]["generation"] == generation and isvc.get("status", {}).get("observedGeneration") == generation
            and conditions.get("Ready") == "True")


def _eagle3_until(kserve, namespace, generation):
    """Pods of generations up to `generation` log the EAGLE-3 engine line, later ones the baseline's."""
    kserve.set_behaviour(namespace, NAME, ready_after=0.2, log_text=read_capture("baseline", "startup.log"))
    for gen in range(1, generation + 1):
        kserve.set_behaviour(namespace, NAME, ready_after=0.2, log_text=read_capture("eagle3", "startup.log"), generation=gen)


@pytest.fixture
def argo_service(api, argocd, git_server, kserve, namespace):
    """The guide's EAGLE-3 InferenceService in a repository that an Argo CD Application (automated, selfHeal) syncs."""
    repo = "isvc-" + uuid.uuid4().hex[:8]
    git_server.create_repo(repo, {"serving/isvc.yaml": _manifest_text(namespace)})
    _eagle3_until(kserve, namespace, 1)
    app = "app-" + uuid.uuid4().hex[:8]
    api.post(ARGO, {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": app, "namespace": "argocd"},
                    "spec": {"project": "default", "syncPolicy": SYNC_POLICY,
                             "source": {"repoURL": git_server.git_url(repo), "targetRevision": "main", "path": "serving"},
                             "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace}}})
    try:
        wait_for(lambda: _exists(api, namespace) and _ready_at(api, namespace, 1), timeout=30, what="the first sync, Ready")
        yield {"repo": repo, "app": app, "path": "%s/%s" % (ARGO, app)}
    finally:
        api.delete("%s/%s" % (ARGO, app))


def _exists(api, namespace):
    try:
        api.get(ISVC % (namespace, NAME))
        return True
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise


def _rollback(tmp_path, kubeconfig, namespace, **more):
    extra = {"rollback_names": ["%s/%s" % (namespace, NAME)], "rollback_wait_timeout": 60, "rollback_wait_sleep": 1,
             "rollback_verify_delay": 1, "rollback_git_sync_timeout": 60}
    extra.update(more)
    return run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=extra, kubeconfig=kubeconfig)


def _only_the_flag_removed(git_server, repo, path, before_sha):
    """The head commit's change to `path` is the flag's line, nothing else."""
    before = git_server.show(repo, before_sha, path).splitlines()
    after = git_server.show(repo, "main", path).splitlines()
    removed = [line for line in before if line not in after]
    assert len(removed) == 1 and removed[0].strip() == FLAG_LINE + " \\", removed
    assert after == [line for line in before if line != removed[0]]


def test_live_rollback_of_an_argo_cd_managed_service_is_refused_and_writes_nothing(
        tmp_path, kubeconfig, api, argo_service, namespace):
    before = api.get(ISVC % (namespace, NAME))
    run = _rollback(tmp_path, kubeconfig, namespace)
    assert run.rc != 0
    assert argo_service["app"] in run.output and "rollback_mode: git" in run.output and "emergency" in run.output, run.output[-3000:]
    after = api.get(ISVC % (namespace, NAME))
    assert after["metadata"]["generation"] == before["metadata"]["generation"] and after["spec"] == before["spec"]


def test_git_mode_commits_only_the_flag_removal_the_owner_syncs_it_and_self_heal_keeps_it_off(
        tmp_path, kubeconfig, api, argocd, git_server, argo_service, namespace):
    repo, before_sha = argo_service["repo"], git_server.head(argo_service["repo"])
    run = _rollback(tmp_path, kubeconfig, namespace, rollback_mode="git")
    assert run.rc == 0, run.output[-6000:]
    head = git_server.head(repo)
    assert head != before_sha and git_server.changed_files(repo, "main") == ["serving/isvc.yaml"]
    assert git_server.log(repo)[0]["subject"].startswith("Roll back speculative decoding on %s/%s: remove --speculative-config" % (namespace, NAME))
    _only_the_flag_removed(git_server, repo, "serving/isvc.yaml", before_sha)
    assert gitops_loops.synced(api, argo_service["path"], head)
    assert "--speculative-config" not in _command(api, namespace) and _ready_at(api, namespace, 2)
    summary = run.result("Summary")["msg"]
    assert "(git mode)" in summary[0] and "speculative_config=None" in summary[1], summary
    # A later self-heal pass re-applies Git's content: the flag stays off, nothing changes.
    argocd.wait_idle()
    assert "--speculative-config" not in _command(api, namespace) and _ready_at(api, namespace, 2)
    rerun = _rollback(tmp_path, kubeconfig, namespace, rollback_mode="git")
    assert rerun.rc == 0 and git_server.head(repo) == head, rerun.output[-3000:]
    assert run.result("Commit the flag's removal")["changed"] is True and rerun.result("Commit the flag's removal")["changed"] is False


OVERLAY_PATCH = """\
# The speculative-decoding overlay: the base serves the target alone.
apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata:
  name: %s
  namespace: %s
spec:
  predictor:
    model:
      args:
        - --max-model-len=8192
        - --speculative-config={"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}
        - --enable-prefix-caching  # kept
"""


def test_git_mode_under_flux_edits_the_overlay_patch_and_reconciles_keep_it_off(
        tmp_path, kubeconfig, api, flux, git_server, kserve, namespace):
    base = yaml.safe_load(_manifest_text(namespace))
    model = base["spec"]["predictor"]["model"]
    model["command"] = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/mnt/models/target"]
    repo = "flux-" + uuid.uuid4().hex[:8]
    git_server.create_repo(repo, {
        "base/isvc.yaml": yaml.safe_dump(base, sort_keys=False),
        "base/kustomization.yaml": "resources:\n  - isvc.yaml\n",
        "overlays/spec/kustomization.yaml": "resources:\n  - ../../base\npatches:\n  - path: speculative.yaml\n",
        "overlays/spec/speculative.yaml": OVERLAY_PATCH % (NAME, namespace)})
    kserve.set_behaviour(namespace, NAME, ready_after=0.2, log_text=read_capture("baseline", "startup.log"))
    kserve.set_behaviour(namespace, NAME, ready_after=0.2, log_text=read_capture("ngram", "startup.log"), generation=1)
    # Flux takes http(s) and ssh URLs only: the loopback server's Basic-auth side, with the Secret git-auth that both Flux
    # and the rollback read (rollback_git_credentials_secret: username + password).
    owner = gitops_loops.flux_kustomization(api, git_server, repo, namespace, "./overlays/spec")
    try:
        wait_for(lambda: _exists(api, namespace) and _ready_at(api, namespace, 1), timeout=30, what="Flux's first apply, Ready")
        args = api.get(ISVC % (namespace, NAME))["spec"]["predictor"]["model"]["args"]
        assert any(a.startswith("--speculative-config=") for a in args), args
        run = _rollback(tmp_path, kubeconfig, namespace, rollback_mode="git", rollback_git_credentials_secret="git-auth")
        assert run.rc == 0, run.output[-6000:]
        assert git_server.token not in run.stdout + run.stderr
        assert git_server.changed_files(repo, "main") == ["overlays/spec/speculative.yaml"]
        patch = git_server.show(repo, "main", "overlays/spec/speculative.yaml")
        assert patch == (OVERLAY_PATCH % (NAME, namespace)).replace(
            '        - --speculative-config={"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}\n', ""), patch
        head = git_server.head(repo)
        status = api.get(owner[0])["status"]
        assert status["lastAppliedRevision"] == "main@sha1:" + head, status
        args = api.get(ISVC % (namespace, NAME))["spec"]["predictor"]["model"]["args"]
        assert args == ["--max-model-len=8192", "--enable-prefix-caching"] and _ready_at(api, namespace, 2), args
        flux.wait_idle()  # a reconcile re-applies the overlay: the flag stays off
        assert api.get(ISVC % (namespace, NAME))["metadata"]["generation"] == 2
    finally:
        gitops_loops.delete(api, *owner)


def _sync_policy_bytes(api, app_path):
    return json.dumps(api.get(app_path)["spec"].get("syncPolicy"))


@pytest.mark.parametrize("killed_after", [None, "pause", "live strip", "commit"])
def test_emergency_path_killed_after_each_step_converges_and_resumes_the_sync_as_it_was(
        tmp_path, kubeconfig, api, argocd, git_server, argo_service, namespace, killed_after):
    repo, app_path = argo_service["repo"], argo_service["path"]
    policy_before = _sync_policy_bytes(api, app_path)
    assert json.loads(policy_before) == SYNC_POLICY
    auth = {"kubeconfig": kubeconfig}
    # What a run killed after that step left behind: the steps before it done, the rest not.
    steps = ["pause", "live strip", "commit"]
    done = steps[:steps.index(killed_after) + 1] if killed_after else []
    if "pause" in done:
        paused = run_module("gitops_sync", dict(auth, state="paused", name=NAME, namespace=namespace, run_id="killed-run"))
        assert paused["changed"] and "automated" not in api.get(app_path)["spec"]["syncPolicy"], paused
    if "live strip" in done:
        stripped = run_module("isvc_speculative", dict(auth, name=NAME, namespace=namespace, state="absent", gitops_owner="ignore",
                                                       wait=True, wait_timeout=60, wait_sleep=1))
        assert stripped["changed"], stripped
    if "commit" in done:
        committed = run_module("gitops_speculative", dict(name=NAME, namespace=namespace, state="absent",
                                                          repo_url=git_server.git_url(repo), branch="main", path="serving"))
        assert committed["commit"], committed
    run = _rollback(tmp_path, kubeconfig, namespace, rollback_mode="emergency", rollback_run_id="rerun")
    assert run.rc == 0, run.output[-6000:]
    # Off live, proven, and off in Git by one rollback commit.
    assert "--speculative-config" not in _command(api, namespace)
    assert [c["subject"].startswith("Roll back speculative decoding") for c in git_server.log(repo)] == [True, False]
    # The Application's sync policy is byte-for-byte what it was, the pause record gone; its sync resumed and in step.
    app = api.get(app_path)
    assert json.dumps(app["spec"].get("syncPolicy")) == policy_before
    assert "spec-decoding.alauda.io/paused-sync" not in (app["metadata"].get("annotations") or {})
    wait_for(lambda: gitops_loops.synced(api, app_path, git_server.head(repo)), timeout=20, what="Argo CD in sync at the commit")
    generation = api.get(ISVC % (namespace, NAME))["metadata"]["generation"]
    argocd.wait_idle()
    assert "--speculative-config" not in _command(api, namespace)
    assert api.get(ISVC % (namespace, NAME))["metadata"]["generation"] == generation
    emergency = run.result("Record the emergency path")["ansible_facts"]["rollback_results"]
    assert emergency[0]["mode"] == "emergency" and emergency[0]["verified"] is True, emergency
