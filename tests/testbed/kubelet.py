"""A kubelet stand-in for the loopback control plane: one Node, pod binding, pod status, and container logs.

What it does, and why:
- Registers a Node (address InternalIP 127.0.0.1, `status.daemonEndpoints.kubeletEndpoint.port` = its HTTPS
  port) so the API server's real `pods/log` endpoint proxies to it (the API server is started with
  `--kubelet-preferred-address-types=InternalIP`, `--kubelet-client-certificate/-key` and
  `--kubelet-certificate-authority`; this server requires that client certificate).
- Serves `GET /containerLogs/<namespace>/<pod>/<container>` with `tailLines`, `sinceSeconds`, `sinceTime`,
  `timestamps`, `limitBytes`, `previous` and a simple `follow`, from files written with `write_log()` (CRI
  log format, like the real kubelet's files, so each line keeps its time). That makes `kubectl logs`,
  `kubernetes.core.k8s_log` and `CoreV1Api.read_namespaced_pod_log` return real text.
- Plays scheduler + kubelet for pods: binds Pending pods without a node to this node (pods/binding), then
  marks them Running (podIP 127.0.0.1) and Ready according to a behaviour (ready after N seconds, never
  ready, crash-looping), and finishes graceful deletion (delete with grace period 0) like a kubelet does
  once the containers stopped. Behaviours are chosen per pod by `set_behaviour(match, PodBehaviour(...))`.

Not served: exec/attach/port-forward, /stats. `pods/proxy` cannot reach a loopback pod IP because the API
server refuses to proxy to loopback addresses (IsProxyableIP). Opt-in per pod, a pod can instead get this host's
non-loopback IPv4 address (`host_ipv4()`, e.g. the eth0 address; the traffic still never leaves the machine) as
its podIP and real HTTP servers bound on that address and the pod's ports (`PodBehaviour(pod_ip=..., http=...)`):
then `GET /api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics` goes through the real API server's pod proxy to
a scripted response (e.g. a /metrics page of a real vLLM capture; the n-th request gets the n-th body). What each
server received is kept (`http_requests()`), with the headers the API server's proxy added (X-Forwarded-Uri names
the pod, which also routes requests when several pods share one address and port).
"""
from __future__ import annotations

import dataclasses
import datetime
import http.server
import ipaddress
import os
import re
import shutil
import socket
import socketserver
import ssl
import tempfile
import threading
import time
import urllib.parse
import uuid

from .controlplane import free_port
from .images import ImageStore
from .pod_network import NodeNetwork
from .pod_process import ProcessMode
from . import ports as _ports
from .wake import EVERYTHING, RESYNC_SECONDS, WatchWaker, WorkQueue

NODE_NAME = "testbed-node"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _rfc3339(ts: datetime.datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


def _rfc3339nano(ts: datetime.datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def _parse_time(text: str) -> datetime.datetime:
    text = text.strip()
    if text.endswith("Z"):
        text = text[:-1]
    if "." in text:
        main, frac = text.split(".", 1)
        text = f"{main}.{frac[:6]}"
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.timezone.utc)


@dataclasses.dataclass
class PodBehaviour:
    """How the stand-in kubelet runs a matching pod.

    ready_after: seconds from start until the Ready condition turns True; None = never ready.
    logs: container name -> text written as that container's log when the pod starts.
    previous_logs: container name -> text of the previous (crashed) instance; restartCount becomes 1.
    crash_loop: containers stay waiting in CrashLoopBackOff (never ready), restartCount grows.
    pod_ip: the podIP reported in status.
    http: port -> {path: response or [responses]}: while the pod runs, a real HTTP server on (pod_ip, port)
        answers GET <path> (query ignored) with the scripted responses in order, the last one repeating. A
        response is str/bytes (200) or (status, str/bytes). Needs a pod_ip the API server proxies to
        (`host_ipv4()`, not loopback); pods sharing address and port are told apart by X-Forwarded-Uri.
    https: those servers speak TLS (the kubelet serving certificate; the API server's pod proxy does not verify
        pod certificates), like vLLM started with --ssl-certfile. Reached as `https:<pod>:<port>`.
    run: "process" runs the pod's containers as real processes (pod_process.py; the other fields then do not
        apply), as the pod annotation `testbed.alauda.io/run: process` does; anything else scripts the pod.
    """
    ready_after: float | None = 0.0
    logs: dict = dataclasses.field(default_factory=dict)
    previous_logs: dict = dataclasses.field(default_factory=dict)
    crash_loop: bool = False
    pod_ip: str = "127.0.0.1"
    http: dict = dataclasses.field(default_factory=dict)
    https: bool = False
    run: str = "scripted"


SIOCGIFFLAGS, SIOCGIFADDR, IFF_UP, IFF_LOOPBACK = 0x8913, 0x8915, 0x1, 0x8


def host_ipv4() -> str | None:
    """This host's first IPv4 address that the API server will proxy to (not loopback, link-local, multicast),
    read from the interfaces that are up; None when there is none. The address is local: traffic to it stays on
    this machine. `ALAUDA_TESTBED_POD_IP` overrides (it must be an address of this host)."""
    import fcntl  # pylint: disable=import-outside-toplevel
    import struct  # pylint: disable=import-outside-toplevel

    def usable(text):
        try:
            addr = ipaddress.IPv4Address(text)
        except ValueError:
            return False
        if addr.is_loopback or addr.is_link_local or addr.is_multicast or addr.is_unspecified:
            return False
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((text, 0))  # only an address of this host binds
        except OSError:
            return False
        return True

    override = os.environ.get("ALAUDA_TESTBED_POD_IP")
    if override:
        return override if usable(override) else None
    for _index, ifname in socket.if_nameindex():
        request = struct.pack("256s", ifname[:15].encode())
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                flags = struct.unpack("H", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request)[16:18])[0]
                if not flags & IFF_UP or flags & IFF_LOOPBACK:
                    continue
                text = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)[20:24])
        except OSError:
            continue
        if usable(text):
            return text
    return None


