"""Rollback against the real kube-apiserver with the real KServe CRD (tests/testbed).

A guide-style EAGLE-3 InferenceService is created, reconciled by the KServe stand-in (Deployment -> pods ->
Ready at the generation), its pods log the real vLLM 0.32 engine lines captured in tests/fixtures/vllm
(eagle3 for the first generation, the baseline for later ones). Then: rollback, rerun no-op, check mode,
a concurrent edit between read and patch, roll-forward from the backup, and the least-privilege Role.
"""
from __future__ import annotations

import copy
import json
import os

import pytest
import yaml

from tests.ansible_run import run_playbook
from tests.module_run import run_module
from tests.paths import read_capture

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(REPO, "tests", "unit", "plugins", "module_utils", "data", "rollback")
BACKUP_ANNOTATION = "spec-decoding.alauda.io/previous-speculative-config"
EAGLE3 = {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
NAME = "llama31-8b-eagle3"


def _capture(folder):
    return read_capture(folder, "startup.log")


def _manifest(name, namespace):
    with open(os.path.join(DATA, name), encoding="utf-8") as fh:
        obj = yaml.safe_load(fh)
    obj["metadata"]["namespace"] = namespace
    return obj


def _api(k8s_client):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.CustomObjectsApi(k8s_client)


def _get(k8s_client, namespace, name=NAME):
    return _api(k8s_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def _wait_ready(k8s_client, namespace, name=NAME, timeout=60):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
    isvc, _elapsed = isvc_wait.wait_ready(k8s_client, namespace, name, timeout=timeout, interval=0.3)
    return isvc


@pytest.fixture
def eagle3_service(k8s_client, kserve, namespace):
    """The guide's Example 2 deployed and Ready; pods of generation 1 log the EAGLE-3 engine line."""
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=_capture("baseline"))
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=_capture("eagle3"), generation=1)
    manifest = _manifest("guide_example2_eagle3.yaml", namespace)
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    isvc = _wait_ready(k8s_client, namespace)
    assert "--speculative-config" in isvc["spec"]["predictor"]["model"]["command"][2]
    return isvc


def _rollback_vars(namespace, **more):
    out = {"rollback_names": ["%s/%s" % (namespace, NAME)], "rollback_wait_timeout": 60, "rollback_wait_sleep": 1,
           "rollback_verify_delay": 1}
    out.update(more)
    return out


def test_rollback_of_deployed_eagle3_then_rerun_is_a_noop(tmp_path, kubeconfig, k8s_client, eagle3_service, namespace):
    run = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=_rollback_vars(namespace), kubeconfig=kubeconfig)
    assert run.rc == 0, run.output
    strip = run.result("Strip the speculative config")
    assert strip["changed"] is True and strip["previous_config"] == EAGLE3 and strip["config"] is None
    isvc = _get(k8s_client, namespace)
    expected = _manifest("guide_example2_eagle3.rolled_back.yaml", namespace)
    # exactly the flag line is gone from the stored object
    assert isvc["spec"]["predictor"] == expected["spec"]["predictor"]
    assert isvc["metadata"]["generation"] == eagle3_service["metadata"]["generation"] + 1
    backup = json.loads(isvc["metadata"]["annotations"][BACKUP_ANNOTATION])
    assert backup["config"] == EAGLE3
    assert backup["containers"]["/spec/predictor/model"]["command"] == eagle3_service["spec"]["predictor"]["model"]["command"]
    # Ready at the new generation, and the engine line of every new pod says None
    assert isvc["status"]["observedGeneration"] == isvc["metadata"]["generation"]
    engine = run.result("Prove the engine runs without a proposer")
    assert engine["speculative_config"] is None and engine["found"] is True
    assert engine["pods"] and all(p["speculative_config"] is None for p in engine["pods"])
    # the summary carries the proof: the engine line of the new pods (issue #48)
    summary = run.result("Summary")["msg"]
    assert summary[0].startswith("1 InferenceService(s) selected; rolled back: %s/%s" % (namespace, NAME)), summary
    assert summary[1].startswith("%s/%s: the engine of %s prints " % (namespace, NAME, engine["pods"][0]["name"])), summary
    assert summary[1].endswith("speculative_config=None") and "Initializing a V1 LLM engine" in summary[1], summary

    rerun = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=_rollback_vars(namespace), kubeconfig=kubeconfig)
    assert rerun.rc == 0, rerun.output
    assert rerun.changed == 0, rerun.output
    assert _get(k8s_client, namespace)["metadata"]["resourceVersion"] == isvc["metadata"]["resourceVersion"]


