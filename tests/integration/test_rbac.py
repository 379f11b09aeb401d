"""RBAC (issue 10): the least-privilege Roles shipped in docs/rbac/*.yaml, proven against the real kube-apiserver
(authorization mode RBAC) with ServiceAccount tokens bound only to them: deploy + verify + rollback succeed with
exactly those rules; with one rule removed the run fails with the API server's Forbidden message naming the verb
and the resource; without the cluster-scoped CRD reader the deploy degrades with a clear warning."""
from __future__ import annotations

import copy
import os

import pytest
import yaml

from tests.ansible_run import run_playbook
from tests.integration.test_deploy import _get, _vars, engine_log
from tests.paths import CAPTURES, REPO

RBAC_DIR = os.path.join(REPO, "docs", "rbac")
RBAC = "/apis/rbac.authorization.k8s.io/v1"
NAME = "llama-eagle3"
TARGET, DRAFT = "/mnt/models/Meta-Llama-3.1-8B-Instruct", "/mnt/models/EAGLE3-LLaMA3.1-Instruct-8B"
EAGLE3 = {"method": "eagle3", "model": DRAFT, "num_spec_tokens": 3}


def _docs(filename):
    with open(os.path.join(RBAC_DIR, filename), encoding="utf-8") as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    # each file is one `kind: List` (ansible-test yamllint wants a single document per file)
    return [item for d in docs for item in (d["items"] if d.get("kind") == "List" else [d])]


def _path(doc):
    meta = doc["metadata"]
    plural = {"Role": "roles", "RoleBinding": "rolebindings", "ClusterRole": "clusterroles",
              "ClusterRoleBinding": "clusterrolebindings"}[doc["kind"]]
    if doc["kind"].startswith("Cluster"):
        return "%s/%s" % (RBAC, plural)
    return "%s/namespaces/%s/%s" % (RBAC, meta["namespace"], plural)


class Grants:
    """Apply docs/rbac/*.yaml for one ServiceAccount of the test namespace (namespaces and the subject rewritten,
    cluster-scoped names made unique), optionally with one verb or one whole object removed; delete on close."""

    def __init__(self, controlplane, namespace, kserve_namespace):
        self.cp = controlplane
        self.namespace = namespace
        self.kserve_namespace = kserve_namespace
        self.created = []

    def grant(self, filename, account, drop_verb=None, skip_kinds=()):
        """drop_verb=(role name, resource, verb): remove that verb for that resource from that Role/ClusterRole."""
        api = self.cp.rest()
        try:
            for doc in _docs(filename):
                doc = copy.deepcopy(doc)
                if doc["kind"] in skip_kinds:
                    continue
                meta = doc["metadata"]
                if "namespace" in meta:
                    meta["namespace"] = {"models": self.namespace, "kserve": self.kserve_namespace}[meta["namespace"]]
                if doc["kind"].startswith("Cluster"):
                    meta["name"] = "%s-%s-%s" % (meta["name"], self.namespace, account)[:253]
                    if doc["kind"] == "ClusterRoleBinding":
                        doc["roleRef"]["name"] = "%s-%s-%s" % (doc["roleRef"]["name"], self.namespace, account)[:253]
                for subject in doc.get("subjects", []):
                    subject.update(namespace=self.namespace, name=account)
                if drop_verb and doc["kind"] in ("Role", "ClusterRole") and meta["name"].startswith(drop_verb[0]):
                    for rule in doc["rules"]:
                        if drop_verb[1] in rule["resources"]:
                            rule["verbs"] = [v for v in rule["verbs"] if v != drop_verb[2]]
                    doc["rules"] = [r for r in doc["rules"] if r["verbs"]]
                api.post(_path(doc), doc)
                self.created.append("%s/%s" % (_path(doc), meta["name"]))
        finally:
            api.close()
        return self.cp.kubeconfig_for_service_account(self.namespace, account)

    def close(self):
        api = self.cp.rest()
        try:
            for path in reversed(self.created):
                if "/namespaces/" not in path:
                    api.delete(path)
        finally:
            api.close()


