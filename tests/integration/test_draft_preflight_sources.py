"""The draft preflight reading its metadata from an http mirror on loopback, from a Modelcar image in the test bed's
registry (Debian's docker-registry) and from a PVC through its read-only Job (a process-mode pod of the test bed: the
claim is a hostPath PersistentVolume), through the draft_preflight_info module as a task runs it.

What is asserted comes from outside the readers: the mirror's own request log (paths, Range headers, bytes sent) and the
registry's access log (which blobs were fetched), so "only the small files" is measured, not assumed.
"""

import json
import os
import struct

import pytest

from tests.loopback_http import mirror_handler, serving
from tests.module_run import run_module
from tests.testbed.gitops_standin import wait_for
from tests.testbed.registry import Registry, ensure_tools

pytestmark = pytest.mark.integration

TARGET = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
          "vocab_size": 4096, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": 0,
          "eos_token_id": 2}
HEAD = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 1,
        "vocab_size": 4096, "draft_vocab_size": 1024, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}
WEIGHT_BYTES = 2 << 20


def _safetensors(path, names):
    """A safetensors file: header naming ``names`` (all in one 2 MiB span) and that many bytes of weights."""
    header = {name: {"dtype": "F32", "shape": [WEIGHT_BYTES // 4 // len(names)],
                     "data_offsets": [i * (WEIGHT_BYTES // len(names)), (i + 1) * (WEIGHT_BYTES // len(names))]}
              for i, name in enumerate(names)}
    data = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(data)) + data + b"\0" * WEIGHT_BYTES)


def _checkpoints(root, head=None, head_tensors=("fc.weight", "d2t", "t2d", "lm_head.weight")):
    for name, config, tensors in (("target", TARGET, ("model.embed_tokens.weight", "lm_head.weight")),
                                  ("draft", head or HEAD, head_tensors)):
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(config, fh)
        with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": "x" * 5000}, fh)
        _safetensors(os.path.join(folder, "model.safetensors"), tensors)
    return os.path.join(root, "target"), os.path.join(root, "draft")


def test_http_mirror_reads_only_the_small_files_and_the_header(tmp_path):
    root = str(tmp_path / "mirror")
    _checkpoints(root)
    log = []
    with serving(mirror_handler(root, log)) as url:
        res = run_module("draft_preflight_info", {"target": url + "/target/", "draft": url + "/draft/", "method": "eagle3",
                                                  "speculative": {"num_speculative_tokens": 3}})
    print(json.dumps(res["preflight"]["checks"], indent=1), log)
    assert not res.failed, res.msg
    pre = res["preflight"]
    assert pre["passed"] and pre["figures"]["draft"]["aux_layer_ids"] == [0, 1, 2]
    assert [c["status"] for c in pre["checks"] if c["check"] == "vocabulary maps"] == ["passed"]  # 1024 of 4096, with d2t
    assert pre["sources"]["draft"]["files_read"] == ["config.json", "tokenizer_config.json", "model.safetensors (header)"]
    sent = sum(n for _p, _r, n in log)
    ranged = [(p, r) for p, r, _n in log if p.endswith("model.safetensors")]
    assert ranged and all(r for _p, r in ranged), ranged  # never a plain GET of the weights
    assert sent < 64 << 10, (sent, log)  # 2 x 2 MiB of weights on the mirror, a few KiB read
    print("bytes read from the mirror: %d of %d" % (sent, 2 * (WEIGHT_BYTES + 2000)))


def test_http_mirror_refusal_names_the_file_and_missing_mirror_is_a_warning(tmp_path):
    root = str(tmp_path / "mirror")
    _checkpoints(root, head=dict(HEAD, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}))
    log = []
    with serving(mirror_handler(root, log)) as url:
        res = run_module("draft_preflight_info", {"target": url + "/target/", "draft": url + "/draft/", "method": "eagle3"})
        warned = run_module("draft_preflight_info", {"target": url + "/target/", "draft": url + "/draft/", "method": "eagle3",
                                                     "preflight": "warn"})
        missing = run_module("draft_preflight_info", {"target": url + "/target/", "draft": url + "/nothing-here/", "method": "eagle3"})
    assert res.failed and "%s/draft/config.json eagle_config.eagle_aux_hidden_state_layer_ids" % url in res.msg, res.msg
    assert "[3] do not exist in the target's 2 layers" in res.msg and res["field"] == "preflight"
    assert not warned.failed and not warned["preflight"]["passed"]
    assert any("[3] do not exist" in w for w in warned.warning_messages)
    assert not missing.failed and missing["preflight"]["skipped"] and "nothing-here/config.json does not exist" in missing["preflight"]["skipped"]
    assert "preflight not run" in missing.warning_messages[0]


def test_air_gapped_refuses_hf_and_a_pvc_job_image_on_a_public_registry():
    res = run_module("draft_preflight_info", {"target": "hf://meta-llama/Llama-3.1-8B-Instruct", "draft": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                              "method": "eagle3", "air_gapped": True})
    # refused as the deploy's first task refuses it, before anything is read
    assert res.failed and res["field"] == "target" and "spec_decoding_air_gapped: true refuses 'hf://meta-llama" in res.msg, res.msg
    # the PVC read Job's image given on Docker Hub: refused before any Job is created (no cluster is named here), naming the
    # inventory variable; the default image (public) is no choice of the user's: the check is not run, said with the variable
    pvc = {"method": "eagle3", "air_gapped": True, "deploy": {"artifacts": {"pvc_name": "model-store"}}}
    res = run_module("draft_preflight_info", dict(pvc, pvc_image="docker.io/vllm/vllm-openai:v0.32.0"))
    assert res.failed and res["field"] == "pvc_image" and "docker.io/vllm/vllm-openai" in res.msg and "stage_pvc_image" in res["fix"], res.msg
    res = run_module("draft_preflight_info", pvc)
    assert not res.failed and res["preflight"]["skipped"].startswith("pvc_image: the PVC read Job needs an image"), res
    assert any(w.startswith("preflight not run, the rollout goes on: pvc_image:") and "set stage_pvc_image" in w for w in res.warning_messages)
    res = run_module("draft_preflight_info", {"method": "ngram"})
    assert not res.failed and "nothing to open" in res["preflight"]["checks"][0]["message"]


def test_pvc_is_read_by_one_read_only_job_which_is_removed(tmp_path, controlplane, kubeconfig, kubelet, namespace):  # pylint: disable=unused-argument
    """The deploy's PVC layout (artifacts.pvc_name, the render's subdirectories): one Job reads both checkpoints from the
    claim; its pod is a real process on the test bed, the claim a hostPath volume. The head reads a layer the target lacks:
    under warn the result has the figures read from the PVC and the refusal naming the file on the claim."""
    _checkpoints(str(tmp_path / "pv"), head=dict(HEAD, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 4]}))
    api = controlplane.rest()
    try:
        pv = "pv-preflight-%s" % namespace[-8:]
        api.post("/api/v1/persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "manual",
                     "hostPath": {"path": str(tmp_path / "pv")}, "claimRef": {"namespace": namespace, "name": "model-store"}}})
        api.post("/api/v1/namespaces/%s/persistentvolumeclaims" % namespace, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "model-store"},
            "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "manual", "volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}}})
        # the pod runs as a real process through its annotation, as inventories/testbed sets spec_decoding_preflight_job_annotations
        res = run_module("draft_preflight_info", {
            "method": "eagle3", "preflight": "warn", "kubeconfig": kubeconfig, "namespace": namespace, "pvc_timeout": 60,
            "pvc_job_annotations": {"testbed.alauda.io/run": "process"},
            "pvc_image": "registry.internal.example/vllm/vllm-openai:v0.32.0", "air_gapped": True,
            "deploy": {"artifacts": {"pvc_name": "model-store"}}})
        jobs = api.get("/apis/batch/v1/namespaces/%s/jobs" % namespace)["items"]
        # a claim that does not exist has nothing to read: skipped, said so, no Job and no warning
        absent = run_module("draft_preflight_info", {"method": "eagle3", "kubeconfig": kubeconfig, "namespace": namespace,
                                                     "deploy": {"artifacts": {"pvc_name": "no-such-store"}}})
    finally:
        api.delete("/api/v1/persistentvolumes/%s" % pv)
        api.close()
    assert not res.failed, res.msg
    pre = res["preflight"]
    print(json.dumps(pre["sources"]), pre["figures"])
    assert pre["sources"]["target"]["location"] == "pvc://model-store/target" and pre["sources"]["draft"]["job"] == pre["sources"]["target"]["job"]
    assert pre["sources"]["draft"]["files_read"] == ["config.json", "tokenizer_config.json", "model.safetensors (header)"]
    assert pre["figures"]["target"]["num_hidden_layers"] == 2 and pre["figures"]["draft"]["aux_layer_ids"] == [0, 1, 4]
    assert [c["status"] for c in pre["checks"] if c["check"] == "vocabulary maps"] == ["passed"]  # d2t found in the header
    assert not pre["passed"] and any("pvc://model-store/draft/config.json eagle_config.eagle_aux_hidden_state_layer_ids" in w
                                     and "[4] do not exist" in w for w in res.warning_messages), res.warning_messages
    assert not absent.failed and absent["preflight"]["skipped"] == "the PVC %s/no-such-store does not exist: nothing to read" % namespace
    assert not absent.warning_messages
    # the Job was deleted once its log was read
    assert pre["sources"]["target"]["job"].split("/")[1] not in [j["metadata"]["name"] for j in jobs], jobs


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    ensure_tools()
    reg = Registry(str(tmp_path_factory.mktemp("preflight-registry"))).start()
    yield reg
    reg.stop()