def free_port_on(address: str) -> int:
    """A TCP port that is free on `address` right now (below the ephemeral range: tests/testbed/ports.py says why)."""
    return _ports.free_port(address)


_PROXY_URI = re.compile(r"/namespaces/([^/]+)/pods/(?:https?:)?([^/:]+)(?::[^/]*)?/proxy(?:/|$)")


class _PodHTTPServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """One real HTTP server on (address, port) for the pods that share it; responses scripted per pod and path."""
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, address: str, port: int, tls: tuple | None = None):
        self.tls = tls is not None
        self.routes = {}     # (namespace, pod) -> {path: [responses]}
        self.counts = {}     # (namespace, pod, path) -> requests served
        self.requests = []   # what came in: namespace, pod, method, path, headers
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                return

            def do_GET(self):  # noqa: N802
                status, body = server.respond(self)
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__((address, port), Handler)
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.socket = ctx.wrap_socket(self.socket, server_side=True)

    def respond(self, handler) -> tuple:
        path = urllib.parse.urlsplit(handler.path).path or "/"
        forwarded = handler.headers.get("X-Forwarded-Uri") or ""
        match = _PROXY_URI.search(forwarded)
        with self.lock:
            key = (match.group(1), match.group(2)) if match else None
            if key not in self.routes and len(self.routes) == 1:
                key = next(iter(self.routes))
            self.requests.append({"namespace": key[0] if key else None, "pod": key[1] if key else None, "tls": self.tls,
                                  "method": handler.command, "path": handler.path, "headers": dict(handler.headers),
                                  "time": time.monotonic()})
            script = self.routes.get(key, {}).get(path)
            if script is None:
                return 404, b"404 page not found\n"
            count = self.counts.get(key + (path,), 0)
            self.counts[key + (path,)] = count + 1
            response = script[min(count, len(script) - 1)]
        status, body = response if isinstance(response, tuple) else (200, response)
        return status, body.encode() if isinstance(body, str) else body


class _LogServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = False


