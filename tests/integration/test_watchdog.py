"""The speculative-decoding watchdog on the test bed: an ngram InferenceService whose pod (kubelet stand-in) serves /metrics
pages made by prometheus_client with vLLM's names - healthy acceptance for the baseline, unreadable (503) once, then
collapsed acceptance - and a second one that stays healthy. Both baselines are recorded in one window (option
``services``) without touching the InferenceServices, an unreadable window is `unknown` and changes nothing, check mode
only says it would roll back, and playbooks/watch.yml in its fleet form (a label selector) watches both together and rolls
back the collapsed one's flag with the rollback role's engine-line proof, the healthy one left alone. Every end state is
read back from the API server.
"""
from __future__ import annotations

import json


from tests.ansible_run import run_playbook
from tests.integration.test_canary_rollout import NGRAM, _api, _get, args_for
from tests.integration.test_verify import capture, isvc_manifest
from tests.module_run import run_module
from tests.testbed.kubelet import free_port_on, host_ipv4
from tests.unit.test_canary import SpeculativeVllm

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"


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


def _healthy_pages():
    """The other service's /metrics: the baseline window (60%), then windows at the same acceptance."""
    server = SpeculativeVllm()
    server.serve_drafting(5, 0.6)
    pages = [server.page()]
    for _i in range(3):
        server.serve_drafting(40, 0.6)
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
    other, other_port = "llm2", free_port_on(ip)
    kserve.set_behaviour(namespace, other, ready_after=0.1, logs={"kserve-container": capture("ngram")}, pod_ip=ip,
                         http={other_port: {"/metrics": _healthy_pages()}})
    for service, service_port in ((name, port), (other, other_port)):
        manifest = isvc_manifest(service, args_for(service_port) + ["--speculative-config", json.dumps(NGRAM)])
        manifest["metadata"]["labels"] = {"team": "watched"}  # the fleet form's selector
        _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
    for service in (name, other):
        isvc_wait.wait_ready(k8s_client, namespace, service, timeout=60, interval=0.2)
    args = dict(name=name, namespace=namespace, kubeconfig=kubeconfig, interval=0.2, count=1)

    # no baseline yet: unknown, nothing done
    res = run_module("speculative_watchdog", args)
    assert not res.failed and res["state"] == "unknown" and "no baseline" in res["msg"], res.msg
    # both baselines in one window (the fleet form's module run)
    both = [{"namespace": namespace, "name": name}, {"namespace": namespace, "name": other}]
    res = run_module("speculative_watchdog", dict({k: v for k, v in args.items() if k != "name" and k != "namespace"}, services=both,
                                                  record_baseline=True))
    assert not res.failed and res["changed"] is True and res["state"] == "recorded", res.msg
    assert [(r["name"], r["baseline"]["figures"]["acceptance"]["draft_acceptance_rate"], r["baseline"]["figures"]["requests"])
            for r in res["services"]] == [(name, 0.6, 40), (other, 0.6, 40)]
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

    # the fleet form: both services found by the selector and watched in one window together; the collapsed one rolled back
    extra = {"watch_label_selector": "team=watched", "watch_namespaces": [namespace], "watch_interval": 0.2, "watch_count": 1,
             "watch_failure_limit": 0, "watch_wait_timeout": 60, "watch_verify_delay": 1, "watch_report_dir": str(tmp_path / "report")}
    run = run_playbook(tmp_path, "playbooks/watch.yml", extra_vars=extra, kubeconfig=kubeconfig)
    assert run.rc == 0, run.output
    isvc = _get(k8s_client, namespace, name)
    assert "--speculative-config" not in isvc["spec"]["predictor"]["model"]["args"]
    proof = run.result("Prove the engine runs without a proposer on every predictor pod")
    assert proof["speculative_config"] is None and proof["pods"] and all(p["speculative_config"] is None for p in proof["pods"])
    kept = _get(k8s_client, namespace, other)
    assert kept["metadata"]["generation"] == 1 and "--speculative-config" in kept["spec"]["predictor"]["model"]["args"]
    report = json.loads((tmp_path / "report" / "watch.json").read_text())
    assert report["rolled_back"] == ["%s/%s" % (namespace, name)]
    assert {s["name"]: (s["state"], s["action"]) for s in report["services"]} == {name: ("collapsed", "roll_back"), other: ("healthy", "none")}
    assert [len(s["analysis"]["windows"]) for s in report["services"]] == [1, 1]
    totals = report["fleet"]["totals"]
    assert (totals["selected"], totals["watched"], totals["collapsed"], totals["healthy"], totals["rolled_back"]) == (2, 2, 1, 1, 1), totals


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
