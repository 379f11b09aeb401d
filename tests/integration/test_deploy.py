"""Deploy against the real kube-apiserver with the real KServe CRD: create, idempotent rerun, check and diff
mode, each artifact mode, the generation-aware wait, and bad input that must not write anything."""
from __future__ import annotations

import os

import pytest

from tests.ansible_run import DID_NOT_FAIL, run_cases, run_playbook
from tests.module_run import run_module
from tests.paths import CAPTURES
from tests.testbed.fixtures import module_namespace

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"

CAPTURE = os.path.join(CAPTURES, "eagle3", "startup.log")


def engine_log(target, draft, tokens=3, method="eagle3"):
    """The real vLLM 0.32 startup log of the eagle3 capture, with this deployment's paths."""
    with open(CAPTURE) as handle:
        text = handle.read()
    return (text.replace("/mnt/models/tiny-eagle3", draft).replace("/mnt/models/tiny-llama", target)
            .replace("method='eagle3'", "method='%s'" % method).replace("num_spec_tokens=3", "num_spec_tokens=%d" % tokens))


BASE_VARS = {
    "spec_decoding_verify": False,
    "spec_decoding_hosts": "localhost",
    "spec_decoding_target": "cluster",
    "spec_decoding_runtime": "aml-vllm-0.32.0",
    "spec_decoding_vllm_version": "0.32.0",
    "spec_decoding_dtype": "bfloat16",
    "spec_decoding_gpu_count": 0,
    "spec_decoding_wait_timeout": 60,
    "spec_decoding_artifact_mode": "pvc",
    "spec_decoding_artifacts": {"pvc_name": "model-store", "target_subdir": "Meta-Llama-3.1-8B-Instruct",
                                "draft_subdir": "EAGLE3-LLaMA3.1-Instruct-8B"},
}


def _vars(namespace, name, **more):
    out = dict(BASE_VARS, spec_decoding_namespace=namespace, spec_decoding_isvc_name=name)
    out.update(more)
    return out


