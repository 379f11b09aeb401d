"""The stage_pvc role against the real kube-apiserver (tests/testbed).

There is no real kubelet, so the test plays the stager pod: when the Job's pod appears it takes the sync
script and the plan out of the ConfigMap the role wrote, runs that script for real on a temporary
directory standing in for the PVC (sources: an HTTP mirror on loopback, and a controller directory the
role serves), writes the script's output as the pod's log (read back through the API server) and sets the
Job's status to Complete or Failed from the script's exit code.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tests.ansible_run import DID_NOT_FAIL, run_cases, run_playbook
from tests.testbed import ports
from tests.testbed.fixtures import module_namespace

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync import bundle

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
STAGED = "spec-decoding.alauda.io/staged"
TARGET = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
MIB = 1 << 20


def _write_model(root, seed, shards=2, mib=2):
    os.makedirs(root, exist_ok=True)
    for i in range(shards):
        with open(os.path.join(root, "model-%05d-of-%05d.safetensors" % (i + 1, shards)), "wb") as fh:
            fh.write(bytes([seed, i]) * (mib * MIB // 2))
    with open(os.path.join(root, "config.json"), "w", encoding="utf-8") as fh:
        json.dump({"architectures": ["LlamaForCausalLM"], "seed": seed}, fh)
    return root


def _free_port(count=2):
    """The first of `count` consecutive loopback ports that are free now (the role serves one per controller directory)."""
    return ports.free_port(count=count)


def _core(k8s_client):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.CoreV1Api(k8s_client)


def _batch(k8s_client):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.BatchV1Api(k8s_client)


def _storage(k8s_client):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.StorageV1Api(k8s_client)


@contextlib.contextmanager
def _storage_classes(k8s_client):
    """make(expandable=False): a StorageClass (no provisioner runs; nothing binds, which the role does not need); all
    deleted on exit."""
    names = []

    def make(expandable=False):
        name = "sc-%s" % uuid.uuid4().hex[:8]
        _storage(k8s_client).create_storage_class({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": "example.com/none", "allowVolumeExpansion": expandable})
        names.append(name)
        return name

    try:
        yield make
    finally:
        for name in names:
            _storage(k8s_client).delete_storage_class(name)


@pytest.fixture
def storage_class(k8s_client):
    with _storage_classes(k8s_client) as make:
        yield make


@contextlib.contextmanager
def _serving_mirror(base):
    """An HTTP mirror on loopback serving the target model (written under `base`) as a directory listing."""
    root = _write_model(os.path.join(str(base), "mirror", "Meta-Llama-3.1-8B-Instruct"), seed=1)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"root": root, "url": "http://127.0.0.1:%d/" % httpd.server_address[1]}
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def mirror(tmp_path):
    """An HTTP mirror on loopback serving the target model as a directory listing."""
    with _serving_mirror(tmp_path) as served:
        yield served


class StagerPod:
    """Plays the kubelet for the stager Job: runs the ConfigMap's script, publishes its log and the Job status."""

    def __init__(self, k8s_client, kubelet, namespace, pvc_dir, outcome=None, before=None):
        self.k8s_client = k8s_client
        self.kubelet = kubelet
        self.namespace = namespace
        self.pvc_dir = pvc_dir
        self.outcome = outcome  # None: from the script's exit code; "Failed"/"Complete" forces it
        self.before = before  # called before the script runs (breaks or repairs the "volume")
        self.stop = threading.Event()
        self.played = {}  # job name -> (rc, output)
        self.outcomes = {}  # job uid -> the status written for it
        self.errors = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.errors, self.errors

    def _loop(self):
        while not self.stop.is_set():
            try:
                for job in _batch(self.k8s_client).list_namespaced_job(self.namespace).items:
                    name = job.metadata.name
                    done = any(c.type in ("Complete", "Failed") and c.status == "True" for c in (job.status.conditions or []))
                    if not done and job.metadata.uid in self.outcomes:
                        # The real Job controller (kube-controller-manager 1.20) writes the whole status from its cache:
                        # a sync that began before our patch drops the condition. Write it again until it sticks.
                        _batch(self.k8s_client).patch_namespaced_job_status(name, self.namespace, {"status": self.outcomes[job.metadata.uid]})
                        continue
                    if done or name in self.played:
                        continue
                    # This Job's own pod: a rerun's Job has the name of the one before it, whose pod may not be collected yet
                    pods = [p for p in _core(self.k8s_client).list_namespaced_pod(self.namespace, label_selector="job-name=%s" % name).items
                            if p.metadata.deletion_timestamp is None
                            and any(ref.uid == job.metadata.uid for ref in p.metadata.owner_references or [])]
                    if pods:
                        self._play(job, pods[0])
            except Exception as exc:  # pylint: disable=broad-except
                self.errors.append(repr(exc))
                return
            self.stop.wait(0.2)

    def _play(self, job, pod):
        name = job.metadata.name
        volumes = {v.name: v for v in pod.spec.volumes}
        cm_name = volumes["stager"].config_map.name
        cm = _core(self.k8s_client).read_namespaced_config_map(cm_name, self.namespace)
        work = os.path.join(os.path.dirname(self.pvc_dir), "stager-" + name)
        os.makedirs(work, exist_ok=True)
        # The ConfigMap's files as the kubelet mounts them: binaryData (the stager's zip application) as bytes.
        for key, value in (cm.binary_data or {}).items():
            with open(os.path.join(work, key), "wb") as fh:
                fh.write(base64.b64decode(value))
        plan = json.loads(cm.data["plan.json"])
        plan["root"] = self.pvc_dir
        for item in plan["items"]:
            item["dest"] = item["dest"].replace("/mnt/pvc", self.pvc_dir, 1)
        with open(os.path.join(work, "plan.json"), "w", encoding="utf-8") as fh:
            json.dump(plan, fh)
        container = pod.spec.containers[0]
        cmd = [sys.executable if c == "python3" else c for c in container.command]
        cmd = [os.path.join(work, os.path.basename(c)) if c.startswith("/opt/spec-decoding/") else c for c in cmd]
        env = dict(os.environ, **{e.name: e.value for e in container.env if e.value is not None})
        if self.before is not None:
            self.before()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
        output = proc.stderr + proc.stdout
        self.played[name] = (proc.returncode, output)
        self.kubelet.write_log(self.namespace, pod.metadata.name, "stager", output, append=False)
        outcome = self.outcome or ("Complete" if proc.returncode == 0 else "Failed")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {"type": outcome, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
        if outcome == "Failed":
            cond.update(reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit")
        status = {"conditions": [cond], "startTime": now, "active": 0}
        status.update({"succeeded": 1, "completionTime": now} if outcome == "Complete" else {"failed": 1})
        self.outcomes[job.metadata.uid] = status
        _batch(self.k8s_client).patch_namespaced_job_status(name, self.namespace, {"status": status})


def _vars(namespace, pvc, items, **more):
    out = {"stage_pvc_name": pvc, "stage_pvc_namespace": namespace, "stage_pvc_items": items, "stage_pvc_poll_interval": 1,
           "stage_pvc_timeout": 120, "stage_pvc_image": "registry.internal.example/vllm/vllm-openai:v0.11.0",
           "stage_pvc_controller_idle_exit": 3}
    out.update(more)
    return out


def _run_role(tmp_path, kubeconfig, extra_vars, check=False):
    tasks = """
    - name: Stage the models
      ansible.builtin.include_role:
        name: alauda.spec_decoding.stage_pvc
    - name: Show the result
      ansible.builtin.debug:
        var: stage_pvc_result
    """
    return run_playbook(tmp_path, tasks=tasks, extra_vars=extra_vars, kubeconfig=kubeconfig, check=check, timeout=300)


def _tree(root):
    out = {}
    for dirpath, _dirs, filenames in os.walk(root):
        for name in filenames:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, root)] = fh.read()
    return out


