"""Who owns a serving object, against the real kube-apiserver with the real Argo CD v3.5.1 and Flux v1.9.x CRDs
(tests/testbed/gitops_fixtures.py's `gitops_crds`): the refusal of a live rollback of an object Argo CD or Flux syncs
(nothing written), the override, gitops_owner_info's reads of the owner objects, and the owner that RBAC hides.

No GitOps controller runs here: the owner objects are written as Argo CD and Flux leave them (the Application's status
with the object, it has no status subresource; the Kustomization's and GitRepository's through /status), so what is
tested is the reading. The stand-ins' syncs are the rollback modes' tests.
"""
from __future__ import annotations

import copy
import os

import pytest
import yaml

from tests.module_run import run_module
from tests.paths import REPO

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
NAME = "llama31-8b-eagle3"
APP = "llm-serving"
SHA = "4f1c2d0e9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e"
OTHER_SHA = "0123456789abcdef0123456789abcdef01234567"
REPO_URL = "https://git.example.com/platform/serving.git"
DATA = os.path.join(REPO, "tests", "unit", "plugins", "module_utils", "data", "rollback")


def _isvc_path(namespace, name=NAME):
    return "/apis/%s/%s/namespaces/%s/%s/%s" % (GROUP, VERSION, namespace, PLURAL, name)


def _create_isvc(api, namespace, labels=None, annotations=None, field_manager="argocd-controller", manifest="guide_example2_eagle3.yaml"):
    """The guide's EAGLE-3 InferenceService (or `manifest`), server-side applied as the owner's controller applies it."""
    with open(os.path.join(DATA, manifest), encoding="utf-8") as fh:
        obj = yaml.safe_load(fh)
    obj["metadata"]["namespace"] = namespace
    obj["metadata"].setdefault("labels", {}).update(labels or {})
    obj["metadata"].setdefault("annotations", {}).update(annotations or {})
    return api.request("PATCH", _isvc_path(namespace), obj, query={"fieldManager": field_manager, "force": "true"},
                       content_type="application/apply-patch+yaml")


def _application(namespace, automated=None):
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": APP, "namespace": namespace},
            "spec": {"project": "default", "source": {"repoURL": REPO_URL, "path": "models/llama", "targetRevision": "main"},
                     "destination": {"server": "https://kubernetes.default.svc", "namespace": namespace},
                     "syncPolicy": {"automated": automated if automated is not None else {"prune": False, "selfHeal": True}}},
            # the Application CRD has no status subresource: Argo CD writes status with the object
            "status": {"sync": {"status": "Synced", "revision": SHA}, "health": {"status": "Healthy"},
                       "operationState": {"phase": "Succeeded", "message": "successfully synced (all tasks run)",
                                          "operation": {"sync": {"revision": SHA}, "initiatedBy": {"automated": True}},
                                          "startedAt": "2026-12-05T12:00:00Z", "finishedAt": "2026-12-05T12:00:01Z",
                                          "syncResult": {"revision": SHA, "source": {"repoURL": REPO_URL, "path": "models/llama",
                                                                                     "targetRevision": "main"}}}}}


@pytest.fixture
def api(controlplane):
    client = controlplane.rest()
    yield client
    client.close()


def _argo(api, namespace, manifest="guide_example2_eagle3.yaml"):
    """An Application outside the control-plane namespace (tracking id "<namespace>_<app>", so no Argo CD stand-in of the
    session syncs it) and the InferenceService it tracks."""
    api.post("/apis/argoproj.io/v1alpha1/namespaces/%s/applications" % namespace, _application(namespace))
    tracking = "%s_%s:serving.kserve.io/InferenceService:%s/%s" % (namespace, APP, namespace, NAME)
    return _create_isvc(api, namespace, annotations={"argocd.argoproj.io/tracking-id": tracking}, manifest=manifest)


@pytest.fixture
def argo_isvc(api, namespace, gitops_crds):  # pylint: disable=redefined-outer-name,unused-argument
    return _argo(api, namespace)


