"""`make try-local`, run as the README says (issue #48): the guide's whole loop on the local test bed, one command.

The test runs `make try-local` in the checkout from a user's environment (no virtualenv, PYTHONPATH or ANSIBLE_* of this
pytest run): the Makefile's set-up, `make cluster-up`'s test bed (started here, or reused when one is running), the
namespace and ServingRuntime of tests/testbed/manifests/try-local/, the tiny checkpoints of this session on a hostPath PVC,
deploy-eagle3.yml with inventories/testbed (real vLLM 0.32 on the CPU in a process-mode pod), completions through the
API server's pod proxy, verify.yml, rollback.yml and verify.yml with verify_speculative=false. It asserts each step's
printed result and the engine lines before (EAGLE-3) and after (None) the rollback, then reads the cluster itself: the
InferenceService without the flag (its backup annotation holding the EAGLE-3 config), the serving pod's own engine
line, the annotation of the inventory on the pod, the volume on the session's checkpoints.

Cost: two vLLM starts (the deployed pod and the rolled-back one, one after the other), four ansible-playbook runs and,
in CI, the start of a second control plane beside the session's (the test bed the user's command starts). It stops
what it started: the InferenceService (its vLLM pod) always, the test bed when it was not running before.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests.ansible_run import REPO
from tests.e2e import vllm_harness
from tests.testbed import cli
from tests.testbed.controlplane import ControlPlane
from tests.testbed.rest import ApiError

pytestmark = pytest.mark.e2e

NAMESPACE, NAME = "models", "tiny-eagle3"
ISVC = "/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices/%s" % (NAMESPACE, NAME)
STEPS = ["cluster", "runtime", "checkpoints", "deploy", "requests", "verify", "rollback", "verify off"]
STEP_LINE = re.compile(r"^try-local: (\d)/8 (\S+(?: off)?) +(ok|FAILED) \(([0-9.]+) s\) (.*)$", re.M)
EAGLE3 = "speculative_config=SpeculativeConfig(method='eagle3', model='/mnt/models/eagle3', num_spec_tokens=3)"


def _user_env():
    """A user's shell: this run's virtualenv, PYTHONPATH and Ansible settings left out (the Makefile sets its own)."""
    venv_bin = os.path.realpath(os.path.dirname(sys.executable))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANSIBLE_", "PYTEST_", "K8S_AUTH_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV", "KUBECONFIG")}
    env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                                  if p and os.path.realpath(p) != venv_bin)
    return env


def _testbed_running():
    return subprocess.run([sys.executable, "-m", "tests.testbed.cli", "status"], cwd=REPO, capture_output=True, check=False).returncode == 0


def _attach():
    with open(cli.POINTER, encoding="utf-8") as handle:
        return ControlPlane.attach(handle.read().strip())


def _pods(api):
    return api.get("/api/v1/namespaces/%s/pods" % NAMESPACE, labelSelector="serving.kserve.io/inferenceservice=%s" % NAME)["items"]


def _stop_the_service(api):
    """Delete the InferenceService and wait until its pods (real vLLM processes) are gone."""
    try:
        api.delete(ISVC)
    except ApiError as exc:
        if exc.status != 404:
            raise
    deadline = time.monotonic() + 120
    while _pods(api) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not _pods(api), [p["metadata"]["name"] for p in _pods(api)]


def test_make_try_local_runs_the_guide_loop(tiny_checkpoints):
    was_running = _testbed_running()
    started = time.monotonic()
    proc = subprocess.run(["make", "try-local"], cwd=REPO, env=_user_env(), capture_output=True, text=True, timeout=2400, check=False)
    seconds = round(time.monotonic() - started, 1)
    api = None
    try:
        output = proc.stdout + proc.stderr
        print(proc.stdout)
        assert proc.returncode == 0, output[-8000:]
        steps = STEP_LINE.findall(proc.stdout)
        assert [(int(n), name, status) for n, name, status, _s, _r in steps] == [(i + 1, s, "ok") for i, s in enumerate(STEPS)], output[-8000:]
        results = {name: result for _n, name, _status, _s, result in steps}
        # the session's checkpoints, on a PersistentVolume; the namespace and runtime of the manifests
        assert tiny_checkpoints["root"] in results["checkpoints"] and "PVC models/model-store" in results["checkpoints"], results
        assert "ServingRuntime models/aml-vllm-0.32.0" in results["runtime"], results
        # the engine line vLLM printed in the deployed pod, the completions, verify with the acceptance read after them
        assert results["deploy"].startswith("ansible-playbook -i inventories/testbed playbooks/deploy-eagle3.yml -> pod tiny-eagle3-predictor-")
        assert results["deploy"].endswith("its engine line: " + EAGLE3), results["deploy"]
        tokens = int(re.search(r"completions of model \S+, (\d+) tokens", results["requests"]).group(1))
        assert tokens > 0 and "/proxy" in results["requests"], results["requests"]
        assert "engine line: " + EAGLE3 in results["verify"] and "acceptance: " in results["verify"], results["verify"]
        # the counters of those completions, read by verify through the pod proxy: the head drafts k=3 tokens a step
        drafted = re.search(r"acceptance: .*?(\d+) accepted of (\d+) draft tokens in (\d+) drafts", results["verify"])
        assert drafted and "no_data" not in results["verify"], results["verify"]
        assert int(drafted.group(3)) > 0 and int(drafted.group(2)) == 3 * int(drafted.group(3)), results["verify"]
        assert results["rollback"].startswith("ansible-playbook -i inventories/testbed playbooks/rollback.yml -> removed --speculative-config")
        assert '"method": "eagle3"' in results["rollback"], results["rollback"]
        assert results["rollback"].endswith("its engine line: speculative_config=None"), results["rollback"]
        assert results["verify off"].startswith("ansible-playbook -i inventories/testbed playbooks/verify.yml -e verify_speculative=false")
        assert "engine line: speculative_config=None" in results["verify off"], results["verify off"]
        # the engine lines before and after the rollback, as the README shows them
        assert "try-local: engine before the rollback: %s\n" % EAGLE3 in proc.stdout, proc.stdout[-3000:]
        assert "try-local: engine after the rollback:  speculative_config=None\n" in proc.stdout, proc.stdout[-3000:]

        # What the cluster says, read here: the flag gone from the InferenceService and kept in its backup annotation,
        # the serving pod's own engine line, the inventory's annotation on the pod, the PV on the session's checkpoints.
        api = _attach().rest()
        isvc = api.get(ISVC)
        assert "--speculative-config" not in isvc["spec"]["predictor"]["model"]["command"][2], isvc["spec"]["predictor"]
        assert "eagle3" in isvc["metadata"]["annotations"]["spec-decoding.alauda.io/previous-speculative-config"]
        pods = [p for p in _pods(api) if not p["metadata"].get("deletionTimestamp")]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        assert pods[0]["metadata"]["annotations"]["testbed.alauda.io/run"] == "process"
        assert pods[0]["metadata"]["name"] in results["rollback"] and pods[0]["metadata"]["name"] not in results["deploy"]
        log = api.request("GET", "/api/v1/namespaces/%s/pods/%s/log" % (NAMESPACE, pods[0]["metadata"]["name"]),
                          query={"container": "kserve-container"}, raw=True)
        line = [entry for entry in log.splitlines() if "Initializing a V1 LLM engine" in entry][-1]
        assert "speculative_config=None" in line and "model='/mnt/models/target'" in line, line
        volume = api.get("/api/v1/persistentvolumes/try-local-tiny-checkpoints")
        assert volume["spec"]["hostPath"]["path"] == tiny_checkpoints["root"], volume["spec"]
    finally:
        if api is None and os.path.exists(cli.POINTER) and _testbed_running():
            api = _attach().rest()
        if api is not None:
            _stop_the_service(api)
            api.close()
        if not was_running:
            subprocess.run([sys.executable, "-m", "tests.testbed.cli", "down"], cwd=REPO, capture_output=True, check=True, timeout=120)
    step_seconds = {name.replace(" ", "_") + "_s": float(s) for _n, name, _status, s, _r in steps}
    print("\nmake try-local: %.1f s (test bed %s), %s" % (seconds, "reused" if was_running else "started", step_seconds))
    vllm_harness.TIMINGS.append(dict({"scenario": "make try-local: cluster-up, deploy-eagle3, requests, verify, rollback, verify off",
                                      "seconds": seconds}, **step_seconds))
