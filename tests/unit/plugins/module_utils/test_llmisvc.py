"""plugins/module_utils/kserve/llmisvc/: render both API versions, refuse bad input by field, find and strip the flag in
every form KServe's and llm-d's presets use (token-exact), readiness as KServe's controller reports it."""
import copy
import json
import os

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import flags as llmisvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import cluster as llmisvc_cluster
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import render as llmisvc_render
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import status as llmisvc_status
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.testbed import crds
from tests.testbed.controlplane import _load_crd
from tests.testbed.llmisvc_standin import schema_errors
from tests.fake_clock import FakeClock

SPEC_JSON = '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'


def params(**over):
    p = dict(name="llama-eagle3", namespace="models", method="eagle3", artifact_mode="pvc",
             artifacts={"pvc_name": "model-store"}, dtype="auto", max_model_len=8192, max_num_seqs=64, seed=42,
             vllm_version="0.32.0", llmisvc={"image": "registry.local/vllm/vllm-openai:v0.32.0"})
    ext = over.pop("llmisvc", None)
    p.update(over)
    if ext is not None:
        p["llmisvc"] = dict(p["llmisvc"], **ext)
    return p


def main_container(manifest, pool="decode"):
    node = manifest["spec"]
    for key in llmisvc_model.POOLS[pool]["path"]:
        node = node[key]
    return next(c for c in node["containers"] if c["name"] == "main")


@pytest.fixture(scope="module")
def crd_schemas():
    body = _load_crd(os.path.join(crds.resolve(), "serving.kserve.io_llminferenceservices.yaml"))
    return {v["name"]: v["schema"]["openAPIV3Schema"] for v in body["spec"]["versions"]}


@pytest.mark.parametrize("version", ["v1alpha1", "v1alpha2"])
def test_render_both_versions_validates_against_the_crd_schema(version, crd_schemas):
    import jsonschema  # pylint: disable=import-outside-toplevel
    out = llmisvc_render.render(params(llmisvc={"api_version": version, "parallelism": {"tensor": 2}, "prefill": {"replicas": 2}}))
    manifest = out["manifest"]
    assert manifest["apiVersion"] == "serving.kserve.io/" + version and manifest["kind"] == "LLMInferenceService"
    assert schema_errors(manifest, crds.resolve()) == []
    validator = jsonschema.Draft7Validator(crd_schemas[version])  # no check_schema: the meta-check of 2 MB costs seconds
    spec = manifest["spec"]
    assert spec["model"] == {"uri": "pvc://model-store/", "name": "llama-eagle3"}
    assert spec["parallelism"] == {"tensor": 2} and spec["prefill"]["replicas"] == 2
    decode = vllm_command.find_speculative_config(main_container(manifest)["command"])
    assert decode == json.loads(SPEC_JSON)
    # speculative decoding is on the decode pool only; the prefill pool runs the same command without it
    assert vllm_command.find_speculative_config(main_container(manifest, "prefill")["command"]) is None
    assert "--tensor-parallel-size 2" in main_container(manifest)["command"][2]
    # the schema really checks: a string where the CRD wants an integer fails
    bad = copy.deepcopy(manifest)
    bad["spec"]["parallelism"]["tensor"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)
    assert schema_errors(bad, crds.resolve()) == ["spec.parallelism.tensor: 'two' is not of type 'integer'"]
    typo = copy.deepcopy(manifest)
    typo["spec"]["paralelism"] = {"tensor": 2}
    assert schema_errors(typo, crds.resolve()) == [".spec.paralelism: not in the schema (the API server would drop it)"]


def test_speculative_on_both_pools_when_asked():
    out = llmisvc_render.render(params(llmisvc={"prefill": {"replicas": 1}, "speculative_pools": ["decode", "prefill"]}))
    for pool in ("decode", "prefill"):
        assert vllm_command.find_speculative_config(main_container(out["manifest"], pool)["command"]) == json.loads(SPEC_JSON)


@pytest.mark.parametrize("over,field", [
    ({"llmisvc": {"api_version": "v1alpha2", "criticality": "Critical"}}, "llmisvc.criticality"),
    ({"llmisvc": {"api_version": "v1alpha1", "kv_cache_offloading": {"cpu": {}}}}, "llmisvc.kv_cache_offloading"),
    ({"llmisvc": {"api_version": "v1alpha1", "confidential": {"enabled": True}}}, "llmisvc.confidential"),
    ({"llmisvc": {"api_version": "v1beta1"}}, "llmisvc.api_version"),
    ({"llmisvc": {"parallelism": {"tensor": 4}}, "speculative": {"draft_tensor_parallel_size": 2}},
     "speculative.draft_tensor_parallel_size"),
    ({"llmisvc": {"parallelism": {"tensors": 4}}}, "llmisvc.parallelism.tensors"),
    ({"llmisvc": {"parallelism": {"tensor": 0}}}, "llmisvc.parallelism.tensor"),
    ({"llmisvc": {"prefill": {"replicas": 1}, "speculative_pools": ["prefill"]}}, "llmisvc.speculative_pools"),
    ({"llmisvc": {"speculative_pools": ["decode", "prefill"]}}, "llmisvc.speculative_pools"),
    ({"artifact_mode": "storage_uris", "artifacts": {"target_uri": "hf://meta/llama", "draft_uri": "hf://x/eagle3"}},
     "artifacts.draft_uri"),
    ({"artifact_mode": "auto", "artifacts": {"target_uri": "hf://meta/llama", "draft_uri": "hf://x/eagle3"}}, "artifacts.draft_uri"),
    ({"method": "ngram", "artifact_mode": "single", "artifacts": {"storage_uri": "gs://bucket/llama"}}, "artifacts.storage_uri"),
    ({"deployment_mode": "Knative"}, "deployment_mode"),
    ({"min_replicas": 1, "max_replicas": 3}, "max_replicas"),
])
def test_bad_input_names_the_field(over, field):
    with pytest.raises(ValidationError) as err:
        llmisvc_render.render(params(**over))
    assert err.value.field == field, str(err.value)
    assert "Fix:" in str(err.value)


