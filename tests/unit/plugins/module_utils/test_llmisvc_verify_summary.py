"""plugins/module_utils/kserve/llmisvc/ verify_summary: what the verify role records and prints for an LLMInferenceService.

The inputs are real: the pools come from ``llmisvc_cluster.engine_report`` reading the recorded vLLM start-up logs (eagle3 on the
decode pool, baseline on the prefill pool) from pods laid out as KServe and the LeaderWorkerSet controller name them, the
acceptance results from the speculative_metrics_info module on the recorded eagle3 /metrics page, registered the way
Ansible registers the role's loop (``ansible_loop_var``, skipped items)."""
import copy
import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import cluster as llmisvc_cluster
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import verify as llmisvc_verify
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import KubeModule
from tests.module_run import run_module
from tests.paths import capture_path, read_capture

SPEC_JSON = '{"method":"eagle3","model":"/mnt/models/tiny-eagle3","num_speculative_tokens":3}'
FLAGGED = {"containers": [{"name": "main", "command": ["vllm", "serve", "/mnt/models"], "args": ["--speculative-config", SPEC_JSON]}]}
PLAIN = {"containers": [{"name": "main", "command": ["vllm", "serve", "/mnt/models"]}]}
RAY_WORKER = "(RayWorkerWrapper pid=3) INFO stage 1\n"


def _pod(name, group=None, worker=None):
    labels = {} if group is None else {llmisvc_model.LWS_GROUP_INDEX_LABEL: str(group), llmisvc_model.LWS_WORKER_INDEX_LABEL: str(worker)}
    return {"name": name, "labels": labels}


def _obj(spec):
    return {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
            "metadata": {"name": "m", "namespace": "models", "generation": 2}, "spec": spec, "status": {}}


@pytest.fixture
def cluster_pods(monkeypatch):
    """Decode pool as a LeaderWorkerSet (group 0 with its leader, group 1 whose leader is being recreated), prefill pool as a
    Deployment of two pods; the pods' logs are the recorded start-up logs."""
    pods = {"m-kserve-mn": [_pod("m-kserve-mn-0", 0, 0), _pod("m-kserve-mn-0-1", 0, 1), _pod("m-kserve-mn-1-1", 1, 1)],
            "llminferenceservice-workload-prefill": [_pod("m-kserve-prefill-a"), _pod("m-kserve-prefill-b")],
            "llminferenceservice-workload,": [_pod("m-kserve-7d9f-a"), _pod("m-kserve-7d9f-b")]}
    eagle3, baseline = read_capture("eagle3", "startup.log"), read_capture("baseline", "startup.log")
    logs = {"m-kserve-mn-0": eagle3, "m-kserve-mn-0-1": RAY_WORKER, "m-kserve-mn-1-1": RAY_WORKER, "m-kserve-prefill-a": baseline,
            "m-kserve-prefill-b": baseline, "m-kserve-7d9f-a": eagle3, "m-kserve-7d9f-b": eagle3}
    monkeypatch.setattr(k8s_pods, "list_pods", lambda _api, _ns, selector: (
        next((list(v) for k, v in pods.items() if k in selector), []), []))
    monkeypatch.setattr(k8s_pods, "stream_pod_log", lambda _api, _ns, pod, **_kw: iter([logs[pod].encode()]))
    return logs


def _pools(spec):
    report, _problems = llmisvc_cluster.engine_report(None, _obj(spec))
    return json.loads(json.dumps(report))  # as the module returns it: JSON


@pytest.fixture(scope="module")
def metrics_result():
    res = run_module("speculative_metrics_info", {"metrics_path": capture_path("eagle3", "metrics.txt"), "method": "eagle3"})
    assert not res.failed, res.msg
    return res


def _registered(metrics_result, *pods, skipped=()):
    """The role's `register: verify_acceptance` of its loop over the decode pods (loop_var verify_llmisvc_pod)."""
    results = [dict(metrics_result, verify_llmisvc_pod=pod, ansible_loop_var="verify_llmisvc_pod", failed=False) for pod in pods]
    results += [{"changed": False, "skipped": True, "false_condition": "verify_metrics | bool and verify_speculative | bool",
                 "verify_llmisvc_pod": pod, "ansible_loop_var": "verify_llmisvc_pod"} for pod in skipped]
    return {"changed": False, "msg": "All items completed", "results": results}


