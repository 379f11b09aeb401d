"""Cluster DNS and kube-proxy for process-mode pods: a pod reaches a Service by its name, as in a cluster.

- DNS: the pod's `/etc/hosts` (the kubelet manages that file in every pod too) names each Service that has a ClusterIP
  when the pod's sandbox is made: `<svc>.<ns>.svc.cluster.local`, `<svc>.<ns>.svc`, `<svc>.<ns>`, and `<svc>` for the
  pod's own namespace, as the cluster DNS search path resolves them. Services created after the pod starts are not
  seen by it (a real pod would resolve them; no test here needs it).
- kube-proxy: for each Service port (TCP) a listener on `ClusterIP:port` inside the pod's network namespace (the
  API server's Service CIDR, 127.96.0.0/16, is on the pod's `lo` like all of 127/8); each connection goes to a ready
  address of the Service's Endpoints at the port's target port, dialled inside that pod's own namespace through the
  node network (pod_network.NodeNetwork.dial), round robin. No ready address: the connection is closed, as kube-proxy
  rejects it.
"""
from __future__ import annotations

import itertools
import os
import socket
import threading

from . import pod_network

CLUSTER_DOMAIN = "cluster.local"


def cluster_ip_services(services: list) -> list:
    """The Services that have a virtual IP (not headless, not ExternalName)."""
    out = []
    for svc in services:
        ip = (svc.get("spec") or {}).get("clusterIP")
        if ip and ip != "None" and (svc.get("spec") or {}).get("type") != "ExternalName":
            out.append(svc)
    return out


def hosts_text(services: list, namespace: str, pod_name: str, pod_ip: str) -> str:
    """The pod's /etc/hosts: localhost, the pod's own name, then the Services' names (see the module doc)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", f"{pod_ip}\t{pod_name}"]
    for svc in cluster_ip_services(services):
        name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
        names = [f"{name}.{ns}.svc.{CLUSTER_DOMAIN}", f"{name}.{ns}.svc", f"{name}.{ns}"] + ([name] if ns == namespace else [])
        lines.append("%s\t%s" % (svc["spec"]["clusterIP"], " ".join(names)))
    return "\n".join(lines) + "\n"


def _target_port(svc_port: dict, subset: dict):
    """The endpoint port a Service port reaches in one Endpoints subset (the endpoints controller resolved named
    targetPorts already; ports are matched by the Service port's name)."""
    for port in subset.get("ports") or []:
        if (port.get("name") or "") == (svc_port.get("name") or "") and port.get("protocol", "TCP") == "TCP":
            return port["port"]
    return None


class ServiceProxy:
    """The listeners of one pod (see the module doc); `close()` stops them."""

    def __init__(self, rest_factory, network: pod_network.NodeNetwork, netns_path: str, services: list):
        self.rest_factory, self.network = rest_factory, network
        self.stop = threading.Event()
        self.listeners = []
        self._turn = itertools.count()
        for svc in cluster_ip_services(services):
            for port in svc["spec"].get("ports") or []:
                if port.get("protocol", "TCP") != "TCP":
                    continue
                sock = pod_network.listen(svc["spec"]["clusterIP"], port["port"], netns_path)
                sock.settimeout(0.5)
                self.listeners.append(sock)
                threading.Thread(target=self._accept, args=(sock, svc["metadata"]["namespace"], svc["metadata"]["name"], port),
                                 name=f"service-proxy-{svc['metadata']['name']}:{port['port']}", daemon=True).start()

    def _addresses(self, namespace: str, name: str, svc_port: dict) -> list:
        api = self.rest_factory()
        try:
            endpoints = api.get(f"/api/v1/namespaces/{namespace}/endpoints/{name}")
        except Exception:  # pylint: disable=broad-except  # no Endpoints (yet): no ready address
            return []
        finally:
            api.close()
        out = []
        for subset in endpoints.get("subsets") or []:
            port = _target_port(svc_port, subset)
            if port is not None:
                out.extend((address["ip"], port) for address in subset.get("addresses") or [])
        return out

    def _accept(self, listener: socket.socket, namespace: str, name: str, svc_port: dict) -> None:
        with listener:
            while not self.stop.is_set():
                try:
                    conn, _peer = listener.accept()
                except socket.timeout:
                    continue
                except OSError:
                    return
                threading.Thread(target=self._forward, args=(conn, namespace, name, svc_port), daemon=True).start()

    def _forward(self, conn: socket.socket, namespace: str, name: str, svc_port: dict) -> None:
        addresses = self._addresses(namespace, name, svc_port)
        if not addresses:
            conn.close()
            return
        ip, port = addresses[next(self._turn) % len(addresses)]
        try:
            upstream = self.network.dial(ip, int(port))
        except OSError:
            conn.close()
            return
        pod_network.splice(conn, upstream, self.stop)

    def close(self) -> None:
        self.stop.set()
        for sock in self.listeners:
            try:
                sock.close()
            except OSError:
                pass


def write_hosts(pod_dir: str, text: str) -> str:
    path = os.path.join(pod_dir, "etc-hosts")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o644)
    return path
