"""plugins/module_utils/llmisvc.py: render both API versions, refuse bad input by field, find and strip the flag in
every form KServe's and llm-d's presets use (token-exact), readiness as KServe's controller reports it."""
import copy
import json
import os

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils import isvc, llmisvc, vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.testbed import crds
from tests.testbed.controlplane import _load_crd
from tests.testbed.llmisvc_standin import schema_errors

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
    for key in llmisvc.POOLS[pool]["path"]:
        node = node[key]
    return next(c for c in node["containers"] if c["name"] == "main")


@pytest.fixture(scope="module")
def crd_schemas():
    body = _load_crd(os.path.join(crds.resolve(), "serving.kserve.io_llminferenceservices.yaml"))
    return {v["name"]: v["schema"]["openAPIV3Schema"] for v in body["spec"]["versions"]}


@pytest.mark.parametrize("version", ["v1alpha1", "v1alpha2"])
def test_render_both_versions_validates_against_the_crd_schema(version, crd_schemas):
    import jsonschema  # pylint: disable=import-outside-toplevel
    out = llmisvc.render(params(llmisvc={"api_version": version, "parallelism": {"tensor": 2}, "prefill": {"replicas": 2}}))
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
    out = llmisvc.render(params(llmisvc={"prefill": {"replicas": 1}, "speculative_pools": ["decode", "prefill"]}))
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
        llmisvc.render(params(**over))
    assert err.value.field == field, str(err.value)
    assert "Fix:" in str(err.value)


def test_no_image_is_left_to_kserve_presets_with_a_warning():
    out = llmisvc.render(params(llmisvc={"image": None}))
    assert "image" not in main_container(out["manifest"])
    assert any("llmisvc.image is not set" in w for w in out["warnings"])


def test_draft_tp_one_or_target_tp_is_accepted():
    for tp in (1, 4):
        out = llmisvc.render(params(llmisvc={"parallelism": {"tensor": 4}}, speculative={"draft_tensor_parallel_size": tp}))
        assert out["speculative"].config["draft_tensor_parallel_size"] == tp


def test_modelcar_and_baseline_storage_forms():
    out = llmisvc.render(params(artifact_mode="modelcar", artifacts={"modelcar_image": "registry.local/models/llama-eagle3:v1"}))
    assert out["manifest"]["spec"]["model"]["uri"] == "oci://registry.local/models/llama-eagle3:v1"
    assert out["artifacts"].draft_path == "/mnt/models/draft"
    base = llmisvc.render(params(method="none", artifact_mode="auto", artifacts={"target_uri": "hf://meta/llama"}))
    assert base["manifest"]["spec"]["model"]["uri"] == "hf://meta/llama" and base["speculative"] is None
    assert vllm_command.find_speculative_config(main_container(base["manifest"])["command"]) is None


def test_strip_rendered_decode_pool_gives_the_baseline_command_byte_for_byte():
    for style in ("bash", "args"):
        out = llmisvc.render(params(command_style=style, llmisvc={"prefill": {"replicas": 1}}))
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
    for key in llmisvc.POOLS[pool]["path"]:
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
    ok = llmisvc.readiness(_status(2, 2, Ready="True", PresetsCombined="True", WorkloadsReady="True", RouterReady="True",
                                   MainWorkloadReady="True", PrefillWorkloadReady="True"))
    assert ok["ready"] and ok["up_to_date"] and ok["pools"] == {"MainWorkloadReady": "True", "PrefillWorkloadReady": "True"}
    stale = llmisvc.readiness(_status(3, 2, Ready="True"))
    assert stale["ready"] and not stale["up_to_date"]
    pending = llmisvc.readiness(_status(2, 2, Ready="False", WorkloadsReady="False", PrefillWorkloadReady="False"))
    assert not pending["ready"] and pending["pools"]["PrefillWorkloadReady"] == "False" and pending["failed"] is None
    broken = llmisvc.readiness(_status(2, 2, Ready="False", PresetsCombined="False"))
    assert broken["failed"].startswith("PresetsCombined=False")