def _get(k8s_client, namespace, name, version=VERSION, plural=PLURAL):
    """The serving.kserve.io object (an InferenceService unless told), or None."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel
    try:
        return client.CustomObjectsApi(k8s_client).get_namespaced_custom_object(GROUP, version, namespace, plural, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _script(isvc):
    return isvc["spec"]["predictor"]["model"]["command"][2]


TARGET, DRAFT = "/mnt/models/Meta-Llama-3.1-8B-Instruct", "/mnt/models/EAGLE3-LLaMA3.1-Instruct-8B"


def test_deploy_eagle3_creates_waits_verifies_and_reruns_unchanged(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    kserve.set_behaviour(namespace, "llama-eagle3", ready_after=1.0, log_text=engine_log(TARGET, DRAFT))
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig,
                       extra_vars=_vars(namespace, "llama-eagle3", spec_decoding_verify=True))
    assert run.rc == 0, run.output
    isvc = _get(k8s_client, namespace, "llama-eagle3")
    script = _script(isvc)
    assert ("--speculative-config '{\"method\":\"eagle3\",\"model\":\"/mnt/models/EAGLE3-LLaMA3.1-Instruct-8B\","
            "\"num_speculative_tokens\":3}'") in script
    assert "--model /mnt/models/Meta-Llama-3.1-8B-Instruct" in script
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "pvc://model-store/"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    assert isvc["metadata"]["labels"]["aml.cpaas.io/runtime-type"] == "vllm"
    assert isvc["spec"]["predictor"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    env = {e["name"]: e["value"] for e in isvc["spec"]["predictor"]["model"]["env"]}
    assert env["GPU_MEMORY_UTILIZATION"] == "0.85"  # 0.9 minus the draft headroom
    waited = run.result("Wait for Ready")
    assert waited["ready"] is True and waited["generation"] == isvc["metadata"]["generation"]
    # verify reads that wait's result (Ready at the applied generation) instead of waiting a second time
    assert run.result("Wait until Ready at the current generation").get("skipped") is True
    assert run.result("Apply the InferenceService")["changed"] is True
    engine = run.result("engine-config line")
    assert engine["speculative_config"] == {"method": "eagle3", "model": DRAFT, "num_spec_tokens": 3}
    assert [p["found"] for p in engine["pods"]] == [True]

    rerun = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=_vars(namespace, "llama-eagle3"), kubeconfig=kubeconfig)
    assert rerun.rc == 0, rerun.output
    assert rerun.changed == 0, rerun.output
    assert _get(k8s_client, namespace, "llama-eagle3")["metadata"]["resourceVersion"] == isvc["metadata"]["resourceVersion"]
    # The apply changed nothing and its answer shows Ready at the generation: the wait returned it without reading the cluster.
    recorded = rerun.result("Wait for Ready at the new generation")
    assert recorded["ready"] is True and recorded["generation"] == isvc["metadata"]["generation"] and recorded["elapsed"] == 0.0
    assert recorded["waited"] is False


def test_deploy_fails_when_the_engine_runs_another_config(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    # The pod came up with 2 speculative tokens although 3 were applied (e.g. an image that overrides the command).
    kserve.set_behaviour(namespace, "llama-eagle3", ready_after=0.5, log_text=engine_log(TARGET, DRAFT, tokens=2))
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig,
                       extra_vars=_vars(namespace, "llama-eagle3", spec_decoding_verify=True))
    assert run.rc != 0
    failed = run.failed[-1]
    assert "num_spec" in failed["msg"] and "3" in failed["msg"] and "2" in failed["msg"], failed["msg"]


def test_check_mode_writes_nothing_and_diff_shows_the_change(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    run = run_playbook(tmp_path, "playbooks/deploy-ngram.yml", extra_vars=_vars(namespace, "llama-ngram"), kubeconfig=kubeconfig,
                       check=True)
    assert run.rc == 0, run.output
    assert run.result("Apply the InferenceService")["changed"] is True
    assert _get(k8s_client, namespace, "llama-ngram") is None

    kserve.set_behaviour(namespace, "llama-ngram", ready_after=0.5)
    assert run_playbook(tmp_path, "playbooks/deploy-ngram.yml", extra_vars=_vars(namespace, "llama-ngram"),
                        kubeconfig=kubeconfig).rc == 0
    before = _get(k8s_client, namespace, "llama-ngram")
    more = _vars(namespace, "llama-ngram", spec_decoding_speculative={"num_speculative_tokens": 3})
    diff = run_playbook(tmp_path, "playbooks/deploy-ngram.yml", extra_vars=more, kubeconfig=kubeconfig, check=True, diff=True)
    assert diff.rc == 0, diff.output
    applied = diff.result("Apply the InferenceService")
    assert applied["changed"] is True
    assert '"num_speculative_tokens":3' in _script(applied["diff"]["after"])
    assert '"num_speculative_tokens":5' in _script(applied["diff"]["before"])
    after = _get(k8s_client, namespace, "llama-ngram")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


@pytest.mark.parametrize("mode,artifacts,expect", [
    ("storage_uris", {"target_uri": "pvc://models/llama", "draft_uri": "pvc://models/eagle3"},
     {"storageUris": [{"uri": "pvc://models/llama", "mountPath": "/mnt/models/target"},
                      {"uri": "pvc://models/eagle3", "mountPath": "/mnt/models/draft"}]}),
    ("storage_uris", {"target_uri": "oci://registry.local/llama:v1", "draft_uri": "oci://registry.local/eagle3:v1"},
     {"storageUris": [{"uri": "oci://registry.local/llama:v1", "mountPath": "/mnt/target/model"},
                      {"uri": "oci://registry.local/eagle3:v1", "mountPath": "/mnt/draft/model"}]}),
    ("modelcar", {"modelcar_image": "registry.local/models/llama-eagle3:v1"},
     {"storageUri": "oci://registry.local/models/llama-eagle3:v1"}),
    ("pvc", {"pvc_name": "store"}, {"storageUri": "pvc://store/"}),
])
def test_each_artifact_mode_is_accepted_by_the_real_crd(kubeconfig, k8s_client, kserve, namespace, mode, artifacts, expect):
    """The render of each artifact mode, applied the way the role applies it (server-side apply under the deploy's field
    manager) and waited Ready: the real CRD's schema accepts it. The modules run in-process; the role's wiring of the
    same path is what test_deploy_eagle3_creates_waits_verifies_and_reruns_unchanged runs as a playbook."""
    name = "m-" + mode.replace("_", "-")
    kserve.set_behaviour(namespace, name, ready_after=0.2)
    rendered = run_module("isvc_manifest", {"name": name, "namespace": namespace, "method": "eagle3", "artifact_mode": mode,
                                            "artifacts": artifacts, "runtime": BASE_VARS["spec_decoding_runtime"], "vllm_version": "0.32.0",
                                            "dtype": "bfloat16", "gpu_count": 0})
    assert not rendered.failed, rendered.msg
    applied = run_module("kubernetes.core.k8s", {"kubeconfig": kubeconfig, "state": "present", "definition": rendered["manifest"],
                                                 "apply": True, "server_side_apply": {"field_manager": "alauda-spec-decoding"}})
    assert not applied.failed and applied["changed"], applied.msg
    ready = run_module("isvc_wait", {"kubeconfig": kubeconfig, "name": name, "namespace": namespace, "timeout": 60})
    assert not ready.failed, ready.msg
    isvc = _get(k8s_client, namespace, name)
    predictor = isvc["spec"]["predictor"]
    if "storageUris" in expect:
        assert predictor["storageUris"] == expect["storageUris"]
        assert "storageUri" not in predictor["model"]
        draft = expect["storageUris"][1]["mountPath"]
        target = expect["storageUris"][0]["mountPath"]
    else:
        assert predictor["model"]["storageUri"] == expect["storageUri"]
        draft, target = "/mnt/models/draft", "/mnt/models/target"
    assert '"model":"%s"' % draft in _script(isvc)
    assert "--model %s " % target in _script(isvc)


def test_auto_mode_reads_kserve_features_from_the_crd(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    kserve.set_behaviour(namespace, "auto", ready_after=0.5)
    more = _vars(namespace, "auto", spec_decoding_artifact_mode="auto",
                 spec_decoding_artifacts={"target_uri": "pvc://m/llama", "draft_uri": "pvc://m/eagle", "pvc_name": "m"})
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=more, kubeconfig=kubeconfig)
    assert run.rc == 0, run.output
    assert run.result("Render the InferenceService")["artifact_mode"] == "storage_uris"
    warnings = run.result("Render the InferenceService")["warnings"]
    # the release the CRD shows reaches the render (it used to warn that there was no cluster to read it from: issue #48)
    assert run.result("Read what the cluster's KServe supports")["kserve_version"].startswith("0.20")
    assert any("KServe 0.20" in w for w in warnings) and not [w for w in warnings if "no cluster to read it from" in w], warnings


def test_stale_ready_from_the_previous_generation_does_not_pass(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    kserve.set_behaviour(namespace, "stale", ready_after=0.2)
    assert run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=_vars(namespace, "stale"), kubeconfig=kubeconfig).rc == 0
    first = _get(k8s_client, namespace, "stale")
    # The next revision never gets ready: the wait must fail although Ready=True is still there from generation 1. A wait
    # that took the old Ready passes at once, so 4 s tell it apart as 8 did (the run waits for the whole timeout).
    kserve.set_behaviour(namespace, "stale", never_ready=True, generation=first["metadata"]["generation"] + 1)
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig,
                       extra_vars=_vars(namespace, "stale", spec_decoding_speculative={"num_speculative_tokens": 2},
                                        spec_decoding_wait_timeout=4))
    assert run.rc != 0
    failed = run.result("Wait for Ready")
    assert failed["failed"] is True and failed["ready"] is False
    assert "predictor pods" in failed["msg"] and "conditions" in failed["msg"]


BAD = [
    ("storageuri-with-storageuris", {"spec_decoding_artifact_mode": "storage_uris",
                                     "spec_decoding_artifacts": {"storage_uri": "pvc://a/", "target_uri": "pvc://a/t", "draft_uri": "pvc://a/d"}},
     "artifacts.storage_uri"),
    ("relative-mountpath", {"spec_decoding_artifact_mode": "storage_uris",
                            "spec_decoding_artifacts": {"target_uri": "hf://a/t", "draft_uri": "hf://a/d", "draft_mount_path": "mnt/draft"}},
     "artifacts.storage_uris[1].mountPath"),
    ("dotdot-mountpath", {"spec_decoding_artifact_mode": "storage_uris",
                          "spec_decoding_artifacts": {"target_uri": "hf://a/t", "draft_uri": "hf://a/d", "draft_mount_path": "/mnt/models/../x"}},
     "artifacts.storage_uris[1].mountPath"),
    ("no-common-parent", {"spec_decoding_artifact_mode": "storage_uris",
                          "spec_decoding_artifacts": {"target_uri": "hf://a/t", "draft_uri": "hf://a/d",
                                                      "target_mount_path": "/target", "draft_mount_path": "/draft"}},
     "mountPath"),
    ("colliding-oci-parents", {"spec_decoding_artifact_mode": "storage_uris",
                               "spec_decoding_artifacts": {"target_uri": "oci://r/t:1", "draft_uri": "oci://r/d:1",
                                                           "target_mount_path": "/mnt/models/target", "draft_mount_path": "/mnt/models/draft"}},
     "artifacts.storage_uris[1].mountPath"),
    ("eagle3-without-draft", {"spec_decoding_artifact_mode": "single", "spec_decoding_artifacts": {"storage_uri": "pvc://a/"}},
     "artifact_mode"),
    ("eagle3-no-artifacts", {"spec_decoding_artifact_mode": "auto", "spec_decoding_artifacts": {}}, "artifacts"),
    ("draft-outside-mounts", {"spec_decoding_artifact_mode": "pvc",
                              "spec_decoding_artifacts": {"pvc_name": "a", "draft_path": "/opt/draft"}}, "artifacts.draft_path"),
    ("bad-speculative", {"spec_decoding_speculative": {"num_speculative_tokens": 0}}, "speculative.num_speculative_tokens"),
    ("unknown-speculative-key", {"spec_decoding_speculative": {"tensor_parallel_size": 2}}, "speculative.tensor_parallel_size"),
    ("removed-flag-in-extra-args", {"spec_decoding_extra_args": ["--speculative-model", "/x"]}, "extra_args"),
]


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory, kubeconfig, controlplane):
    """Every BAD case in one ansible-playbook run (a block/rescue per case, the role included as deploy-eagle3.yml
    does), in a namespace of its own: (run, {case: {msg, task}}, namespace)."""
    with module_namespace(controlplane, "deploy-bad-input") as namespace:
        cases = [(cid, {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.inference_service"},
                        "vars": dict(_vars(namespace, "bad-%d" % index, **overrides), inference_service_method="eagle3")})
                 for index, (cid, overrides, _field) in enumerate(BAD)]
        # test_invalid_name_is_refused_before_writing's case
        cases.append((INVALID_NAME, {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.inference_service"},
                                     "vars": dict(_vars(namespace, INVALID_NAME), inference_service_method="eagle3")}))
        run, results = run_cases(tmp_path_factory.mktemp("deploy-bad-input"), cases, kubeconfig=kubeconfig)
        yield run, results, namespace


@pytest.mark.parametrize("index,overrides,field", [(i,) + b[1:] for i, b in enumerate(BAD)], ids=[b[0] for b in BAD])
def test_bad_input_fails_before_writing(bad_input_runs, k8s_client, index, overrides, field):  # pylint: disable=unused-argument
    run, results, namespace = bad_input_runs
    result = results[BAD[index][0]]
    assert result["msg"] != DID_NOT_FAIL, run.output
    assert result["task"].split(" : ")[-1] == "Render the InferenceService", result
    assert field in result["msg"] and "Fix:" in result["msg"], result["msg"]
    assert _get(k8s_client, namespace, "bad-%d" % index) is None


INVALID_NAME = "Llama_EAGLE3"


def test_invalid_name_is_refused_before_writing(bad_input_runs, k8s_client):
    """A case of bad_input_runs (one ansible-playbook run for all of them)."""
    run, results, namespace = bad_input_runs
    result = results[INVALID_NAME]
    assert result["msg"] != DID_NOT_FAIL, run.output
    assert result["task"].split(" : ")[-1] == "Render the InferenceService", result
    assert result["msg"].startswith("name:"), result["msg"]
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    assert client.CustomObjectsApi(k8s_client).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"] == []


def test_deployment_mode_change_is_refused_and_legacy_names_do_not_diff(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    kserve.set_behaviour(namespace, "mode", ready_after=0.2)
    assert run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=_vars(namespace, "mode"), kubeconfig=kubeconfig).rc == 0
    before = _get(k8s_client, namespace, "mode")
    legacy = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig,
                          extra_vars=_vars(namespace, "mode", spec_decoding_deployment_mode="RawDeployment"))
    assert legacy.rc == 0 and legacy.changed == 0, legacy.output
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig,
                       extra_vars=_vars(namespace, "mode", spec_decoding_deployment_mode="Knative"))
    assert run.rc != 0
    msg = run.result("Render the InferenceService")["msg"]
    assert msg.startswith("deployment_mode:") and "Standard" in msg
    assert _get(k8s_client, namespace, "mode")["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_redeploy_after_rollback_works(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    """A deploy after a rollback puts --speculative-config back instead of failing: the rollback edits the command as
    its own field manager, and the role takes those fields back when the server-side apply names it in a conflict.
    (Refusing anyone else's edit is unit-tested on the API server's conflict text.)"""
    name = "llama-redeploy"
    kserve.set_behaviour(namespace, name, ready_after=0.5)
    deploy_vars = _vars(namespace, name)
    assert run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig, extra_vars=deploy_vars).rc == 0
    first = _script(_get(k8s_client, namespace, name))
    rollback = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig, extra_vars={
        "rollback_names": ["%s/%s" % (namespace, name)], "rollback_verify": False, "rollback_wait_timeout": 60,
        "rollback_wait_sleep": 1})
    assert rollback.rc == 0, rollback.output
    assert "--speculative-config" not in _script(_get(k8s_client, namespace, name))

    redeploy = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig, extra_vars=deploy_vars)
    assert redeploy.rc == 0, redeploy.output
    isvc = _get(k8s_client, namespace, name)
    assert _script(isvc) == first and "--speculative-config '{\"method\":\"eagle3\"" in first
    assert isvc["status"]["observedGeneration"] == isvc["metadata"]["generation"]


def test_a_missing_namespace_fails_once_in_one_line_with_the_fix(tmp_path, kubeconfig, kserve, namespace):  # pylint: disable=unused-argument
    """The apply's 404 is reported once (not by the apply and again by its conflict rescue), as one line naming the
    namespace, the variable and the fix, not the API server's JSON Status (issue #48)."""
    missing = namespace + "-absent"
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig, extra_vars=_vars(missing, "llama-eagle3"))
    assert run.rc != 0
    messages = [res.get("msg") for res in run.failed]
    assert messages == ["Namespace %s does not exist, so InferenceService llama-eagle3 was not applied (nothing was written). Fix: "
                        "create it (kubectl create namespace %s) or set spec_decoding_namespace to an existing namespace." % (missing, missing)
                        ], messages
    assert run.result("Apply the InferenceService")["missing_namespace"] == missing


def test_spec_decoding_wait_false_applies_and_returns_without_waiting(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    """spec_decoding_wait: false reaches the role (its default had hard-coded true): the object is applied and the play ends
    without the wait, and without the verify that would wait for the pods (issue #48)."""
    kserve.set_behaviour(namespace, "nowait", never_ready=True)
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig,
                       extra_vars=_vars(namespace, "nowait", spec_decoding_wait=False, spec_decoding_verify=True,
                                        spec_decoding_wait_timeout=30))
    assert run.rc == 0, run.output
    assert run.result("Apply the InferenceService")["changed"] is True
    assert run.result("Wait for Ready at the new generation").get("skipped") is True
    assert not [name for name, _h, res in run.tasks if "Check the engine-config line" in name and not res.get("skipped")]
    isvc = _get(k8s_client, namespace, "nowait")
    assert "--speculative-config" in _script(isvc)