def test_no_image_is_left_to_kserve_presets_with_a_warning():
    out = llmisvc_render.render(params(llmisvc={"image": None}))
    assert "image" not in main_container(out["manifest"])
    assert any("llmisvc.image is not set" in w for w in out["warnings"])


def test_draft_tp_one_or_target_tp_is_accepted():
    for tp in (1, 4):
        out = llmisvc_render.render(params(llmisvc={"parallelism": {"tensor": 4}}, speculative={"draft_tensor_parallel_size": tp}))
        assert out["speculative"].config["draft_tensor_parallel_size"] == tp


def test_modelcar_and_baseline_storage_forms():
    out = llmisvc_render.render(params(artifact_mode="modelcar", artifacts={"modelcar_image": "registry.local/models/llama-eagle3:v1"}))
    assert out["manifest"]["spec"]["model"]["uri"] == "oci://registry.local/models/llama-eagle3:v1"
    assert out["artifacts"].draft_path == "/mnt/models/draft"
    base = llmisvc_render.render(params(method="none", artifact_mode="auto", artifacts={"target_uri": "hf://meta/llama"}))
    assert base["manifest"]["spec"]["model"]["uri"] == "hf://meta/llama" and base["speculative"] is None
    assert vllm_command.find_speculative_config(main_container(base["manifest"])["command"]) is None


def test_strip_rendered_decode_pool_gives_the_baseline_command_byte_for_byte():
    for style in ("bash", "args"):
        out = llmisvc_render.render(params(command_style=style, llmisvc={"prefill": {"replicas": 1}}))
        obj = out["manifest"]
        patch, changes = llmisvc.strip(obj)
        assert [c["pool"] for c in changes] == ["decode"]
        replace = [op for op in patch if op["op"] == "replace"]
        assert len(replace) == 1
        key = "command" if style == "bash" else "args"
        assert replace[0]["path"] == "/spec/template/containers/0/" + key
        # the prefill pool was rendered without the flag: stripping the decode pool must give exactly that
        assert replace[0]["value"] == main_container(obj, "prefill")[key]


# The forms of KServe's config/llmisvc presets and llm-d's: argv command+args, --flag=value, `bash -c` with the script
# in args (the data-parallel presets) and the VLLM_ADDITIONAL_ARGS env they expand.
DP_SCRIPT = ('START_RANK=0\neval "vllm serve \\\n  /mnt/models \\\n  --port 8001 \\\n  --data-parallel-size 2 \\\n'
             '  ${VLLM_ADDITIONAL_ARGS} \\\n  --trust-remote-code"')
FORMS = {
    "argv": ({"command": ["vllm", "serve", "/mnt/models"], "args": ["--port", "8000", "--speculative-config", SPEC_JSON, "--seed", "1"]},
             {"args": ["--port", "8000", "--seed", "1"]}),
    "argv_inline": ({"command": ["vllm", "serve", "/mnt/models"], "args": ["--speculative-config=" + SPEC_JSON, "--port", "8000"]},
                    {"args": ["--port", "8000"]}),
    "split_flags": ({"command": ["vllm", "serve", "/mnt/models"],
                     "args": ["--spec-method", "ngram", "--spec-tokens", "4", "--port", "8000"]},
                    {"args": ["--port", "8000"]}),
    "script_in_args": ({"command": ["/bin/bash", "-c"],
                        "args": ["exec vllm serve /mnt/models \\\n  --port 8001 \\\n  --speculative-config '%s' \\\n  --seed 1" % SPEC_JSON]},
                       {"args": ["exec vllm serve /mnt/models \\\n  --port 8001 \\\n  --seed 1"]}),
    "env_additional_args": ({"command": ["/bin/bash", "-c"], "args": [DP_SCRIPT],
                             "env": [{"name": "HOME", "value": "/home"},
                                     {"name": "VLLM_ADDITIONAL_ARGS", "value": "--max-num-seqs 8 --speculative-config '%s'" % SPEC_JSON}]},
                            {"env": [{"name": "HOME", "value": "/home"}, {"name": "VLLM_ADDITIONAL_ARGS", "value": "--max-num-seqs 8"}]}),
}


def _obj(container, pool="decode", base_refs=None):
    spec = {"model": {"uri": "pvc://m/"}}
    node = spec
    for key in llmisvc_model.POOLS[pool]["path"]:
        node = node.setdefault(key, {})
    node["containers"] = [dict(container, name="main", image="x")]
    if base_refs:
        spec["baseRefs"] = [{"name": n} for n in base_refs]
    return {"apiVersion": "serving.kserve.io/v1alpha2", "kind": "LLMInferenceService",
            "metadata": {"name": "m", "namespace": "ns", "generation": 1}, "spec": spec}


