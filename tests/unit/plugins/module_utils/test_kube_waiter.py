"""The one waiter (kube/wait.py): each row of its readiness table - Deployment rollout, Job, InferenceService,
LLMInferenceService pools, the canary revisions - ready, not ready, and timed out through the one loop, in-process: the
API answers are scripted at kube/client.request (every read of the collection goes through it), the clock is fake.
The PVC preflight's Job wait (ops/draft_preflight_pvc._wait) is the Job row's, tested here too."""
import ast
import copy
import os

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import model_metadata, pvc_metadata
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import cluster as llmisvc_cluster
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as kube_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary_wait, draft_preflight_pvc
from tests.fake_clock import FakeClock
from tests.paths import REPO

NS = "ns"
JOB_PATH = "/apis/batch/v1/namespaces/ns/jobs/j"
PODS_PATH = "/api/v1/namespaces/ns/pods"
DEPLOYMENT_PATH = "/apis/apps/v1/namespaces/ns/deployments/d"
ISVC_PATH = "/apis/serving.kserve.io/v1beta1/namespaces/ns/inferenceservices/m"
WATCH_WINDOW = 5  # seconds a scripted watch lasts without an event


class Api:
    """Scripted answers per path: each read takes the next answer, the last one stays; every call is recorded."""

    def __init__(self):
        self.answers, self.calls = {}, []

    def request(self, _api_client, method, path, query=None, **_kwargs):
        self.calls.append((method, path, (query or {}).get("labelSelector")))
        queue = self.answers[path]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        return copy.deepcopy(answer)


@pytest.fixture
def api(monkeypatch):
    """The scripted API, and watches that end without an event after their window (the loop reads the object again)."""
    fake, clock = Api(), FakeClock()
    monkeypatch.setattr(kube_client, "request", fake.request)

    def watch(_api, _ns, _name, _rv, seconds, kind=None):  # pylint: disable=unused-argument
        clock.now += min(seconds, WATCH_WINDOW)
    monkeypatch.setattr(kube_wait, "_watch_for_change", watch)
    fake.clock = clock
    return fake


class Reader:
    """A ``kind`` of kube/wait.wait_for that answers every read with one object."""
    group, version, plural = "serving.kserve.io", "v1alpha2", "llminferenceservices"

    def __init__(self, kind, obj):
        self.kind, self.obj = kind, obj

    def get(self, _api_client, _namespace, _name):
        return self.obj


def _deployment(observed=2, updated=2, total=2, available=2):
    return {"metadata": {"name": "d", "namespace": NS, "generation": 2, "resourceVersion": "1"}, "spec": {"replicas": 2},
            "status": {"observedGeneration": observed, "updatedReplicas": updated, "replicas": total, "availableReplicas": available}}


def _job(*conditions, active=1):
    return {"metadata": {"name": "j", "namespace": NS, "resourceVersion": "1"},
            "status": {"active": active, "conditions": [{"type": t, "status": "True", "reason": r, "message": m} for t, r, m in conditions]}}


def _pod(name, phase="Pending", waiting=None, restarts=0, labels=None):
    state = {"waiting": {"reason": waiting, "message": "back-off pulling image"}} if waiting else {"running": {}}
    return {"metadata": {"name": name, "namespace": NS, "labels": labels or {}}, "spec": {"containers": [{"name": "kserve-container"}]},
            "status": {"phase": phase, "containerStatuses": [{"name": "kserve-container", "state": state, "restartCount": restarts}]}}


