"""A render defect is caught (issue #32): the collection's own rendered InferenceService, with the quoting of its
`bash -c` script broken on purpose in the test's copy, runs in a process-mode pod (tests/testbed/pod_process.py) where
bash itself refuses the script; the pod crash-loops, the KServe stand-in writes KServe's verdict (modelStatus
FailedToLoad / BlockedByFailedLoad, lastFailureInfo ModelLoadFailed: tests/testbed/kserve_model_status.py, pinned to
KServe's vectors), and verify fails in seconds, not at its timeout, with bash's own error line read from the pod's
previous log. No vLLM: bash fails before `exec`."""
from __future__ import annotations

import copy
import json
import re
import time

import pytest

from tests.ansible_run import run_playbook
from tests.integration.test_process_pods import _bound_claim
from tests.module_run import run_module

pytestmark = pytest.mark.integration

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# Process mode, and a short back-off so the second restart comes after 0.5 s, not the kubelet's 10 s.
PROCESS = {"testbed.alauda.io/run": "process", "testbed.alauda.io/backoff-seconds": "0.5"}


def _broken_copy(manifest):
    """The rendered manifest with the closing quote of the --speculative-config JSON dropped (the product is untouched)."""
    broken = copy.deepcopy(manifest)
    command = broken["spec"]["predictor"]["model"]["command"]
    assert command[:2] == ["bash", "-c"] and command[2].rstrip().endswith("}'"), command
    command[2] = command[2].rstrip()[:-1] + "\n"
    return broken


def test_broken_quoting_crash_loops_and_verify_fails_with_the_pods_own_log(
        controlplane, kubeconfig, kserve, kubelet, namespace, tmp_path):  # pylint: disable=unused-argument
    api = controlplane.rest()
    pv = _bound_claim(api, namespace, "store", tmp_path, mode="ReadOnlyMany")
    try:
        rendered = run_module("isvc_manifest", {
            "name": "broken", "namespace": namespace, "method": "ngram", "speculative": NGRAM, "artifact_mode": "pvc",
            "artifacts": {"pvc_name": "store"}, "runtime": "aml-vllm-0.32.0", "vllm_version": "0.32.0",
            "dtype": "float32", "max_model_len": 2048, "max_num_seqs": 4, "gpu_count": 0, "annotations": PROCESS})
        assert not rendered.failed, rendered.msg
        started, applied_at = time.monotonic(), time.time()
        api.post(f"/apis/serving.kserve.io/v1beta1/namespaces/{namespace}/inferenceservices", _broken_copy(rendered["manifest"]))
        # verify_speculative false: the collection's own reader finds no flag in a script bash cannot parse either, so the
        # default flag check stops verify before the wait this test is about (with its own message, checked below).
        run = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig,
                           extra_vars={"verify_name": "broken", "verify_namespace": namespace, "verify_speculative": False,
                                       "verify_metrics": False, "verify_wait_timeout": 45, "verify_wait_interval": 1})
        elapsed = time.monotonic() - started
        pods = api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        isvc = api.get(f"/apis/serving.kserve.io/v1beta1/namespaces/{namespace}/inferenceservices/broken")
        seen = "pods: %s\nmodelStatus: %s\nstand-in errors: %s %s" % (
            json.dumps([p["status"] for p in pods])[:3000], isvc["status"].get("modelStatus"), kserve.errors[-3:], kubelet.errors[-3:])
        assert run.rc != 0, run.output
        waited = run.result("Wait until Ready at the current generation")
        msg = waited["msg"]
        assert elapsed < 40, "verify took %.1f s: it waited for the timeout instead of KServe's verdict\n%s" % (elapsed, msg + "\n" + seen)
        assert "FailedToLoad" in msg and "BlockedByFailedLoad" in msg and "ModelLoadFailed" in msg, msg
        # The verdict comes from the restart count; the state is whichever of its turns the loop was in when read (with
        # the test's 0.5 s back-off a pod read just after its restart shows running: seen in a suite run, stop 44).
        restarted = re.search(r"container kserve-container restarted (\d+) times and is (CrashLoopBackOff|Error|running)\.", msg)
        assert restarted and int(restarted.group(1)) >= 2, msg
        # bash's own words, from the pod's previous run's log read through the API server
        assert "unexpected EOF while looking for matching `''" in msg, msg
        assert waited["ready"] is False and waited["pods"][0]["states"]["kserve-container"] == restarted.group(2)
        assert waited["pods"][0]["restarts"]["kserve-container"] >= 2, waited["pods"]
        failure = isvc["status"]["modelStatus"]["lastFailureInfo"]
        assert failure["reason"] == "ModelLoadFailed" and failure["exitCode"] == 2, failure
        wait = [(start, end) for _play, tasks in run.timeline for name, start, end, _h in tasks if "Wait until Ready" in name]
        # With the default (a flag expected), verify says the script does not parse, not that the flag is missing.
        flagged = run_playbook(tmp_path, playbook="playbooks/verify.yml", kubeconfig=kubeconfig,
                               extra_vars={"verify_name": "broken", "verify_namespace": namespace, "verify_metrics": False})
        check = flagged.result("Check the speculative flag")
        assert flagged.rc != 0 and "no shell can run" in check["msg"] and "unterminated single quote" in check["msg"], check
        assert "carries no --speculative-config" not in check["msg"], check["msg"]
        print("crash-loop verify: %.1f s from apply to verify's failure; the wait task began %.1f s after the apply and "
              "took %.1f s\n%s" % (elapsed, wait[0][0] - applied_at, wait[0][1] - wait[0][0], msg))
    finally:
        api.delete(f"/apis/serving.kserve.io/v1beta1/namespaces/{namespace}/inferenceservices/broken")
        api.delete(f"/api/v1/persistentvolumes/{pv}")
        api.close()