def _apply(obj, patch):
    """A minimal RFC 6902 test/replace applier, to check the patch against the object it was made from."""
    out = copy.deepcopy(obj)
    for op in patch:
        parts = op["path"].strip("/").split("/")
        node = out
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        last = int(parts[-1]) if isinstance(node, list) else parts[-1]
        if op["op"] == "test":
            assert node[last] == op["value"]
        else:
            node[last] = op["value"]
    return out


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("pool", ["decode", "prefill", "worker"])
def test_strip_every_preset_form_token_exact(form, pool):
    container, expected = FORMS[form]
    obj = _obj(container, pool)
    found = llmisvc.flags(obj)
    assert [(f["pool"], f["source"]) for f in found] == [(pool, "resource")]
    assert found[0]["config"]["method"] in ("eagle3", "ngram")
    patch, changes = llmisvc.strip(obj)
    assert changes and all(c["pool"] == pool for c in changes)
    after = _apply(obj, patch)
    got = main_container(after, pool)
    for key, value in expected.items():
        assert got[key] == value
    for key in ("command", "args", "env"):
        if key not in expected:
            assert got.get(key) == main_container(obj, pool).get(key), key
    assert llmisvc.flags(after) == []
    assert llmisvc.strip(after) == ([], [])


def test_a_flag_inside_the_eval_string_is_refused_not_half_stripped():
    script = DP_SCRIPT.replace("${VLLM_ADDITIONAL_ARGS}", "--speculative-config '%s'" % SPEC_JSON)
    obj = _obj({"command": ["/bin/bash", "-c"], "args": [script]})
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj)
    assert err.value.field == "spec.template" and "quoted string" in str(err.value)


def test_preset_in_base_refs_that_sets_the_flag_is_named_and_refused():
    preset = {"kind": "LLMInferenceServiceConfig", "metadata": {"name": "spec-preset"},
              "spec": {"template": {"containers": [{"name": "main", "env": [
                  {"name": "VLLM_ADDITIONAL_ARGS", "value": "--speculative-config '%s'" % SPEC_JSON}]}]}}}
    obj = _obj({"command": ["vllm", "serve", "/mnt/models"], "args": ["--port", "8000"]}, base_refs=["spec-preset"])
    found = llmisvc.flags(obj, {"spec-preset": preset})
    assert [(f["pool"], f["source"]) for f in found] == [("decode", "LLMInferenceServiceConfig/spec-preset")]
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, {"spec-preset": preset})
    assert err.value.field == "spec.baseRefs" and "spec-preset" in str(err.value)
    # the resource's own VLLM_ADDITIONAL_ARGS replaces the preset's (merge by env name): then the flag is not in effect
    own = _obj({"command": ["vllm", "serve", "/mnt/models"], "env": [{"name": "VLLM_ADDITIONAL_ARGS", "value": "--seed 1"}]},
               base_refs=["spec-preset"])
    assert llmisvc.flags(own, {"spec-preset": preset}) == []
    # a preset's args are replaced when the resource sets args
    args_preset = {"spec": {"template": {"containers": [{"name": "main", "args": ["--speculative-config", SPEC_JSON]}]}}}
    assert llmisvc.flags(obj, {"spec-preset": args_preset}) == []
    no_args = _obj({"command": ["vllm", "serve", "/mnt/models"]}, base_refs=["spec-preset"])
    assert [f["source"] for f in llmisvc.flags(no_args, {"spec-preset": args_preset})] == ["LLMInferenceServiceConfig/spec-preset"]


def _status(generation, observed, **conds):
    return {"metadata": {"generation": generation},
            "status": {"observedGeneration": observed,
                       "conditions": [{"type": k, "status": v, "reason": "R" + k} for k, v in conds.items()]}}


def test_readiness_needs_ready_at_the_current_generation():
    ok = llmisvc_status.readiness(_status(2, 2, Ready="True", PresetsCombined="True", WorkloadsReady="True", RouterReady="True",
                                          MainWorkloadReady="True", PrefillWorkloadReady="True"))
    assert ok["ready"] and ok["up_to_date"] and ok["pools"] == {"MainWorkloadReady": "True", "PrefillWorkloadReady": "True"}
    stale = llmisvc_status.readiness(_status(3, 2, Ready="True"))
    assert stale["ready"] and not stale["up_to_date"]
    pending = llmisvc_status.readiness(_status(2, 2, Ready="False", WorkloadsReady="False", PrefillWorkloadReady="False"))
    assert not pending["ready"] and pending["pools"]["PrefillWorkloadReady"] == "False" and pending["failed"] is None
    broken = llmisvc_status.readiness(_status(2, 2, Ready="False", PresetsCombined="False"))
    assert broken["failed"].startswith("PresetsCombined=False")


def test_pod_selector_and_names_follow_kserve_labels():
    assert llmisvc_model.pod_selector("m", "decode") == ("app.kubernetes.io/component=llminferenceservice-workload,"
                                                         "app.kubernetes.io/name=m,app.kubernetes.io/part-of=llminferenceservice")
    assert llmisvc_model.deployment_name("m", "prefill") == "m-kserve-prefill" and llmisvc_model.deployment_name("m", "decode") == "m-kserve"
    with pytest.raises(ValidationError):
        llmisvc_model.check_resource_kind("Deployment")
    assert isvc.KIND in llmisvc_model.RESOURCE_KINDS


