"""Air-gap checks: every internet source is named with its field and a fix; internal ones pass."""
import os
import re

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import air_gap
from tests.ansible_run import REPO

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


# Issue 48: every image the collection renders or runs is checked, not only the model's.
IMAGES_REFUSED = [
    ({"llmisvc": {"image": "docker.io/vllm/vllm-openai:v0.30.0"}}, "spec_decoding_llmisvc.image", "LLMInferenceService's main container"),
    ({"llmisvc": {"image": "vllm/vllm-openai:v0.30.0"}}, "spec_decoding_llmisvc.image", "Docker Hub"),
    # no image and no preset of the user's own: KServe's well-known presets give the public llm-d image
    ({"llmisvc": {}}, "spec_decoding_llmisvc.image", "well-known presets"),
    ({"stage_items": [{"source": "/srv/models/llama"}], "stage_image": ""}, "stage_pvc_image", "docker.io/vllm/vllm-openai:latest"),
    ({"images": {"rollback_schedule_image": "ghcr.io/acme/spec-decoding-ee:0.1.0"}}, "rollback_schedule_image", "CronJob"),
    ({"images": {"benchmark_load_image": "quay.io/acme/vllm:0.32"}}, "benchmark_load_image", "load Job"),
    ({"images": {"tune_load_job.image": "vllm/vllm-openai:v0.32.0"}}, "tune_load_job.image", "tune.yml's sweep"),
    ({"runtimes": {"get": {"ServingRuntime/models/aml-vllm": {"spec": {"containers": [
        {"name": "kserve-container", "image": "docker.io/vllm/vllm-openai:v0.32.0"}]}}}}, "namespace": "models", "runtime": "aml-vllm"},
     "spec_decoding_runtime", "ServingRuntime aml-vllm"),
    ({"runtimes": {"get": {"ServingRuntime/models/aml-vllm": None, "ClusterServingRuntime/aml-vllm": {"spec": {"containers": [
        {"name": "kserve-container", "image": "vllm/vllm-openai:v0.32.0"}]}}}}, "namespace": "models", "runtime": "aml-vllm"},
     "spec_decoding_runtime", "ClusterServingRuntime aml-vllm"),
]


@pytest.mark.parametrize("spec,field,mentions", IMAGES_REFUSED, ids=[c[1] + "-" + c[2].split()[0] for c in IMAGES_REFUSED])
def test_every_image_on_a_public_registry_is_refused_with_the_variable_to_set(spec, field, mentions):
    found = air_gap.messages(spec)
    assert len(found) == 1, found
    message = found[0]
    assert message.startswith(field + ": spec_decoding_air_gapped: true") and mentions in message, message
    fix = message.split(". Fix: ", 1)[1]
    # the fix names what to set and an internal reference to set it to
    assert ("spec_decoding_llmisvc.image" in fix or field in fix or "kubectl edit" in fix) and "registry.internal.example" in fix, fix


def test_internal_images_and_a_preset_of_ones_own_pass():
    assert air_gap.messages({"llmisvc": {"image": "registry.internal.example:5000/vllm/vllm-openai:v0.32.0"}}) == []
    assert air_gap.messages({"llmisvc": {"base_refs": ["internal-vllm-preset"]}}) == []
    assert air_gap.messages({"llmisvc": None}) == []  # an InferenceService: no LLMInferenceService image to check
    assert air_gap.messages({"stage_items": [{"source": "/srv/m"}], "stage_image": "registry.internal.example/vllm:0.32"}) == []
    assert air_gap.messages({"images": {"benchmark_image": "", "rollback_schedule_image": "registry.example.com/ee:0.1.0"}}) == []
    internal = {"get": {"ServingRuntime/models/aml-vllm": {"spec": {"containers": [{"name": "kserve-container",
                                                                                   "image": "registry.internal.example/vllm:0.32"}]}}}}
    assert air_gap.messages({"runtimes": internal, "namespace": "models", "runtime": "aml-vllm"}) == []
    # a snapshot of another namespace says nothing about this one's runtime
    assert air_gap.messages({"runtimes": internal, "namespace": "other", "runtime": "aml-vllm"}) == []


def test_the_stager_default_is_the_stage_pvc_roles_default():
    with open(os.path.join(REPO, "roles", "stage_pvc", "defaults", "main.yml")) as handle:
        assert yaml.safe_load(handle)["stage_pvc_image"] == air_gap.STAGER_DEFAULT_IMAGE


def test_the_inventory_check_role_passes_every_role_image():
    """roles/inventory_check checks the images the inventory sets: the names in its task are air_gap.ROLE_IMAGES, and each
    is a variable some role's argument spec declares."""
    tasks = os.path.join(REPO, "roles", "inventory_check", "tasks")
    text = ""
    for name in sorted(os.listdir(tasks)):  # main.yml includes refuse.yml, which holds the refusals
        with open(os.path.join(tasks, name)) as handle:
            text += handle.read()
    passed = set(re.findall(r"'([a-z_.]+)': \(?hostvars\[inventory_hostname\]\.", text))
    assert passed == set(air_gap.ROLE_IMAGES)
    for name in passed:
        variable, _dot, key = name.partition(".")
        assert "hostvars[inventory_hostname].%s" % variable in text and (not key or ").%s | default('')" % key in text), name
    declared = set()
    for role in os.listdir(os.path.join(REPO, "roles")):
        path = os.path.join(REPO, "roles", role, "meta", "argument_specs.yml")
        if os.path.exists(path):
            with open(path) as handle:
                declared.update((yaml.safe_load(handle)["argument_specs"]["main"].get("options") or {}))
    assert {name.split(".")[0] for name in air_gap.ROLE_IMAGES} <= declared
