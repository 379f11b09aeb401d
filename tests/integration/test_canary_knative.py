"""Canary rollout in KServe Knative mode (`spec.predictor.canaryTrafficPercent`) on the test bed: the KServe stand-in's
Knative path (a revision `<isvc>-predictor-000NN` per pod-template change, KServe's traffic split with the `prev` tag,
`status.components.predictor` as PropagateStatus writes it), each revision's pods serving /metrics through the API
server's pod proxy. Every end state is read back from the API server.
"""
from __future__ import annotations

import json
import re
import time

import pytest

from tests.ansible_run import run_playbook
from tests.integration.test_canary_rollout import NGRAM, _api, _get, _pages, _vars, args_for, rollout
from tests.integration.test_verify import capture, isvc_manifest
from tests.module_run import run_module
from tests.testbed.kubelet import free_port_on, host_ipv4

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
REV = "serving.knative.dev/revision"
NAME = "llm"
FIRST, CANARY, THIRD = "llm-predictor-00001", "llm-predictor-00002", "llm-predictor-00003"


def _pods(k8s_client, ns):
    """Running (not deleting) predictor pods by revision: {revision: [uid, ...]}."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    out = {}
    for pod in client.CoreV1Api(k8s_client).list_namespaced_pod(ns, label_selector="serving.kserve.io/inferenceservice=%s" % NAME).items:
        if pod.metadata.deletion_timestamp is None:
            out.setdefault(pod.metadata.labels[REV], []).append(pod.metadata.uid)
    return out


def _component(isvc):
    return isvc["status"]["components"]["predictor"]


def _serve(kserve, ns, stable_pages, canary_pages):
    """Behaviours by revision: the first one (and the one a rollback makes of the same spec) without a proposer, the canary
    revision with ngram; both serve /metrics on one port of this host's address. Returns the port."""
    ip = host_ipv4()
    assert ip, "the pod-proxy tests need a non-loopback IPv4 address of this host"
    port = free_port_on(ip)
    kserve.set_behaviour(ns, NAME, ready_after=0.1, logs={"kserve-container": capture("baseline")}, pod_ip=ip,
                         http={port: {"/metrics": stable_pages}})
    kserve.set_behaviour(ns, NAME, ready_after=0.1, logs={"kserve-container": capture("ngram")}, pod_ip=ip,
                         http={port: {"/metrics": canary_pages}}, revision=CANARY)
    return port


def _create(k8s_client, ns, port, annotations=None):
    manifest = isvc_manifest(NAME, args_for(port))
    manifest["metadata"]["annotations"] = dict({"serving.kserve.io/deploymentMode": "Serverless"}, **(annotations or {}))
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        isvc = _get(k8s_client, ns, NAME)
        st = isvc.get("status") or {}
        if st.get("observedGeneration") == isvc["metadata"]["generation"] and \
                any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or []):
            return isvc
        time.sleep(0.2)
    pytest.fail("InferenceService did not become Ready: %s" % _get(k8s_client, ns, NAME).get("status"))
    return None


