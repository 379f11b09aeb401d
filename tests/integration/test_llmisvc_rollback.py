"""LLMInferenceService rollback gaps on the test bed (real kube-apiserver, the real LLMInferenceService CRD, the llmisvc
controller stand-in): a flag from one of KServe's well-known presets, a baseRefs preset's flag hidden under the
resource's own (KServe's merge ignores an empty value, so emptying the resource's would bring it back), VLLM_ADDITIONAL_ARGS
through valueFrom, and the draft's removal after the rollback (rollback.yml, role wiring), keeping a draft another
resource still uses.

Presets and ConfigMaps are created through the API in the test's namespace (KServe's controller looks a well-known
preset up in the resource's namespace before its system namespace), never in `kserve`: other files share the control
plane. The stand-in merges baseRefs only, so a well-known preset's flag never reaches its pods; what is tested here is
that the rollback sees it and refuses before writing.
"""
from __future__ import annotations

import copy
import json
import os
import time

from tests.ansible_run import run_playbook
from tests.integration.test_stage_pvc import StagerPod, _batch, _core, _write_model
from tests.module_run import run_module
from tests.paths import read_capture
from tests.unit.plugins.module_utils.test_llmisvc_presets import _fix

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import artifact_sync
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command

GROUP, VERSION, PLURAL, CONFIGS = "serving.kserve.io", "v1alpha2", "llminferenceservices", "llminferenceserviceconfigs"
SPEC = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}'
STAGED, REMOVED = "spec-decoding.alauda.io/staged", "spec-decoding.alauda.io/draft-removed"
PVC = "model-store"
JOB_IMAGE = "registry.internal.example/vllm/vllm-openai:v0.32.0"


def _api(k8s_client):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.CustomObjectsApi(k8s_client)


def _get(k8s_client, namespace, name):
    return _api(k8s_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def _create(k8s_client, namespace, name, container, uri="pvc://m/", **spec):
    body = {"apiVersion": "%s/%s" % (GROUP, VERSION), "kind": "LLMInferenceService", "metadata": {"name": name},
            "spec": dict({"model": {"uri": uri, "name": name}, "replicas": 1,
                          "template": {"containers": [dict({"name": "main", "image": "registry.local/vllm:v0.32.0"}, **container)]}},
                         **spec)}
    return _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def _untouched(k8s_client, namespace, created):
    """Nothing written: same spec and generation, and the rollback's field manager never touched it (the stand-in's
    finalizer and status writes change the resourceVersion)."""
    now = _get(k8s_client, namespace, created["metadata"]["name"])
    assert now["metadata"]["generation"] == 1 and now["spec"] == created["spec"]
    assert "alauda-spec-decoding-rollback" not in [m.get("manager") for m in now["metadata"].get("managedFields") or []]


def _strip(kubeconfig, namespace, name, **extra):
    return run_module("llmisvc_speculative", dict({"kubeconfig": kubeconfig, "name": name, "namespace": namespace,
                                                   "state": "absent"}, **extra))


def test_a_flag_from_a_well_known_preset_is_refused_naming_it_and_nothing_is_written(kubeconfig, k8s_client, llmisvc, namespace):
    # KServe's config-llm-template.yaml, as an admin extended it in this namespace (it wins over kserve's own copy)
    preset = {"apiVersion": "%s/%s" % (GROUP, VERSION), "kind": "LLMInferenceServiceConfig",
              "metadata": {"name": "kserve-config-llm-template"},
              "spec": {"template": {"containers": [{"name": "main", "command": ["vllm", "serve", "/mnt/models"],
                                                    "args": ["--port", "8000", "--speculative-config", SPEC]}]}}}
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, CONFIGS, preset)
    live = _create(k8s_client, namespace, "wk", {"env": [{"name": "HOME", "value": "/home"}]})
    found = run_module("llmisvc_speculative", {"kubeconfig": kubeconfig, "name": "wk", "namespace": namespace})
    assert not found.failed, found.msg
    assert [(f["pool"], f["source"], f["preset"], f["preset_namespace"]) for f in found["flags"]] == [
        ("decode", "LLMInferenceServiceConfig/kserve-config-llm-template", "well-known", namespace)]
    assert found["previous_config"]["decode"] == json.loads(SPEC)
    refused = _strip(kubeconfig, namespace, "wk")
    assert refused.failed and refused["field"] == "spec.template", refused.msg
    assert "%s/kserve-config-llm-template" % namespace in refused.msg and "well-known preset" in refused.msg
    _untouched(k8s_client, namespace, live)
    # the same preset no longer applies once the resource has a prefill pool (the controller then merges the
    # decode/prefill templates, absent here): the flag search follows the shape, and the strip has nothing to do
    _create(k8s_client, namespace, "pd", {"env": [{"name": "HOME", "value": "/home"}]},
            prefill={"replicas": 1, "template": {"containers": [{"name": "main", "image": "i"}]}})
    pd = _strip(kubeconfig, namespace, "pd")
    assert not pd.failed and pd["flags"] == [] and not pd["changed"], pd.msg


