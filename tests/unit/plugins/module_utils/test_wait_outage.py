"""The one waiter (kube/wait.py) across an API server outage: reads 0.5 s, 1 s, then 2 s apart while the server refuses,
so a wait notices the server back within 2 s (it read again every 5 s before), and never past the wait's timeout.
Against a real loopback port that refuses connections and then serves, with the kubernetes client the modules use."""
import json
import socket
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait
from tests.fake_clock import FakeClock
from tests.loopback_http import serving
from tests.module_run import run_module

ISVC_PATH = "/apis/serving.kserve.io/v1beta1/namespaces/ns/inferenceservices/m"
READY = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
         "metadata": {"name": "m", "namespace": "ns", "generation": 2, "resourceVersion": "7"},
         "status": {"observedGeneration": 2, "conditions": [{"type": "Ready", "status": "True"}]}}


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass

    def do_GET(self):  # pylint: disable=invalid-name
        body = json.dumps(READY if self.path.split("?")[0] == ISVC_PATH else {"kind": "Status", "code": 404}).encode()
        self.send_response(200 if self.path.split("?")[0] == ISVC_PATH else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _LateServer:
    """Nothing listens on ``port`` (connections are refused) until ``after`` seconds, then the API answers."""

    def __init__(self, port, after):
        self.port, self.after, self.up_at, self.httpd = port, after, None, None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        time.sleep(self.after)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        self.up_at = time.monotonic()
        self.httpd.serve_forever(poll_interval=0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        while self.httpd is None and self._thread.is_alive():
            time.sleep(0.05)
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


def _api_client(port):
    from kubernetes.client import ApiClient, Configuration  # pylint: disable=import-outside-toplevel
    config = Configuration()
    config.host = "http://127.0.0.1:%d" % port
    return ApiClient(config)


def test_the_wait_notices_the_api_server_back_within_two_seconds():
    port = _free_port()
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        time.sleep(seconds)

    with _LateServer(port, after=0.7) as server:
        isvc, _elapsed = isvc_wait.wait_ready(_api_client(port), "ns", "m", timeout=30, sleep=sleep)
        returned_at = time.monotonic()
    assert isvc["metadata"]["generation"] == 2
    # refused at 0 and 0.5 s, read at 1.5 s: the server was back 0.8 s before (a fixed 5 s poll read it 4.3 s late)
    assert sleeps[:2] == [kube_wait.OUTAGE_RETRY_FIRST, 2 * kube_wait.OUTAGE_RETRY_FIRST], sleeps
    assert max(sleeps) <= kube_wait.OUTAGE_RETRY_MAX
    lag = returned_at - server.up_at
    print("API server back after 0.7 s; the wait returned %.2f s later, pauses %s" % (lag, sleeps))
    assert lag < kube_wait.OUTAGE_RETRY_MAX, (lag, sleeps)


def test_a_long_outage_is_read_every_two_seconds_until_the_timeout(monkeypatch):
    clock = FakeClock()

    def refused(*_args, **_kwargs):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(isvc_wait._Kind, "get", refused)  # pylint: disable=protected-access
    with pytest.raises(SpecDecodingError) as err:
        isvc_wait.wait_ready(None, "ns", "m", timeout=9, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [0.5, 1.0, 2.0, 2.0, 2.0, 1.5]  # the last pause ends at the timeout, never past it
    assert "cannot reach the API server" in str(err.value) and "still after 9s" in str(err.value)
    assert err.value.field == "name"


VERSION = {"major": "1", "minor": "30", "gitVersion": "v1.30.0", "gitCommit": "0", "gitTreeState": "clean", "buildDate": "2024-01-01T00:00:00Z",
           "goVersion": "go1.22", "compiler": "gc", "platform": "linux/amd64"}
# What kubernetes.core's discovery reads while it builds the client: a core API without resources and no groups.
DISCOVERY = {"/api": {"kind": "APIVersions", "versions": ["v1"]}, "/apis": {"kind": "APIGroupList", "groups": []},
             "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": []}}


class _Overloaded(BaseHTTPRequestHandler):
    """Discovery answers; every read of the InferenceService is HTTP 503 (an overloaded API server)."""
    reads = []

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass

    def do_GET(self):  # pylint: disable=invalid-name
        path = self.path.split("?")[0]
        if path == ISVC_PATH:
            self.reads.append(time.monotonic())
        status, doc = (503, {"kind": "Status", "code": 503}) if path == ISVC_PATH else (200, DISCOVERY.get(path, VERSION))
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_the_module_fails_naming_the_outage_at_its_timeout(tmp_path, monkeypatch):
    from kubernetes.client import Configuration  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # kubernetes.core's discovery cache goes there, not /tmp
    monkeypatch.setattr(Configuration, "_default", None)  # a module run is a process of its own; this test is not
    with serving(_Overloaded) as url:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c", "preferences": {},
            "clusters": [{"name": "c", "cluster": {"server": url}}],
            "users": [{"name": "u", "user": {"token": "t"}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        started = time.monotonic()
        res = run_module("isvc_wait", {"name": "m", "namespace": "ns", "kubeconfig": str(kubeconfig), "timeout": 2})
        took = time.monotonic() - started
    assert res.failed and "the API server answered HTTP 503" in res.msg and "still after 2s" in res.msg, res
    assert res["field"] == "name" and res["fix"]
    # read at 0, 0.5 and 1.5 s, and at the 2 s timeout (the pause cut short there): not once and again at 5 s
    gaps = [b - a for a, b in zip(_Overloaded.reads, _Overloaded.reads[1:])]
    # (bounds wide enough for a busy machine; a fixed 5 s pause would have read twice, at 0 and at 2 s)
    assert len(gaps) == 3 and 0.45 < gaps[0] < 0.95 and 0.95 < gaps[1] < 1.6 and gaps[2] < 1.0, gaps
    assert took < 6, took
