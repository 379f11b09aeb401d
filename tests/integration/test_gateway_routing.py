"""The routing plan on the test bed: Gateway API v1.6.1's CRDs installed, the plan's HTTPRoute accepted by the real API
server, and the gateway stand-in (tests/testbed/gateway_standin.py) sending each request class to the pool the plan
says, the answers coming from the process-mode pods themselves. Then the watchdog per request class (issue #52,
roles/watch/tasks/classes.yml) through playbooks/watch.yml: the speculative pool (an InferenceService's process-mode pod)
answers with vLLM 0.32's recorded per-request blocks, one class's acceptance collapsed, and the route on the API server
sends that class back to the baseline while the other stays. Small Python servers, never vLLM: a few seconds."""
import http.client
import json
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_plan
from tests.ansible_run import run_playbook
from tests.module_run import run_module
from tests.paths import read_capture
from tests.testbed import gateway_crds
from tests.testbed.gateway_standin import BACKEND_HEADER, GatewayStandin
from tests.testbed.rest import ApiError

PROCESS = {"testbed.alauda.io/run": "process", "testbed.alauda.io/backoff-seconds": "0.5"}

# The pod scripts' shared part: a handler whose GET answers 200 and whose `answer(self)` (each script's own) makes the JSON
# body of a POST; `{answer}` is that function's code, at the module's top level.
POD_SERVER = r"""
import copy, http.server, json, os
{answer}
class H(http.server.BaseHTTPRequestHandler):
    def _send(self, body):
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        self._send(b"{{}}")
    def do_POST(self):
        self._send(json.dumps(answer(self)).encode())
    def log_message(self, *a):
        pass
http.server.HTTPServer(("", 8080), H).serve_forever()
"""

# Answers POST /v1/completions with the pod's name and the class header it saw (an OpenAI-shaped body), GET with 200.
SERVER = POD_SERVER.format(answer=r"""
def answer(handler):
    handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    return {"served_by": os.environ["HOSTNAME"], "class": handler.headers.get("x-request-class")}
""")


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


def _ready_addresses(api, namespace, name):
    """The Service's ready addresses; none while its Endpoints object does not exist yet (a Service KServe's stand-in
    creates from the InferenceService, after the test's own writes)."""
    try:
        subsets = api.get(f"/api/v1/namespaces/{namespace}/endpoints/{name}").get("subsets") or []
    except ApiError as exc:
        if exc.status != 404:
            raise
        return []
    return [a for s in subsets for a in s.get("addresses") or []]


def _wait_endpoints(api, namespace, names, timeout=30.0):
    deadline = time.monotonic() + timeout
    for name in names:
        while not _ready_addresses(api, namespace, name):
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
    # The rerun in a later second than the first apply: an applied route that differs from the stored, defaulted one
    # (a defaulted field left out of the atomic parentRefs/rules) gets a new managedFields time and resourceVersion on every
    # apply in a new second (kubernetes/kubernetes#121404), and only then.
    created_second = int(time.time())
    while int(time.time()) == created_second:
        time.sleep(0.05)
    again = run_module("server_side_apply", {"definition": route, "field_manager": "alauda-spec-decoding-routes", "kubeconfig": kubeconfig}, diff=True)
    assert not again.failed and again["changed"] is False, json.dumps(again.get("diff"))[:3000]  # the same decisions: nothing to write
    _wait_endpoints(api, namespace, ("speculative", "baseline"))
    with GatewayStandin(controlplane.rest, namespace=namespace, dial=kubelet.network.dial, seed=52) as gateway:
        answers = {klass: _post(gateway.url, klass) for klass in ("code", "chat", None, "summarize")}
    assert answers["code"] == (200, f"{namespace}/speculative", {"served_by": "spec-0", "class": "code"})
    assert answers["chat"] == (200, f"{namespace}/baseline", {"served_by": "base-0", "class": "chat"})
    # unclassified, and a class the plan never measured: the default rule, the baseline
    assert answers[None] == (200, f"{namespace}/baseline", {"served_by": "base-0", "class": None})
    assert answers["summarize"][2]["served_by"] == "base-0"


