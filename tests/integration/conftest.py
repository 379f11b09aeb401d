"""Integration tier: a real kube-apiserver with the KServe CRDs (tests/testbed). Every test here is marked
`integration`; the fixtures come from tests.testbed.fixtures (tests/e2e can import them the same way)."""
import os

import pytest

from tests.testbed.fixtures import *  # noqa: F401,F403  pylint: disable=wildcard-import,unused-wildcard-import
from tests.testbed.fixtures import prebuild

_HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
    for item in items:
        if str(item.fspath).startswith(_HERE + os.sep):
            item.add_marker(pytest.mark.integration)


def pytest_collection_finish(session):
    """Build the Kubernetes binaries (first run on a machine only) before the first test's timeout starts."""
    prebuild(session)


# The benchmark reads the GPU model and count from the node of the first predictor pod.
GPU_LABELS = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "8"}


@pytest.fixture
def gpu_node(k8s_client, kubelet):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    core = client.CoreV1Api(k8s_client)
    core.patch_node(kubelet.node_name, {"metadata": {"labels": GPU_LABELS}})
    yield kubelet.node_name
    core.patch_node(kubelet.node_name, {"metadata": {"labels": {k: None for k in GPU_LABELS}}})
