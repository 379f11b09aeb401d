"""Where the test bed gets the KServe CRDs: one order, used by the fixtures, the unit tests and `make cluster-up`.

1. ``ALAUDA_KSERVE_CRDS=DIR``: a folder holding the CRD files (for example one written by
   ``python -m tests.testbed.cli export-crds DIR`` from a running test bed, or ``config/crd/full`` of a KServe checkout);
2. ``../shared/kserve-crds`` next to the checkout (``ALAUDA_SHARED`` moves ``../shared``), as CI lays it out;
3. ``ALAUDA_KSERVE_CRDS_KUBECONFIG=FILE`` (and optionally ``ALAUDA_KSERVE_CRDS_CONTEXT=NAME``): the
   CustomResourceDefinitions of group serving.kserve.io are read (read-only, with the ``kubernetes`` client) from
   the user's own cluster where KServe is installed, and written as YAML into
   ``~/.cache/alauda-spec-decoding/kserve-crds/<server and context>/``, which is then used.

Otherwise ``resolve()`` raises ``CrdsNotFound`` whose message names the three ways. A folder given by
``ALAUDA_KSERVE_CRDS`` that lacks a file is an error too (it is not skipped in favour of the next source).
This module imports only the standard library at load time (``make cluster-up`` checks it before any set-up).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE_ROOT = os.environ.get("ALAUDA_SPEC_DECODING_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "alauda-spec-decoding")
GROUP = "serving.kserve.io"
ENV_DIR = "ALAUDA_KSERVE_CRDS"
ENV_KUBECONFIG = "ALAUDA_KSERVE_CRDS_KUBECONFIG"
ENV_CONTEXT = "ALAUDA_KSERVE_CRDS_CONTEXT"
# The CRDs the test bed installs (a 1.20 API server takes these four after the `default: ""` edit, see controlplane.py).
REQUIRED = (
    "serving.kserve.io_inferenceservices.yaml",
    "serving.kserve.io_servingruntimes.yaml",
    "serving.kserve.io_clusterservingruntimes.yaml",
    "serving.kserve.io_clusterstoragecontainers.yaml",
)


class CrdsNotFound(RuntimeError):
    """No source of KServe CRDs: the message names the three ways to give them."""


def shared_dir(folder: str = "kserve-crds") -> str:
    """``../shared/<folder>`` next to the checkout (``ALAUDA_SHARED`` moves ``../shared``)."""
    shared = os.environ.get("ALAUDA_SHARED") or os.path.join(os.path.dirname(REPO_ROOT), "shared")
    return os.path.normpath(os.path.join(shared, folder))


def pinned_crd_dir(env_dir: str, folder: str, files, not_found, what: str) -> str:
    """The folder holding the pinned CRD ``files`` of a project other than KServe (Argo CD and Flux, Gateway API): the one
    ``env_dir`` names, else ``../shared/<folder>``; ``not_found`` (an exception class) names where it looked and ``what``
    the files are."""
    path = os.environ.get(env_dir) or shared_dir(folder)
    missing = missing_files(path, files)
    if missing:
        raise not_found(f"{what} not found: {path} lacks {', '.join(missing)}. Give them with {env_dir}=DIR or in "
                        f"../shared/{folder} next to the checkout")
    return path


def missing_files(path: str, required=REQUIRED) -> list[str]:
    return [name for name in required if not os.path.isfile(os.path.join(path, name))]


def three_ways(problem: str) -> str:
    return (f"KServe CRDs not found: {problem}\n"
            f"The test bed needs {', '.join(REQUIRED)}.\nGive them one of three ways (tried in this order):\n"
            f"  1. {ENV_DIR}=DIR\n"
            f"       a folder with those files (KServe's config/crd/full, or one written from a running test bed by\n"
            f"       `python -m tests.testbed.cli export-crds DIR`)\n"
            f"  2. ../shared/kserve-crds next to the checkout (looked in {shared_dir()})\n"
            f"  3. {ENV_KUBECONFIG}=FILE [{ENV_CONTEXT}=NAME]\n"
            f"       copy them (read-only, with the kubernetes client) from your own cluster's KServe install")


def given() -> str | None:
    """Which way is given, without reading a cluster ('dir', 'shared', 'cluster' or None): the quick pre-check."""
    if os.environ.get(ENV_DIR):
        return "dir"
    if not missing_files(shared_dir()):
        return "shared"
    if os.environ.get(ENV_KUBECONFIG):
        return "cluster"
    return None


def resolve(required=REQUIRED) -> str:
    """The folder holding the KServe CRD files, by the order above; raises ``CrdsNotFound``."""
    env_dir = os.environ.get(ENV_DIR)
    if env_dir:
        missing = missing_files(env_dir, required)
        if missing:
            raise CrdsNotFound(three_ways(f"{ENV_DIR}={env_dir} lacks {', '.join(missing)}"))
        return env_dir
    shared = shared_dir()
    if not missing_files(shared, required):
        return shared
    kubeconfig = os.environ.get(ENV_KUBECONFIG)
    if kubeconfig:
        context = os.environ.get(ENV_CONTEXT) or None
        out = cache_dir(kubeconfig, context)
        try:
            export_from_cluster(kubeconfig, context, out)
        except CrdsNotFound:
            raise
        except Exception as exc:  # pylint: disable=broad-except  # the client raises many kinds; all mean "not read"
            raise CrdsNotFound(three_ways(f"reading them from {ENV_KUBECONFIG}={kubeconfig}"
                                          f"{' context ' + context if context else ''} failed: {type(exc).__name__}: {exc}")) from exc
        missing = missing_files(out, required)
        if missing:
            raise CrdsNotFound(three_ways(f"the cluster of {ENV_KUBECONFIG}={kubeconfig} has no CRD for "
                                          f"{', '.join(missing)} (is KServe installed there?)"))
        return out
    raise CrdsNotFound(three_ways(f"{ENV_DIR} is not set, {shared} does not hold them, and {ENV_KUBECONFIG} is not set"))


def cache_dir(kubeconfig: str, context: str | None) -> str:
    key = hashlib.sha256(json.dumps([os.path.abspath(kubeconfig), context]).encode()).hexdigest()[:16]
    return os.path.join(CACHE_ROOT, "kserve-crds", key)


def manifest(crd: dict) -> dict:
    """A CRD as read from an API server, without what the server added (status, uid, managedFields ...)."""
    meta = crd.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k != "kubectl.kubernetes.io/last-applied-configuration"}
    out = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": meta["name"]}, "spec": dict(crd["spec"])}
    if annotations:
        out["metadata"]["annotations"] = annotations
    # A conversion webhook points at the cluster's KServe service, which a test bed does not have.
    if (out["spec"].get("conversion") or {}).get("strategy") == "Webhook":
        out["spec"]["conversion"] = {"strategy": "None"}
    return out


def export_from_cluster(kubeconfig: str, context: str | None, out_dir: str) -> list[str]:
    """Read the serving.kserve.io CRDs with the kubernetes client and write ``<group>_<plural>.yaml`` files into
    ``out_dir`` (each written to a temporary name and renamed). Returns the file names."""
    from kubernetes import client, config  # pylint: disable=import-outside-toplevel
    import yaml  # pylint: disable=import-outside-toplevel
    api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    try:
        resp = client.ApiextensionsV1Api(api_client).list_custom_resource_definition(_preload_content=False, _request_timeout=60)
        items = json.loads(resp.data).get("items") or []
    finally:
        api_client.close()
    crds = [manifest(item) for item in items if (item.get("spec") or {}).get("group") == GROUP]
    if not crds:
        raise CrdsNotFound(three_ways(f"the cluster of {kubeconfig}{' context ' + context if context else ''} has no "
                                      f"CustomResourceDefinition of group {GROUP} (is KServe installed there?)"))
    os.makedirs(out_dir, exist_ok=True)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    names = []
    for crd in sorted(crds, key=lambda c: c["metadata"]["name"]):
        name = f"{GROUP}_{crd['spec']['names']['plural']}.yaml"
        fd, tmp = tempfile.mkstemp(prefix=".crd-", dir=out_dir)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"# read from the cluster of {os.path.basename(kubeconfig)}{' context ' + context if context else ''} "
                     "by tests/testbed/crds.py\n")
            yaml.dump(crd, fh, Dumper=dumper, sort_keys=False, default_flow_style=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(out_dir, name))
        names.append(name)
    return names


def main(argv=None) -> int:
    """``python3 -m tests.testbed.crds check``: exit 1 with the three ways when no source is given (standard library only)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["check"]:
        print(main.__doc__, file=sys.stderr)
        return 2
    if given() is None:
        print("cluster-up: " + three_ways(f"{ENV_DIR} is not set, {shared_dir()} does not hold them, and {ENV_KUBECONFIG} is not set"),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