def test_a_rolled_back_revision_that_crash_loops_fails_the_rollback_at_once_with_its_log(
        tmp_path, kubeconfig, k8s_client, kserve, eagle3_service, namespace):  # pylint: disable=unused-argument
    """The stripped revision's predictor crash-loops (KServe: FailedToLoad at the new generation): the rollback fails in
    seconds, not at rollback_wait_timeout, with KServe's verdict and the container's previous log; it never reports
    success (the strip is reported as a change, and no engine proof ran)."""
    kserve.set_behaviour(namespace, NAME, crash_loop=True, generation=2,
                         previous_logs={"kserve-container": "ValueError: max_model_len 65536 exceeds the model's 8192\n"})
    # The scripted pod's restartCount stays at 1 (a real crash loop's grows: the default of 2 restarts is exercised on a
    # process-mode pod in test_crash_loop_verify.py), so this run asks for 1: the role's variable reaches the wait.
    run = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig,
                       extra_vars=_rollback_vars(namespace, rollback_wait_timeout=120, rollback_wait_crash_loop_restarts=1))
    assert run.rc != 0, run.output
    strip = run.result("Strip the speculative config")
    assert strip["failed"] and strip["changed"] is True, strip
    assert "FailedToLoad" in strip["msg"] and "CrashLoopBackOff" in strip["msg"], strip["msg"]
    assert "max_model_len 65536 exceeds" in strip["msg"], strip["msg"]
    assert run.wall < 90, "the rollback waited %.0f s: for its timeout, not for KServe's verdict" % run.wall
    assert not [name for name, _h, _r in run.tasks if "Prove the engine runs without a proposer" in name]
    assert "--speculative-config" not in _get(k8s_client, namespace)["spec"]["predictor"]["model"]["command"][2]


def test_check_mode_writes_nothing_and_diff_shows_the_flag(tmp_path, kubeconfig, k8s_client, eagle3_service, namespace):
    run = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=_rollback_vars(namespace), kubeconfig=kubeconfig,
                       check=True, diff=True)
    assert run.rc == 0, run.output
    strip = run.result("Strip the speculative config")
    assert strip["changed"] is True
    before = strip["diff"]["before"]["/spec/predictor/model"]["command"]
    after = strip["diff"]["after"]["/spec/predictor/model"]["command"]
    assert "--speculative-config" in before[2] and "--speculative-config" not in after[2]
    assert json.loads(strip["diff"]["after"]["annotations"][BACKUP_ANNOTATION])["config"] == EAGLE3
    # the server ran the patch as a dry run: the returned object has the change, the stored one does not
    assert "--speculative-config" not in strip["resource"]["spec"]["predictor"]["model"]["command"][2]
    stored = _get(k8s_client, namespace)
    assert stored["metadata"]["resourceVersion"] == eagle3_service["metadata"]["resourceVersion"]
    assert stored["spec"] == eagle3_service["spec"]


def _params(**params):
    """The isvc_speculative options rollback.run reads."""
    out = dict(name=NAME, namespace=None, state="absent", config=None, vllm_version=None, restore_backup=False,
               container=None, backup="annotation", backup_file=None, guard="value", retries=0,
               remove_draft_artifacts=False, wait=False, wait_timeout=60, wait_sleep=1)
    out.update(params)
    return out


