"""The speculative-decoding watchdog on a real vLLM server (issue #33): the InferenceService rendered by `isvc_manifest`
runs as a real vLLM 0.32 process pod on the test bed (tests/testbed/pod_process.py), its proposer the known-curve one
(tests/e2e/known_curve_proposer.py, k=3), whose acceptance the test sets through its control file on the running server.

Traffic goes to the pod through the API server's pod proxy (the pod IP lives in the pod's own network namespace) from
background threads, while the watchdog measures short windows with the product's default checks and budgets:
- the rendered command ran: bash reached `exec`, and the pod's engine line (engine_config_info) names the target on the
  PVC and the custom proposer with k=3, no difference from the InferenceService's flag;
- the baseline is recorded (a ConfigMap; the InferenceService's generation does not move);
- the healthy curve (conditional 0.9/0.8/0.7) is `healthy` in a window after the baseline's (one: the collapse below
  takes the product's two failed windows, so the budget's count over windows runs there);
- a window in which /metrics cannot be read, for real: the pod's whole vLLM process group (API server and EngineCore
  with the model) is stopped with SIGSTOP, so every scrape through the pod proxy times out; the window is `unknown`
  and the InferenceService is unchanged; SIGCONT resumes the server;
- the proposer's acceptance collapses (every draft token wrong), `playbooks/watch.yml` finds `collapsed`, strips the
  flag with the rollback role, and the new pod's own engine line (engine_config_info) says `speculative_config=None`.
One vLLM start for the speculative pod, one for the rolled-back pod.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import time

import pytest

from ansible_collections.alauda.spec_decoding.plugins.modules import speculative_watchdog as watchdog_module
from tests.ansible_run import run_playbook
from tests.e2e import vllm_harness
from tests.integration.test_process_pods import _bound_claim
from tests.module_run import run_module

pytestmark = pytest.mark.e2e

NAME = "tiny"
K = 3
HEALTHY_RATES = [0.9, 0.8, 0.7]
COLLAPSED_RATES = [0.0, 0.0, 0.0]
KNOWN_CURVE = {"method": "custom_class", "model": "known_curve_proposer.KnownCurveProposer", "num_speculative_tokens": K}
# Windows of a few seconds instead of the default 5 minutes, long enough for about three times the product's min_requests at the
# request rate measured just before under the same curve (a loaded machine serves fewer; a collapsed proposer makes
# every request take more steps); the checks, budgets and min_requests stay the product's. At least 2 s (4 until stop 49:
# at the 24-62 requests/s measured here a 4 s window held 2.5-4 x the 3 x min_requests the rate asks for).
INTERVAL = 2
MAX_INTERVAL = 30
MIN_REQUESTS = watchdog_module.argument_spec()["min_requests"]["default"]
# Seconds a /metrics read may take before the window counts as unreadable (the default 30 s would only make the stopped
# window longer).
SCRAPE_TIMEOUT = 3
# The same for the window of the stopped pod, whose every read times out: the kubernetes client's urllib3 pool tries a
# timed-out GET four times (Retry(3), read errors of idempotent methods), so each of the window's two scrapes takes 4 x
# the timeout: that window took 28 s at 3 s (and a 4 s window), 10-12 s at 1 s. The running pod's reads keep SCRAPE_TIMEOUT.
STOPPED_SCRAPE_TIMEOUT = 1
# Seconds of traffic over which the request rate that sizes a window is measured (at 24-62 requests/s here: 36-93 requests).
RATE_SECONDS = 1.5
CLIENTS = 4  # the server's --max-num-seqs
MAX_TOKENS = 16
PROMPTS = tuple("Note %d: %s" % (i, text) for i, text in enumerate(vllm_harness.REPETITIVE_PROMPTS + ("one two three four five six seven " * 6,)))
PROPOSER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "known_curve_proposer.py")
ISVC = "/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices/%s"


def _pods(api, namespace):
    return [p for p in api.get("/api/v1/namespaces/%s/pods" % namespace)["items"] if not p["metadata"].get("deletionTimestamp")]


def _complete(api, namespace, pod, prompt):
    path = "/api/v1/namespaces/%s/pods/%s:8080/proxy/v1/completions" % (namespace, pod)
    return api.post(path, {"model": NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})


class Traffic:
    """Clients sending the known prompts in a loop to the pod, until stopped or the InferenceService's generation moves
    (the rollback: the old pod goes, and the new one starts faster without them)."""

    def __init__(self, controlplane, namespace, pod, generation):
        self.controlplane, self.namespace, self.pod, self.generation = controlplane, namespace, pod, generation
        self.stop = threading.Event()
        self.done, self.errors = [0] * CLIENTS, [0] * CLIENTS
        self.rates = []
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def interval(self, seconds=RATE_SECONDS):
        """A window length for about 3 x min_requests at the rate served over the next ``seconds``."""
        before = sum(self.done)
        time.sleep(seconds)
        rate = (sum(self.done) - before) / seconds
        self.rates.append(round(rate, 2))
        return min(MAX_INTERVAL, max(INTERVAL, math.ceil(3 * MIN_REQUESTS / max(rate, 0.1))))

    def _client(self, index):
        api = self.controlplane.rest(timeout=15)
        try:
            turn = index
            while not self.stop.is_set():
                if index == 0 and api.get(ISVC % (self.namespace, NAME))["metadata"]["generation"] != self.generation:
                    self.stop.set()
                    break
                try:
                    _complete(api, self.namespace, self.pod, PROMPTS[turn % len(PROMPTS)])
                    self.done[index] += 1
                except Exception:  # pylint: disable=broad-except  # a stopped or deleted pod: keep going until told
                    self.errors[index] += 1
                    self.stop.wait(0.5)
                turn += 1
        finally:
            api.close()


def _ready_after_startup(api, namespace, pod):
    """Seconds from vLLM's `Application startup complete.` (the pod log's own timestamp) to the pod's Ready condition (1 s
    resolution): the kubelet's startupProbe cadence (pod_process.probe_cadence), printed, not asserted."""
    log = api.request("GET", "/api/v1/namespaces/%s/pods/%s/log" % (namespace, pod), query={"timestamps": "true"}, raw=True)
    line = next((line for line in log.splitlines() if "Application startup complete" in line), None)
    conditions = api.get("/api/v1/namespaces/%s/pods/%s" % (namespace, pod))["status"].get("conditions") or []
    ready = next((c["lastTransitionTime"] for c in conditions if c["type"] == "Ready" and c["status"] == "True"), None)
    if line is None or ready is None:
        return None
    started = datetime.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f")
    return round((datetime.datetime.strptime(ready, "%Y-%m-%dT%H:%M:%SZ") - started).total_seconds(), 1)


