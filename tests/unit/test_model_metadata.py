"""Reading a checkpoint's small metadata (plugins/module_utils/artifacts/model_metadata.py) from a local directory, and the
draft_preflight_info module's choice of sources from the deploy's variables. The http mirror and the registry are read in
tests/integration/test_draft_preflight_sources.py."""

import json
import struct

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import model_metadata as M
from tests.module_run import run_module

TARGET = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
          "num_nextn_predict_layers": 1, "vocab_size": 129280}


def _write(folder, config, index=None, header=None, extra=b""):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if index is not None:
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    if header is not None:
        data = json.dumps(header).encode()
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(data)) + data + extra)
    return str(folder)


def test_index_gives_names_and_total_size(tmp_path):
    path = _write(tmp_path / "t", TARGET, index={"metadata": {"total_size": 1342177280000},
                                                 "weight_map": {"model.layers.61.eh_proj.weight": "model-00163-of-00163.safetensors",
                                                                "lm_head.weight": "model-00163-of-00163.safetensors"}})
    ckpt = M.read_location(path)
    assert ckpt["tensors"] == ["lm_head.weight", "model.layers.61.eh_proj.weight"] and ckpt["total_size"] == 1342177280000
    assert ckpt["files_read"] == ["config.json", "model.safetensors.index.json"] and ckpt["tokenizer"] is None


def test_single_file_header_and_a_file_that_is_not_safetensors(tmp_path):
    header = {"__metadata__": {"format": "pt"}, "d2t": {"dtype": "I64", "shape": [32000], "data_offsets": [0, 256000]},
              "fc.weight": {"dtype": "BF16", "shape": [4096, 12288], "data_offsets": [256000, 100919296]}}
    path = _write(tmp_path / "d", {"architectures": ["LlamaForCausalLMEagle3"]}, header=header, extra=b"\0" * 64)
    ckpt = M.read_location(path)
    assert ckpt["tensors"] == ["d2t", "fc.weight"] and ckpt["total_size"] == 100919296
    junk = tmp_path / "j"
    junk.mkdir()
    (junk / "config.json").write_text("{}")
    (junk / "model.safetensors").write_bytes(b"model.safetensors" * 100)  # the "length" is absurd: no names, the rest runs
    assert M.read_location(str(junk))["tensors"] is None


def test_missing_config_and_not_json_are_unreadable(tmp_path):
    with pytest.raises(M.MetadataUnreadable) as err:
        M.read_location(str(tmp_path), field="draft")
    assert str(err.value).startswith("draft: cannot read the metadata of %s: %s/config.json does not exist" % (tmp_path, tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(M.MetadataUnreadable, match="config.json is not JSON"):
        M.read_location(str(tmp_path))


@pytest.mark.parametrize("deploy, expected", [
    ({"artifacts": {"modelcar_image": "r.example/m:v1", "draft_subdir": "eagle"}, "modelcar_build": {"target_dir": "/b/t", "draft_dir": "/b/d"}},
     {"target": "/b/t", "draft": "/b/d", "skipped": None}),
    ({"artifacts": {"pvc_name": "store"}, "stage": True, "stage_items": [{"source": "https://m/t/"}, {"source": "hf://o/d"}]},
     {"target": "https://m/t/", "draft": "hf://o/d", "skipped": None}),
    ({"artifacts": {"target_uri": "oci://r/t:1", "draft_uri": "oci://r/d:1"}},
     {"target": "oci://r/t:1", "draft": "oci://r/d:1", "target_subdir": "", "skipped": None}),
    ({"artifacts": {"modelcar_image": "r.example/m:v1", "draft_subdir": "eagle"}},
     {"target": "oci://r.example/m:v1", "draft_subdir": "eagle", "target_subdir": "target"}),
    # a PVC is read by a Job, S3 by signed or anonymous GETs (the locations as given; the render's subdirectories for pvc_name)
    ({"artifacts": {"target_uri": "pvc://store/t", "draft_uri": "pvc://store/d"}}, {"target": "pvc://store/t", "skipped": None}),
    ({"artifacts": {"target_uri": "s3://b/t", "draft_uri": "https://m/d/"}}, {"target": "s3://b/t", "skipped": None}),
    ({"artifacts": {"pvc_name": "store"}}, {"target": "pvc://store/target", "draft": "pvc://store/draft", "skipped": None}),
    ({"artifacts": {"target_uri": "gs://b/t", "draft_uri": "https://m/d/"}}, {"skipped": "gs://b/t is a other location"}),
])
def test_sources_from_deploy(deploy, expected):
    found = M.sources_from_deploy(deploy.get("artifacts"), deploy.get("modelcar_build"), deploy.get("stage_items"), deploy.get("stage", False))
    for key, value in expected.items():
        if key == "skipped" and value:
            assert found["skipped"].startswith(value), found
        else:
            assert found[key] == value, found


def test_module_mtp_from_the_deploy_reads_the_target_only_and_merges_the_preset(tmp_path):
    target = _write(tmp_path / "t", TARGET)
    res = run_module("draft_preflight_info", {"method": "deepseek_mtp", "deploy": {"artifacts": {}, "modelcar_build": {
        "target_dir": target, "draft_dir": str(tmp_path / "no-such-draft")}}})
    assert not res.failed, res.msg
    pre = res["preflight"]
    assert pre["method"] == "mtp" and pre["num_speculative_tokens"] == 1 and list(pre["sources"]) == ["target"]
    assert pre["passed"] and pre["figures"]["target_mtp"]["mtp_layers"] == 1
    res = run_module("draft_preflight_info", {"method": "mtp", "target": target, "speculative": {"num_speculative_tokens": 3},
                                              "preflight": "off"})
    assert res["preflight"]["skipped"] == "preflight: off" and res["preflight"]["checks"] == []
