# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verify per request class (issue #52, module ``request_class_routing_info``, the verify role's
``verify_request_classes``): requests of each class sent through the gateway, and, from the serving pods' own answers,
which pool served each class against the pool the routing plan says.

The evidence is in the answer itself. The speculative pool runs vLLM 0.32+ with ``--per-request-spec-decode-metrics``
(the render turns it on for every speculative deploy where the release has it), so each of its answers to a completion
that is not streamed and has ``n == 1`` carries ``metrics.speculative_decoding`` (vLLM 0.32
``entrypoints/openai/completion/serving.py`` ``OpenAIServingCompletion.request_output_to_completion_response``: the block
is built by ``entrypoints/generate/base/serving.py`` ``build_spec_decoding_metrics`` whenever the request's output has
per-request spec-decode stats, which the flag turns on). The baseline pool cannot carry that flag (vLLM 0.32
``config/vllm.py`` ``VllmConfig.__post_init__`` refuses it without a speculative config), so its answers have
``metrics: null``. An answer with the block was served by the speculative pool, one without it by the baseline; the
gateway's own word (a response header, its logs) is not read: only what the serving vLLM wrote.

What is sent: per class of the plan, the class's prompts (or ``default_prompt``) as ``POST /v1/completions`` with the
plan's class header set to the class, ``temperature`` 0, ``n`` 1, not streamed; and one request without the header, which
the plan's default rule sends to the baseline (an unclassified request is never served speculatively by the plan).

Where the plan comes from: the routing plan's HTTPRoute (the file the benchmark role writes,
``<benchmark_report_name>-httproute.yaml``, or the live object by name), the LLMInferenceService part that carries the same
rules in its router, or the plan itself (filter ``routing_plan`` with ``render=plan``). The pool each class is meant for is
the plan's annotation (``spec-decoding.alauda.io/routing-plan``, also kept up to date by the watchdog's route edit,
ops/watchdog_classes.py ``route_back``), the class header the name its rules match on.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import http.client
import json

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import watchdog_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics

UNCLASSIFIED = "(unclassified)"
SPECULATIVE, BASELINE = routing_plan.POOLS
SEEN_SPECULATIVE = "answers carried metrics.speculative_decoding (vLLM's per-request spec-decode block): the speculative pool"
SEEN_BASELINE = "answers carried no metrics.speculative_decoding: a server without speculative decoding, the baseline pool"


class RoutingMismatch(SpecDecodingError):
    """A class reached another pool than the plan says; the failed result keeps every class's finding (``classes``)."""

    classes = None

    def result(self):
        return dict(super().result(), classes=self.classes)


# -- the plan -------------------------------------------------------------------------------------------------------------

def _class_header_of_rules(rules):
    """The header the plan's class rules match on (bench/routing_plan.py ``route_rules``: rule ``class-<class>``, its first
    match's first header), or None when the route has no class rule."""
    for rule in rules or []:
        if str(rule.get("name", "")).startswith(watchdog_classes.RULE_PREFIX):
            for match in rule.get("matches") or []:
                for header in match.get("headers") or []:
                    if header.get("name"):
                        return header["name"]
    return None


def expected_pools(route):
    """``(class_header, {class: pool}, default_pool)`` of a routing plan given as its HTTPRoute, an LLMInferenceService
    with the plan's rules in its router, or the plan itself (``routing_plan.build_plan``)."""
    if isinstance(route, dict) and isinstance(route.get("classes"), list) and "pools" in route:  # the plan itself
        pools = {e["class"]: e["pool"] for e in route["classes"] if isinstance(e, dict) and e.get("class")}
        return route.get("class_header") or routing_plan.DEFAULT_CLASS_HEADER, pools, route.get("default_pool") or BASELINE
    try:
        pools = watchdog_classes.plan_pools(route)
    except ValidationError as exc:  # the watchdog names its own option; here the plan is this module's route
        said = str(exc)[len(exc.field) + 2:] if exc.field and str(exc).startswith(exc.field + ": ") else str(exc)
        raise ValidationError(said.split(". Fix: ")[0], field="route",
                              hint="give the routing plan's HTTPRoute the benchmark role wrote (<benchmark_report_name>-httproute.yaml), "
                                   "or the plan (filter routing_plan, render=plan)") from exc
    rules = watchdog_classes._rules_holder(route)["rules"]  # pylint: disable=protected-access  # the one reader of both kinds
    text = route["metadata"]["annotations"][watchdog_classes.llmisvc_router.PLAN_ANNOTATION]
    default = json.loads(text).get("default") or BASELINE
    return _class_header_of_rules(rules) or routing_plan.DEFAULT_CLASS_HEADER, pools, default