def _dp_obj(data):
    obj = _obj({"command": ["vllm", "serve", "/mnt/models"], "args": ["--speculative-config", SPEC_JSON]})
    obj["spec"]["parallelism"] = {"data": data}
    return obj


ENGINE_LINE = ("(EngineCore_DP0 pid=7) INFO 11-29 07:44:56 [core.py:93] Initializing a V1 LLM engine (v0.32.0) with config: "
               "model='/mnt/models', speculative_config=SpeculativeConfig(method='eagle3', model='/mnt/models/draft', "
               "num_spec_tokens=3), tokenizer='/mnt/models'\n")


@pytest.fixture
def fake_pods(monkeypatch):
    """Two decode pods; only the first (data-parallel rank 0) logs the engine line."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods
    logs = {"m-kserve-0": ENGINE_LINE, "m-kserve-1": "(EngineCore_DP1 pid=8) INFO loading weights\n"}
    monkeypatch.setattr(k8s_pods, "list_pods", lambda _api, _ns, selector: (
        [{"name": n} for n in sorted(logs)] if "llminferenceservice-workload," in selector else [], []))
    monkeypatch.setattr(k8s_pods, "stream_pod_log", lambda _api, _ns, pod, **_kw: iter([logs[pod].encode()]))
    return logs


def test_engine_line_from_data_parallel_rank_0_names_the_pod(fake_pods):
    report, problems = llmisvc_cluster.engine_report(None, _dp_obj(2))
    assert problems == [], problems
    decode = report["decode"]
    assert decode["engine_pod"] == "m-kserve-0" and decode["data_parallel"] == 2
    assert decode["speculative_config"] == {"method": "eagle3", "model": "/mnt/models/draft", "num_spec_tokens": 3}
    assert [p["found"] for p in decode["pods"]] == [True, False]
    # without data parallelism every pod must log the line
    _report, problems = llmisvc_cluster.engine_report(None, _dp_obj(1))
    assert problems == ["pool decode pod m-kserve-1: no engine-config line in container main"]
    # and a rank-0 line that contradicts the flag fails, naming the pod
    fake_pods["m-kserve-0"] = ENGINE_LINE.replace("num_spec_tokens=3", "num_spec_tokens=5")
    _report, problems = llmisvc_cluster.engine_report(None, _dp_obj(2))
    assert len(problems) == 1 and "pod m-kserve-0" in problems[0] and "5" in problems[0]


@pytest.mark.parametrize("method,mode,artifacts", [
    ("ngram", "pvc", {"pvc_name": "model-store"}),
    ("draft_model", "modelcar", {"modelcar_image": "registry.local/models/llama-draft:v1"}),
    ("none", "single", {"storage_uri": "s3://bucket/llama"}),
])
def test_every_deploy_playbook_method_renders_schema_valid(method, mode, artifacts):
    out = llmisvc_render.render(params(method=method, artifact_mode=mode, artifacts=artifacts, command_style="args"))
    assert schema_errors(out["manifest"], crds.resolve()) == []
    flag = vllm_command.find_speculative_config(main_container(out["manifest"])["command"], main_container(out["manifest"])["args"])
    assert (flag or {}).get("method") == (None if method == "none" else method)


def test_wait_returns_only_when_ready_at_the_generation_and_the_pools_rolled_out(monkeypatch):
    """KServe marks a pool ready from its Deployment's Available condition (True on the old pods during a rolling
    update): the wait also waits for the rollout, and fails at once when a preset is missing."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
    ready = dict(_status(2, 2, Ready="True"), metadata={"name": "m", "namespace": "ns", "generation": 2, "resourceVersion": "5"})
    reads = [ready, ready, ready]
    rollout = ["pool decode: Deployment m-kserve rolling out (0 of 1 updated, 1 old, 1 available)", None]
    monkeypatch.setattr(isvc_wait._Kind, "get", lambda self, *_a: reads.pop(0))  # pylint: disable=protected-access
    monkeypatch.setattr(llmisvc_cluster, "rollout_pending", lambda _api, _obj: rollout.pop(0))
    clock = FakeClock()
    obj, elapsed = isvc_wait.wait_ready(None, "ns", "m", timeout=60, interval=5, clock=clock, sleep=clock.sleep,
                                        kind="LLMInferenceService")
    assert obj is ready and rollout == [] and clock.sleeps == [1.0] and elapsed == 1.0

    broken = dict(_status(1, 1, Ready="False", PresetsCombined="False"), metadata={"name": "m", "generation": 1})
    monkeypatch.setattr(isvc_wait._Kind, "get", lambda self, *_a: broken)  # pylint: disable=protected-access
    monkeypatch.setattr(isvc_wait._Kind, "pods", lambda self, *_a: [])  # pylint: disable=protected-access
    with pytest.raises(isvc_wait.WaitTimeout) as err:
        isvc_wait.wait_ready(None, "ns", "m", timeout=600, clock=clock, sleep=clock.sleep, kind="LLMInferenceService")
    assert "cannot become Ready: PresetsCombined=False" in str(err.value) and clock.sleeps == [1.0]


