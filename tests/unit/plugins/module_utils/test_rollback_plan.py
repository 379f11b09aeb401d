"""ops/rollback_plan.py: the rollback as a value built from reads (no cluster), and ops/rollback.py acting on it."""
import copy
import json
import os

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import writer
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback_plan

DATA = os.path.join(os.path.dirname(__file__), "data", "rollback")
FLAG = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
PARAMS = dict(namespace="ns", name="llama", state="absent", config=None, vllm_version=None, restore_backup=False, container=None,
              backup="annotation", backup_file=None, guard="value", retries=0, runtime_copy=False, edit_runtime=False,
              remove_draft_artifacts=False, wait=False, wait_timeout=60, wait_sleep=1, wait_crash_loop_restarts=0,
              gitops_owner="refuse")


def _guide():
    with open(os.path.join(DATA, "guide_example2_eagle3.yaml"), encoding="utf-8") as fh:
        obj = yaml.safe_load(fh)
    obj["metadata"].update(resourceVersion="41", generation=3)
    return obj


def _runtime(args=None):
    container = {"name": "kserve-container", "image": "vllm/vllm-openai:v0.11.2",
                 "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": args or ["--port", "8080"]}
    return {"metadata": {"name": "vllm-runtime", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [container], "supportedModelFormats": [{"name": "vLLM", "autoSelect": True}]}}


def _isvc_on_runtime():
    return {"metadata": {"name": "llama", "namespace": "ns", "resourceVersion": "7", "generation": 2},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "vLLM"}, "runtime": "vllm-runtime"}}}}


class _Reader:
    """The runtime reads the plan is given (a snapshot of one ServingRuntime)."""
    forbidden = []

    def __init__(self, rt):
        self.rt = rt

    def get(self, kind, namespace, name):
        return copy.deepcopy(self.rt) if kind == "ServingRuntime" and name == self.rt["metadata"]["name"] else None

    def list(self, kind, namespace):
        return [copy.deepcopy(self.rt)] if kind == "ServingRuntime" else []

    def users(self, _effective):
        return ["ns/llama", "ns/other"]


def test_the_plan_of_a_strip_is_built_from_the_reads_alone():
    isvc = _guide()
    asked = []
    plan = rollback_plan.build(dict(PARAMS, namespace="llm-demo", name="llama31-8b-eagle3"), isvc,
                               owner_of=lambda obj, what, warn: asked.append((obj["metadata"]["name"], what)) or {"kind": "none"})
    assert plan.changed and plan.runtime_fix is None and plan.owners == [{"kind": "none"}]
    assert asked == [("llama31-8b-eagle3", "InferenceService llm-demo/llama31-8b-eagle3")]  # who owns it, before any write
    assert plan.previous_config == {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
    after = writer.apply_patch(isvc, plan.ops)
    assert "--speculative-config" not in after["spec"]["predictor"]["model"]["command"][2]
    assert json.loads(after["metadata"]["annotations"][patch_plan.BACKUP_ANNOTATION])["config"] == plan.previous_config
    assert plan.result["containers"] == ["model"] and "runtime" not in plan.result  # no reader: the runtime is not checked
    # the object as it is after the strip: nothing to write, nobody asked
    again = rollback_plan.build(PARAMS, after, owner_of=lambda *a: pytest.fail("asked the owner with nothing to write"))
    assert not again.changed and again.ops == []


def test_a_flag_from_the_shared_runtime_is_refused_or_planned_as_a_copy_or_an_edit():
    rt = _runtime(["--speculative-config", json.dumps(FLAG)])
    with pytest.raises(ValidationError) as refused:
        rollback_plan.build(PARAMS, _isvc_on_runtime(), reader=_Reader(rt))
    assert "vllm-runtime" in str(refused.value)
    copied = rollback_plan.build(dict(PARAMS, runtime_copy=True), _isvc_on_runtime(), reader=_Reader(rt))
    assert copied.changed and copied.runtime_fix["fix"] == "copy" and copied.runtime["source"] == "serving_runtime"
    assert copied.previous_config == FLAG and copied.runtime_users == ["ns/llama", "ns/other"]
    name = copied.runtime_fix["body"]["metadata"]["name"]
    assert name != "vllm-runtime" and copied.ops == [  # the object's own command has no flag: only the switch to the copy
        {"op": "test", "path": "/spec/predictor/model/runtime", "value": "vllm-runtime"},
        {"op": "replace", "path": "/spec/predictor/model/runtime", "value": name}]
    edited = rollback_plan.build(dict(PARAMS, edit_runtime=True), _isvc_on_runtime(), reader=_Reader(rt))
    assert edited.runtime_fix["fix"] == "edit" and edited.ops == [] and edited.changed
    assert "--speculative-config" not in json.dumps(writer.apply_patch(rt, edited.runtime_fix["ops"]))
    assert any("every InferenceService using it loses" in w for w in edited.warnings)


class _Cluster:
    """The act's side of the cluster: what was written, in order."""
    api_client = None

    def __init__(self, isvc, rt):
        self.obj, self.rt, self.writes = isvc, rt, []

    def get(self):
        return copy.deepcopy(self.obj)

    def runtime_reader(self):
        return _Reader(self.rt)

    def owner_of(self, obj, what, policy=None, warn=None):
        self.writes.append(("owner", what, policy))
        return {"kind": "none"}

    def patch_runtime(self, kind, name, ops, dry_run):
        self.writes.append(("runtime", kind, name, dry_run))

    def patch(self, ops, dry_run):
        self.writes.append(("isvc", dry_run))
        self.obj = writer.apply_patch(self.obj, ops)
        return copy.deepcopy(self.obj)


def test_the_act_writes_the_runtime_fix_then_nothing_else_when_the_object_itself_has_no_flag():
    cluster = _Cluster(_isvc_on_runtime(), _runtime(["--speculative-config", json.dumps(FLAG)]))
    result, warnings = rollback.run(cluster, dict(PARAMS, edit_runtime=True, gitops_owner="ignore"))
    assert result["changed"] and result["attempts"] == 1 and result["runtime"]["fix"] == "edit"
    assert cluster.writes == [("owner", "InferenceService ns/llama", "ignore"), ("owner", "ServingRuntime vllm-runtime", "ignore"),
                              ("runtime", "ServingRuntime", "vllm-runtime", False)]
    assert any("edit_runtime" in w for w in warnings)
