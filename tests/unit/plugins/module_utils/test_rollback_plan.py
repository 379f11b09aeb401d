"""ops/rollback_plan.py: the rollback as a value built from reads (no cluster), and ops/rollback.py acting on it."""
import copy
import json
import os
import sys

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner as gitops_owner
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import writer
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command

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


class _Reads:
    """The runtime reads of the cluster service (custom_objects' shape): one ServingRuntime, no InferenceService listed."""

    def __init__(self, rt):
        self.rt = rt

    def get_namespaced_custom_object(self, _group, _version, _namespace, plural, name):
        if plural == "servingruntimes" and name == self.rt["metadata"]["name"]:
            return copy.deepcopy(self.rt)
        raise _NotFound()

    def get_cluster_custom_object(self, *_args):
        raise _NotFound()

    def list_namespaced_custom_object(self, _group, _version, _namespace, plural, label_selector=None):
        return {"items": [copy.deepcopy(self.rt)] if plural == "servingruntimes" else []}

    def list_cluster_custom_object(self, *_args, **_kwargs):
        return {"items": []}


class _NotFound(Exception):
    status = 404


class _Cluster(kube_service.ClusterService):
    """The cluster service the act writes through: what was written, in order (the owner asked: gitops/owner.py's check,
    recorded by the ``owner_asked`` fixture)."""

    def __init__(self, isvc, rt):
        super().__init__(None)
        self.obj, self.rt, self.writes = isvc, rt, []

    def inference_service(self, namespace, name):
        return copy.deepcopy(self.obj)

    def custom_objects(self):
        return _Reads(self.rt)

    def get(self, res, name, namespace=None, missing="refuse", field="name", **_kwargs):
        return copy.deepcopy(self.rt) if res.kind == "ServingRuntime" and name == self.rt["metadata"]["name"] else None

    def create(self, res, body, namespace=None, field_manager=None, dry_run=False):
        self.writes.append(("create", res.kind, body["metadata"]["name"], dry_run))
        return copy.deepcopy(body)

    def json_patch(self, res, name, ops, namespace=None, field_manager=None, dry_run=False, read=None):
        if res.kind != "InferenceService":
            self.writes.append(("runtime", res.kind, name, dry_run))
            return None
        self.writes.append(("isvc", dry_run))
        self.obj = writer.apply_patch(self.obj, ops)
        return copy.deepcopy(self.obj)


@pytest.fixture
def owner_asked(monkeypatch):
    """Every owner question of the act, as ``("owner", what, policy)`` into the cluster's writes (it answers: no owner)."""
    def asking(cluster):
        def check_live_write(_api_client, _obj, policy, what, warn=None):
            cluster.writes.append(("owner", what, policy))
            return {"kind": "none"}
        monkeypatch.setattr(gitops_owner, "check_live_write", check_live_write)
        return cluster
    return asking


def test_the_act_writes_the_runtime_fix_then_nothing_else_when_the_object_itself_has_no_flag(owner_asked):
    cluster = owner_asked(_Cluster(_isvc_on_runtime(), _runtime(["--speculative-config", json.dumps(FLAG)])))
    result, warnings = rollback.run(cluster, dict(PARAMS, edit_runtime=True, gitops_owner="ignore"))
    assert result["changed"] and result["attempts"] == 1 and result["runtime"]["fix"] == "edit"
    assert cluster.writes == [("owner", "InferenceService ns/llama", "ignore"), ("owner", "ServingRuntime vllm-runtime", "ignore"),
                              ("runtime", "ServingRuntime", "vllm-runtime", False)]
    assert any("edit_runtime" in w for w in warnings)


# -- one way through: each file the rollback reaches is entered at most three times (issue #46) ----------------------

PLUGINS = os.path.realpath(os.path.join(os.path.dirname(rollback.__file__), "..", ".."))
ENTRIES_MAX = 3
# vllm/ as a district is printed too: one read per command (vllm/command_line.read), not one call per word or question
VLLM = os.path.join("module_utils", "vllm") + os.sep


def _file_entries(call):
    """(result of ``call()``, {file: entries}, entries into vllm/ as a whole): a file of plugins/ is entered when a call
    lands in it from another file while it is not already on the stack (calls made while a module is imported do not
    count)."""
    entries, district, stack = {}, [0], []

    def where(frame):
        if frame.f_code.co_name == "<module>":
            return "<import>"
        path = os.path.realpath(frame.f_code.co_filename)
        return path[len(PLUGINS) + 1:] if path.startswith(PLUGINS + os.sep) else "-"

    def profile(frame, event, _arg):
        if event == "call":
            here = where(frame)
            if here not in ("-", "<import>") and "<import>" not in stack:
                if here not in stack:
                    entries[here] = entries.get(here, 0) + 1
                if here.startswith(VLLM) and not any(f.startswith(VLLM) for f in stack):
                    district[0] += 1
            stack.append(here)
        elif event == "return" and stack:
            stack.pop()

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = call()
    finally:
        sys.setprofile(previous)
    return result, entries, district[0]