EAGLE3_LINE = "method=eagle3 model=/mnt/models/tiny-eagle3 num_spec_tokens=3"


def test_multi_node_decode_pool_and_prefill_deployment(cluster_pods, metrics_result):
    pools = _pools({"template": FLAGGED, "worker": FLAGGED, "parallelism": {"pipeline": 2}, "prefill": {"template": PLAIN, "replicas": 2}})
    out = llmisvc_verify.verify_summary("models", "m", pools, acceptance=_registered(metrics_result, "m-kserve-mn-0"), generation=2)
    assert out["lines"] == [
        "LLMInferenceService models/m: Ready at generation 2",
        "pool decode (LeaderWorkerSet m-kserve-mn, 3 pod(s), 2 group(s), leaders m-kserve-mn-0 none, engine line from m-kserve-mn-0): "
        + EAGLE3_LINE,
        "pool prefill (Deployment m-kserve-prefill, 2 pod(s), engine line from m-kserve-prefill-a): speculative_config=None",
        "acceptance on m-kserve-mn-0: " + metrics_result["msg"],
    ]
    assert metrics_result["msg"].startswith("source=prometheus; mean acceptance length ")
    assert out["metrics"] == {"m-kserve-mn-0": {"mean_acceptance_length": metrics_result["mean_acceptance_length"],
                                                "draft_acceptance_rate": metrics_result["draft_acceptance_rate"],
                                                "diagnosis": metrics_result["diagnosis"], "msg": metrics_result["msg"]}}


def test_single_node_pool_every_pod_measured_and_skipped_items_left_out(cluster_pods, metrics_result):
    pools = _pools({"template": FLAGGED})
    acceptance = _registered(metrics_result, "m-kserve-7d9f-a", "m-kserve-7d9f-b", skipped=["m-kserve-7d9f-c"])
    out = llmisvc_verify.verify_summary("models", "m", pools, acceptance=acceptance, generation=5)
    assert out["lines"][:2] == ["LLMInferenceService models/m: Ready at generation 5",
                                "pool decode (Deployment m-kserve, 2 pod(s), engine line from m-kserve-7d9f-a): " + EAGLE3_LINE]
    assert out["lines"][2:] == ["acceptance on m-kserve-7d9f-a: " + metrics_result["msg"], "acceptance on m-kserve-7d9f-b: " + metrics_result["msg"]]
    assert sorted(out["metrics"]) == ["m-kserve-7d9f-a", "m-kserve-7d9f-b"]


def test_rollback_proof_without_metrics(cluster_pods, metrics_result):
    """verify_speculative false (after a rollback): the metrics task is skipped on every pod, the summary says None."""
    cluster_pods.update({"m-kserve-7d9f-a": read_capture("baseline", "startup.log"), "m-kserve-7d9f-b": read_capture("baseline", "startup.log")})
    pools = _pools({"template": PLAIN})
    for acceptance in (_registered(metrics_result, skipped=["m-kserve-7d9f-a", "m-kserve-7d9f-b"]), None,
                       {"changed": False, "skipped": True, "results": []}):
        out = llmisvc_verify.verify_summary("models", "m", pools, acceptance=acceptance, generation=3)
        assert out["lines"] == ["LLMInferenceService models/m: Ready at generation 3",
                                "pool decode (Deployment m-kserve, 2 pod(s), engine line from m-kserve-7d9f-a): speculative_config=None"]
        assert out["metrics"] == {}


def test_no_engine_line_and_unknown_generation(cluster_pods):
    pools = _pools({"template": FLAGGED})
    for entry in pools.values():
        entry.update(engine_pod=None, speculative_config=None)
    out = llmisvc_verify.verify_summary("models", "m", pools)
    assert out["lines"] == ["LLMInferenceService models/m: Ready at generation ?",
                            "pool decode (Deployment m-kserve, 2 pod(s), engine line from none): speculative_config=None"]