def _racing_cluster(k8s_client, namespace, edit):
    """The module's real cluster service, with another writer editing the object right after the first of the module's
    reads of the InferenceService."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.service import ClusterService  # pylint: disable=import-outside-toplevel

    class Racing(ClusterService):
        edits = 0

        def inference_service(self, namespace, name):
            obj = super().inference_service(namespace, name)
            if self.edits == 0:
                self.edits += 1
                edit()
            return obj

    return Racing(k8s_client)


def test_concurrent_edit_between_read_and_patch_is_detected(k8s_client, eagle3_service, namespace):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ConflictError  # pylint: disable=import-outside-toplevel

    def edit(marker="concurrent-edit"):
        # someone else changes the same command (adds a line at the end) between our read and our patch
        obj = _get(k8s_client, namespace)
        ops = [{"op": "replace", "path": "/spec/predictor/model/command/2",
                "value": obj["spec"]["predictor"]["model"]["command"][2] + "echo %s\n" % marker}]
        _api(k8s_client).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME, ops,
                                                        _content_type="application/json-patch+json")

    with pytest.raises(ConflictError) as exc:
        rollback.run(_racing_cluster(k8s_client, namespace, edit), _params(namespace=namespace))
    assert "changed between read and write" in str(exc.value) and "retries" in str(exc.value)
    stored = _get(k8s_client, namespace)
    script = stored["spec"]["predictor"]["model"]["command"][2]
    assert "echo concurrent-edit" in script and "--speculative-config" in script  # the edit survived, nothing overwritten
    assert BACKUP_ANNOTATION not in stored["metadata"].get("annotations", {})

    # with retries the module re-reads and strips the flag on top of the other writer's edit
    # with retries the module re-reads after the conflict and strips the flag on top of the other writer's edits
    result, _warnings = rollback.run(_racing_cluster(k8s_client, namespace, lambda: edit("second-edit")),
                                     _params(namespace=namespace, retries=1))
    assert result["changed"] is True and result["attempts"] == 2
    script = _get(k8s_client, namespace)["spec"]["predictor"]["model"]["command"][2]
    assert "echo concurrent-edit" in script and "echo second-edit" in script and "--speculative-config" not in script


def test_resource_version_guard_conflicts_on_any_edit(k8s_client, eagle3_service, namespace):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ConflictError  # pylint: disable=import-outside-toplevel

    def label_edit():
        _api(k8s_client).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME, {"metadata": {"labels": {"x": "y"}}})

    with pytest.raises(ConflictError):
        rollback.run(_racing_cluster(k8s_client, namespace, label_edit), _params(namespace=namespace, guard="resource_version"))
    assert "--speculative-config" in _get(k8s_client, namespace)["spec"]["predictor"]["model"]["command"][2]


def test_roll_forward_restores_the_backup_exactly(tmp_path, kubeconfig, k8s_client, eagle3_service, namespace):
    assert run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=_rollback_vars(namespace, rollback_verify=False),
                        kubeconfig=kubeconfig).rc == 0
    rolled = _get(k8s_client, namespace)
    assert "--speculative-config" not in rolled["spec"]["predictor"]["model"]["command"][2]
    tasks = """
    - name: Roll forward
      alauda.spec_decoding.isvc_speculative:
        name: %s
        namespace: %s
        state: present
        restore_backup: true
        wait: true
        wait_timeout: 60
        wait_sleep: 1
      register: forward
    """ % (NAME, namespace)
    run = run_playbook(tmp_path, tasks=tasks, kubeconfig=kubeconfig)
    assert run.rc == 0, run.output
    assert run.result("Roll forward")["changed"] is True
    restored = _get(k8s_client, namespace)
    assert restored["spec"]["predictor"] == eagle3_service["spec"]["predictor"]  # byte for byte
    assert restored["status"]["observedGeneration"] == restored["metadata"]["generation"] == rolled["metadata"]["generation"] + 1
    again = run_playbook(tmp_path, tasks=tasks, kubeconfig=kubeconfig)
    assert again.rc == 0, again.output
    assert again.result("Roll forward")["changed"] is False


def test_missing_inference_service_is_a_clear_error(kubeconfig, namespace, controlplane):
    # The module in-process (tests/module_run.py), not in a playbook: only its answer is under test, and the contract test
    # (tests/unit/plugins/modules/test_module_contract.py) holds that answer the same through both ways a task runs it.
    res = run_module("isvc_speculative", {"kubeconfig": kubeconfig, "name": "nope", "namespace": namespace})
    assert res.failed
    assert "InferenceService %s/nope not found" % namespace in res.msg


def test_label_selector_selects_only_matching_services(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    kserve.set_behaviour(namespace, "a", ready_after=0.2, log_text=_capture("baseline"))
    kserve.set_behaviour(namespace, "b", ready_after=0.2, log_text=_capture("baseline"))
    for name, labels in (("a", {"spec-decoding": "on"}), ("b", {})):
        manifest = _manifest("guide_example1_ngram.yaml", namespace)
        manifest["metadata"]["name"] = name
        manifest["metadata"]["labels"].update(labels)
        _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
        _wait_ready(k8s_client, namespace, name)
    run = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig, extra_vars={
        "rollback_names": [], "rollback_label_selector": "spec-decoding=on", "rollback_namespaces": [namespace],
        "rollback_wait_timeout": 60, "rollback_wait_sleep": 1, "rollback_verify_delay": 1})
    assert run.rc == 0, run.output
    assert "--speculative-config" not in _get(k8s_client, namespace, "a")["spec"]["predictor"]["model"]["command"][2]
    assert "--speculative-config" in _get(k8s_client, namespace, "b")["spec"]["predictor"]["model"]["command"][2]


def test_least_privilege_role_is_enough_and_a_token_without_it_is_refused(tmp_path, kubeconfig, k8s_client, controlplane,
                                                                          eagle3_service, namespace):
    # applied only: the CronJob and the job's variables as the role rendered and applied them (its files are
    # tests/unit/plugins/filter/test_rollback_schedule_problems.py's)
    out = render_schedule(tmp_path, kubeconfig, namespace, None)
    cron = next(m for m in out.result("Render the CronJob")["ansible_facts"]["rollback_schedule_manifests"] if m["kind"] == "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    role = client.RbacAuthorizationV1Api(k8s_client).read_namespaced_role("spec-decoding-rollback", namespace)
    assert sorted((tuple(r.api_groups), tuple(sorted(r.resources)), tuple(sorted(r.verbs))) for r in role.rules) == sorted([
        (("serving.kserve.io",), ("inferenceservices",), ("get", "list", "patch", "watch")),
        (("serving.kserve.io",), ("servingruntimes",), ("get", "list")),
        (("",), ("pods",), ("get", "list")),
        (("",), ("pods/log",), ("get",)),
    ])
    stored_cron = client.BatchV1beta1Api(k8s_client).read_namespaced_cron_job("spec-decoding-rollback", namespace) \
        if hasattr(client, "BatchV1beta1Api") else None
    if stored_cron is not None:
        assert stored_cron.spec.concurrency_policy == "Forbid"

    # a service account without the binding is refused by the API server
    outsider = controlplane.kubeconfig_for_service_account(namespace, "outsider")
    refused = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=_rollback_vars(namespace), kubeconfig=outsider)
    assert refused.rc != 0
    assert "forbidden" in refused.output.lower()
    assert "--speculative-config" in _get(k8s_client, namespace)["spec"]["predictor"]["model"]["command"][2]

    # the job's own service account, with only the rendered Role, does the whole rollback and its proof
    job_sa = controlplane.kubeconfig_for_service_account(namespace, "spec-decoding-rollback")
    job_vars = cron_job_vars(out, namespace)
    done = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=job_vars, kubeconfig=job_sa)
    assert done.rc == 0, done.output
    assert done.result("Prove the engine runs without a proposer")["speculative_config"] is None
    assert "--speculative-config" not in _get(k8s_client, namespace)["spec"]["predictor"]["model"]["command"][2]


def render_schedule(tmp_path, kubeconfig, namespace, out, **more):
    """Render and apply role rollback_schedule (suspended CronJob) for the test service into ``namespace``; the manifests
    are also written to ``out`` unless it is None (each file is a module run of ansible.builtin.copy, about 0.5 s:
    a test that reads no file passes None and takes what it needs from the run, see cron_job_vars)."""
    role_vars = {"rollback_schedule_namespace": namespace, "rollback_schedule_names": [NAME],
                 "rollback_schedule_cronjob_api_version": "batch/v1beta1", "rollback_schedule_suspend": True,
                 "rollback_schedule_output_dir": "" if out is None else str(out), "rollback_schedule_apply": True}
    role_vars.update(more)
    tasks = [{"name": "Render and apply the schedule", "ansible.builtin.include_role": {"name": "alauda.spec_decoding.rollback_schedule"},
              "vars": role_vars}]
    run = run_playbook(tmp_path, tasks=json.dumps(tasks), kubeconfig=kubeconfig)
    assert run.rc == 0, run.output
    return run


def cron_job_vars(out, namespace, **more):
    """The variables the rendered CronJob runs rollback.yml with, with the test's short waits (and ``more``) on top;
    the job's interpreter path is its image's, not this machine's. ``out``: the directory render_schedule wrote, or its
    run (the ConfigMap as the role rendered and applied it)."""
    if hasattr(out, "result"):
        manifests = out.result("Render the CronJob")["ansible_facts"]["rollback_schedule_manifests"]
        cm = next(m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "spec-decoding-rollback-vars")
    else:
        cm = yaml.safe_load((out / ("configmap-%s-spec-decoding-rollback-vars.yaml" % namespace)).read_text())
    job_vars = json.loads(cm["data"]["vars.yml"])
    job_vars.pop("ansible_python_interpreter")
    job_vars.update(rollback_wait_timeout=60, rollback_wait_sleep=1, rollback_verify_delay=1, **more)
    return job_vars


def test_remove_draft_artifacts_after_ready(tmp_path, kubeconfig, k8s_client, eagle3_service, namespace):
    run = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig,
                       extra_vars=_rollback_vars(namespace, rollback_remove_draft_artifacts=True))
    assert run.rc == 0, run.output
    isvc = _get(k8s_client, namespace)
    assert isvc["spec"]["predictor"]["storageUris"] == [copy.deepcopy(eagle3_service["spec"]["predictor"]["storageUris"][0])]
    # removed only after the rolled-back revision was Ready and proven by the engine line
    assert run.result("Prove the engine runs without a proposer")["speculative_config"] is None
    removed = run.result("Remove the draft (storageUris entry or Modelcar layers)")
    assert removed["mode"] == "storage_uris" and removed["removed"]["mountPath"] == "/mnt/models/draft"
    assert isvc["status"]["observedGeneration"] == isvc["metadata"]["generation"]


SPECULATOR = "/mnt/models/llama-eagle3-speculator"


def test_rollback_of_a_speculators_checkpoint_refuses_naming_it_and_the_fix(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    """A speculators-format checkpoint served as --model turns speculative decoding on with no flag (vLLM reads its
    speculators_config and serves the verifier it names): the rollback has nothing to strip, and its proof of the engine
    fails at once (no retries: waiting changes nothing) naming the checkpoint, the verifier and the fix. Nothing is written."""
    # The real vLLM 0.32 engine line of the eagle3 capture, as vLLM prints it for a speculator: the verifier is the
    # engine's model, the served checkpoint is the draft.
    line = _capture("eagle3").replace("/mnt/models/tiny-eagle3", SPECULATOR).replace("/mnt/models/tiny-llama", "/mnt/models/target")
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=line)
    manifest = _manifest("guide_example2_eagle3.rolled_back.yaml", namespace)
    script = manifest["spec"]["predictor"]["model"]["command"][2]
    manifest["spec"]["predictor"]["model"]["command"][2] = script.replace("--model /mnt/models/target", "--model " + SPECULATOR)
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    before = _wait_ready(k8s_client, namespace)
    run = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig,
                       extra_vars=_rollback_vars(namespace, rollback_verify_retries=5, rollback_verify_delay=2))
    assert run.rc != 0, run.output  # never success while a proposer runs
    assert run.result("Strip the speculative config")["changed"] is False
    proof = run.result("Prove the engine runs without a proposer")
    assert proof["failed"] and proof["attempts"] == 1, proof  # refused at once, not after 5 retries
    assert proof["speculative_source"]["kind"] == "speculators_checkpoint"
    assert "speculators-format checkpoint %s served as the model" % SPECULATOR in proof["msg"], proof["msg"]
    assert "Fix: serve the target model /mnt/models/target directly" in proof["msg"], proof["msg"]
    assert _get(k8s_client, namespace)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