class KubeletStandIn(ProcessMode):
    """Kubelet + scheduler stand-in for one node. Use start()/stop() or a context manager."""

    def __init__(self, controlplane, node_name: str = NODE_NAME, log_dir: str | None = None,
                 idle_interval: float = RESYNC_SECONDS):
        self.cp = controlplane
        self.node_name = node_name
        self.log_dir = log_dir
        self._own_log_dir = log_dir is None
        self.idle_interval = idle_interval  # the resync: pod events, behaviours and readiness delays come before it
        # Pods to handle: (namespace, name) -> the latest watch event of that pod, or None (GET it: a readiness delay
        # ended); EVERYTHING: list them all (start, a watch that listed again, a behaviour set in this process).
        self._queue = WorkQueue()
        self._queue.add(EVERYTHING)
        self.port = None
        self._server = None
        self._threads = []
        self._stop = threading.Event()
        self._behaviours = []  # list of (match callable, PodBehaviour), newest first
        self._lock = threading.Lock()
        self._started = {}  # pod uid -> monotonic start time
        self._http = {}  # (address, port) -> _PodHTTPServer serving pods with PodBehaviour.http
        self.network = None  # NodeNetwork: pod IPs, and the API server's way to the node
        self._process = {}  # pod uid -> ProcessPod (process mode)
        self.pods_dir = None
        self.images = ImageStore()  # process mode's images: add_registry(); root filesystems under the state dir
        self.backoff_seconds = 10.0  # the kubelet's crash back-off base (pod annotation testbed.alauda.io/backoff-seconds)
        # Process mode's longest probe period (pod_process.probe_cadence: the failure threshold scaled, the time to fail
        # kept); None runs every probe at its own periodSeconds.
        self.probe_period_max = 1.0
        self.stopping = False
        self.errors = []

    # ---------------------------------------------------------------------------------------------
    # logs

    def _log_path(self, namespace: str, pod: str, container: str, previous: bool = False) -> str:
        suffix = ".previous.log" if previous else ".log"
        return os.path.join(self.log_dir, namespace, pod, container + suffix)

    def write_log(self, namespace: str, pod: str, container: str, text: str, previous: bool = False,
                  append: bool = True, timestamp: datetime.datetime | None = None) -> str:
        """Write container log text (one CRI record per line, stamped `timestamp` or now). Returns the file."""
        path = self._log_path(namespace, pod, container, previous)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        stamp = _rfc3339nano(timestamp or _now())
        lines = text.splitlines()
        with open(path, "a" if append else "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(f"{stamp} stdout F {line}\n")
        return path

    def clear_logs(self, namespace: str, pod: str) -> None:
        shutil.rmtree(os.path.join(self.log_dir, namespace, pod), ignore_errors=True)

    def read_records(self, namespace, pod, container, previous=False):
        path = self._log_path(namespace, pod, container, previous)
        records = []
        try:
            with open(path, encoding="utf-8") as fh:
                for raw in fh:
                    stamp, _stream, _tag, line = raw.rstrip("\n").split(" ", 3)
                    records.append((stamp, line))
        except FileNotFoundError:
            return None
        return records

    # ---------------------------------------------------------------------------------------------
    # behaviours

    def set_behaviour(self, match, behaviour: PodBehaviour) -> None:
        """Register `behaviour` for pods where match(pod_dict) is true (newest registration wins)."""
        with self._lock:
            self._behaviours.insert(0, (match, behaviour))
        self.wake()

    def clear_behaviours(self) -> None:
        with self._lock:
            self._behaviours.clear()

    def behaviour_for(self, pod: dict) -> PodBehaviour:
        with self._lock:
            for match, behaviour in self._behaviours:
                try:
                    if match(pod):
                        return behaviour
                except Exception:  # pylint: disable=broad-except
                    continue
        return PodBehaviour()

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    def start(self) -> "KubeletStandIn":
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="kubelet-logs-", dir=self.cp.state_dir)
        os.makedirs(self.log_dir, exist_ok=True)
        self.pods_dir = tempfile.mkdtemp(prefix="kubelet-pods-", dir=self.cp.state_dir)
        self.images.directory = tempfile.mkdtemp(prefix="kubelet-images-", dir=self.cp.state_dir)
        self.network = NodeNetwork(self.cp.egress_socket).start()
        self._start_server()
        self._register_node()
        thread = threading.Thread(target=self._loop, name=f"kubelet-{self.node_name}", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self.stopping = True
        self._stop.set()
        self._queue.close()
        with self._lock:
            workers = list(self._process.values())
        for worker in workers:
            worker.terminate(0)
        for worker in workers:
            worker.done.wait(15)
        # The log server's thread is one of self._threads: shut it down first, or the join below waits out its timeout.
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for thread in self._threads:
            thread.join(timeout=10)
        with self._lock:
            servers, self._http = list(self._http.values()), {}
        for server in servers:
            server.shutdown()
            server.server_close()
        if self.network is not None:
            self.network.stop()
            self.network = None
        if self.pods_dir:
            shutil.rmtree(self.pods_dir, ignore_errors=True)
        if self.images.directory:
            shutil.rmtree(self.images.directory, ignore_errors=True)
        if self._own_log_dir and self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _start_server(self) -> None:
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                return

            def _send(self, code, body: bytes, ctype="text/plain; charset=utf-8"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]
                if parts == ["healthz"]:
                    return self._send(200, b"ok")
                if len(parts) == 4 and parts[0] == "containerLogs":
                    return standin._serve_logs(self, parts[1], parts[2], parts[3],
                                               urllib.parse.parse_qs(url.query))
                return self._send(404, b"404 page not found\n")

        self.port = free_port()
        server = _LogServer(("127.0.0.1", self.port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cert, key = self.cp.kubelet_serving_cert
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(self.cp.ca.cert_path)
        ctx.verify_mode = ssl.CERT_REQUIRED  # only the API server's kubelet-client certificate gets in
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self._server = server
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                  name=f"kubelet-http-{self.node_name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _serve_logs(self, handler, namespace, pod, container, query):
        def q(name, default=None):
            return query.get(name, [default])[0]
        previous = q("previous", "false") == "true"
        records = self.read_records(namespace, pod, container, previous)
        if records is None:
            if previous:
                msg = f'previous terminated container "{container}" in pod "{pod}" not found'
                return handler._send(400, msg.encode())
            records = []
        since = None
        if q("sinceSeconds"):
            since = _now() - datetime.timedelta(seconds=int(q("sinceSeconds")))
        elif q("sinceTime"):
            since = _parse_time(q("sinceTime"))
        if since is not None:
            records = [r for r in records if _parse_time(r[0]) >= since]
        tail = q("tailLines")
        if tail is not None and int(tail) >= 0:
            records = records[-int(tail):] if int(tail) else []
        timestamps = q("timestamps", "false") == "true"
        body = "".join(f"{s} {line}\n" if timestamps else f"{line}\n" for s, line in records).encode()
        limit = q("limitBytes")
        if limit is not None:
            body = body[:int(limit)]
        if q("follow", "false") != "true":
            return handler._send(200, body)
        # follow: stream what exists, then new records until the client goes away or we stop.
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        seen = len(self.read_records(namespace, pod, container, previous) or [])
        token = self._follow_token(namespace, pod, container)

        def chunk(data: bytes):
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()
        try:
            if body:
                chunk(body)
            while not self._stop.is_set():
                time.sleep(0.1)
                now = self.read_records(namespace, pod, container, previous) or []
                if len(now) > seen:
                    new = now[seen:]
                    seen = len(now)
                    chunk("".join(f"{s} {l}\n" if timestamps else f"{l}\n" for s, l in new).encode())
                elif token is not None and (previous or not token[-1] or self._follow_token(namespace, pod, container) != token):
                    # a process-mode container's instance ended: so does the follow, as with the kubelet, after the lines
                    # written between the read above and the end
                    last = (self.read_records(namespace, pod, container, previous) or [])[seen:]
                    if last:
                        chunk("".join(f"{s} {l}\n" if timestamps else f"{l}\n" for s, l in last).encode())
                    break
            handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            return None
        return None

    # ---------------------------------------------------------------------------------------------
    # pod HTTP endpoints (PodBehaviour.http)

    def http_requests(self, namespace: str | None = None, pod: str | None = None) -> list:
        """Requests the pods' HTTP servers received (oldest first), optionally of one namespace/pod."""
        with self._lock:
            servers = list(self._http.values())
        out = []
        for server in servers:
            with server.lock:
                out.extend(r for r in server.requests if (namespace is None or r["namespace"] == namespace)
                           and (pod is None or r["pod"] == pod))
        return out

    def _open_http(self, namespace: str, pod: str, behaviour: PodBehaviour) -> None:
        for port, paths in behaviour.http.items():
            key = (behaviour.pod_ip, int(port))
            with self._lock:
                server = self._http.get(key)
            if server is None:
                try:
                    server = _PodHTTPServer(behaviour.pod_ip, int(port),
                                            tls=self.cp.kubelet_serving_cert if behaviour.https else None)
                except OSError as exc:
                    self.errors.append(f"kubelet: pod {namespace}/{pod}: cannot serve HTTP on "
                                       f"{behaviour.pod_ip}:{port}: {exc}")
                    continue
                thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                          name=f"pod-http-{behaviour.pod_ip}:{port}", daemon=True)
                thread.start()
                with self._lock:
                    self._http[key] = server
            with server.lock:
                server.routes[(namespace, pod)] = {
                    path: list(script) if isinstance(script, list) else [script] for path, script in paths.items()}

    def _close_http(self, namespace: str, pod: str) -> None:
        """The pod stopped: forget its routes; a server without pods is shut down (its port is free again)."""
        with self._lock:
            items = list(self._http.items())
        for key, server in items:
            with server.lock:
                server.routes.pop((namespace, pod), None)
                idle = not server.routes
            if idle:
                with self._lock:
                    if self._http.get(key) is server:
                        del self._http[key]
                server.shutdown()
                server.server_close()

    # ---------------------------------------------------------------------------------------------
    # node and pods

    def _register_node(self) -> None:
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        api = self.cp.rest()
        now = _rfc3339(_now())
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.node_name, "labels": {
                "kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "alauda.io/testbed": "kubelet-standin"}},
            "spec": {},
        }
        status = {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet stand-in is posting ready status", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}],
            "nodeInfo": {"kubeletVersion": "v1.20.2", "kubeProxyVersion": "v1.20.2", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "standin://0",
                         "kernelVersion": os.uname().release, "osImage": "testbed", "machineID": "",
                         "systemUUID": "", "bootID": ""},
        }
        try:
            try:
                api.delete(f"/api/v1/nodes/{self.node_name}")
            except ApiError as exc:
                if exc.status != 404:
                    raise
            api.post("/api/v1/nodes", node)
            api.patch(f"/api/v1/nodes/{self.node_name}/status", {"status": status})
        finally:
            api.close()

    def wake(self) -> None:
        """Run a pass over all pods now."""
        self._queue.add(EVERYTHING)

    def _on_event(self, event: dict) -> None:
        meta = (event.get("object") or {}).get("metadata") or {}
        if meta.get("name"):
            self._queue.add((meta.get("namespace"), meta["name"]), event)

    def _pods(self, api, batch: dict) -> list:
        """(event type, pod) of each pod taken from the queue: the pod its latest watch event carried (events come in
        order, so that is the newest state this kubelet knows: a stale write conflicts and the change that made it stale
        brings its own event), a GET for a deferred key, all pods for EVERYTHING."""
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        if EVERYTHING in batch:
            return [("LISTED", pod) for pod in api.get("/api/v1/pods")["items"]]
        out = []
        for (ns, name), event in sorted(batch.items()):
            if event is not None:
                out.append((event.get("type"), event["object"]))
                continue
            try:
                out.append(("GOT", api.get(f"/api/v1/namespaces/{ns}/pods/{name}")))
            except ApiError as exc:
                if exc.status != 404:
                    raise
        return out

    def _loop(self) -> None:
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        api = self.cp.rest()
        waker = WatchWaker(self.cp, ["/api/v1/pods"], self._on_event, self.wake, self._stop, name=f"kubelet-{self.node_name}").start()
        waker.wait_started(10)
        last_full = time.monotonic()
        try:
            while not self._stop.is_set():
                # Woken by a pod event (that pod only), a behaviour set in this process (all pods), the end of a pod's
                # readiness delay (that pod), or the resync interval (all pods).
                batch = self._queue.take(last_full + self.idle_interval)
                if batch is None:
                    break
                if EVERYTHING in batch:
                    last_full = time.monotonic()
                try:
                    pods = self._pods(api, batch)
                except Exception as exc:  # pylint: disable=broad-except
                    if not self._stop.is_set():
                        self.errors.append(f"kubelet loop: {exc!r}")
                        for key in batch:
                            self._queue.add_after(key, time.monotonic() + 1.0)  # the events' pods are read again then
                    continue
                for kind, pod in pods:
                    try:
                        if kind == "DELETED":
                            self._forget(pod)
                        else:
                            self._handle_pod(api, pod)
                    except ApiError as exc:
                        if exc.status not in (404, 409):
                            self.errors.append(f"kubelet: {exc}")
                            self._retry(pod)
                    except Exception as exc:  # pylint: disable=broad-except
                        if not self._stop.is_set():
                            self.errors.append(f"kubelet loop: {exc!r}")
                            self._retry(pod)
        finally:
            self._stop.set()
            waker.stop()
            api.close()

    def _retry(self, pod: dict) -> None:
        """A pod whose handling failed (not a 404/409) is tried again shortly, as a rate-limited requeue."""
        self._queue.add_after((pod["metadata"]["namespace"], pod["metadata"]["name"]), time.monotonic() + 1.0)

    def _forget(self, pod: dict) -> None:
        """A pod removed without this kubelet finishing its deletion (deleted with grace period 0): stop serving it."""
        meta = pod["metadata"]
        with self._lock:
            worker = self._process.get(meta.get("uid"))
        if worker is not None:
            worker.terminate(0)
        if self._started.pop(meta.get("uid"), None) is not None:
            self._close_http(meta["namespace"], meta["name"])

    def _handle_pod(self, api, pod: dict) -> None:
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        meta, spec = pod["metadata"], pod["spec"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        base = f"/api/v1/namespaces/{ns}/pods/{name}"
        node = spec.get("nodeName")
        if not node:
            if meta.get("deletionTimestamp") or spec.get("schedulerName", "default-scheduler") != "default-scheduler":
                return
            api.post(f"{base}/binding", {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name}})
            return
        if node != self.node_name:
            return
        if self._process_mode(pod):
            self._handle_process_pod(api, pod)
            return
        if meta.get("deletionTimestamp"):
            # Containers "stopped": finish the graceful deletion like a kubelet does.
            try:
                api.delete(base, {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                                  "preconditions": {"uid": uid}})
            except ApiError as exc:
                if exc.status not in (404, 409):
                    raise
            if self._started.pop(uid, None) is not None:
                self._close_http(ns, name)
            return
        behaviour = self.behaviour_for(pod)
        if uid not in self._started:
            self._started[uid] = (time.monotonic(), _now())
            if behaviour.http:
                self._open_http(ns, name, behaviour)
            for container, text in behaviour.previous_logs.items():
                self.write_log(ns, name, container, text, previous=True, append=False)
            for container, text in behaviour.logs.items():
                self.write_log(ns, name, container, text, append=False)
        started_mono, started_at = self._started[uid]
        ready = (not behaviour.crash_loop and behaviour.ready_after is not None
                 and time.monotonic() - started_mono >= behaviour.ready_after)
        if not ready and not behaviour.crash_loop and behaviour.ready_after is not None:
            # Nothing reports the end of the delay: come back to this pod then.
            self._queue.add_after((ns, name), started_mono + behaviour.ready_after + 0.01)
        status = pod.get("status") or {}
        current_ready = {c["type"]: c["status"] for c in status.get("conditions") or []}.get("Ready")
        if status.get("phase") == "Running" and current_ready == ("True" if ready else "False") and \
                status.get("podIP") == behaviour.pod_ip:
            return
        desired = self._pod_status(pod, behaviour, ready, started_at)
        if status.get("qosClass"):
            desired["qosClass"] = status["qosClass"]
        pod = dict(pod, apiVersion="v1", kind="Pod", status=desired)
        api.put(f"{base}/status", pod)

    def _pod_status(self, pod: dict, behaviour: PodBehaviour, ready: bool, started_at) -> dict:
        spec = pod["spec"]
        start = _rfc3339(started_at)
        now = _rfc3339(_now())
        rs = "True" if ready else "False"
        restarts = 1 if behaviour.previous_logs else 0

        def container_status(c, init=False):
            cid = "standin://" + uuid.uuid5(uuid.NAMESPACE_URL, pod["metadata"]["uid"] + c["name"]).hex
            base = {"name": c["name"], "image": c.get("image") or "", "imageID": "", "containerID": cid,
                    "restartCount": restarts, "ready": True if init else ready}
            if init:
                base["state"] = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": start,
                                                "finishedAt": start, "containerID": cid}}
                base["ready"] = True
                return base
            if behaviour.crash_loop:
                base["state"] = {"waiting": {"reason": "CrashLoopBackOff",
                                             "message": f"back-off restarting failed container {c['name']}"}}
                base["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": start,
                                                    "finishedAt": now, "containerID": cid}}
                base["restartCount"] = max(1, restarts)
                base["started"] = False
            else:
                base["state"] = {"running": {"startedAt": start}}
                base["started"] = True
                if restarts:
                    base["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": start,
                                                        "finishedAt": start, "containerID": cid}}
            return base

        reason = {} if ready else {"reason": "ContainersNotReady", "message": "containers with unready status"}
        return {
            "phase": "Running", "hostIP": "127.0.0.1", "podIP": behaviour.pod_ip,
            "podIPs": [{"ip": behaviour.pod_ip}], "startTime": start,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": start},
                dict({"type": "Ready", "status": rs, "lastTransitionTime": now}, **reason),
                dict({"type": "ContainersReady", "status": rs, "lastTransitionTime": now}, **reason),
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": start},
            ],
            "initContainerStatuses": [container_status(c, init=True) for c in spec.get("initContainers") or []],
            "containerStatuses": [container_status(c) for c in spec.get("containers") or []],
        }
