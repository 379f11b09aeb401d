"""The speculative-decoding watchdog on the test bed: an ngram InferenceService whose pod (kubelet stand-in) serves /metrics
pages made by prometheus_client with vLLM's names - healthy acceptance for the baseline, unreadable (503) once, then
collapsed acceptance. The baseline is recorded without touching the InferenceService, an unreadable window is `unknown`
and changes nothing, check mode only says it would roll back, and playbooks/watch.yml rolls the flag back with the rollback
role's engine-line proof. Every end state is read back from the API server.
"""
from __future__ import annotations

import json

from prometheus_client import Counter

from tests.ansible_run import run_playbook
from tests.integration.test_canary_rollout import NGRAM, _api, _get, args_for
from tests.integration.test_verify import capture, isvc_manifest
from tests.module_run import run_module
from tests.testbed.kubelet import free_port_on, host_ipv4
from tests.unit.test_canary import FakeVllm

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"


class SpeculativeVllm(FakeVllm):
    """FakeVllm plus vLLM's spec_decode counters (3 draft positions)."""

    def __init__(self, model="llm"):
        super().__init__(model)
        kw = {"labelnames": ["model_name", "engine"], "registry": self.registry}
        self.drafts = Counter("vllm:spec_decode_num_drafts", "c", **kw)
        self.drafted = Counter("vllm:spec_decode_num_draft_tokens", "c", **kw)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "c", **kw)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "c", labelnames=["model_name", "engine", "position"],
                               registry=self.registry)

    def serve_drafting(self, n, acceptance):
        """n requests of 10 drafts x 3 tokens each, ``acceptance`` of the draft tokens accepted."""
        labels = {"model_name": self.model, "engine": "0"}
        for _i in range(n):
            self.serve(0.05, 0.015)
            self.drafts.labels(**labels).inc(10)
            self.drafted.labels(**labels).inc(30)
            self.accepted.labels(**labels).inc(round(30 * acceptance))
            for pos in range(3):
                self.per_pos.labels(position=str(pos), **labels).inc(round(10 * acceptance))


def _pages():
    """The pod's /metrics, one page per read: baseline window (60%), an unreadable window, then collapsed windows (1%)."""
    server = SpeculativeVllm()
    server.serve_drafting(5, 0.6)
    pages = [server.page()]
    server.serve_drafting(40, 0.6)
    pages += [server.page(), (503, "unavailable\n"), (503, "unavailable\n")]
    for _i in range(4):
        server.serve_drafting(40, 0.01)
        pages.append(server.page())
    return pages


