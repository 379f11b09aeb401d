"""Verify per request class (ops/verify_classes.py, module request_class_routing_info): requests of each class through a
gateway, the pool that served each told from the answer's own vLLM per-request block, against the routing plan.

In-process and on loopback: two small servers answer as vLLM 0.32 does (the speculative pool with the per-request block
of a real answer, captured from vLLM 0.32 with --per-request-spec-decode-metrics summary; the baseline with
``metrics: null``, as vLLM without the flag answers), and a loopback gateway routes by the plan's HTTPRoute with the test
bed's gateway stand-in's matching (tests/testbed/gateway_standin.py ``select``, pinned to Gateway API's conformance
cases). The module runs as Ansible runs it (tests/module_run.py)."""
from __future__ import annotations

import copy
import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import verify_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import watchdog_classes
from tests.module_run import run_module
from tests.testbed.gateway_standin import select

# metrics.speculative_decoding of a real answer (vLLM 0.32.0+cpu, ngram k=5, --per-request-spec-decode-metrics summary:
# ../shared/vllm-captures/ngram_perreq/requests.txt, its first completion)
BLOCK = {"mean_acceptance_length": 2.6, "draft_acceptance_rate": 0.4, "acceptance_histogram": [12, 8, 1, 12, 0, 2],
         "num_spec_steps": 35, "num_accepted_draft_tokens": 56, "num_draft_tokens": 140, "num_spec_tokens": 5}