def test_pod_selector_and_names_follow_kserve_labels():
    assert llmisvc.pod_selector("m", "decode") == ("app.kubernetes.io/component=llminferenceservice-workload,"
                                                   "app.kubernetes.io/name=m,app.kubernetes.io/part-of=llminferenceservice")
    assert llmisvc.deployment_name("m", "prefill") == "m-kserve-prefill" and llmisvc.deployment_name("m", "decode") == "m-kserve"
    with pytest.raises(ValidationError):
        llmisvc.check_resource_kind("Deployment")
    assert isvc.KIND in llmisvc.RESOURCE_KINDS


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
    from ansible_collections.alauda.spec_decoding.plugins.module_utils import k8s_pods
    logs = {"m-kserve-0": ENGINE_LINE, "m-kserve-1": "(EngineCore_DP1 pid=8) INFO loading weights\n"}
    monkeypatch.setattr(k8s_pods, "list_pods", lambda _api, _ns, selector: (
        [{"name": n} for n in sorted(logs)] if "llminferenceservice-workload," in selector else [], []))
    monkeypatch.setattr(k8s_pods, "stream_pod_log", lambda _api, _ns, pod, **_kw: iter([logs[pod].encode()]))
    return logs


def test_engine_line_from_data_parallel_rank_0_names_the_pod(fake_pods):
    report, problems = llmisvc.engine_report(None, _dp_obj(2))
    assert problems == [], problems
    decode = report["decode"]
    assert decode["engine_pod"] == "m-kserve-0" and decode["data_parallel"] == 2
    assert decode["speculative_config"] == {"method": "eagle3", "model": "/mnt/models/draft", "num_spec_tokens": 3}
    assert [p["found"] for p in decode["pods"]] == [True, False]
    # without data parallelism every pod must log the line
    _report, problems = llmisvc.engine_report(None, _dp_obj(1))
    assert problems == ["pool decode pod m-kserve-1: no engine-config line in container main"]
    # and a rank-0 line that contradicts the flag fails, naming the pod
    fake_pods["m-kserve-0"] = ENGINE_LINE.replace("num_spec_tokens=3", "num_spec_tokens=5")
    _report, problems = llmisvc.engine_report(None, _dp_obj(2))
    assert len(problems) == 1 and "pod m-kserve-0" in problems[0] and "5" in problems[0]


@pytest.mark.parametrize("method,mode,artifacts", [
    ("ngram", "pvc", {"pvc_name": "model-store"}),
    ("draft_model", "modelcar", {"modelcar_image": "registry.local/models/llama-draft:v1"}),
    ("none", "single", {"storage_uri": "s3://bucket/llama"}),
])
def test_every_deploy_playbook_method_renders_schema_valid(method, mode, artifacts):
    out = llmisvc.render(params(method=method, artifact_mode=mode, artifacts=artifacts, command_style="args"))
    assert schema_errors(out["manifest"], crds.resolve()) == []
    flag = vllm_command.find_speculative_config(main_container(out["manifest"])["command"], main_container(out["manifest"])["args"])
    assert (flag or {}).get("method") == (None if method == "none" else method)


class _Clock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_returns_only_when_ready_at_the_generation_and_the_pools_rolled_out(monkeypatch):
    """KServe marks a pool ready from its Deployment's Available condition (True on the old pods during a rolling
    update): the wait also waits for the rollout, and fails at once when a preset is missing."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils import isvc_wait
    ready = dict(_status(2, 2, Ready="True"), metadata={"name": "m", "namespace": "ns", "generation": 2, "resourceVersion": "5"})
    reads = [ready, ready, ready]
    rollout = ["pool decode: Deployment m-kserve rolling out (0 of 1 updated, 1 old, 1 available)", None]
    monkeypatch.setattr(isvc_wait._Kind, "get", lambda self, *_a: reads.pop(0))  # pylint: disable=protected-access
    monkeypatch.setattr(llmisvc, "rollout_pending", lambda _api, _obj: rollout.pop(0))
    clock = _Clock()
    obj, elapsed = isvc_wait.wait_ready(None, "ns", "m", timeout=60, interval=5, clock=clock, sleep=clock.sleep,
                                        kind="LLMInferenceService")
    assert obj is ready and rollout == [] and clock.sleeps == [1.0] and elapsed == 1.0

    broken = dict(_status(1, 1, Ready="False", PresetsCombined="False"), metadata={"name": "m", "generation": 1})
    monkeypatch.setattr(isvc_wait._Kind, "get", lambda self, *_a: broken)  # pylint: disable=protected-access
    monkeypatch.setattr(isvc_wait._Kind, "pods", lambda self, *_a: [])  # pylint: disable=protected-access
    with pytest.raises(isvc_wait.WaitTimeout) as err:
        isvc_wait.wait_ready(None, "ns", "m", timeout=600, clock=clock, sleep=clock.sleep, kind="LLMInferenceService")
    assert "cannot become Ready: PresetsCombined=False" in str(err.value) and clock.sleeps == [1.0]
