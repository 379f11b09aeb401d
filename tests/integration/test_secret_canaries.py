"""Secret canaries: a registry password, a Hugging Face token, a bearer token and two kube tokens never leak.

Unique canary values are used for real: the registry password of a loopback registry with htpasswd auth (Modelcar
push from deploy, in GitOps and cluster mode), the Hugging Face token (artifact_credentials writes it into a Secret,
stage_pvc hands that Secret to its stager Job), the inference endpoint's bearer token (benchmark), the admin token
of the API server (credentials run) and the token of a ServiceAccount (deploy, stage_pvc, verify, troubleshoot,
benchmark and rollback authenticate with it through K8S_AUTH_API_KEY, so it is a module parameter).
Every run is at -vvv. Scanned: stdout/stderr of every run, every file under the GitOps directory, the benchmark
reports, the troubleshoot bundle (and the members of its archive), the Modelcar progress log, the HOME the runs used
(caches, ansible's own leftovers), the registry's storage, and every object the API server holds in the namespace
except Secrets (ConfigMaps, Jobs, Pods, Deployments, the InferenceService, events, ...). A Secret may hold a value,
nothing else may, in clear or base64.
"""
from __future__ import annotations

import base64
import json
import os
import tarfile
import threading
import uuid
from http.server import ThreadingHTTPServer

import yaml

from tests.ansible_run import run_playbook
from tests.integration.test_deploy import engine_log
from tests.integration.test_stage_pvc import StagerPod, _vars as stage_vars, mirror  # noqa: F401  pylint: disable=unused-import
from tests.paths import CAPTURES
from tests.testbed import registry as testbed_registry
from tests.unit.plugins.module_utils.test_bench_client import ScriptedSSE

NAME = "canary-llama"
SA = "canary-artifacts"
OPERATOR = "canary-operator"
TARGET_MOUNT, DRAFT_MOUNT = "/mnt/models/target", "/mnt/models/draft"
NAMESPACED = ["/api/v1/namespaces/{ns}/%s" % r for r in ("configmaps", "pods", "serviceaccounts", "services", "events",
                                                         "persistentvolumeclaims", "endpoints")]
NAMESPACED += ["/apis/apps/v1/namespaces/{ns}/deployments", "/apis/apps/v1/namespaces/{ns}/replicasets",
               "/apis/batch/v1/namespaces/{ns}/jobs", "/apis/batch/v1beta1/namespaces/{ns}/cronjobs",
               "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
               "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
               "/apis/serving.kserve.io/v1beta1/namespaces/{ns}/inferenceservices"]


def _canaries():
    tag = uuid.uuid4().hex[:12]
    return {"registry password": "CANARYreg%sPassw0rd" % tag, "hf token": "hf_CANARY%sHubToken" % tag,
            "bearer token": "CANARYbearer%sKey" % tag}


def _forms(name, value, user=None):
    """The value itself, base64 of it, and for registry credentials the docker auth form base64(user:password)."""
    out = {name: value, name + " (base64)": base64.b64encode(value.encode()).decode()}
    if user:
        out[name + " (docker auth)"] = base64.b64encode(("%s:%s" % (user, value)).encode()).decode()
    return out