def _nothing_written(k8s_client, namespace, pvc):
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel
    assert not _core(k8s_client).list_namespaced_config_map(namespace, label_selector="app.kubernetes.io/part-of=%s" % pvc).items
    assert not _batch(k8s_client).list_namespaced_job(namespace).items
    try:
        return _core(k8s_client).read_namespaced_persistent_volume_claim(pvc, namespace)
    except ApiException as exc:
        assert exc.status == 404
        return None


def test_stage_target_and_draft_then_rerun_is_idempotent(tmp_path, kubeconfig, k8s_client, kubelet, namespace, storage_class, mirror):
    sc = storage_class()
    draft_dir = _write_model(str(tmp_path / "controller" / "eagle3"), seed=2, shards=1, mib=1)
    pvc_dir = str(tmp_path / "pvc")
    port = _free_port()
    items = [
        {"name": TARGET, "subdir": "Meta-Llama-3.1-8B-Instruct", "source": mirror["url"]},
        {"name": DRAFT, "subdir": "EAGLE3-LLaMA3.1-Instruct-8B", "source": draft_dir},
    ]
    extra = _vars(namespace, "llama-models", items, stage_pvc_storage_class=sc, stage_pvc_controller_address="127.0.0.1",
                  stage_pvc_controller_bind="127.0.0.1", stage_pvc_controller_port=port, stage_pvc_air_gapped=True,
                  stage_pvc_min_size="1Mi", stage_pvc_headroom_percent=10)
    with StagerPod(k8s_client, kubelet, namespace, pvc_dir) as pod:
        run = _run_role(tmp_path, kubeconfig, extra)
    assert run.rc == 0, run.output
    assert len(pod.played) == 1
    job_name, (rc, output) = list(pod.played.items())[0]
    assert rc == 0, output

    # The data landed in the two predictable subdirectories, each with a complete manifest.
    assert sorted(os.listdir(pvc_dir)) == ["EAGLE3-LLaMA3.1-Instruct-8B", "Meta-Llama-3.1-8B-Instruct"]
    target = _tree(os.path.join(pvc_dir, "Meta-Llama-3.1-8B-Instruct"))
    assert {k: v for k, v in target.items() if not k.startswith(".")} == _tree(mirror["root"])
    assert {k: v for k, v in _tree(os.path.join(pvc_dir, "EAGLE3-LLaMA3.1-Instruct-8B")).items() if not k.startswith(".")} == _tree(draft_dir)
    manifest = json.loads(target[".spec-decoding-manifest.json"])
    assert manifest["name"] == TARGET

    # PVC: size = files + 10 % headroom (rounded up to Gi), class and modes as asked, labels.
    pvc = _core(k8s_client).read_namespaced_persistent_volume_claim("llama-models", namespace)
    assert pvc.spec.storage_class_name == sc and pvc.spec.access_modes == ["ReadWriteOnce"]
    assert pvc.spec.resources.requests["storage"] == "1Gi"
    assert pvc.metadata.labels["app.kubernetes.io/managed-by"] == "alauda.spec_decoding"
    staged = json.loads(pvc.metadata.annotations[STAGED])
    assert staged["Meta-Llama-3.1-8B-Instruct"]["name"] == TARGET and staged["EAGLE3-LLaMA3.1-Instruct-8B"]["name"] == DRAFT
    assert staged["Meta-Llama-3.1-8B-Instruct"]["tree_sha256"] == manifest["tree_sha256"]

    # ConfigMap: the collection's stager (the zip application built from the package), byte for byte, and the plan;
    # owned by the PVC.
    cm = _core(k8s_client).read_namespaced_config_map("llama-models-stager", namespace)
    assert base64.b64decode(cm.binary_data["artifact_sync.pyz"]) == bundle.zipapp()
    plan = json.loads(cm.data["plan.json"])
    assert [(i["name"], i["dest"]) for i in plan["items"]] == [
        (TARGET, "/mnt/pvc/Meta-Llama-3.1-8B-Instruct"), (DRAFT, "/mnt/pvc/EAGLE3-LLaMA3.1-Instruct-8B")]
    assert plan["items"][1]["source"] == "http://127.0.0.1:%d/" % port and plan["air_gapped"] is True
    assert [(o.kind, o.name, o.uid) for o in cm.metadata.owner_references] == [("PersistentVolumeClaim", "llama-models", pvc.metadata.uid)]

    # Job: vLLM runtime image, the script from the ConfigMap, the PVC mounted, owned by the PVC.
    job = _batch(k8s_client).read_namespaced_job(job_name, namespace)
    assert job_name.startswith("llama-models-stage-")
    spec = job.spec.template.spec
    c = spec.containers[0]
    assert c.image == "registry.internal.example/vllm/vllm-openai:v0.11.0"
    assert c.command == ["python3", "/opt/spec-decoding/artifact_sync.pyz", "--config", "/opt/spec-decoding/plan.json"]
    assert {m.name: m.mount_path for m in c.volume_mounts} == {"models": "/mnt/pvc", "stager": "/opt/spec-decoding"}
    assert {v.name: (v.persistent_volume_claim.claim_name if v.persistent_volume_claim else v.config_map.name) for v in spec.volumes} == {
        "models": "llama-models", "stager": "llama-models-stager"}
    assert {e.name: e.value for e in c.env}["SPEC_DECODING_AIR_GAPPED"] == "true"
    assert spec.restart_policy == "Never" and job.spec.backoff_limit == 3
    assert [(o.kind, o.uid) for o in job.metadata.owner_references] == [("PersistentVolumeClaim", pvc.metadata.uid)]

    result = run.result("Show the result")["stage_pvc_result"]
    assert result["storage_uri"] == "pvc://llama-models/"
    assert result["paths"] == {"Meta-Llama-3.1-8B-Instruct": "/mnt/models/Meta-Llama-3.1-8B-Instruct",
                               "EAGLE3-LLaMA3.1-Instruct-8B": "/mnt/models/EAGLE3-LLaMA3.1-Instruct-8B"}

    # Rerun: nothing changes, the completed Job is not run again.
    with StagerPod(k8s_client, kubelet, namespace, pvc_dir) as pod2:
        again = _run_role(tmp_path, kubeconfig, extra)
    assert again.rc == 0, again.output
    assert again.changed == 0, [(n, r.get("changed")) for n, _h, r in again.tasks if r.get("changed")]
    assert pod2.played == {}
    assert _batch(k8s_client).read_namespaced_job(job_name, namespace).metadata.uid == job.metadata.uid
    assert len(_batch(k8s_client).list_namespaced_job(namespace).items) == 1

    # A changed plan (full re-hash) is a new Job; it copies nothing, and the old Job is cleaned up.
    with StagerPod(k8s_client, kubelet, namespace, pvc_dir) as pod3:
        third = _run_role(tmp_path, kubeconfig, dict(extra, stage_pvc_verify="full"))
    assert third.rc == 0, third.output
    (new_job, (rc3, out3)), = pod3.played.items()  # pylint: disable=unbalanced-dict-unpacking
    assert new_job != job_name and rc3 == 0
    summary = json.loads(out3.strip().splitlines()[-1])["spec_decoding_sync"]
    assert [i["copied_files"] for i in summary["items"]] == [0, 0]
    assert [i["verified_files"] for i in summary["items"]] == [3, 2]
    jobs = [j.metadata.name for j in _batch(k8s_client).list_namespaced_job(namespace).items if not j.metadata.deletion_timestamp]
    assert jobs == [new_job]