# The speculative pool's vLLM stand-in: answers POST /v1/completions with vLLM 0.32's recorded responses (the ngram_perreq
# capture, with --per-request-spec-decode-metrics: each carries metrics.speculative_decoding), in turn per class (a prompt
# starting with "def " is class code, any other chat); the class named by COLLAPSED gets the same responses with no draft
# token accepted. Every answer names the pod that served it.
SPEC_SERVER = POD_SERVER.format(answer=r"""
CAPTURED = json.loads(os.environ["CAPTURED"])
SEEN = {}
def answer(handler):
    prompt = json.loads(handler.rfile.read(int(handler.headers.get("Content-Length") or 0)) or b"{}").get("prompt") or ""
    klass = "code" if prompt.startswith("def ") else "chat"
    SEEN[klass] = SEEN.get(klass, 0) + 1
    body = copy.deepcopy(CAPTURED[(SEEN[klass] - 1) % len(CAPTURED)])
    if klass == os.environ["COLLAPSED"]:
        block = body["metrics"]["speculative_decoding"]
        block.update(num_accepted_draft_tokens=0, mean_acceptance_length=1.0, draft_acceptance_rate=0.0,
                     acceptance_histogram=[block["num_spec_steps"]] + [0] * block["num_spec_tokens"])
    body["served_by"] = os.environ["HOSTNAME"]
    return body
""")
# the recorded non-streamed responses of vLLM 0.32 (tests/fixtures/vllm/ngram_perreq)
CAPTURED = [json.loads(chunk.split("\n", 1)[0]) for chunk in read_capture("ngram_perreq", "requests.txt").split("--- RESPONSE:\n")[1:]
            if chunk.startswith("{")]
PROBES = {"code": ["def f%d(x):" % i for i in range(8)], "chat": ["Hello, how is day %d going?" % i for i in range(8)]}
ISVC = "/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices"
HTTPROUTE = "/apis/gateway.networking.k8s.io/v1/namespaces/%s/httproutes/classes"
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}


def _class_baseline(n):
    """A class's baseline as the A/B report gives it (its counters): the first ``n`` recorded responses in turn, summed here
    from vLLM's per-request fields (acceptance_histogram[i]: steps that accepted exactly i draft tokens)."""
    blocks = [CAPTURED[i % len(CAPTURED)]["metrics"]["speculative_decoding"] for i in range(n)]
    k = blocks[0]["num_spec_tokens"]
    counters = {"num_drafts": sum(b["num_spec_steps"] for b in blocks), "num_draft_tokens": sum(b["num_draft_tokens"] for b in blocks),
                "num_accepted_tokens": sum(b["num_accepted_draft_tokens"] for b in blocks),
                "accepted_tokens_per_position": [sum(sum(b["acceptance_histogram"][j + 1:]) for b in blocks) for j in range(k)]}
    return {"requests": n, "acceptance": {"counters": counters}}