def test_watchdog_records_a_baseline_ignores_an_unreadable_window_and_rolls_back_a_collapse(tmp_path, k8s_client, kubeconfig, kserve,
                                                                                            namespace):
    name = "llm"
    ip = host_ipv4()
    assert ip, "the pod-proxy tests need a non-loopback IPv4 address of this host"
    port = free_port_on(ip)
    http = {port: {"/metrics": _pages()}}
    kserve.set_behaviour(namespace, name, ready_after=0.1, logs={"kserve-container": capture("baseline")}, pod_ip=ip, http=http)
    kserve.set_behaviour(namespace, name, ready_after=0.1, logs={"kserve-container": capture("ngram")}, pod_ip=ip, http=http, generation=1)
    manifest = isvc_manifest(name, args_for(port) + ["--speculative-config", json.dumps(NGRAM)])
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
    isvc_wait.wait_ready(k8s_client, namespace, name, timeout=60, interval=0.2)
    args = dict(name=name, namespace=namespace, kubeconfig=kubeconfig, interval=0.2, count=1)

    # no baseline yet: unknown, nothing done
    res = run_module("speculative_watchdog", args)
    assert not res.failed and res["state"] == "unknown" and "no baseline" in res["msg"], res.msg
    res = run_module("speculative_watchdog", dict(args, record_baseline=True))
    assert not res.failed and res["changed"] is True and res["state"] == "recorded", res.msg
    assert res["baseline"]["figures"]["acceptance"]["draft_acceptance_rate"] == 0.6
    isvc = _get(k8s_client, namespace, name)
    assert isvc["metadata"]["generation"] == 1  # recording wrote no KServe object: the pods did not roll
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    cm = client.CoreV1Api(k8s_client).read_namespaced_config_map("llm-spec-decoding-baseline", namespace)
    assert cm.metadata.owner_references[0].uid == isvc["metadata"]["uid"]

    # /metrics unreadable for a window: unknown, nothing written
    res = run_module("speculative_watchdog", dict(args, consecutive_error_limit=0))
    assert not res.failed and res["state"] == "unknown" and res["action"] == "none", res["reasons"]
    assert res["analysis"]["counts"]["error"] == 1 and res["analysis"]["counts"]["fail"] == 0
    assert _get(k8s_client, namespace, name)["metadata"]["generation"] == 1

    # check mode: collapsed, would roll back, nothing written
    res = run_module("speculative_watchdog", dict(args, failure_limit=0), check_mode=True)
    assert not res.failed and res["state"] == "collapsed" and res["would_roll_back"] is True, res["reasons"]
    assert any("acceptance rate" in r for r in res["reasons"]), res["reasons"]
    assert _get(k8s_client, namespace, name)["metadata"]["generation"] == 1

    extra = {"watch_names": ["%s/%s" % (namespace, name)], "watch_interval": 0.2, "watch_count": 1, "watch_failure_limit": 0,
             "watch_wait_timeout": 60, "watch_verify_delay": 1, "watch_report_dir": str(tmp_path / "report")}
    run = run_playbook(tmp_path, "playbooks/watch.yml", extra_vars=extra, kubeconfig=kubeconfig)
    assert run.rc == 0, run.output
    isvc = _get(k8s_client, namespace, name)
    assert "--speculative-config" not in isvc["spec"]["predictor"]["model"]["args"]
    proof = run.result("Prove the engine runs without a proposer on every predictor pod")
    assert proof["speculative_config"] is None and proof["pods"] and all(p["speculative_config"] is None for p in proof["pods"])
    report = json.loads((tmp_path / "report" / "watch.json").read_text())
    assert report["rolled_back"] == ["%s/%s" % (namespace, name)]
    assert report["services"][0]["state"] == "collapsed" and report["services"][0]["action"] == "roll_back"


def test_schedule_renders_a_cronjob_with_least_privilege_and_only_the_watch_variables(tmp_path):
    import yaml  # pylint: disable=import-outside-toplevel
    out = tmp_path / "watch"
    # names and a label selector (the fleet form, issue 53): the job gets both and finds the selected services again
    extra = {"watch_names": ["models/llm", "llm2"], "watch_namespaces": ["team-a"], "watch_label_selector": "team=llm",
             "watch_target": "schedule", "watch_schedule_output_dir": str(out), "watch_schedule_namespace": "ops", "watch_interval": 120}
    run = run_playbook(tmp_path, "playbooks/watch.yml", extra_vars=extra)
    assert run.rc == 0, run.output
    docs = {p.name: yaml.safe_load(p.read_text()) for p in out.glob("*.yaml") if p.name != "kustomization.yaml"}
    roles = {d["metadata"]["namespace"]: d for d in docs.values() if d["kind"] == "Role"}
    assert sorted(roles) == ["models", "team-a"]
    rules = roles["models"]["rules"]
    assert {"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]} in rules
    assert {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]} in rules
    assert {"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"], "verbs": ["get", "list", "watch", "patch"]} in rules
    cron = next(d for d in docs.values() if d["kind"] == "CronJob")
    container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert cron["spec"]["schedule"] == "*/30 * * * *" and "alauda.spec_decoding.watch" in container["command"]
    job_vars = json.loads(next(d for d in docs.values() if d["kind"] == "ConfigMap")["data"]["vars.yml"])
    # extra vars override role vars: a rollback_names here would roll back every watched service, not the collapsed ones
    assert not [k for k in job_vars if k.startswith("rollback_")]
    assert job_vars["watch_names"] == ["models/llm", "team-a/llm2"] and job_vars["watch_target"] == "cluster"
    assert job_vars["watch_label_selector"] == "team=llm" and job_vars["watch_namespaces"] == ["team-a", "models"]
    assert float(job_vars["watch_interval"]) == 120
