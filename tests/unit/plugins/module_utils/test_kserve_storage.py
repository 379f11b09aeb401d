"""KServe's storage rules (plugins/module_utils/kserve/storage.py) against KServe v0.20.0's own cases
(tests/fixtures/kserve/storage.json): KServe's verdict for every case, and the render-level checks, which refuse what
KServe refuses with KServe's message and refuse more only where KServe would accept and mount nothing."""
from __future__ import annotations


import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import storage
from tests.kserve_vectors import check as check_vector
from tests.paths import kserve_vectors

VECTORS = kserve_vectors("storage.json")
CASES = VECTORS["cases"]
# Cases KServe accepts and the render refuses, each because KServe would then mount nothing (or not all of it).
RENDER_REFUSES = {
    "uris-pvc-duplicate-paths-alone": "two PVCs at one mountPath: KServe mounts only the first",
    "uri-accept-relative-path": "a local path: nothing is mounted at /mnt/models",
    "uri-accept-root": "a local path",
    "uri-accept-bare-word": "a local path",
    "uri-accept-empty": "no URI",
}


def _mode(case):
    return storage.resolve_oci_mode(case["input"].get("storageInitializer") or {})[0]


def test_the_vectors_name_their_source():
    assert VECTORS["source"]["tag"] == "v0.20.0" and len(VECTORS["source"]["commit"]) == 40
    assert len(CASES) >= 60 and len({c["id"] for c in CASES}) == len(CASES)
    for case in CASES:
        assert case["check"] in VECTORS["checks"] and case["tag"] == "v0.20.0" and case["file"], case["id"]
        # a rule no Go test exercises says which function it was read from, and why it is here
        assert case["go_test"] or case.get("note"), case["id"]
    assert set(RENDER_REFUSES) <= {c["id"] for c in CASES}


def _uris(data):
    found = storage.isvc_storage_uris_problems(data["storageUris"], data.get("storageInitializer"), storage_uri=data.get("storageUri"))
    return found and found[0]


def _mode_value(data):
    mode = storage.resolve_oci_mode(data["storageInitializer"])[0]
    return {"mode": "" if mode == storage.OCI_DISABLED else mode}


def _scheme(data):
    return dict(zip(("mode", "uri", "is_oci"), storage.parse_oci_scheme(data["uri"])))


# KServe's answer to each kind of case, from storage.py: None (accepted), an error message, or the value asked for.
READERS = {
    "isvc_storage_uri": lambda data: storage.isvc_storage_uri_problem(data["uri"]),
    "isvc_storage_uris": _uris,
    "oci_model_mode": _mode_value,
    "oci_scheme": _scheme,
    "llmisvc_model_uri": lambda data: storage.llmisvc_model_uri_problem(data["uri"], data.get("storageInitializer")),
}


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_kserve_verdict(case):
    check_vector(case, READERS)


RENDERED = [c for c in CASES if c["check"] in ("isvc_storage_uri", "isvc_storage_uris", "llmisvc_model_uri") and "storageUri" not in c["input"]]


@pytest.mark.parametrize("case", RENDERED, ids=[c["id"] for c in RENDERED])
def test_render_check_refuses_what_kserve_refuses(case):
    data, want = case["input"], case["expected"]
    mode = _mode(case) if "storageInitializer" in data else storage.DEFAULT_OCI_MODE

    def check():
        if case["check"] == "isvc_storage_uris":
            storage.check_storage_uris(data["storageUris"], (0, 20, 0), oci_mode=mode)
        else:
            kind = "LLMInferenceService" if case["check"] == "llmisvc_model_uri" else "InferenceService"
            storage.check_storage_uri(data["uri"], "artifacts.storage_uri", kind=kind, oci_mode=mode)

    if "error" in want or case["id"] in RENDER_REFUSES:
        with pytest.raises(ValidationError) as info:
            check()
        text = str(info.value)
        assert "Fix:" in text and text.split(":", 1)[0].startswith(("artifacts.storage_uri", "storage_uris")), text
        if "error" in want:
            assert want["error"] in text, text
    else:
        check()


@pytest.mark.parametrize("entries,mode,field,words", [
    # KServe's rules name the entry and the fix
    ([{"uri": "s3://b/t", "mountPath": "/"}], "modelcar", "storage_uris[0].mountPath", "storage path cannot be empty"),
    ([{"uri": "s3://b/t", "mountPath": "/mnt/models/x..y"}], "modelcar", "storage_uris[0].mountPath", "'..'"),
    ([{"uri": "oci://r/t:1", "mountPath": "/mnt/models/target"}, {"uri": "oci://r/d:1", "mountPath": "/mnt/models/draft"}], "modelcar",
     "storage_uris[1].mountPath", "share parent directory"),
    # OCI off: KServe skips a bare oci:// entry, so the render refuses it
    ([{"uri": "oci://r/t:1", "mountPath": "/mnt/models"}], "disabled", "storage_uris[0].uri", "OCI off"),
])
def test_storage_uris_refusals_name_the_entry(entries, mode, field, words):
    with pytest.raises(ValidationError) as info:
        storage.check_storage_uris(entries, (0, 20, 0), oci_mode=mode)
    text = str(info.value)
    assert text.startswith(field + ":") and words in text and "Fix:" in text, text


def test_native_mode_lifts_the_parent_directory_rule():
    entries = [{"uri": "oci://r/t:1", "mountPath": "/mnt/models/target"}, {"uri": "oci://r/d:1", "mountPath": "/mnt/models/draft"}]
    storage.check_storage_uris(entries, (0, 20, 0), oci_mode="native")
    # an explicit oci+native:// works whatever the cluster's mode, and is not counted by the modelcar parent rule
    storage.check_storage_uri("oci+native://r/t:1", "artifacts.storage_uri", oci_mode="disabled")
    storage.check_storage_uris([{"uri": "oci+native://r/t:1", "mountPath": "/mnt/models/target"},
                                {"uri": "oci://r/d:1", "mountPath": "/mnt/models/draft"}], (0, 20, 0), oci_mode="modelcar")


def test_hdfs_and_webhdfs_are_storage_uris_now():
    for uri in ("hdfs://namenode/models/llama", "webhdfs://namenode/models/llama"):
        assert storage.check_storage_uri(uri, "artifacts.storage_uri") == uri
        with pytest.raises(ValidationError, match="unsupported schema in model URI"):
            storage.check_storage_uri(uri, "artifacts.storage_uri", kind="LLMInferenceService")


@pytest.mark.parametrize("settings,mode", [
    ('{"enableModelcar": "true"}', "modelcar"),  # a string is read as meant
    ({"ociModelMode": "sidecar"}, "modelcar"),  # a mode KServe does not know runs its modelcar path
    ({"ociModelMode": ""}, "disabled"),
    (None, "disabled"),
])
def test_resolve_oci_mode_edges(settings, mode):
    assert storage.resolve_oci_mode(settings)[0] == mode


def test_unknown_oci_mode_is_refused():
    with pytest.raises(ValidationError) as info:
        storage.check_storage_uri("pvc://m/", "x", oci_mode="sidecar")
    assert str(info.value).startswith("oci_model_mode:") and "disabled" in str(info.value)