def _main_of_deployment(k8s_client, namespace, name, generation, timeout=60):
    """The main container of the pods the stand-in's Deployment runs (presets merged as KServe merges them), once the
    stand-in reconciled the given generation of the LLMInferenceService (it writes the Deployment first, then the status)."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    deadline = time.monotonic() + timeout
    while (_get(k8s_client, namespace, name).get("status") or {}).get("observedGeneration") != generation:
        assert time.monotonic() < deadline, "%s/%s generation %s not reconciled" % (namespace, name, generation)
        time.sleep(0.2)
    template = client.AppsV1Api(k8s_client).read_namespaced_deployment(name + "-kserve", namespace).to_dict()["spec"]["template"]
    return next(c for c in template["spec"]["containers"] if c["name"] == "main")


def _additional_args(container):
    return [e["value"] for e in container.get("env") or [] if e["name"] == "VLLM_ADDITIONAL_ARGS"]


def test_a_preset_flag_under_the_resources_own_is_refused_with_a_fix_that_works(kubeconfig, k8s_client, llmisvc, namespace):
    """Both the resource and its baseRefs preset carry the flag in VLLM_ADDITIONAL_ARGS. Emptying the resource's value
    would report success while KServe's merge (an empty value never overrides) runs the preset's flag again: the rollback
    refuses and writes nothing, and the fix it gives, applied, leaves no flag in what the stand-in runs."""
    flag = "--speculative-config '%s'" % SPEC
    preset = {"apiVersion": "%s/%s" % (GROUP, VERSION), "kind": "LLMInferenceServiceConfig", "metadata": {"name": "spec-args"},
              "spec": {"template": {"containers": [{"name": "main", "env": [{"name": "VLLM_ADDITIONAL_ARGS", "value": flag}]}]}}}
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, CONFIGS, preset)
    llmisvc.set_behaviour(namespace, "both", ready_after=0.1)
    script = 'eval "vllm serve /mnt/models --port 8000 ${VLLM_ADDITIONAL_ARGS}"'
    _create(k8s_client, namespace, "both", {"command": ["/bin/bash", "-c", script],
                                            "env": [{"name": "VLLM_ADDITIONAL_ARGS", "value": flag}]}, baseRefs=[{"name": "spec-args"}])
    ready = run_module("isvc_wait", {"kubeconfig": kubeconfig, "kind": "LLMInferenceService", "name": "both",
                                     "namespace": namespace, "timeout": 60, "interval": 1})
    assert not ready.failed, ready.msg
    assert _additional_args(_main_of_deployment(k8s_client, namespace, "both", 1)) == [flag]
    before = _get(k8s_client, namespace, "both")

    refused = _strip(kubeconfig, namespace, "both")
    assert refused.failed and refused["field"] == "spec.template.containers[main].env[VLLM_ADDITIONAL_ARGS]", refused.msg
    assert "does not let an empty value" in refused.msg and "%s/spec-args" % namespace in refused.msg, refused.msg
    after = _get(k8s_client, namespace, "both")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    _untouched(k8s_client, namespace, before)

    # what the old advice amounted to (the resource's value emptied): the stand-in, merging as KServe, runs the preset's
    # flag, and the rollback names the preset
    def set_value(value):
        container = copy.deepcopy(_get(k8s_client, namespace, "both")["spec"]["template"]["containers"][0])
        container["env"] = [dict({"name": "VLLM_ADDITIONAL_ARGS"}, **({} if value is None else {"value": value}))]
        _api(k8s_client).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "both",
                                                        {"spec": {"template": {"containers": [container]}}},
                                                        _content_type="application/merge-patch+json")
    # the variable without a value: to KServe's Go types the same as value "" (which the test bed's kube-apiserver 1.20
    # refuses for this CRD, as null)
    set_value(None)
    assert _additional_args(_main_of_deployment(k8s_client, namespace, "both", 2)) == [flag]
    emptied = _strip(kubeconfig, namespace, "both")
    assert emptied.failed and emptied["field"] == "spec.baseRefs" and "spec-args" in emptied.msg, emptied.msg

    # the fix the refusal gave: the value it names, set on the resource
    fixed = _fix(refused["fix"])["spec"]["template"]["containers"][0]
    assert fixed["env"] == [{"name": "VLLM_ADDITIONAL_ARGS", "value": " "}]
    set_value(fixed["env"][0]["value"])
    runs = _main_of_deployment(k8s_client, namespace, "both", 3)
    assert _additional_args(runs) == [" "] and not vllm_command.script_occurrences(" ".join(_additional_args(runs)))
    assert vllm_command.find_speculative_config(runs["command"]) is None
    found = run_module("llmisvc_speculative", {"kubeconfig": kubeconfig, "name": "both", "namespace": namespace})
    assert not found.failed and found["flags"] == [], found.msg
    clean = _strip(kubeconfig, namespace, "both")
    assert not clean.failed and not clean["changed"] and clean["flags"] == [], clean.msg


def test_additional_args_from_a_configmap_or_a_secret_is_refused_naming_the_source(kubeconfig, k8s_client, llmisvc, namespace):
    args = "--max-num-seqs 8 --speculative-config '%s'" % SPEC
    _core(k8s_client).create_namespaced_config_map(namespace, {"metadata": {"name": "vllm-args"}, "data": {"extra": args}})
    script = 'eval "vllm serve /mnt/models --port 8000 ${VLLM_ADDITIONAL_ARGS}"'
    env = {"name": "VLLM_ADDITIONAL_ARGS", "valueFrom": {"configMapKeyRef": {"name": "vllm-args", "key": "extra"}}}
    live = _create(k8s_client, namespace, "cm", {"command": ["/bin/bash", "-c", script], "env": [env]})
    found = run_module("llmisvc_speculative", {"kubeconfig": kubeconfig, "name": "cm", "namespace": namespace})
    assert [(f["source"], f["forms"], f["value_from"]["name"], f["config"]) for f in found["flags"]] == [
        ("resource", ["env_configmap"], "vllm-args", json.loads(SPEC))]
    refused = _strip(kubeconfig, namespace, "cm")
    assert refused.failed and refused["field"] == "spec.template.containers[main].env[VLLM_ADDITIONAL_ARGS]", refused.msg
    assert "VLLM_ADDITIONAL_ARGS" in refused.msg and "ConfigMap vllm-args key extra" in refused.msg
    assert "kubectl edit configmap vllm-args" in refused.msg and "with value" in refused.msg
    _untouched(k8s_client, namespace, live)
    # once the ConfigMap holds no flag there is nothing left to strip
    _core(k8s_client).patch_namespaced_config_map("vllm-args", namespace, {"data": {"extra": "--max-num-seqs 8"}})
    clean = _strip(kubeconfig, namespace, "cm")
    assert not clean.failed and not clean["changed"] and clean["flags"] == [], clean.msg

    # a Secret is never read: refused unless the user vouches for it, and then only the resource's own flag goes
    secret = {"name": "VLLM_ADDITIONAL_ARGS", "valueFrom": {"secretKeyRef": {"name": "vllm-secret", "key": "extra"}}}
    _create(k8s_client, namespace, "sec", {"command": ["vllm", "serve", "/mnt/models"], "args": ["--speculative-config", SPEC],
                                           "env": [secret]})
    refused = _strip(kubeconfig, namespace, "sec")
    assert refused.failed and "Secret vllm-secret key extra" in refused.msg and "secret_env_has_no_flag" in refused.msg
    assert _get(k8s_client, namespace, "sec")["metadata"]["generation"] == 1
    vouched = _strip(kubeconfig, namespace, "sec", secret_env_has_no_flag=True)
    assert not vouched.failed and vouched["changed"], vouched.msg
    container = _get(k8s_client, namespace, "sec")["spec"]["template"]["containers"][0]
    assert container["args"] == [] and container["env"] == [secret]


def _render(namespace, name, draft_subdir):
    out = run_module("isvc_manifest", {"resource_kind": "LLMInferenceService", "name": name, "namespace": namespace,
                                       "method": "eagle3", "artifact_mode": "pvc",
                                       "artifacts": {"pvc_name": PVC, "draft_subdir": draft_subdir},
                                       "runtime": "unused", "vllm_version": "0.32.0", "gpu_count": 0,
                                       "llmisvc": {"image": "registry.local/vllm/vllm-openai:v0.32.0"}})
    assert not out.failed, out.msg
    return out["manifest"]


def test_rollback_removes_the_draft_and_keeps_one_another_resource_still_uses(tmp_path, kubeconfig, k8s_client, kubelet, llmisvc,
                                                                              namespace):
    """rollback.yml on two LLMInferenceServices on one PVC: `kept`'s draft is also the model of `user` (kept, with a
    warning), `freed`'s draft is used by nobody (removed by the remover Job once the rollback is proven)."""
    root = tmp_path / "pvc"
    staged = {}
    for seed, subdir in enumerate(("target", "tiny-eagle3", "free-draft")):
        src = _write_model(str(tmp_path / ("src-" + subdir)), seed=seed, shards=1, mib=1)
        summary = artifact_sync.Syncer(artifact_sync.LocalSource(src), str(root / subdir), name=subdir, fsync=False).run()
        staged[subdir] = {"name": subdir, "tree_sha256": summary["tree_sha256"]}
    _core(k8s_client).create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": PVC, "annotations": {STAGED: json.dumps(staged, sort_keys=True)}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    eagle3, baseline = read_capture("eagle3", "startup.log"), read_capture("baseline", "startup.log")
    for name, draft in (("kept", "tiny-eagle3"), ("freed", "free-draft")):
        llmisvc.set_behaviour(namespace, name, ready_after=0.1, logs={"main": baseline})
        llmisvc.set_behaviour(namespace, name, generation=1, ready_after=0.1, logs={"main": eagle3})
        _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _render(namespace, name, draft))
    # another LLMInferenceService serves the draft of `kept` as its model
    _create(k8s_client, namespace, "user", {"command": ["vllm", "serve", "/mnt/models"]}, uri="pvc://%s/tiny-eagle3" % PVC)

    extra = {"spec_decoding_resource_kind": "LLMInferenceService", "rollback_names": ["%s/kept" % namespace, "%s/freed" % namespace],
             "rollback_wait_timeout": 60, "rollback_wait_sleep": 1, "rollback_verify_delay": 1,
             "rollback_remove_draft_artifacts": True, "rollback_draft_job_poll_interval": 1, "rollback_draft_job_timeout": 60,
             "rollback_draft_job_image": JOB_IMAGE}
    with StagerPod(k8s_client, kubelet, namespace, str(root)) as pod:
        run = run_playbook(tmp_path, "playbooks/rollback.yml", extra_vars=extra, kubeconfig=kubeconfig, timeout=300)
    assert run.rc == 0, run.output
    drafts = {res["draft_path"]: res for name, _h, res in run.tasks if "Remove the draft (storageUris" in name}
    assert sorted(drafts) == ["/mnt/models/free-draft", "/mnt/models/tiny-eagle3"], (list(drafts.values()), run.output)
    kept, freed = drafts["/mnt/models/tiny-eagle3"], drafts["/mnt/models/free-draft"]
    assert kept["mode"] == "pvc" and kept["run_job"] is False and kept["kept"] is True
    assert kept["still_used_by"] == ["LLMInferenceService %s/user (mounts pvc://%s/tiny-eagle3)" % (namespace, PVC)]
    assert any("still used by" in w for w in kept.get("warnings") or []), kept
    assert freed["mode"] == "pvc" and freed["run_job"] is True and freed["pvc_job"]["keep"] == ["target"]

    # only the free draft went, by the one remover Job, after both rollbacks were proven
    jobs = _batch(k8s_client).list_namespaced_job(namespace, label_selector="spec-decoding.alauda.io/task=remove-draft").items
    assert [j.metadata.name for j in jobs] == [freed["pvc_job"]["job"]]
    assert [rc for rc, _out in pod.played.values()] == [0]
    assert sorted(os.listdir(str(root))) == ["target", "tiny-eagle3"]
    assert artifact_sync.check_dest(str(root / "target"), name="target")["ok"]
    annotations = _core(k8s_client).read_namespaced_persistent_volume_claim(PVC, namespace).metadata.annotations
    assert sorted(json.loads(annotations[STAGED])) == ["target", "tiny-eagle3"]
    assert json.loads(annotations[REMOVED]) == {"free-draft": jobs[0].metadata.name}
    results = run.result("Record the result for %s/kept" % namespace)["ansible_facts"]["rollback_results"]
    assert [(r["isvc"], r["verified"], (r["draft_artifacts"] or {}).get("mode")) for r in results] == [
        ("%s/freed" % namespace, True, "pvc"), ("%s/kept" % namespace, True, "pvc")]
    for name in ("kept", "freed"):
        live = _get(k8s_client, namespace, name)
        assert live["metadata"]["generation"] == 2 and live["spec"]["model"]["uri"] == "pvc://%s/" % PVC
        assert vllm_command.find_speculative_config(live["spec"]["template"]["containers"][0]["command"]) is None
