"""speculative_metrics_info and the verify playbook reading /metrics THROUGH THE API SERVER'S POD PROXY on the test bed.

The API server refuses to proxy to loopback pod IPs, so these pods get this host's non-loopback IPv4 address
(tests.testbed.kubelet.host_ipv4, e.g. eth0's; traffic to it never leaves the machine) and a real HTTP server on
that address and the pod's port answers /metrics with real vLLM captures (tests/fixtures/vllm/*/metrics.txt).
Every request must arrive through the API server (the kubelet stand-in records the X-Forwarded-Uri the pod proxy
adds). Expected numbers are the literal numbers of the capture files; each test checks the file holds them.
"""

import re

import pytest

from tests.ansible_run import run_playbook
from tests.module_run import run_module
from tests.integration.test_verify import EAGLE3_JSON, NGRAM_JSON, capture, deploy
from tests.testbed.kubelet import free_port_on, host_ipv4

# ngram/metrics.txt (vLLM 0.32.0, served model name t-ngram)
NGRAM = {"num_drafts": 229, "num_draft_tokens": 1002, "num_accepted_tokens": 655, "per_pos": [190, 152, 126, 99, 88]}
# ngram/metrics_partial.txt: an earlier scrape of the same server, after 3 of its 6 requests (for the window test)
NGRAM_PARTIAL = {"num_drafts": 122, "num_draft_tokens": 552, "num_accepted_tokens": 296, "per_pos": [95, 72, 57, 39, 33]}
# eagle3/metrics.txt (a random EAGLE-3 head: nothing accepted)
EAGLE3 = {"num_drafts": 1026, "num_draft_tokens": 3078, "num_accepted_tokens": 0, "per_pos": [0, 0, 0]}

NAMES = {"num_drafts": "vllm:spec_decode_num_drafts_total", "num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
         "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total"}


def metrics_page(folder, numbers, model, name="metrics.txt"):
    """The capture's /metrics text, after checking that it holds exactly `numbers` (a dict as above)."""
    text = capture(folder, name)
    for key, metric in NAMES.items():
        assert '%s{engine="0",model_name="%s"} %.1f' % (metric, model, numbers[key]) in text.splitlines(), (folder, key)
    for pos, value in enumerate(numbers["per_pos"]):
        line = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="%s",position="%d"} %.1f' % (model, pos, value)
        assert line in text.splitlines(), (folder, pos)
    return text


def zeroed(text):
    """The page as vLLM shows it after start-up, before the first draft: every spec_decode counter at 0."""
    return re.sub(r"^(vllm:spec_decode_\w+_total\{[^}]*\}) \S+$", r"\1 0.0", text, flags=re.M)


def two_models(ngram_text, eagle3_text):
    """One exposition page whose spec_decode families carry series of both t-ngram and t-eagle3."""
    extra = [line for line in eagle3_text.splitlines() if line.startswith("vllm:spec_decode")]
    lines = ngram_text.splitlines()
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        name = line.split("{")[0]
        following = lines[i + 1].split("{")[0] if i + 1 < len(lines) else ""
        if line.startswith("vllm:spec_decode") and following != name:
            out.extend(e for e in extra if e.split("{")[0] == name)
    return "\n".join(out) + "\n"


@pytest.fixture(scope="session")
def pod_ip():
    address = host_ipv4()
    if address is None:
        pytest.skip("no non-loopback IPv4 address on this host: the API server refuses to proxy to loopback pod IPs, "
                    "so /metrics through the pod proxy cannot be served here (set ALAUDA_TESTBED_POD_IP to a local address)")
    return address


def proxied(kubelet, namespace, pod=None):
    """Requests the pods' HTTP servers received; each must have come through the API server's pod proxy."""
    requests = kubelet.http_requests(namespace, pod)
    for req in requests:
        uri = req["headers"].get("X-Forwarded-Uri", "")
        assert re.match(r"^/api/v1/namespaces/%s/pods/(https:)?%s:\d+/proxy/metrics$" % (namespace, req["pod"]), uri), req
    return requests