# ----------------------------------------------------------------------------------------------------------------
# KServe's well-known presets (config_merge.go combineBaseRefsConfig) and VLLM_ADDITIONAL_ARGS through valueFrom

def _upstream(name, pool_paths, container):
    """An LLMInferenceServiceConfig shaped like KServe's config/llmisvc/<name>.yaml (main container, its own fields)."""
    spec = {}
    for path in pool_paths:
        node = spec
        for key in path:
            node = node.setdefault(key, {})
        node["containers"] = [dict({"name": "main", "image": "ghcr.io/llm-d/llm-d:0.0.8"}, **copy.deepcopy(container))]
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LLMInferenceServiceConfig",
            "metadata": {"name": name, "namespace": "kserve"}, "spec": spec}


# config-llm-template.yaml: argv, command [vllm, serve, model] + args; the admin appended the flag to the args.
TEMPLATE_ARGS = {"command": ["vllm", "serve", "{{ .Spec.Model.Name }}"],
                 "args": ["--served-model-name", "{{ .Spec.Model.Name }}", "--port", "8000", "--speculative-config", SPEC_JSON],
                 "env": [{"name": "HOME", "value": "/home"}, {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}]}
# config-llm-decode-worker-data-parallel.yaml: bash -c eval "vllm serve ... ${VLLM_ADDITIONAL_ARGS} ..." in template and worker.
DP_PRESET = {"command": ["/bin/bash", "-c"], "args": [DP_SCRIPT],
             "env": [{"name": "HOME", "value": "/home"},
                     {"name": "VLLM_ADDITIONAL_ARGS", "value": "--speculative-config '%s'" % SPEC_JSON}]}


@pytest.mark.parametrize("spec,expected", [
    ({}, ["kserve-config-llm-template"]),
    ({"prefill": {"replicas": 1}}, ["kserve-config-llm-prefill-template", "kserve-config-llm-decode-template"]),
    ({"worker": {}, "parallelism": {"data": 2, "dataLocal": 1}}, ["kserve-config-llm-worker-data-parallel"]),
    ({"worker": {}, "parallelism": {"pipeline": 2}}, ["kserve-config-llm-worker-pipeline-parallel"]),
    ({"worker": {}, "parallelism": {"tensor": 2}}, []),  # multi-node without data or pipeline parallelism: none
    ({"worker": {}, "parallelism": {"data": 4}, "prefill": {"worker": {}, "parallelism": {"dataLocal": 2}}},
     ["kserve-config-llm-prefill-worker-data-parallel", "kserve-config-llm-decode-worker-data-parallel"]),
    ({"router": {"scheduler": {}, "route": {}}, "tracing": {}},
     ["kserve-config-llm-scheduler", "kserve-config-llm-router-route", "kserve-config-llm-tracing", "kserve-config-llm-template"]),
    ({"router": {"scheduler": {"pool": {"ref": {"name": "mine"}}}, "route": {"http": {"refs": [{"name": "r"}]}}}},
     ["kserve-config-llm-template"]),
])
def test_well_known_presets_follow_the_controller_shape_rules(spec, expected):
    assert llmisvc.well_known_presets({"spec": spec}) == expected


def test_well_known_names_honour_the_prefix_the_pins_and_the_baserefs_shape():
    obj = {"spec": {"baseRefs": [{"name": "pd"}]}, "status": {"annotations": {
        "serving.kserve.io/config-llm-decode-template": "v0-20-0-kserve-config-llm-decode-template"}}}
    # the shape comes from the resource merged with its baseRefs: a baseRef that adds a prefill pool makes it P/D
    assert llmisvc.well_known_presets(obj, [{"prefill": {"replicas": 1}}], config_prefix="v3-4-0-kserve-") == [
        "v3-4-0-kserve-config-llm-prefill-template", "v0-20-0-kserve-config-llm-decode-template"]
    assert llmisvc.well_known_presets(obj) == ["kserve-config-llm-template"]


def test_flag_from_the_well_known_template_is_found_in_merge_order_and_refused_naming_it():
    preset = _upstream("kserve-config-llm-template", [("template",)], TEMPLATE_ARGS)
    obj = _obj({"env": [{"name": "HF_TOKEN", "value": "x"}]})  # the resource sets neither command nor args
    del main_container(obj)["image"]
    presets = {"kserve-config-llm-template": preset}
    found = llmisvc.flags(obj, presets)
    assert [(f["pool"], f["source"], f["preset"], f["preset_namespace"]) for f in found] == [
        ("decode", "LLMInferenceServiceConfig/kserve-config-llm-template", "well-known", "kserve")]
    assert found[0]["config"] == json.loads(SPEC_JSON)
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, presets)
    msg = str(err.value)
    assert "kserve/kserve-config-llm-template" in msg and "well-known preset" in msg and err.value.field == "spec.template"
    # a prefill pool changes the shape: the single-node template no longer applies, nothing is found
    pd = copy.deepcopy(obj)
    pd["spec"]["prefill"] = {"template": {"containers": [{"name": "main", "args": ["--port", "8000"]}]}}
    assert llmisvc.flags(pd, presets) == []
    # the resource's own args replace the preset's (strategic merge replaces the list): no flag in effect
    own = copy.deepcopy(obj)
    main_container(own)["args"] = ["--port", "8000"]
    assert llmisvc.flags(own, presets) == [] and llmisvc.strip(own, presets) == ([], [])


