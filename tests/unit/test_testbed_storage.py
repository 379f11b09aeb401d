"""KServe v0.20.0's own storage cases (tests/fixtures/kserve/storage.json) against the test bed's reading of KServe
(tests/testbed/kserve_storage.py), which the InferenceService and LLMInferenceService stand-ins apply. The collection's
rules run the same cases in tests/unit/plugins/module_utils/test_kserve_storage.py: both sides are pinned to KServe."""
from __future__ import annotations

import ast
import os

import pytest

from tests.kserve_vectors import check as check_vector
from tests.paths import REPO, kserve_vectors
from tests.testbed import kserve_storage
from tests.testbed.kserve_standin import KServeStandIn
from tests.testbed.llmisvc_standin import LLMISvcStandIn

CASES = kserve_vectors("storage.json")["cases"]
READERS = {
    "isvc_storage_uri": lambda data: kserve_storage.storage_uri_error(data["uri"]),
    "isvc_storage_uris": lambda data: kserve_storage.storage_uris_error(
        data["storageUris"], data.get("storageInitializer"), data.get("storageUri")),
    "oci_model_mode": lambda data: {"mode": kserve_storage.oci_model_mode(data["storageInitializer"])},
    "oci_scheme": lambda data: dict(zip(("mode", "uri", "is_oci"), kserve_storage.parse_oci_scheme(data["uri"]))),
    "llmisvc_model_uri": lambda data: kserve_storage.model_uri_error(data["uri"], data.get("storageInitializer")),
}


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_standin_storage_rules_follow_kserve(case):
    check_vector(case, READERS)


# The one shared part, and why: the CEL evaluator (kube/cel_rules.py: cel-expr-python with Kubernetes's CEL libraries)
# is a language runtime, not a reading of KServe. The rules the stand-in evaluates come from the CRD file itself, not
# from the rules the collection ships, and the test bed's kube-apiserver (1.20) evaluates no CEL of its own.
SHARED_WITH_PLUGINS = {("llmisvc_standin.py", "ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.cel_rules")}


def test_the_standin_rules_are_their_own_reading_of_kserve():
    """Nothing the test bed's rules or stand-ins import comes from plugins/ (else both sides would share a misreading)."""
    for name in ("kserve_storage.py", "kserve_runtimes.py", "llmisvc_merge.py", "kserve_standin.py", "llmisvc_standin.py"):
        with open(os.path.join(REPO, "tests", "testbed", name), encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = ["%s.%s" % (node.module, a.name) for a in node.names] if node.module else []
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for imported in names:
                if (name, imported) in SHARED_WITH_PLUGINS:
                    continue
                assert "alauda.spec_decoding" not in imported and not imported.startswith("plugins"), (name, imported)


def _isvc(predictor):
    return {"metadata": {"name": "llama", "namespace": "models", "uid": "u1", "generation": 2}, "spec": {"predictor": predictor}}


@pytest.mark.parametrize("predictor,config,words", [
    ({"model": {"storageUri": "custom://x/y"}}, None, "StorageURI not supported: storageUri, must be one of"),
    ({"storageUris": [{"uri": "s3://b/m", "mountPath": "/mnt/models/../x"}]}, None, "cannot contain '..'"),
    ({"storageUris": [{"uri": "oci://r/t:1", "mountPath": "/mnt/models/t"}, {"uri": "oci://r/d:1", "mountPath": "/mnt/models/d"}]},
     {"enableModelcar": True}, "volume mount shadowing"),
    ({"storageUris": [{"uri": "oci://r/t:1", "mountPath": "/mnt/models/t"}, {"uri": "oci://r/d:1", "mountPath": "/mnt/models/d"}]},
     {"ociModelMode": "native"}, None),
    ({"model": {"storageUri": "pvc://store/llama"}}, None, None),
])
def test_the_isvc_standin_refuses_what_kserve_refuses(predictor, config, words):
    config = config if config is not None else kserve_storage.INSTALLED_STORAGE_INITIALIZER
    problem = KServeStandIn._storage_problem(_isvc(predictor), config)  # pylint: disable=protected-access
    assert (problem is None) if words is None else (words in problem), problem


def test_the_isvc_standin_mounts_oci_as_the_mode_says():
    uris = [{"uri": "oci://r/t:1", "mountPath": "/mnt/models/t"}, {"uri": "oci+native://r/d:1", "mountPath": "/mnt/models/d"}]
    pod = {"containers": [{"name": "kserve-container"}]}
    KServeStandIn._add_storage(pod, pod["containers"][0], uris, "native")  # pylint: disable=protected-access
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    # ImageVolumes (played by emptyDirs: the test bed's API server predates them), mounted with subPath models
    assert mounts["/mnt/models/t"]["subPath"] == "models" and mounts["/mnt/models/d"]["subPath"] == "models"
    assert [c["name"] for c in pod["containers"]] == ["kserve-container"] and "initContainers" not in pod
    pod = {"containers": [{"name": "kserve-container"}]}
    KServeStandIn._add_storage(pod, pod["containers"][0], uris[:1], "modelcar")  # pylint: disable=protected-access
    assert [c["name"] for c in pod["containers"]] == ["kserve-container", "modelcar"]


@pytest.mark.parametrize("uri,config,pool_condition", [
    ("gs://bucket/model", None, "unsupported schema in model URI: gs://bucket/model"),
    ("oci://r/m:1", {"enableModelcar": False}, "OCI modelcars is not enabled"),
    ("oci+native://r/m:1", {}, None),
    ("hf://org/model", None, None),
])
def test_the_llmisvc_standin_refuses_what_kserve_refuses(uri, config, pool_condition):
    problem = LLMISvcStandIn.model_problem(uri, config if config is not None else kserve_storage.INSTALLED_STORAGE_INITIALIZER)
    assert (problem is None) if pool_condition is None else (pool_condition in problem), problem
