"""plugins/module_utils/kserve/llmisvc/, multi-node pools (spec.worker -> LeaderWorkerSet) and data parallelism: the pure
parts. Names and labels from KServe's workload_multi_node.go, LWS semantics from sigs.k8s.io/lws (leaderworkerset_types.go,
leaderworkerset_controller.go updateConditions)."""
import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import cluster as llmisvc_cluster
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import status as llmisvc_status
from tests.testbed.llmisvc_standin import lws_crd_body, lws_size

SPEC_JSON = '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'
LINE = ("(EngineCore_DP0 pid=7) INFO 11-29 07:44:56 [core.py:93] Initializing a V1 LLM engine (v0.32.0) with config: "
        "model='/mnt/models', speculative_config=SpeculativeConfig(method='eagle3', model='/mnt/models/draft', "
        "num_spec_tokens=3), tokenizer='/mnt/models'\n")
FLAGGED = {"containers": [{"name": "main", "command": ["vllm", "serve", "/mnt/models"], "args": ["--speculative-config", SPEC_JSON]}]}
PLAIN = {"containers": [{"name": "main", "command": ["vllm", "serve", "/mnt/models"]}]}


def _obj(spec, generation=1, observed=None, conditions=()):
    status = {"conditions": [{"type": t, "status": s} for t, s in conditions]}
    if observed is not None:
        status["observedGeneration"] = observed
    return {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
            "metadata": {"name": "m", "namespace": "ns", "generation": generation}, "spec": spec, "status": status}


def _pod(name, group=None, worker=None):
    labels = {}
    if group is not None:
        labels = {llmisvc_model.LWS_GROUP_INDEX_LABEL: str(group), llmisvc_model.LWS_WORKER_INDEX_LABEL: str(worker)}
    return {"name": name, "labels": labels}


def test_names_selectors_and_pod_roles_follow_kserve_and_lws():
    assert llmisvc_model.lws_name("m", "decode") == "m-kserve-mn" and llmisvc_model.lws_name("m", "prefill") == "m-kserve-mn-prefill"
    assert llmisvc_model.pod_selector("m", "decode", multi_node=True) == "leaderworkerset.sigs.k8s.io/name=m-kserve-mn"
    assert llmisvc_model.pod_selector("m", "prefill", multi_node=True) == "leaderworkerset.sigs.k8s.io/name=m-kserve-mn-prefill"
    assert llmisvc_model.pod_selector("m", "decode").startswith("app.kubernetes.io/component=llminferenceservice-workload,")
    assert llmisvc_model.all_pods_selector("m") == "app.kubernetes.io/name=m,app.kubernetes.io/part-of=llminferenceservice"
    assert llmisvc_model.pod_pool({"app.kubernetes.io/component": "llminferenceservice-workload-leader"}) == "decode leader"
    assert llmisvc_model.pod_pool({"app.kubernetes.io/component": "llminferenceservice-workload-worker-prefill"}) == "prefill worker"
    assert llmisvc_model.pod_pool({"app.kubernetes.io/component": "llminferenceservice-router-scheduler"}) is None


def test_multi_node_from_the_status_at_the_generation_else_from_the_spec_and_presets():
    # the controller's conditions at the current generation decide (a preset may have brought spec.worker)
    assert llmisvc_status.multi_node(_obj({"template": PLAIN}, 2, 2, [("WorkerWorkloadReady", "True")]), "decode") is True
    assert llmisvc_status.multi_node(_obj({"template": PLAIN, "worker": PLAIN}, 2, 2, [("MainWorkloadReady", "True")]), "decode") is False
    # a status of the previous generation does not: the spec (and the presets it names) does
    stale = _obj({"template": PLAIN, "worker": PLAIN}, 3, 2, [("MainWorkloadReady", "True")])
    assert llmisvc_status.multi_node(stale, "decode") is True and llmisvc_status.multi_node(stale, "prefill") is False
    with_preset = _obj({"template": PLAIN, "baseRefs": [{"name": "dp"}]})
    assert llmisvc_status.multi_node(with_preset, "decode") is False
    assert llmisvc_status.multi_node(with_preset, "decode", presets={"dp": {"spec": {"worker": PLAIN}}}) is True
    prefill = _obj({"template": PLAIN, "prefill": {"worker": PLAIN}})
    assert llmisvc_status.multi_node(prefill, "prefill") is True and llmisvc_status.multi_node(prefill, "decode") is False
    assert llmisvc_status.pools_of(prefill) == ["decode", "prefill"]  # a prefill pool with only workers still is a pool
    assert llmisvc_status.pools_of(_obj({"template": PLAIN})) == ["decode"]


