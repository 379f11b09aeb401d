"""--speculative-config in a ServingRuntime / ClusterServingRuntime (issue #22), on the real kube-apiserver with the real
KServe CRDs: the flag in the runtime only, in the service only, in both; and which runtime a predictor gets with
KServe's own huggingface runtimes installed (issue #31).

The KServe stand-in builds each predictor Deployment with its own reading of KServe's MergeRuntimeContainers (see
tests/testbed/kserve_standin.py `_container`); the pods' "engine" logs the ngram engine line exactly when the merged
kserve-container command passes the flag to vLLM (an argv flag, or inside a `bash -c` script; args of a script that
does not read "$@" are not passed). So the engine line answers from what the pod really runs, not from the code under
test. Few ansible-playbook runs on purpose (CI time): one per scenario family step.
"""
from __future__ import annotations

import json
import os
import tarfile
import time

import pytest

from tests.ansible_run import run_playbook
from tests.module_run import run_module
from tests.paths import kserve_vectors, read_capture

GROUP, RT_VERSION = "serving.kserve.io", "v1alpha1"
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
VLLM = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
RT_ARGS = ["--port=8080", "--model=/mnt/models", "--served-model-name={{.Name}}"]


def _capture(folder):
    """A recorded vLLM startup log (tests/fixtures/vllm, real vLLM 0.32 output)."""
    return read_capture(folder, "startup.log")


def _api(k8s_client):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.CustomObjectsApi(k8s_client)


def _runtime(kind, name, namespace=None, args=None, command=None):
    container = {"name": "kserve-container", "image": "vllm/vllm-openai:v0.11.2"}
    if command:
        container["command"] = command
    if args:
        container["args"] = args
    meta = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "%s/%s" % (GROUP, RT_VERSION), "kind": kind, "metadata": meta,
            # vLLM for the predictors below, transformers for the deploy's render (its model_format default): KServe
            # refuses a named runtime that does not list the predictor's modelFormat
            "spec": {"supportedModelFormats": [{"name": "vLLM", "autoSelect": True}, {"name": "transformers", "autoSelect": True}],
                     "protocolVersions": ["v2", "v1"],
                     "containers": [container, {"name": "sidecar", "image": "busybox"}]}}


def _create_runtime(k8s_client, body):
    api = _api(k8s_client)
    if body["kind"] == "ServingRuntime":
        return api.create_namespaced_custom_object(GROUP, RT_VERSION, body["metadata"]["namespace"], "servingruntimes", body)
    return api.create_cluster_custom_object(GROUP, RT_VERSION, "clusterservingruntimes", body)


def _get_runtime(k8s_client, kind, name, namespace=None):
    api = _api(k8s_client)
    if kind == "ServingRuntime":
        return api.get_namespaced_custom_object(GROUP, RT_VERSION, namespace, "servingruntimes", name)
    return api.get_cluster_custom_object(GROUP, RT_VERSION, "clusterservingruntimes", name)


def _delete_csr(k8s_client, name):
    try:
        _api(k8s_client).delete_cluster_custom_object(GROUP, RT_VERSION, "clusterservingruntimes", name)
    except Exception:  # pylint: disable=broad-except
        pass


def _isvc(namespace, name, runtime, command=None, args=None):
    model = {"modelFormat": {"name": "vLLM"}, "runtime": runtime, "storageUri": "pvc://model-store/llama"}
    if command:
        model["command"] = command
    if args:
        model["args"] = args
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": namespace, "annotations": {"serving.kserve.io/deploymentMode": "Standard"}},
            "spec": {"predictor": {"model": model}}}


def _get_isvc(k8s_client, namespace, name):
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel
    try:
        return _api(k8s_client).get_namespaced_custom_object(GROUP, "v1beta1", namespace, "inferenceservices", name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _engine_sees_flag(pod):
    """What vLLM's argparse would receive, read straight from the pod (independent of the collection's code)."""
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "kserve-container")
    command, args = container.get("command") or [], container.get("args") or []
    if len(command) >= 3 and command[0].rsplit("/", 1)[-1] in ("bash", "sh") and command[1] == "-c":
        seen = [command[2]] + (args if "$@" in command[2] else [])
    else:
        seen = command + args
    return any("--speculative-config" in word for word in seen)


