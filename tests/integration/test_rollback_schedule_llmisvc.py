"""The scheduled rollback of KServe's LLMInferenceService (role rollback_schedule with
`rollback_schedule_resource_kind: LLMInferenceService`) run for real on the test bed: the schedule is rendered and applied
(tests/integration/test_rollback.py render_schedule), and the CronJob's Job is played the way the scheduled canary is
(tests/integration/test_canary_schedule.py run_job): its container's command and env, the ConfigMap where the container
mounts it, the rendered ServiceAccount's token, so only the rendered RBAC, against the test bed's API server and the
LLMInferenceService controller stand-in. The first run strips the flag from the pool and proves it by the engine line;
the second (already rolled back) writes nothing.
"""
from __future__ import annotations

import time

import pytest
import yaml

from tests.integration.test_canary_schedule import run_job
from tests.integration.test_llmisvc_rollback import GROUP, PLURAL, VERSION, _api, _get, _render
from tests.integration.test_rbac import kserve_namespace  # noqa: F401  pylint: disable=unused-import
from tests.integration.test_rbac_llmisvc import ARGS_CONFIGMAP, assert_rolled_back
from tests.integration.test_rollback import render_schedule
from tests.paths import read_capture


NAME = "llama-eagle3"
SCHEDULE = "spec-decoding-rollback"
LLM_RULES = sorted([
    (("serving.kserve.io",), ("llminferenceservices",), ("get", "list", "patch", "watch")),
    (("serving.kserve.io",), ("llminferenceserviceconfigs",), ("get",)),
    (("",), ("configmaps",), ("get",)),
    (("apps",), ("deployments",), ("get",)),
    (("leaderworkerset.x-k8s.io",), ("leaderworkersets",), ("get",)),
    (("",), ("pods",), ("get", "list")),
    (("",), ("pods/log",), ("get",)),
])


def _rules(role):
    return sorted((tuple(r.api_groups), tuple(sorted(r.resources)), tuple(sorted(r.verbs))) for r in role.rules)


def test_scheduled_llminferenceservice_rollback_with_the_rendered_rbac_then_a_rerun_writes_nothing(
        tmp_path, kubeconfig, llmisvc, k8s_client, controlplane, namespace, kserve_namespace):  # noqa: F811  pylint: disable=redefined-outer-name
    start = time.monotonic()
    from kubernetes import client, config  # pylint: disable=import-outside-toplevel
    # generation 1 runs EAGLE-3, the rolled-back generation logs the baseline's engine line
    llmisvc.set_behaviour(namespace, NAME, ready_after=0.1, logs={"main": read_capture("baseline", "startup.log")})
    llmisvc.set_behaviour(namespace, NAME, generation=1, ready_after=0.1, logs={"main": read_capture("eagle3", "startup.log")})
    # VLLM_ADDITIONAL_ARGS from a ConfigMap (no flag in it): the flag search has to read it (get on configmaps)
    client.CoreV1Api(k8s_client).create_namespaced_config_map(
        namespace, {"metadata": {"name": ARGS_CONFIGMAP}, "data": {"extra": "--max-num-seqs 8"}})
    manifest = _render(namespace, NAME, "tiny-eagle3")
    manifest["spec"]["template"]["containers"][0].setdefault("env", []).append(
        {"name": "VLLM_ADDITIONAL_ARGS", "valueFrom": {"configMapKeyRef": {"name": ARGS_CONFIGMAP, "key": "extra"}}})
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)

    # applied only: the manifests as the role rendered and applied them (its files are
    # tests/unit/plugins/filter/test_rollback_schedule_problems.py's)
    render = render_schedule(tmp_path, kubeconfig, namespace, None, rollback_schedule_names=[NAME],
                             rollback_schedule_resource_kind="LLMInferenceService", rollback_schedule_api_version=VERSION,
                             rollback_schedule_kserve_namespace=kserve_namespace, rollback_schedule_wait_timeout=60,
                             rollback_schedule_extra_vars={"rollback_wait_sleep": 1, "rollback_verify_delay": 1})
    rbac = client.RbacAuthorizationV1Api(k8s_client)
    # only the kind's rules in the target namespace; get on the presets in KServe's namespace
    assert _rules(rbac.read_namespaced_role(SCHEDULE, namespace)) == LLM_RULES
    assert _rules(rbac.read_namespaced_role(SCHEDULE + "-presets", kserve_namespace)) == [
        (("serving.kserve.io",), ("llminferenceserviceconfigs",), ("get",))]
    binding = rbac.read_namespaced_role_binding(SCHEDULE + "-presets", kserve_namespace)
    assert [(s.kind, s.namespace, s.name) for s in binding.subjects] == [("ServiceAccount", namespace, SCHEDULE)]
    rendered = {(m["kind"], m["metadata"]["namespace"], m["metadata"]["name"]): m
                for m in render.result("Render the CronJob")["ansible_facts"]["rollback_schedule_manifests"]}
    job_vars = yaml.safe_load(rendered[("ConfigMap", namespace, SCHEDULE + "-vars")]["data"]["vars.yml"])
    assert job_vars["rollback_resource_kind"] == "LLMInferenceService" and job_vars["rollback_api_version"] == VERSION
    assert job_vars["rollback_llmisvc_config_namespace"] == kserve_namespace
    pod = rendered[("CronJob", namespace, SCHEDULE)]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SCHEDULE
    container, volumes = pod["containers"][0], pod["volumes"]
    assert container["command"][:2] == ["ansible-playbook", "alauda.spec_decoding.rollback"]
    assert _get(k8s_client, namespace, NAME)["metadata"]["generation"] == 1  # rendering and applying touch no service

    job_sa = controlplane.kubeconfig_for_service_account(namespace, SCHEDULE)
    with pytest.raises(client.ApiException) as denied:  # the job's identity has the rendered Roles, nothing more
        client.CoreV1Api(config.new_client_from_config(job_sa)).list_namespaced_secret(namespace)
    assert denied.value.status == 403

    first = run_job(tmp_path, k8s_client, namespace, container, volumes, job_sa, "run-1")
    assert first.rc == 0, first.output
    # KServe's namespace was readable (the well-known presets are 404 there, not a 403 skipped with a warning)
    live = assert_rolled_back(first, k8s_client, namespace, generation=2)
    assert "--speculative-config" not in yaml.safe_dump(live["spec"])
    spec, generation = live["spec"], live["metadata"]["generation"]

    second = run_job(tmp_path, k8s_client, namespace, container, volumes, job_sa, "run-2")
    assert second.rc == 0, second.output
    assert second.result("Strip the speculative config")["changed"] is False
    assert second.result("Prove no pool's engine runs a proposer")["pools"]["decode"]["speculative_config"] is None
    assert second.changed == 0, second.output
    again = _get(k8s_client, namespace, NAME)
    assert again["metadata"]["generation"] == generation and again["spec"] == spec
    print("scheduled LLMInferenceService rollback (render + 2 job runs): %.1f s" % (time.monotonic() - start))
