"""Air-gap checks: every internet source is named with its field and a fix; internal ones pass."""
import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import air_gap

REFUSED = [
    ({"artifacts": {"target_uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}}, "artifacts.target_uri", "hf://"),
    ({"artifacts": {"draft_uri": "https://huggingface.co/yuhuili/EAGLE3"}}, "artifacts.draft_uri", "huggingface.co"),
    ({"artifacts": {"draft_uri": "https://cdn-lfs.hf.co/x"}}, "artifacts.draft_uri", "hf.co"),
    ({"artifacts": {"target_uri": "gs://kfserving-examples/models/llama"}}, "artifacts.target_uri", "gs://"),
    ({"artifacts": {"target_uri": "https://bucket.s3.amazonaws.com/llama.tar"}}, "artifacts.target_uri", "amazonaws.com"),
    ({"artifacts": {"modelcar_image": "docker.io/acme/llama:v1"}}, "artifacts.modelcar_image", "docker.io"),
    ({"artifacts": {"modelcar_image": "acme/llama:v1"}}, "artifacts.modelcar_image", "Docker Hub"),
    ({"artifacts": {"modelcar_image": "llama:v1"}}, "artifacts.modelcar_image", "Docker Hub"),
    ({"artifacts": {"modelcar_image": "oci://quay.io/acme/llama:v1"}}, "artifacts.modelcar_image", "quay.io"),
    ({"artifacts": {"target_uri": "oci://ghcr.io/acme/llama:v1"}}, "artifacts.target_uri", "ghcr.io"),
    ({"artifacts": {"target_uri": "oci://us-docker.pkg.dev/p/r/llama:v1"}}, "artifacts.target_uri", "pkg.dev"),
    ({"artifacts": {"storage_uris": [{"uri": "pvc://a/b"}, {"uri": "hf://org/draft"}]}}, "artifacts.storage_uris[1].uri", "hf://"),
    ({"env": {"HF_ENDPOINT": "https://huggingface.co"}}, "env.HF_ENDPOINT", "HF_ENDPOINT"),
    ({"env": {"HF_HUB_OFFLINE": "0"}}, "env.HF_HUB_OFFLINE", "HF_HUB_OFFLINE"),
    ({"extra_args": ["--tokenizer", "https://huggingface.co/org/tok"]}, "extra_args[1]", "huggingface.co"),
    ({"stage_items": [{"source": "hf://org/model"}]}, "stage_pvc_items[0].source", "stage_pvc_hf_endpoint"),
    ({"stage_items": [{"source": "hf://org/model"}], "stage_hf_endpoint": "https://hf-mirror.com"}, "stage_pvc_items[0].source", "hf-mirror.com"),
    ({"stage_items": [{"source": "s3://bucket/llama"}]}, "stage_pvc_items[0].source", "stage_pvc_s3_endpoint"),
    ({"stage_items": [{"source": "https://modelscope.cn/models/x"}]}, "stage_pvc_items[0].source", "modelscope.cn"),
]


@pytest.mark.parametrize("spec,field,mentions", REFUSED)
def test_internet_sources_are_refused_with_field_and_fix(spec, field, mentions):
    found = air_gap.messages(spec)
    assert len(found) == 1, found
    assert found[0].startswith(field + ": spec_decoding_air_gapped: true") and "Fix:" in found[0] and mentions in found[0], found[0]


def test_internal_sources_pass():
    spec = {
        "artifacts": {"modelcar_image": "registry.internal.example:5000/models/llama-eagle3:v1", "pvc_name": "model-store",
                      "target_uri": "pvc://models/llama", "draft_uri": "s3://models/eagle3", "target_subdir": "llama",
                      "storage_uris": [{"uri": "oci://127.0.0.1:5000/m/t:1", "mountPath": "/mnt/target/model"},
                                       {"uri": "https://minio.internal.example/d.tar", "mountPath": "/mnt/draft/model"}]},
        "env": {"HF_ENDPOINT": "https://hf.internal.example", "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "INFO"},
        "extra_args": ["--max-num-batched-tokens", "8192"],
        "stage_items": [{"source": "hf://org/model"}, {"source": "s3://b/d", "s3_endpoint": "http://minio.internal.example:9000"},
                        {"source": "/srv/models/draft"}, {"source": "localhost:5000/x"}],
        "stage_hf_endpoint": "https://hf.internal.example",
    }
    assert air_gap.messages(spec) == []
    assert air_gap.messages({}) == [] and air_gap.messages(None) == []


def test_every_problem_is_reported_at_once():
    found = air_gap.messages({"artifacts": {"target_uri": "hf://a/t", "draft_uri": "hf://a/d"}, "env": {"HF_ENDPOINT": "https://hf.co"}})
    assert [m.split(":", 1)[0] for m in found] == ["artifacts.target_uri", "artifacts.draft_uri", "env.HF_ENDPOINT"]


@pytest.mark.parametrize("ref,host", [("quay.io/a/b:1", "quay.io"), ("a/b", "docker.io"), ("b", "docker.io"), ("localhost/b", "localhost"),
                                      ("127.0.0.1:5000/b@sha256:00", "127.0.0.1:5000"), ("oci://Reg.Local:443/b", "reg.local:443")])
def test_image_registry(ref, host):
    assert air_gap.image_registry(ref) == host
