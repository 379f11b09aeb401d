"""The canary where Git is the source of truth (issue #47's last part), on the test bed: the real kube-apiserver with the
real KServe and Argo CD CRDs, the loopback Git server, the Argo CD stand-in (automated, selfHeal) that syncs the
repository into the cluster and corrects drift, and the KServe stand-in's Knative path (a revision per pod-template
change, canaryTrafficPercent's traffic split). The canary_rollout module runs in-process as the canary role calls it.

A live step of the managed InferenceService is refused naming the owner and both fixes; in Git mode the start, one step
and the abort are exactly three commits to the file that defines the object (the abort gives back its original bytes),
each synced by the stand-in before the step's effect is waited for; the live object then has neither the share nor the
flag, its pods' engine line says speculative_config=None, and a drift pass leaves it so.
"""
# pylint: disable=redefined-outer-name  # pytest fixtures are parameters named like the fixture functions
from __future__ import annotations

import json
import textwrap
import time
import uuid

import pytest

from tests.ansible_run import run_playbook
from tests.e2e import gitops_loops
from tests.integration import test_canary_knative
from tests.integration.test_canary_rollout import _pages, _vars
from tests.integration.test_verify import capture
from tests.module_run import run_module
from tests.testbed.gitops_standin import wait_for

pytestmark = pytest.mark.integration

NAME = "llm"
ISVC = "/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices/%s"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
CANARY_REVISION = "llm-predictor-00002"
# The InferenceService as a platform team keeps it in Git: Knative mode, comments and quoting of its own.
MANIFEST = textwrap.dedent("""\
    # llm: Argo CD syncs this file.
    apiVersion: serving.kserve.io/v1beta1
    kind: InferenceService
    metadata:
      name: llm
      namespace: %s
      annotations:
        serving.kserve.io/deploymentMode: "Serverless"   # canaries need Knative revisions
    spec:
      predictor:
        minReplicas: 1
        # the model server
        model:
          modelFormat: {name: vllm}
          args:
          - --model
          - /mnt/models   # the PVC's mount
          - '--max-model-len=4096'
    """)


@pytest.fixture
def api(controlplane):
    client = controlplane.rest()
    yield client
    client.close()


def _ready_at_generation(isvc):
    status = isvc.get("status") or {}
    return status.get("observedGeneration") == isvc["metadata"]["generation"] and \
        any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])


def _step(kubeconfig, namespace, **args):
    return run_module("canary_rollout", dict(name=NAME, namespace=namespace, kubeconfig=kubeconfig, kserve_version="v0.20.0",
                                             canary_name="spec", wait_timeout=60, **args))


def _git_step(kubeconfig, namespace, **args):
    return _step(kubeconfig, namespace, write_mode="git", git_sync_timeout=60, git_sync_sleep=0.5, **args)