def read_route(api_client, namespace, name):
    """The live HTTPRoute ``namespace/name``, as applied (ops/watchdog_classes.py ``applied_part``)."""
    try:
        live = kube_client.request(api_client, "GET", watchdog_classes.HTTPROUTE_PATH % (namespace, name))
    except kube_client.ApiException as exc:
        raise k8s_pods.PodAccessError("reading HTTPRoute %s/%s failed: %s" % (namespace, name, k8s_pods.api_error_message(exc)),
                                      field="route_name", hint="check the name and namespace; the identity needs get on httproutes") from exc
    return watchdog_classes.applied_part(live, "HTTPRoute")


# -- the requests ---------------------------------------------------------------------------------------------------------

def request_body(model, prompt, max_tokens):
    """One request: greedy, one choice, not streamed - the answers that carry vLLM's per-request block (a stream carries
    it only with usage, ``n > 1`` never)."""
    return {"model": model, "prompt": prompt, "max_tokens": int(max_tokens), "temperature": 0, "n": 1, "stream": False}


def gateway_sender(endpoint):
    """``send(headers, body) -> (status, answer)``: POST /v1/completions through the gateway (``bench.client.Endpoint``:
    its URL, token and TLS settings). ``answer`` is the JSON body, or the text of one that is not JSON."""
    def send(headers, body):
        conn = endpoint.connect()
        try:
            conn.request("POST", endpoint.prefix + "/v1/completions", body=json.dumps(body).encode("utf-8"),
                         headers=dict(endpoint.headers(), **headers))
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            raise SpecDecodingError("POST %s/v1/completions failed: %s" % (endpoint.url.rstrip("/"), exc), field="gateway_url",
                                    hint="give the gateway's address as the verifying host reaches it, and check the gateway serves") from exc
        finally:
            conn.close()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text
    return send


def pool_of_answer(answer):
    """``(pool, block)``: the pool that wrote ``answer`` by its per-request block (see the module doc)."""
    block = bench_client.spec_decoding_block(answer) if isinstance(answer, dict) else None
    return (SPECULATIVE if block is not None else BASELINE), block


def class_row(klass, expected, answers):
    """One class's finding from its ``answers`` (``[(status, answer)]``): the pools seen, the acceptance the speculative
    pool's blocks report, and ``ok`` when every answer came from the expected pool."""
    seen, errors, total = [], [], spec_metrics.SpecDecodeCounters(source="response")
    for status, answer in answers:
        if status != 200 or not isinstance(answer, dict) or not answer.get("choices"):
            errors.append("HTTP %s: %s" % (status, (answer if isinstance(answer, str) else json.dumps(answer))[:300]))
            continue
        pool, _block = pool_of_answer(answer)
        seen.append(pool)
        if pool == SPECULATIVE:
            total = total + spec_metrics.counters_from_response(answer)
    pools = sorted(set(seen))
    return {"class": klass, "expected_pool": expected, "seen_pools": pools, "seen_pool": pools[0] if len(pools) == 1 else None,
            "requests": len(answers), "answered": len(seen), "errors": errors,
            "evidence": SEEN_SPECULATIVE if pools == [SPECULATIVE] else SEEN_BASELINE if pools == [BASELINE] else
            "answers of both pools" if pools else "no answer",
            "acceptance": spec_metrics.summarize(total) if total.found else None,
            "ok": not errors and pools == [expected]}


