"""LLMInferenceService multi-node pools on the test bed: spec.worker makes KServe's controller (stand-in written from
workload_multi_node.go) run the pool as a LeaderWorkerSet (trimmed upstream CRD, the LWS controller's pod labels and
status), and data parallelism spread over the pods of a group (ParallelismSpec.GetSize = data / dataLocal pods).

Module logic runs in-process (tests/module_run.py) against the real API server: isvc_wait (KServe's conditions at the
generation, then the LeaderWorkerSet's own rollout) and llmisvc_engine_config_info (the engine line of each group's leader;
workers silent). The role wiring (verify.yml -> these modules) is covered by test_llmisvc_testbed.py.
"""
from __future__ import annotations

import pytest

from tests.ansible_run import run_playbook
from tests.module_run import run_module
from tests.paths import read_capture
from tests.testbed.kubelet import free_port_on, host_ipv4

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics

LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
GEN = "testbed.alauda.io/isvc-generation"
EAGLE3 = {"method": "eagle3", "model": "/mnt/models/tiny-eagle3", "num_spec_tokens": 3}  # as recorded (tests/fixtures/vllm/eagle3)
WORKER_LOG = "(RayWorkerWrapper pid=311) INFO 12-01 13:48:20 [worker.py:88] Loading weights for pipeline stage 1\n"


def _manifest(namespace, name, parallelism, replicas=1, leader_template=True):
    """What isvc_manifest renders for an LLMInferenceService, with the pod template also as spec.worker (multi-node):
    leader and workers run the same vLLM command, as in KServe's multi-node presets."""
    out = run_module("isvc_manifest", {"resource_kind": "LLMInferenceService", "name": name, "namespace": namespace,
                                       "method": "eagle3", "artifact_mode": "pvc",
                                       "artifacts": {"pvc_name": "model-store", "draft_subdir": "tiny-eagle3"},
                                       "runtime": "unused", "vllm_version": "0.32.0", "gpu_count": 0, "min_replicas": replicas,
                                       "max_replicas": replicas,
                                       "llmisvc": {"image": "registry.local/vllm/vllm-openai:v0.32.0", "parallelism": parallelism}})
    assert not out.failed, out.msg
    manifest = out["manifest"]
    spec = manifest["spec"]
    spec["worker"] = spec["template"] if not leader_template else dict(spec["template"])
    if not leader_template:
        del spec["template"]
    return manifest


def _apply(kubeconfig, manifest):
    out = run_module("kubernetes.core.k8s", {"kubeconfig": kubeconfig, "state": "present", "definition": manifest,
                                             "apply": True, "server_side_apply": {"field_manager": "alauda-spec-decoding",
                                                                                  "force_conflicts": True}})
    assert not out.failed, out.msg
    return out


def _wait(kubeconfig, namespace, name):
    return run_module("isvc_wait", {"kubeconfig": kubeconfig, "kind": "LLMInferenceService", "name": name,
                                    "namespace": namespace, "timeout": 40, "interval": 1})


def _engine(kubeconfig, namespace, name, **extra):
    return run_module("llmisvc_engine_config_info", dict({"kubeconfig": kubeconfig, "name": name, "namespace": namespace}, **extra))


def _pods(k8s_client, namespace, selector):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    items = client.CoreV1Api(k8s_client).list_namespaced_pod(namespace, label_selector=selector).items
    return {p.metadata.name: p for p in items if p.metadata.deletion_timestamp is None}