def _wait_pods(k8s_client, ns, want, timeout=30):
    """Poll until the running pods' revisions are ``want`` (a set); returns the pods by revision."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = _pods(k8s_client, ns)
        if set(pods) == want:
            return pods
        time.sleep(0.2)
    pytest.fail("pods by revision %s, want %s" % (_pods(k8s_client, ns), sorted(want)))
    return None


def test_knative_step_observe_promote_and_rerun(k8s_client, kubeconfig, kserve, namespace):
    port = _serve(kserve, namespace, _pages(0.05, 0.030, 30), _pages(0.05, 0.012, 25))
    created = _create(k8s_client, namespace, port, annotations={"serving.kserve.io/enable-tag-routing": "true"})
    assert created["status"]["deploymentMode"] == "Knative"
    assert _component(created)["latestRolledoutRevision"] == FIRST and "previousRolledoutRevision" not in _component(created)
    first_pods = _wait_pods(k8s_client, namespace, {FIRST})

    res = rollout(kubeconfig, namespace, NAME, speculative_config=NGRAM, percent=10, steps=[10, 50, 100], wait_timeout=60)
    assert not res.failed, res.msg
    assert res["changed"] is True and res["mode"] == "Knative" and res["rollout"]["done"] is True
    assert res["selectors"] == {"stable": "%s=%s" % (REV, FIRST), "canary": "%s=%s" % (REV, CANARY)}
    isvc = _get(k8s_client, namespace, NAME)
    predictor = isvc["spec"]["predictor"]
    assert predictor["canaryTrafficPercent"] == 10 and "canary" not in isvc["spec"] and "name" not in predictor
    assert predictor["model"]["args"][:-2] == args_for(port) and predictor["model"]["args"][-2] == "--speculative-config"
    assert json.loads(predictor["model"]["args"][-1]) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    comp = _component(isvc)
    assert comp["latestCreatedRevision"] == comp["latestReadyRevision"] == CANARY and comp["latestRolledoutRevision"] == FIRST
    assert [(t["revisionName"], t["percent"], t["latestRevision"], t.get("tag")) for t in comp["traffic"]] == \
        [(CANARY, 10, True, "latest"), (FIRST, 90, False, "prev")]
    assert isvc["status"]["observedGeneration"] == isvc["metadata"]["generation"]
    pods = _wait_pods(k8s_client, namespace, {FIRST, CANARY})
    assert pods[FIRST] == first_pods[FIRST]  # the serving revision was not touched

    # the same step again writes nothing; the next step only moves traffic (no new revision)
    again = rollout(kubeconfig, namespace, NAME, speculative_config=NGRAM, percent=10, wait_timeout=60)
    assert not again.failed and again["changed"] is False
    step2 = rollout(kubeconfig, namespace, NAME, speculative_config=NGRAM, percent=50, steps=[10, 50, 100], wait_timeout=60)
    assert not step2.failed and step2["changed"] is True, step2.msg
    comp = _component(_get(k8s_client, namespace, NAME))
    assert comp["latestCreatedRevision"] == CANARY and [(t["revisionName"], t["percent"]) for t in comp["traffic"]] == \
        [(CANARY, 50), (FIRST, 50)]

    obs = run_module("canary_observe_info", dict(name=NAME, namespace=namespace, kubeconfig=kubeconfig, window=0.2, min_requests=20,
                                                 percent=50))
    assert not obs.failed, obs.msg
    assert obs["selectors"] == res["selectors"]  # read from status.components.predictor.traffic
    assert obs["decision"] == "promote", obs["reasons"]
    assert obs["stable"]["requests"] == 30 and obs["canary"]["requests"] == 25
    assert obs["canary"]["pod_names"] and all(p.startswith(CANARY) for p in obs["canary"]["pod_names"])

    res = rollout(kubeconfig, namespace, NAME, state="promoted", wait_timeout=60)
    assert not res.failed, res.msg
    assert res["changed"] is True
    isvc = _get(k8s_client, namespace, NAME)
    assert "canaryTrafficPercent" not in isvc["spec"]["predictor"]
    assert "--speculative-config" in isvc["spec"]["predictor"]["model"]["args"]
    comp = _component(isvc)
    assert [(t["revisionName"], t["percent"], t["latestRevision"]) for t in comp["traffic"]] == [(CANARY, 100, True)]
    assert comp["latestRolledoutRevision"] == CANARY and comp["previousRolledoutRevision"] == FIRST
    assert comp["latestCreatedRevision"] == CANARY  # promoting moves traffic, it makes no new revision
    assert set(_pods(k8s_client, namespace)) == {CANARY}  # the previous revision retired (scaled to zero) before the module returned
    assert _pods(k8s_client, namespace)[CANARY] == pods[CANARY]

    generation = isvc["metadata"]["generation"]
    rerun = rollout(kubeconfig, namespace, NAME, speculative_config=NGRAM, percent=10, steps=[10, 50, 100], wait_timeout=60)
    assert not rerun.failed, rerun.msg
    assert rerun["changed"] is False and rerun["already_promoted"] is True
    assert _get(k8s_client, namespace, NAME)["metadata"]["generation"] == generation


def test_knative_playbook_rolls_back_to_the_untouched_previous_revision(tmp_path, k8s_client, kubeconfig, kserve, namespace):
    port = _serve(kserve, namespace, _pages(0.05, 0.020, 30), _pages(0.06, 0.035, 25))
    _create(k8s_client, namespace, port)
    first_pods = _wait_pods(k8s_client, namespace, {FIRST})
    run = run_playbook(tmp_path, "playbooks/canary.yml", kubeconfig=kubeconfig,
                       extra_vars=_vars(namespace, NAME, tmp_path / "report", canary_kserve_version="0.15.2"))
    assert run.rc == 0, run.output
    assert run.result("Canary on 10%")["selectors"] == {"stable": "%s=%s" % (REV, FIRST), "canary": "%s=%s" % (REV, CANARY)}
    # on the API server: KServe's rollback (canaryTrafficPercent 0), 100% on the previous revision, the flag gone
    isvc = _get(k8s_client, namespace, NAME)
    predictor = isvc["spec"]["predictor"]
    assert predictor["canaryTrafficPercent"] == 0 and predictor["model"]["args"] == args_for(port)
    comp = _component(isvc)
    serving = [(t["revisionName"], t["percent"]) for t in comp["traffic"] if t["percent"]]
    assert serving == [(FIRST, 100)] and comp["latestRolledoutRevision"] == FIRST
    # the spec without the flag is a new revision on 0%; the canary revision has no pod left, the previous one the same pods
    assert comp["latestCreatedRevision"] == THIRD and [(t["revisionName"], t["percent"]) for t in comp["traffic"] if t["latestRevision"]] == \
        [(THIRD, 0)]
    pods = _pods(k8s_client, namespace)
    assert CANARY not in pods and pods[FIRST] == first_pods[FIRST], pods
    # the rollback role's proof ran on what serves: no pod of the canary revision, none with a proposer
    proof = run.result("Prove the engine runs without a proposer on every predictor pod")
    assert proof["speculative_config"] is None and proof["pods"] and all(p["speculative_config"] is None for p in proof["pods"])
    assert not any(p["name"].startswith(CANARY) for p in proof["pods"])
    report = json.loads((tmp_path / "report" / ("canary-%s-llm.json" % namespace)).read_text())
    assert report["decision"] == "roll_back" and [o["percent"] for o in report["observations"]] == [10]
    assert report["observations"][0]["mode"] == "Knative"
    assert any("median TPOT" in r and "got worse" in r for r in report["reasons"]), report["reasons"]
    # promoting now would send 100% to the revision without the flag: refused before any write
    refused = rollout(kubeconfig, namespace, NAME, state="promoted", kserve_version="0.15.2", wait_timeout=10)
    assert refused.failed and refused.msg.startswith("spec.predictor: there is no canary to promote"), refused.msg
    assert _get(k8s_client, namespace, NAME)["metadata"]["generation"] == isvc["metadata"]["generation"]


def test_knative_bad_percent_refused_then_a_never_ready_canary_removed_without_touching_the_previous_revision(
        k8s_client, kubeconfig, kserve, namespace):
    port = _serve(kserve, namespace, ["x"], ["x"])
    kserve.set_behaviour(namespace, NAME, never_ready=True, revision=CANARY)
    before = _create(k8s_client, namespace, port)
    for percent in (0, 100, 150):
        res = rollout(kubeconfig, namespace, NAME, speculative_config=NGRAM, percent=percent, kserve_version="0.15.2")
        assert res.failed and re.search(r"^percent: %d is outside 1\.\.99.*Fix:" % percent, res.msg), res.msg
    res = rollout(kubeconfig, namespace, NAME, speculative_config=NGRAM, percent=10, steps=[10, 200], kserve_version="0.15.2")
    assert res.failed and res.msg.startswith("steps[1]: 200 is outside 1..99"), res.msg
    after = _get(k8s_client, namespace, NAME)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert "canaryTrafficPercent" not in after["spec"]["predictor"] and _component(after)["latestCreatedRevision"] == FIRST

    first_pods = _wait_pods(k8s_client, namespace, {FIRST})
    res = rollout(kubeconfig, namespace, NAME, speculative_config=NGRAM, percent=10, kserve_version="0.15.2", wait_timeout=2)
    assert res.failed and "canary spec not ready" in res.msg, res.msg
    comp = _component(_get(k8s_client, namespace, NAME))
    # Knative routes the canary's share to the latest ready revision while the new one is not ready: all on the previous
    assert comp["latestCreatedRevision"] == CANARY and comp["latestReadyRevision"] == FIRST
    assert {t["revisionName"] for t in comp["traffic"]} == {FIRST}
    res = rollout(kubeconfig, namespace, NAME, state="absent", kserve_version="0.15.2", wait_timeout=60)
    assert not res.failed, res.msg
    isvc = _get(k8s_client, namespace, NAME)
    assert isvc["spec"]["predictor"]["model"]["args"] == args_for(port) and isvc["spec"]["predictor"]["canaryTrafficPercent"] == 0
    assert [(t["revisionName"], t["percent"]) for t in _component(isvc)["traffic"] if t["percent"]] == [(FIRST, 100)]
    pods = _pods(k8s_client, namespace)
    assert CANARY not in pods and pods[FIRST] == first_pods[FIRST], pods
