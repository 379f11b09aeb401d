"""Gateway API's standard CRDs at v1.6.1 (issue #52) on the test bed's kube-apiserver, and found for the unit tests.

Found like the GitOps CRDs (tests/testbed/gitops_crds.py): ``ALAUDA_GATEWAY_API_CRDS=DIR``, else
``../shared/gateway-api-crds`` next to the checkout (``ALAUDA_SHARED`` moves ``../shared``). Installed unchanged but for
the `default: ""` lines the control plane drops for every CRD (controlplane._load_crd). A 1.20 API server ignores their
`x-kubernetes-validations` (CEL arrived in 1.25); the collection checks them itself (bench/routing_plan.check_httproute).
"""
from __future__ import annotations

from .crds import pinned_crd_dir

ENV_DIR = "ALAUDA_GATEWAY_API_CRDS"
FILES = (
    "v1.6.1-gatewayclasses.yaml",   # gateway.networking.k8s.io/v1 GatewayClass
    "v1.6.1-gateways.yaml",         # gateway.networking.k8s.io/v1 Gateway
    "v1.6.1-httproutes.yaml",       # gateway.networking.k8s.io/v1 HTTPRoute
    "v1.6.1-referencegrants.yaml",  # gateway.networking.k8s.io/v1beta1 ReferenceGrant
)


class GatewayCrdsNotFound(RuntimeError):
    """The folder with the Gateway API CRD files is missing or incomplete (the message names where it looked)."""


def crd_dir() -> str:
    """The folder holding FILES; raises GatewayCrdsNotFound naming both ways to give it."""
    return pinned_crd_dir(ENV_DIR, "gateway-api-crds", FILES, GatewayCrdsNotFound,
                          "Gateway API CRDs (the standard channel of Gateway API v1.6.1)")


def install(controlplane, path: str | None = None) -> list[str]:
    """Create the Gateway API CRDs (409: already there) and wait until each is Established and served. Returns their names."""
    return controlplane.install_crds(path or crd_dir(), files=FILES)