@pytest.fixture
def flux_isvc(api, namespace, gitops_crds):  # pylint: disable=redefined-outer-name,unused-argument
    """A Kustomization and its GitRepository as kustomize-controller and source-controller leave them, and the
    InferenceService the Kustomization applied (its owner labels, field manager kustomize-controller)."""
    base = "/apis/source.toolkit.fluxcd.io/v1/namespaces/%s/gitrepositories" % namespace
    api.post(base, {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "metadata": {"name": "serving"},
                    "spec": {"interval": "1m", "url": "ssh://git@git.example.com/platform/serving.git", "ref": {"branch": "main"}}})
    repo = api.get(base + "/serving")
    repo["status"] = {"artifact": {"revision": "main@sha1:" + OTHER_SHA, "digest": "sha256:" + "a" * 64, "path": "x", "url": "http://x",
                                   "lastUpdateTime": "2026-12-05T12:00:00Z"}}
    api.put(base + "/serving/status", repo)
    base = "/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/%s/kustomizations" % namespace
    api.post(base, {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization", "metadata": {"name": "apps"},
                    "spec": {"interval": "10m", "path": "./clusters/prod/models", "prune": True,
                             "sourceRef": {"kind": "GitRepository", "name": "serving"}}})
    ks = api.get(base + "/apps")
    ks["status"] = {"lastAppliedRevision": "main@sha1:" + SHA, "lastAttemptedRevision": "main@sha1:" + SHA,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "ReconciliationSucceeded",
                                    "message": "Applied revision: main@sha1:" + SHA, "lastTransitionTime": "2026-12-05T12:00:00Z"}]}
    api.put(base + "/apps/status", ks)
    return _create_isvc(api, namespace, labels={"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": namespace},
                        field_manager="kustomize-controller")


def _written(obj):
    """What a write of the collection would change: the generation, spec, annotations and labels (the KServe stand-in's
    status writes move resourceVersion on their own)."""
    meta = obj["metadata"]
    return meta["generation"], obj["spec"], meta.get("annotations"), meta.get("labels")


def _strip(kubeconfig, namespace, **more):
    return run_module("isvc_speculative", dict({"name": NAME, "namespace": namespace, "state": "absent", "kubeconfig": kubeconfig}, **more))


def test_argo_tracked_rollback_is_refused_with_nothing_written(kubeconfig, api, namespace, argo_isvc):
    before = _written(api.get(_isvc_path(namespace)))
    for check_mode in (True, False):
        result = run_module("isvc_speculative", {"name": NAME, "namespace": namespace, "state": "absent", "kubeconfig": kubeconfig},
                            check_mode=check_mode)
        assert result.failed and result["field"] == "gitops_owner" and result["changed"] is False
        assert result.msg.startswith("gitops_owner: Argo CD Application %s/%s (automated, selfHeal) syncs InferenceService %s/%s from "
                                     "%s models/llama@%s: a live patch is undone at its next sync; nothing was written"
                                     % (namespace, APP, namespace, NAME, REPO_URL, SHA)), result.msg
        assert "rollback_mode: git" in result["fix"] and "rollback_mode: emergency" in result["fix"]
        assert "gitops_owner: ignore" in result["fix"]
    after = api.get(_isvc_path(namespace))
    assert _written(after) == before
    assert "--speculative-config" in after["spec"]["predictor"]["model"]["command"][2]


def test_argo_tracked_rollback_with_ignore_goes_through_with_a_warning(kubeconfig, api, namespace, argo_isvc):
    result = _strip(kubeconfig, namespace, gitops_owner="ignore")
    assert not result.failed, result.msg
    assert result["changed"] is True and result["previous_config"]["method"] == "eagle3"
    assert any(w.startswith("gitops_owner=ignore: Argo CD Application %s/%s (automated, selfHeal) syncs" % (namespace, APP))
               for w in result.warning_messages), result.warning_messages
    assert "--speculative-config" not in api.get(_isvc_path(namespace))["spec"]["predictor"]["model"]["command"][2]


