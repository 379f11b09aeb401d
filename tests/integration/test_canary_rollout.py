"""Canary rollout of speculative decoding on the test bed: real kube-apiserver with KServe v0.20's CRD, the KServe stand-in's
Standard-mode `spec.canary` (own Deployment/Service per canary, replica split, canaryStatuses, promotion, removal), the
kubelet stand-in serving each revision's /metrics (pages made by prometheus_client, vLLM's metric names) through the API
server's pod proxy. Every end state is read back from the API server.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest
import yaml

from tests.ansible_run import run_playbook
from tests.integration.test_verify import capture, isvc_manifest
from tests.module_run import run_module
from tests.testbed.kubelet import free_port_on, host_ipv4
from tests.unit.test_canary import FakeVllm

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
ARGS = ["--model", "/mnt/models", "--port", "8080"]


def args_for(port):
    """The predictor's vLLM args with the pods' port (a free port of this host's address: other test beds on the machine
    serve pods on the same address)."""
    return ["--model", "/mnt/models", "--port", str(port)]


def _api(k8s_client):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.CustomObjectsApi(k8s_client)


def _get(k8s_client, ns, name):
    return _api(k8s_client).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def _deployments(k8s_client, ns, name):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    items = client.AppsV1Api(k8s_client).list_namespaced_deployment(ns, label_selector="serving.kserve.io/inferenceservice=%s" % name).items
    return {d.metadata.name: d for d in items if d.metadata.deletion_timestamp is None}


def _pages(ttft, tpot, n):
    """[before, after] /metrics of a pod that finished n requests in the window (prometheus_client's histograms)."""
    server = FakeVllm("llm")
    for _i in range(5):
        server.serve(ttft, tpot)
    before = server.page()
    for _i in range(n):
        server.serve(ttft, tpot)
    return [before, server.page()]


def _serve(kserve, ns, name, stable_pages, canary_pages, canary_log=None, canary_ready=True):
    """Behaviours of both revisions' pods; returns the port they serve on (give it to _create)."""
    ip = host_ipv4()
    assert ip, "the pod-proxy tests need a non-loopback IPv4 address of this host"
    port = free_port_on(ip)
    kserve.set_behaviour(ns, name, ready_after=0.1, logs={"kserve-container": capture("baseline")}, pod_ip=ip,
                         http={port: {"/metrics": stable_pages}}, deployment="%s-predictor" % name)
    kserve.set_behaviour(ns, name, ready_after=0.1 if canary_ready else None,
                         logs={"kserve-container": canary_log or capture("ngram")}, pod_ip=ip,
                         http={port: {"/metrics": canary_pages}}, deployment="%s-predictor-spec" % name)
    return port


def _create(k8s_client, ns, name, port=8080):
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, isvc_manifest(name, args_for(port)))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        isvc = _get(k8s_client, ns, name)
        st = isvc.get("status") or {}
        if st.get("observedGeneration") == isvc["metadata"]["generation"] and \
                any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or []):
            return isvc
        time.sleep(0.2)
    pytest.fail("InferenceService did not become Ready")
    return None


def rollout(kubeconfig, ns, name, **args):
    return run_module("canary_rollout", dict(name=name, namespace=ns, kubeconfig=kubeconfig, **args))