def _lws(generation=2, replicas=2, **status):
    conds = status.pop("conditions", {"Available": "True"})
    body = {"metadata": {"name": "m-kserve-mn", "generation": generation}, "spec": {"replicas": replicas},
            "status": dict({"replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas, "observedGeneration": generation},
                           conditions=[{"type": t, "status": s, "reason": "R"} for t, s in conds.items()], **status)}
    return body


@pytest.mark.parametrize("lws,reason", [
    (_lws(), None),
    # Available left True on the old groups: the LWS controller has not seen the edit yet
    (_lws(observedGeneration=1), "not observed at generation 2"),
    (_lws(conditions={"UpdateInProgress": "True", "Progressing": "True"}, updatedReplicas=1), "1 of 2 groups updated, 2 ready, 2 created, UpdateInProgress"),
    (_lws(readyReplicas=1, conditions={"Progressing": "True"}), "1 ready"),
    (_lws(replicas=1, updatedReplicas=1, readyReplicas=1, conditions={"Available": "True"}) | {"spec": {"replicas": 2}}, "1 of 2 groups updated"),
    (_lws(conditions={"Progressing": "True"}), "not Available (no Available condition yet)"),
])
def test_lws_rollout_pending_follows_the_lws_controllers_status(lws, reason):
    why = llmisvc_cluster.lws_rollout_pending(lws, "decode")
    assert (why is None) if reason is None else (reason in why and why.startswith("pool decode: LeaderWorkerSet m-kserve-mn")), why


def test_lws_rollout_pending_without_status_observed_generation_uses_the_conditions():
    old_release = _lws()
    del old_release["status"]["observedGeneration"]
    assert llmisvc_cluster.lws_rollout_pending(old_release) is None  # nothing tells the generation: the counts decide
    old_release["status"]["conditions"][0]["observedGeneration"] = 1
    assert "not observed at generation 2" in llmisvc_cluster.lws_rollout_pending(old_release)


def test_rollout_pending_reads_the_leaderworkerset_of_a_multi_node_pool(monkeypatch):
    from kubernetes.client.rest import ApiException
    read = []

    class Api:
        def get_namespaced_custom_object(self, group, version, namespace, plural, name):
            read.append((group, version, namespace, plural, name))
            if name == "m-kserve-mn-prefill":
                raise ApiException(status=404)
            return _lws(conditions={"Available": "True"})
    monkeypatch.setattr(llmisvc_cluster, "_custom_api", lambda _client: Api())
    obj = _obj({"template": PLAIN, "worker": PLAIN, "prefill": {"worker": PLAIN}})
    assert llmisvc_cluster.rollout_pending(None, obj) == "pool prefill: LeaderWorkerSet m-kserve-mn-prefill does not exist yet"
    assert read == [("leaderworkerset.x-k8s.io", "v1", "ns", "leaderworkersets", "m-kserve-mn"),
                    ("leaderworkerset.x-k8s.io", "v1", "ns", "leaderworkersets", "m-kserve-mn-prefill")]


def test_rank0_is_the_leader_of_the_lowest_group_not_the_first_name():
    pods = [dict(_pod("m-kserve-mn-10", 10, 0), found=True), dict(_pod("m-kserve-mn-2-1", 2, 1), found=True),
            dict(_pod("m-kserve-mn-2", 2, 0), found=True)]
    assert llmisvc_status.rank0_pod(pods) == "m-kserve-mn-2"
    assert llmisvc_status.rank0_pod([dict(p, found=False) for p in pods]) is None
    assert llmisvc_status.rank0_pod([{"name": "b", "found": True}, {"name": "a", "found": True}]) == "a"  # Deployment pods: by name
    assert llmisvc_status.lws_groups([_pod("x-1-1", 1, 1), _pod("x-0", 0, 0), _pod("x-0-1", 0, 1)]) == [
        {"group": 0, "leader": "x-0", "workers": ["x-0-1"]}, {"group": 1, "leader": None, "workers": ["x-1-1"]}]


@pytest.fixture
def lws_pods(monkeypatch):
    """One LWS group of the decode pool (leader + 1 worker) and a prefill Deployment pod; logs per pod, settable."""
    pods = {"m-kserve-mn": [_pod("m-kserve-mn-0", 0, 0), _pod("m-kserve-mn-0-1", 0, 1)],
            "llminferenceservice-workload-prefill": [{"name": "m-kserve-prefill-a", "labels": {}}]}
    logs = {"m-kserve-mn-0": LINE, "m-kserve-mn-0-1": "(RayWorkerWrapper pid=3) INFO stage 1\n",
            "m-kserve-prefill-a": LINE.replace("speculative_config=SpeculativeConfig(method='eagle3', model='/mnt/models/draft', "
                                               "num_spec_tokens=3)", "speculative_config=None")}
    selectors = []

    def list_pods(_api, _ns, selector):
        selectors.append(selector)
        return next((list(v) for k, v in pods.items() if k in selector), []), []

    def stream(_api, _ns, pod, **_kw):
        if isinstance(logs[pod], Exception):
            raise logs[pod]
        return iter([logs[pod].encode()])
    monkeypatch.setattr(k8s_pods, "list_pods", list_pods)
    monkeypatch.setattr(k8s_pods, "stream_pod_log", stream)
    return pods, logs, selectors


def test_engine_report_reads_the_leader_of_each_group_and_lets_workers_be_silent(lws_pods):
    pods, logs, selectors = lws_pods
    obj = _obj({"template": FLAGGED, "worker": FLAGGED, "parallelism": {"pipeline": 2},
                "prefill": {"template": PLAIN, "replicas": 1}})
    report, problems = llmisvc_cluster.engine_report(None, obj)
    assert problems == [], problems
    decode = report["decode"]
    assert selectors[0] == "leaderworkerset.sigs.k8s.io/name=m-kserve-mn"
    assert decode["workload"] == {"kind": "LeaderWorkerSet", "name": "m-kserve-mn"}
    assert report["prefill"]["workload"] == {"kind": "Deployment", "name": "m-kserve-prefill"}
    assert decode["engine_pod"] == "m-kserve-mn-0" and decode["speculative_config"]["num_spec_tokens"] == 3
    assert decode["groups"] == [{"group": 0, "leader": "m-kserve-mn-0", "workers": ["m-kserve-mn-0-1"],
                                 "engine_pod": "m-kserve-mn-0", "logged_by": ["m-kserve-mn-0"]}]
    assert [(p["role"], p["worker_index"]) for p in decode["pods"]] == [("leader", 0), ("worker", 1)]

    logs["m-kserve-mn-0"] = "nothing yet\n"
    _report, problems = llmisvc_cluster.engine_report(None, obj)
    assert problems == ["pool decode group 0 leader pod m-kserve-mn-0: no engine-config line in container main (the leader "
                        "runs data-parallel rank 0 and the API server)"]
    logs["m-kserve-mn-0"] = LINE
    logs["m-kserve-mn-0-1"] = LINE.replace("num_spec_tokens=3", "num_spec_tokens=5")
    _report, problems = llmisvc_cluster.engine_report(None, obj)
    assert len(problems) == 1 and problems[0].startswith("pool decode pod m-kserve-mn-0-1: ") and "5" in problems[0]
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
    logs["m-kserve-mn-0-1"] = SpecDecodingError("log read refused (403)")
    _report, problems = llmisvc_cluster.engine_report(None, obj)
    assert problems == ["pool decode group 0 worker pod m-kserve-mn-0-1: log read refused (403)"]
    pods["m-kserve-mn"].pop(0)  # the leader is gone (being recreated): the group cannot be verified
    logs["m-kserve-mn-0-1"] = "(RayWorkerWrapper pid=3) INFO stage 1\n"
    report, problems = llmisvc_cluster.engine_report(None, obj)
    assert problems == ["pool decode group 0: no leader pod (worker index 0) running"] and report["decode"]["engine_pod"] is None


def test_without_a_leader_template_the_worker_templates_flag_is_what_the_pool_runs(lws_pods):
    obj = _obj({"worker": FLAGGED, "parallelism": {"data": 2, "dataLocal": 1}})
    report, problems = llmisvc_cluster.engine_report(None, obj)
    assert problems == [], problems
    assert report["decode"]["flag"] == ["resource"] and report["decode"]["data_parallel"] == 2
    assert report["decode"]["expected"]["method"] == "eagle3"
    # a leader template without the flag (workers with it): the leader's engine must run without speculative decoding
    report, problems = llmisvc_cluster.engine_report(None, _obj({"template": PLAIN, "worker": FLAGGED}))
    assert report["decode"]["expected"] == {"enabled": False} and len(problems) == 1 and "m-kserve-mn-0" in problems[0]


def test_wait_describes_every_pool_pod_with_its_multi_node_role(monkeypatch):
    monkeypatch.setattr(k8s_pods, "list_pods", lambda _api, _ns, selector: ([
        {"name": "m-kserve-mn-0", "labels": {"app.kubernetes.io/component": "llminferenceservice-workload-leader"}},
        {"name": "m-kserve-mn-0-1", "labels": {"app.kubernetes.io/component": "llminferenceservice-workload-worker"}},
    ], []) if selector == llmisvc_model.all_pods_selector("m") else ([], []))
    pods = isvc_wait._Kind("LLMInferenceService").pods(None, "ns", "m")  # pylint: disable=protected-access
    assert [(p["name"], p["pool"]) for p in pods] == [("m-kserve-mn-0", "decode leader"), ("m-kserve-mn-0-1", "decode worker")]


@pytest.mark.parametrize("parallelism,size", [
    (None, None), ({"tensor": 8}, None), ({"pipeline": 3}, 3), ({"data": 4, "dataLocal": 2}, 2), ({"data": 2}, 2),
    ({"dataLocal": 4}, 1), ({"data": 8, "dataLocal": 8, "pipeline": 2}, 1),
])
def test_standin_group_size_is_kserves_parallelism_get_size(parallelism, size):
    assert lws_size(parallelism) == size


def test_standin_lws_crd_keeps_the_upstream_names_subresources_and_defaults():
    body = lws_crd_body()
    assert body["metadata"]["name"] == "leaderworkersets.leaderworkerset.x-k8s.io"
    assert body["spec"]["names"]["shortNames"] == ["lws"]
    (version,) = body["spec"]["versions"]
    assert version["name"] == "v1" and version["served"] and version["storage"]
    assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                                                "labelSelectorPath": ".status.hpaPodSelector"}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["replicas"]["default"] == 1 and spec["startupPolicy"]["default"] == "LeaderCreated"
    assert spec["leaderWorkerTemplate"]["properties"]["size"]["default"] == 1
    assert spec["leaderWorkerTemplate"]["properties"]["restartPolicy"]["default"] == "RecreateGroupOnPodRestart"
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"readyReplicas", "updatedReplicas", "replicas", "hpaPodSelector", "observedGeneration", "conditions"} <= set(status)
