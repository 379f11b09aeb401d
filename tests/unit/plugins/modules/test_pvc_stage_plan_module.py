"""The pvc_stage_plan module through real ansible-playbook: planning, a clear failure, and the stager-log check."""

import json
import os
import subprocess

from tests import stager
from tests.ansible_run import run_playbook


def _model(root):
    os.makedirs(root)
    with open(os.path.join(root, "model.safetensors"), "wb") as fh:
        fh.write(b"\0" * 4096)
    return root


def test_plan_then_check_a_real_stager_log(tmp_path):
    target = _model(str(tmp_path / "target"))
    draft = _model(str(tmp_path / "draft"))
    pvc = tmp_path / "pvc"
    cfg = tmp_path / "plan.json"
    cfg.write_text(json.dumps({"root": str(pvc), "items": [{"name": "org/t", "source": target, "dest": str(pvc / "T")},
                                                           {"name": "org/d", "source": draft, "dest": str(pvc / "D")}]}))
    proc = subprocess.run(stager.command("--config", str(cfg)), capture_output=True, text=True, check=True)
    items = [{"name": "org/t", "subdir": "T", "source": target}, {"name": "org/d", "subdir": "D", "source": draft}]
    run = run_playbook(tmp_path, tasks="""
    - name: Plan
      alauda.spec_decoding.pvc_stage_plan:
        pvc_name: models
        items: "{{ items_ }}"
        controller_address: 10.1.2.3
        existing_pvc: {metadata: {name: models}, spec: {resources: {requests: {storage: 10Gi}}}}
    - name: Check the log
      alauda.spec_decoding.pvc_stage_plan:
        pvc_name: models
        items: "{{ items_ }}"
        stager_log: "{{ log_ }}"
    """, extra_vars={"items_": items, "log_": proc.stderr + proc.stdout})
    assert run.rc == 0, run.output
    plan = run.result("Plan")
    assert plan["changed"] is False and plan["pvc_action"] == "reuse" and plan["size"] == "10Gi" and plan["data_bytes"] == 8192
    assert [i["source"] for i in plan["plan"]["items"]] == ["http://10.1.2.3:8765/", "http://10.1.2.3:8766/"]
    checked = run.result("Check the log")
    assert checked["stager_summary"]["layout"] == ["D", "T"]
    assert json.loads(checked["staged_annotation"])["T"]["name"] == "org/t"


def test_bad_input_fails_with_the_field_and_the_fix(tmp_path):
    run = run_playbook(tmp_path, tasks="""
    - name: Plan
      alauda.spec_decoding.pvc_stage_plan:
        pvc_name: models
        items: [{name: org/t, subdir: T, source: "hf://meta-llama/Llama-3.1-8B-Instruct", size_bytes: 10}]
        air_gapped: true
        list_sources: false
    """)
    assert run.rc != 0
    res = run.result("Plan")
    assert res["failed"] and res["field"] == "stage_pvc_items[0].source"
    assert "air-gapped inventory" in res["msg"] and "Fix:" in res["msg"]
