"""The draft preflight reading its metadata from an http mirror on loopback and from a Modelcar image in the test bed's
registry (Debian's docker-registry), through the draft_preflight_info module as a task runs it.

What is asserted comes from outside the readers: the mirror's own request log (paths, Range headers, bytes sent) and the
registry's access log (which blobs were fetched), so "only the small files" is measured, not assumed.
"""

import json
import os
import re
import struct
from http.server import SimpleHTTPRequestHandler

import pytest

from tests.loopback_http import serving
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


def _mirror_handler(root, log):
    class Mirror(SimpleHTTPRequestHandler):
        """A static mirror that honours Range (python's http.server does not) and logs each request and the bytes sent."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=root, **kwargs)

        def do_GET(self):  # noqa: N802
            path = self.translate_path(self.path)
            rng = self.headers.get("Range")
            if not os.path.isfile(path):
                log.append((self.path, rng, 0))
                self.send_error(404)
                return
            size = os.path.getsize(path)
            start, end = 0, size - 1
            if rng:
                m = re.match(r"bytes=(\d+)-(\d*)", rng)
                start, end = int(m.group(1)), min(int(m.group(2) or size - 1), size - 1)
            with open(path, "rb") as fh:
                fh.seek(start)
                body = fh.read(end - start + 1)
            self.send_response(206 if rng else 200)
            if rng:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            log.append((self.path, rng, len(body)))

        def log_message(self, *args):  # pylint: disable=arguments-differ
            pass
    return Mirror


def test_http_mirror_reads_only_the_small_files_and_the_header(tmp_path):
    root = str(tmp_path / "mirror")
    _checkpoints(root)
    log = []
    with serving(_mirror_handler(root, log)) as url:
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
    with serving(_mirror_handler(root, log)) as url:
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


def test_air_gapped_refuses_hf_and_pvc_is_skipped_with_its_reason():
    res = run_module("draft_preflight_info", {"target": "hf://meta-llama/Llama-3.1-8B-Instruct", "draft": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                              "method": "eagle3", "air_gapped": True})
    # refused as the deploy's first task refuses it, before anything is read
    assert res.failed and res["field"] == "target" and "spec_decoding_air_gapped: true refuses 'hf://meta-llama" in res.msg, res.msg
    res = run_module("draft_preflight_info", {"method": "eagle3", "deploy": {"artifacts": {"pvc_name": "model-store"}}})
    assert not res.failed and "PVC model-store" in res["summary"] and res["preflight"]["checks"] == []
    res = run_module("draft_preflight_info", {"method": "ngram"})
    assert not res.failed and "nothing to open" in res["preflight"]["checks"][0]["message"]


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
    """The inference_service role's preflight task (roles/inference_service/tasks/preflight.yml) on a GitOps render whose
    storageUris point at the loopback mirror: the broken head stops the play before the manifests are written."""
    from tests.ansible_run import run_playbook
    root = str(tmp_path / "mirror")
    _checkpoints(os.path.join(root, "good"))
    _checkpoints(os.path.join(root, "bad"), head=dict(HEAD, eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 1, 5]}))
    log = []
    with serving(_mirror_handler(root, log)) as url:
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