def task(name, module_args):
    """One speculative_metrics_info call: (result name, module arguments)."""
    return [(name, module_args)]


class Calls:
    """speculative_metrics_info calls run in this process in order, their results by name (the verify playbook's wiring of the module
    is tested by test_verify_playbook_reads_metrics_through_the_pod_proxy)."""

    def __init__(self, calls, kubeconfig=None):
        self.results = {}
        for name, module_args in calls:
            args = dict(module_args)
            if kubeconfig and "kubeconfig" not in args:
                args["kubeconfig"] = kubeconfig
            self.results[name] = run_module("speculative_metrics_info", args)
        self.output = "\n".join("%s: %s" % (n, r.msg) for n, r in self.results.items())

    def result(self, name):
        return self.results[name]


def test_counters_through_the_pod_proxy_equal_the_capture(k8s_client, kubeconfig, kubelet, kserve, namespace, pod_ip):
    port = free_port_on(pod_ip)
    page = metrics_page("ngram", NGRAM, "t-ngram")
    pods = deploy(k8s_client, kserve, namespace, "ng", ["--port", str(port), "--speculative-config", NGRAM_JSON], capture("ngram"),
                  pod_ip=pod_ip, http={port: {"/metrics": page}})
    run = Calls(kubeconfig=kubeconfig, calls=(
        task("read", {"name": "ng", "namespace": namespace, "log_fallback": "false"})
        + task("thresholds met", {"name": "ng", "namespace": namespace, "min_mean_acceptance_length": 3.8, "min_acceptance_rate": 0.65})
        + task("rate too low", {"name": "ng", "namespace": namespace, "min_acceptance_rate": 0.7})
        + task("length too low", {"name": "ng", "namespace": namespace, "min_mean_acceptance_length": 3.9})))
    res = run.result("read")
    assert res.get("failed") is not True, run.output
    assert res["source"] == "prometheus" and res["has_data"] is True and res["changed"] is False
    assert (res["num_drafts"], res["num_draft_tokens"], res["num_accepted_tokens"]) == (229, 1002, 655)
    assert res["accepted_tokens_per_position"] == [190, 152, 126, 99, 88]
    assert res["mean_acceptance_length"] == pytest.approx(1 + 655 / 229)
    assert res["draft_acceptance_rate"] == pytest.approx(655 / 1002)
    assert res["per_position_acceptance_rate"] == pytest.approx([190 / 229, 152 / 229, 126 / 229, 99 / 229, 88 / 229])
    assert res["model_names"] == ["t-ngram"] and res["notes"] == [] and res["interval"] == 0
    assert res["diagnosis"]["status"] == "healthy" and res["diagnosis"]["method"] == "ngram"  # method from the flag
    # the port came from --port in the predictor's args (the runtime's containerPort says 8080)
    assert res["endpoints"] == [{"pod": pods[0], "scheme": "http", "port": port, "path": "/metrics",
                                 "how": "port %d from --port in the command/args of kserve-container" % port}]
    assert [p["name"] for p in res["pods"]] == pods and res["pods"][0]["num_accepted_tokens"] == 655
    assert run.result("thresholds met").get("failed") is not True and run.result("thresholds met")["failures"] == []
    low = run.result("rate too low")
    assert low["failed"] is True and low["failures"] == ["draft_acceptance_rate 0.6537 is below min_acceptance_rate 0.7"]
    assert low["msg"].startswith("acceptance below the thresholds: draft_acceptance_rate 0.6537") and low["source"] == "prometheus"
    short = run.result("length too low")
    assert short["failed"] is True and short["failures"] == ["mean_acceptance_length 3.860 is below min_mean_acceptance_length 3.9"]
    assert len(proxied(kubelet, namespace, pods[0])) == 4


