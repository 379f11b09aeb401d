"""The node's pod network for process-mode pods: one network namespace per pod, reached without leaving this machine.

- Each process-mode pod lives in its own network namespace (made by `unshare -n`, see pod_process.py) with `lo` up and
  its pod IP (from 198.18.0.0/15, the benchmarking range no real network here uses) on `lo`, so `--port 8080` in one
  pod never meets another pod's 8080 and a server bound to the pod IP works.
- The API server reaches the node through this kubelet's HTTP CONNECT proxy on a Unix socket (its egress selector
  for `cluster` traffic, configured by controlplane.py, as a konnectivity server would be): a CONNECT to a pod IP
  opens the connection inside that pod's namespace; any other address (the kubelet's log port on 127.0.0.1, the
  host address scripted pods use) is dialled as before. So `pods/<pod>:8080/proxy/...` reaches the pod's own 8080.
- A thread enters a pod's namespace with setns(2) (Python 3.11 has no os.setns) only long enough to create the socket:
  a socket keeps the namespace it was created in, so the connection itself runs on the host's threads.
"""
from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import selectors
import socket
import threading

CLONE_NEWNET = 0x40000000
POD_CIDR = ipaddress.ip_network("198.18.0.0/15")

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, nstype: int) -> None:
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered_netns(netns_path: str):
    """Run the body with this thread in the network namespace at `netns_path` (e.g. /proc/<pid>/ns/net), then back."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    try:
        _setns(target, CLONE_NEWNET)
        try:
            yield
        finally:
            _setns(own, CLONE_NEWNET)
    finally:
        os.close(target)
        os.close(own)


def connect(host: str, port: int, netns_path: str | None = None, timeout: float = 5.0) -> socket.socket:
    """A TCP connection to host:port, from inside the network namespace at `netns_path` when given."""
    if netns_path is None:
        return socket.create_connection((host, port), timeout=timeout)
    with entered_netns(netns_path):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def listen(host: str, port: int, netns_path: str) -> socket.socket:
    """A listening socket on host:port inside the namespace at `netns_path` (the tests' stand-in for a pod's server)."""
    with entered_netns(netns_path):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(16)
    return sock


def splice(a: socket.socket, b: socket.socket, stop: threading.Event | None = None) -> None:
    """Copy bytes both ways until both sides closed (a half-close is passed on), then close both."""
    sel = selectors.DefaultSelector()
    peers = {a: b, b: a}
    open_reads = {a, b}
    for sock in (a, b):
        sock.setblocking(True)
        sock.settimeout(None)
        sel.register(sock, selectors.EVENT_READ)
    try:
        while open_reads and not (stop is not None and stop.is_set()):
            for key, _events in sel.select(timeout=0.5):
                src = key.fileobj
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                if data:
                    try:
                        peers[src].sendall(data)
                        continue
                    except OSError:
                        return
                sel.unregister(src)
                open_reads.discard(src)
                with contextlib.suppress(OSError):
                    peers[src].shutdown(socket.SHUT_WR)
    finally:
        sel.close()
        for sock in (a, b):
            sock.close()


class NodeNetwork:
    """Pod IPs -> network namespaces, and the HTTP CONNECT proxy the API server dials the node through."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self._pods = {}  # pod IP -> netns path
        self._next = 1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = None
        self._thread = None

    # pod IPs

    def allocate_ip(self) -> str:
        with self._lock:
            address = str(POD_CIDR[self._next])
            self._next += 1
        return address

    def attach(self, pod_ip: str, netns_path: str) -> None:
        with self._lock:
            self._pods[pod_ip] = netns_path

    def detach(self, pod_ip: str) -> None:
        with self._lock:
            self._pods.pop(pod_ip, None)

    def netns_of(self, address: str) -> str | None:
        with self._lock:
            return self._pods.get(address)

    def dial(self, host: str, port: int, timeout: float = 5.0) -> socket.socket:
        """Connect as the node would: a pod IP inside that pod's namespace, anything else from the host."""
        netns = self.netns_of(host)
        if netns is None and ipaddress.ip_address(host) in POD_CIDR:
            raise ConnectionRefusedError(f"no pod has the address {host}")
        return connect(host, port, netns, timeout)

    # the CONNECT proxy

    def start(self) -> "NodeNetwork":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.socket_path)
        server.listen(64)
        server.settimeout(0.5)
        self._server = server
        self._thread = threading.Thread(target=self._accept, name="node-network", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._server is not None:
            self._server.close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _address = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(conn,), name="node-network-conn", daemon=True).start()

    def _tunnel(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        head = b""
        try:
            while b"\r\n\r\n" not in head:
                data = conn.recv(4096)
                if not data:
                    conn.close()
                    return
                head += data
            line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(line) < 2 or line[0] != "CONNECT":
                raise ValueError(f"not a CONNECT request: {line!r}")
            host, _sep, port = line[1].rpartition(":")
            upstream = self.dial(host.strip("[]"), int(port))
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError):
                conn.sendall(f"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nX-Reason: {' '.join(str(exc).split())}\r\n\r\n".encode())
            conn.close()
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        rest = head.split(b"\r\n\r\n", 1)[1]
        if rest:
            upstream.sendall(rest)
        splice(conn, upstream, self._stop)