def _guide_on_runtime(flag_in_runtime):
    """The guide's Example 2 on its ServingRuntime: the flag in the InferenceService's script, or (``flag_in_runtime``)
    only in the runtime's args, which the script passes on with "$@"."""
    isvc = _guide()
    rt = _runtime(["--speculative-config", json.dumps(FLAG)] if flag_in_runtime else None)
    rt["metadata"].update(name=isvc["spec"]["predictor"]["model"]["runtime"], namespace="llm-demo")
    rt["spec"]["supportedModelFormats"] = [{"name": "transformers", "autoSelect": True}]
    if flag_in_runtime:
        script = isvc["spec"]["predictor"]["model"]["command"][2]
        script = "".join(line for line in script.splitlines(True) if "--speculative-config" not in line)
        isvc["spec"]["predictor"]["model"]["command"][2] = script.replace("--enable-prefix-caching", '--enable-prefix-caching "$@"')
    return isvc, rt


@pytest.mark.parametrize("flag_in_runtime", [False, True], ids=["flag in the InferenceService's script", "flag in the ServingRuntime's args, runtime_copy"])
def test_a_rollback_enters_each_file_at_most_three_times(monkeypatch, flag_in_runtime):
    isvc, rt = _guide_on_runtime(flag_in_runtime)
    cluster = _Cluster(isvc, rt)
    # the wait is the waiter's (its own tests): Ready at once
    monkeypatch.setattr(isvc_wait, "wait_ready", lambda *_a, **_k: (cluster.inference_service(None, None), 0.0))
    params = dict(PARAMS, namespace="llm-demo", name="llama31-8b-eagle3", wait=True, runtime_copy=flag_in_runtime)
    vllm_command.read.cache_clear()  # a cold run: every command read for the first time, as in a fresh module process
    (result, warnings), entries, vllm_entries = _file_entries(lambda: rollback.run(cluster, params, diff=True))
    table = "\n".join("%4d  %s" % (n, f) for f, n in sorted(entries.items(), key=lambda item: (-item[1], item[0])))
    print("entries per file (vllm/ entered %d times as a district):\n%s" % (vllm_entries, table))
    # the rollback itself happened, as rollback_one.yml's isvc_speculative task does it
    assert result["changed"] and result["ready"]["ready"] and warnings == []
    assert result["previous_config"] == (FLAG if flag_in_runtime else
                                         {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3})
    assert result["runtime"]["source"] == ("serving_runtime" if flag_in_runtime else "inference_service")
    assert result["runtime"]["fix"] == ("copy" if flag_in_runtime else "none") and result["config"] is None
    assert "--speculative-config" not in cluster.obj["spec"]["predictor"]["model"]["command"][2]
    copied = [("create", "ServingRuntime", result["runtime"]["copy"], False)] if flag_in_runtime else []
    assert "diff" in result and cluster.writes == copied + [("isvc", False)]
    over = {f: n for f, n in entries.items() if n > ENTRIES_MAX}
    assert not over, "files entered more than %d times:\n%s" % (ENTRIES_MAX, table)
    assert entries["module_utils/kserve/isvc/runtime.py"] == 1  # one selection and merge, the stripped command merged into it


def test_the_backup_file_is_written_whole_for_its_owner_and_rolls_forward_exactly(tmp_path):
    isvc, rt = _guide_on_runtime(False)
    cluster = _Cluster(isvc, rt)
    path = tmp_path / "backups" / "llama.json"  # its folder is made by the write
    params = dict(PARAMS, namespace="llm-demo", name="llama31-8b-eagle3", backup="both", backup_file=str(path))
    result, _warnings = rollback.run(cluster, params)
    assert result["backup_file"] == str(path) and os.listdir(path.parent) == [path.name]  # no temporary file left
    assert os.stat(path).st_mode & 0o777 == 0o600
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["namespace"] == "llm-demo" and saved["config"] == result["previous_config"] == {
        "method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
    assert "--speculative-config" not in cluster.obj["spec"]["predictor"]["model"]["command"][2]
    forward, _warnings = rollback.run(cluster, dict(params, state="present", restore_backup=True, backup="file"))
    assert forward["changed"] and cluster.obj["spec"]["predictor"]["model"]["command"] == isvc["spec"]["predictor"]["model"]["command"]