def test_interval_reports_the_window_deltas(k8s_client, kubeconfig, kubelet, kserve, namespace, pod_ip):
    port = free_port_on(pod_ip)
    before = metrics_page("ngram", NGRAM_PARTIAL, "t-ngram", "metrics_partial.txt")
    after = metrics_page("ngram", NGRAM, "t-ngram")
    pods = deploy(k8s_client, kserve, namespace, "win", ["--port", str(port), "--speculative-config", NGRAM_JSON], "",
                  pod_ip=pod_ip, http={port: {"/metrics": [before, after, after]}})
    run = Calls(kubeconfig=kubeconfig, calls=(
        task("with traffic", {"name": "win", "namespace": namespace, "interval": 1, "log_fallback": "false"})
        + task("idle", {"name": "win", "namespace": namespace, "interval": 1, "log_fallback": "false"})))
    res = run.result("with traffic")
    assert res.get("failed") is not True, run.output
    assert res["source"] == "prometheus" and res["interval"] == 1 and res["counter_reset"] is False
    assert (res["num_drafts"], res["num_draft_tokens"], res["num_accepted_tokens"]) == (229 - 122, 1002 - 552, 655 - 296)
    assert res["accepted_tokens_per_position"] == [190 - 95, 152 - 72, 126 - 57, 99 - 39, 88 - 33]
    assert res["mean_acceptance_length"] == pytest.approx(1 + 359 / 107) and res["draft_acceptance_rate"] == pytest.approx(359 / 450)
    idle = run.result("idle")
    assert idle["has_data"] is False and idle["num_draft_tokens"] == 0 and idle["diagnosis"]["status"] == "no_data"
    assert idle["msg"].startswith("no drafts during the 1.0 s interval")
    times = [r["time"] for r in proxied(kubelet, namespace, pods[0])]
    assert len(times) == 4 and times[1] - times[0] >= 1.0 and times[3] - times[2] >= 1.0


def test_model_name_filter_and_sum_over_pods(k8s_client, kubeconfig, kubelet, kserve, namespace, pod_ip):
    """Two pods behind one InferenceService, each page with series of two served models; containerPort named http."""
    port = free_port_on(pod_ip)
    page = two_models(metrics_page("ngram", NGRAM, "t-ngram"), metrics_page("eagle3", EAGLE3, "t-eagle3"))
    pods = deploy(k8s_client, kserve, namespace, "multi", ["--speculative-config", NGRAM_JSON], "", replicas=2,
                  ports=[{"name": "http", "containerPort": port, "protocol": "TCP"}], pod_ip=pod_ip, http={port: {"/metrics": page}})
    run = Calls(kubeconfig=kubeconfig, calls=(
        task("all models", {"name": "multi", "namespace": namespace})
        + task("ngram only", {"name": "multi", "namespace": namespace, "model_name": "t-ngram"})
        + task("eagle3 only", {"name": "multi", "namespace": namespace, "model_name": "t-eagle3", "method": "eagle3"})
        + task("unknown model", {"name": "multi", "namespace": namespace, "model_name": "llama", "log_fallback": "false"})
        + task("one pod, named port", {"pod": sorted(pods)[0], "namespace": namespace, "port": "http", "model_name": "t-ngram"})
        + task("one pod, number and scheme", {"pod": sorted(pods)[1], "namespace": namespace, "port": port, "scheme": "http",
                                              "model_name": "t-eagle3"})))
    every = run.result("all models")
    assert every.get("failed") is not True, run.output
    assert every["source"] == "prometheus" and sorted(every["model_names"]) == ["t-eagle3", "t-ngram"]
    assert (every["num_drafts"], every["num_draft_tokens"], every["num_accepted_tokens"]) == (2 * (229 + 1026), 2 * (1002 + 3078), 2 * 655)
    assert sorted(e["pod"] for e in every["endpoints"]) == sorted(pods)
    assert {e["how"] for e in every["endpoints"]} == {"port %d from containerPort 'http' of kserve-container" % port}
    assert [p["num_drafts"] for p in every["pods"]] == [229 + 1026, 229 + 1026]
    ngram = run.result("ngram only")
    assert (ngram["num_drafts"], ngram["num_draft_tokens"], ngram["num_accepted_tokens"]) == (458, 2004, 1310)
    assert ngram["accepted_tokens_per_position"] == [380, 304, 252, 198, 176] and ngram["model_names"] == ["t-ngram"]
    assert ngram["diagnosis"]["status"] == "healthy"
    eagle = run.result("eagle3 only")
    assert (eagle["num_drafts"], eagle["num_draft_tokens"], eagle["num_accepted_tokens"]) == (2052, 6156, 0)
    assert eagle["diagnosis"]["status"] == "likely_draft_mismatch" and eagle["draft_acceptance_rate"] == 0
    unknown = run.result("unknown model")
    assert unknown["has_data"] is False and unknown["diagnosis"]["status"] == "no_data"
    assert unknown["msg"] == "no spec_decode series for model_name 'llama'; the page has model_name 't-eagle3', 't-ngram'"
    one = run.result("one pod, named port")
    assert (one["num_drafts"], one["num_draft_tokens"], one["num_accepted_tokens"]) == (229, 1002, 655)
    assert one["endpoints"][0]["port"] == port and "pods" not in one
    other = run.result("one pod, number and scheme")
    assert (other["num_drafts"], other["num_accepted_tokens"]) == (1026, 0) and other["endpoints"][0]["how"] == "port and scheme given"
    requests = proxied(kubelet, namespace)
    assert sorted({r["pod"] for r in requests}) == sorted(pods) and len(requests) == 4 * 2 + 2


