"""pytest fixtures for the loopback Kubernetes test bed. Import them into a conftest.py:

    from tests.testbed.fixtures import *  # noqa: F401,F403

Session scope: `k8s_binaries` (build once per machine, cached), `kserve_crd_dir` (the KServe CRD folder, found in
the order of tests/testbed/crds.py; fails the tests with the three ways to give it when there is none), `controlplane` (etcd + kube-apiserver + kube-controller-manager with the KServe
CRDs installed), `kubeconfig` (admin kubeconfig path), `k8s_client` (admin `kubernetes` ApiClient),
`kubelet` (node + pod lifecycle + logs stand-in), `kserve` (KServe controller stand-in).
Function scope: `namespace` (a fresh namespace, deleted after the test).
A failed build fails the tests (it is a defect of the machine setup, not a reason to skip).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import uuid

import pytest

from . import build as _build
from .controlplane import ControlPlane, kserve_crd_dir as _crd_dir
from .crds import CrdsNotFound
from .kserve_standin import KServeStandIn
from .kubelet import KubeletStandIn

__all__ = ["k8s_binaries", "kserve_crd_dir", "controlplane", "kubeconfig", "k8s_client", "kubelet", "kserve",
           "namespace", "prebuild", "llmisvc"]

_BUILD = {}


def prebuild(session) -> None:
    """Call from a conftest's `pytest_collection_finish`: when a selected test needs the control plane, build
    (or find) the binaries before the first test starts, so the one-time build (minutes) is not charged to
    that test's pytest-timeout. A failure is remembered and reported by the `k8s_binaries` fixture."""
    if _BUILD or not any("k8s_binaries" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    try:
        _BUILD["path"] = _build.build()
    except _build.BuildError as exc:
        _BUILD["error"] = str(exc)


@pytest.fixture(scope="session")
def kserve_crd_dir():
    try:
        return _crd_dir()
    except CrdsNotFound as exc:
        message = str(exc)
    return pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def k8s_binaries():
    if "error" in _BUILD:
        pytest.fail(f"building kube-apiserver/kube-controller-manager failed: {_BUILD['error']}", pytrace=False)
    if "path" in _BUILD:
        return _BUILD["path"]
    try:
        return _build.build()
    except _build.BuildError as exc:
        pytest.fail(f"building kube-apiserver/kube-controller-manager failed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def controlplane(k8s_binaries, kserve_crd_dir):
    cp = ControlPlane(bin_dir=k8s_binaries)
    cp.start()
    try:
        cp.install_crds(kserve_crd_dir)
        cp.wait_for_controller_manager()
        yield cp
    finally:
        _write_controlplane_cost(cp)
        cp.stop()


def _write_controlplane_cost(cp):
    """With ALAUDA_TEST_COST set, record what this worker's control plane cost: CPU seconds per process and the API
    requests it served by user agent program, verb and resource (hack/test_summary.py prints them). The tests are
    charged this CPU only when the control plane stops; this record says which requests caused it."""
    prefix = os.environ.get("ALAUDA_TEST_COST")
    if not prefix:
        return
    hertz = os.sysconf("SC_CLK_TCK")
    cpu = {}
    for name, proc in cp.procs.items():
        try:
            with open("/proc/%d/stat" % proc.pid, encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            cpu[name] = (int(fields[11]) + int(fields[12])) / hertz
        except (OSError, ValueError, IndexError):
            continue
    requests = {}
    try:
        text = cp.rest().request("GET", "/metrics", raw=True)
    except Exception:  # pylint: disable=broad-except  # a diagnostic never fails the session
        text = ""
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            key = "%s %s%s" % (labels.get("verb", "?"), labels.get("group", "") + "/" if labels.get("group") else "", labels.get("resource", "?"))
            requests[key] = requests.get(key, 0) + float(line.rsplit(" ", 1)[1])
    record = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "cpu": cpu, "requests": requests}
    with open("%s-controlplane-%s.json" % (prefix, record["worker"]), "w", encoding="utf-8") as handle:
        json.dump(record, handle)


@pytest.fixture(scope="session")
def kubeconfig(controlplane):
    return controlplane.kubeconfig


@pytest.fixture(scope="session")
def k8s_client(controlplane):
    return controlplane.api_client()


@pytest.fixture(scope="session")
def kubelet(controlplane):
    standin = KubeletStandIn(controlplane).start()
    yield standin
    standin.stop()


@pytest.fixture(scope="session")
def kserve(controlplane, kubelet):
    standin = KServeStandIn(controlplane, kubelet=kubelet).start()
    yield standin
    standin.stop()


@contextlib.contextmanager
def module_namespace(controlplane, stem):
    """A fresh namespace named after `stem` (made a DNS label, at most 40 characters) and a random suffix, deleted on
    exit: the `namespace` fixture's, and a module-scoped fixture's (several tests reading one batch run)."""
    from .rest import ApiError  # pylint: disable=import-outside-toplevel
    stem = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:40].strip("-") or "t"
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    api = controlplane.rest()
    try:
        api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                        "metadata": {"name": name, "labels": {"alauda.io/testbed": "true"}}})
        yield name
        try:
            api.delete(f"/api/v1/namespaces/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
    finally:
        api.close()


@pytest.fixture
def namespace(request, controlplane):
    with module_namespace(controlplane, request.node.name) as name:
        yield name


@pytest.fixture(scope="session")
def llmisvc(controlplane, kubelet, kserve_crd_dir):
    """KServe's LLMInferenceService: the real CRD (with the 1.20 edits of llmisvc_standin.crd_body) and the controller
    stand-in, on the session's control plane."""
    from .llmisvc_standin import LLMISvcStandIn, install_crd, refresh_discovery_cache  # pylint: disable=import-outside-toplevel
    install_crd(controlplane, kserve_crd_dir)
    refresh_discovery_cache(controlplane.kubeconfig)
    standin = LLMISvcStandIn(controlplane, kubelet=kubelet).start()
    yield standin
    standin.stop()
