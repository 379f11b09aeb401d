"""RBAC for KServe's LLMInferenceService: the least-privilege Roles of docs/rbac/*.yaml, proven on the real kube-apiserver
(authorization mode RBAC) with ServiceAccount tokens bound only to them, for the kind's own reads and writes:
llminferenceservices, the presets (llminferenceserviceconfigs, in the namespace and in KServe's), the ConfigMap that
VLLM_ADDITIONAL_ARGS is read from, the pools' Deployments (the rollout wait), pods, pods/log and pods/proxy.

Three real playbook runs (deploy-eagle3.yml, verify.yml, rollback.yml, each with its own token); the removed-rule cases
run the modules in-process (tests/module_run.py) with a token whose Role lacks that one rule.
"""
from __future__ import annotations

import json
import time

from tests.ansible_run import run_playbook
from tests.integration.test_rbac import grants, kserve_namespace  # noqa: F401  pylint: disable=unused-import
from tests.integration.test_llmisvc_rollback import _api, _get
from tests.module_run import run_module
from tests.paths import read_capture
from tests.testbed.kubelet import free_port_on, host_ipv4

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command

NAME = "llama-eagle3"
EAGLE3 = {"method": "eagle3", "model": "/mnt/models/tiny-eagle3", "num_spec_tokens": 3}  # as recorded (tests/fixtures/vllm/eagle3)
ARGS_CONFIGMAP = "vllm-args"
PRESET_WARNING = "could not read KServe's well-known preset"


def _common(namespace, kserve_ns):
    return {"spec_decoding_hosts": "localhost", "spec_decoding_target": "cluster", "spec_decoding_namespace": namespace,
            "spec_decoding_isvc_name": NAME, "spec_decoding_resource_kind": "LLMInferenceService",
            "spec_decoding_kserve_namespace": kserve_ns,
            "spec_decoding_llmisvc": {"image": "registry.local/vllm/vllm-openai:v0.32.0"}}


def _deploy_vars(namespace, kserve_ns):
    return dict(_common(namespace, kserve_ns), spec_decoding_vllm_version="0.32.0", spec_decoding_gpu_count=0,
                spec_decoding_wait_timeout=60, spec_decoding_verify=True, spec_decoding_artifact_mode="pvc",
                spec_decoding_artifacts={"pvc_name": "model-store", "draft_subdir": "tiny-eagle3"})


def assert_rolled_back(run, k8s_client, namespace, generation):
    """The rollback run stripped the EAGLE-3 flag, read KServe's presets without a 403, proved the engine runs no
    proposer, and left the rest of the decode container (its ConfigMap env) alone. Returns the live object."""
    assert not [w for w in _warnings(run) if PRESET_WARNING in w], _warnings(run)
    strip = run.result("Strip the speculative config")
    assert strip["changed"] is True and strip["previous_config"]["decode"]["method"] == "eagle3"
    proved = run.result("Prove no pool's engine runs a proposer")
    assert proved["pools"]["decode"]["speculative_config"] is None
    live = _get(k8s_client, namespace, NAME)
    assert live["metadata"]["generation"] == generation
    container = live["spec"]["template"]["containers"][0]
    assert vllm_command.find_speculative_config(container["command"]) is None
    assert container["env"][-1]["valueFrom"]["configMapKeyRef"]["name"] == ARGS_CONFIGMAP  # the rest is untouched
    return live


def _warnings(run):
    return [w for _name, _host, res in run.tasks for w in res.get("warnings") or []]


def _behave(llmisvc, namespace, metrics_port=None):
    """Decode pods of generations 1 and 2 run EAGLE-3 (and serve the recorded /metrics page through the pod proxy);
    after the rollback (generation 3) they log the baseline's engine line."""
    llmisvc.set_behaviour(namespace, NAME, ready_after=0.2, logs={"main": read_capture("baseline", "startup.log")})
    extra = {}
    if metrics_port:
        extra = {"pod_ip": host_ipv4(), "http": {metrics_port: {"/metrics": read_capture("eagle3", "metrics.txt")}}}
    for generation in (1, 2):
        llmisvc.set_behaviour(namespace, NAME, pool="decode", generation=generation, ready_after=0.2,
                              logs={"main": read_capture("eagle3", "startup.log")}, **extra)