@pytest.fixture
def engine(kserve, namespace):
    """Pods of this namespace log the ngram engine line when their merged command passes the flag, else the baseline."""
    from tests.testbed.kubelet import PodBehaviour  # pylint: disable=import-outside-toplevel
    ngram, baseline = _capture("ngram"), _capture("baseline")

    def ours(pod):
        return pod["metadata"]["namespace"] == namespace

    kserve.kubelet.set_behaviour(lambda pod: ours(pod) and not _engine_sees_flag(pod),
                                 PodBehaviour(ready_after=0.2, logs={"kserve-container": baseline}))
    kserve.kubelet.set_behaviour(lambda pod: ours(pod) and _engine_sees_flag(pod),
                                 PodBehaviour(ready_after=0.2, logs={"kserve-container": ngram}))


def _wait_ready(k8s_client, namespace, name):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
    return isvc_wait.wait_ready(k8s_client, namespace, name, timeout=60, interval=0.3)[0]


def _deployment_container(k8s_client, namespace, name):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    dep = client.AppsV1Api(k8s_client).read_namespaced_deployment("%s-predictor" % name, namespace)
    container = next(c for c in dep.spec.template.spec.containers if c.name == "kserve-container")
    return list(container.command or []), list(container.args or [])


def _effective(k8s_client, isvc):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime as serving_runtime  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers  # pylint: disable=import-outside-toplevel
    return serving_runtime.effective_command(isvc, runtime_readers.ClientReader(k8s_client))


DEPLOY_VARS = {
    "spec_decoding_hosts": "localhost", "spec_decoding_target": "cluster", "spec_decoding_vllm_version": "0.32.0",
    "spec_decoding_dtype": "bfloat16", "spec_decoding_gpu_count": 0, "spec_decoding_wait_timeout": 60,
    "spec_decoding_artifact_mode": "pvc", "spec_decoding_command_style": "args",
    "spec_decoding_artifacts": {"pvc_name": "model-store", "target_subdir": "llama"},
}


@pytest.mark.usefixtures("engine")
def test_deploy_refuses_the_double_and_verify_names_the_source(tmp_path, kubeconfig, k8s_client, namespace):
    csr = "ngram-%s" % namespace
    _create_runtime(k8s_client, _runtime("ClusterServingRuntime", csr, args=RT_ARGS + ["--speculative-config", json.dumps(NGRAM)],
                                         command=VLLM))
    _create_runtime(k8s_client, _runtime("ServingRuntime", "clean", namespace, args=RT_ARGS, command=VLLM))
    try:
        # the runtime already passes an ngram config; the deploy's would come after it -> refused, nothing applied
        run = run_playbook(tmp_path, "playbooks/deploy-ngram.yml", kubeconfig=kubeconfig,
                           extra_vars=dict(DEPLOY_VARS, spec_decoding_namespace=namespace, spec_decoding_isvc_name="llama",
                                           spec_decoding_runtime=csr, spec_decoding_verify=False))
        assert run.rc != 0
        msg = run.result("Render the InferenceService")["msg"]
        assert "appear twice" in msg and "ClusterServingRuntime %s" % csr in msg and "spec_decoding_runtime_flag" in msg
        assert _get_isvc(k8s_client, namespace, "llama") is None

        # spec_decoding_runtime_flag: replace lets the service's flag (the last one) win, with a warning
        run = run_playbook(tmp_path, "playbooks/deploy-ngram.yml", kubeconfig=kubeconfig,
                           extra_vars=dict(DEPLOY_VARS, spec_decoding_namespace=namespace, spec_decoding_isvc_name="llama-replace",
                                           spec_decoding_runtime=csr, spec_decoding_verify=False, spec_decoding_runtime_flag="replace"))
        assert run.rc == 0, run.output
        rendered = run.result("Render the InferenceService")
        assert rendered["runtime_check"]["sources"] == ["cluster_serving_runtime", "inference_service"]
        assert rendered["runtime_check"]["source"] == "inference_service"
        assert any("ClusterServingRuntime %s also sets --speculative-config" % csr in w for w in rendered["warnings"]), rendered
        command, args = _deployment_container(k8s_client, namespace, "llama-replace")
        flags = [i for i, a in enumerate(command + args) if a.startswith("--speculative-config")]
        assert len(flags) == 2, command + args  # KServe's merge: the runtime's first, the service's last (vLLM takes it)

        # the flag in the service only: deployed, verified on the engine line, source named
        run = run_playbook(tmp_path, "playbooks/deploy-ngram.yml", kubeconfig=kubeconfig,
                           extra_vars=dict(DEPLOY_VARS, spec_decoding_namespace=namespace, spec_decoding_isvc_name="llama",
                                           spec_decoding_runtime="clean", spec_decoding_verify=True))
        assert run.rc == 0, run.output
        assert run.result("Render the InferenceService")["runtime_check"]["source"] == "inference_service"
        assert run.result("Note where the flag comes from")["ansible_facts"]["verify_flag_source"] == "inference_service"
        engine_line = run.result("Check the engine-config line")
        assert engine_line["speculative_config"]["method"] == "ngram"
        isvc = _get_isvc(k8s_client, namespace, "llama")
        command, args = _deployment_container(k8s_client, namespace, "llama")
        assert command == isvc["spec"]["predictor"]["model"]["command"]
        assert args[:3] == ["--port=8080", "--model=/mnt/models", "--served-model-name=llama"]  # runtime's first
        assert args[3:] == isvc["spec"]["predictor"]["model"]["args"]
        eff = _effective(k8s_client, isvc)
        assert (eff.container["command"], eff.container["args"]) == (command, args)
    finally:
        _delete_csr(k8s_client, csr)