def test_baserefs_override_the_well_known_presets_and_the_resource_overrides_both():
    preset = _upstream("kserve-config-llm-template", [("template",)], TEMPLATE_ARGS)
    user = {"metadata": {"name": "team-args", "namespace": "ns"},
            "spec": {"template": {"containers": [{"name": "main", "args": ["--port", "8000", "--max-num-seqs", "8"]}]}}}
    obj = _obj({"env": [{"name": "HOME", "value": "/h"}]}, base_refs=["team-args"])
    presets = {"kserve-config-llm-template": preset, "team-args": user}
    assert llmisvc.flags(obj, presets) == []  # team-args' args replace the well-known template's
    user["spec"]["template"]["containers"][0]["args"].append("--speculative-config=" + SPEC_JSON)
    found = llmisvc.flags(obj, presets)
    assert [(f["source"], f["preset"]) for f in found] == [("LLMInferenceServiceConfig/team-args", "baseRefs")]
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, presets)
    assert err.value.field == "spec.baseRefs" and "team-args" in str(err.value)


def test_data_parallel_preset_env_in_template_and_worker_and_the_resource_value_overriding_it():
    preset = _upstream("kserve-config-llm-decode-worker-data-parallel", [("template",), ("worker",)], DP_PRESET)
    spec = {"model": {"uri": "pvc://m/"}, "parallelism": {"data": 2}, "prefill": {"template": {"containers": [{"name": "main"}]},
                                                                                  "worker": {"containers": [{"name": "main"}]},
                                                                                  "parallelism": {"data": 2}},
            "template": {"containers": [{"name": "main"}]}, "worker": {"containers": [{"name": "main"}]}}
    obj = {"metadata": {"name": "m", "namespace": "ns"}, "spec": spec}
    presets = {"kserve-config-llm-decode-worker-data-parallel": preset}
    found = llmisvc.flags(obj, presets)
    assert sorted((f["pool"], f["field"], f["preset"]) for f in found) == [
        ("decode", "env[1] VLLM_ADDITIONAL_ARGS", "well-known"), ("worker", "env[1] VLLM_ADDITIONAL_ARGS", "well-known")]
    # the resource sets VLLM_ADDITIONAL_ARGS itself in both pools (merge by env name): only its own flag is in effect,
    # and the strip removes it token-exact, leaving the preset's script untouched
    for path in (("template",), ("worker",)):
        _dig_containers(obj, path)[0]["env"] = [{"name": "VLLM_ADDITIONAL_ARGS", "value": "--max-num-seqs 8 --speculative-config '%s'" % SPEC_JSON}]
    found = llmisvc.flags(obj, presets)
    assert sorted((f["pool"], f["source"]) for f in found) == [("decode", "resource"), ("worker", "resource")]
    patch, _changes = llmisvc.strip(obj, presets)
    after = _apply(obj, patch)
    for path in (("template",), ("worker",)):
        assert _dig_containers(after, path)[0]["env"] == [{"name": "VLLM_ADDITIONAL_ARGS", "value": "--max-num-seqs 8"}]
    assert llmisvc.flags(after, presets) == []


def _dig_containers(obj, path):
    node = obj["spec"]
    for key in path:
        node = node[key]
    return node["containers"]


CM_REF = {"name": "VLLM_ADDITIONAL_ARGS", "valueFrom": {"configMapKeyRef": {"name": "vllm-args", "key": "extra"}}}
SECRET_REF = {"name": "VLLM_ADDITIONAL_ARGS", "valueFrom": {"secretKeyRef": {"name": "vllm-secret", "key": "extra"}}}


def test_additional_args_from_a_configmap_is_read_and_a_flag_there_is_refused_naming_it():
    obj = _obj({"command": ["/bin/bash", "-c"], "args": [DP_SCRIPT], "env": [{"name": "HOME", "value": "/h"}, CM_REF]})
    assert llmisvc_cluster.env_configmap_refs(obj) == [("vllm-args", "extra", False)]
    # without the ConfigMap's value the valueFrom is not looked at (engine_report's use)
    assert llmisvc.flags(obj) == []
    sources = {("vllm-args", "extra"): {"value": "--max-num-seqs 8 --speculative-config '%s'" % SPEC_JSON, "reason": None}}
    found = llmisvc.flags(obj, env_sources=sources)
    assert len(found) == 1 and found[0]["source"] == "resource" and found[0]["forms"] == ["env_configmap"]
    assert found[0]["value_from"] == {"kind": "ConfigMap", "name": "vllm-args", "key": "extra", "optional": False}
    assert found[0]["config"] == json.loads(SPEC_JSON)
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, env_sources=sources)
    msg = str(err.value) + " " + err.value.hint
    assert "VLLM_ADDITIONAL_ARGS" in msg and "ConfigMap vllm-args key extra" in msg and "kubectl edit configmap vllm-args" in msg
    assert "with value" in err.value.hint and err.value.field == "spec.template.containers[main].env[VLLM_ADDITIONAL_ARGS]"
    # a ConfigMap without the flag: nothing found, the strip goes on with the rest (here: nothing)
    clean = {("vllm-args", "extra"): {"value": "--max-num-seqs 8", "reason": None}}
    assert llmisvc.flags(obj, env_sources=clean) == [] and llmisvc.strip(obj, env_sources=clean) == ([], [])
    # a ConfigMap that could not be read is refused, with the reason
    forbidden = {("vllm-args", "extra"): {"value": None, "reason": "HTTP 403 Forbidden"}}
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, env_sources=forbidden)
    assert "could not be inspected" in str(err.value) and "403" in str(err.value)