def _control(path, rates):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"conditional_rates": rates, "seed": 0}, handle)
    os.replace(tmp, path)  # the proposer reads it again when the modification time changes


def test_watchdog_on_real_vllm_healthy_unknown_then_collapsed_and_rolled_back(
        controlplane, kubeconfig, kserve, kubelet, namespace, tiny_checkpoints, tmp_path):
    started = time.monotonic()
    steps = {}  # step -> seconds since the test started, when it ended (printed and in the e2e timings)

    def step(name):
        steps[name] = round(time.monotonic() - started, 1)
    api = controlplane.rest()
    # The pod's /tmp is its own (tests/testbed/pod_sandbox.py): the proposer and its control file live where the pod sees
    # the host's files.
    folder = tempfile.mkdtemp(prefix="watchdog-e2e-", dir=vllm_harness.CACHE_ROOT)
    shutil.copy(PROPOSER_FILE, folder)
    control = os.path.join(folder, "curve.json")
    _control(control, HEALTHY_RATES)
    pv = _bound_claim(api, namespace, "store", tiny_checkpoints["root"], mode="ReadOnlyMany")
    stopped = []
    try:
        rendered = run_module("isvc_manifest", {
            "name": NAME, "namespace": namespace, "method": "custom_class", "speculative": KNOWN_CURVE, "artifact_mode": "pvc",
            "artifacts": {"pvc_name": "store"}, "runtime": "aml-vllm-0.32.0", "vllm_version": "0.32.0",
            "dtype": vllm_harness.TINY_DTYPE, "max_model_len": 2048, "max_num_seqs": CLIENTS, "gpu_count": 0,
            "env": dict(vllm_harness.SERVER_ENV, PYTHONPATH=folder, KNOWN_CURVE_CONFIG=control,
                        KNOWN_CURVE_STATS=os.path.join(folder, "stats.json")),
            "extra_args": ["--enforce-eager"], "annotations": {"testbed.alauda.io/run": "process"}})
        assert not rendered.failed, rendered.msg
        applied = run_module("kubernetes.core.k8s", {"kubeconfig": kubeconfig, "state": "present", "definition": rendered["manifest"],
                                                     "apply": True, "server_side_apply": {"field_manager": "alauda-spec-decoding"}})
        assert not applied.failed, applied.msg
        ready = run_module("isvc_wait", {"kubeconfig": kubeconfig, "name": NAME, "namespace": namespace, "timeout": 600})
        pods = _pods(api, namespace)
        assert not ready.failed, "%s\n--- pod logs ---\n%s" % (ready.msg, "\n".join(
            api.request("GET", "/api/v1/namespaces/%s/pods/%s/log" % (namespace, p["metadata"]["name"]), raw=True)[-3000:] for p in pods))
        assert len(pods) == 1
        pod = pods[0]["metadata"]["name"]
        ready_s = time.monotonic() - started
        step("ready")
        ready_after_startup = _ready_after_startup(api, namespace, pod)
        generation = api.get(ISVC % (namespace, NAME))["metadata"]["generation"]
        # The rendered command really ran (what test_process_pod_e2e.py checked before this test covered it): bash -x of
        # the rendered script reached exec, and the engine line of that process names the tiny target on the PVC and the
        # custom proposer with k=3, as the InferenceService's flag says.
        log = api.request("GET", "/api/v1/namespaces/%s/pods/%s/log" % (namespace, pod), raw=True)
        assert "+ exec python3 -m vllm.entrypoints.openai.api_server" in log, log[-3000:]
        proof = run_module("engine_config_info", {"name": NAME, "namespace": namespace, "kubeconfig": kubeconfig,
                                                  "expected": {"method": "custom_class", "num_speculative_tokens": 3}})
        assert not proof.failed and proof["found"] and "model='/mnt/models/target'" in proof["line"], (proof.msg, proof.get("line"))
        assert [p["name"] for p in proof["pods"]] == [pod], proof["pods"]
        assert proof["speculative_config"]["method"] == "custom_class" and proof["speculative_config"]["num_spec_tokens"] == 3, proof
        assert proof["differences"] == [] and proof["expected"]["method"] == "custom_class", proof["differences"]
        for prompt in PROMPTS:  # the proposer drafts only for a prompt it has seen: the first run records each
            _complete(api, namespace, pod, prompt)
        step("engine line, prompts seen")
        args = {"name": NAME, "namespace": namespace, "kubeconfig": kubeconfig, "timeout": SCRAPE_TIMEOUT}

        with Traffic(controlplane, namespace, pod, generation) as traffic:
            args["interval"] = healthy_interval = traffic.interval()
            recorded = run_module("speculative_watchdog", dict(args, record_baseline=True))
            assert not recorded.failed and recorded["state"] == "recorded", recorded.msg
            step("baseline")
            base = recorded["baseline"]["figures"]["acceptance"]
            # conditional 0.9/0.8/0.7: per-position 0.9, 0.72, 0.504, about 0.71 of the draft tokens accepted
            assert 0.5 < base["draft_acceptance_rate"] < 0.9, base
            assert api.get(ISVC % (namespace, NAME))["metadata"]["generation"] == generation

            healthy = run_module("speculative_watchdog", dict(args, count=1))
            assert not healthy.failed and healthy["state"] == "healthy", (healthy.msg, healthy.get("reasons"))
            assert [w["verdict"] for w in healthy["analysis"]["windows"]] == ["pass"], healthy["analysis"]
            step("healthy")

            # /metrics unreadable for a window: the pod's vLLM process group is stopped (every scrape times out)
            group = kubelet.process_pod(namespace, pod).container("kserve-container").proc.pid
            os.killpg(group, signal.SIGSTOP)
            stopped.append(group)
            try:
                unknown = run_module("speculative_watchdog", dict(args, count=1, interval=INTERVAL, timeout=STOPPED_SCRAPE_TIMEOUT))
            finally:
                os.killpg(group, signal.SIGCONT)
                stopped.clear()
            step("unknown")
            assert not unknown.failed and unknown["state"] == "unknown" and unknown["action"] == "none", unknown.msg
            assert unknown["analysis"]["counts"]["error"] == 1, unknown["analysis"]
            assert "no vLLM /metrics from the pods %s" % pod in unknown["analysis"]["windows"][0]["reasons"][0], unknown["analysis"]
            isvc = api.get(ISVC % (namespace, NAME))
            assert isvc["metadata"]["generation"] == generation and "--speculative-config" in isvc["spec"]["predictor"]["model"]["command"][2]

            # the proposer's acceptance collapses; watch.yml with the product's defaults but the window length
            _control(control, COLLAPSED_RATES)
            collapse_interval = traffic.interval()
            step("collapsed rate")
            extra = {"watch_names": ["%s/%s" % (namespace, NAME)], "watch_interval": collapse_interval, "watch_wait_timeout": 600,
                     "watch_report_dir": str(tmp_path / "report")}
            playbook_started = time.monotonic()
            run = run_playbook(tmp_path, "playbooks/watch.yml", extra_vars=extra, kubeconfig=kubeconfig, timeout=900)
            playbook_s = time.monotonic() - playbook_started
            step("watch.yml")
        assert run.rc == 0, run.output
        assert sum(traffic.done) > 0

        report = json.loads((tmp_path / "report" / "watch.json").read_text())
        watched = report["services"][0]
        assert watched["state"] == "collapsed" and watched["action"] == "roll_back", watched
        assert report["rolled_back"] == ["%s/%s" % (namespace, NAME)]
        failed = [w for w in watched["analysis"]["windows"] if w["verdict"] == "fail"]
        assert len(failed) == 2 and all(w["figures"]["acceptance"]["draft_acceptance_rate"] < 0.1 for w in failed), watched["analysis"]
        isvc = api.get(ISVC % (namespace, NAME))
        assert isvc["metadata"]["generation"] > generation
        assert "--speculative-config" not in isvc["spec"]["predictor"]["model"]["command"][2]
        # the new pod's own engine line, read here too (the rollback role proved it in the playbook)
        new_pods = _pods(api, namespace)
        assert [p["metadata"]["name"] for p in new_pods] != [pod], new_pods
        proof = run_module("engine_config_info", {"name": NAME, "namespace": namespace, "kubeconfig": kubeconfig})
        assert not proof.failed and proof["found"], proof
        assert proof["speculative_config"] is None and "speculative_config=None" in proof["line"], proof["line"]
        assert [p["name"] for p in proof["pods"]] == [p["metadata"]["name"] for p in new_pods] != [pod], proof["pods"]
        assert all(p["speculative_config"] is None for p in proof["pods"]), proof["pods"]
        step("rolled-back engine line")
    finally:
        for group in stopped:
            os.killpg(group, signal.SIGCONT)
        api.delete(ISVC % (namespace, NAME))
        api.delete("/api/v1/persistentvolumes/%s" % pv)
        api.close()
        shutil.rmtree(folder, ignore_errors=True)
    step("cleaned up")
    seconds = round(time.monotonic() - started, 1)
    vllm_harness.TIMINGS.append({"scenario": "watchdog: healthy, unknown (SIGSTOP), collapsed and rolled back on a process pod",
                                 "seconds": seconds, "first_pod_ready_s": round(ready_s, 1), "watch_playbook_s": round(playbook_s, 1),
                                 "pod_ready_after_vllm_startup_s": ready_after_startup,
                                 "steps_ended_at_s": steps})
    windows = [("baseline", recorded["baseline"]["figures"])] + [
        ("%s %d" % (label, w["index"]), w["figures"]) for label, res in (("healthy", healthy["analysis"]), ("collapse", watched["analysis"]))
        for w in res["windows"]]
    print("\nwatchdog e2e: %.1f s (speculative pod ready after %.1f s, watch.yml with the rollback %.1f s), %d requests sent, "
          "%d failed (stopped or replaced pod); pod Ready %s s after vLLM's startup line; request rates %s/s, windows %d s healthy, "
          "%d s collapsed\n  %s\n  unknown window: %s" % (
              seconds, ready_s, playbook_s, sum(traffic.done), sum(traffic.errors), ready_after_startup, traffic.rates, healthy_interval, collapse_interval,
              "\n  ".join("%s: %d requests, acceptance rate %.3f" % (label, f["requests"], f["acceptance"]["draft_acceptance_rate"])
                          for label, f in windows), unknown["analysis"]["windows"][0]["reasons"][0]))