# pylint: disable-next=redefined-outer-name,unused-argument
def test_argo_tracked_canary_step_is_refused_with_nothing_written(kubeconfig, api, namespace, gitops_crds):
    baseline = _argo(api, namespace, manifest="guide_example2_eagle3.rolled_back.yaml")
    result = run_module("canary_rollout", {"name": NAME, "namespace": namespace, "state": "present", "percent": 10, "kserve_version": "v0.20.0",
                                           "speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
                                           "wait": False, "kubeconfig": kubeconfig})
    assert result.failed and result.msg.startswith("gitops_owner: Argo CD Application %s/%s (automated, selfHeal) syncs InferenceService"
                                                   % (namespace, APP)), result.msg
    assert _written(api.get(_isvc_path(namespace))) == _written(baseline)


def test_edit_runtime_of_a_flux_runtime_is_refused(kubeconfig, api, namespace):
    """edit_runtime patches the shared ServingRuntime: its own owner is checked as well (the InferenceService has none)."""
    rt = "/apis/serving.kserve.io/v1alpha1/namespaces/%s/servingruntimes" % namespace
    flag = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}']
    api.post(rt, {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime",
                  "metadata": {"name": "shared", "labels": {"kustomize.toolkit.fluxcd.io/name": "runtimes",
                                                            "kustomize.toolkit.fluxcd.io/namespace": "flux-system"}},
                  "spec": {"supportedModelFormats": [{"name": "vLLM", "autoSelect": True}],
                           "containers": [{"name": "kserve-container", "image": "vllm/vllm-openai:v0.11.2",
                                           "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                                           "args": ["--port=8080", "--model=/mnt/models"] + flag}]}})
    api.post("/apis/%s/%s/namespaces/%s/%s" % (GROUP, VERSION, namespace, PLURAL), {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": "b", "annotations": {"serving.kserve.io/deploymentMode": "Standard"}},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "vLLM"}, "runtime": "shared", "storageUri": "pvc://model-store/llama",
                                         "args": ["--seed=1"]}}}})
    before = api.get(rt + "/shared")["metadata"]["resourceVersion"]
    result = _strip(kubeconfig, namespace, name="b", edit_runtime=True)
    assert result.failed and result.msg.startswith("gitops_owner: Flux Kustomization flux-system/runtimes (policy unknown: 404 Not Found"), result.msg
    assert "syncs ServingRuntime shared" in result.msg
    assert api.get(rt + "/shared")["metadata"]["resourceVersion"] == before


def test_owner_info_reads_the_application(kubeconfig, namespace, argo_isvc):
    args = {"name": NAME, "namespace": namespace, "kubeconfig": kubeconfig}
    result = run_module("gitops_owner_info", args)
    assert not result.failed, result.msg
    owner = result["owner"]
    assert result["managed"] is True and result["resource_generation"] == argo_isvc["metadata"]["generation"]
    assert (owner["kind"], owner["namespace"], owner["name"], owner["readable"]) == ("argocd", namespace, APP, True)
    assert owner["sync"] == {"automated": True, "self_heal": True, "prune": False, "suspended": False, "interval": None}
    assert owner["source"]["repo_url"] == REPO_URL and owner["source"]["path"] == "models/llama" and owner["source"]["revision"] == "main"
    assert owner["synced_revision"] == SHA and owner["field_managers"] == ["argocd-controller"]
    synced = run_module("gitops_owner_info", dict(args, revision=SHA, wait=True, wait_timeout=5))
    assert synced["revision_synced"] is True and synced["elapsed"] == 0
    late = run_module("gitops_owner_info", dict(args, revision=OTHER_SHA, wait=True, wait_timeout=2, wait_sleep=1))
    assert late.failed and late["field"] == "wait_timeout"
    assert "has not synced commit %s after 2s; its last status: sync Synced at revision %s" % (OTHER_SHA, SHA) in late.msg


def test_flux_labelled_rollback_is_refused_and_owner_info_reads_kustomization_and_source(kubeconfig, api, namespace, flux_isvc):
    before = _written(flux_isvc)
    result = _strip(kubeconfig, namespace)
    assert result.failed and result.msg.startswith(
        "gitops_owner: Flux Kustomization %s/apps (interval 10m, corrects drift) syncs InferenceService %s/%s from "
        "ssh://git@git.example.com/platform/serving.git ./clusters/prod/models@%s: a live patch is undone at its next sync"
        % (namespace, namespace, NAME, SHA)), result.msg
    assert _written(api.get(_isvc_path(namespace))) == before
    info = run_module("gitops_owner_info", {"name": NAME, "namespace": namespace, "kubeconfig": kubeconfig})
    owner = info["owner"]
    assert (owner["kind"], owner["name"], owner["readable"], owner["read_error"]) == ("flux", "apps", True, None)
    assert owner["sync"] == {"automated": True, "self_heal": True, "prune": True, "suspended": False, "interval": "10m"}
    assert owner["source"] == {"repo_url": "ssh://git@git.example.com/platform/serving.git", "revision": "main",
                               "path": "./clusters/prod/models", "source_kind": "GitRepository", "source_name": "serving",
                               "source_namespace": namespace}
    assert (owner["synced_revision"], owner["fetched_revision"]) == (SHA, OTHER_SHA)
    fetched = run_module("gitops_owner_info", {"name": NAME, "namespace": namespace, "kubeconfig": kubeconfig, "revision": OTHER_SHA,
                                               "fetched": True, "wait": True, "wait_timeout": 5})
    assert fetched["revision_synced"] is True


def _role(api, namespace, name, rules, account):
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/%s" % namespace
    api.post(rbac + "/roles", {"metadata": {"name": name}, "rules": rules})
    api.post(rbac + "/rolebindings", {"metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                                      "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]})


def _reader_rules():
    """The rules of docs/rbac/gitops-owner-reader.yaml's reader ClusterRole, as shipped."""
    with open(os.path.join(REPO, "docs", "rbac", "gitops-owner-reader.yaml"), encoding="utf-8") as fh:
        items = yaml.safe_load(fh)["items"]
    return copy.deepcopy(next(i for i in items if i["metadata"]["name"] == "spec-decoding-gitops-owner-reader" and i["kind"] == "ClusterRole")["rules"])


def test_owner_behind_rbac_is_unreadable_then_read_with_the_shipped_rules(controlplane, api, namespace, argo_isvc):
    _role(api, namespace, "isvc-only", [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get"]}], "owner-reader")
    kubeconfig = controlplane.kubeconfig_for_service_account(namespace, "owner-reader")
    args = {"name": NAME, "namespace": namespace, "kubeconfig": kubeconfig}
    result = run_module("gitops_owner_info", args)
    assert not result.failed, result.msg
    owner = result["owner"]
    assert owner["kind"] == "argocd" and owner["readable"] is False and owner["source"] is None
    assert owner["read_error"].startswith("403 Forbidden: cannot get Application %s/%s" % (namespace, APP))
    assert 'cannot get resource "applications" in API group "argoproj.io"' in owner["read_error"]
    assert owner["read_error"].endswith("(add the RBAC in docs/rbac/gitops-owner-reader.yaml)")
    # the refusal does not depend on reading the owner
    refused = _strip(kubeconfig, namespace)
    assert refused.failed and "Argo CD Application %s/%s (policy unknown: 403 Forbidden" % (namespace, APP) in refused.msg
    _role(api, namespace, "gitops-owner-reader", _reader_rules(), "owner-reader")
    owner = run_module("gitops_owner_info", args)["owner"]
    assert owner["readable"] is True and owner["sync"]["self_heal"] is True


# pylint: disable-next=redefined-outer-name,unused-argument
def test_verify_summary_names_the_owner(tmp_path, kubeconfig, kserve, api, namespace, gitops_crds):
    """The verify role's one gitops_owner_info call: its summary ends with the owner, its policy and source."""
    from tests.ansible_run import run_playbook  # pylint: disable=import-outside-toplevel
    from tests.paths import read_capture  # pylint: disable=import-outside-toplevel
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=read_capture("baseline", "startup.log"), generation=1)
    _argo(api, namespace, manifest="guide_example2_eagle3.rolled_back.yaml")
    run = run_playbook(tmp_path, "playbooks/verify.yml", kubeconfig=kubeconfig,
                       extra_vars={"verify_name": NAME, "verify_namespace": namespace, "verify_wait_timeout": 60,
                                   "verify_wait_interval": 1, "verify_speculative": False})
    assert run.rc == 0, run.output
    summary = run.result("Summary")["msg"]
    assert summary[-1] == "owner: Argo CD Application %s/%s (automated, selfHeal) from %s models/llama@%s" % (namespace, APP, REPO_URL, SHA), summary
    facts = run.result("Register the full verification data")["ansible_facts"]["verify_result"]
    assert facts["owner"]["kind"] == "argocd" and facts["owner"]["readable"] is True


# pylint: disable-next=redefined-outer-name,unused-argument
def test_argo_tracked_llmisvc_strip_is_refused_with_nothing_written(kubeconfig, api, llmisvc, namespace, gitops_crds):
    api.post("/apis/argoproj.io/v1alpha1/namespaces/%s/applications" % namespace, _application(namespace))
    path = "/apis/serving.kserve.io/v1alpha2/namespaces/%s/llminferenceservices" % namespace
    spec = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}'
    created = api.post(path, {
        "apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
        "metadata": {"name": "llm", "annotations": {
            "argocd.argoproj.io/tracking-id": "%s_%s:serving.kserve.io/LLMInferenceService:%s/llm" % (namespace, APP, namespace)}},
        "spec": {"model": {"uri": "pvc://m/", "name": "llm"}, "replicas": 1,
                 "template": {"containers": [{"name": "main", "image": "registry.local/vllm:v0.32.0",
                                              "command": ["vllm", "serve", "/mnt/models", "--speculative-config", spec]}]}}})
    result = run_module("llmisvc_speculative", {"kubeconfig": kubeconfig, "name": "llm", "namespace": namespace, "state": "absent"})
    assert result.failed and result.msg.startswith("gitops_owner: Argo CD Application %s/%s (automated, selfHeal) syncs LLMInferenceService %s/llm"
                                                   % (namespace, APP, namespace)), result.msg
    now = api.get(path + "/llm")
    assert now["metadata"]["generation"] == 1 and now["spec"] == created["spec"]
    assert "alauda-spec-decoding-rollback" not in [m.get("manager") for m in now["metadata"].get("managedFields") or []]
    # query (the default state) reads and never refuses
    assert not run_module("llmisvc_speculative", {"kubeconfig": kubeconfig, "name": "llm", "namespace": namespace}).failed


def test_rollback_role_passes_the_refusal(tmp_path, kubeconfig, api, namespace, argo_isvc):
    """playbooks/rollback.yml (live mode, the default): the role's rollback_gitops_owner reaches isvc_speculative."""
    from tests.ansible_run import run_playbook  # pylint: disable=import-outside-toplevel
    run = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig,
                       extra_vars={"rollback_names": ["%s/%s" % (namespace, NAME)], "rollback_wait_timeout": 60})
    assert run.rc != 0
    msg = run.result("Strip the speculative config")["msg"]
    assert msg.startswith("gitops_owner: Argo CD Application %s/%s (automated, selfHeal) syncs InferenceService" % (namespace, APP)), msg
    assert _written(api.get(_isvc_path(namespace))) == _written(argo_isvc)
