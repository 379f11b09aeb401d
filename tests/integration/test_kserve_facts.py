"""kserve_facts against the real kube-apiserver with the real KServe CRDs, in-process (the deploy's wiring of it is
covered by test_deploy / test_rbac): the release from the installed CRD's schema, Modelcar from the storage initializer
settings, the current object, and a clear error for a broken ConfigMap."""
from __future__ import annotations

import pytest

from tests.integration.test_rollback import GROUP, PLURAL, VERSION, _api, _manifest


def _config_map(controlplane, namespace, storage_initializer):
    api = controlplane.rest()
    try:
        body = {"metadata": {"name": "inferenceservice-config"}}
        if storage_initializer is not None:
            body["data"] = {"storageInitializer": storage_initializer}
        api.post("/api/v1/namespaces/%s/configmaps" % namespace, body)
    finally:
        api.close()


def test_release_modelcar_and_existing_from_the_cluster(k8s_client, controlplane, namespace):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import facts as kserve_facts  # pylint: disable=import-outside-toplevel
    # No ConfigMap in this namespace: KServe's default (Modelcar on); no InferenceService yet.
    facts = kserve_facts.gather(k8s_client, namespace, "llama31-8b-eagle3", namespace)
    # The installed CRD is KServe v0.20's (the test bed's CRDs): spec.canary and storageUris are in its schema.
    assert facts["installed"] is True and facts["crd_readable"] is True
    assert facts["kserve_version"] == "0.20.0" and "spec.canary" in facts["evidence"]
    assert facts["modelcar_enabled"] is True and "not readable" in facts["modelcar_evidence"]
    assert facts["oci_model_mode"] == "modelcar" and facts["kserve_warning"] is None
    assert facts["existing"] is None

    _config_map(controlplane, namespace, '{"enableModelcar": false, "uidModelcar": 1010}')
    created = _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                               _manifest("guide_example2_eagle3.yaml", namespace))
    facts = kserve_facts.gather(k8s_client, namespace, "llama31-8b-eagle3", namespace)
    assert facts["modelcar_enabled"] is False and "enableModelcar" in facts["modelcar_evidence"]
    assert facts["oci_model_mode"] == "disabled"
    assert facts["existing"]["metadata"]["uid"] == created["metadata"]["uid"]


def test_native_oci_mode_and_a_newer_storage_initializer_from_the_config_map(k8s_client, controlplane, namespace):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import facts as kserve_facts  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc  # pylint: disable=import-outside-toplevel
    # what a KServe 0.21 install with ImageVolumes on writes: ociModelMode wins over enableModelcar (ResolveOciModelMode)
    _config_map(controlplane, namespace, '{"image": "kserve/storage-initializer:v0.21.0", "enableModelcar": true, '
                                         '"ociModelMode": "native", "uidModelcar": 1010}')
    facts = kserve_facts.gather(k8s_client, namespace, "llama", namespace)
    assert facts["oci_model_mode"] == "native" and "ociModelMode: native" in facts["oci_model_mode_evidence"]
    assert facts["kserve_version"] == "0.20.0" and "KServe 0.21.0" in facts["kserve_warning"]
    # the render takes the mode: two oci:// entries under one parent, which the modelcar mode refuses
    art = {"target_uri": "oci://registry.local/llama:v1", "draft_uri": "oci://registry.local/eagle3:v1",
           "target_mount_path": "/mnt/models/target", "draft_mount_path": "/mnt/models/draft"}
    p = {"name": "llama", "namespace": namespace, "method": "eagle3", "runtime": "vllm", "artifact_mode": "storage_uris",
         "artifacts": art, "kserve_version": facts["kserve_version"], "oci_model_mode": facts["oci_model_mode"], "dtype": "auto",
         "gpu_memory_utilization": 0.9, "max_model_len": 4096, "max_num_seqs": 8, "seed": 0}
    assert [e["mountPath"] for e in isvc.render(p)["manifest"]["spec"]["predictor"]["storageUris"]] == ["/mnt/models/target", "/mnt/models/draft"]


def test_storage_initializer_that_is_not_json_names_the_config_map(k8s_client, controlplane, namespace):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import facts as kserve_facts  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError  # pylint: disable=import-outside-toplevel
    _config_map(controlplane, namespace, "{enableModelcar: yes")
    with pytest.raises(ValidationError) as err:
        kserve_facts.gather(k8s_client, namespace, "absent", namespace)
    assert "inferenceservice-config key storageInitializer is not JSON" in str(err.value)
    assert str(err.value).startswith("kserve_namespace:") and "Fix:" in str(err.value)