def _isvc(generation=2, observed=2, ready=True, canary=None):
    status = {"observedGeneration": observed, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if canary is not None:
        status["canaryStatuses"] = [{"name": "spec", "ready": canary[0], "trafficPercent": canary[1]}]
    return {"metadata": {"name": "m", "namespace": NS, "generation": generation, "resourceVersion": "7"},
            "spec": {"predictor": {"name": "base"}}, "status": status}


# -- Deployment rollout --------------------------------------------------------------------------------------------------

def test_deployment_row_waits_for_the_rollout_and_times_out_naming_it(api):
    cluster = kube_service.ClusterService(None)
    api.answers[DEPLOYMENT_PATH] = [_deployment(updated=1, total=3), _deployment()]
    dep, elapsed = cluster.wait_for(NS, "d", kube_service.DEPLOYMENT, timeout=60, interval=5, clock=api.clock, sleep=api.clock.sleep)
    # a rollout shows on the Deployment's status: watched (one window without an event), then read again and passed
    assert dep["status"]["updatedReplicas"] == 2 and elapsed == WATCH_WINDOW and api.clock.sleeps == []
    assert [c[1] for c in api.calls] == [DEPLOYMENT_PATH, DEPLOYMENT_PATH]

    api.answers[DEPLOYMENT_PATH], api.clock.now = [_deployment(available=1)], 0.0
    with pytest.raises(kube_wait.WaitTimeout) as err:
        cluster.wait_for(NS, "d", kube_service.DEPLOYMENT, timeout=30, interval=5, clock=api.clock, sleep=api.clock.sleep)
    assert str(err.value).startswith("timeout: Deployment ns/d: Deployment d rolling out (2 of 2 updated, 0 old, 1 available) after 30s")
    assert err.value.field == "timeout" and err.value.obj["metadata"]["name"] == "d"


# -- Job -----------------------------------------------------------------------------------------------------------------

def test_job_row_passes_on_complete_and_with_finished_on_failed_too():
    assert kube_wait.pending("Job", _job(("Complete", None, None))) is None
    failed = _job(("Failed", "BackoffLimitExceeded", "1 failure"))
    with pytest.raises(kube_wait.SpecDecodingError, match="Job j failed: BackoffLimitExceeded: 1 failure"):
        kube_wait.pending("Job", failed)
    assert kube_wait.pending("Job", failed, None, finished=True) is None  # ended: the caller reads the pod's log
    assert kube_wait.pending("Job", _job(), None, finished=True) == "Job j not complete (1 active, 0 succeeded)"


def test_job_row_looks_at_its_pods_and_fails_at_once_on_one_that_cannot_start(api):
    api.answers[PODS_PATH] = [{"items": [_pod("j-1")]}]
    why = kube_wait.pending("Job", _job(), None, pod_selector="job-name=j", pod_interval=2.5)
    assert isinstance(why, kube_wait.LookAgain) and why.after == 2.5 and why == "Job j not complete (1 active, 0 succeeded)"
    assert api.calls == [("GET", PODS_PATH, "job-name=j")]

    api.answers[PODS_PATH] = [{"items": [_pod("j-1", waiting="ImagePullBackOff")]}]
    with pytest.raises(kube_wait.PodCannotStart) as err:
        kube_wait.pending("Job", _job(), None, pod_selector="job-name=j")
    assert (err.value.pod, err.value.reason, err.value.detail) == ("j-1", "ImagePullBackOff", "back-off pulling image")
    assert str(err.value).startswith("image: the pod ns/j-1 of Job j cannot start: ImagePullBackOff: back-off pulling image. Fix: ")


def test_job_wait_through_the_cluster_service_polls_its_pods_then_times_out(api):
    cluster = kube_service.ClusterService(None)
    api.answers[JOB_PATH] = [_job(), _job(), _job(("Complete", None, None), active=0)]
    api.answers[PODS_PATH] = [{"items": [_pod("j-1", phase="Running")]}]
    job, elapsed = cluster.wait_for(NS, "j", kube_service.JOB, timeout=60, interval=5, clock=api.clock, sleep=api.clock.sleep,
                                    finished=True, pod_selector="job-name=j")
    # a pod's state does not change the Job: read again every pod_interval (1 s), no watch
    assert job["status"]["conditions"][0]["type"] == "Complete" and elapsed == 2.0 and api.clock.sleeps == [1.0, 1.0]

    api.answers[JOB_PATH], api.clock.now, api.clock.sleeps[:] = [_job()], 0.0, []
    with pytest.raises(kube_wait.WaitTimeout, match=r"^timeout: Job ns/j: Job j not complete \(1 active, 0 succeeded\) after 10s"):
        cluster.wait_for(NS, "j", kube_service.JOB, timeout=10, interval=5, clock=api.clock, sleep=api.clock.sleep,
                         finished=True, pod_selector="job-name=j")
    assert sum(api.clock.sleeps) == 10


def test_job_outcome_says_how_the_job_ended_with_its_newest_pods_log(api, monkeypatch):
    """ClusterService.job_outcome (module job_outcome_info, the stager's and the draft remover's wait): the Job row with
    finished, then the newest pod's log; a failed Job is an outcome, not an error; a Job that ended without a pod has no log."""
    cluster = kube_service.ClusterService(None)
    logs = []
    monkeypatch.setattr(cluster, "pod_log_text", lambda ns, pod, **kw: logs.append((ns, pod, kw)) or "log of %s" % pod)
    older, newer = _pod("j-1", phase="Failed"), _pod("j-2", phase="Failed")
    older["metadata"]["creationTimestamp"], newer["metadata"]["creationTimestamp"] = "2026-12-06T10:00:00Z", "2026-12-06T10:01:00Z"
    api.answers[JOB_PATH] = [_job(), _job(("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"), active=0)]
    api.answers[PODS_PATH] = [{"items": [newer, older]}]
    out = cluster.job_outcome(NS, "j", 60, container="stager", interval=2, clock=api.clock, sleep=api.clock.sleep)
    assert (out["ended"], out["condition"]["reason"], out["pod"], out["pod_phase"], out["log"]) == \
        ("Failed", "BackoffLimitExceeded", "j-2", "Failed", "log of j-2")
    assert logs == [(NS, "j-2", {"container": "stager", "max_bytes": None})] and api.clock.sleeps == [2]

    # a newer retry that never ran (the deadline stopped it first) has no log: the newest pod that ran says why
    never_ran = _pod("j-3", waiting="ContainerCreating")
    never_ran["metadata"]["creationTimestamp"] = "2026-12-06T10:02:00Z"
    api.answers[JOB_PATH] = [_job(("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"), active=0)]
    api.answers[PODS_PATH] = [{"items": [older, never_ran, newer]}]
    out = cluster.job_outcome(NS, "j", 60, max_bytes=100, clock=api.clock, sleep=api.clock.sleep)
    assert (out["pod"], out["pod_phase"], out["log"]) == ("j-2", "Failed", "log of j-2")
    assert logs[-1] == (NS, "j-2", {"container": None, "max_bytes": 100})
    del logs[1:]

    api.answers[JOB_PATH] = [_job(("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"), active=0)]
    api.answers[PODS_PATH] = [{"items": []}]
    out = cluster.job_outcome(NS, "j", 60, clock=api.clock, sleep=api.clock.sleep)
    assert (out["ended"], out["pod"], out["pod_phase"], out["log"]) == ("Failed", None, None, "") and len(logs) == 1

    api.answers[JOB_PATH], api.answers[PODS_PATH] = [_job()], [{"items": [_pod("j-1", waiting="ImagePullBackOff")]}]
    with pytest.raises(kube_wait.PodCannotStart, match="the pod ns/j-1 of Job j cannot start: ImagePullBackOff"):
        cluster.job_outcome(NS, "j", 60, clock=api.clock, sleep=api.clock.sleep)


def test_the_pvc_preflight_waits_on_the_job_row(api, monkeypatch):
    """ops/draft_preflight_pvc._outcome: the cluster service's job_outcome (the Job row, the log of the pod that ran, read
    up to the preflight's cap); a pod that cannot start, a Job failed without a pod that ran, the timeout and a log the API
    server refuses are each a MetadataUnreadable naming the option to change or what failed."""
    outcome = draft_preflight_pvc._outcome  # pylint: disable=protected-access
    logs = []

    def log_text(_self, namespace, pod, **kwargs):
        logs.append((namespace, pod, kwargs))
        if pod == "refused":
            raise kube_pods.PodAccessError("reading log of pod %s/%s container reader failed: pods/log is forbidden" % (namespace, pod))
        return "result of %s" % pod
    monkeypatch.setattr(kube_service.ClusterService, "pod_log_text", log_text)
    api.answers[JOB_PATH] = [_job(), _job(("Complete", None, None), active=0)]
    api.answers[PODS_PATH] = [{"items": [_pod("j-1", phase="Running")]}, {"items": [_pod("j-1", phase="Succeeded")]}]
    out = outcome(None, NS, "j", 120, api.clock, api.clock.sleep)
    assert (out["pod"], out["pod_phase"], out["log"]) == ("j-1", "Succeeded", "result of j-1") and api.clock.sleeps == [1.0]
    assert logs == [(NS, "j-1", {"container": pvc_metadata.CONTAINER, "max_bytes": draft_preflight_pvc.MAX_LOG_BYTES})]

    api.answers[JOB_PATH] = [_job()]
    api.answers[PODS_PATH] = [{"items": [_pod("j-1", waiting="ErrImagePull")]}]
    with pytest.raises(model_metadata.MetadataUnreadable) as err:
        outcome(None, NS, "j", 120, api.clock, api.clock.sleep)
    assert err.value.field == "pvc_image" and "the PVC read Job's pod ns/j-1 cannot start: ErrImagePull" in str(err.value)

    api.answers[JOB_PATH] = [_job(("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"), active=0)]
    api.answers[PODS_PATH] = [{"items": [_pod("j-1", waiting="ContainerCreating")]}]
    with pytest.raises(model_metadata.MetadataUnreadable, match="the PVC read Job ns/j failed: DeadlineExceeded: Job was active"):
        outcome(None, NS, "j", 120, api.clock, api.clock.sleep)

    api.answers[JOB_PATH] = [_job(("Complete", None, None), active=0)]
    api.answers[PODS_PATH] = [{"items": [_pod("refused", phase="Succeeded")]}]
    with pytest.raises(model_metadata.MetadataUnreadable, match="the PVC read Job ns/j: reading log of pod ns/refused container reader "
                                                                "failed: pods/log is forbidden"):
        outcome(None, NS, "j", 120, api.clock, api.clock.sleep)

    api.answers[JOB_PATH], api.answers[PODS_PATH], api.clock.now = [_job()], [{"items": [_pod("j-1")]}], 0.0
    with pytest.raises(model_metadata.MetadataUnreadable) as err:
        outcome(None, NS, "j", 120, api.clock, api.clock.sleep)
    assert err.value.field == "pvc_timeout" and "did not end within 120 s" in str(err.value) and api.clock.now == 150


# -- InferenceService and LLMInferenceService pools --------------------------------------------------------------------

def test_inference_service_row_is_ready_at_the_generation_and_times_out_with_the_conditions(api):
    assert kube_wait.pending("InferenceService", _isvc()) is None
    assert kube_wait.pending("InferenceService", _isvc(observed=1)) == "not reconciled yet"
    assert kube_wait.pending("InferenceService", _isvc(ready=False)) == "not Ready"
    api.answers[ISVC_PATH] = [_isvc(observed=1), _isvc()]
    api.answers[PODS_PATH] = [{"items": []}]
    isvc, _elapsed = isvc_wait.wait_for_row(None, NS, "m", "InferenceService", timeout=60, clock=api.clock, sleep=api.clock.sleep)
    assert isvc["status"]["observedGeneration"] == 2

    api.answers[ISVC_PATH], api.clock.now = [_isvc(ready=False)], 0.0
    with pytest.raises(isvc_wait.WaitTimeout) as err:
        isvc_wait.wait_for_row(None, NS, "m", "InferenceService", timeout=20, clock=api.clock, sleep=api.clock.sleep)
    assert str(err.value).startswith("InferenceService ns/m: not Ready after 20s: generation 2, observedGeneration 2; conditions: Ready=False")
    assert err.value.isvc["metadata"]["name"] == "m" and err.value.pods == []


def test_llm_inference_service_pools_row_looks_again_while_a_pool_rolls_out(monkeypatch):
    llm = {"metadata": {"name": "m", "namespace": NS, "generation": 1},
           "status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}}
    rolling = ["pool decode: Deployment m-kserve rolling out (0 of 1 updated, 1 old, 1 available)", None]
    monkeypatch.setattr(llmisvc_cluster, "rollout_pending", lambda _api, _obj: rolling.pop(0))
    assert kube_wait.pending("LLMInferenceService", llm) is None  # Ready at the generation; the pools only when asked
    why = kube_wait.pending("LLMInferenceService", llm, None, pools=True)
    assert isinstance(why, kube_wait.LookAgain) and why.startswith("pool decode: Deployment m-kserve rolling out") and why.after == 1.0
    assert kube_wait.pending("LLMInferenceService", llm, None, pools=True) is None
    llm["status"]["observedGeneration"] = 0
    assert kube_wait.pending("LLMInferenceService", llm, None, pools=True) == "not reconciled yet"

    # timed out while a pool still rolls out: the loop read every second, the error names the pool
    monkeypatch.setattr(llmisvc_cluster, "rollout_pending", lambda _api, _obj: "pool decode: LeaderWorkerSet m-kserve-mn not Available")
    llm["status"]["observedGeneration"] = 1
    clock = FakeClock()
    with pytest.raises(kube_wait.WaitTimeout, match="pool decode: LeaderWorkerSet m-kserve-mn not Available after 3s"):
        kube_wait.wait_ready(None, NS, "m", Reader("LLMInferenceService", llm), timeout=3, clock=clock, sleep=clock.sleep, pools=True)
    assert clock.sleeps == [1.0, 1.0, 1.0]


# -- the canary revisions ----------------------------------------------------------------------------------------------

def test_canary_row_present_waits_for_both_revisions_on_the_percent(api):
    options = {"state": "present", "mode": "Standard", "canary_name": "spec", "percent": 10}
    assert kube_wait.pending(canary_wait.CANARY, _isvc(canary=(True, 10)), None, **options) is None
    assert kube_wait.pending(canary_wait.CANARY, _isvc(canary=(True, 20)), None, **options) == "canary traffic 20%, want 10%"
    assert kube_wait.pending(canary_wait.CANARY, _isvc(canary=(False, 10)), None, **options) == "canary spec not ready"

    api.answers[ISVC_PATH] = [_isvc(canary=(False, 10)), _isvc(canary=(True, 10))]
    isvc, _elapsed, state = canary_wait.wait_step(None, NS, "m", "present", "Standard", "spec", 10, 60, clock=api.clock, sleep=api.clock.sleep)
    assert state["done"] and isvc["status"]["canaryStatuses"][0]["ready"]

    api.answers[ISVC_PATH], api.answers[PODS_PATH], api.clock.now = [_isvc(canary=(False, 10))], [{"items": []}], 0.0
    with pytest.raises(isvc_wait.WaitTimeout, match="^InferenceService ns/m: canary spec not ready after 30s"):
        canary_wait.wait_step(None, NS, "m", "present", "Standard", "spec", 10, 30, clock=api.clock, sleep=api.clock.sleep)


def test_canary_row_fails_at_once_on_a_crash_looping_canary_revision(api):
    api.answers[ISVC_PATH] = [_isvc(canary=(False, 10))]
    api.answers[PODS_PATH] = [{"items": [_pod("m-predictor-spec-1", phase="Running", restarts=1)]},
                              {"items": [_pod("m-predictor-spec-1", phase="Running", restarts=3)]}]
    with pytest.raises(isvc_wait.WaitTimeout) as err:
        canary_wait.wait_step(None, NS, "m", "present", "Standard", "spec", 10, 600, clock=api.clock, sleep=api.clock.sleep,
                              crash_loop_restarts=3)
    assert err.value.field == "wait_crash_loop_restarts" and "the canary revision" in str(err.value) and "restarted 3 times" in str(err.value)
    # the restarts do not change the InferenceService: its pods were looked at again after 2 s, not at the timeout
    assert api.clock.sleeps == [canary_wait.CRASH_LOOP_INTERVAL]


def test_canary_row_promoted_waits_for_the_retired_revisions_pods_to_go(api):
    options = {"state": "promoted", "mode": "Standard", "canary_name": "spec", "retired": "app=isvc.m-predictor-base"}
    assert kube_wait.pending(canary_wait.CANARY, _isvc(canary=(True, 10)), None, **options) == \
        "not Ready without a canary at the current generation"
    api.answers[PODS_PATH] = [{"items": [_pod("old-1", phase="Running")]}, {"items": []}]
    why = kube_wait.pending(canary_wait.CANARY, _isvc(), None, **options)
    assert isinstance(why, kube_wait.LookAgain) and why == "pods of the retired revision (app=isvc.m-predictor-base) still serve: old-1"
    assert kube_wait.pending(canary_wait.CANARY, _isvc(), None, **options) is None

    api.answers[ISVC_PATH] = [_isvc()]
    api.answers[PODS_PATH] = [{"items": [_pod("old-1", phase="Running")]}, {"items": []}]
    _isvc_read, elapsed, state = canary_wait.wait_step(None, NS, "m", "promoted", "Standard", "spec", None, 60, retired=options["retired"],
                                                       clock=api.clock, sleep=api.clock.sleep)
    assert state == {"done": True, "why": "promoted: 100% on one revision"} and elapsed == canary_wait.RETIRED_INTERVAL

    api.answers[PODS_PATH], api.clock.now = [{"items": [_pod("old-1", phase="Running")]}], 0.0
    with pytest.raises(isvc_wait.WaitTimeout, match=r"pods of the retired revision \(app=isvc.m-predictor-base\) still serve: old-1 after 5s"):
        canary_wait.wait_step(None, NS, "m", "promoted", "Standard", "spec", None, 5, retired=options["retired"], clock=api.clock,
                              sleep=api.clock.sleep)


def test_every_kind_of_the_issue_is_a_row_of_the_one_table():
    assert {"Deployment", "Job", "InferenceService", "LLMInferenceService", canary_wait.CANARY} <= set(kube_wait.READINESS)


# module_utils files whose loops sleep for something other than an object of the cluster becoming ready; kube/wait.py's
# loop is the one wait for the cluster.
SLEEPS_FOR_ANOTHER_REASON = {
    "kube/wait.py": "the one wait loop",
    "ops/canary.py": "the observation window: live traffic for a given time, then scraped again",
    "artifacts/registry.py": "an OCI registry's retry back-off",
    "artifacts/artifact_sync/serve.py": "the stager pod's own idle exit",
    "bench/stream_client.py": "the load client's schedule: each request is released at its arrival offset",
}


def _sleeping_loops(path):
    """Line numbers of the loops (while/for) of a file that call a ``sleep``."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.While, ast.For)) and any(
                isinstance(sub, ast.Call) and getattr(sub.func, "attr", getattr(sub.func, "id", None)) == "sleep" for sub in ast.walk(node)):
            lines.append(node.lineno)
    return lines


def test_kube_wait_is_the_only_module_that_loops_to_wait_for_the_cluster():
    """No loop that sleeps outside kube/wait.py but the listed ones (each sleeps for something else); a listed file that
    no longer has one fails too, so the list says what is true."""
    root = os.path.join(REPO, "plugins", "module_utils")
    found = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                lines = _sleeping_loops(os.path.join(folder, name))
                if lines:
                    found[os.path.relpath(os.path.join(folder, name), root)] = lines
    assert {path: lines for path, lines in found.items() if path not in SLEEPS_FOR_ANOTHER_REASON} == {}
    assert set(SLEEPS_FOR_ANOTHER_REASON) - set(found) == set()