def test_multi_node_pool_runs_as_a_leaderworkerset_and_verify_reads_each_groups_leader(kubeconfig, k8s_client, llmisvc, namespace):
    """spec.worker + pipeline 2, 2 replicas: LWS <name>-kserve-mn with 2 groups of 2 pods; the leaders log the line,
    the workers (pipeline stage 1) only their own lines; then an edit rolls the groups and the wait waits for it."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    name = "mn-eagle3"
    eagle3 = read_capture("eagle3", "startup.log")
    llmisvc.set_behaviour(namespace, name, pool="decode_leader", ready_after=0.2, logs={"main": eagle3})
    llmisvc.set_behaviour(namespace, name, pool="decode_worker", ready_after=0.2, logs={"main": WORKER_LOG})
    manifest = _manifest(namespace, name, {"pipeline": 2}, replicas=2)
    _apply(kubeconfig, manifest)
    ready = _wait(kubeconfig, namespace, name)
    assert not ready.failed, ready.msg
    conds = {c["type"]: c["status"] for c in ready["resource"]["status"]["conditions"]}
    assert conds["WorkerWorkloadReady"] == "True" and "MainWorkloadReady" not in conds and conds["Ready"] == "True"

    lws = client.CustomObjectsApi(k8s_client).get_namespaced_custom_object(LWS_GROUP, LWS_VERSION, namespace, LWS_PLURAL,
                                                                           name + "-kserve-mn")
    assert lws["spec"]["replicas"] == 2 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"  # the CRD's defaults and KServe's values are there
    assert lws["status"]["readyReplicas"] == lws["status"]["updatedReplicas"] == 2
    pods = _pods(k8s_client, namespace, "leaderworkerset.sigs.k8s.io/name=%s-kserve-mn" % name)
    assert sorted(pods) == ["mn-eagle3-kserve-mn-0", "mn-eagle3-kserve-mn-0-1", "mn-eagle3-kserve-mn-1", "mn-eagle3-kserve-mn-1-1"]
    leader = pods["mn-eagle3-kserve-mn-1"].metadata.labels
    assert leader["app.kubernetes.io/component"] == "llminferenceservice-workload-leader"
    assert leader["leaderworkerset.sigs.k8s.io/group-index"] == "1" and leader["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert pods["mn-eagle3-kserve-mn-1-1"].metadata.labels["app.kubernetes.io/component"] == "llminferenceservice-workload-worker"
    with pytest.raises(client.exceptions.ApiException) as gone:
        client.AppsV1Api(k8s_client).read_namespaced_deployment(name + "-kserve", namespace)
    assert gone.value.status == 404

    verified = _engine(kubeconfig, namespace, name)
    assert not verified.failed, verified.msg
    decode = verified["pools"]["decode"]
    assert decode["workload"] == {"kind": "LeaderWorkerSet", "name": name + "-kserve-mn"}
    assert decode["engine_pod"] == "mn-eagle3-kserve-mn-0" and decode["speculative_config"] == EAGLE3
    assert [(g["group"], g["leader"], g["workers"], g["engine_pod"]) for g in decode["groups"]] == [
        (0, "mn-eagle3-kserve-mn-0", ["mn-eagle3-kserve-mn-0-1"], "mn-eagle3-kserve-mn-0"),
        (1, "mn-eagle3-kserve-mn-1", ["mn-eagle3-kserve-mn-1-1"], "mn-eagle3-kserve-mn-1")]

    # A leader that did not log the line fails, naming group and pod; so does a worker that contradicts the flag.
    llmisvc.kubelet.write_log(namespace, "mn-eagle3-kserve-mn-1", "main", WORKER_LOG, append=False)
    silent = _engine(kubeconfig, namespace, name)
    assert silent.failed and "group 1 leader pod mn-eagle3-kserve-mn-1: no engine-config line" in silent.msg, silent.msg
    llmisvc.kubelet.write_log(namespace, "mn-eagle3-kserve-mn-1", "main", eagle3, append=False)
    llmisvc.kubelet.write_log(namespace, "mn-eagle3-kserve-mn-0-1", "main", eagle3.replace("num_spec_tokens=3", "num_spec_tokens=5"),
                              append=False)
    wrong = _engine(kubeconfig, namespace, name)
    assert wrong.failed and "pool decode pod mn-eagle3-kserve-mn-0-1" in wrong.msg, wrong.msg

    # An edit of the pod template rolls the groups (LWS RollingUpdate, one group at a time); the wait returns only when
    # every group runs the new revision and is ready, so every pod then belongs to generation 2.
    baseline = read_capture("baseline", "startup.log")
    llmisvc.set_behaviour(namespace, name, pool="decode_leader", generation=2, ready_after=0.3, logs={"main": baseline})
    llmisvc.set_behaviour(namespace, name, pool="decode_worker", generation=2, ready_after=0.3, logs={"main": WORKER_LOG})
    stripped = run_module("llmisvc_speculative", {"kubeconfig": kubeconfig, "name": name, "namespace": namespace, "state": "absent"})
    assert not stripped.failed and stripped["changed"], stripped.msg
    assert sorted({c["pool"] for c in stripped["changes"]}) == ["decode", "worker"]
    rolled = _wait(kubeconfig, namespace, name)
    assert not rolled.failed and rolled["generation"] == 2, rolled.msg
    pods = _pods(k8s_client, namespace, "leaderworkerset.sigs.k8s.io/name=%s-kserve-mn" % name)
    assert len(pods) == 4 and {p.metadata.annotations[GEN] for p in pods.values()} == {"2"}
    proved = _engine(kubeconfig, namespace, name, expected={"enabled": False})
    assert not proved.failed and proved["pools"]["decode"]["speculative_config"] is None, proved.msg


def test_data_parallel_over_the_pods_of_a_group_verifies_on_rank_0(tmp_path, kubeconfig, k8s_client, llmisvc, namespace):
    """parallelism {data: 2, dataLocal: 1} with only spec.worker (KServe's data-parallel presets): 2 pods per group, the
    leader (LWS_WORKER_INDEX 0, --data-parallel-start-rank 0) logs the line and serves the API, the --headless rank-1
    pod does neither. verify.yml passes, names the rank-0 pod and reads the metrics of the leader only."""
    name = "dp-eagle3"
    eagle3, metrics = read_capture("eagle3", "startup.log"), read_capture("eagle3", "metrics.txt")
    pod_ip = host_ipv4()
    port = free_port_on(pod_ip)
    llmisvc.set_behaviour(namespace, name, ready_after=0.2, logs={"main": eagle3}, pod_ip=pod_ip, http={port: {"/metrics": metrics}})
    llmisvc.set_behaviour(namespace, name, pod=name + "-kserve-mn-0-", ready_after=0.2,
                          logs={"main": "(EngineCore_DP1 pid=9) INFO 12-01 13:48:15 [core.py:701] Waiting for init message\n"})
    _apply(kubeconfig, _manifest(namespace, name, {"data": 2, "dataLocal": 1}, leader_template=False))
    ready = _wait(kubeconfig, namespace, name)
    assert not ready.failed, ready.msg
    pods = _pods(k8s_client, namespace, "leaderworkerset.sigs.k8s.io/name=%s-kserve-mn" % name)
    assert sorted(pods) == [name + "-kserve-mn-0", name + "-kserve-mn-0-1"]
    # without a leader template the leader runs the worker template and carries the workers' labels
    assert pods[name + "-kserve-mn-0"].metadata.labels["app.kubernetes.io/component"] == "llminferenceservice-workload-worker"
    env = {e.name: e.value for e in pods[name + "-kserve-mn-0-1"].spec.containers[0].env}
    assert env["LWS_WORKER_INDEX"] == "1" and env["LWS_GROUP_SIZE"] == "2"

    verified = _engine(kubeconfig, namespace, name)
    assert not verified.failed, verified.msg
    decode = verified["pools"]["decode"]
    assert decode["data_parallel"] == 2 and decode["flag"] == ["resource"]
    assert decode["engine_pod"] == name + "-kserve-mn-0" and decode["speculative_config"] == EAGLE3
    assert [(p["name"], p["found"], p["role"]) for p in decode["pods"]] == [
        (name + "-kserve-mn-0", True, "leader"), (name + "-kserve-mn-0-1", False, "worker")]

    # the role as users run it: verify.yml on the multi-node pool (metrics from the leader: the worker serves nothing)
    verify = run_playbook(tmp_path, "playbooks/verify.yml", kubeconfig=kubeconfig, extra_vars={
        "spec_decoding_hosts": "localhost", "spec_decoding_target": "cluster", "spec_decoding_resource_kind": "LLMInferenceService",
        "verify_name": name, "verify_namespace": namespace, "verify_wait_timeout": 30, "verify_metrics_port": port,
        "verify_metrics_scheme": "http"})
    assert verify.rc == 0, verify.output
    result = verify.result("Register the full verification data")["ansible_facts"]["verify_result"]
    assert result["pools"]["decode"]["engine_pod"] == name + "-kserve-mn-0"
    expected = spec_metrics.summarize(spec_metrics.parse_prometheus(metrics), method="eagle3")
    assert sorted(result["metrics"]) == [name + "-kserve-mn-0"]
    assert result["metrics"][name + "-kserve-mn-0"]["mean_acceptance_length"] == pytest.approx(expected["mean_acceptance_length"])
    summary = "\n".join(verify.result("Summary")["msg"])
    assert "LeaderWorkerSet %s-kserve-mn, 2 pod(s), 1 group(s), leaders %s-kserve-mn-0, engine line from %s-kserve-mn-0" % (
        name, name, name) in summary, summary

    # the non-rank-0 pod contradicting the flag fails the check, naming that pod
    llmisvc.kubelet.write_log(namespace, name + "-kserve-mn-0-1", "main", eagle3.replace("num_spec_tokens=3", "num_spec_tokens=4"),
                              append=False)
    wrong = _engine(kubeconfig, namespace, name)
    assert wrong.failed and "pool decode pod %s-kserve-mn-0-1" % name in wrong.msg and "4" in wrong.msg, wrong.msg


def test_prefill_pool_alone_runs_multi_node_next_to_the_decode_deployment(kubeconfig, llmisvc, namespace):
    """spec.prefill.worker + prefill pipeline 2: the prefill pool is LeaderWorkerSet <name>-kserve-mn-prefill
    (PrefillWorkerWorkloadReady), the decode pool stays Deployment <name>-kserve (MainWorkloadReady); verify reads each
    pool from its own workload, the prefill leader's line (speculative_config=None) counts for the prefill pool."""
    import copy  # pylint: disable=import-outside-toplevel
    name = "pmn-eagle3"
    llmisvc.set_behaviour(namespace, name, pool="decode", ready_after=0.2, logs={"main": read_capture("eagle3", "startup.log")})
    llmisvc.set_behaviour(namespace, name, pool="prefill_leader", ready_after=0.2, logs={"main": read_capture("baseline", "startup.log")})
    llmisvc.set_behaviour(namespace, name, pool="prefill_worker", ready_after=0.2, logs={"main": WORKER_LOG})
    out = run_module("isvc_manifest", {"resource_kind": "LLMInferenceService", "name": name, "namespace": namespace,
                                       "method": "eagle3", "artifact_mode": "pvc",
                                       "artifacts": {"pvc_name": "model-store", "draft_subdir": "tiny-eagle3"},
                                       "runtime": "unused", "vllm_version": "0.32.0", "gpu_count": 0, "min_replicas": 1,
                                       "max_replicas": 1,
                                       "llmisvc": {"image": "registry.local/vllm/vllm-openai:v0.32.0",
                                                   "prefill": {"replicas": 1, "parallelism": {"pipeline": 2}}}})
    assert not out.failed, out.msg
    manifest = out["manifest"]
    manifest["spec"]["prefill"]["worker"] = copy.deepcopy(manifest["spec"]["prefill"]["template"])
    _apply(kubeconfig, manifest)
    ready = _wait(kubeconfig, namespace, name)
    assert not ready.failed, ready.msg
    conds = {c["type"]: c["status"] for c in ready["resource"]["status"]["conditions"]}
    assert conds["MainWorkloadReady"] == conds["PrefillWorkerWorkloadReady"] == "True" and "PrefillWorkloadReady" not in conds

    verified = _engine(kubeconfig, namespace, name)
    assert not verified.failed, verified.msg
    decode, prefill = verified["pools"]["decode"], verified["pools"]["prefill"]
    assert decode["workload"] == {"kind": "Deployment", "name": name + "-kserve"} and decode["speculative_config"] == EAGLE3
    assert prefill["workload"] == {"kind": "LeaderWorkerSet", "name": name + "-kserve-mn-prefill"}
    assert prefill["engine_pod"] == name + "-kserve-mn-prefill-0" and prefill["speculative_config"] is None
    assert [(g["leader"], g["workers"], g["logged_by"]) for g in prefill["groups"]] == [
        (name + "-kserve-mn-prefill-0", [name + "-kserve-mn-prefill-0-1"], [name + "-kserve-mn-prefill-0"])]