def _push(registry, target, draft, tag):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import modelcar_image, modelcar_push, oci_blobs
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as R
    plan = modelcar_image.build_plan(target, draft)
    image = "%s/models/pair:%s" % (registry.host, tag)
    client = R.RegistryClient(R.ImageRef.parse(image), tls_verify=False)
    modelcar_push.push_plan(plan, client, oci_blobs.DigestCache(None, enabled=False), jobs=1)
    return image


def test_modelcar_image_reads_only_the_layers_holding_the_metadata(registry, tmp_path):
    target, draft = _checkpoints(str(tmp_path / "pair"))
    image = _push(registry, target, draft, "good")
    with open(registry.log_path, encoding="utf-8", errors="replace") as fh:
        before = fh.read().count("GET /v2/models/pair/blobs/")
    res = run_module("draft_preflight_info", {"target": "oci://" + image, "draft": "oci://" + image, "method": "eagle3",
                                              "tls_verify": False, "speculative": {"num_speculative_tokens": 3}})
    assert not res.failed, res.msg
    pre = res["preflight"]
    assert pre["passed"] and pre["sources"]["draft"]["files_read"][-1] == "model.safetensors (header)"

    def blob_gets_logged():
        with open(registry.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read().count("GET /v2/models/pair/blobs/") - before
    # the registry writes its access log line after answering: read it once it has the eight GETs (or more), or 5 s on
    try:
        wait_for(lambda: blob_gets_logged() >= 8, timeout=5, what="the registry's access log")
    except TimeoutError:
        pass  # the assertion below says how many were logged
    blob_gets = blob_gets_logged()
    # per checkpoint: config.json, tokenizer_config.json, 2 x the safetensors layer (length, then header); an index is absent
    print("registry blob GETs: %d; layers read: %s" % (blob_gets, {k: v["layers_read"] for k, v in pre["sources"].items()}))
    assert pre["sources"]["target"]["layers_read"] == 4 and blob_gets == 8, blob_gets
    # the same image with the broken head is refused, naming the image path of the file
    target, draft = _checkpoints(str(tmp_path / "bad"), head=dict(HEAD, hidden_size=512))
    bad = _push(registry, target, draft, "bad")
    res = run_module("draft_preflight_info", {"target": "oci://" + bad, "draft": "oci://" + bad, "method": "eagle3", "tls_verify": False})
    assert res.failed and "oci://%s//models/draft/config.json hidden_size" % bad in res.msg and "512" in res.msg and "256" in res.msg, res.msg


def test_deploy_role_refuses_the_bad_pair_before_any_file_and_renders_the_good_one(tmp_path):
    """The inference_service role's preflight task (roles/inference_service/tasks/main.yml) on a GitOps render whose
    storageUris point at the loopback mirror: the broken head stops the play before the manifests are written."""
    from tests.ansible_run import run_playbook
    root = str(tmp_path / "mirror")
    _checkpoints(os.path.join(root, "good"))
    _checkpoints(os.path.join(root, "bad"), head=dict(HEAD, eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 1, 5]}))
    log = []
    with serving(mirror_handler(root, log)) as url:
        def render(pair, out):
            return run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars={
                "spec_decoding_target": "gitops", "spec_decoding_gitops_dir": str(out), "spec_decoding_hosts": "localhost",
                "spec_decoding_namespace": "models", "spec_decoding_isvc_name": "pair-" + pair,
                "spec_decoding_artifact_mode": "storage_uris", "spec_decoding_vllm_version": "0.32.0",
                "spec_decoding_artifacts": {"target_uri": "%s/%s/target/" % (url, pair), "draft_uri": "%s/%s/draft/" % (url, pair),
                                            "target_mount_path": "/mnt/target/model", "draft_mount_path": "/mnt/draft/model"}})
        bad = render("bad", tmp_path / "out-bad")
        good = render("good", tmp_path / "out-good")
    assert bad.rc != 0
    failed = bad.result("Check the draft against its target from the checkpoints' metadata")
    assert failed["failed"] and "/bad/draft/config.json eagle_config.eagle_aux_hidden_state_layer_ids" in failed["msg"], failed
    assert "[5] do not exist in the target's 2 layers" in failed["msg"] and "Fix:" in failed["msg"]
    assert not (tmp_path / "out-bad").exists() or not os.listdir(tmp_path / "out-bad")
    assert good.rc == 0, good.output
    passed = good.result("Check the draft against its target from the checkpoints' metadata")
    assert passed["preflight"]["passed"] and passed["summary"].startswith("preflight eagle3: passed")
    assert passed["preflight"]["num_speculative_tokens"] == 3  # the eagle3 preset, merged as the render merges it
    assert os.listdir(tmp_path / "out-good")


