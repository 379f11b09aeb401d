"""A real Kubernetes control plane on loopback: etcd, kube-apiserver (token auth + RBAC), kube-controller-manager.

    cp = ControlPlane()            # binaries from tests.testbed.build (built once per machine, then cached)
    cp.start()                     # free ports, fresh certs, state in a per-run directory
    cp.kubeconfig                  # admin kubeconfig (static token, group system:masters)
    cp.kubeconfig_for_user("limited-user")   # a user with no rights until a test binds RBAC to it
    cp.install_crds()              # KServe CRDs, `default: ""` lines dropped at install time
    cp.stop()                      # SIGTERM/SIGKILL exactly the process groups it started

Every process runs in its own session (process group); the run's `state.json` lists them so
`python -m tests.testbed.cli down` can stop a control plane started by another Python process.
Nothing listens on anything but 127.0.0.1, and the Service CIDR is 127.96.0.0/16.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from . import build as _build
from . import crds as _crds
from . import pki
from . import ports as _ports

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVICE_CIDR = "127.96.0.0/16"
SERVICE_IP = "127.96.0.1"
DEFAULT_EXTRA_USERS = ("limited-user", "limited-user-2", "readonly-user")
# The four CRDs a 1.20 API server accepts after the `default: ""` edit (see the CRD folder's SOURCE.md).
DEFAULT_CRDS = _crds.REQUIRED


class ControlPlaneError(RuntimeError):
    """The control plane could not start or answer; the message names the component and its log file."""


def kserve_crd_dir() -> str:
    """The folder of the KServe CRDs, in the order of tests/testbed/crds.py ($ALAUDA_KSERVE_CRDS, ../shared/kserve-crds,
    a cluster named by $ALAUDA_KSERVE_CRDS_KUBECONFIG); raises crds.CrdsNotFound naming the three ways."""
    return _crds.resolve()


def free_port() -> int:
    return _ports.free_port()


def listening_ports(pids) -> list[tuple[int, int]]:
    """(pid, port) of TCP sockets in LISTEN state owned by any of `pids` (read from /proc)."""
    inodes = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    if parts[3] == "0A" and parts[9] in inodes:
                        found.append((inodes[parts[9]], int(parts[1].rsplit(":", 1)[1], 16)))
        except OSError:
            continue
    return found


def port_is_listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


APISERVER_DRAIN_SECONDS = 0.5


def _stop_apiserver_process(pid: int, port: int, timeout: float = 10.0) -> None:
    """SIGTERM kube-apiserver's group, wait until its port refuses connections (or it exits), give its in-flight short
    requests APISERVER_DRAIN_SECONDS, then stop the group (SIGKILL for what still runs: the watches it would drain)."""
    if not _pid_alive(pid):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _pid_alive(pid) and port_is_listening(port):
        time.sleep(0.05)
    stop_process_group(pid, timeout=APISERVER_DRAIN_SECONDS)


def stop_process_group(pid: int, expect: str | None = None, timeout: float = 10.0) -> None:
    """SIGTERM the process group led by `pid` (our Popen used start_new_session), then SIGKILL if needed.

    `expect` guards against pid reuse: the group is signalled only if /proc/<pid>/cmdline contains it.
    """
    if not _pid_alive(pid):
        return
    if expect:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if expect.encode() not in fh.read():
                    return
        except OSError:
            return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not _pid_alive(pid):
            break
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)  # leftovers of the group, or a leader that ignored SIGTERM
    except ProcessLookupError:
        pass
    for _attempt in range(100):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not _pid_alive(pid):
            return
        time.sleep(0.05)


def _kubeconfig_yaml(server: str, ca: str, user: str, token: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": f"{user}@testbed", "context": {"cluster": "testbed", "user": user}}],
        "current-context": f"{user}@testbed",
    }, indent=2)


class ControlPlane:
    """One etcd + kube-apiserver + kube-controller-manager on loopback, owned by this object."""

    def __init__(self, bin_dir: str | None = None, state_dir: str | None = None,
                 extra_users=DEFAULT_EXTRA_USERS, controller_manager: bool = True):
        self.bin_dir = bin_dir
        self.state_dir = state_dir
        self.extra_users = tuple(extra_users)
        self.with_controller_manager = controller_manager
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.tokens: dict[str, str] = {}
        self.kubeconfig = None
        self.etcd_data = None
        self.timings: dict[str, float] = {}
        self._kubeconfigs: dict[str, str] = {}
        self._api = None

    # ---------------------------------------------------------------------------------------------
    # start

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def egress_socket(self) -> str:
        """The Unix socket the API server sends its node traffic through (kubelet logs, pods/proxy, services/proxy):
        an HTTP CONNECT proxy the kubelet stand-in serves (tests/testbed/pod_network.py), as konnectivity serves a real
        one. It lets a pod have an address of its own network namespace, which the API server could not reach."""
        return os.path.join(self.state_dir, "node-network.sock")

    @property
    def ca_path(self) -> str:
        return os.path.join(self.state_dir, "pki", "ca.crt")

    def start(self, timeout: float = 120.0) -> "ControlPlane":
        t0 = time.monotonic()
        if not self.bin_dir:
            self.bin_dir = _build.build()
        self.timings["binaries"] = time.monotonic() - t0
        for name in _build.BINARIES:
            if not os.access(os.path.join(self.bin_dir, name), os.X_OK):
                raise ControlPlaneError(f"{name} is missing from {self.bin_dir}; run `python -m tests.testbed.build`")
        etcd = shutil.which("etcd")
        if not etcd:
            raise ControlPlaneError("etcd is not on PATH; `python -m tests.testbed.build` installs the etcd-server "
                                    "apt package")
        if not self.state_dir:
            self.state_dir = tempfile.mkdtemp(prefix="alauda-testbed-")
        os.makedirs(self.state_dir, exist_ok=True)
        self.log_dir = os.path.join(self.state_dir, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        self._write_pki()
        self.timings["pki"] = time.monotonic() - t0
        try:
            for attempt in range(3):
                self.ports = {"etcd": free_port(), "etcd_peer": free_port(), "apiserver": free_port()}
                try:
                    self._start_etcd(etcd)
                    self._start_apiserver()
                    self._wait_apiserver(t0 + timeout)
                    break
                except ControlPlaneError as exc:
                    # Another run may have taken a port between our probe and the bind: retry on new ports.
                    if "address already in use" not in str(exc) or attempt == 2:
                        raise
                    self._stop_processes()
            self.timings["apiserver_ready"] = time.monotonic() - t0
            if self.with_controller_manager:
                self._start_controller_manager()
            self._save_state()
            self.timings["started"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        return self

    def _write_pki(self) -> None:
        d = os.path.join(self.state_dir, "pki")
        os.makedirs(d, exist_ok=True)
        self.ca = pki.CertificateAuthority(d)
        self.apiserver_cert = self.ca.issue(
            "apiserver", "kube-apiserver", server=True,
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"),
            ips=("127.0.0.1", SERVICE_IP))
        self.kubelet_client_cert = self.ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                                 orgs=("system:masters",), client=True)
        self.kubelet_serving_cert = self.ca.issue("kubelet", "testbed-node", server=True, ips=("127.0.0.1",),
                                                  dns=("localhost",))
        self.sa_key, self.sa_pub = pki.service_account_keypair(d)
        rows = []
        self.tokens = {"admin": secrets.token_hex(16), "system:kube-controller-manager": secrets.token_hex(16)}
        rows.append(f'{self.tokens["admin"]},admin,admin,"system:masters"')
        rows.append(f'{self.tokens["system:kube-controller-manager"]},system:kube-controller-manager,'
                    'system:kube-controller-manager')
        for user in self.extra_users:
            self.tokens[user] = secrets.token_hex(16)
            rows.append(f"{self.tokens[user]},{user},{user}")
        self.token_file = os.path.join(d, "tokens.csv")
        with open(self.token_file, "w", encoding="utf-8") as fh:
            fh.write("\n".join(rows) + "\n")
        os.chmod(self.token_file, 0o600)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log_path = os.path.join(self.log_dir, f"{name}.log")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=self.state_dir)
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 25) -> str:
        try:
            with open(os.path.join(self.log_dir, f"{name}.log"), encoding="utf-8", errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return ""

    def _died(self, name: str) -> ControlPlaneError:
        proc = self.procs[name]
        return ControlPlaneError(f"{name} exited with code {proc.returncode} during start-up; "
                                 f"log {os.path.join(self.log_dir, name + '.log')}:\n{self.log_tail(name)}")

    def _start_etcd(self, etcd: str) -> None:
        shm = "/dev/shm"
        base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else self.state_dir
        self.etcd_data = tempfile.mkdtemp(prefix="alauda-testbed-etcd-", dir=base)
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd_peer']}"
        self._spawn("etcd", [
            etcd, "--name", "testbed", "--data-dir", self.etcd_data,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"testbed={peer}", "--initial-cluster-state", "new",
            "--quota-backend-bytes", str(2 * 1024 ** 3), "--log-level", "warn", "--logger", "zap",
        ])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.procs["etcd"].poll() is not None:
                raise self._died("etcd")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise ControlPlaneError(f"etcd did not report healthy at {client}/health within 20 s:\n{self.log_tail('etcd')}")

    def _audit_args(self, pkid):
        """With ALAUDA_TESTBED_AUDIT_LOG=<file>: the API server's audit log at Metadata level (who asked what, with its
        user agent), to find which client makes a tier's requests; off by default (it costs the API server CPU)."""
        path = os.environ.get("ALAUDA_TESTBED_AUDIT_LOG")
        if not path:
            return []
        policy = os.path.join(pkid, "audit-policy.json")
        with open(policy, "w", encoding="utf-8") as fh:
            json.dump({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [
                {"level": "Metadata", "omitStages": ["RequestReceived"]}]}, fh)
        return [f"--audit-policy-file={policy}", f"--audit-log-path={path}.{self.ports['apiserver']}", "--audit-log-format=json"]

    def _start_apiserver(self) -> None:
        pkid = os.path.join(self.state_dir, "pki")
        cert, key = self.apiserver_cert
        kcert, kkey = self.kubelet_client_cert
        egress = os.path.join(pkid, "egress-selector.json")
        with open(egress, "w", encoding="utf-8") as fh:
            json.dump({"apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
                       "egressSelections": [{"name": "cluster", "connection": {
                           "proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": self.egress_socket}}}}]}, fh)
        self._spawn("kube-apiserver", [
            os.path.join(self.bin_dir, "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}", "--insecure-port=0",
            f"--cert-dir={pkid}", f"--tls-cert-file={cert}", f"--tls-private-key-file={key}",
            f"--client-ca-file={self.ca.cert_path}",
            f"--token-auth-file={self.token_file}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-key-file={self.sa_pub}",
            f"--service-account-signing-key-file={self.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--endpoint-reconciler-type=none",
            f"--kubelet-client-certificate={kcert}", f"--kubelet-client-key={kkey}",
            f"--kubelet-certificate-authority={self.ca.cert_path}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--egress-selector-config-file={egress}",
            "--allow-privileged=true", "--profiling=false",
            "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,DefaultTolerationSeconds,ResourceQuota,"
            "LimitRanger",
            "--v=1",
        ] + self._audit_args(pkid))
        time.sleep(0.2)
        if self.procs["kube-apiserver"].poll() is not None:
            raise self._died("kube-apiserver")

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_path)
        return ctx

    def _wait_apiserver(self, deadline: float) -> None:
        ctx = self._ssl_context()
        req = urllib.request.Request(f"{self.server}/readyz",
                                     headers={"Authorization": f"Bearer {self.tokens['admin']}"})
        last = ""
        while time.monotonic() < deadline:
            if self.procs["kube-apiserver"].poll() is not None:
                raise self._died("kube-apiserver")
            try:
                with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                    if resp.status == 200:
                        break
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.1)
        else:
            raise ControlPlaneError(f"kube-apiserver at {self.server} was not ready in time ({last}); log:\n"
                                    f"{self.log_tail('kube-apiserver')}")
        self.kubeconfig = self._write_kubeconfig("admin", self.tokens["admin"])
        self._kubeconfigs["admin"] = self.kubeconfig

    def _start_controller_manager(self) -> None:
        kcm_kubeconfig = self._write_kubeconfig("system:kube-controller-manager",
                                                self.tokens["system:kube-controller-manager"],
                                                filename="kube-controller-manager.kubeconfig")
        self._spawn("kube-controller-manager", [
            os.path.join(self.bin_dir, "kube-controller-manager"),
            f"--kubeconfig={kcm_kubeconfig}",
            "--port=0", "--secure-port=0",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.sa_key}",
            f"--root-ca-file={self.ca.cert_path}",
            # No kubelet heartbeats here (the stand-in node is static), no cloud: keep those controllers off.
            "--controllers=*,-nodelifecycle,-nodeipam,-cloud-node-lifecycle,-service,-route,-attachdetach,"
            "-persistentvolume-binder,-persistentvolume-expander,-ttl",
            "--v=1",
        ])
        time.sleep(0.1)
        if self.procs["kube-controller-manager"].poll() is not None:
            raise self._died("kube-controller-manager")

    def _write_kubeconfig(self, user: str, token: str, filename: str | None = None) -> str:
        safe = user.replace(":", "-")
        path = os.path.join(self.state_dir, filename or f"kubeconfig-{safe}")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(_kubeconfig_yaml(self.server, self.ca_path, user, token))
        os.chmod(path, 0o600)
        return path

    def _save_state(self) -> None:
        state = {
            "state_dir": self.state_dir, "kubeconfig": self.kubeconfig, "server": self.server,
            "tokens_file": self.token_file,
            "ports": self.ports, "etcd_data": self.etcd_data, "bin_dir": self.bin_dir,
            "processes": {name: {"pid": p.pid, "argv0": p.args[0]} for name, p in self.procs.items()},
        }
        path = os.path.join(self.state_dir, "state.json")
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=2)
        os.replace(path + ".tmp", path)

    @classmethod
    def attach(cls, state_dir: str) -> "ControlPlane":
        """A ControlPlane object for a run started elsewhere (e.g. `cli up`): clients, users and certs work;
        stop() here stops nothing that was not added with add_process()."""
        with open(os.path.join(state_dir, "state.json"), encoding="utf-8") as fh:
            state = json.load(fh)
        cp = cls(bin_dir=state.get("bin_dir"), state_dir=state_dir)
        cp.ports = state["ports"]
        cp.kubeconfig = state["kubeconfig"]
        cp._kubeconfigs["admin"] = cp.kubeconfig  # pylint: disable=protected-access
        cp.etcd_data = None
        cp.log_dir = os.path.join(state_dir, "logs")
        pkid = os.path.join(state_dir, "pki")
        cp.ca = type("CA", (), {"cert_path": os.path.join(pkid, "ca.crt"), "key_path": os.path.join(pkid, "ca.key")})
        cp.kubelet_serving_cert = (os.path.join(pkid, "kubelet.crt"), os.path.join(pkid, "kubelet.key"))
        cp.token_file = state.get("tokens_file") or os.path.join(pkid, "tokens.csv")
        with open(cp.token_file, encoding="utf-8") as fh:
            for row in fh:
                token, user = row.split(",")[:2]
                cp.tokens[user] = token
        cp.extra_users = tuple(u for u in cp.tokens if u not in ("admin", "system:kube-controller-manager"))
        return cp

    def add_process(self, name: str, proc: subprocess.Popen) -> None:
        """Track a helper process (started with start_new_session=True) so stop()/cli down end it too."""
        self.procs[name] = proc
        self._save_state()

    # ---------------------------------------------------------------------------------------------
    # clients, users

    def api_client(self, user: str = "admin"):
        """A `kubernetes` ApiClient for `user` (admin is cached; others are new clients the caller closes)."""
        from kubernetes import config  # pylint: disable=import-outside-toplevel
        if user == "admin":
            if self._api is None:
                self._api = config.new_client_from_config(config_file=self.kubeconfig)
            return self._api
        return config.new_client_from_config(config_file=self.kubeconfig_for_user(user))

    def kubeconfig_for_user(self, user: str) -> str:
        """Kubeconfig for a static-token user configured at start (extra_users). It has no RBAC rights until a
        test binds a Role/ClusterRole to User `<user>`."""
        if user in self._kubeconfigs:
            return self._kubeconfigs[user]
        if user not in self.tokens or user == "system:kube-controller-manager":
            raise KeyError(f"user {user!r} has no static token; pass it in ControlPlane(extra_users=...) "
                           f"(configured: {', '.join(self.extra_users)})")
        self._kubeconfigs[user] = self._write_kubeconfig(user, self.tokens[user])
        return self._kubeconfigs[user]

    def rest(self, user: str = "admin", timeout: float = 60.0):
        """A small dict-based REST client (tests.testbed.rest.Rest) for `user`; one per thread."""
        from .rest import Rest  # pylint: disable=import-outside-toplevel
        return Rest(self.server, self.tokens[user], self.ca_path, timeout=timeout)

    def kubeconfig_for_service_account(self, namespace: str, name: str, timeout: float = 30.0) -> str:
        """Create ServiceAccount namespace/name if needed, wait for its token Secret (made by the
        controller manager's token controller) and write a kubeconfig for
        `system:serviceaccount:<namespace>:<name>`."""
        import base64  # pylint: disable=import-outside-toplevel
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        api = self.rest()
        try:
            try:
                api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
            except ApiError as exc:
                if exc.status != 409:
                    raise
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                sa = api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}")
                for ref in sa.get("secrets") or []:
                    secret = api.get(f"/api/v1/namespaces/{namespace}/secrets/{ref['name']}")
                    if secret.get("type") == "kubernetes.io/service-account-token" and \
                            (secret.get("data") or {}).get("token"):
                        token = base64.b64decode(secret["data"]["token"]).decode()
                        return self._write_kubeconfig(f"system:serviceaccount:{namespace}:{name}", token)
                time.sleep(0.2)
        finally:
            api.close()
        raise ControlPlaneError(f"no token Secret appeared for ServiceAccount {namespace}/{name} within {timeout} s; "
                                f"is kube-controller-manager running? log:\n{self.log_tail('kube-controller-manager')}")

    def wait_for_controller_manager(self, timeout: float = 60.0) -> None:
        """Block until the controller manager created the `default` ServiceAccount (with its token) in `default`."""
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        api = self.rest()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                try:
                    if api.get("/api/v1/namespaces/default/serviceaccounts/default").get("secrets"):
                        return
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                proc = self.procs.get("kube-controller-manager")
                if proc is not None and proc.poll() is not None:
                    raise self._died("kube-controller-manager")
                time.sleep(0.1)
        finally:
            api.close()
        raise ControlPlaneError("kube-controller-manager did not create the default ServiceAccount in time; log:\n"
                                + self.log_tail("kube-controller-manager"))

    # ---------------------------------------------------------------------------------------------
    # CRDs

    def install_crds(self, crd_dir: str | None = None, files=DEFAULT_CRDS, timeout: float = 180.0) -> list[str]:
        """Create the KServe CRDs with every `default: ""` line dropped (the shared files stay untouched);
        wait until each is Established and its API is served. Returns the CRD names."""
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        crd_dir = crd_dir or kserve_crd_dir()
        api = self.rest(timeout=timeout)
        names, versions = [], set()
        try:
            for fname in files:
                path = os.path.join(crd_dir, fname)
                body = _load_crd(path)
                try:
                    api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body)
                except ApiError as exc:
                    if exc.status != 409:
                        raise ControlPlaneError(f"installing CRD from {path} failed: HTTP {exc.status}: "
                                                f"{exc.message}") from exc
                names.append(body["metadata"]["name"])
                versions.update(f"/apis/{body['spec']['group']}/{v['name']}" for v in body["spec"]["versions"]
                                if v.get("served"))
            deadline = time.monotonic() + timeout
            for name in names:
                while True:
                    crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                    conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
                    if conds.get("Established") == "True":
                        break
                    if time.monotonic() > deadline:
                        raise ControlPlaneError(f"CRD {name} not Established within {timeout} s: {conds}")
                    time.sleep(0.05)
            # Discovery can lag a moment behind Established; wait until every version is served.
            for path in sorted(versions):
                while True:
                    try:
                        api.get(path)
                        break
                    except ApiError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
        finally:
            api.close()
        return names

    # ---------------------------------------------------------------------------------------------
    # restart (fault tests)

    def stop_apiserver(self) -> None:
        """Stop only kube-apiserver (SIGTERM, then SIGKILL); etcd and the controller manager keep running.

        On SIGTERM kube-apiserver closes its listener at once (every new request is refused from then on) and then drains
        its open watches for up to a minute before it exits (measured on the test bed with the stand-ins' watches open:
        refused after 0.5 s, still running after 14 s). Those seconds were dead time of every stop (10 s, until
        stop_process_group's SIGKILL): once the port refuses, the process gets APISERVER_DRAIN_SECONDS for its in-flight
        short requests and is then killed, which ends the draining watches as the exit would."""
        proc = self.procs.get("kube-apiserver")
        if proc is None:
            raise ControlPlaneError("kube-apiserver is not running under this ControlPlane object")
        _stop_apiserver_process(proc.pid, self.ports["apiserver"])
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        del self.procs["kube-apiserver"]

    def start_apiserver(self, timeout: float = 240.0) -> None:
        """Start kube-apiserver again on the same port, certificates, tokens and etcd data; wait for /readyz."""
        if "kube-apiserver" in self.procs:
            raise ControlPlaneError("kube-apiserver is already running; call stop_apiserver() first")
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._start_apiserver()
                self._wait_apiserver(deadline)
                break
            except ControlPlaneError as exc:
                # The old socket may linger for a moment after the stop: retry on the same port until the deadline.
                if "address already in use" not in str(exc) or time.monotonic() > deadline:
                    raise
                self.procs.pop("kube-apiserver", None)
                time.sleep(0.2)
        self._save_state()

    def restart(self, down_seconds: float = 0.0, timeout: float = 240.0) -> float:
        """Stop kube-apiserver, stay down `down_seconds`, start it on the same port/certs/etcd data, wait until ready.
        Clients keep their kubeconfigs (same server URL and tokens). Returns the seconds the API was unavailable."""
        t0 = time.monotonic()
        self.stop_apiserver()
        if down_seconds > 0:
            time.sleep(down_seconds)
        self.start_apiserver(timeout=timeout)
        self.timings["last_restart"] = time.monotonic() - t0
        return self.timings["last_restart"]

    # ---------------------------------------------------------------------------------------------
    # stop

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def _stop_processes(self) -> None:
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if name == "kube-apiserver":  # its watches drain for up to a minute after SIGTERM (stop_apiserver)
                _stop_apiserver_process(proc.pid, self.ports["apiserver"])
            else:
                stop_process_group(proc.pid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        if self.etcd_data:
            shutil.rmtree(self.etcd_data, ignore_errors=True)
            self.etcd_data = None

    def stop(self, remove_state: bool = True) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None
        self._stop_processes()
        if remove_state and self.state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _load_crd(path: str, as_is: bool = False) -> dict:
    """Parse a CRD YAML with the `default: ""` lines dropped (`as_is`: unchanged, as a 1.25+ API server takes it, whose
    defaults the CEL rules see). The parsed form is cached as JSON under ~/.cache/alauda-spec-decoding/crd-json/ keyed
    by the file's sha256 (YAML parsing of the 2 MB InferenceService CRD costs seconds; JSON is milliseconds)."""
    import hashlib  # pylint: disable=import-outside-toplevel
    with open(path, "rb") as fh:
        raw = fh.read()
    cache = os.path.join(_build.CACHE_ROOT, "crd-json", hashlib.sha256(raw).hexdigest() + (".as-is" if as_is else "") + ".json")
    try:
        with open(cache, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        pass
    import yaml  # pylint: disable=import-outside-toplevel
    text = "".join(line for line in raw.decode("utf-8").splitlines(keepends=True) if as_is or line.strip() != 'default: ""')
    body = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(cache + f".{os.getpid()}", "w", encoding="utf-8") as fh:
            json.dump(body, fh)
        os.replace(cache + f".{os.getpid()}", cache)
    except OSError:
        pass
    return body


def stop_from_state(state_dir: str) -> list[str]:
    """Stop the processes recorded in <state_dir>/state.json (used by `cli down`). Returns their names."""
    path = os.path.join(state_dir, "state.json")
    with open(path, encoding="utf-8") as fh:
        state = json.load(fh)
    stopped = []
    for name in reversed(list(state.get("processes", {}))):
        info = state["processes"][name]
        stop_process_group(info["pid"], expect=os.path.basename(info.get("argv0", "")) or None)
        stopped.append(name)
    if state.get("etcd_data"):
        shutil.rmtree(state["etcd_data"], ignore_errors=True)
    return stopped
