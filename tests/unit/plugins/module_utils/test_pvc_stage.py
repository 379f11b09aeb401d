# -*- coding: utf-8 -*-
# Copyright: Alauda
# Apache License 2.0 (see LICENSE)
"""Planning a PVC staging run: sizes, PVC decisions, ownership, air-gap, and reading the stager's summary."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import artifact_sync
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import pvc_plan as pvc_stage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests import stager

GI = 1 << 30


def _model(root, size):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "model.safetensors"), "wb") as fh:
        fh.truncate(size)  # sparse: the size is what counts
    with open(os.path.join(root, "config.json"), "w", encoding="utf-8") as fh:
        fh.write("{}")
    return root


def _params(items, **kw):
    out = {"pvc_name": "models", "items": items, "headroom_percent": 10, "min_size": "1Gi", "controller_address": "10.0.0.5"}
    out.update(kw)
    return out


def _pvc(size, sc="fast", annotations=None, capacity=None):
    return {"metadata": {"name": "models", "annotations": annotations or {}},
            "spec": {"storageClassName": sc, "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
            "status": dict({"phase": "Bound"}, **({"capacity": {"storage": capacity}} if capacity else {}))}


@pytest.mark.parametrize("text,num", [("100Gi", 100 * GI), ("1.5Ti", int(1.5 * (1 << 40))), ("500M", 500 * 10 ** 6), ("1024", 1024),
                                      (2048, 2048), ("1k", 1000)])
def test_parse_quantity(text, num):
    assert pvc_stage.parse_quantity(text) == num


@pytest.mark.parametrize("bad", ["", "ten", "10 GB", True, "-1Gi"])
def test_parse_quantity_rejects(bad):
    with pytest.raises(ValidationError, match="not a storage quantity"):
        pvc_stage.parse_quantity(bad, field="stage_pvc_size")


def test_size_is_files_plus_headroom_rounded_up_to_gi(tmp_path):
    t = _model(str(tmp_path / "t"), 15 * GI)
    d = _model(str(tmp_path / "d"), GI // 2)
    out = pvc_stage.plan(_params([{"name": "a/t", "subdir": "T", "source": t}, {"name": "a/d", "subdir": "D", "source": d}]))
    total = 15 * GI + GI // 2 + 4
    assert out["data_bytes"] == total
    assert out["required_bytes"] == int(-(-total * 1.1 // 1))
    assert out["size"] == "18Gi" and out["pvc_action"] == "create"
    assert [(i["subdir"], i["files"], i["kind"]) for i in out["items"]] == [("T", 2, "controller"), ("D", 2, "controller")]
    assert [s["port"] for s in out["serve"]] == [8765, 8766]
    assert [i["source"] for i in out["plan"]["items"]] == ["http://10.0.0.5:8765/", "http://10.0.0.5:8766/"]
    assert [i["dest"] for i in out["plan"]["items"]] == ["/mnt/pvc/T", "/mnt/pvc/D"]
    assert out["paths"] == {"T": "/mnt/models/T", "D": "/mnt/models/D"} and out["storage_uri"] == "pvc://models/"


def test_existing_pvc_reused_expanded_or_refused(tmp_path):
    t = _model(str(tmp_path / "t"), 5 * GI)
    items = [{"name": "a/t", "subdir": "T", "source": t}]
    assert pvc_stage.plan(_params(items, existing_pvc=_pvc("20Gi")))["pvc_action"] == "reuse"
    assert pvc_stage.plan(_params(items, existing_pvc=_pvc("20Gi")))["size"] == "20Gi"
    with pytest.raises(ValidationError, match=r"PVC models is 2Gi but the models need 6Gi .* does not allow expansion"):
        pvc_stage.plan(_params(items, existing_pvc=_pvc("2Gi")))
    expandable = {"metadata": {"name": "fast"}, "allowVolumeExpansion": True}
    grown = pvc_stage.plan(_params(items, existing_pvc=_pvc("2Gi"), existing_storage_class=expandable))
    assert grown["pvc_action"] == "expand" and grown["size"] == "6Gi"
    pending = dict(_pvc("2Gi"), status={"phase": "Pending"})
    with pytest.raises(ValidationError, match="it is Pending: Kubernetes expands only bound claims"):
        pvc_stage.plan(_params(items, existing_pvc=pending, existing_storage_class={"allowVolumeExpansion": True}))
    with pytest.raises(ValidationError, match="would shrink it"):
        pvc_stage.plan(_params(items, existing_pvc=_pvc("20Gi"), size="10Gi"))
    with pytest.raises(ValidationError, match="stage_pvc_size: 4Gi is smaller than the 5.0 GiB"):
        pvc_stage.plan(_params(items, size="4Gi"))


def test_storage_class_must_exist(tmp_path):
    items = [{"name": "a/t", "subdir": "T", "source": _model(str(tmp_path / "t"), 10)}]
    with pytest.raises(ValidationError, match="stage_pvc_storage_class: StorageClass 'gold' does not exist"):
        pvc_stage.plan(_params(items, storage_class_name="gold", storage_class=None))
    assert pvc_stage.plan(_params(items, storage_class_name="gold", storage_class={"metadata": {"name": "gold"}}))["pvc_action"] == "create"


def test_subdirectory_with_another_model_needs_force(tmp_path):
    items = [{"name": "meta-llama/Llama-3.1-8B-Instruct", "subdir": "T", "source": _model(str(tmp_path / "t"), 10)}]
    pvc = _pvc("5Gi", annotations={pvc_stage.STAGED_ANNOTATION: json.dumps({"T": {"name": "mistralai/Mistral-7B"}})})
    with pytest.raises(ValidationError, match=r"stage_pvc_items\[0\].subdir: subdirectory T of PVC models holds the model 'mistralai/Mistral-7B'"):
        pvc_stage.plan(_params(items, existing_pvc=pvc))
    out = pvc_stage.plan(_params(items, existing_pvc=pvc, force=True))
    assert out["replaced"] == ["T"] and out["plan"]["items"][0]["force"] is True
    same = _pvc("5Gi", annotations={pvc_stage.STAGED_ANNOTATION: json.dumps({"T": {"name": "meta-llama/Llama-3.1-8B-Instruct"}})})
    assert "force" not in pvc_stage.plan(_params(items, existing_pvc=same))["plan"]["items"][0]


def test_item_validation(tmp_path):
    src = _model(str(tmp_path / "t"), 10)
    with pytest.raises(ValidationError, match=r"stage_pvc_items\[0\].subdir: '../x' is not a safe"):
        pvc_stage.plan(_params([{"name": "a", "subdir": "../x", "source": src}]))
    with pytest.raises(ValidationError, match="is used by items 0 and 1"):
        pvc_stage.plan(_params([{"name": "a", "subdir": "x", "source": src}, {"name": "b", "subdir": "x/", "source": src}]))
    with pytest.raises(ValidationError, match="nest inside each other"):
        pvc_stage.plan(_params([{"name": "a", "subdir": "x", "source": src}, {"name": "b", "subdir": "x/y", "source": src}]))
    with pytest.raises(ValidationError, match=r"stage_pvc_items\[0\].name: is required"):
        pvc_stage.plan(_params([{"subdir": "x", "source": src}]))
    with pytest.raises(ValidationError, match="does not exist"):
        pvc_stage.plan(_params([{"name": "a", "subdir": "x", "source": str(tmp_path / "nope")}]))
    with pytest.raises(ValidationError, match="needs stage_pvc_controller_address"):
        pvc_stage.plan(_params([{"name": "a", "subdir": "x", "source": src}], controller_address=None))
    with pytest.raises(ValidationError, match="need stage_pvc_source_volume"):
        pvc_stage.plan(_params([{"name": "a", "subdir": "x", "source": "volume:/m", "size_bytes": 10}]))
    with pytest.raises(ValidationError, match="the size of x is unknown"):
        pvc_stage.plan(_params([{"name": "a", "subdir": "x", "source": "volume:/m"}], source_volume={"nfs": {}}))
    out = pvc_stage.plan(_params([{"name": "a", "subdir": "x", "source": "volume:/m/llama", "size_bytes": 3 * GI}], source_volume={"nfs": {}}))
    assert out["plan"]["items"][0]["source"] == "/mnt/source/m/llama" and out["size"] == "4Gi"


def test_air_gapped_plans_refuse_public_hubs():
    for item, extra in (({"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}, {}),
                        ({"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}, {"hf_endpoint": "https://hf-mirror.com"}),
                        ({"source": "https://huggingface.co/meta-llama/x/resolve/main/"}, {}),
                        ({"source": "s3://bucket/llama"}, {"s3_endpoint": "https://cdn-lfs.hf.co"})):
        with pytest.raises(ValidationError, match=r"stage_pvc_items\[0\].source: air-gapped inventory"):
            pvc_stage.plan(_params([dict(item, name="a", subdir="x", size_bytes=10)], air_gapped=True, list_sources=False, **extra))
    out = pvc_stage.plan(_params([{"name": "a", "subdir": "x", "source": "hf://org/m", "size_bytes": 10}], air_gapped=True,
                                 list_sources=False, hf_endpoint="https://hf.internal.example"))
    assert out["plan"]["air_gapped"] is True and out["plan"]["hf_endpoint"] == "https://hf.internal.example"


def test_plan_digest_changes_with_plan_and_script(tmp_path):
    items = [{"name": "a/t", "subdir": "T", "source": _model(str(tmp_path / "t"), 10)}]
    a = pvc_stage.plan(_params(items, script_sha256="1"))["plan_sha256"]
    assert a == pvc_stage.plan(_params(items, script_sha256="1"))["plan_sha256"]
    assert a != pvc_stage.plan(_params(items, script_sha256="2"))["plan_sha256"]
    assert a != pvc_stage.plan(_params(items, script_sha256="1", verify="full"))["plan_sha256"]


def test_stager_summary_from_a_real_engine_run(tmp_path):
    t = _model(str(tmp_path / "t"), 1000)
    d = _model(str(tmp_path / "d"), 10)
    root = tmp_path / "pvc"
    cfg = tmp_path / "plan.json"
    cfg.write_text(json.dumps({"root": str(root), "items": [
        {"name": "a/t", "source": t, "dest": str(root / "T")}, {"name": "a/d", "source": d, "dest": str(root / "D")}]}))
    proc = subprocess.run(stager.command("--config", str(cfg)), capture_output=True, text=True, check=True)
    log = proc.stderr + proc.stdout
    summary = pvc_stage.parse_stager_log(log, ["T", "D"], ["a/t", "a/d"])
    assert summary["layout"] == ["D", "T"] and all(i["verified_layout"] for i in summary["items"])
    with pytest.raises(ValidationError, match="T holds 'a/t', expected 'x/y'"):
        pvc_stage.parse_stager_log(log, ["T", "D"], ["x/y", "a/d"])
    with pytest.raises(ValidationError, match="lacks E"):
        pvc_stage.parse_stager_log(log, ["T", "E"], ["a/t", "a/e"])
    with pytest.raises(ValidationError, match="no summary line"):
        pvc_stage.parse_stager_log("Traceback (most recent call last):\n  boom", ["T"], ["a/t"])
    failed = json.dumps({artifact_sync.RESULT_KEY: {"ok": False, "items": [{"ok": False, "error": "source: cannot reach"}]}})
    with pytest.raises(ValidationError, match="the stager failed: source: cannot reach"):
        pvc_stage.parse_stager_log("x\n" + failed, ["T"], ["a/t"])
