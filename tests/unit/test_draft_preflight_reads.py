"""The preflight's PVC and S3 reads without a cluster or a store: the PVC Job's script run as the pod runs it (python3 -c
with its JSON argument) on a directory standing in for the claim, its output parsed and read back by model_metadata; the
Job's manifest (read-only mounts, no retries); the S3 URLs; where the deploy's variables put the PVC checkpoints."""

import json
import os
import struct
import subprocess
import sys

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import model_metadata, pvc_metadata
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

TARGET = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "vocab_size": 4096}


def _checkpoint(folder, config, tensors, weight_bytes=1 << 20):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": "x" * 3000}, fh)
    header = {name: {"dtype": "F32", "shape": [4], "data_offsets": [i * 16, (i + 1) * 16]} for i, name in enumerate(tensors)}
    data = json.dumps(header).encode()
    with open(os.path.join(folder, "model.safetensors"), "wb") as fh:
        fh.write(struct.pack("<Q", len(data)) + data + b"\1" * weight_bytes)
    return len(data)


def _run_job_script(job, root):
    """The Job's container command, run here with the claims' mount paths rewritten to directories under ``root``."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["python3", "-c"]
    request = json.loads(container["command"][3])
    request["dirs"] = [d.replace(pvc_metadata.MOUNT_ROOT, root, 1) for d in request["dirs"]]
    proc = subprocess.run([sys.executable, "-c", container["command"][2], json.dumps(request)], capture_output=True, text=True,
                          check=True, timeout=60)
    return proc.stdout.replace(root, pvc_metadata.MOUNT_ROOT)


def test_pvc_job_reads_the_small_files_and_the_header_only(tmp_path):
    root = str(tmp_path / "mnt")
    header_len = _checkpoint(os.path.join(root, "pvc-0", "models", "llama"), TARGET, ["lm_head.weight", "model.embed_tokens.weight"])
    _checkpoint(os.path.join(root, "pvc-0", "models", "eagle3"), dict(TARGET, num_hidden_layers=1), ["fc.weight", "d2t"])
    locations = {"target": "pvc://model-store/models/llama/", "draft": "pvc://model-store/models/eagle3"}
    job = pvc_metadata.job_manifest("models", locations, "registry.internal.example/vllm/vllm-openai:v0.32.0", timeout=90)
    spec = job["spec"]["template"]["spec"]
    # one claim, one volume, mounted read-only twice over (the mount and the claim), no retries, a deadline
    assert spec["volumes"] == [{"name": "pvc-0", "persistentVolumeClaim": {"claimName": "model-store", "readOnly": True}}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "pvc-0", "mountPath": pvc_metadata.MOUNT_ROOT + "/pvc-0", "readOnly": True}]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 90 and spec["restartPolicy"] == "Never"
    assert job["metadata"]["generateName"].startswith("model-store-preflight-")
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    output = _run_job_script(job, root)
    found = pvc_metadata.parse_log("some warning line\n" + output)
    layout = pvc_metadata.plan(locations)
    assert layout["dirs"] == {"target": pvc_metadata.MOUNT_ROOT + "/pvc-0/models/llama", "draft": pvc_metadata.MOUNT_ROOT + "/pvc-0/models/eagle3"}
    target = found[layout["dirs"]["target"]]["files"]
    # 8 bytes of length and the header: none of the 1 MiB of weights
    assert len(target["model.safetensors"]) == 8 + header_len
    assert sorted(target) == ["config.json", "model.safetensors", "tokenizer_config.json"]
    ckpt = model_metadata.read_checkpoint(pvc_metadata.DumpReader(found[layout["dirs"]["target"]]), locations["target"])
    assert ckpt["config"] == TARGET and ckpt["tensors"] == ["lm_head.weight", "model.embed_tokens.weight"]
    assert ckpt["files_read"] == ["config.json", "tokenizer_config.json", "model.safetensors (header)"]
    assert ckpt["tokenizer"] == {"tokenizer_class": "PreTrainedTokenizerFast"}


def test_pvc_job_says_which_directory_is_missing_and_two_claims_get_two_volumes(tmp_path):
    root = str(tmp_path / "mnt")
    _checkpoint(os.path.join(root, "pvc-1", "llama"), TARGET, ["lm_head.weight"])
    locations = {"target": "pvc://targets/llama", "draft": "pvc://drafts/nothing-here"}
    job = pvc_metadata.job_manifest("models", locations, "img")
    assert [v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]] == ["drafts", "targets"]
    found = pvc_metadata.parse_log(_run_job_script(job, root))
    dirs = pvc_metadata.plan(locations)["dirs"]
    assert found[dirs["draft"]]["error"] == "not a directory on the volume"
    assert found[dirs["target"]]["error"] is None


def test_pvc_uri_and_log_without_a_result():
    assert pvc_metadata.parse_pvc_uri("pvc://store/a/../b/") == ("store", "b")
    assert pvc_metadata.parse_pvc_uri("pvc://store") == ("store", "")
    with pytest.raises(ValidationError) as err:
        pvc_metadata.parse_pvc_uri("pvc:///x", field="draft")
    assert err.value.field == "draft" and "names no claim" in str(err.value)
    assert pvc_metadata.parse_log("Traceback (most recent call last):\n{not json\n") is None


def test_s3_locations_are_path_style_urls_and_need_an_endpoint():
    assert model_metadata.s3_base("s3://models/llama/8b", "http://127.0.0.1:9000/") == "http://127.0.0.1:9000/models/llama/8b/"
    assert model_metadata.s3_base("s3://models", "https://s3.internal") == "https://s3.internal/models/"
    with pytest.raises(ValidationError) as err:
        model_metadata.s3_base("s3://models/llama", None)
    assert err.value.field == "s3_endpoint" and "stage_pvc_s3_endpoint" in err.value.hint
    with pytest.raises(ValidationError) as err:
        model_metadata.reader_for("s3://models/llama", air_gapped=True, s3_endpoint="https://s3.amazonaws.com")
    assert err.value.field == "s3_endpoint", err.value


def test_deploy_on_a_pvc_reads_the_subdirectories_the_render_mounts():
    found = model_metadata.sources_from_deploy({"pvc_name": "model-store", "target_subdir": "llama"})
    assert found == {"target": "pvc://model-store/llama", "draft": "pvc://model-store/draft", "target_subdir": "llama",
                     "draft_subdir": "draft", "skipped": None}


def test_pvc_without_a_job_is_skipped_with_its_reason_and_check_mode_starts_none():
    from tests.module_run import run_module
    args = {"method": "eagle3", "deploy": {"artifacts": {"pvc_name": "model-store"}}}
    res = run_module("draft_preflight_info", dict(args, pvc_job=False))
    assert not res.failed and res["preflight"]["checks"] == [], res.msg
    assert "pvc://model-store/target" in res["summary"] and "GitOps render" in res["summary"]
    res = run_module("draft_preflight_info", args, check_mode=True)
    assert not res.failed and "(check mode)" in res["preflight"]["skipped"], res.msg


def test_s3_signature_is_aws_published_get_object_example():
    """AWS's "Example: GET Object" of Signature Version 4 for S3 (Authenticating Requests: Using the Authorization Header,
    single chunk): the first 10 bytes of examplebucket/test.txt, with its published keys, date and signature."""
    import datetime
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import s3_sign
    headers = s3_sign.sign_get("https://examplebucket.s3.amazonaws.com/test.txt", "AKIAIOSFODNN7EXAMPLE",
                               "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "us-east-1", {"Range": "bytes=0-9"},
                               now=datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc))
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    assert headers["x-amz-date"] == "20130524T000000Z" and headers["Range"] == "bytes=0-9"
    assert "wJalrXUtnFEMI" not in json.dumps(headers)


def test_s3_reader_takes_the_artifact_credentials_endpoint_and_keys():
    s3 = {"endpoint": "minio.internal:9000", "use_https": False, "access_key_id": "AK", "secret_access_key": "SK", "region": "eu-1"}
    reader = model_metadata.reader_for("s3://models/llama", s3=s3)
    assert isinstance(reader, model_metadata.S3Reader) and reader.base == "http://minio.internal:9000/models/llama/"
    assert reader.keys == ("AK", "SK") and reader.region == "eu-1"
    anonymous = model_metadata.reader_for("s3://models/llama", s3_endpoint="https://s3.internal",
                                          s3={"access_key_id": "AK", "secret_access_key": "SK", "use_anonymous_credential": True})
    assert anonymous.keys is None and anonymous.base == "https://s3.internal/models/llama/"


def _isvc(predictor):
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "llama", "namespace": "models"},
            "spec": {"predictor": predictor}}


def test_live_pair_maps_the_container_paths_back_to_their_storage():
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_preflight_live as L
    spec = json.dumps({"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3})
    # the render's pvc mode: one storageUri at /mnt/models, target and draft its subdirectories; a bash -c script
    pvc = _isvc({"model": {"modelFormat": {"name": "vLLM"}, "storageUri": "pvc://model-store/",
                           "command": ["bash", "-c", "exec vllm serve /mnt/models/target --port 8080 --speculative-config '%s'" % spec]}})
    assert L.pair_of(pvc) == {"method": "eagle3", "speculative": json.loads(spec), "target": "pvc://model-store/target",
                              "draft": "pvc://model-store/draft", "target_subdir": "", "draft_subdir": "", "skipped": None}
    # storageUris (option A): each entry at its mountPath; a Modelcar image entry gives the image and its directory
    uris = _isvc({"model": {"modelFormat": {"name": "vLLM"}, "args": ["--model", "/mnt/target/model", "--speculative-config", spec.replace(
        "/mnt/models/draft", "/mnt/draft/eagle3")]},
        "storageUris": [{"uri": "s3://models/llama", "mountPath": "/mnt/target/model"},
                        {"uri": "oci://registry.internal.example/pair:v1", "mountPath": "/mnt/draft"}]})
    found = L.pair_of(uris)
    assert (found["target"], found["draft"], found["draft_subdir"]) == ("s3://models/llama", "oci://registry.internal.example/pair:v1", "eagle3")
    # a draft path no storage mounts, and no flag at all
    outside = _isvc({"model": {"storageUri": "pvc://m/", "args": ["--model", "/mnt/models/t", "--speculative-config", spec.replace(
        "/mnt/models/draft", "/opt/draft")]}})
    assert L.pair_of(outside)["skipped"] == "the draft /opt/draft is not under a storage URI's mount"
    assert L.pair_of(_isvc({"model": {"storageUri": "pvc://m/", "args": ["--model", "/mnt/models/t"]}}))["skipped"] == \
        "the predictor carries no --speculative-config"


def test_report_lists_the_figures_and_what_did_not_pass():
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_preflight as ops
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import draft_preflight as P
    target = {"where": "pvc://store/target", "config": TARGET, "tokenizer": None, "tensors": None, "total_size": None, "files_read": []}
    head = dict(TARGET, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, draft_vocab_size=1024,
                eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 4]})
    draft = {"where": "pvc://store/draft", "config": head, "tokenizer": None, "tensors": ["d2t", "fc.weight"], "total_size": None, "files_read": []}
    result = P.run("eagle3", target, draft, {"num_speculative_tokens": 3})
    result.update(mode="warn", skipped=None, sources={"target": {"location": "pvc://store/target"}})
    result["warnings"] = P.enforce(result, "warn")
    lines = ops.report(result)
    print("\n".join(lines))
    assert lines[0].startswith("preflight eagle3: failed (warn only)")
    assert "  target (pvc://store/target) - LlamaForCausalLM: layers 2, hidden 256, vocabulary 4096" in lines
    assert "  draft - LlamaForCausalLMEagle3: layers 1, hidden 256, vocabulary 4096, draft vocabulary 1024, aux layers [0, 1, 4]" in lines
    assert any(line.startswith("  failed aux layers: ") and "[4] do not exist" in line for line in lines), lines
    assert ops.report(None) == ["preflight: not recorded"]


def test_troubleshoot_describe_shows_the_preflight_figures():
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import troubleshoot
    isvc = _isvc({"model": {"storageUri": "pvc://store/", "args": ["--model", "/mnt/models/target", "--speculative-config",
                                                                   json.dumps({"method": "eagle3", "model": "/mnt/models/draft"})]}})
    result = {"method": "eagle3", "mode": "warn", "skipped": None, "passed": True, "warnings": [], "num_speculative_tokens": 3,
              "rules_from_vllm": "0.32.0", "sources": {"target": {"location": "pvc://store/target"}},
              "checks": [{"check": "hidden size", "status": "passed", "message": "256 = 256"}],
              "figures": {"target": {"architecture": "LlamaForCausalLM", "num_hidden_layers": 2, "hidden_size": 256, "vocab_size": 4096},
                          "draft": {"architecture": "LlamaForCausalLMEagle3", "num_hidden_layers": 1, "hidden_size": 256,
                                    "vocab_size": 4096, "aux_layer_ids": [0, 1], "trained_k": 3}}}
    text = troubleshoot.describe({"isvc": isvc, "preflight": result})
    block = text.split("Draft preflight (re-run read-only for this bundle; docs/preflight.md):\n", 1)[1].split("Conditions:")[0]
    assert block.splitlines() == [
        "  preflight eagle3: passed (1 checks, 0 warnings)",
        "  target (pvc://store/target) - LlamaForCausalLM: layers 2, hidden 256, vocabulary 4096",
        "  draft - LlamaForCausalLMEagle3: layers 1, hidden 256, vocabulary 4096, aux layers [0, 1], trained k 3",
        "  num_speculative_tokens 3; rules of vLLM 0.32.0"]
    # the bundle's own run: no Job for a PVC (read-only), said so
    found = troubleshoot.preflight_of(None, {"isvc": isvc, "namespace": "models"})
    assert found["skipped"] == ("the target is on a PVC (pvc://store/target), which only a Job can read, and none is started "
                                "(the troubleshooting bundle starts no Job)")


def _llmisvc(uri, main=None, base_refs=()):
    spec = {"model": {"uri": uri, "name": "llama"}}
    if main is not None:
        spec["template"] = {"containers": [dict(main, name="main")]}
    if base_refs:
        spec["baseRefs"] = [{"name": n} for n in base_refs]
    return {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
            "metadata": {"name": "llama", "namespace": "models"}, "spec": spec}


def _preset(name, main, namespace="models"):
    return {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceServiceConfig",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"template": {"containers": [dict(main, name="main")]}}}


def test_llmisvc_pair_is_the_decode_pools_flag_after_the_presets_under_the_model_uri():
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_preflight_live as L
    spec = {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
    # the render's own resource: a bash -c script serving /mnt/models/target, the model URI a PVC mounted at /mnt/models
    script = "exec python3 -m vllm.entrypoints.openai.api_server --model /mnt/models/target --speculative-config '%s'" % json.dumps(spec)
    own = _llmisvc("pvc://model-store/llama", {"command": ["bash", "-c", script]})
    assert L.llmisvc_pair_of(own) == {"method": "eagle3", "speculative": spec, "target": "pvc://model-store/llama/target",
                                      "draft": "pvc://model-store/llama/draft", "target_subdir": "", "draft_subdir": "", "skipped": None}
    # the flag only in VLLM_ADDITIONAL_ARGS, the served path from KServe's well-known preset (eval "vllm serve /mnt/models
    # ${VLLM_ADDITIONAL_ARGS}"); a Modelcar image: the draft is the image's directory
    preset = _preset("kserve-config-llm-template", {"command": ["/bin/bash", "-c", 'eval "vllm serve /mnt/models ${VLLM_ADDITIONAL_ARGS}"']},
                     namespace="kserve")
    env_only = _llmisvc("oci://registry.internal.example/llama-pair:v1", {"env": [
        {"name": "VLLM_ADDITIONAL_ARGS", "value": "--speculative-config '%s'" % json.dumps(spec)}]})
    found = L.llmisvc_pair_of(env_only, {"kserve-config-llm-template": preset})
    assert (found["target"], found["target_subdir"], found["draft"], found["draft_subdir"]) == (
        "oci://registry.internal.example/llama-pair:v1", "", "oci://registry.internal.example/llama-pair:v1", "draft"), found
    # the flag in a baseRefs preset, no served path anywhere (presets unreadable): /mnt/models, what KServe's presets serve
    in_preset = _llmisvc("s3://models/llama", base_refs=["eagle3-args"])
    found = L.llmisvc_pair_of(in_preset, {"eagle3-args": _preset("eagle3-args", {"args": ["--speculative-config", json.dumps(spec)]})})
    assert (found["target"], found["draft"], found["skipped"]) == ("s3://models/llama", "s3://models/llama/draft", None)
    # no flag in the decode pool (the prefill pool never drafts), and a draft outside /mnt/models
    prefill_only = _llmisvc("pvc://m/", {"args": ["--port", "8000"]})
    prefill_only["spec"]["prefill"] = {"template": {"containers": [{"name": "main", "args": ["--speculative-config", json.dumps(spec)]}]}}
    assert L.llmisvc_pair_of(prefill_only)["skipped"] == "the decode pool carries no --speculative-config"
    outside = _llmisvc("pvc://m/", {"args": ["--speculative-config", json.dumps(dict(spec, model="/opt/draft"))]})
    assert L.llmisvc_pair_of(outside)["skipped"] == "the draft /opt/draft is not under a storage URI's mount"


def test_preflight_of_a_live_llmisvc_names_it_and_its_storage():
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_preflight as ops
    spec = {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
    obj = _llmisvc("pvc://model-store/llama", {"command": ["vllm", "serve", "/mnt/models/target"],
                                               "args": ["--speculative-config", json.dumps(spec)]})
    params = dict(ops.PARAM_DEFAULTS, preflight="warn", namespace="models", pvc_job=False, pvc_job_off_reason="test")
    found = ops.preflight(params, isvc=obj)
    assert found["skipped"] == "the target is on a PVC (pvc://model-store/llama/target), which only a Job can read, and none is started (test)"
    assert found["method"] == "eagle3" and found["num_speculative_tokens"] == 3
    no_flag = _llmisvc("pvc://m/", {"args": ["--port", "8000"]})
    assert ops.preflight(params, isvc=no_flag)["skipped"] == "LLMInferenceService llama: the decode pool carries no --speculative-config"
