"""The watch role over a fleet (issue 53): the watchdog measures its services' windows together, and reads each serving
pod's /metrics once per window.

The role runs module speculative_watchdog once for every watched service (roles/watch/tasks/cluster.yml, option
``services``). Here that run's own code (ops/watchdog.watch_services) watches three services with 2, 1 and 3 pods against a
fake API server at the collection's one request function (kube.client.request), which answers by path, counts every
request and serves each pod's /metrics from a prometheus_client registry with vLLM's names (tests/unit/test_canary.py's
FakeVllm plus vLLM's spec_decode counters) that finishes requests between two reads. A fake clock moves only when the
watchdog sleeps. The figures this pins:

* the time shape: one wait of ``interval`` per window for all the services together - a run of ``count`` windows over N
  services takes count x interval (N x count x interval when the services were watched one after another), and recording
  the baselines one window for all of them;
* the reads: a pod's /metrics is read once per window - at the window's end, which is the next window's start
  (ops/watchdog.window_start / window_end), plus once before the first window - so count + 1 reads per pod and run whatever
  N; a service whose run ended early (collapsed) is read no more; per window each service costs one LIST of its pods, and
  once per run one GET per pod (canary.pod_targets: where vLLM listens) and one GET of the service: linear in the pods;
* the verdicts stay per service: the one whose acceptance collapsed is ``collapsed`` with action ``roll_back``, the others
  ``healthy`` and left alone.
"""
from __future__ import annotations

import collections
import re

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import watchdog
from tests.unit.test_canary import SpeculativeVllm

NAMESPACE = "models"
SERVICES = {"llama": 2, "qwen": 1, "mistral": 3}
COUNT = 3
INTERVAL = 60.0
REQUESTS_PER_WINDOW = 25  # per pod, between two reads of its /metrics


