"""pytest fixtures for the GitOps part of the test bed (issue #47). Import them in a conftest.py, next to the test bed's
own (tests/integration/conftest.py does): a session fixture imported into a test module is that module's own, so two
modules importing them would run two Argo CD stand-ins on one control plane, each reconciling every Application.

Session scope, on the session's control plane: `git_server` (tests/testbed/git_server.py: git:// anonymous and http://
Basic auth), `gitops_crds` (the Argo CD v3.5.1 and Flux v1.9.x CRDs installed; tests/testbed/gitops_crds.py), `argocd`
(the Argo CD application-controller stand-in for Applications in namespace `argocd`, which it creates with the
`default` AppProject, as an Argo CD install does; interval 1 s) and `flux` (source-controller + kustomize-controller
stand-ins; intervals are each object's `spec.interval`). They share one git cache. Tests create their own target
namespaces and unique Application / Kustomization names, and delete them.
"""
from __future__ import annotations

import pytest

from .argocd_standin import ArgoCDStandIn
from .flux_standin import FluxStandIn
from .git_server import GitServer
from .gitops_crds import GitopsCrdsNotFound, install as _install_crds
from .gitops_standin import GitCache
from .rest import ApiError

__all__ = ["git_server", "gitops_crds", "gitops_git_cache", "argocd", "flux"]

ARGOCD_NAMESPACE = "argocd"


@pytest.fixture(scope="session")
def git_server():
    server = GitServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gitops_crds(controlplane):
    try:
        names = _install_crds(controlplane)
    except GitopsCrdsNotFound as exc:
        pytest.fail(str(exc), pytrace=False)
    from .llmisvc_standin import refresh_discovery_cache  # pylint: disable=import-outside-toplevel
    # kubernetes.core caches discovery per API server; a cache written before these CRDs would hide them from k8s modules.
    refresh_discovery_cache(controlplane.kubeconfig)
    return names


@pytest.fixture(scope="session")
def gitops_git_cache():
    cache = GitCache()
    yield cache
    cache.close()


def _ensure_argocd_namespace(controlplane) -> None:
    api = controlplane.rest()
    try:
        for path, body in (("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ARGOCD_NAMESPACE}}),
                           (f"/apis/argoproj.io/v1alpha1/namespaces/{ARGOCD_NAMESPACE}/appprojects",
                            {"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                             "metadata": {"name": "default", "namespace": ARGOCD_NAMESPACE},
                             "spec": {"sourceRepos": ["*"], "destinations": [{"namespace": "*", "server": "*"}],
                                      "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]}})):
            try:
                api.post(path, body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
    finally:
        api.close()


@pytest.fixture(scope="session")
def argocd(controlplane, gitops_crds, gitops_git_cache):  # pylint: disable=redefined-outer-name,unused-argument
    _ensure_argocd_namespace(controlplane)
    standin = ArgoCDStandIn(controlplane, namespace=ARGOCD_NAMESPACE, interval=1.0, git_cache=gitops_git_cache).start()
    yield standin
    standin.stop()


@pytest.fixture(scope="session")
def flux(controlplane, gitops_crds, gitops_git_cache):  # pylint: disable=redefined-outer-name,unused-argument
    standin = FluxStandIn(controlplane, git_cache=gitops_git_cache).start()
    yield standin
    standin.stop()