class Scanner:
    """Counts what was scanned and where any canary form was found."""

    def __init__(self, forms):
        self.forms = forms
        self.hits = []
        self.scanned = {"outputs": [0, 0], "files": [0, 0], "archive members": [0, 0], "API objects": [0, 0]}

    def text(self, kind, where, data):
        if isinstance(data, bytes):
            data = data.decode("utf-8", "replace")
        self.scanned[kind][0] += 1
        self.scanned[kind][1] += len(data.encode("utf-8"))
        for name, value in self.forms.items():
            if value in data:
                self.hits.append("%s found in %s" % (name, where))

    def tree(self, root):
        for base, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(base, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as fh:
                    self.text("files", path, fh.read())
                if name.endswith(".tar.gz"):
                    with tarfile.open(path) as tar:
                        for member in tar.getmembers():
                            if member.isfile():
                                self.text("archive members", "%s:%s" % (path, member.name), tar.extractfile(member).read())

    def run(self, label, run):
        self.text("outputs", label + " stdout/stderr", run.stdout + "\n" + run.stderr)

    def report(self):
        return ", ".join("%s: %d (%d bytes)" % (k, v[0], v[1]) for k, v in self.scanned.items())


def _sa_auth(controlplane, k8s_client, namespace):
    """A ServiceAccount token (bound to cluster-admin for this test) as the env-var auth kubernetes.core reads."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    path = controlplane.kubeconfig_for_service_account(namespace, OPERATOR)
    with open(path, encoding="utf-8") as fh:
        token = yaml.safe_load(fh)["users"][0]["user"]["token"]
    client.RbacAuthorizationV1Api(k8s_client).create_cluster_role_binding({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "canary-" + namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": namespace}]})
    return token, {"K8S_AUTH_API_KEY": token, "K8S_AUTH_HOST": controlplane.server, "K8S_AUTH_SSL_CA_CERT": controlplane.ca_path}


def _model(root, seed):
    os.makedirs(root)
    with open(os.path.join(root, "config.json"), "w", encoding="utf-8") as fh:
        json.dump({"architectures": ["LlamaForCausalLM"], "seed": seed}, fh)
    with open(os.path.join(root, "model.safetensors"), "wb") as fh:
        fh.write(bytes([seed]) * 8192)
    return root


def test_canaries_never_leak(tmp_path, kubeconfig, k8s_client, controlplane, kubelet, kserve, namespace, mirror):  # noqa: F811
    # pylint: disable=too-many-locals,too-many-statements,redefined-outer-name
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    canary = _canaries()
    testbed_registry.ensure_tools()
    reg = testbed_registry.Registry(str(tmp_path / "registry"), auth="htpasswd", users={"robot": canary["registry password"]}).start()
    sse = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedSSE)
    threading.Thread(target=sse.serve_forever, daemon=True).start()
    sa_token, sa_env = _sa_auth(controlplane, k8s_client, namespace)
    forms = {}
    forms.update(_forms("registry password", canary["registry password"], user="robot"))
    forms.update(_forms("hf token", canary["hf token"]))
    forms.update(_forms("bearer token", canary["bearer token"]))
    forms.update(_forms("service account token", sa_token))
    forms.update(_forms("admin token", controlplane.tokens["admin"]))
    scan = Scanner(forms)
    home = tmp_path / "home"
    home.mkdir()
    out = {k: tmp_path / k for k in ("gitops", "reports", "bundle", "logs")}
    for path in out.values():
        path.mkdir()
    (tmp_path / "pvc").mkdir()
    env = {"HOME": str(home)}
    sa_run = dict(env, **sa_env)
    target = _model(str(tmp_path / "model" / "target"), 1)
    draft = _model(str(tmp_path / "model" / "draft"), 2)
    build = {"target_dir": target, "draft_dir": draft, "username": "robot", "password": canary["registry password"], "tls_verify": False}
    deploy = {"spec_decoding_hosts": "localhost", "spec_decoding_namespace": namespace, "spec_decoding_isvc_name": NAME,
              "spec_decoding_runtime": "aml-vllm-0.32.0", "spec_decoding_vllm_version": "0.32.0", "spec_decoding_gpu_count": 0,
              "spec_decoding_dtype": "bfloat16", "spec_decoding_artifact_mode": "modelcar",
              "spec_decoding_artifacts": {"modelcar_image": "%s/canary/llama-eagle3:v1" % reg.host},
              "spec_decoding_modelcar_build": build, "spec_decoding_service_account_name": SA, "spec_decoding_wait_timeout": 60}
    with open(os.path.join(CAPTURES, "baseline", "startup.log"), encoding="utf-8") as fh:
        kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=fh.read())
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=engine_log(TARGET_MOUNT, DRAFT_MOUNT), generation=1)
    runs = []
    try:
        # 1. Credentials on the cluster (admin kubeconfig): the HF token and the registry password go into Secrets.
        runs.append(("credentials", run_playbook(tmp_path, "playbooks/credentials.yml", kubeconfig=kubeconfig, verbosity=3, env=env, extra_vars={
            "spec_decoding_hosts": "localhost", "artifact_credentials_target": "cluster", "artifact_credentials_namespace": namespace,
            "artifact_credentials_service_account_name": SA, "artifact_credentials_hf_token": canary["hf token"],
            "artifact_credentials_registries": [{"server": reg.host, "username": "robot", "password": canary["registry password"]}]})))
        # 2. Deploy in GitOps mode with the Modelcar push (registry password as a module parameter).
        runs.append(("deploy gitops + modelcar push", run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", verbosity=3, env=env, extra_vars=dict(
            deploy, spec_decoding_target="gitops", spec_decoding_gitops_dir=str(out["gitops"]), spec_decoding_verify=False))))
        # 3. The push module alone, with its progress log.
        runs.append(("modelcar_image with progress log", run_playbook(tmp_path, verbosity=3, env=env, tasks="""
        - name: Push with a progress log
          alauda.spec_decoding.modelcar_image:
            target_dir: %s
            draft_dir: %s
            image: %s/canary/direct:v1
            username: robot
            password: "{{ canary_password }}"
            tls_verify: false
            progress_log: %s/modelcar-push.log
        """ % (target, draft, reg.host, out["logs"]), extra_vars={"canary_password": canary["registry password"]})))
        # 4. Deploy on the cluster with the ServiceAccount token, the verify role at the end.
        runs.append(("deploy cluster + verify", run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", verbosity=3, env=sa_run, extra_vars=dict(
            deploy, spec_decoding_target="cluster", spec_decoding_verify=True))))
        # 5. Stage a PVC with the HF token Secret handed to the stager Job.
        with StagerPod(k8s_client, kubelet, namespace, str(tmp_path / "pvc")):
            runs.append(("stage_pvc", run_playbook(tmp_path, verbosity=3, env=sa_run, timeout=300, tasks="""
            - name: Stage
              ansible.builtin.include_role:
                name: alauda.spec_decoding.stage_pvc
            """, extra_vars=stage_vars(namespace, "canary-models", [{"name": "org/llama", "subdir": "target", "source": mirror["url"]}],
                                       stage_pvc_min_size="1Mi", stage_pvc_hf_token_secret=SA + "-hf"))))
        # 6. Verify, troubleshoot, benchmark (bearer token canary) and rollback with the ServiceAccount token.
        runs.append(("verify", run_playbook(tmp_path, "playbooks/verify.yml", verbosity=3, env=sa_run, extra_vars={
            "verify_name": NAME, "verify_namespace": namespace, "verify_wait_timeout": 60, "verify_wait_interval": 1, "verify_metrics": False})))
        runs.append(("troubleshoot", run_playbook(tmp_path, "playbooks/troubleshoot.yml", verbosity=3, env=sa_run, extra_vars={
            "troubleshoot_names": ["%s/%s" % (namespace, NAME)], "troubleshoot_dest": str(out["bundle"]),
            "troubleshoot_kserve_namespaces": [namespace], "troubleshoot_redact": [canary["bearer token"]]})))
        url = "http://127.0.0.1:%d" % sse.server_address[1]
        runs.append(("benchmark", run_playbook(tmp_path, "playbooks/benchmark.yml", verbosity=3, env=sa_run, extra_vars={
            "benchmark_namespace": namespace, "benchmark_candidate_name": NAME, "benchmark_baseline_url": url, "benchmark_candidate_url": url,
            "benchmark_workload": "general_chat", "benchmark_max_tokens": 32, "benchmark_concurrency": 3,
            "benchmark_bearer_token": canary["bearer token"], "benchmark_report_dir": str(out["reports"]),
            "benchmark_gpu_model": "cpu", "benchmark_gpu_count": 0, "benchmark_baseline_command": "vllm serve %s" % TARGET_MOUNT})))
        runs.append(("rollback", run_playbook(tmp_path, "playbooks/rollback.yml", verbosity=3, env=sa_run, extra_vars={
            "rollback_names": ["%s/%s" % (namespace, NAME)], "rollback_wait_timeout": 60, "rollback_wait_sleep": 1,
            "rollback_verify_delay": 1})))
        for label, run in runs:
            scan.run(label, run)
        failed = ["%s (rc %d): %s" % (label, run.rc, run.output[-2500:]) for label, run in runs if run.rc != 0]
        assert not failed, "\n\n".join(failed) + "\nleaks so far: %s" % scan.hits

        # The canaries were really used: the Secrets hold them, the registry accepted the password, the bearer token was sent.
        core = client.CoreV1Api(k8s_client)
        assert base64.b64decode(core.read_namespaced_secret(SA + "-hf", namespace).data["HF_TOKEN"]).decode() == canary["hf token"]
        job = [j for j in client.BatchV1Api(k8s_client).list_namespaced_job(namespace).items if j.metadata.name.startswith("canary-models-stage")]
        refs = [e.value_from.secret_key_ref.name for e in job[0].spec.template.spec.containers[0].env or [] if e.name == "HF_TOKEN"]
        assert refs == [SA + "-hf"]
        assert "Bearer " + canary["bearer token"] in [b[2] for b in ScriptedSSE.bodies]
        assert os.listdir(os.path.join(reg.storage, "docker", "registry", "v2", "repositories", "canary"))

        # Files the collection wrote, the HOME the runs used, the registry's storage.
        for path in list(out.values()) + [home, reg.storage]:
            scan.tree(str(path))
        assert scan.scanned["files"][0] >= 5 and scan.scanned["archive members"][0] >= 3, scan.report()
        # Everything the API server holds in the namespace except Secrets.
        api = controlplane.rest()
        try:
            for path in NAMESPACED:
                for item in api.get(path.format(ns=namespace))["items"]:
                    meta = item["metadata"]
                    scan.text("API objects", "%s %s" % (path.rsplit("/", 1)[-1], meta["name"]), json.dumps(item))
        finally:
            api.close()
    finally:
        sse.shutdown()
        sse.server_close()
        reg.stop()
        client.RbacAuthorizationV1Api(k8s_client).delete_cluster_role_binding("canary-" + namespace)
    print("\nsecret canaries: %d values (%s)" % (len(forms), ", ".join(sorted(forms))))
    print("runs at -vvv: %s" % ", ".join(label for label, _r in runs))
    print("scanned: %s" % scan.report())
    print("hits: %d" % len(scan.hits))
    assert not scan.hits, "\n".join(scan.hits)
