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
in CI, the start of a second control plane beside the session's (the test bed the user's command starts): about 60 s
alone. The run is a background process (tests/e2e/try_local_run.py) that starts beside the watchdog test (the e2e
conftest's START_BESIDE, ``start_early`` here), so this test mostly reads its result; run alone, the test starts it. It
stops what it started: the InferenceService (its vLLM pod) always, the test bed when it was not running before.
"""
from __future__ import annotations

import re
import time

import pytest

from tests.e2e import try_local_run, vllm_harness
from tests.e2e.try_local_run import ISVC, NAMESPACE

pytestmark = pytest.mark.e2e

STEPS = ["cluster", "runtime", "checkpoints", "deploy", "requests", "verify", "rollback", "verify off"]
STEP_LINE = re.compile(r"^try-local: (\d)/8 (\S+(?: off)?) +(ok|FAILED) \(([0-9.]+) s\) (.*)$", re.M)
EAGLE3 = "speculative_config=SpeculativeConfig(method='eagle3', model='/mnt/models/eagle3', num_spec_tokens=3)"


def start_early(request):  # pylint: disable=unused-argument
    """Called by the e2e conftest (START_BESIDE) when the watchdog module starts: the run goes on beside the watchdog
    test, which leaves most of a core idle (its windows are sized from the request rate measured just before them)."""
    try_local_run.RUN.start()


def stop_early():
    """Called by the e2e conftest at the session's end: a run whose test did not run is stopped, with what it started."""
    try_local_run.RUN.clean_up()


def test_make_try_local_runs_the_guide_loop(tiny_checkpoints):
    run = try_local_run.RUN
    beside = run.proc is not None  # started beside the watchdog test (start_early), or by this test now
    waited_from = time.monotonic()
    api = None
    try:
        proc = run.wait(timeout=2400)
        waited = round(time.monotonic() - waited_from, 1)
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
        api = try_local_run.attach().rest()
        isvc = api.get(ISVC)
        assert "--speculative-config" not in isvc["spec"]["predictor"]["model"]["command"][2], isvc["spec"]["predictor"]
        assert "eagle3" in isvc["metadata"]["annotations"]["spec-decoding.alauda.io/previous-speculative-config"]
        pods = [p for p in try_local_run.pods(api) if not p["metadata"].get("deletionTimestamp")]
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
        if api is not None:
            api.close()
        run.clean_up()  # the InferenceService and its vLLM pod always, the test bed when the run started it
    step_seconds = {name.replace(" ", "_") + "_s": float(s) for _n, name, _status, s, _r in steps}
    print("\nmake try-local: %.1f s (test bed %s; %s, waited for here %.1f s), %s" % (
        run.seconds, "reused" if run.was_running else "started", "beside the watchdog test" if beside else "alone", waited, step_seconds))
    vllm_harness.TIMINGS.append(dict({"scenario": "make try-local: cluster-up, deploy-eagle3, requests, verify, rollback, verify off",
                                      "seconds": run.seconds, "beside": "watchdog" if beside else "none", "waited_s": waited},
                                     **step_seconds))