def test_canary_in_git_start_step_abort_three_commits_synced_and_kept_off(kubeconfig, api, argocd, git_server, kserve, namespace):
    started = time.monotonic()
    # revision 1 (and the one the abort makes of the spec without the canary) logs the baseline's engine line, the canary's
    # revision ngram's
    kserve.set_behaviour(namespace, NAME, ready_after=0.1, logs={"kserve-container": capture("baseline")})
    kserve.set_behaviour(namespace, NAME, ready_after=0.1, logs={"kserve-container": capture("ngram")}, revision=CANARY_REVISION)
    repo = "canary-" + uuid.uuid4().hex[:8]
    original = MANIFEST % namespace
    git_server.create_repo(repo, {"serving/isvc.yaml": original})
    app_path = gitops_loops.argo_application(api, git_server, repo, namespace, "serving")
    app = app_path.rsplit("/", 1)[1]
    try:
        wait_for(lambda: gitops_loops.synced(api, app_path, git_server.head(repo)) and _ready_at_generation(api.get(ISVC % (namespace, NAME))),
                 timeout=30, what="the first sync, Ready")
        first = git_server.head(repo)
        before = api.get(ISVC % (namespace, NAME))

        # live: refused, nothing written, the owner and both fixes named
        live = _step(kubeconfig, namespace, speculative_config=NGRAM, percent=10, wait=False)
        assert live.failed and ("Argo CD Application argocd/%s" % app) in live.msg, live.msg
        assert "canary_mode: git" in live.msg and "canary_gitops_owner: ignore" in live.msg, live.msg
        assert api.get(ISVC % (namespace, NAME))["metadata"]["generation"] == before["metadata"]["generation"]

        start = _git_step(kubeconfig, namespace, speculative_config=NGRAM, percent=10, steps=[10, 50, 100])
        assert not start.failed, start.msg
        assert start["changed"] is True and start["mode"] == "Knative" and start["rollout"]["done"] is True
        assert start["git"]["files"][0]["file"] == "serving/isvc.yaml" and start["git"]["commit"] == git_server.head(repo)
        live_predictor = api.get(ISVC % (namespace, NAME))["spec"]["predictor"]
        assert live_predictor["canaryTrafficPercent"] == 10 and "--speculative-config" in live_predictor["model"]["args"]
        assert start["selectors"]["canary"] == "serving.knative.dev/revision=" + CANARY_REVISION
        flag_value = next(c["value"] for c in start["git"]["changes"] if c.get("flag") == "--speculative-config")
        assert json.loads(flag_value) == NGRAM

        step = _git_step(kubeconfig, namespace, speculative_config=NGRAM, percent=50, steps=[10, 50, 100])
        assert not step.failed, step.msg
        assert step["changed"] is True and api.get(ISVC % (namespace, NAME))["spec"]["predictor"]["canaryTrafficPercent"] == 50
        assert step["rollout"]["traffic"] == 50

        abort = _git_step(kubeconfig, namespace, state="absent")
        assert not abort.failed, abort.msg
        head = git_server.head(repo)
        assert abort["changed"] is True and abort["git"]["commit"] == head

        # Git: exactly the three steps, each to the one file; the abort gives back the file's original bytes
        log = git_server.log(repo)
        assert [c["sha"] for c in log[3:4]] == [first] and len(log) == 4, log
        assert [c["subject"].split(": ", 1)[1] for c in log[:3]] == [
            "abort the canary (canaryTrafficPercent removed, --speculative-config removed)",
            "canary on 50% (canaryTrafficPercent 50)",
            "canary on 10%% (canaryTrafficPercent 10, --speculative-config %s)" % flag_value], log
        assert all(git_server.changed_files(repo, c["sha"]) == ["serving/isvc.yaml"] for c in log[:3])
        assert git_server.show(repo, head, "serving/isvc.yaml") == original

        # the cluster after the owner's sync of the abort: no share, no flag, Ready, the new revision's engine without a proposer
        assert gitops_loops.synced(api, app_path, head)
        isvc = api.get(ISVC % (namespace, NAME))
        assert "canaryTrafficPercent" not in isvc["spec"]["predictor"] and isvc["spec"]["predictor"]["model"]["args"] == \
            ["--model", "/mnt/models", "--max-model-len=4096"] and _ready_at_generation(isvc)
        proof = run_module("engine_config_info", dict(name=NAME, namespace=namespace, kubeconfig=kubeconfig, expected={"enabled": False}))
        assert not proof.failed, proof.msg
        assert proof["speculative_config"] is None

        # a drift-correction pass re-applies Git: it stays off, nothing changes
        generation = isvc["metadata"]["generation"]
        argocd.wait_idle()
        after = api.get(ISVC % (namespace, NAME))
        assert after["metadata"]["generation"] == generation and "canaryTrafficPercent" not in after["spec"]["predictor"]
        assert "--speculative-config" not in after["spec"]["predictor"]["model"]["args"]
        print("canary in Git: start, step, abort and proof in %.1f s" % (time.monotonic() - started))
    finally:
        api.delete(app_path)


def test_canary_role_in_git_rolls_back_a_slower_canary_and_proves_it(tmp_path, kubeconfig, api, argocd, git_server, kserve, namespace):
    """The wiring (playbooks/canary.yml, canary_mode: git): the canary's first step is a commit the Argo CD stand-in syncs,
    the window observes the revisions' own /metrics, the slower canary is aborted by a commit that gives back the file's
    bytes, and the rollback role (Git mode) proves speculative_config=None on what serves."""
    port = test_canary_knative._serve(kserve, namespace, _pages(0.05, 0.020, 30), _pages(0.06, 0.035, 25))
    repo = "canary-role-" + uuid.uuid4().hex[:8]
    original = MANIFEST.replace("  - '--max-model-len=4096'\n", "  - '--port'\n      - '%d'\n" % port) % namespace
    assert "'--port'" in original
    git_server.create_repo(repo, {"serving/isvc.yaml": original})
    app_path = gitops_loops.argo_application(api, git_server, repo, namespace, "serving")
    try:
        wait_for(lambda: gitops_loops.synced(api, app_path, git_server.head(repo)) and _ready_at_generation(api.get(ISVC % (namespace, NAME))),
                 timeout=30, what="the first sync, Ready")
        run = run_playbook(tmp_path, "playbooks/canary.yml", kubeconfig=kubeconfig, extra_vars=_vars(
            namespace, NAME, tmp_path / "report", canary_kserve_version="0.15.2", canary_mode="git", canary_git_sync_timeout=60,
            rollback_git_sync_timeout=60))
        assert run.rc == 0, run.output[-6000:]
        report = json.loads((tmp_path / "report" / ("canary-%s-llm.json" % namespace)).read_text())
        assert report["decision"] == "roll_back" and [o["percent"] for o in report["observations"]] == [10], report["reasons"]
        # Git: the step and the abort, each to the one file; the file is back to its bytes
        log = git_server.log(repo)
        assert len(log) == 3 and all(git_server.changed_files(repo, c["sha"]) == ["serving/isvc.yaml"] for c in log[:2]), log
        assert git_server.show(repo, "main", "serving/isvc.yaml") == original
        assert gitops_loops.synced(api, app_path, git_server.head(repo))
        predictor = api.get(ISVC % (namespace, NAME))["spec"]["predictor"]
        assert "canaryTrafficPercent" not in predictor and "--speculative-config" not in predictor["model"]["args"], predictor
        proof = run.result("Prove the engine runs without a proposer")
        assert proof["speculative_config"] is None and proof["pods"] and all(p["speculative_config"] is None for p in proof["pods"]), proof
    finally:
        api.delete(app_path)
