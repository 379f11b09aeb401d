"""The Gateway API stand-in (tests/testbed/gateway_standin.py) against Gateway API v1.6.1's own conformance cases for
HTTPRoute matching and weights (tests/data/gateway-httproute-conformance.yaml), and its proxy over loopback."""
import collections
import http.client
import json
import os
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tests.testbed import gateway_standin

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "gateway-httproute-conformance.yaml")

with open(DATA, encoding="utf-8") as _handle:
    CONFORMANCE = yaml.safe_load(_handle)


def _cases():
    for case in CONFORMANCE["cases"]:
        for index, request in enumerate(case["requests"]):
            yield pytest.param(case, request, id="%s-%d" % (case["name"], index))


def test_the_data_is_the_release_it_names():
    assert CONFORMANCE["release"] == "v1.6.1"
    assert len(CONFORMANCE["cases"]) == 7 and sum(len(c["requests"]) for c in CONFORMANCE["cases"]) == 71


@pytest.mark.parametrize("case, request_", list(_cases()))
def test_matching_conformance(case, request_):
    routes = gateway_standin.creation_timestamps(case["routes"])
    chosen = gateway_standin.select(routes, request_.get("method", "GET"), request_["path"], request_.get("headers") or {},
                                    request_.get("host", "gateway.example"))
    if "status" in request_:
        assert chosen is None, "expected 404, routed by %r" % (chosen,)
        return
    assert chosen is not None, "expected %s, got 404" % request_["backend"]
    _route, _index, rule = chosen
    assert [ref["name"] for ref in rule["backendRefs"]] == [request_["backend"]]


def test_weights_conformance():
    [case] = CONFORMANCE["weights"]
    [route] = gateway_standin.creation_timestamps(case["routes"])
    _route, _index, rule = gateway_standin.select([route], "GET", case["path"], {})
    rng = random.Random(52)
    seen = collections.Counter(gateway_standin.pick_backend(rule, rng)["name"] for _draw in range(case["total_requests"]))
    for backend, share in case["expected"].items():
        assert abs(seen[backend] / case["total_requests"] - share) <= case["tolerance"], (backend, seen)
    assert seen["infra-backend-v3"] == 0  # weight 0 never
    assert gateway_standin.pick_backend({"backendRefs": [{"name": "x", "port": 1, "weight": 0}]}) is None


def test_precedence_of_the_routing_plan_shape():
    """The routing plan's shape: class rules with a header match beat the default rule whatever their order."""
    rules = [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [{"name": "baseline", "port": 80}]},
             {"matches": [{"path": {"type": "PathPrefix", "value": "/"}, "headers": [{"name": "x-request-class", "value": "code"}]}],
              "backendRefs": [{"name": "speculative", "port": 80}]}]
    routes = gateway_standin.creation_timestamps([{"name": "plan", "spec": {"rules": rules}}])

    def pick(headers):
        return gateway_standin.select(routes, "POST", "/v1/completions", headers)[2]["backendRefs"][0]["name"]
    assert pick({"X-Request-Class": "code"}) == "speculative"
    assert pick({"x-request-class": "chat"}) == "baseline" and pick({}) == "baseline"


# -- the proxy, over loopback, with a fake API server --------------------------------------------------------------------
class _Backend(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    name = "?"

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass

    def do_POST(self):  # pylint: disable=invalid-name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index in range(3):
            data = ("data: %s\n\n" % json.dumps({"served_by": self.name, "i": index, "echo": json.loads(body)})).encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")


def _serve(name):
    handler = type("Backend_" + name, (_Backend,), {"name": name})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _FakeApi:
    def __init__(self, objects):
        self.objects = objects

    def get(self, path):
        if path not in self.objects:
            raise KeyError(path)
        return self.objects[path]

    def close(self):
        pass


def test_proxy_routes_streams_and_names_the_backend():
    spec, base = _serve("speculative"), _serve("baseline")
    objects = {"/apis/gateway.networking.k8s.io/v1/namespaces/models/httproutes": {"items": [{
        "metadata": {"name": "plan", "namespace": "models", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"rules": [
            {"matches": [{"headers": [{"name": "x-request-class", "value": "code"}]}], "backendRefs": [{"name": "spec", "port": 80}]},
            {"backendRefs": [{"name": "base", "port": 80}]},
            {"matches": [{"path": {"type": "Exact", "value": "/nowhere"}}], "backendRefs": [{"name": "gone", "port": 80}]}]}}]}}
    for name, server in (("spec", spec), ("base", base)):
        objects["/api/v1/namespaces/models/services/%s" % name] = {"spec": {"ports": [{"name": "http", "port": 80}]}}
        objects["/api/v1/namespaces/models/endpoints/%s" % name] = {"subsets": [{
            "addresses": [{"ip": "127.0.0.1"}], "ports": [{"name": "http", "port": server.server_address[1]}]}]}
    with gateway_standin.GatewayStandin(lambda: _FakeApi(objects), namespace="models", seed=1) as gateway:
        port = int(gateway.url.rsplit(":", 1)[1])
        for klass, expected in (("code", "speculative"), ("chat", "baseline"), (None, "baseline")):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            headers = {"Content-Type": "application/json"}
            if klass:
                headers["x-request-class"] = klass
            started = time.perf_counter()
            conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "p"}), headers=headers)
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader(gateway_standin.BACKEND_HEADER) == "models/" + {"speculative": "spec", "baseline": "base"}[expected]
            first = resp.readline()
            first_at = time.perf_counter() - started
            rest = resp.read()
            events = [json.loads(line[5:]) for line in (first + rest).decode().splitlines() if line.startswith("data:")]
            assert [e["served_by"] for e in events] == [expected] * 3 and events[0]["echo"] == {"prompt": "p"}
            assert first_at < 0.1  # the first event arrived before the backend finished (streamed, not buffered)
            conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/nowhere", body="{}", headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 500  # the rule's Service has no endpoints
        conn.close()
        assert [entry[2:] for entry in gateway.served] == [("code", "models/spec"), ("chat", "models/base"), (None, "models/base"), (None, 500)]
    for server in (spec, base):
        server.shutdown()
        server.server_close()
