"""The scheduled canary (`canary_target: schedule`) run for real on the test bed. The role renders the CronJob
(roles/rollback_schedule's manifests plus the canary's /metrics Role), the manifests are applied, and the CronJob's Job
template is played the way the test bed plays the scheduled rollback (tests/integration/test_rollback_draft_removal.py):
its container's command and env, the ConfigMap where the container mounts it, the rendered ServiceAccount's token (so
only the rendered RBAC) against the test bed's API server. The first run steps, observes and promotes; the second finds
the promotion and writes nothing. (The rendering assertions of the former render-only test live here too.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.ansible_run import REPO, PlaybookRun, run_playbook
from tests.integration.test_canary_rollout import NGRAM, _create, _deployments, _get, _pages, _serve, _vars

NAME = "llm"
SCHEDULE = "spec-decoding-canary"


def _apply(k8s_client, out):
    """Apply the rendered manifests (the kustomization's resources, in its order) as an administrator would, in-process."""
    from kubernetes import dynamic  # pylint: disable=import-outside-toplevel
    api = dynamic.DynamicClient(k8s_client)
    docs = {}
    for name in yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]:
        doc = yaml.safe_load((out / name).read_text())
        api.resources.get(api_version=doc["apiVersion"], kind=doc["kind"]).create(body=doc, namespace=doc["metadata"]["namespace"])
        docs[name] = doc
    return docs


def _job(k8s_client, namespace):
    """(container, volumes) of the applied CronJob's Job template, read back from the API server."""
    from kubernetes import dynamic  # pylint: disable=import-outside-toplevel
    cron = dynamic.DynamicClient(k8s_client).resources.get(api_version="batch/v1beta1", kind="CronJob").get(
        name=SCHEDULE, namespace=namespace).to_dict()
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SCHEDULE and cron["spec"]["suspend"] is True
    return pod["containers"][0], pod["volumes"]


def run_job(tmp_path, k8s_client, namespace, container, volumes, kubeconfig, run_name):
    """Play one Job of the CronJob: its command and env, the ConfigMap volume as files in a local directory standing for
    the mount path, the service account's kubeconfig standing for the in-cluster token."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    core = client.CoreV1Api(k8s_client)
    mounts = {}
    for mount in container["volumeMounts"]:
        volume = next(v for v in volumes if v["name"] == mount["name"])
        local = tmp_path / run_name / mount["name"]
        local.mkdir(parents=True)
        for key, text in core.read_namespaced_config_map(volume["configMap"]["name"], namespace).data.items():
            (local / key).write_text(text)
        mounts[mount["mountPath"]] = str(local)
    command = list(container["command"])
    assert command[0] == "ansible-playbook"
    command[0] = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    for i, arg in enumerate(command):
        for mount_path, local in mounts.items():
            if arg.startswith("@" + mount_path + "/"):
                command[i] = "@" + local + arg[len(mount_path) + 1:]
    env = dict(os.environ, **{e["name"]: e["value"] for e in container.get("env") or []})
    env.update(HOME=str(tmp_path / run_name), K8S_AUTH_KUBECONFIG=kubeconfig, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    return PlaybookRun(subprocess.run(command, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600, check=False))


def test_scheduled_canary_job_promotes_with_the_rendered_rbac_then_a_rerun_is_a_noop(
        tmp_path, k8s_client, kserve, controlplane, namespace):
    port = _serve(kserve, namespace, NAME, _pages(0.05, 0.030, 30), _pages(0.05, 0.012, 25))
    _create(k8s_client, namespace, NAME, port)
    out = tmp_path / "schedule"
    extra = _vars(namespace, NAME, "", canary_target="schedule", canary_steps=[10, 100], canary_schedule_output_dir=str(out),
                  canary_kserve_version="0.20.0", canary_schedule_cron="0 10 * * 1", canary_ready_timeout=60,
                  # the test bed's API server (1.20) serves CronJobs as batch/v1beta1; suspended: never started by the controller
                  rollback_schedule_cronjob_api_version="batch/v1beta1", rollback_schedule_suspend=True)
    rendered = run_playbook(tmp_path, "playbooks/canary.yml", extra_vars=extra)
    assert rendered.rc == 0, rendered.output
    docs = {name: yaml.safe_load((out / name).read_text()) for name in os.listdir(out) if name != "kustomization.yaml"}
    assert sorted(yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]) == sorted(docs)
    cron = docs["cronjob-%s-%s.yaml" % (namespace, SCHEDULE)]
    assert cron["spec"]["schedule"] == "0 10 * * 1"
    job_vars = yaml.safe_load(docs["configmap-%s-%s-vars.yaml" % (namespace, SCHEDULE)]["data"]["vars.yml"])
    assert job_vars["canary_target"] == "cluster" and job_vars["canary_speculative_config"] == NGRAM
    assert job_vars["canary_steps"] == [10, 100] and float(job_vars["canary_window"]) == 0.2
    assert docs["role-%s-%s-metrics.yaml" % (namespace, SCHEDULE)]["rules"] == \
        [{"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]}]
    assert docs["rolebinding-%s-%s-metrics.yaml" % (namespace, SCHEDULE)]["subjects"][0]["name"] == SCHEDULE
    _apply(k8s_client, out)
    assert "canary" not in _get(k8s_client, namespace, NAME)["spec"]  # rendering and applying the schedule touch no service

    container, volumes = _job(k8s_client, namespace)
    assert container["command"][:2] == ["ansible-playbook", "alauda.spec_decoding.canary"]
    job_sa = controlplane.kubeconfig_for_service_account(namespace, SCHEDULE)
    from kubernetes import client, config  # pylint: disable=import-outside-toplevel
    with pytest.raises(client.ApiException) as denied:  # the job's identity has the rendered Roles, nothing more
        client.AppsV1Api(config.new_client_from_config(job_sa)).list_namespaced_deployment(namespace)
    assert denied.value.status == 403
    first = run_job(tmp_path, k8s_client, namespace, container, volumes, job_sa, "run-1")
    assert first.rc == 0, first.output
    assert first.result("Canary on 10%")["changed"] is True
    observed = first.result("Observe both revisions")
    assert observed["decision"] == "promote" and observed["stable"]["requests"] == 30 and observed["canary"]["requests"] == 25
    assert first.result("Promote the canary to 100%")["changed"] is True
    # on the API server: promoted the KServe v0.20 way, the previous revision retired
    isvc = _get(k8s_client, namespace, NAME)
    assert "canary" not in isvc["spec"] and isvc["spec"]["predictor"]["name"] == "spec"
    args = isvc["spec"]["predictor"]["model"]["args"]
    assert args[-2] == "--speculative-config" and json.loads(args[-1]) == dict(NGRAM)
    assert not isvc["status"].get("canaryStatuses") and sorted(_deployments(k8s_client, namespace, NAME)) == ["llm-predictor-spec"]
    generation, template = isvc["metadata"]["generation"], _deployments(k8s_client, namespace, NAME)["llm-predictor-spec"].spec.template

    second = run_job(tmp_path, k8s_client, namespace, container, volumes, job_sa, "run-2")
    assert second.rc == 0, second.output
    step = second.result("Canary on 10%")
    assert step["changed"] is False and step["already_promoted"] is True
    assert "nothing to do" in second.result("Note an earlier promotion")["ansible_facts"]["canary__actions"][-1]
    assert second.changed == 0, second.output
    assert _get(k8s_client, namespace, NAME)["metadata"]["generation"] == generation
    assert _deployments(k8s_client, namespace, NAME)["llm-predictor-spec"].spec.template == template