def test_failed_job_reports_its_log_and_the_next_run_retries(tmp_path, kubeconfig, k8s_client, kubelet, namespace, mirror):
    pvc_dir = str(tmp_path / "pvc")
    items = [{"name": TARGET, "subdir": "target", "source": mirror["url"]}]
    extra = _vars(namespace, "models", items, stage_pvc_min_size="1Mi")

    def break_volume():
        # Something else sits where the subdirectory should be: the engine refuses it.
        os.makedirs(pvc_dir, exist_ok=True)
        with open(os.path.join(pvc_dir, "target"), "w", encoding="utf-8") as fh:
            fh.write("not a directory")

    with StagerPod(k8s_client, kubelet, namespace, pvc_dir, before=break_volume) as pod:
        run = _run_role(tmp_path, kubeconfig, extra)
    assert run.rc != 0
    failed = run.failed[-1]
    assert "The stager Job %s/models-stage-" % namespace in failed["msg"]
    assert "BackoffLimitExceeded" in failed["msg"]
    # The pod's own log, read through the API server, says what went wrong.
    assert "[artifact-sync] ERROR: dest: %s/target exists and is not a directory" % pvc_dir in failed["msg"]
    assert "resumes" in failed["msg"]
    first_job = list(pod.played)[0]
    assert len(pod.played) == 1
    first_uid = _batch(k8s_client).read_namespaced_job(first_job, namespace).metadata.uid

    # Next run: the failed Job is replaced (same plan, same name, new uid), and this time it completes.
    with StagerPod(k8s_client, kubelet, namespace, pvc_dir, before=lambda: os.unlink(os.path.join(pvc_dir, "target"))) as pod2:
        run2 = _run_role(tmp_path, kubeconfig, extra)
    assert run2.rc == 0, run2.output
    assert list(pod2.played) == [first_job]
    assert _batch(k8s_client).read_namespaced_job(first_job, namespace).metadata.uid != first_uid
    assert json.loads(_core(k8s_client).read_namespaced_persistent_volume_claim("models", namespace).metadata.annotations[STAGED])["target"]["name"] == TARGET