class FakeApi:
    """The InferenceServices, their predictor pods (LIST by the KServe label, GET by name), the pods' /metrics through
    the pod proxy and the baseline ConfigMaps; every request counted by (kind, pod or service)."""

    def __init__(self):
        self.requests = collections.Counter()
        self.servers = {"%s-predictor-%d" % (s, i): SpeculativeVllm() for s, n in SERVICES.items() for i in range(n)}
        self.acceptance = {s: 0.6 for s in SERVICES}  # what each service's pods accept from now on
        self.configmaps = {}
        for server in self.servers.values():  # served before the watch: vLLM's histograms have their series
            server.serve_drafting(5, 0.6)

    @staticmethod
    def _pod(service, index):
        name = "%s-predictor-%d" % (service, index)
        labels = {"serving.kserve.io/inferenceservice": service, "component": "predictor"}
        return {"metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
                "spec": {"containers": [{"name": "kserve-container", "image": "vllm",
                                         "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}

    def __call__(self, _api_client, method, path, query=None, stream=False, body=None, **_kw):
        base = "/api/v1/namespaces/%s" % NAMESPACE
        if path.startswith(base + "/configmaps"):
            return self._configmap(method, path, body)
        assert method == "GET", (method, path)
        if path.startswith("/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices/" % NAMESPACE):
            service = path.rsplit("/", 1)[1]
            self.requests[("GET inferenceservice", service)] += 1
            if service not in SERVICES:
                raise kube_client.ApiException(status=404, reason="Not Found")
            return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                    "metadata": {"name": service, "namespace": NAMESPACE, "uid": "u-" + service}}
        if path == base + "/pods":
            service = re.match(r"serving\.kserve\.io/inferenceservice=([a-z]+)", query["labelSelector"]).group(1)
            self.requests[("LIST pods", service)] += 1
            return {"items": [self._pod(service, i) for i in range(SERVICES[service])]}
        proxy = re.match(r"%s/pods/(([a-z]+)-predictor-\d+):8080/proxy/metrics$" % re.escape(base), path)
        if proxy:
            assert stream
            self.requests[("GET /metrics", proxy.group(1))] += 1
            server = self.servers[proxy.group(1)]
            page = server.page()
            server.serve_drafting(REQUESTS_PER_WINDOW, self.acceptance[proxy.group(2)])  # traffic until the next read
            return _Response(page)
        pod = re.match(r"%s/pods/(([a-z]+)-predictor-(\d+))$" % re.escape(base), path)
        if pod:
            self.requests[("GET pod", pod.group(1))] += 1
            return self._pod(pod.group(2), int(pod.group(3)))
        raise AssertionError("the watchdog asked for %s" % path)

    def _configmap(self, method, path, body):
        self.requests[(method + " configmap", None)] += 1
        if method == "POST":
            self.configmaps[body["metadata"]["name"]] = body
            return body
        assert method == "GET", (method, path)
        name = path.rsplit("/", 1)[1]
        if name not in self.configmaps:
            raise kube_client.ApiException(status=404)
        return self.configmaps[name]


class _Response:
    def __init__(self, text):
        self.data = text.encode("utf-8")

    def release_conn(self):
        pass


class FakeClock:
    """Time that moves only when the watchdog sleeps; every sleep is kept."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self):
        return self.now


@pytest.fixture(name="api")
def api_fixture(monkeypatch):
    api = FakeApi()
    monkeypatch.setattr(kube_client, "request", api)
    return api


def _params(**over):
    params = {"name": None, "namespace": None, "resource_kind": "InferenceService", "api_version": "v1alpha2",
              "record_baseline": False, "baseline": None, "checks": None, "interval": INTERVAL, "count": COUNT,
              "failure_limit": 1, "inconclusive_limit": 3, "consecutive_error_limit": 1, "initial_delay": 0.0,
              "min_requests": 20, "confidence": 0.95, "model_name": None, "container": "kserve-container", "port": None,
              "scheme": None, "timeout": 5}
    params.update(over)
    return params


def _services():
    return watchdog.service_list([{"namespace": NAMESPACE, "name": s} for s in sorted(SERVICES)])


def test_a_fleet_watch_measures_its_services_together_and_reads_each_pod_once_per_window(api):
    # the baselines: one window for the three services together, each kept in its own ConfigMap
    clock = FakeClock()
    recorded = watchdog.watch_services(None, _params(record_baseline=True), _services(), sleep=clock.sleep, clock=clock)
    assert clock.sleeps == [INTERVAL] and recorded["changed"] is True and recorded["state"] == "recorded"
    assert sorted(api.configmaps) == sorted(s + "-spec-decoding-baseline" for s in SERVICES)
    assert {r["name"]: r["baseline"]["figures"]["acceptance"]["draft_acceptance_rate"] for r in recorded["services"]} == {
        s: 0.6 for s in SERVICES}
    assert {r["name"]: r["baseline"]["figures"]["requests"] for r in recorded["services"]} == {
        s: REQUESTS_PER_WINDOW * n for s, n in SERVICES.items()}
    api.requests.clear()

    # qwen's acceptance collapses; llama and mistral stay as recorded
    api.acceptance["qwen"] = 0.01
    clock = FakeClock()
    out = watchdog.watch_services(None, _params(), _services(), sleep=clock.sleep, clock=clock)

    # the time shape: count windows of interval for the three services together, not 3 x that
    assert clock.sleeps == [INTERVAL] * COUNT and clock.now == COUNT * INTERVAL
    by_service = {r["name"]: r for r in out["services"]}
    for service, result in by_service.items():
        assert [w["figures"]["requests"] for w in result["analysis"]["windows"]] == \
            [REQUESTS_PER_WINDOW * SERVICES[service]] * len(result["analysis"]["windows"])
    # the verdicts and actions per service
    assert {s: (r["state"], r["action"], len(r["analysis"]["windows"])) for s, r in by_service.items()} == {
        "llama": ("healthy", "none", COUNT), "mistral": ("healthy", "none", COUNT), "qwen": ("collapsed", "roll_back", 2)}
    assert [(r["namespace"], r["name"]) for r in out["services"]] == [(NAMESPACE, s) for s in sorted(SERVICES)]
    assert out["state"] == "collapsed" and out["action"] == "roll_back" and out["changed"] is False
    assert all(w["figures"]["acceptance"]["draft_acceptance_rate"] < 0.05 for w in by_service["qwen"]["analysis"]["windows"])

    # the reads: each pod's /metrics once per window of its service's run, plus its first window's start
    metrics = {pod: n for (kind, pod), n in api.requests.items() if kind == "GET /metrics"}
    pods = sorted("%s-predictor-%d" % (s, i) for s, n in SERVICES.items() for i in range(n))
    assert sorted(metrics) == pods  # every serving pod, and nothing else
    windows = {s: len(r["analysis"]["windows"]) for s, r in by_service.items()}
    assert metrics == {pod: windows[pod.split("-")[0]] + 1 for pod in pods}, metrics
    for service, n in SERVICES.items():
        assert api.requests[("GET inferenceservice", service)] == 1
        assert api.requests[("LIST pods", service)] == windows[service]
        assert [api.requests[("GET pod", "%s-predictor-%d" % (service, i))] for i in range(n)] == [1] * n
    assert api.requests[("GET configmap", None)] == len(SERVICES)
    total = sum(api.requests.values())
    n_pods, n_windows = sum(SERVICES.values()), sum(windows.values())
    assert total == len(SERVICES) * 2 + n_windows + sum(n * (1 + windows[s] + 1) for s, n in SERVICES.items())
    pod_windows = sum(n * windows[s] for s, n in SERVICES.items())
    print("fleet watch: %d services, %d pods, %d windows of %.0f s: %.0f s on the watchdog's clock (%.0f s one service after "
          "another); %d /metrics reads = %d pod-windows x 1 + %d first starts; %d API requests"
          % (len(SERVICES), n_pods, COUNT, INTERVAL, clock.now, len(SERVICES) * COUNT * INTERVAL, sum(metrics.values()), pod_windows,
             n_pods, total))


def test_one_service_without_a_baseline_is_unknown_and_the_others_are_still_watched(api):
    two = [svc for svc in _services() if svc["name"] != "qwen"]
    watchdog.watch_services(None, _params(record_baseline=True), two, sleep=FakeClock().sleep, clock=FakeClock())
    api.requests.clear()
    clock = FakeClock()
    out = watchdog.watch_services(None, _params(count=1), _services(), sleep=clock.sleep, clock=clock)
    assert {r["name"]: r["state"] for r in out["services"]} == {"llama": "healthy", "mistral": "healthy", "qwen": "unknown"}
    qwen = next(r for r in out["services"] if r["name"] == "qwen")
    assert qwen["action"] == "none" and "no baseline recorded" in qwen["reasons"][0] and qwen["analysis"] is None
    assert clock.sleeps == [INTERVAL] and out["state"] == "unknown" and out["action"] == "none"
    assert api.requests[("GET /metrics", "qwen-predictor-0")] == 0  # a service that cannot be judged is not read


def test_a_service_gone_since_it_was_found_is_reported_and_the_others_are_watched(api):
    watchdog.watch_services(None, _params(record_baseline=True), _services(), sleep=FakeClock().sleep, clock=FakeClock())
    clock = FakeClock()
    services = _services() + [{"namespace": NAMESPACE, "name": "gone"}]
    out = watchdog.watch_services(None, _params(count=1), services, sleep=clock.sleep, clock=clock)
    assert [(r["name"], r["state"]) for r in out["services"]] == [("llama", "healthy"), ("mistral", "healthy"), ("qwen", "healthy"),
                                                                  ("gone", "unknown")]
    gone = out["services"][-1]
    assert gone["action"] == "none" and "gone" in gone["reasons"][0] and clock.sleeps == [INTERVAL]
    # alone, the same service fails the run (the module's failure names it), as one service's watch always did
    with pytest.raises(SpecDecodingError) as err:
        watchdog.watch_services(None, _params(count=1), services[-1:], sleep=clock.sleep, clock=clock)
    assert "gone" in str(err.value)


def test_recording_a_fleet_writes_no_baseline_when_one_service_cannot_have_one(api):
    api.servers["qwen-predictor-0"].serve_drafting = lambda n, acceptance: None  # qwen serves no request
    clock = FakeClock()
    with pytest.raises(ValidationError) as err:
        watchdog.watch_services(None, _params(record_baseline=True), _services(), sleep=clock.sleep, clock=clock)
    assert err.value.field == "record_baseline" and "models/qwen: cannot record a baseline: 0 requests" in str(err.value), str(err.value)
    assert clock.sleeps == [INTERVAL] and api.configmaps == {}  # one window for all, and nothing half-written


def test_the_services_option_is_checked():
    with pytest.raises(ValidationError) as err:
        watchdog.service_list([{"namespace": "models"}])
    assert err.value.field == "services" and "not {namespace, name}" in str(err.value) and err.value.hint
    assert watchdog.service_list([{"namespace": "a", "name": "b"}] * 2) == [{"namespace": "a", "name": "b"}]
