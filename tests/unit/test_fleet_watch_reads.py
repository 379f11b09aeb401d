"""The watch role over a fleet (issue 53): how often the watchdog reads each serving pod's /metrics.

The role runs module speculative_watchdog once per watched service (roles/watch/tasks/cluster.yml, a loop over the
services), and each run measures watch_count windows of its own service's pods. Here that loop runs the module's own
code (ops/watchdog.watch) over three services with 2, 1 and 3 pods against a fake API server at the collection's one
request function (kube.client.request), which answers by path and counts every request. The figures this pins:

* a pod's /metrics is read once per window - at the window's end, which is the next window's start
  (ops/watchdog.measure_window), plus once before the first window - so watch_count + 1 reads per pod and run, whatever N;
* no pod is read by another service's run, and per window each service costs one LIST of its pods and one GET per pod
  and, once per run while the same pods serve, one GET per pod (canary.pod_targets: where vLLM listens), plus one GET of
  the service per run: the API requests grow with the pods, linearly.
"""
from __future__ import annotations

import collections
import re

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import watchdog
from tests.paths import read_capture
from tests.unit.test_analysis import window

NAMESPACE = "models"
SERVICES = {"llama": 2, "qwen": 1, "mistral": 3}
COUNT = 3


class FakeApi:
    """GET by path: the InferenceService, its predictor pods (LIST by the KServe label, GET by name), their /metrics
    through the pod proxy; every request counted by (kind, pod or service)."""

    def __init__(self):
        self.metrics = read_capture("ngram", "metrics.txt")
        self.requests = collections.Counter()

    @staticmethod
    def _pod(service, index):
        name = "%s-predictor-%d" % (service, index)
        labels = {"serving.kserve.io/inferenceservice": service, "component": "predictor"}
        return {"metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
                "spec": {"containers": [{"name": "kserve-container", "image": "vllm",
                                         "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}

    def __call__(self, _api_client, method, path, query=None, stream=False, **_kw):
        assert method == "GET", (method, path)
        base = "/api/v1/namespaces/%s/pods" % NAMESPACE
        if path.startswith("/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices/" % NAMESPACE):
            service = path.rsplit("/", 1)[1]
            self.requests[("GET inferenceservice", service)] += 1
            return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                    "metadata": {"name": service, "namespace": NAMESPACE, "uid": "u-" + service}}
        if path == base:
            service = re.match(r"serving\.kserve\.io/inferenceservice=([a-z]+)", query["labelSelector"]).group(1)
            self.requests[("LIST pods", service)] += 1
            return {"items": [self._pod(service, i) for i in range(SERVICES[service])]}
        proxy = re.match(r"%s/([a-z]+-predictor-\d+):8080/proxy/metrics$" % re.escape(base), path)
        if proxy:
            assert stream
            self.requests[("GET /metrics", proxy.group(1))] += 1
            return _Response(self.metrics)
        pod = re.match(r"%s/(([a-z]+)-predictor-(\d+))$" % re.escape(base), path)
        if pod:
            self.requests[("GET pod", pod.group(1))] += 1
            return self._pod(pod.group(2), int(pod.group(3)))
        raise AssertionError("the watchdog asked for %s" % path)


class _Response:
    def __init__(self, text):
        self.data = text.encode("utf-8")

    def release_conn(self):
        pass


@pytest.fixture(name="api")
def api_fixture(monkeypatch):
    api = FakeApi()
    monkeypatch.setattr(kube_client, "request", api)
    return api


def _params(service):
    return {"name": service, "namespace": NAMESPACE, "resource_kind": "InferenceService", "api_version": "v1alpha2",
            "record_baseline": False, "baseline": window(), "checks": None, "interval": 60.0, "count": COUNT,
            "failure_limit": 1, "inconclusive_limit": 3, "consecutive_error_limit": 1, "initial_delay": 0.0,
            "min_requests": 20, "confidence": 0.95, "model_name": None, "container": "kserve-container", "port": None,
            "scheme": None, "timeout": 5}


def test_each_pod_is_read_once_per_window_by_its_own_service_only(api):
    clock = iter(range(10 ** 6))
    results = {}
    for service in sorted(SERVICES):  # the role's loop: the module once per watched service
        results[service] = watchdog.watch(None, _params(service), sleep=lambda _s: None, clock=lambda: float(next(clock)))
    # the same /metrics page at both ends of each window: no requests finished, every window too quiet to judge
    assert {s: (r["state"], len(r["analysis"]["windows"])) for s, r in results.items()} == {s: ("no_traffic", COUNT) for s in SERVICES}

    metrics = {pod: n for (kind, pod), n in api.requests.items() if kind == "GET /metrics"}
    pods = sorted("%s-predictor-%d" % (s, i) for s, n in SERVICES.items() for i in range(n))
    assert sorted(metrics) == pods  # every serving pod, and nothing else
    assert set(metrics.values()) == {COUNT + 1}, metrics  # the first window's start, then each window's end
    for service, n in SERVICES.items():
        assert api.requests[("GET inferenceservice", service)] == 1
        assert api.requests[("LIST pods", service)] == COUNT
        assert [api.requests[("GET pod", "%s-predictor-%d" % (service, i))] for i in range(n)] == [1] * n
    total = sum(api.requests.values())
    n_pods = sum(SERVICES.values())
    assert total == len(SERVICES) * (1 + COUNT) + n_pods * (1 + COUNT + 1)
    print("fleet watch: %d services, %d pods, %d windows each: %d /metrics reads (%.1f per pod per window), %d API requests"
          % (len(SERVICES), n_pods, COUNT, sum(metrics.values()), sum(metrics.values()) / float(n_pods * COUNT), total))