def test_runtime_reads_are_recorded_for_the_render(k8s_client, namespace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import facts as kserve_facts  # pylint: disable=import-outside-toplevel
    name = "vllm-rt-" + namespace[-6:]
    facts = kserve_facts.gather(k8s_client, namespace, "llama", namespace, runtime=name)
    # neither a ServingRuntime nor a ClusterServingRuntime of that name: both lookups recorded as missing
    assert facts["runtimes"]["get"] == {"ServingRuntime/%s/%s" % (namespace, name): None, "ClusterServingRuntime/%s" % name: None}
    body = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime", "metadata": {"name": name},
            "spec": {"supportedModelFormats": [{"name": "transformers", "autoSelect": True}],
                     "containers": [{"name": "kserve-container", "image": "vllm/vllm-openai:v0.11.2", "args": ["--port=8080"]}]}}
    client.CustomObjectsApi(k8s_client).create_namespaced_custom_object("serving.kserve.io", "v1alpha1", namespace, "servingruntimes", body)
    facts = kserve_facts.gather(k8s_client, namespace, "llama", namespace, runtime=name)
    found = facts["runtimes"]["get"]["ServingRuntime/%s/%s" % (namespace, name)]
    assert found["spec"]["containers"][0]["args"] == ["--port=8080"] and len(facts["runtimes"]["get"]) == 1
    # without a runtime name KServe auto-selects: both kinds are listed, the namespaced one holds the new runtime
    facts = kserve_facts.gather(k8s_client, namespace, "llama", namespace)
    listed = facts["runtimes"]["list"]
    assert [rt["metadata"]["name"] for rt in listed["ServingRuntime/%s" % namespace]] == [name]
    assert "ClusterServingRuntime" in listed


def test_kserve_info_answers_alike_in_the_task_process_and_as_a_module(tmp_path, controlplane, namespace):
    """Over a local connection the action plugin makes the reads in the task's own process (no "invocation": no module
    ran); a task `environment` sends it to the module process instead (with "invocation"). Both give the same facts, and
    the same msg, field and fix for a storage initializer that is not JSON."""
    from tests.ansible_run import run_playbook  # pylint: disable=import-outside-toplevel
    _config_map(controlplane, namespace, "{enableModelcar: yes")
    task = """\
- name: {label}
  alauda.spec_decoding.kserve_info:
    name: absent
    namespace: {ns}
    kserve_namespace: {kserve_ns}
  register: {label}
  ignore_errors: {fails}
"""
    tasks = ""
    for kserve_ns, fails in ((namespace + "-none", "false"), (namespace, "true")):
        for where in ("in_process", "as_module"):
            label = "%s_%s" % (where, "fails" if fails == "true" else "ok")
            tasks += task.format(label=label, ns=namespace, kserve_ns=kserve_ns, fails=fails)
            if where == "as_module":
                tasks += "  environment:\n    SPEC_DECODING_TEST_MODULE_PROCESS: '1'\n"
    run = run_playbook(tmp_path, tasks=tasks, kubeconfig=controlplane.kubeconfig)
    assert run.rc == 0, run.output
    in_process, as_module = run.result("in_process_ok"), run.result("as_module_ok")
    assert "invocation" not in in_process and "invocation" in as_module
    assert {k: v for k, v in in_process.items() if k != "invocation"} == {k: v for k, v in as_module.items() if k != "invocation"}
    assert in_process["kserve_version"] == "0.20.0" and in_process["existing"] is None
    failed = [run.result(label) for label in ("in_process_fails", "as_module_fails")]
    assert all(res["failed"] for res in failed)
    assert [(res["msg"], res["field"], res["fix"]) for res in failed] == [(failed[1]["msg"], "kserve_namespace", failed[1]["fix"])] * 2
    assert "is not JSON" in failed[0]["msg"]


def test_the_release_verdict_is_kept_per_crd_resource_version(k8s_client, controlplane, tmp_path):
    """The verdict comes from the cache only for the CRD it was read from: after any edit of the CRD (a new
    resourceVersion) the CRD is read again; a cache file that is not the user's own mode 0600 is not trusted."""
    import json  # pylint: disable=import-outside-toplevel
    import os  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import facts as kserve_facts  # pylint: disable=import-outside-toplevel
    cache = str(tmp_path / "kserve-releases.json")
    first = kserve_facts.kserve_release(k8s_client, cache=cache)
    assert first["kserve_version"] == "0.20.0" and oct(os.stat(cache).st_mode & 0o777) == "0o600"
    # a planted verdict under the same key is what comes back: the second call did not read the CRD
    (key,) = json.load(open(cache, encoding="utf-8"))
    with open(cache, "w", encoding="utf-8") as handle:
        json.dump({key: dict(first, evidence="from the cache")}, handle)
    assert kserve_facts.kserve_release(k8s_client, cache=cache)["evidence"] == "from the cache"
    os.chmod(cache, 0o644)  # another user could write such a file: it is read again from the API server
    assert kserve_facts.kserve_release(k8s_client, cache=cache)["evidence"] == first["evidence"]
    os.chmod(cache, 0o600)
    with open(cache, "w", encoding="utf-8") as handle:
        json.dump({key: dict(first, evidence="from the cache")}, handle)
    api = controlplane.rest()
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + kserve_facts.CRD_NAME
    try:
        api.patch(path, {"metadata": {"annotations": {"test.alauda.io/touched": str(tmp_path.name)}}})
        # a new resourceVersion (as a KServe upgrade makes): the CRD is read again, and that verdict kept beside
        again = kserve_facts.kserve_release(k8s_client, cache=cache)
        assert again["evidence"] == first["evidence"] and len(json.load(open(cache, encoding="utf-8"))) == 2
    finally:
        api.patch(path, {"metadata": {"annotations": {"test.alauda.io/touched": None}}})
        api.close()