def test_step_observe_and_promote_a_faster_canary(k8s_client, kubeconfig, kserve, namespace):
    name = "llm"
    port = _serve(kserve, namespace, name, _pages(0.05, 0.030, 30), _pages(0.05, 0.012, 25))
    _create(k8s_client, namespace, name, port)
    stable_before = _deployments(k8s_client, namespace, name)["llm-predictor"]

    res = rollout(kubeconfig, namespace, name, speculative_config=NGRAM, percent=10, steps=[10, 50, 100], wait_timeout=60)
    assert not res.failed, res.msg
    assert res["changed"] is True and res["mode"] == "Standard" and res["rollout"]["done"] is True
    isvc = _get(k8s_client, namespace, name)
    assert isvc["spec"]["predictor"]["model"]["args"] == args_for(port)  # the serving revision is untouched
    entry = isvc["spec"]["canary"][0]
    assert entry["trafficPercent"] == 10 and entry["predictor"]["name"] == "spec"
    assert entry["predictor"]["model"]["args"][-2] == "--speculative-config"
    assert json.loads(entry["predictor"]["model"]["args"][-1]) == {"method": "ngram", "num_speculative_tokens": 3,
                                                                   "prompt_lookup_max": 4}
    assert isvc["status"]["canaryStatuses"][0]["name"] == "spec" and isvc["status"]["canaryStatuses"][0]["ready"] is True
    deps = _deployments(k8s_client, namespace, name)
    assert sorted(deps) == ["llm-predictor", "llm-predictor-spec"]
    assert deps["llm-predictor-spec"].spec.template.metadata.labels["app"] == "isvc.llm-predictor-spec"
    assert deps["llm-predictor"].spec.template == stable_before.spec.template

    # the same step again: nothing to change
    again = rollout(kubeconfig, namespace, name, speculative_config=NGRAM, percent=10, wait_timeout=60)
    assert not again.failed and again["changed"] is False

    obs = run_module("canary_observe_info", dict(name=name, namespace=namespace, kubeconfig=kubeconfig, selectors=res["selectors"],
                                                 window=0.2, min_requests=20, percent=10))
    assert not obs.failed, obs.msg
    assert obs["decision"] == "promote", obs["reasons"]
    assert obs["stable"]["requests"] == 30 and obs["canary"]["requests"] == 25
    assert obs["canary"]["tpot_ms"]["median"] < obs["stable"]["tpot_ms"]["median"]
    assert "**promote**" in obs["markdown"]

    template = deps["llm-predictor-spec"].spec.template
    res = rollout(kubeconfig, namespace, name, state="promoted", wait_timeout=60)
    assert not res.failed, res.msg
    isvc = _get(k8s_client, namespace, name)
    assert "canary" not in isvc["spec"] and isvc["spec"]["predictor"]["name"] == "spec"
    assert "--speculative-config" in isvc["spec"]["predictor"]["model"]["args"]
    assert not isvc["status"].get("canaryStatuses")
    deps = _deployments(k8s_client, namespace, name)
    assert sorted(deps) == ["llm-predictor-spec"]  # the old revision retired, the canary's Deployment kept as it was
    assert deps["llm-predictor-spec"].spec.template == template

    # a rerun of the first step after the promotion (a scheduled canary) has nothing to do and writes nothing
    generation = isvc["metadata"]["generation"]
    rerun = rollout(kubeconfig, namespace, name, speculative_config=NGRAM, percent=10, steps=[10, 50, 100], wait_timeout=60)
    assert not rerun.failed, rerun.msg
    assert rerun["changed"] is False and rerun["already_promoted"] is True
    assert _get(k8s_client, namespace, name)["metadata"]["generation"] == generation
    # another config is still refused on a serving revision that runs one (roll back first)
    other = rollout(kubeconfig, namespace, name, speculative_config=dict(NGRAM, num_speculative_tokens=5),
                    percent=10, wait_timeout=60)
    assert other.failed and "already runs with --speculative-config" in other.msg


def test_bad_input_is_refused_before_any_write(k8s_client, kubeconfig, kserve, namespace):
    name = "llm"
    port = _serve(kserve, namespace, name, ["x"], ["x"])
    before = _create(k8s_client, namespace, name, port)
    for args, pattern in (
            (dict(percent=100), r"percent: 100 is outside 1..99"),
            (dict(percent=10, steps=[10, 5]), r"steps\[1\]: 5 does not rise"),
            (dict(percent=10, kserve_version="0.19.2"), r"kserve_version: KServe 0.19.2 has no spec.canary"),
            (dict(percent=10, canary_name="Bad_Name"), r"canary_name: 'Bad_Name' is not a DNS label")):
        res = rollout(kubeconfig, namespace, name, speculative_config=NGRAM, **args)
        assert res.failed and re.search(pattern, res.msg), (args, res.msg)
        assert "Fix:" in res.msg
    after = _get(k8s_client, namespace, name)
    assert after["metadata"]["generation"] == before["metadata"]["generation"] and "canary" not in after["spec"]


def test_canary_never_ready_fails_at_the_deadline_and_removal_leaves_the_previous_revision(k8s_client, kubeconfig, kserve, namespace):
    name = "llm"
    port = _serve(kserve, namespace, name, ["x"], ["x"], canary_ready=False)
    _create(k8s_client, namespace, name, port)
    stable = _deployments(k8s_client, namespace, name)["llm-predictor"]
    res = rollout(kubeconfig, namespace, name, speculative_config=NGRAM, percent=10, wait_timeout=2)
    assert res.failed and "canary spec not ready" in res.msg, res.msg
    res = rollout(kubeconfig, namespace, name, state="absent", wait_timeout=60)
    assert not res.failed, res.msg
    isvc = _get(k8s_client, namespace, name)
    assert "canary" not in isvc["spec"] and not isvc["status"].get("canaryStatuses")
    deps = _deployments(k8s_client, namespace, name)
    assert sorted(deps) == ["llm-predictor"] and deps["llm-predictor"].spec.template == stable.spec.template


