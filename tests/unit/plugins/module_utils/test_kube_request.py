"""kube/client.py `request`: one API call by path with a real kubernetes ApiClient against a local HTTP server (the
collection's way around the typed API classes: their import and pydantic models cost about a second per module)."""
import http.server
import json
import threading
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods

kubernetes = pytest.importorskip("kubernetes")


class _Handler(http.server.BaseHTTPRequestHandler):
    seen = []

    def log_message(self, *args):
        pass

    def _answer(self, code, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        self.seen.append(("GET", self.path, dict(self.headers), None))
        if self.path.startswith("/api/v1/namespaces/ns/pods?"):
            self._answer(200, {"kind": "PodList", "items": [
                {"metadata": {"name": "b", "namespace": "ns", "labels": {"component": "predictor"}},
                 "spec": {"containers": [{"name": "kserve-container"}]},
                 "status": {"phase": "Running", "containerStatuses": [{"name": "kserve-container", "restartCount": 2}]}},
                {"metadata": {"name": "a", "namespace": "ns", "deletionTimestamp": "2026-12-02T00:00:00Z"}, "spec": {"containers": []},
                 "status": {"phase": "Running"}}]})
        elif self.path.startswith("/api/v1/namespaces/ns/pods/b/log?"):
            self._answer(200, b"line 1\nline 2\n", "text/plain")
        elif self.path == "/api/v1/namespaces/ns/pods/https:b:8443/proxy/metrics":
            self._answer(200, b"vllm:spec_decode_num_drafts_total 3\n", "text/plain")
        elif self.path.startswith("/api/v1/namespaces/ns/pods/") and "/proxy/metrics" in self.path:
            # the page's headers and a part of it, then the rest never comes (a server stopped mid-answer)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"vllm:spec_decode_num_drafts_total 3\n")
            self.wfile.flush()
            if self.path.startswith("/api/v1/namespaces/ns/pods/stalled:"):
                time.sleep(1.5)
            self.close_connection = True
        else:
            self._answer(404, {"kind": "Status", "status": "Failure", "message": "pods \"x\" not found", "reason": "NotFound", "code": 404})

    def do_PATCH(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("PATCH", self.path, dict(self.headers), body))
        self._answer(200, {"metadata": {"name": "pvc", "annotations": body["metadata"]["annotations"]}})


@pytest.fixture(name="api_client")
def fixture_api_client():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = kubernetes.client.Configuration()
    config.host = "http://127.0.0.1:%d" % server.server_address[1]
    _Handler.seen = []
    api = kubernetes.client.ApiClient(config)
    yield api
    server.shutdown()
    server.server_close()


def test_get_returns_the_json_as_dicts_with_the_query(api_client):
    pods, skipped = k8s_pods.list_pods(api_client, "ns", "serving.kserve.io/inferenceservice=m")
    assert pods == [{"name": "b", "namespace": "ns", "phase": "Running", "deleting": False, "labels": {"component": "predictor"},
                     "containers": ["kserve-container"], "restarts": {"kserve-container": 2}, "init_restarts": {},
                     "states": {"kserve-container": None}}]
    assert [(p["name"], p["reason"]) for p in skipped] == [("a", "being deleted")]
    method, path, headers, _body = _Handler.seen[0]
    assert (method, path) == ("GET", "/api/v1/namespaces/ns/pods?labelSelector=serving.kserve.io/inferenceservice%3Dm")
    assert headers["Accept"] == "application/json"


def test_logs_stream_and_the_proxy_path_carries_scheme_and_port(api_client):
    assert b"".join(k8s_pods.stream_pod_log(api_client, "ns", "b", tail_lines=5, previous=True)) == b"line 1\nline 2\n"
    assert _Handler.seen[-1][1] == "/api/v1/namespaces/ns/pods/b/log?container=kserve-container&tailLines=5&previous=true"
    assert k8s_pods.proxy_get(api_client, "ns", "b", port=8443, scheme="https") == "vllm:spec_decode_num_drafts_total 3\n"


@pytest.mark.parametrize("pod", ["stalled", "cut"])
def test_a_page_that_stops_half_way_is_a_pod_access_error(api_client, pod):
    # the body is read after the answer's headers: a read timeout or a cut connection there is the pod's failure to
    # answer (the watchdog's `unknown` window), not a crash of the module
    with pytest.raises(k8s_pods.PodAccessError, match="GET /metrics on pod ns/%s port 8080 .* failed" % pod):
        k8s_pods.proxy_get(api_client, "ns", pod, port=8080, timeout=0.5)


def test_a_get_with_a_timeout_is_tried_once():
    """A pod that accepts and never answers (a SIGSTOPped vLLM behind the pod proxy): the read times out once, on one
    connection - the timeout is the request's, not each of the pool's four attempts' (urllib3's default Retry)."""
    import socket  # pylint: disable=import-outside-toplevel
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = []

    def accept():
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    config = kubernetes.client.Configuration()
    config.host = "http://127.0.0.1:%d" % listener.getsockname()[1]
    api = kubernetes.client.ApiClient(config)
    started = time.monotonic()
    try:
        with pytest.raises(k8s_pods.PodAccessError, match="GET /metrics on pod ns/silent port 8080 .* failed"):
            k8s_pods.proxy_get(api, "ns", "silent", port=8080, timeout=0.4)
        seconds = time.monotonic() - started
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert len(accepted) == 1 and 0.4 <= seconds < 1.2, (len(accepted), seconds)


def test_an_error_answer_raises_the_clients_api_exception_with_the_servers_message(api_client):
    with pytest.raises(kube_client.ApiException) as caught:
        kube_client.request(api_client, "GET", "/api/v1/namespaces/ns/pods/x")
    assert caught.value.status == 404
    assert k8s_pods.api_error_message(caught.value) == 'pods "x" not found (HTTP 404)'
    with pytest.raises(k8s_pods.ValidationError, match="pod ns/x not found"):
        k8s_pods.read_pod(api_client, "ns", "x")


def test_patch_sends_the_body_with_its_content_type(api_client):
    out = kube_client.request(api_client, "PATCH", "/api/v1/namespaces/ns/persistentvolumeclaims/pvc",
                              body={"metadata": {"annotations": {"a": "1"}}}, content_type="application/merge-patch+json")
    assert out == {"metadata": {"name": "pvc", "annotations": {"a": "1"}}}
    method, _path, headers, body = _Handler.seen[-1]
    assert method == "PATCH" and headers["Content-Type"] == "application/merge-patch+json" and body == {"metadata": {"annotations": {"a": "1"}}}