def _speculative_pool(api, namespace, name, collapsed):
    """An InferenceService whose predictor pod (KServe stand-in: Deployment, then a process-mode pod) runs SPEC_SERVER, its
    command carrying the speculative flag the watchdog must leave alone."""
    api.post(ISVC % namespace, {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": name, "annotations": {"serving.kserve.io/deploymentMode": "RawDeployment", **PROCESS}},
        "spec": {"predictor": {"containers": [{
            "name": "kserve-container", "image": "testbed/python",
            "command": ["python3", "-c", SPEC_SERVER, "--speculative-config", json.dumps(NGRAM)],
            "env": [{"name": "CAPTURED", "value": json.dumps(CAPTURED)}, {"name": "COLLAPSED", "value": collapsed}],
            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/v1/models", "port": 8080}, "periodSeconds": 1}}]}}})


def test_the_watchdog_routes_a_collapsed_class_back_to_the_baseline_and_leaves_the_other_on(
        controlplane, kserve, kubelet, api, namespace, kubeconfig, tmp_path):  # pylint: disable=unused-argument
    gateway_crds.install(controlplane)
    _speculative_pool(api, namespace, "spec", collapsed="code")
    _pool(api, namespace, "base-0", "baseline")
    # the routing plan: both classes gained, both on the speculative pool (KServe's predictor Service); the rest on the baseline
    classes = {"classes": [{"class": "code", "decision": "keep", "outcome": "keep"}, {"class": "chat", "decision": "keep", "outcome": "keep"}]}
    plan = routing_plan.build_plan(classes, {"name": "spec-predictor", "port": 80}, {"name": "baseline", "port": 80})
    route = routing_plan.httproute(plan, "classes", namespace, parent_refs=[{"name": "inference-gateway"}])
    applied = run_module("server_side_apply", {"definition": route, "field_manager": "alauda-spec-decoding-routes", "kubeconfig": kubeconfig})
    assert not applied.failed, applied.msg
    assert [r["name"] for r in api.get(HTTPROUTE % namespace)["spec"]["rules"]] == ["class-code", "class-chat", "default"]
    # each class's baseline, in the ConfigMap the watchdog reads (recorded when the routes were verified)
    api.post(f"/api/v1/namespaces/{namespace}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "spec-spec-decoding-class-baseline"},
        "data": {"classes.json": json.dumps({"classes": {k: _class_baseline(len(p)) for k, p in PROBES.items()}})}})
    _wait_endpoints(api, namespace, ("spec-predictor", "baseline"), timeout=60)
    before = api.get(ISVC % namespace + "/spec")

    extra = {"watch_names": [f"{namespace}/spec"], "watch_interval": 0.2, "watch_count": 1,
             "watch_request_classes": {"probes": PROBES, "route_name": "classes", "write": "apply", "min_requests": 8}}
    run = run_playbook(tmp_path, "playbooks/watch.yml", extra_vars=extra, kubeconfig=kubeconfig)
    assert run.rc == 0, run.output
    watched = run.result("Watch each request class on the speculative pool")["results"][0]
    assert {r["class"]: r["state"] for r in watched["classes"]} == {"code": "collapsed", "chat": "healthy"}, watched["reasons"]
    assert watched["routed_back"] == ["code"] and watched["action"] == "route_back"
    assert {r["class"]: r["figures"]["requests"] for r in watched["classes"]} == {"code": 8, "chat": 8}

    # the route on the API server: code's rule gone (its requests take the default rule, the baseline), chat's kept
    live = api.get(HTTPROUTE % namespace)
    assert {r["name"]: [b["name"] for b in r["backendRefs"]] for r in live["spec"]["rules"]} == {
        "class-chat": ["spec-predictor"], "default": ["baseline"]}
    assert json.loads(live["metadata"]["annotations"]["spec-decoding.alauda.io/routing-plan"])["classes"] == {
        "code": "baseline", "chat": "speculative"}
    assert {m["manager"] for m in live["metadata"]["managedFields"]} == {"alauda-spec-decoding-routes"}
    # the pool itself untouched: same generation, the flag still in its command; the service-wide watch had no baseline
    after = api.get(ISVC % namespace + "/spec")
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"]["predictor"]["containers"][0]["command"] == before["spec"]["predictor"]["containers"][0]["command"]
    assert "--speculative-config" in after["spec"]["predictor"]["containers"][0]["command"]
    assert run.result("Set watch_result")["ansible_facts"]["watch_result"]["rolled_back"] == []

    # and the gateway routes as the new route says
    with GatewayStandin(controlplane.rest, namespace=namespace, dial=kubelet.network.dial, seed=52) as gateway:
        answers = {klass: _post(gateway.url, klass) for klass in ("code", "chat")}
    assert answers["code"][:2] == (200, f"{namespace}/baseline") and answers["code"][2]["served_by"] == "base-0"
    assert answers["chat"][:2] == (200, f"{namespace}/spec-predictor") and answers["chat"][2]["served_by"].startswith("spec-predictor-")
    assert answers["chat"][2]["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"] > 0
    print("\nwatchdog per class through watch.yml: %.1f s wall, %.1f CPU s; code collapsed and routed back, chat kept" % (run.wall, run.cpu))