def test_a_crash_looping_canary_fails_the_step_at_once_with_its_log(k8s_client, kubeconfig, kserve, namespace):
    """KServe's modelStatus describes the stable revision during a canary: the canary revision's own pods tell that it
    cannot start. The scripted canary pod crash-loops (restartCount 1) with a previous log carrying a token."""
    name = "llm"
    port = _serve(kserve, namespace, name, ["x"], ["x"])
    _create(k8s_client, namespace, name, port)
    kserve.set_behaviour(namespace, name, crash_loop=True, deployment="%s-predictor-spec" % name, previous_logs={
        "kserve-container": "loading\nHF_TOKEN=hf_s3cr3tT0kenValue1234567890\nValueError: unrecognized arguments: --speculative-config\n"})
    started = time.monotonic()
    res = rollout(kubeconfig, namespace, name, speculative_config=NGRAM, percent=10, wait_timeout=120, wait_crash_loop_restarts=1)
    elapsed = time.monotonic() - started
    assert res.failed and res["field"] == "wait_crash_loop_restarts", res.msg
    assert elapsed < 60, "the step waited %.0f s: towards its timeout, not stopped by the crash loop" % elapsed
    assert "the canary revision (app=isvc.llm-predictor-spec) crash-loops" in res.msg, res.msg
    assert "ValueError: unrecognized arguments: --speculative-config" in res.msg and "s3cr3t" not in res.msg, res.msg
    # the stable revision is untouched and serves; the canary entry stays for the user to fix or remove
    assert sorted(_deployments(k8s_client, namespace, name)) == ["llm-predictor", "llm-predictor-spec"]
    res = rollout(kubeconfig, namespace, name, state="absent", wait_timeout=60)
    assert not res.failed, res.msg


def test_gitops_renders_each_step_without_a_cluster(tmp_path):
    res = run_module("canary_rollout", dict(definition=isvc_manifest("llm", ARGS), speculative_config=NGRAM, percent=50,
                                            kserve_version="0.20.0"))
    assert not res.failed, res.msg
    assert res["manifest"]["spec"]["canary"][0]["trafficPercent"] == 50
    assert res["manifest"]["spec"]["predictor"]["model"]["args"] == ARGS


def _vars(ns, name, report_dir, **more):
    out = {"canary_isvc_name": name, "canary_namespace": ns, "canary_speculative_config": NGRAM, "canary_steps": [10, 50, 100],
           "canary_window": 0.2, "canary_min_requests": 20, "canary_ready_timeout": 60, "canary_report_dir": str(report_dir),
           "canary_target": "cluster", "canary_verify_delay": 1}
    out.update(more)
    return out


def test_playbook_rolls_back_a_slower_canary_and_proves_it(tmp_path, k8s_client, kubeconfig, kserve, namespace):
    name = "llm"
    port = _serve(kserve, namespace, name, _pages(0.05, 0.020, 30), _pages(0.06, 0.035, 25))
    _create(k8s_client, namespace, name, port)
    stable = _deployments(k8s_client, namespace, name)["llm-predictor"]
    run = run_playbook(tmp_path, "playbooks/canary.yml", extra_vars=_vars(namespace, name, tmp_path / "report"), kubeconfig=kubeconfig)
    assert run.rc == 0, run.output
    # on the API server: no canary, the previous revision untouched and alone
    isvc = _get(k8s_client, namespace, name)
    assert "canary" not in isvc["spec"] and isvc["spec"]["predictor"]["model"]["args"] == args_for(port)
    assert not isvc["status"].get("canaryStatuses")
    deps = _deployments(k8s_client, namespace, name)
    assert sorted(deps) == ["llm-predictor"] and deps["llm-predictor"].spec.template == stable.spec.template
    # the rollback role's proof ran on what serves
    proof = run.result("Prove the engine runs without a proposer on every predictor pod")
    assert proof["speculative_config"] is None and proof["pods"] and all(p["speculative_config"] is None for p in proof["pods"])
    assert all(not p["name"].startswith("llm-predictor-spec") for p in proof["pods"])
    # only the first step ran (roll_back at 10%), the report says why
    report = json.loads((tmp_path / "report" / ("canary-%s-llm.json" % namespace)).read_text())
    assert report["decision"] == "roll_back" and len(report["observations"]) == 1
    assert report["observations"][0]["percent"] == 10
    assert any("median TPOT" in r and "got worse" in r for r in report["reasons"]), report["reasons"]
    markdown = (tmp_path / "report" / ("canary-%s-llm.md" % namespace)).read_text()
    assert "# Outcome: roll_back" in markdown and "| requests | 30 | 25 |" in markdown