@pytest.mark.usefixtures("engine")
def test_rollback_refuses_a_shared_runtime_then_each_fix(tmp_path, kubeconfig, k8s_client, namespace):
    shared = "shared"
    _create_runtime(k8s_client, _runtime("ServingRuntime", shared, namespace, args=RT_ARGS + ["--speculative-config", json.dumps(NGRAM)],
                                         command=VLLM))
    api = _api(k8s_client)
    # a: the flag in both (runtime args and its own args); b: the flag in the runtime only (OpenShift AI style, args only)
    api.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "inferenceservices",
                                        _isvc(namespace, "a", shared, args=["--max-model-len=2048", "--speculative-config", json.dumps(NGRAM)]))
    api.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "inferenceservices", _isvc(namespace, "b", shared, args=["--seed=1"]))
    a, b = _wait_ready(k8s_client, namespace, "a"), _wait_ready(k8s_client, namespace, "b")
    for isvc in (a, b):  # the merged command is KServe's (stand-in) merge, for both combinations
        eff = _effective(k8s_client, isvc)
        assert (eff.container["command"], eff.container["args"]) == _deployment_container(k8s_client, namespace, isvc["metadata"]["name"])
    assert _effective(k8s_client, a).sources() == ["serving_runtime", "inference_service"]
    assert _effective(k8s_client, b).source() == "serving_runtime"
    # serving_runtime_info names the runtime's users (both services, and only those)
    info = run_module("serving_runtime_info", {"name": "b", "namespace": namespace, "kubeconfig": kubeconfig, "list_users": True})
    assert not info.failed, info.msg
    assert info["source"] == "serving_runtime" and sorted(info["users"]) == ["%s/a" % namespace, "%s/b" % namespace]
    assert info["inference_service"]["metadata"]["name"] == "b"
    runtime_before = _get_runtime(k8s_client, "ServingRuntime", shared, namespace)
    rb_vars = {"rollback_names": ["%s/a" % namespace], "rollback_wait_timeout": 60, "rollback_wait_sleep": 1,
               "rollback_verify_delay": 1, "rollback_verify_retries": 10}

    # 1. refused: the runtime is named with every user, and nothing is written
    run = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig, extra_vars=rb_vars)
    assert run.rc != 0
    msg = run.result("Strip the speculative config")["msg"]
    assert "ServingRuntime shared" in msg and "%s/a, %s/b" % (namespace, namespace) in msg
    assert "spec_decoding_rollback_runtime_copy" in msg and "spec_decoding_rollback_edit_runtime" in msg
    assert _get_isvc(k8s_client, namespace, "a")["metadata"]["resourceVersion"] == a["metadata"]["resourceVersion"]
    assert _get_runtime(k8s_client, "ServingRuntime", shared, namespace)["metadata"]["resourceVersion"] == \
        runtime_before["metadata"]["resourceVersion"]

    # 2. per-service copy: a runs on its own runtime without the flag (engine line None); b keeps speculative decoding
    run = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig,
                       extra_vars=dict(rb_vars, spec_decoding_rollback_runtime_copy=True))
    assert run.rc == 0, run.output
    strip = run.result("Strip the speculative config")
    assert strip["runtime"]["fix"] == "copy" and strip["previous_config"] == NGRAM
    copy_name = strip["runtime"]["copy"]
    copy = _get_runtime(k8s_client, "ServingRuntime", copy_name, namespace)
    assert copy["spec"]["containers"][0]["args"] == RT_ARGS
    assert [f["autoSelect"] for f in copy["spec"]["supportedModelFormats"]] == [False, False]
    a = _get_isvc(k8s_client, namespace, "a")
    assert a["spec"]["predictor"]["model"]["runtime"] == copy_name
    assert a["spec"]["predictor"]["model"]["args"] == ["--max-model-len=2048"]
    assert run.result("Prove the engine runs without a proposer")["speculative_config"] is None
    assert _get_runtime(k8s_client, "ServingRuntime", shared, namespace)["spec"] == runtime_before["spec"]
    assert _effective(k8s_client, _get_isvc(k8s_client, namespace, "b")).config() == NGRAM

    # 3. edit the shared runtime for b (users listed first), proven on b's new pods; a troubleshoot bundle has the runtime
    rb_vars["rollback_names"] = ["%s/b" % namespace]
    run = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig,
                       extra_vars=dict(rb_vars, spec_decoding_rollback_edit_runtime=True))
    assert run.rc == 0, run.output
    strip = run.result("Strip the speculative config")
    assert strip["runtime"]["fix"] == "edit" and strip["runtime_users"] == ["%s/b" % namespace]
    assert any("every InferenceService using it" in w for w in strip.get("warnings", []))
    assert _get_runtime(k8s_client, "ServingRuntime", shared, namespace)["spec"]["containers"][0]["args"] == RT_ARGS
    assert run.result("Prove the engine runs without a proposer")["speculative_config"] is None
    # a scheduled rerun (default variables, both services) has nothing left to do: no refusal, no loop
    rerun = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig,
                         extra_vars=dict(rb_vars, rollback_names=["%s/a" % namespace, "%s/b" % namespace]))
    assert rerun.rc == 0, rerun.output
    assert rerun.changed == 0, rerun.output
    rerun = run_playbook(tmp_path, "playbooks/troubleshoot.yml", kubeconfig=kubeconfig,
                         extra_vars={"troubleshoot_names": ["%s/a" % namespace], "troubleshoot_dest": str(tmp_path / "ts"),
                                     "troubleshoot_metrics": False, "troubleshoot_engine": False})
    assert rerun.rc == 0, rerun.output
    archives = [p for p in os.listdir(tmp_path / "ts") if p.endswith(".tar.gz")]
    with tarfile.open(tmp_path / "ts" / archives[0]) as tar:
        names = tar.getnames()
        runtime_file = next(n for n in names if n.endswith("/servingruntime.yaml"))
        assert copy_name in tar.extractfile(runtime_file).read().decode()
        effective = json.loads(tar.extractfile(next(n for n in names if n.endswith("/effective_command.json"))).read())
    assert effective["runtime"] == {"kind": "ServingRuntime", "name": copy_name} and effective["source"] is None