def test_controller_port_in_use_fails_clearly_and_starts_no_job(tmp_path, kubeconfig, k8s_client, namespace):
    draft = _write_model(str(tmp_path / "controller" / "eagle3"), seed=2, shards=1, mib=1)
    port = _free_port()
    with socket.socket() as squatter:  # another program listens on the port the role would serve the draft on
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        items = [{"name": DRAFT, "subdir": "draft", "source": draft}]
        run = _run_role(tmp_path, kubeconfig, _vars(namespace, "models", items, stage_pvc_controller_address="127.0.0.1",
                                                    stage_pvc_controller_bind="127.0.0.1", stage_pvc_controller_port=port,
                                                    stage_pvc_controller_start_timeout=3, stage_pvc_min_size="1Mi"))
    assert run.rc != 0
    msg = run.failed[-1]["msg"]
    assert "did not start listening on 127.0.0.1:%d" % port in msg, msg
    assert "Address already in use" in msg and "stage_pvc_controller_port" in msg and "No Job was started" in msg
    assert not _batch(k8s_client).list_namespaced_job(namespace).items
    # the controller temp directory of the ready markers is removed on the failure path too
    ready_dir = run.result("Make a directory for the file servers' ready markers")["path"]
    assert os.path.basename(ready_dir).startswith("spec-decoding-serve-")
    assert run.result("Remove the file servers' ready markers")["changed"] and not os.path.exists(ready_dir), ready_dir


