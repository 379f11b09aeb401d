"""The real Argo CD and Flux CRDs on the test bed's kube-apiserver, at the releases issue #47 pins.

Found like the KServe CRDs' second source: ``ALAUDA_GITOPS_CRDS=DIR``, else ``../shared/gitops-crds`` next to the
checkout (``ALAUDA_SHARED`` moves ``../shared``). The files are installed unchanged but for the `default: ""` lines the
control plane drops for every CRD (controlplane._load_crd; none in these). A 1.20 API server ignores their
`x-kubernetes-validations` (CEL arrived in 1.25), as it does for KServe's.
"""
from __future__ import annotations

from .crds import pinned_crd_dir

ENV_DIR = "ALAUDA_GITOPS_CRDS"
FILES = (
    "argocd-v3.5.1-application-crd.yaml",          # argoproj.io/v1alpha1 Application (no status subresource)
    "argocd-v3.5.1-appproject-crd.yaml",           # argoproj.io/v1alpha1 AppProject
    "flux-kustomize-controller-v1.9.4-kustomizations-crd.yaml",  # kustomize.toolkit.fluxcd.io/v1 Kustomization
    "flux-source-controller-v1.9.1-gitrepositories-crd.yaml",    # source.toolkit.fluxcd.io/v1 GitRepository
)


class GitopsCrdsNotFound(RuntimeError):
    """The folder with the four CRD files is missing or incomplete (the message names where it looked)."""


def crd_dir() -> str:
    """The folder holding FILES; raises GitopsCrdsNotFound naming both ways to give it."""
    return pinned_crd_dir(ENV_DIR, "gitops-crds", FILES, GitopsCrdsNotFound,
                          "Argo CD / Flux CRDs (Argo CD v3.5.1 Application + AppProject, Flux kustomize-controller v1.9.4 "
                          "Kustomization, source-controller v1.9.1 GitRepository)")


def install(controlplane, path: str | None = None) -> list[str]:
    """Create the four CRDs (409: already there) and wait until each is Established and served. Returns their names."""
    return controlplane.install_crds(path or crd_dir(), files=FILES)