@pytest.mark.usefixtures("engine")
def test_single_node_predictor_gets_kserve_huggingfaceserver(kubeconfig, k8s_client, namespace):
    """KServe's built-in huggingface runtimes (config/runtimes, as KServe installs them): the multinode one has the
    higher priority but a workerSpec, so a predictor without one gets kserve-huggingfaceserver, on the stand-in and in
    the collection's reading (serving_runtime_info, the read verify makes); a runtime named for a format it does not
    list is refused by both, KServe's way."""
    runtimes = [kserve_vectors("config_runtimes/%s.yaml" % name) for name in ("kserve-huggingfaceserver", "kserve-huggingfaceserver-multinode")]
    for body in runtimes:
        _create_runtime(k8s_client, body)
    try:
        api = _api(k8s_client)
        isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                "metadata": {"name": "hf", "namespace": namespace, "annotations": {"serving.kserve.io/deploymentMode": "Standard"}},
                "spec": {"predictor": {"model": {"modelFormat": {"name": "huggingface"}, "storageUri": "pvc://model-store/llama"}}}}
        api.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "inferenceservices", isvc)
        # the runtime's format names no runtime it does not list: KServe refuses, and writes why
        wrong = json.loads(json.dumps(isvc))
        wrong["metadata"]["name"] = "hf-wrong-format"
        wrong["spec"]["predictor"]["model"].update(modelFormat={"name": "vLLM"}, runtime="kserve-huggingfaceserver")
        api.create_namespaced_custom_object(GROUP, "v1beta1", namespace, "inferenceservices", wrong)

        ready = _wait_ready(k8s_client, namespace, "hf")
        assert ready["status"]["clusterServingRuntimeName"] == "kserve-huggingfaceserver"
        single = runtimes[0]["spec"]["containers"][0]
        command, args = _deployment_container(k8s_client, namespace, "hf")
        assert command == [] and args == ["--model_name=hf"]  # the single-node runtime's: no bash/ray script
        from kubernetes import client  # pylint: disable=import-outside-toplevel
        dep = client.AppsV1Api(k8s_client).read_namespaced_deployment("hf-predictor", namespace)
        main = next(c for c in dep.spec.template.spec.containers if c.name == "kserve-container")
        assert main.image == single["image"] == "kserve/huggingfaceserver:latest"
        assert ("LMCACHE_USE_EXPERIMENTAL", "True") in [(e.name, e.value) for e in main.env or []]
        assert "devshm" in [v.name for v in dep.spec.template.spec.volumes]  # the runtime's volume, for its /dev/shm mount

        info = run_module("serving_runtime_info", {"name": "hf", "namespace": namespace, "kubeconfig": kubeconfig})
        assert not info.failed, info.msg
        assert info["runtime"] == {"kind": "ClusterServingRuntime", "name": "kserve-huggingfaceserver"}
        assert (info["command"], info["args"]) == (command, args)

        refused = _get_isvc(k8s_client, namespace, "hf-wrong-format")
        for _attempt in range(100):
            if (refused.get("status") or {}).get("modelStatus", {}).get("lastFailureInfo"):
                break
            time.sleep(0.1)
            refused = _get_isvc(k8s_client, namespace, "hf-wrong-format")
        assert refused["status"]["modelStatus"]["transitionStatus"] == "InvalidSpec"
        assert refused["status"]["modelStatus"]["lastFailureInfo"] == {
            "reason": "NoSupportingRuntime", "message": "Specified runtime does not support specified framework/version"}
        info = run_module("serving_runtime_info", {"name": "hf-wrong-format", "namespace": namespace, "kubeconfig": kubeconfig})
        assert info.failed and "specified runtime kserve-huggingfaceserver does not support specified framework/version" in info.msg
        assert "supports the model formats huggingface:1" in info.msg
        assert not client.AppsV1Api(k8s_client).list_namespaced_deployment(
            namespace, label_selector="serving.kserve.io/inferenceservice=hf-wrong-format").items
        # the waiter does not wait out what KServe refused: one line at once, with the fix
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
        started = time.monotonic()
        with pytest.raises(isvc_wait.WaitTimeout) as err:
            isvc_wait.wait_ready(k8s_client, namespace, "hf-wrong-format", timeout=120, interval=0.3)
        assert time.monotonic() - started < 10
        assert str(err.value).startswith(
            "InferenceService %s/hf-wrong-format cannot become Ready: KServe refused the predictor (InvalidSpec, NoSupportingRuntime): "
            "Specified runtime does not support specified framework/version. Fix: create the ServingRuntime" % namespace)
        assert "\n" not in str(err.value) and "spec_decoding_runtime" in err.value.hint
    finally:
        for body in runtimes:
            _delete_csr(k8s_client, body["metadata"]["name"])