def _args_from_configmap(k8s_client, namespace):
    """As a platform does: VLLM_ADDITIONAL_ARGS from a ConfigMap (no speculative flag in it), so the flag search has to
    read it (get on configmaps). An admin's JSON patch: generation 2."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    client.CoreV1Api(k8s_client).create_namespaced_config_map(
        namespace, {"metadata": {"name": ARGS_CONFIGMAP}, "data": {"extra": "--max-num-seqs 8"}})
    env = {"name": "VLLM_ADDITIONAL_ARGS", "valueFrom": {"configMapKeyRef": {"name": ARGS_CONFIGMAP, "key": "extra"}}}
    _api(k8s_client).patch_namespaced_custom_object("serving.kserve.io", "v1alpha2", namespace, "llminferenceservices", NAME,
                                                    [{"op": "add", "path": "/spec/template/containers/0/env/-", "value": env}],
                                                    _content_type="application/json-patch+json")


def test_deploy_verify_rollback_an_llminferenceservice_with_only_the_documented_roles(
        tmp_path, grants, llmisvc, k8s_client, namespace, kserve_namespace):
    start = time.monotonic()
    port = free_port_on(host_ipv4())
    _behave(llmisvc, namespace, metrics_port=port)
    deployer = grants.grant("deploy.yaml", "deployer")
    verifier = grants.grant("verify.yaml", "verifier")
    roller = grants.grant("rollback.yaml", "roller")

    deploy = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=deployer, extra_vars=_deploy_vars(namespace, kserve_namespace))
    assert deploy.rc == 0, deploy.output
    engine = deploy.result("Check the engine-config line of every pod, per pool")
    assert engine["pools"]["decode"]["speculative_config"] == EAGLE3
    assert deploy.result("Wait for Ready at the new generation")["generation"] == 1
    # verify read the deploy's own wait (Ready at generation 1, pools rolled out) instead of waiting a second time
    assert deploy.result("Wait until Ready at the current generation").get("skipped") is True
    # the well-known presets were read (404 in both namespaces), not skipped as forbidden in KServe's namespace
    assert not [w for w in _warnings(deploy) if PRESET_WARNING in w], _warnings(deploy)
    live = _get(k8s_client, namespace, NAME)
    assert live["metadata"]["generation"] == 1
    assert "alauda-spec-decoding" in [m.get("manager") for m in live["metadata"]["managedFields"]]

    _args_from_configmap(k8s_client, namespace)
    verify = run_playbook(tmp_path, "playbooks/verify.yml", kubeconfig=verifier, extra_vars=dict(
        _common(namespace, kserve_namespace), verify_name=NAME, verify_namespace=namespace, verify_wait_timeout=60,
        verify_wait_interval=1, verify_metrics_port=port, verify_metrics_scheme="http"))
    assert verify.rc == 0, verify.output
    assert not [w for w in _warnings(verify) if PRESET_WARNING in w], _warnings(verify)
    found = verify.result("Find the speculative flag in every pool")["flags"]
    # the ConfigMap was read (an unreadable one is an `opaque` entry): only the resource's own argv flag is in effect
    assert [(f["pool"], f["source"], f.get("opaque")) for f in found] == [("decode", "resource", None)], found
    assert verify.result("Wait until Ready at the current generation")["generation"] == 2
    assert verify.result("Check the engine-config line of every pod, per pool")["pools"]["decode"]["speculative_config"] == EAGLE3
    # /metrics through the pod proxy (get on pods/proxy), as recorded
    expected = spec_metrics.summarize(spec_metrics.parse_prometheus(read_capture("eagle3", "metrics.txt")), method="eagle3")
    per_pod = verify.result("Register the full verification data")["ansible_facts"]["verify_result"]["metrics"]
    assert per_pod and all(m["mean_acceptance_length"] == expected["mean_acceptance_length"] for m in per_pod.values()), per_pod

    rollback = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=roller, extra_vars=dict(
        _common(namespace, kserve_namespace), rollback_names=["%s/%s" % (namespace, NAME)], rollback_wait_timeout=60,
        rollback_wait_sleep=1, rollback_verify_delay=1))
    assert rollback.rc == 0, rollback.output
    assert_rolled_back(rollback, k8s_client, namespace, generation=3)
    print("3 playbook runs with the documented Roles: %.1f s" % (time.monotonic() - start))


def _forbidden(msg, namespace, account, verb, resource):
    msg = str(msg).replace('\\"', '"')
    assert 'cannot %s resource "%s"' % (verb, resource) in msg and "forbidden" in msg, msg
    assert "system:serviceaccount:%s:%s" % (namespace, account) in msg, msg


def test_one_rule_removed_fails_with_a_forbidden_naming_it(kubeconfig, grants, llmisvc, k8s_client, namespace, kserve_namespace):
    """Module logic in-process, an admin-deployed LLMInferenceService: rollback.yaml without patch on
    llminferenceservices refuses the strip with the API server's message and writes nothing; verify.yaml without get on
    deployments fails the rollout wait naming it (not a traceback)."""
    start = time.monotonic()
    _behave(llmisvc, namespace)
    manifest = run_module("isvc_manifest", {"resource_kind": "LLMInferenceService", "name": NAME, "namespace": namespace,
                                            "method": "eagle3", "artifact_mode": "pvc",
                                            "artifacts": {"pvc_name": "model-store", "draft_subdir": "tiny-eagle3"},
                                            "runtime": "unused", "vllm_version": "0.32.0", "gpu_count": 0,
                                            "llmisvc": {"image": "registry.local/vllm/vllm-openai:v0.32.0"}})["manifest"]
    _api(k8s_client).create_namespaced_custom_object("serving.kserve.io", "v1alpha2", namespace, "llminferenceservices", manifest)
    ready = run_module("isvc_wait", {"kubeconfig": kubeconfig, "kind": "LLMInferenceService", "name": NAME, "namespace": namespace,
                                     "timeout": 60, "interval": 1})
    assert not ready.failed, ready.msg
    before = _get(k8s_client, namespace, NAME)

    no_patch = grants.grant("rollback.yaml", "no-patch", drop_verb=("spec-decoding-rollback", "llminferenceservices", "patch"))
    refused = run_module("llmisvc_speculative", {"kubeconfig": no_patch, "name": NAME, "namespace": namespace, "state": "absent",
                                                 "config_namespace": kserve_namespace})
    assert refused.failed
    print("rollback without patch on llminferenceservices: %s" % refused.msg[:300])
    _forbidden(refused.msg, namespace, "no-patch", "patch", "llminferenceservices")
    after = _get(k8s_client, namespace, NAME)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"] and after["spec"] == before["spec"]
    assert json.dumps(after["spec"]).count("--speculative-config") == 1

    no_deployments = grants.grant("verify.yaml", "no-deployments", drop_verb=("spec-decoding-verify", "deployments", "get"))
    waited = run_module("isvc_wait", {"kubeconfig": no_deployments, "kind": "LLMInferenceService", "name": NAME,
                                      "namespace": namespace, "timeout": 30, "interval": 1})
    assert waited.failed
    print("verify's wait without get on deployments: %s" % waited.msg[:300])
    _forbidden(waited.msg, namespace, "no-deployments", "get", "deployments")
    assert "Deployment %s/%s-kserve" % (namespace, NAME) in waited.msg
    print("removed-rule cases: %.1f s" % (time.monotonic() - start))