@pytest.fixture
def kserve_namespace(controlplane, namespace):
    """A KServe namespace for this test, with the inferenceservice-config ConfigMap (Modelcar on)."""
    name = "kserve-" + namespace[-6:]
    api = controlplane.rest()
    try:
        api.post("/api/v1/namespaces", {"metadata": {"name": name}})
        api.post("/api/v1/namespaces/%s/configmaps" % name, {"metadata": {"name": "inferenceservice-config"},
                                                             "data": {"storageInitializer": '{"enableModelcar": true}'}})
        yield name
        api.delete("/api/v1/namespaces/%s" % name)
    finally:
        api.close()


@pytest.fixture
def grants(controlplane, namespace, kserve_namespace):
    holder = Grants(controlplane, namespace, kserve_namespace)
    yield holder
    holder.close()


def _baseline_log():
    with open(os.path.join(CAPTURES, "baseline", "startup.log"), encoding="utf-8") as fh:
        return fh.read()


def _deploy_vars(namespace, kserve_namespace, **more):
    return _vars(namespace, NAME, **dict({"spec_decoding_verify": True, "spec_decoding_kserve_namespace": kserve_namespace}, **more))


def _behave(kserve, namespace):
    """Generation 1 logs the EAGLE-3 engine line; later generations (after the rollback) the baseline's."""
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=_baseline_log())
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=engine_log(TARGET, DRAFT), generation=1)


def _verify_vars(namespace):
    return {"verify_name": NAME, "verify_namespace": namespace, "verify_wait_timeout": 60, "verify_wait_interval": 1}


def _rollback_vars(namespace):
    return {"rollback_names": ["%s/%s" % (namespace, NAME)], "rollback_wait_timeout": 60, "rollback_wait_sleep": 1,
            "rollback_verify_delay": 1}


def test_deploy_verify_rollback_with_only_the_documented_roles(tmp_path, grants, kserve, k8s_client, namespace, kserve_namespace):
    _behave(kserve, namespace)
    deployer = grants.grant("deploy.yaml", "deployer")
    verifier = grants.grant("verify.yaml", "verifier")
    roller = grants.grant("rollback.yaml", "roller")

    deploy = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=deployer, extra_vars=_deploy_vars(namespace, kserve_namespace))
    assert deploy.rc == 0, deploy.output
    facts = deploy.result("Read what the cluster's KServe supports")
    assert not [w for w in facts.get("warnings", []) if "CustomResourceDefinition" in w], "the CRD reader ClusterRole did not work"
    assert facts["crd_readable"] is True and facts["kserve_version"] == "0.20.0", "the CRD reader ClusterRole did not work"
    assert facts["oci_model_mode_evidence"].startswith("ConfigMap %s/inferenceservice-config key storageInitializer" % kserve_namespace), \
        "the kserve-config reader Role did not work"
    assert deploy.result("engine-config line")["speculative_config"] == EAGLE3
    # rerun: the object exists, server-side apply patches (nothing changes)
    again = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=deployer, extra_vars=_deploy_vars(namespace, kserve_namespace))
    assert again.rc == 0 and again.changed == 0, again.output

    verify = run_playbook(tmp_path, "playbooks/verify.yml", kubeconfig=verifier, extra_vars=_verify_vars(namespace))
    assert verify.rc == 0, verify.output
    assert verify.result("Check the engine-config line")["speculative_config"] == EAGLE3
    # read-only: the verifier's token cannot roll back
    refused = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=verifier, extra_vars=_rollback_vars(namespace))
    assert refused.rc != 0
    assert 'cannot patch resource "inferenceservices"' in refused.failed[-1]["msg"].replace('\\"', '"'), refused.failed[-1]["msg"]

    rollback = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=roller, extra_vars=_rollback_vars(namespace))
    assert rollback.rc == 0, rollback.output
    assert rollback.result("Prove the engine runs without a proposer")["speculative_config"] is None
    assert "--speculative-config" not in _get(k8s_client, namespace, NAME)["spec"]["predictor"]["model"]["command"][2]