def test_additional_args_from_a_secret_is_never_read_and_refused_unless_the_user_vouches():
    argv_flag = ["--port", "8000", "--speculative-config", SPEC_JSON]
    obj = _obj({"command": ["vllm", "serve", "/mnt/models"], "args": argv_flag, "env": [SECRET_REF]})
    assert llmisvc_cluster.env_configmap_refs(obj) == []  # nothing to read: a Secret is never fetched
    found = llmisvc.flags(obj, env_sources={})
    secret = [f for f in found if f.get("value_from")]
    assert len(secret) == 1 and secret[0]["opaque"] and secret[0]["value_from"]["kind"] == "Secret" and secret[0]["config"] is None
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, env_sources={})
    assert "Secret vllm-secret key extra" in str(err.value) and "secret_env_has_no_flag" in err.value.hint
    patch, changes = llmisvc.strip(obj, env_sources={}, secret_env_has_no_flag=True)
    assert [c["field"] for c in changes] == ["args"]
    assert main_container(_apply(obj, patch))["args"] == ["--port", "8000"]
    assert main_container(_apply(obj, patch))["env"] == [SECRET_REF]


def test_configmap_refs_come_from_whichever_layer_owns_the_variable():
    preset = _upstream("kserve-config-llm-template", [("template",)], {"env": [CM_REF]})
    obj = _obj({"args": ["--port", "8000"]})
    presets = {"kserve-config-llm-template": preset}
    assert llmisvc_cluster.env_configmap_refs(obj, presets) == [("vllm-args", "extra", False)]
    sources = {("vllm-args", "extra"): {"value": "--speculative-config '%s'" % SPEC_JSON, "reason": None}}
    found = llmisvc.flags(obj, presets, sources)
    assert [(f["source"], f["preset"], f["value_from"]["name"]) for f in found] == [
        ("LLMInferenceServiceConfig/kserve-config-llm-template", "well-known", "vllm-args")]
    with pytest.raises(ValidationError) as err:
        llmisvc.strip(obj, presets, sources)
    assert "kserve-config-llm-template" in str(err.value)
    assert "does not replace the preset's valueFrom" in err.value.hint and "ConfigMap vllm-args key extra" in err.value.hint
    # a value the resource sets does not remove the preset's valueFrom: KServe's merge keeps both in one env item (the
    # Deployment is then refused), so the ConfigMap is still read and its flag still refused
    main_container(obj)["env"] = [{"name": "VLLM_ADDITIONAL_ARGS", "value": "--seed 1"}]
    assert llmisvc_cluster.env_configmap_refs(obj, presets) == [("vllm-args", "extra", False)]
    assert [f["source"] for f in llmisvc.flags(obj, presets, sources)] == ["LLMInferenceServiceConfig/kserve-config-llm-template"]
    # a valueFrom the resource sets is the one in effect (the preset's ConfigMap is no longer read)
    main_container(obj)["env"] = [{"name": "VLLM_ADDITIONAL_ARGS", "valueFrom": {"configMapKeyRef": {"name": "own", "key": "k"}}}]
    assert llmisvc_cluster.env_configmap_refs(obj, presets) == [("own", "k", False)]


# ----------------------------------------------------------------------------------------------------------------
# Draft removal after a rollback (draft_removal, shared with the InferenceService path)

def _rolled_back(uri, draft_subdir="tiny-eagle3", name="llama-eagle3"):
    """An LLMInferenceService rendered with the draft on the PVC (or in the Modelcar image), then stripped."""
    if uri.startswith("pvc://"):
        art = dict(artifact_mode="pvc", artifacts={"pvc_name": uri[len("pvc://"):].strip("/"), "draft_subdir": draft_subdir})
    else:
        art = dict(artifact_mode="modelcar", artifacts={"modelcar_image": uri[len("oci://"):]})
    obj = llmisvc_render.render(params(name=name, **art))["manifest"]
    patch, _changes = llmisvc.strip(obj)
    return obj, _apply(obj, patch)


def test_the_draft_of_an_llminferenceservice_is_its_pvc_subdirectory_or_its_modelcar_layers():
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_location  # pylint: disable=import-outside-toplevel
    before, after = _rolled_back("pvc://model-store/")
    with pytest.raises(ValidationError) as err:  # still speculative: the draft stays
        draft_location.locate(before, "/mnt/models/tiny-eagle3")
    assert "still runs speculative decoding" in str(err.value)
    loc = draft_location.locate(after, "/mnt/models/tiny-eagle3")
    assert (loc.mode, loc.details["pvc"], loc.details["subdir"], loc.details["keep"]) == ("pvc", "model-store", "tiny-eagle3", ["target"])
    with pytest.raises(ValidationError):  # the target the rolled-back command names is never removed
        draft_location.locate(after, "/mnt/models/target")
    _before, car = _rolled_back("oci://registry.local/models/llama-eagle3:v1")
    loc = draft_location.locate(car, "/mnt/models/draft")
    assert loc.mode == "modelcar" and loc.details["image_path"] == "models/draft"
    assert (loc.details["pointer"], loc.details["storage_uri"]) == ("/spec/model/uri", "oci://registry.local/models/llama-eagle3:v1")