@contextlib.contextmanager
def _pvc_maker(k8s_client, tmp_path):
    """make(namespace, name, size, sc, annotations=None, bound=False): a PVC, optionally bound to a static PV (only bound
    claims can expand); the PVs deleted on exit."""
    volumes = []

    def make(namespace, name, size, sc, annotations=None, bound=False):
        spec = {"accessModes": ["ReadWriteOnce"], "storageClassName": sc, "resources": {"requests": {"storage": size}}}
        if bound:
            pv = "pv-%s" % uuid.uuid4().hex[:8]
            _core(k8s_client).create_persistent_volume({
                "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                         "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(tmp_path / pv)},
                         "claimRef": {"namespace": namespace, "name": name}}})
            volumes.append(pv)
            spec["volumeName"] = pv
        _core(k8s_client).create_namespaced_persistent_volume_claim(namespace, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "annotations": annotations or {}}, "spec": spec})
        if bound:
            # The test bed runs no PV binder: play it (PV and claim Bound, capacity reported).
            _core(k8s_client).patch_persistent_volume_status(pv, {"status": {"phase": "Bound"}})
            _core(k8s_client).patch_namespaced_persistent_volume_claim_status(name, namespace, {"status": {
                "phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}}})
        return _core(k8s_client).read_namespaced_persistent_volume_claim(name, namespace)

    try:
        yield make
    finally:
        for pv in volumes:
            _core(k8s_client).delete_persistent_volume(pv)


@pytest.fixture
def make_pvc(k8s_client, tmp_path):
    """A PVC, optionally bound to a static PV (only bound claims can expand)."""
    with _pvc_maker(k8s_client, tmp_path) as make:
        yield make


def test_expandable_pvc_grows(tmp_path, kubeconfig, k8s_client, namespace, storage_class, kubelet, make_pvc):
    """The refusals on an expandable PVC (a size below the files, a shrink) are cases of refusal_runs."""
    sc = storage_class(expandable=True)
    make_pvc(namespace, "models", "1Gi", sc, bound=True)
    items = [{"name": TARGET, "subdir": "target", "source": "volume:/models/llama", "size_bytes": 3 * (1 << 30)}]
    extra = _vars(namespace, "models", items, stage_pvc_source_volume={"nfs": {"server": "nfs.internal", "path": "/"}})
    # Computed size above the current one: the PVC is expanded (the stager then fails: no such NFS here).
    with StagerPod(k8s_client, kubelet, namespace, str(tmp_path / "pvc"), outcome="Failed"):
        run = _run_role(tmp_path, kubeconfig, extra)
    assert run.rc != 0 and "The stager Job" in run.failed[-1]["msg"]
    pvc = _core(k8s_client).read_namespaced_persistent_volume_claim("models", namespace)
    assert pvc.spec.resources.requests["storage"] == "4Gi"


def test_subdirectory_holding_a_different_model_is_refused_without_force(tmp_path, kubeconfig, k8s_client, namespace, kubelet,
                                                                         mirror, make_pvc):
    before = make_pvc(namespace, "models", "5Gi", None, annotations={
        STAGED: json.dumps({"target": {"name": "mistralai/Mistral-7B-Instruct-v0.3", "tree_sha256": "0" * 64}})})
    items = [{"name": TARGET, "subdir": "target", "source": mirror["url"]}]
    run = _run_role(tmp_path, kubeconfig, _vars(namespace, "models", items))
    assert run.rc != 0
    msg = run.failed[-1]["msg"]
    assert "stage_pvc_items[0].subdir: subdirectory target of PVC models holds the model 'mistralai/Mistral-7B-Instruct-v0.3'" in msg
    assert "stage_pvc_force" in msg
    after = _nothing_written(k8s_client, namespace, "models")
    assert after.metadata.resource_version == before.metadata.resource_version

    # With force the plan marks the item forced; the engine replaces the old files.
    pvc_dir = str(tmp_path / "pvc")
    os.makedirs(os.path.join(pvc_dir, "target"))
    with open(os.path.join(pvc_dir, "target", "consolidated.safetensors"), "wb") as fh:
        fh.write(b"old model")
    with StagerPod(k8s_client, kubelet, namespace, pvc_dir) as pod:
        run = _run_role(tmp_path, kubeconfig, _vars(namespace, "models", items, stage_pvc_force=True))
    assert run.rc == 0, run.output
    assert not os.path.exists(os.path.join(pvc_dir, "target", "consolidated.safetensors"))
    assert json.loads(_core(k8s_client).read_namespaced_persistent_volume_claim("models", namespace).metadata.annotations[STAGED])[
        "target"]["name"] == TARGET
    assert len(pod.played) == 1


# Refusals before anything is written, each a case of one ansible-playbook run (a block/rescue per case, the role included
# as _run_role includes it) in one namespace, each case with a PVC name of its own: about 2.5 CPU s of ansible-playbook
# start and collection load per case saved. (case, PVC name, extra vars over _vars, what the message must say)
NFS = {"nfs": {"server": "nfs.internal", "path": "/"}}
REFUSALS = [
    ("missing-source", "missing", {"stage_pvc_controller_address": "127.0.0.1"}, ["stage_pvc_items[0].source", "does not exist"]),
    ("storage-class-absent", "no-class", {"stage_pvc_storage_class": "no-such-class"},
     ["stage_pvc_storage_class: StorageClass 'no-such-class' does not exist"]),
    ("air-gapped-public-hub", "hub", {"stage_pvc_air_gapped": True}, ["air-gapped", "huggingface.co", "stage_pvc_hf_endpoint"]),
    ("pvc-too-small", "models", {"stage_pvc_source_volume": NFS},
     ["PVC models is 1Gi but the models need 18Gi", "does not allow expansion", "Fix:"]),
    # an expandable PVC of 1Gi: a size below the files, and a size below the PVC's
    ("size-below-files", "grow", {"stage_pvc_source_volume": NFS, "stage_pvc_size": "2Gi"},
     ["stage_pvc_size: 2Gi is smaller than the 3.0 GiB of model files"]),
    ("would-shrink", "grow", {"stage_pvc_source_volume": NFS, "stage_pvc_size": "500Mi"}, ["would shrink it"]),
]


def _refusal_items(case, mirror_url, missing_dir):
    return {"missing-source": [{"name": TARGET, "subdir": "target", "source": missing_dir}],
            "storage-class-absent": [{"name": TARGET, "subdir": "target", "source": mirror_url}],
            "air-gapped-public-hub": [{"name": TARGET, "subdir": "target", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"}],
            "pvc-too-small": [{"name": TARGET, "subdir": "target", "source": "volume:/models/llama", "size_bytes": 16 * (1 << 30)}],
            "size-below-files": [{"name": TARGET, "subdir": "target", "source": "volume:/models/llama", "size_bytes": 3 * (1 << 30)}],
            "would-shrink": [{"name": TARGET, "subdir": "target", "source": "volume:/models/llama", "size_bytes": 100 * MIB}]}[case]


@pytest.fixture(scope="module")
def refusal_runs(tmp_path_factory, kubeconfig, controlplane, k8s_client):
    """(run, {case: {msg, task}}, namespace, {PVC name: resourceVersion before the run})."""
    tmp = tmp_path_factory.mktemp("stage-pvc-refusals")
    with module_namespace(controlplane, "stage-pvc-refusals") as namespace, _serving_mirror(tmp) as served, \
            _storage_classes(k8s_client) as storage_class, _pvc_maker(k8s_client, tmp) as make_pvc:
        before = {"models": make_pvc(namespace, "models", "1Gi", storage_class(expandable=False), bound=True),
                  "grow": make_pvc(namespace, "grow", "1Gi", storage_class(expandable=True), bound=True)}
        cases = [(case, {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.stage_pvc"},
                         "vars": _vars(namespace, pvc, _refusal_items(case, served["url"], str(tmp / "no-such-dir")), **more)})
                 for case, pvc, more, _needles in REFUSALS]
        run, results = run_cases(tmp, cases, kubeconfig=kubeconfig, timeout=300)
        yield run, results, namespace, {name: pvc.metadata.resource_version for name, pvc in before.items()}


@pytest.mark.parametrize("case,pvc,needles", [(r[0], r[1], r[3]) for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_bad_settings_fail_before_anything_is_written(refusal_runs, k8s_client, case, pvc, needles):
    run, results, namespace, versions = refusal_runs
    msg = results[case]["msg"]
    assert msg != DID_NOT_FAIL, run.output
    assert all(needle in msg for needle in needles), msg
    after = _nothing_written(k8s_client, namespace, pvc)
    if pvc in versions:  # an existing PVC is left as it was
        assert after.metadata.resource_version == versions[pvc]
    else:
        assert after is None