# (RBAC file, (role name prefix, resource, verb) removed, playbook that needs it, expected Forbidden text)
REMOVED = [
    ("deploy-create", "deploy.yaml", ("spec-decoding-deploy", "inferenceservices", "create"), "deploy",
     'cannot create resource "inferenceservices"'),
    ("deploy-pods-log", "deploy.yaml", ("spec-decoding-deploy", "pods/log", "get"), "deploy", 'cannot get resource "pods/log"'),
    ("verify-pods-list", "verify.yaml", ("spec-decoding-verify", "pods", "list"), "verify", 'cannot list resource "pods"'),
    ("rollback-patch", "rollback.yaml", ("spec-decoding-rollback", "inferenceservices", "patch"), "rollback",
     'cannot patch resource "inferenceservices"'),
]


@pytest.mark.parametrize("filename,drop,step,forbidden", [r[1:] for r in REMOVED], ids=[r[0] for r in REMOVED])
def test_one_rule_removed_fails_with_a_forbidden_naming_it(tmp_path, grants, kserve, kubeconfig, k8s_client, namespace, kserve_namespace,
                                                           filename, drop, step, forbidden):
    _behave(kserve, namespace)
    limited = grants.grant(filename, "limited", drop_verb=drop)
    if step != "deploy":  # the object exists (deployed by an admin)
        assert run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig,
                            extra_vars=_deploy_vars(namespace, kserve_namespace, spec_decoding_verify=False)).rc == 0
    before = _get(k8s_client, namespace, NAME)
    playbook, extra = {"deploy": ("playbooks/deploy-eagle3.yml", _deploy_vars(namespace, kserve_namespace)),
                       "verify": ("playbooks/verify.yml", _verify_vars(namespace)),
                       "rollback": ("playbooks/rollback.yml", _rollback_vars(namespace))}[step]
    run = run_playbook(tmp_path, playbook, kubeconfig=limited, extra_vars=extra)
    assert run.rc != 0
    msg = str(run.failed[-1].get("msg")).replace('\\"', '"')  # kubernetes.core quotes the API server's JSON Status
    print("%s without %s %s: %s" % (step, drop[2], drop[1], msg[:300]))
    assert forbidden in msg and "forbidden" in msg.lower() and "system:serviceaccount:%s:limited" % namespace in msg, msg
    after = _get(k8s_client, namespace, NAME)
    if step == "rollback":  # nothing half-done
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_deploy_without_the_crd_reader_warns_and_assumes_the_release(tmp_path, grants, kserve, k8s_client, namespace, kserve_namespace):
    _behave(kserve, namespace)
    deployer = grants.grant("deploy.yaml", "no-crd", skip_kinds=("ClusterRole", "ClusterRoleBinding"))
    extra = _deploy_vars(namespace, kserve_namespace, spec_decoding_artifact_mode="auto",
                         spec_decoding_artifacts={"target_uri": "pvc://m/llama", "draft_uri": "pvc://m/eagle", "pvc_name": "m"},
                         spec_decoding_verify=False)
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=deployer, extra_vars=extra)
    assert run.rc == 0, run.output
    (warning,) = [w for w in run.result("Read what the cluster's KServe supports").get("warnings", []) if "CustomResourceDefinition" in w]
    print(warning)
    assert "403 Forbidden" in warning and "spec-decoding-kserve-crd-reader" in warning and "spec_decoding_kserve_version" in warning
    rendered = run.result("Render the InferenceService")
    assert rendered["artifact_mode"] == "storage_uris"  # auto mode on the assumed KServe 0.20
    # the warning above names the assumption; the render does not add that there was no cluster to read (issue #48)
    assert not [w for w in rendered.get("warnings", []) if "no cluster to read it from" in w], rendered.get("warnings")
    assert _get(k8s_client, namespace, NAME)["spec"]["predictor"]["storageUris"][0]["uri"] == "pvc://m/llama"