def test_a_pvc_draft_another_resource_still_uses_is_kept():
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_location  # pylint: disable=import-outside-toplevel
    _before, me = _rolled_back("pvc://model-store/")
    me["kind"] = "LLMInferenceService"
    as_model = {"kind": "LLMInferenceService", "metadata": {"name": "draft-alone", "namespace": "models"},
                "spec": {"model": {"uri": "pvc://model-store/tiny-eagle3"}}}
    still_speculative, _after = _rolled_back("pvc://model-store/", name="twin")
    isvc_user = {"kind": "InferenceService", "metadata": {"name": "old", "namespace": "models"},
                 "spec": {"predictor": {"model": {"storageUri": "pvc://model-store/",
                                                  "args": ["--speculative-config", '{"model": "/mnt/models/tiny-eagle3"}']}}}}
    other_claim = {"kind": "InferenceService", "metadata": {"name": "x", "namespace": "models"},
                   "spec": {"predictor": {"model": {"storageUri": "pvc://elsewhere/tiny-eagle3"}}}}
    assert draft_location.other_users([me, other_claim, _after], me, "model-store", "tiny-eagle3") == []  # the twin rolled back
    users = draft_location.other_users([me, as_model, still_speculative, isvc_user, other_claim], me, "model-store", "tiny-eagle3")
    assert users == ["LLMInferenceService models/draft-alone (mounts pvc://model-store/tiny-eagle3)",
                     "LLMInferenceService models/twin (names /tiny-eagle3 on pvc://model-store)",
                     "InferenceService models/old (names /tiny-eagle3 on pvc://model-store)"]


class _DraftCluster:
    """draft_removal.execute's cluster for a rolled-back LLMInferenceService on a PVC: records every write."""

    def __init__(self, obj, users, unchecked=()):
        self.obj, self.users, self.unchecked, self.writes = obj, users, list(unchecked), []

    def get_isvc(self):
        return self.obj

    def patch_isvc(self, ops, dry_run=False):
        self.writes.append(("patch", ops))

    def get_pvc(self, name):
        return {"metadata": {"name": name, "annotations": {}}}

    def patch_pvc_annotations(self, name, annotations):
        self.writes.append(("pvc", name, annotations))

    def list_users(self):
        return self.users, self.unchecked


def test_the_removal_plan_keeps_a_used_or_unchecked_draft_and_runs_the_job_only_for_a_free_one():
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_removal  # pylint: disable=import-outside-toplevel
    _before, after = _rolled_back("pvc://model-store/")
    after.update(kind="LLMInferenceService")
    after["metadata"]["generation"] = 2
    after["status"] = {"observedGeneration": 2, "conditions": [{"type": "Ready", "status": "True"}]}
    params = {"draft_path": "/mnt/models/tiny-eagle3", "script_sha256": "0" * 64}
    user = {"kind": "InferenceService", "metadata": {"name": "old", "namespace": "models"},
            "spec": {"predictor": {"model": {"storageUri": "pvc://model-store/tiny-eagle3"}}}}
    used = draft_removal.execute(params, _DraftCluster(after, [after, user]))
    assert (used["run_job"], used["kept"], used["still_used_by"]) == (
        False, True, ["InferenceService models/old (mounts pvc://model-store/tiny-eagle3)"])
    assert "still used by" in used["warnings"][0]
    forbidden = "LLMInferenceServices (listing them failed, so it is unknown whether one uses it: 403)"
    unchecked = _DraftCluster(after, [after], unchecked=[forbidden])
    assert draft_removal.execute(params, unchecked)["still_used_by"] == [forbidden] and unchecked.writes == []
    free = draft_removal.execute(params, _DraftCluster(after, [after]))
    assert free["run_job"] is True and "kept" not in free and free["pvc_job"]["subdir"] == "tiny-eagle3"


def test_read_presets_skips_a_forbidden_well_known_preset_but_refuses_a_forbidden_base_ref(monkeypatch):
    """No rights in KServe's namespace: the well-known presets are named back (the engine line still proves what runs); a
    preset the resource itself names cannot be guessed, so that is an error naming spec.baseRefs."""
    from kubernetes.client.rest import ApiException
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
    reads = []

    class Api:
        def get_namespaced_custom_object(self, group, version, namespace, plural, name):
            reads.append((namespace, name))
            raise ApiException(status=403 if namespace == "kserve" else 404)
    monkeypatch.setattr(llmisvc_cluster, "_custom_api", lambda _client: Api())
    obj = {"metadata": {"name": "m", "namespace": "ns"}, "spec": {"template": {"containers": [{"name": "main"}]}}}
    unreadable = []
    assert llmisvc_cluster.read_presets(None, obj, unreadable=unreadable) == {}
    assert unreadable and all(u.startswith("kserve/kserve-") for u in unreadable)
    assert ("ns", unreadable[0].split("/")[1]) in reads  # the object's namespace is asked first
    obj["spec"]["baseRefs"] = [{"name": "shared-preset"}]
    with pytest.raises(SpecDecodingError) as err:
        llmisvc_cluster.read_presets(None, obj)
    assert err.value.field == "spec.baseRefs" and "kserve/shared-preset" in str(err.value)
