"""Integration tier: a real kube-apiserver with the KServe CRDs (tests/testbed). Every test here is marked
`integration`; the fixtures come from tests.testbed.fixtures (tests/e2e can import them the same way)."""
import os

import pytest

from tests.testbed.fixtures import *  # noqa: F401,F403  pylint: disable=wildcard-import,unused-wildcard-import
from tests.testbed.fixtures import prebuild
# Here, not in the test modules: a session fixture imported into a module is that module's own, so each module that
# imported them ran its own Argo CD and Flux stand-ins on the worker's one control plane, all reconciling every
# Application; one with a stale read synced again and undid a test's live drift.
from tests.testbed.gitops_fixtures import *  # noqa: F401,F403  pylint: disable=wildcard-import,unused-wildcard-import

_HERE = os.path.dirname(os.path.abspath(__file__))


# Seconds each file took in the tier (the sum of its tests' wall, CI-like run of stop 49 on 2 workers, 855 s), for the order
# below. A file not listed counts as UNLISTED_SECONDS; the table needs no update for a new test, only for a file whose cost
# moves a lot.
FILE_SECONDS = {
    "test_faults.py": 142, "test_stage_pvc.py": 114, "test_deploy.py": 104, "test_rollback_draft_removal.py": 99,
    "test_benchmark_role.py": 91, "test_deploy_pvc.py": 76, "test_rollback.py": 60, "test_rollback_gitops.py": 56,
    "test_rbac.py": 52, "test_secret_canaries.py": 51, "test_modelcar.py": 49, "test_airgap.py": 49,
    "test_artifact_credentials.py": 46, "test_benchmark_llmisvc.py": 40, "test_verify.py": 36, "test_testbed.py": 35,
    "test_bad_input_corpus.py": 35, "test_llmisvc_testbed.py": 35, "test_tune_playbook.py": 34, "test_canary_rollout.py": 33,
    "test_deploy_serial.py": 31, "test_gitops_owner.py": 31, "test_serving_runtime_cluster.py": 29, "test_canary_gitops.py": 28,
    "test_rollback_schedule_llmisvc.py": 27, "test_llmisvc_rollback.py": 22, "test_canary_schedule.py": 19,
    "test_canary_knative.py": 19, "test_foreign_edit.py": 16,
}
UNLISTED_SECONDS = 10


def _file_seconds(item):
    return FILE_SECONDS.get(os.path.basename(str(item.fspath)), UNLISTED_SECONDS)


def pytest_configure(config):
    """xdist's `--dist loadfile` hands out files in collection order, but by default first reorders them by their number
    of tests (`loadscopereorder`), which says little about their time here (test_faults.py: 6 tests, 142 s). Off, so the
    order below holds."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
    """Mark every test here `integration`, and run the files longest first (stable: a file's tests keep their order, files
    of equal cost their collected order). With `--dist loadfile` each worker takes the next file when it runs low, so the
    long files start early and the short ones fill the end: the two workers finish within a short file of each other. In
    xdist's own order (most tests first) the longest files came anywhere: in the run of stop 49 one worker ran 58 s of
    tests more than the other (850 against 792 s); handing that run's files out in this order gives 821 and 821 s."""
    here = [index for index, item in enumerate(items) if str(item.fspath).startswith(_HERE + os.sep)]
    for index in here:
        items[index].add_marker(pytest.mark.integration)
    ordered = sorted((items[index] for index in here), key=lambda item: -_file_seconds(item))
    for index, item in zip(here, ordered):  # the other tiers' tests, in a run of several, stay where they were
        items[index] = item


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