def test_zero_counters_mean_no_data(k8s_client, kubeconfig, kubelet, kserve, namespace, pod_ip):
    """The proxy works and the families exist, but no draft was made yet: has_data false, no_data, not a failure."""
    port = free_port_on(pod_ip)
    page = zeroed(metrics_page("ngram", NGRAM, "t-ngram"))
    assert 'vllm:spec_decode_num_drafts_total{engine="0",model_name="t-ngram"} 0.0' in page
    deploy(k8s_client, kserve, namespace, "idle", ["--port", str(port), "--speculative-config", NGRAM_JSON], capture("ngram"),
           pod_ip=pod_ip, http={port: {"/metrics": page}})
    run = Calls(kubeconfig=kubeconfig, calls=(
        task("no drafts yet", {"name": "idle", "namespace": namespace})
        + task("thresholds without data", {"name": "idle", "namespace": namespace, "min_acceptance_rate": 0.1})))
    res = run.result("no drafts yet")
    assert res.get("failed") is not True, run.output
    # the counters exist (so the log is not read instead) but are zero
    assert res["source"] == "prometheus" and res["has_data"] is False and res["notes"] == []
    assert (res["num_drafts"], res["num_draft_tokens"], res["num_accepted_tokens"]) == (0, 0, 0)
    assert res["diagnosis"]["status"] == "no_data" and res["mean_acceptance_length"] is None
    assert res["msg"].startswith("speculative-decoding counters are present but zero")
    strict = run.result("thresholds without data")
    assert strict["failed"] is True and strict["failures"][0].startswith("thresholds were given but there is no data")
    assert len(proxied(kubelet, namespace)) == 2


