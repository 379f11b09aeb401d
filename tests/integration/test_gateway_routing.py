"""The routing plan on the test bed: Gateway API v1.6.1's CRDs installed, the plan's HTTPRoute accepted by the real API
server, and the gateway stand-in (tests/testbed/gateway_standin.py) sending each request class to the pool the plan
says, the answers coming from the process-mode pods themselves. Small Python servers, never vLLM: a few seconds."""
import http.client
import json
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_plan
from tests.module_run import run_module
from tests.testbed import gateway_crds
from tests.testbed.gateway_standin import BACKEND_HEADER, GatewayStandin
from tests.testbed.rest import ApiError

PROCESS = {"testbed.alauda.io/run": "process", "testbed.alauda.io/backoff-seconds": "0.5"}

# Answers POST /v1/completions with the pod's name and the class header it saw (an OpenAI-shaped body), GET with 200.
SERVER = r"""
import http.server, json, os
class H(http.server.BaseHTTPRequestHandler):
    def _send(self, body):
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        self._send(b"{}")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(json.dumps({"served_by": os.environ["HOSTNAME"], "class": self.headers.get("x-request-class")}).encode())
    def log_message(self, *a):
        pass
http.server.HTTPServer(("", 8080), H).serve_forever()
"""


@pytest.fixture
def api(controlplane, kubelet):  # pylint: disable=unused-argument
    client = controlplane.rest()
    yield client
    client.close()


def _create(api, path, body, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:  # the ServiceAccount admission needs the namespace's default ServiceAccount first
        try:
            return api.post(path, body)
        except ApiError as exc:
            if exc.status != 403 or "serviceaccount" not in exc.body or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _pool(api, namespace, name, pool):
    _create(api, f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": PROCESS, "labels": {"pool": pool}},
        "spec": {"restartPolicy": "Always", "automountServiceAccountToken": False, "containers": [{
            "name": "server", "image": "testbed/python", "command": ["python3", "-c", SERVER],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1}}]}})
    api.post(f"/api/v1/namespaces/{namespace}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": pool},
        "spec": {"selector": {"pool": pool}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})


def _wait_endpoints(api, namespace, names, timeout=30.0):
    deadline = time.monotonic() + timeout
    for name in names:
        while not any(s.get("addresses") for s in api.get(f"/api/v1/namespaces/{namespace}/endpoints/{name}").get("subsets") or []):
            assert time.monotonic() < deadline, f"Service {name} got no ready endpoint"
            time.sleep(0.1)


def _post(url, klass):
    host, port = url[len("http://"):].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": "application/json"}
    if klass:
        headers["x-request-class"] = klass
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({"model": "m", "prompt": "p"}), headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader(BACKEND_HEADER), json.loads(resp.read() or b"null")
    finally:
        conn.close()


def test_the_plans_httproute_routes_each_class_to_its_pool(controlplane, kubelet, api, namespace, kubeconfig):
    gateway_crds.install(controlplane)
    _pool(api, namespace, "spec-0", "speculative")
    _pool(api, namespace, "base-0", "baseline")
    classes = {"classes": [{"class": "code", "decision": "keep", "outcome": "keep"},
                           {"class": "chat", "decision": "roll_back", "outcome": "no_gain"}]}
    plan = routing_plan.build_plan(classes, {"name": "speculative", "port": 80}, {"name": "baseline", "port": 80})
    route = routing_plan.httproute(plan, "classes", namespace, parent_refs=[{"name": "inference-gateway"}])
    routing_plan.check_httproute(route)
    # applied as the benchmark role's write=apply does (roles/benchmark/tasks/routes.yml): server-side apply, in-process
    applied = run_module("server_side_apply", {"definition": route, "field_manager": "alauda-spec-decoding-routes", "kubeconfig": kubeconfig})
    assert not applied.failed, applied.msg
    created = api.get(f"/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/httproutes/classes")
    assert applied["changed"] is True and created["metadata"]["managedFields"][0]["manager"] == "alauda-spec-decoding-routes"
    assert [r["name"] for r in created["spec"]["rules"]] == ["class-code", "class-chat", "default"]  # stored as rendered
    again = run_module("server_side_apply", {"definition": route, "field_manager": "alauda-spec-decoding-routes", "kubeconfig": kubeconfig})
    assert not again.failed and again["changed"] is False  # the same decisions: nothing to write
    _wait_endpoints(api, namespace, ("speculative", "baseline"))
    with GatewayStandin(controlplane.rest, namespace=namespace, dial=kubelet.network.dial, seed=52) as gateway:
        answers = {klass: _post(gateway.url, klass) for klass in ("code", "chat", None, "summarize")}
    assert answers["code"] == (200, f"{namespace}/speculative", {"served_by": "spec-0", "class": "code"})
    assert answers["chat"] == (200, f"{namespace}/baseline", {"served_by": "base-0", "class": "chat"})
    # unclassified, and a class the plan never measured: the default rule, the baseline
    assert answers[None] == (200, f"{namespace}/baseline", {"served_by": "base-0", "class": None})
    assert answers["summarize"][2]["served_by"] == "base-0"
