"""The third way to give the test bed its KServe CRDs: copy them out of a running cluster (here: the session's test bed)
with the kubernetes client, as `python -m tests.testbed.cli export-crds DIR` and ALAUDA_KSERVE_CRDS_KUBECONFIG do."""
import os

import yaml

from tests.testbed import crds
from tests.testbed.controlplane import _load_crd


def _load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def test_export_writes_the_installed_crds_with_their_schemas(tmp_path, controlplane, kserve_crd_dir):
    names = crds.export_from_cluster(controlplane.kubeconfig, None, str(tmp_path / "out"))
    # Every serving.kserve.io CRD the test bed has, nothing else; the llmisvc fixture adds the LLMInferenceService CRDs to
    # the worker's shared control plane when a test file of the same worker used it first.
    optional = {"serving.kserve.io_llminferenceservices.yaml", "serving.kserve.io_llminferenceserviceconfigs.yaml"}
    assert sorted(n for n in names if n not in optional) == sorted(crds.REQUIRED)
    for name in crds.REQUIRED:
        exported = _load(str(tmp_path / "out" / name))
        source = _load_crd(os.path.join(kserve_crd_dir, name))
        assert exported["kind"] == "CustomResourceDefinition" and "status" not in exported
        assert set(exported["metadata"]) <= {"name", "annotations"} and exported["metadata"]["name"] == source["metadata"]["name"]
        assert exported["spec"]["names"] == source["spec"]["names"] and exported["spec"]["scope"] == source["spec"]["scope"]
        assert [v["name"] for v in exported["spec"]["versions"]] == [v["name"] for v in source["spec"]["versions"]]
        for got, want in zip(exported["spec"]["versions"], source["spec"]["versions"]):
            assert got["schema"]["openAPIV3Schema"]["properties"].keys() == want["schema"]["openAPIV3Schema"]["properties"].keys()
            if "spec" in want["schema"]["openAPIV3Schema"]["properties"]:
                assert (got["schema"]["openAPIV3Schema"]["properties"]["spec"] == want["schema"]["openAPIV3Schema"]["properties"]["spec"])


def test_resolve_reads_the_cluster_named_by_the_kubeconfig(tmp_path, controlplane, monkeypatch):
    for name in (crds.ENV_DIR, crds.ENV_CONTEXT):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALAUDA_SHARED", str(tmp_path / "no-shared"))
    monkeypatch.setenv(crds.ENV_KUBECONFIG, controlplane.kubeconfig)
    monkeypatch.setattr(crds, "CACHE_ROOT", str(tmp_path / "cache"))
    found = crds.resolve()
    assert found == crds.cache_dir(controlplane.kubeconfig, None) and found.startswith(str(tmp_path / "cache"))
    assert crds.missing_files(found) == []
    isvc = _load(os.path.join(found, "serving.kserve.io_inferenceservices.yaml"))
    assert isvc["spec"]["group"] == "serving.kserve.io" and isvc["spec"]["names"]["kind"] == "InferenceService"