def test_https_pod_and_least_privilege_identity(k8s_client, controlplane, kubelet, kserve, namespace, pod_ip):
    """vLLM with --ssl-certfile is reached as https:<pod>:<port>; an identity with only the documented rights works,
    one without pods/proxy gets the API server's refusal."""
    from kubernetes import client
    port = free_port_on(pod_ip)
    page = metrics_page("eagle3", EAGLE3, "t-eagle3")
    args = ["--port=%d" % port, "--ssl-keyfile", "/etc/tls/tls.key", "--ssl-certfile", "/etc/tls/tls.crt", "--speculative-config", EAGLE3_JSON]
    pods = deploy(k8s_client, kserve, namespace, "tls", args, capture("eagle3"), pod_ip=pod_ip, https=True, http={port: {"/metrics": page}})
    rbac = client.RbacAuthorizationV1Api(k8s_client)
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
             {"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"], "verbs": ["get"]}]
    for user, extra in (("limited-user", [{"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]}]), ("limited-user-2", [])):
        rbac.create_namespaced_role(namespace, {"metadata": {"name": user}, "rules": rules + extra})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": user}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    run = Calls(calls=(
        task("https pod", {"name": "tls", "namespace": namespace, "log_fallback": "false",
                           "kubeconfig": controlplane.kubeconfig_for_user("limited-user")})
        + task("plain http to a TLS server", {"name": "tls", "namespace": namespace, "scheme": "http", "log_fallback": "false",
                                              "kubeconfig": controlplane.kubeconfig_for_user("limited-user")})
        + task("no proxy right", {"name": "tls", "namespace": namespace, "log_fallback": "false",
                                  "kubeconfig": controlplane.kubeconfig_for_user("limited-user-2")})))
    res = run.result("https pod")
    assert res.get("failed") is not True, run.output
    assert res["source"] == "prometheus" and (res["num_drafts"], res["num_draft_tokens"], res["num_accepted_tokens"]) == (1026, 3078, 0)
    assert res["diagnosis"]["status"] == "likely_draft_mismatch" and res["diagnosis"]["method"] == "eagle3"
    assert res["endpoints"][0]["scheme"] == "https" and res["endpoints"][0]["port"] == port
    assert "https because kserve-container passes --ssl-certfile" in res["endpoints"][0]["how"]
    plain = run.result("plain http to a TLS server")
    assert plain["failed"] is True and plain["msg"].startswith("port: GET /metrics on pod %s/%s port %d (http)" % (namespace, pods[0], port))
    denied = run.result("no proxy right")
    assert denied["failed"] is True and "forbidden" in denied["msg"] and "pods/proxy" in denied["msg"] and "(HTTP 403)" in denied["msg"]
    requests = proxied(kubelet, namespace)
    assert [r["tls"] for r in requests] == [True] and requests[0]["headers"]["X-Forwarded-Uri"].startswith(
        "/api/v1/namespaces/%s/pods/https:%s:%d/proxy" % (namespace, pods[0], port))


def test_verify_playbook_reads_metrics_through_the_pod_proxy(tmp_path, k8s_client, kubeconfig, kubelet, kserve, namespace, pod_ip):
    port = free_port_on(pod_ip)
    page = metrics_page("eagle3", EAGLE3, "t-eagle3")
    pods = deploy(k8s_client, kserve, namespace, "llama-eagle3", ["--port", str(port), "--speculative-config", EAGLE3_JSON],
                  capture("eagle3"), pod_ip=pod_ip, http={port: {"/metrics": page}})
    extra = {"verify_name": "llama-eagle3", "verify_namespace": namespace, "verify_wait_timeout": 60, "verify_wait_interval": 1}
    run = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig, extra_vars=extra)
    assert run.rc == 0, run.output
    metrics = run.result("Register the full verification data")["ansible_facts"]["verify_result"]["metrics"]
    assert metrics["source"] == "prometheus" and metrics["notes"] == []
    # num_drafts is only on /metrics (the log windows do not print it)
    assert (metrics["num_drafts"], metrics["num_draft_tokens"], metrics["num_accepted_tokens"]) == (1026, 3078, 0)
    assert metrics["endpoints"][0]["port"] == port and metrics["model_names"] == ["t-eagle3"]
    summary = run.result("Summary")["msg"]
    assert any(line.startswith("acceptance: source=prometheus; mean acceptance length 1.00; draft acceptance 0.0%") for line in summary), summary
    assert any(line.startswith("diagnosis: likely_draft_mismatch") for line in summary)
    assert len(proxied(kubelet, namespace, pods[0])) == 1
    run = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig,
                       extra_vars=dict(extra, verify_model_name="t-eagle3", verify_min_mean_acceptance_length=1.5))
    assert run.rc != 0
    failed = run.result("Read the acceptance metrics")
    assert failed["failures"] == ["mean_acceptance_length 1.000 is below min_mean_acceptance_length 1.5"] and failed["source"] == "prometheus"
    assert len(proxied(kubelet, namespace, pods[0])) == 2