def test_the_inputs_are_not_changed(cluster_pods, metrics_result):
    pools = _pools({"template": FLAGGED, "worker": FLAGGED, "parallelism": {"pipeline": 2}})
    acceptance = _registered(metrics_result, "m-kserve-mn-0")
    before = copy.deepcopy((pools, acceptance))
    llmisvc_verify.verify_summary("models", "m", pools, acceptance=acceptance, generation=2)
    assert (pools, acceptance) == before


@pytest.mark.parametrize("pools, acceptance, field, fragment", [
    (None, None, "pools", "is not the pools of an engine report"),
    ({"decode": ["pod"]}, None, "pools", "is not the pools of an engine report"),
    ({}, {"results": "x"}, "acceptance", "is a str, not the registered result of a loop"),
    ({}, [1], "acceptance.results[0]", "is a int, not a module result"),
    ({}, {"results": [{"msg": "x"}]}, "acceptance.results[0]", "names no pod (no loop variable)"),
], ids=["none", "pool-not-a-dict", "results-not-a-list", "item-not-a-dict", "item-without-pod"])
def test_bad_input_names_the_field_and_the_fix(pools, acceptance, field, fragment):
    with pytest.raises(ValidationError) as err:
        llmisvc_verify.verify_summary("models", "m", pools, acceptance=acceptance)
    assert err.value.field == field and str(err.value).startswith(field + ": " + fragment) and "Fix:" in str(err.value)


def test_a_newer_vllm_is_read_and_what_it_printed_beyond_the_tables_is_said(cluster_pods):
    """Decode pods running a vLLM newer than the tables (tests/fixtures/vllm/newer/): the engine line is read, the unknown
    field is listed per pool with its pod, and the summary says it once, for the engine line and the /metrics page."""
    from tests.vllm_newer import NEWER  # pylint: disable=import-outside-toplevel
    with open("%s/startup.log" % NEWER, encoding="utf-8") as handle:
        newer_log = handle.read()
    for pod in ("m-kserve-7d9f-a", "m-kserve-7d9f-b"):
        cluster_pods[pod] = newer_log
    pools = _pools(FLAGGED)
    decode = pools["decode"]
    assert decode["speculative_config"]["method"] == "draft_model"
    assert [(n["name"], n["pod"], n["count"]) for n in decode["not_understood"]] == [
        ("adaptive_draft_length", "m-kserve-7d9f-a", 1), ("adaptive_draft_length", "m-kserve-7d9f-b", 1)]
    newer_metrics = run_module("speculative_metrics_info", {"metrics_path": "%s/metrics.txt" % NEWER})
    summary = llmisvc_verify.verify_summary("models", "m", pools, acceptance=_registered(newer_metrics, "m-kserve-7d9f-a"))
    said = [line for line in summary["lines"] if line.startswith("not understood: ")]
    assert len(said) == 1 and said[0].count(" | ") == 1, summary["lines"]


def test_the_module_returns_and_warns_what_the_pods_printed_beyond_the_tables(cluster_pods, monkeypatch):
    from tests.vllm_newer import NEWER  # pylint: disable=import-outside-toplevel
    with open("%s/startup.log" % NEWER, encoding="utf-8") as handle:
        cluster_pods["m-kserve-7d9f-a"] = cluster_pods["m-kserve-7d9f-b"] = handle.read()
    draft = '{"method":"draft_model","model":"/mnt/models/tiny-draft","num_speculative_tokens":3}'
    spec = {"template": {"containers": [{"name": "main", "command": ["vllm", "serve", "/mnt/models"],
                                         "args": ["--speculative-config", draft]}]}}
    monkeypatch.setattr(llmisvc_cluster, "get", lambda *_a: _obj(spec))
    monkeypatch.setattr(llmisvc_cluster, "read_presets", lambda *_a, **_kw: None)
    monkeypatch.setattr(KubeModule, "api_client", property(lambda _self: None))  # every read above is replaced
    res = run_module("llmisvc_engine_config_info", {"name": "m", "namespace": "models"})
    assert not res.failed, res.msg
    assert [(n["name"], n["pool"], n["pod"]) for n in res["not_understood"]] == [
        ("adaptive_draft_length", "decode", "m-kserve-7d9f-a"), ("adaptive_draft_length", "decode", "m-kserve-7d9f-b")]
    assert len(res.warning_messages) == 1 and "engine line adaptive_draft_length" in res.warning_messages[0]