def test_playbook_renders_every_step_for_gitops(tmp_path):
    definition = tmp_path / "llm.yaml"
    definition.write_text(json.dumps(isvc_manifest("llm", ARGS)))
    out = tmp_path / "gitops"
    extra = _vars("models", "llm", "", canary_target="gitops", canary_definition_file=str(definition), canary_gitops_dir=str(out),
                  canary_kserve_version="0.20.0")
    run = run_playbook(tmp_path, "playbooks/canary.yml", extra_vars=extra)
    assert run.rc == 0, run.output
    files = sorted(os.listdir(out))
    assert files == ["llm-canary-1-10pct.yaml", "llm-canary-2-50pct.yaml", "llm-canary-promote.yaml", "llm-canary-rollback.yaml"]
    step2 = yaml.safe_load((out / "llm-canary-2-50pct.yaml").read_text())
    assert step2["spec"]["canary"][0]["trafficPercent"] == 50
    promote = yaml.safe_load((out / "llm-canary-promote.yaml").read_text())
    assert "canary" not in promote["spec"] and promote["spec"]["predictor"]["name"] == "spec"
    assert "--speculative-config" in promote["spec"]["predictor"]["model"]["args"]
    rollback = yaml.safe_load((out / "llm-canary-rollback.yaml").read_text())
    assert rollback["spec"] == isvc_manifest("llm", ARGS)["spec"]


# The scheduled form (canary_target: schedule) is rendered, applied and run for real in test_canary_schedule.py.


def test_no_decision_on_too_few_requests_or_missing_metrics(k8s_client, kubeconfig, kserve, namespace):
    name = "llm"
    port = _serve(kserve, namespace, name, _pages(0.05, 0.03, 3), _pages(0.05, 0.01, 3))
    _create(k8s_client, namespace, name, port)
    res = rollout(kubeconfig, namespace, name, speculative_config=NGRAM, percent=10, wait_timeout=60)
    assert not res.failed, res.msg
    obs = run_module("canary_observe_info", dict(name=name, namespace=namespace, kubeconfig=kubeconfig, window=0.2, max_window=1.5,
                                                 min_requests=20))
    assert not obs.failed, obs.msg
    assert obs["decision"] == "none" and obs["extended"] >= 1 and obs["window_s"] >= 1.4, \
        (obs["extended"], obs["window_s"], obs["reasons"], kserve.kubelet.errors[-3:])
    assert obs["reasons"] == ["the stable revision finished 3 requests in the window, fewer than min_requests 20",
                              "the canary revision finished 3 requests in the window, fewer than min_requests 20"]
    assert obs["selectors"] == res["selectors"]  # read from the InferenceService when not given
    obs = run_module("canary_observe_info", dict(name=name, namespace=namespace, kubeconfig=kubeconfig, window=0.1, min_requests=1,
                                                 selectors={"stable": res["selectors"]["stable"], "canary": "app=isvc.nothing-here"}))
    assert not obs.failed and obs["decision"] == "none"
    assert obs["missing"]["canary"] == ["(no running pod matches app=isvc.nothing-here)"]
    assert "no /metrics from the canary pods (no running pod matches app=isvc.nothing-here)" in obs["reasons"]
    assert _get(k8s_client, namespace, name)["spec"]["canary"][0]["trafficPercent"] == 10  # nothing decided, nothing changed


def test_a_scrape_that_fails_mid_step_ends_the_window_in_error_not_rolled_back(k8s_client, kubeconfig, kserve, namespace):
    name = "llm"
    stable, canary = _pages(0.05, 0.030, 30), _pages(0.05, 0.012, 25)
    # the stable pod's second /metrics read (the end of the first window) fails; the next window reads both pages again
    port = _serve(kserve, namespace, name, [stable[0], (503, "upstream unavailable\n"), stable[0], stable[1]], canary + canary)
    _create(k8s_client, namespace, name, port)
    res = rollout(kubeconfig, namespace, name, speculative_config=NGRAM, percent=10, wait_timeout=60)
    assert not res.failed, res.msg
    args = dict(name=name, namespace=namespace, kubeconfig=kubeconfig, selectors=res["selectors"], window=0.2, min_requests=20)
    obs = run_module("canary_observe_info", dict(args, consecutive_error_limit=0))
    assert not obs.failed, obs.msg
    assert obs["decision"] == "none" and obs["verdict"] == "error", (obs["verdict"], obs["reasons"])
    assert obs["analysis"]["counts"]["error"] == 1 and obs["analysis"]["counts"]["fail"] == 0
    assert any("no /metrics from the stable pods" in r for r in obs["reasons"]), obs["reasons"]
    assert "neither promoted nor rolled back" in obs["next_step"] and "Analysis: error" in obs["markdown"]
    isvc = _get(k8s_client, namespace, name)
    assert isvc["spec"]["canary"][0]["trafficPercent"] == 10  # nothing rolled back, nothing promoted
    # the next window reads both revisions again and decides on them
    obs = run_module("canary_observe_info", args)
    assert not obs.failed and obs["decision"] == "promote" and obs["verdict"] == "successful", obs["reasons"]