def _answer(model, speculative):
    return {"id": "cmpl-1", "object": "text_completion", "model": model,
            "choices": [{"index": 0, "text": " hello", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21},
            "metrics": {"time_to_first_token_ms": None, "speculative_decoding": dict(BLOCK)} if speculative else None}


class _Server:
    """A loopback HTTP server; ``handle(method, path, headers, body) -> (status, dict)``."""

    def __init__(self, handle):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # pylint: disable=arguments-differ
                pass

            def _do(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                status, out = handle(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _do  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.port = self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _pool(speculative, seen):
    def handle(method, path, headers, body):
        if method == "GET" and path == "/v1/models":
            return 200, {"data": [{"id": "tiny"}]}
        seen.append((headers.get("x-request-class"), body))
        return 200, _answer(body["model"], speculative)
    return _Server(handle)


class _Gateway:
    """Routes by ``routes`` (HTTPRoute objects, changeable) with the stand-in's ``select``; a backendRef's Service name is
    looked up in ``services`` ({name: port on loopback})."""

    def __init__(self, routes, services):
        self.routes, self.services = routes, services

        def handle(method, path, headers, body):
            chosen = select(self.routes, method, path, headers)
            if chosen is None:
                return 404, {"error": "no rule"}
            port = self.services[chosen[2]["backendRefs"][0]["name"]]
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request(method, path, body=json.dumps(body) if body is not None else None,
                             headers={k: v for k, v in headers.items() if k in ("x-request-class", "content-type")})
                resp = conn.getresponse()
                return resp.status, json.loads(resp.read())
            finally:
                conn.close()
        self.server = _Server(handle)
        self.url = self.server.url


@pytest.fixture(name="servers", scope="module")
def _servers():
    seen = {"speculative": [], "baseline": []}
    spec, base = _pool(True, seen["speculative"]), _pool(False, seen["baseline"])
    gateway = _Gateway([], {"tiny-predictor": spec.port, "tiny-baseline-predictor": base.port})
    yield gateway, seen
    for server in (spec, base, gateway.server):
        server.close()


@pytest.fixture(name="bed")
def _bed(servers):
    gateway, seen = servers
    for requests in seen.values():
        del requests[:]
    classes = {"classes": [{"class": "copy", "decision": "keep", "outcome": "keep"},
                           {"class": "chat", "decision": "roll_back", "outcome": "no_gain"}]}
    plan = routing_plan.build_plan(classes, {"name": "tiny-predictor", "port": 80}, {"name": "tiny-baseline-predictor", "port": 80})
    route = routing_plan.httproute(plan, "report-classes", "models")
    gateway.routes[:] = [copy.deepcopy(route)]
    return {"route": route, "plan": plan, "gateway": gateway, "seen": seen}


def test_each_class_reaches_the_pool_the_plan_says(bed):
    result = run_module("request_class_routing_info", {"gateway_url": bed["gateway"].url, "route": bed["route"],
                                                       "prompts": {"copy": ["a b a b a b", "c d c d"]}})
    assert not result.failed, result.msg
    rows = {r["class"]: r for r in result["classes"]}
    assert [(c, rows[c]["expected_pool"], rows[c]["seen_pool"], rows[c]["requests"]) for c in ("chat", "copy", "(unclassified)")] == [
        ("chat", "baseline", "baseline", 1), ("copy", "speculative", "speculative", 2), ("(unclassified)", "baseline", "baseline", 1)]
    assert all(r["ok"] and not r["errors"] for r in rows.values())
    # the speculative pool's blocks, summed: two answers of the captured block
    assert rows["copy"]["acceptance"]["num_drafts"] == 2 * BLOCK["num_spec_steps"]
    assert rows["copy"]["acceptance"]["num_accepted_tokens"] == 2 * BLOCK["num_accepted_draft_tokens"]
    assert rows["chat"]["acceptance"] is None
    assert result["model"] == "tiny" and result["class_header"] == "x-request-class" and result["speculative_classes"] == ["copy"]
    assert "copy -> speculative" in result.msg and "chat -> baseline" in result.msg
    # what the pools really got: the class header, the model from /v1/models, n 1, not streamed
    assert [c for c, _b in bed["seen"]["speculative"]] == ["copy", "copy"]
    assert [c for c, _b in bed["seen"]["baseline"]] == ["chat", None]
    body = bed["seen"]["speculative"][0][1]
    assert (body["model"], body["n"], body["stream"], body["temperature"], body["prompt"]) == ("tiny", 1, False, 0, "a b a b a b")


def test_the_plan_itself_and_the_class_header_of_its_rules(bed):
    header, pools, default = verify_classes.expected_pools(bed["route"])
    assert (header, pools, default) == ("x-request-class", {"copy": "speculative", "chat": "baseline"}, "baseline")
    assert verify_classes.expected_pools(bed["plan"]) == (header, pools, default)
    result = run_module("request_class_routing_info", {"gateway_url": bed["gateway"].url + "/v1", "route": bed["plan"], "unclassified": False})
    assert not result.failed, result.msg
    assert [r["class"] for r in result["classes"]] == ["chat", "copy"]


def test_a_class_routed_to_the_other_pool_fails_naming_the_class_and_both_pools(bed):
    # the live route sends copy to the baseline (its rule's backendRef edited), the plan still says speculative
    live = copy.deepcopy(bed["route"])
    live["spec"]["rules"][0]["backendRefs"][0]["name"] = "tiny-baseline-predictor"
    bed["gateway"].routes[:] = [live]
    result = run_module("request_class_routing_info", {"gateway_url": bed["gateway"].url, "route": bed["route"]})
    assert result.failed
    assert result.msg.startswith("route: class copy (header x-request-class: copy) reached the baseline pool"), result.msg
    assert "the plan says the speculative pool" in result.msg and result["field"] == "route"
    assert "class-copy" in result["fix"] and "--per-request-spec-decode-metrics" in result["fix"]
    assert {r["class"]: r["seen_pool"] for r in result["classes"]} == {"chat": "baseline", "copy": "baseline", "(unclassified)": "baseline"}


def test_a_class_the_plan_keeps_on_the_baseline_seen_on_the_speculative_pool_fails(bed):
    live = copy.deepcopy(bed["route"])
    live["spec"]["rules"][1]["backendRefs"][0]["name"] = "tiny-predictor"  # chat's rule
    bed["gateway"].routes[:] = [live]
    result = run_module("request_class_routing_info", {"gateway_url": bed["gateway"].url, "route": bed["route"]})
    assert result.failed and "class chat (header x-request-class: chat) reached the speculative pool" in result.msg, result.msg
    assert "the plan says the baseline pool" in result.msg


def test_a_class_routed_back_by_the_watchdog_is_expected_on_the_baseline(bed):
    # ops/watchdog_classes.route_back: copy's rule removed, the plan's annotation says baseline; the gateway has that route
    back = watchdog_classes.route_back(bed["route"], ["copy"])
    bed["gateway"].routes[:] = [back]
    result = run_module("request_class_routing_info", {"gateway_url": bed["gateway"].url, "route": back})
    assert not result.failed, result.msg
    assert {r["class"]: (r["expected_pool"], r["seen_pool"]) for r in result["classes"]}["copy"] == ("baseline", "baseline")


def test_no_answer_through_the_gateway_names_the_gateway(bed):
    bed["gateway"].routes[:] = []  # no rule: the gateway answers 404
    result = run_module("request_class_routing_info", {"gateway_url": bed["gateway"].url, "route": bed["route"], "model": "tiny"})
    assert result.failed and result["field"] == "gateway_url", result.msg
    assert "class chat (header x-request-class: chat): 1 of 1 requests got no answer through the gateway (HTTP 404" in result.msg


def test_refusals_name_the_field():
    with pytest.raises(ValidationError) as err:
        verify_classes.expected_pools({"kind": "HTTPRoute", "metadata": {"name": "x"}, "spec": {"rules": []}})
    assert err.value.field == "route" and str(err.value).startswith("route: carries no routing plan (annotation spec-decoding"), str(err.value)
    with pytest.raises(ValidationError) as err:
        verify_classes.expected_pools({"kind": "Service"})
    assert err.value.field == "route" and "is not the routing plan's HTTPRoute" in str(err.value)
    plan = {"classes": [{"class": "copy", "pool": "speculative"}], "pools": {}, "class_header": "x-request-class"}
    params = {"prompts": {"code": ["x"]}, "requests_per_class": 1, "max_tokens": 4, "default_prompt": "hi"}
    with pytest.raises(ValidationError) as err:
        verify_classes.verify_classes(params, plan, None, "m")
    assert err.value.field == "prompts" and "class code, which the plan does not route (copy)" in str(err.value)
    with pytest.raises(ValidationError) as err:
        verify_classes.verify_classes(dict(params, prompts={"copy": []}), plan, lambda h, b: (200, {}), "m")
    assert err.value.field == "prompts.copy"
    result = run_module("request_class_routing_info", {"gateway_url": "http://127.0.0.1:9", "route_name": "r"})
    assert result.failed and "namespace" in result.msg  # required_by: AnsibleModule's own rule


def test_an_answer_without_a_block_is_the_baseline_and_a_stream_chunk_is_not_judged():
    assert verify_classes.pool_of_answer(_answer("m", True)) == ("speculative", BLOCK)
    assert verify_classes.pool_of_answer(_answer("m", False)) == ("baseline", None)
    row = verify_classes.class_row("copy", "speculative", [(200, _answer("m", True)), (200, _answer("m", False))])
    assert row["seen_pools"] == ["baseline", "speculative"] and row["seen_pool"] is None and not row["ok"]
    assert row["evidence"] == "answers of both pools"