def test_s3_store_signed_reads_of_the_small_files_and_the_header(tmp_path):
    """moto's S3 on loopback (tests/s3_server.py): the target's objects public-read, the draft's private. With the access key
    of artifact_credentials_s3 the GETs are signed and the private head is read; without it the head is refused (403) and
    the check says it did not run. Only config.json, tokenizer_config.json and ranged GETs of model.safetensors are sent."""
    from tests.s3_server import serving as s3_serving
    target, draft = _checkpoints(str(tmp_path / "pair"))
    secret = "S3cr3t-preflight-canary"
    with s3_serving(str(tmp_path)) as s3:
        s3.make_bucket("models")
        for folder, prefix, public in ((target, "llama/target", True), (draft, "llama/eagle3", False)):
            for name in sorted(os.listdir(folder)):
                with open(os.path.join(folder, name), "rb") as fh:
                    s3.put("models", "%s/%s" % (prefix, name), fh.read(), public=public)
        args = {"target": "s3://models/llama/target", "draft": "s3://models/llama/eagle3", "method": "eagle3",
                "speculative": {"num_speculative_tokens": 3},
                "s3": {"endpoint": "127.0.0.1:%d" % s3.port, "use_https": False, "access_key_id": "AKIDPREFLIGHT", "secret_access_key": secret}}
        before = len(s3.requests())
        signed = run_module("draft_preflight_info", args)
        reads = s3.requests()[before:]
        anonymous = run_module("draft_preflight_info", dict(args, s3={"endpoint": "127.0.0.1:%d" % s3.port, "use_https": False}))
        refused = s3.requests()[before + len(reads):]
    print(reads, refused)
    assert not signed.failed, signed.msg
    pre = signed["preflight"]
    assert pre["passed"] and pre["figures"]["draft"]["aux_layer_ids"] == [0, 1, 2] and pre["figures"]["target"]["num_hidden_layers"] == 2
    assert pre["sources"]["draft"]["files_read"] == ["config.json", "tokenizer_config.json", "model.safetensors (header)"]
    weights = [(path, status) for method, path, status in reads if path.endswith("model.safetensors")]
    # two ranged GETs per checkpoint (the length, then the header): 206 each, never the 2 MiB of weights
    assert len(weights) == 4 and all(status == 206 for _p, status in weights), reads
    assert secret not in json.dumps(signed, default=str) and "AKIDPREFLIGHT" not in json.dumps(signed, default=str)
    # unsigned: the public target is read, the private head is refused by the store: the check did not run, the rollout goes on
    assert not anonymous.failed and "HTTP 403" in anonymous["preflight"]["skipped"], anonymous["preflight"]
    assert ("GET", "/models/llama/eagle3/config.json", 403) in refused, refused