def _mismatch(row, header):
    who = "requests without the class header" if row["class"] == UNCLASSIFIED else "class %s (header %s: %s)" % (row["class"], header, row["class"])
    if row["errors"]:
        return RoutingMismatch("%s: %d of %d requests got no answer through the gateway (%s); the plan says the %s pool" % (
            who, len(row["errors"]), row["requests"], row["errors"][0], row["expected_pool"]), field="gateway_url",
            hint="check that the gateway routes by the plan's HTTPRoute and that both pools' Services have ready endpoints")
    seen = " and ".join(row["seen_pools"])
    hint = "check the route's rule %s%s and its backendRef (the plan's Service of the %s pool)" % (
        watchdog_classes.RULE_PREFIX, row["class"], row["expected_pool"]) if row["class"] != UNCLASSIFIED else \
        "check the route's default rule: it must send requests without a class to the baseline"
    if row["expected_pool"] == SPECULATIVE and row["seen_pools"] == [BASELINE]:
        hint += "; a speculative pool whose vLLM runs without --per-request-spec-decode-metrics (before 0.32, or the flag " \
                "off) answers without the block too: deploy it with spec_decoding_per_request_metrics auto or summary"
    return RoutingMismatch("%s reached the %s pool (%s), the plan says the %s pool" % (who, seen, row["evidence"], row["expected_pool"]),
                           field="route", hint=hint)


def _prompts(params, klass):
    prompts = (params.get("prompts") or {}).get(klass)
    if prompts is None:
        return [params["default_prompt"]] * int(params["requests_per_class"])
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValidationError("class %s has no prompts" % klass, field="prompts.%s" % klass,
                              hint="give a list of prompt strings, or leave the class out to send default_prompt")
    return prompts


def verify_classes(params, route, send, model):
    """The module's result: per class (and the unclassified request) the pool its answers came from against the plan's;
    raises RoutingMismatch naming the first class that reached another pool. ``send(headers, body) -> (status, answer)``."""
    header, pools, default = expected_pools(route)
    header = params.get("class_header") or header
    unknown = sorted(set(params.get("prompts") or {}) - set(pools))
    if unknown:
        raise ValidationError("prompts for class %s, which the plan does not route (%s)" % (unknown[0], ", ".join(sorted(pools)) or "no class"),
                              field="prompts", hint="name only the plan's classes; a class outside the plan goes to the default pool")
    if int(params["requests_per_class"]) < 1:
        raise ValidationError("must be at least 1", field="requests_per_class", hint="e.g. 2 requests per class")
    rows = []
    for klass in sorted(pools):
        answers = [send({header: klass}, request_body(model, prompt, params["max_tokens"])) for prompt in _prompts(params, klass)]
        rows.append(class_row(klass, pools[klass], answers))
    if params.get("unclassified", True):
        answers = [send({}, request_body(model, params["default_prompt"], params["max_tokens"]))]
        rows.append(class_row(UNCLASSIFIED, default, answers))
    summary = ", ".join("%s -> %s" % (r["class"], r["seen_pool"] or "/".join(r["seen_pools"]) or "no answer") for r in rows)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        exc = _mismatch(bad[0], header)
        exc.classes = rows
        raise exc
    return dict(changed=False, class_header=header, model=model, classes=rows,
                speculative_classes=sorted(c for c, p in pools.items() if p == SPECULATIVE),
                msg="each class reached the pool the plan says (from the serving pods' answers): %s" % summary)


def run(api_client, params, send=None):
    """``request_class_routing_info``: the plan from ``route`` or the live ``route_name``, the requests through
    ``gateway_url`` (``send`` replaces the HTTP client in tests)."""
    if params.get("route"):
        route = params["route"]
    elif params.get("route_name"):
        if not params.get("namespace"):
            raise ValidationError("is required with route_name", field="namespace", hint="the HTTPRoute's namespace")
        route = read_route(api_client, params["namespace"], params["route_name"])
    else:
        raise ValidationError("names no routing plan", field="route",
                              hint="give the plan's HTTPRoute (the benchmark's <report>-httproute.yaml) as route, or its name as route_name")
    endpoint = bench_client.Endpoint(params["gateway_url"], model=params.get("model") or None, api="completions",
                                     token=params.get("gateway_token"), timeout=params["timeout"],
                                     validate_certs=params.get("gateway_validate_certs", True), field="gateway_url")
    if send is None:
        send = gateway_sender(endpoint)
        model = endpoint.resolve_model()  # GET /v1/models through the gateway's default rule: the baseline's name
    else:
        model = params.get("model") or "model"
    return verify_classes(params, route, send, model)
