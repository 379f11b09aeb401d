"""serving_runtime: KServe's runtime selection and container merge, and where the speculative flag comes from.

Merge cases are KServe's own (kserve/kserve, v0.20 line):
- pkg/controller/v1beta1/inferenceservice/utils/utils_test.go TestMergeRuntimeContainers "BasicMerge";
- same file, TestReplacePlaceholders "ReplaceArgsAndEnvPlaceholders";
- same file, TestGetServingRuntime ("NamespaceServingRuntime", "ClusterServingRuntime", "InvalidServingRuntime");
- pkg/controller/v1beta1/inferenceservice/controller_test.go, "When transformer container is present in both serving
  runtime and inference service" (runtime command + args kept when the predictor sets neither; runtime args
  ``--model_name={{.Name}}`` then the InferenceService's ``--http-port 8060`` under the InferenceService's command);
- pkg/apis/serving/v1beta1/predictor_model.go GetSupportingRuntimes (namespaced before cluster, autoSelect, priority).
"""
from __future__ import annotations

import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime as sr
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

NGRAM = {"method": "ngram", "num_speculative_tokens": 5}
EAGLE = {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
VLLM = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
# The predictors here say vLLM; the render says transformers (its model_format default): KServe refuses a named runtime
# that lists neither.
FORMATS = [{"name": "vLLM", "autoSelect": True}, {"name": "transformers", "autoSelect": True}]


class Reader:
    def __init__(self, namespaced=(), cluster=()):
        self.items = {sr.SERVING_RUNTIME: list(namespaced), sr.CLUSTER_SERVING_RUNTIME: list(cluster)}

    def get(self, kind, namespace, name):
        for rt in self.items[kind]:
            if rt["metadata"]["name"] == name and (kind == sr.CLUSTER_SERVING_RUNTIME or rt["metadata"].get("namespace") == namespace):
                return rt
        return None

    def list(self, kind, namespace):
        return [rt for rt in self.items[kind] if kind == sr.CLUSTER_SERVING_RUNTIME or rt["metadata"].get("namespace") == namespace]


def runtime(name, args=None, command=None, namespace="ns", formats=None, created="2026-01-01T00:00:00Z", **spec):
    container = {"name": "kserve-container", "image": "vllm/vllm-openai:v0.11.2"}
    if command is not None:
        container["command"] = command
    if args is not None:
        container["args"] = args
    meta = {"name": name, "creationTimestamp": created}
    if namespace:
        meta["namespace"] = namespace
    body = {"metadata": meta, "spec": dict({"containers": [container],
                                            "supportedModelFormats": formats or FORMATS}, **spec)}
    return body


def isvc(runtime_name="vllm-runtime", command=None, args=None, fmt="vLLM", name="llama", **model):
    m = dict({"modelFormat": {"name": fmt}}, **model)
    if runtime_name:
        m["runtime"] = runtime_name
    if command is not None:
        m["command"] = command
    if args is not None:
        m["args"] = args
    return {"metadata": {"name": name, "namespace": "ns", "labels": {"modelDir": "/mnt/models"}},
            "spec": {"predictor": {"model": m}}}


# -- KServe's merge ------------------------------------------------------------------------------

def test_basic_merge_from_kserve_utils_test():
    base = {"name": "kserve-container", "image": "default-image", "args": ["--foo=bar", "--test=dummy"],
            "env": [{"name": "PORT", "value": "8080"}, {"name": "PORT2", "value": "8081"}],
            "resources": {"limits": {"cpu": "1", "memory": "2Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}}}
    override = {"args": ["--new-arg=baz"], "env": [{"name": "PORT2", "value": "8082"}, {"name": "Some", "value": "Var"}],
                "resources": {"limits": {"cpu": "2", "memory": "4Gi"}}}
    assert sr.merge_runtime_container(base, override) == {
        "name": "kserve-container", "image": "default-image", "args": ["--foo=bar", "--test=dummy", "--new-arg=baz"],
        "env": [{"name": "PORT", "value": "8080"}, {"name": "PORT2", "value": "8082"}, {"name": "Some", "value": "Var"}],
        "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}}}


def test_replace_placeholders_from_kserve_utils_test():
    container = {"name": "kserve-container", "image": "default-image", "args": ["--foo={{.Name}}", "--test=dummy", "--new-arg=baz"],
                 "env": [{"name": "PORT", "value": "8080"}, {"name": "MODELS_DIR", "value": "{{.Labels.modelDir}}"}]}
    out = sr.replace_placeholders(container, {"name": "bar", "labels": {"modelDir": "/mnt/models"}})
    assert out["args"] == ["--foo=bar", "--test=dummy", "--new-arg=baz"]
    assert out["env"][1] == {"name": "MODELS_DIR", "value": "/mnt/models"}


def test_controller_test_runtime_command_kept_and_args_concatenated():
    # tf-serving-collocation: predictor sets neither command nor args -> the runtime's, unchanged
    tf = {"name": "kserve-container", "image": "tensorflow/serving:1.14.0", "command": ["/usr/bin/tensorflow_model_server"],
          "args": ["--port=9000", "--rest_api_port=8080", "--model_base_path=/mnt/models", "--rest_api_timeout_in_ms=60000"]}
    merged = sr.merge_runtime_container(tf, {})
    assert merged["command"] == tf["command"] and merged["args"] == tf["args"]
    # transformer: the InferenceService's command replaces, its args come after the runtime's (placeholders resolved)
    rt = {"name": "transformer-container", "image": "transformer:v1", "args": ["--model_name={{.Name}}"]}
    own = {"name": "transformer-container", "image": "transformer:v1", "command": ["transformer"], "args": ["--http-port", "8060"]}
    merged = sr.replace_placeholders(sr.merge_runtime_container(rt, own), {"name": "isvc-with-collocated-transformer-runtime"})
    assert merged["command"] == ["transformer"]
    assert merged["args"] == ["--model_name=isvc-with-collocated-transformer-runtime", "--http-port", "8060"]


def test_empty_fields_never_override_and_env_value_conflict():
    base = {"name": "kserve-container", "command": ["vllm", "serve"], "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    merged = sr.merge_runtime_container(base, {"command": [], "image": "", "env": [{"name": "A", "value": "x"}]})
    assert merged["command"] == ["vllm", "serve"]
    assert merged["env"] == [{"name": "A", "value": "x"}]


# -- runtime selection (GetServingRuntime / GetSupportingRuntimes) -----------------------------

def test_named_runtime_namespaced_first_then_cluster_then_error():
    ns_rt, cl_rt = runtime("tf-runtime"), runtime("sklearn-runtime", namespace=None)
    reader = Reader([ns_rt, runtime("other", namespace="elsewhere")], [cl_rt, runtime("tf-runtime", namespace=None)])
    assert sr.select_runtime(isvc("tf-runtime"), reader) == (ns_rt, sr.SERVING_RUNTIME)
    assert sr.select_runtime(isvc("sklearn-runtime"), reader) == (cl_rt, sr.CLUSTER_SERVING_RUNTIME)
    with pytest.raises(ValidationError, match="No ServingRuntimes or ClusterServingRuntimes with the name: foo"):
        sr.select_runtime(isvc("foo"), reader)
    with pytest.raises(ValidationError, match="disabled"):
        sr.select_runtime(isvc("off"), Reader([runtime("off", disabled=True)]))


def test_auto_select_order():
    low = runtime("low", formats=[{"name": "vLLM", "autoSelect": True, "priority": 1}])
    high = runtime("high", formats=[{"name": "vLLM", "autoSelect": True, "priority": 2}])
    manual = runtime("manual", formats=[{"name": "vLLM", "autoSelect": False, "priority": 9}])
    cluster = runtime("cluster", namespace=None, formats=[{"name": "vLLM", "autoSelect": True, "priority": 99}])
    reader = Reader([low, high, manual], [cluster])
    assert sr.select_runtime(isvc(None), reader)[0] is high  # namespaced before cluster, then priority
    assert sr.select_runtime(isvc(None), Reader([manual], [cluster])) == (cluster, sr.CLUSTER_SERVING_RUNTIME)
    old, new = runtime("a-old", created="2025-01-01T00:00:00Z"), runtime("b-new", created="2026-06-01T00:00:00Z")
    assert sr.select_runtime(isvc(None), Reader([old, new]))[0] is new  # no priority: newest first
    v2only = runtime("v2", protocolVersions=["v2"])
    assert sr.select_runtime(isvc(None), Reader([v2only, old]))[0] is old  # protocol v1 by default
    with pytest.raises(ValidationError, match="no runtime found"):
        sr.select_runtime(isvc(None, fmt="sklearn"), reader)


def test_runtime_without_kserve_container():
    rt = runtime("x")
    rt["spec"]["containers"][0]["name"] = "main"
    with pytest.raises(ValidationError, match="failed to find kserve-container"):
        sr.effective_command(isvc("x"), Reader([rt]))


# -- where the flag comes from --------------------------------------------------------------

RT_ARGS = ["--port=8080", "--model=/mnt/models", "--served-model-name={{.Name}}"]


def test_flag_in_runtime_only():
    rt = runtime("vllm-runtime", args=RT_ARGS + ["--speculative-config", json.dumps(NGRAM)], command=VLLM)
    eff = sr.effective_command(isvc(), Reader([rt]))
    assert eff.container["args"][2] == "--served-model-name=llama"
    assert eff.sources() == [sr.SOURCE_SR] and eff.source() == sr.SOURCE_SR and eff.config() == NGRAM
    error, _w = sr.runtime_flag_problem(eff, "replace")
    assert "ServingRuntime vllm-runtime" in error and "does not ask for it" in error


def test_flag_in_service_only_cluster_runtime():
    rt = runtime("vllm-runtime", namespace=None, args=RT_ARGS, command=VLLM)
    eff = sr.effective_command(isvc(args=["--speculative-config", json.dumps(EAGLE)]), Reader([], [rt]))
    assert eff.container["command"] == VLLM
    assert eff.container["args"] == ["--port=8080", "--model=/mnt/models", "--served-model-name=llama", "--speculative-config", json.dumps(EAGLE)]
    assert eff.sources() == [sr.SOURCE_ISVC] and eff.config() == EAGLE
    assert sr.runtime_flag_problem(eff, "refuse") == (None, [])


def test_flag_in_both_last_wins_and_policy():
    rt = runtime("vllm-runtime", namespace=None, args=RT_ARGS + ["--speculative-config=" + json.dumps(NGRAM)], command=VLLM)
    eff = sr.effective_command(isvc(args=["--speculative-config", json.dumps(EAGLE)]), Reader([], [rt]))
    assert eff.sources() == [sr.SOURCE_CSR, sr.SOURCE_ISVC]
    assert eff.source() == sr.SOURCE_ISVC and eff.config() == EAGLE  # vLLM keeps the last
    error, _w = sr.runtime_flag_problem(eff, "refuse")
    assert "appear twice" in error and "ClusterServingRuntime vllm-runtime" in error
    error, warnings = sr.runtime_flag_problem(eff, "replace")
    assert error is None and "vLLM takes it" in warnings[0]
    with pytest.raises(ValidationError, match="runtime_flag"):
        sr.runtime_flag_problem(eff, "merge")


def test_flag_in_runtime_command_replaced_by_isvc_command():
    rt = runtime("vllm-runtime", command=VLLM + ["--speculative-config", json.dumps(NGRAM)], args=RT_ARGS)
    eff = sr.effective_command(isvc(command=VLLM), Reader([rt]))
    assert eff.container["command"] == VLLM and eff.sources() == []
    eff = sr.effective_command(isvc(), Reader([rt]))
    assert eff.command_from == sr.SOURCE_SR and eff.sources() == [sr.SOURCE_SR]


def test_bash_script_command_drops_runtime_args_unless_it_passes_them():
    rt = runtime("vllm-runtime", args=["--speculative-config", json.dumps(NGRAM)])
    script = "exec python3 -m vllm.entrypoints.openai.api_server --port 8080\n"
    eff = sr.effective_command(isvc(command=["bash", "-c", script]), Reader([rt]))
    assert eff.sources() == [] and eff.config() is None and len(eff.ignored()) == 1
    assert "ignored" in sr.runtime_flag_problem(eff)[1][0]
    eff = sr.effective_command(isvc(command=["bash", "-c", script.rstrip() + ' "$@"\n', "bash"]), Reader([rt]))
    assert eff.sources() == [sr.SOURCE_SR]


def test_custom_predictor_has_no_runtime():
    body = {"metadata": {"name": "c", "namespace": "ns"},
            "spec": {"predictor": {"containers": [{"name": "kserve-container", "command": VLLM, "args": ["--speculative-config", json.dumps(NGRAM)]}]}}}
    eff = sr.effective_command(body, Reader())
    assert eff.runtime is None and eff.source() == sr.SOURCE_ISVC and eff.as_dict()["runtime"] is None


def test_flag_locations_name_the_runtime_or_the_containers():
    rt = runtime("vllm-runtime", namespace=None, args=RT_ARGS + ["--speculative-config=" + json.dumps(NGRAM)], command=VLLM)
    both = isvc(args=["--speculative-config", json.dumps(EAGLE)])
    assert sr.flag_locations(both, sr.effective_command(both, Reader([], [rt]))) == (
        ["ClusterServingRuntime vllm-runtime", "kserve-container"], sr.SOURCE_ISVC)
    plain = runtime("vllm-runtime", namespace=None, args=RT_ARGS, command=VLLM)
    assert sr.flag_locations(isvc(), sr.effective_command(isvc(), Reader([], [plain]))) == ([], None)
    # no runtime (custom predictor, or one that could not be read): every container whose argv carries the flag, any form
    script = "exec vllm serve /mnt/models --speculative-config '%s'\n" % json.dumps(NGRAM)
    custom = {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"predictor": {"containers": [
        {"name": "kserve-container", "command": ["bash", "-c", script]}, {"name": "sidecar", "command": ["sleep", "inf"]}]}}}
    assert sr.flag_locations(custom) == (["kserve-container"], sr.SOURCE_ISVC)
    unread = isvc(args=["--speculative-config=" + json.dumps(EAGLE)])
    assert sr.flag_locations(unread, None) == (["kserve-container"], sr.SOURCE_ISVC)
    assert sr.flag_locations(isvc(args=["--seed", "0"])) == ([], None)


# -- rollback fixes ---------------------------------------------------------------------------

def test_runtime_strip_patch_and_copy():
    rt = runtime("vllm-runtime", args=RT_ARGS + ["--speculative-config", json.dumps(NGRAM)], command=VLLM)
    rt["metadata"]["annotations"] = {"opendatahub.io/recommended-accelerators": "[\"nvidia.com/gpu\"]"}
    eff = sr.effective_command(isvc(), Reader([rt]))
    ops = sr.runtime_strip_patch(rt, eff.runtime_index)
    assert ops == [{"op": "test", "path": "/spec/containers/0/args", "value": rt["spec"]["containers"][0]["args"]},
                   {"op": "replace", "path": "/spec/containers/0/args", "value": RT_ARGS}]
    body = sr.render_runtime_copy(eff)
    assert body["kind"] == "ServingRuntime" and body["metadata"]["name"] == "llama-vllm-runtime-nospec"
    assert body["spec"]["containers"][0]["args"] == RT_ARGS and body["spec"]["containers"][0]["command"] == VLLM
    assert body["spec"]["supportedModelFormats"] == [dict(f, autoSelect=False) for f in FORMATS]
    assert rt["spec"]["containers"][0]["args"][-2] == "--speculative-config"  # the original is untouched
    copy_isvc = isvc(body["metadata"]["name"])
    assert sr.effective_command(copy_isvc, Reader([rt, body])).config() is None
    assert len(sr.copy_name("a" * 40, "b" * 40)) == 63


def test_users_of_runtime():
    a = isvc("shared", name="a")
    b = isvc(None, name="b")
    b["status"] = {"clusterServingRuntimeName": "shared"}
    c = isvc("shared", name="c")
    c["metadata"]["namespace"] = "other"
    assert sr.users_of_runtime(sr.SERVING_RUNTIME, "shared", "ns", [a, b, c]) == ["ns/a"]
    assert sr.users_of_runtime(sr.CLUSTER_SERVING_RUNTIME, "shared", None, [a, b, c], {"ns": {"shared"}}) == ["ns/b", "other/c"]
    eff = sr.effective_command(a, Reader([runtime("shared", args=["--speculative-config", json.dumps(NGRAM)])]))
    msg = sr.rollback_refusal(eff, ["ns/a", "ns/z"])
    assert "ServingRuntime shared" in msg and "ns/a, ns/z" in msg and "spec_decoding_rollback_edit_runtime" in msg \
        and "a-shared-nospec" in msg


def test_client_reader_reads_404_and_403_as_nothing():
    pytest.importorskip("kubernetes")

    class Exc(Exception):
        def __init__(self, status):
            super().__init__("HTTP %d" % status)
            self.status = status

    class Api:
        def get_namespaced_custom_object(self, *args):
            raise Exc(404)

        def get_cluster_custom_object(self, *args):
            raise Exc(403)

        def list_namespaced_custom_object(self, *args):
            return {"items": [runtime("x")]}

        def list_cluster_custom_object(self, *args):
            raise Exc(500)

    reader = runtime_readers.ClientReader(None)
    reader.api = Api()
    assert reader.get(sr.SERVING_RUNTIME, "ns", "x") is None
    assert reader.get(sr.CLUSTER_SERVING_RUNTIME, None, "x") is None and reader.forbidden == [sr.CLUSTER_SERVING_RUNTIME]
    assert [r["metadata"]["name"] for r in reader.list(sr.SERVING_RUNTIME, "ns")] == ["x"]
    with pytest.raises(sr.SpecDecodingError, match="reading ClusterServingRuntimes failed"):
        reader.list(sr.CLUSTER_SERVING_RUNTIME, None)


def test_client_reader_reads_each_runtime_once():
    """The rollback resolves the merged command before and after its strip through one reader: one GET, one snapshot."""
    calls = []

    class Api:
        def get_namespaced_custom_object(self, *args):
            calls.append(args)
            return runtime(args[-1], command=VLLM)

        def list_namespaced_custom_object(self, *args):
            calls.append(args)
            return {"items": [runtime("x")]}

    reader = runtime_readers.ClientReader(None)
    reader.api = Api()
    first = sr.effective_command(isvc(), reader)
    again = sr.effective_command(isvc(), reader)
    assert first.runtime is again.runtime and first.runtime_name == "vllm-runtime"
    assert reader.list(sr.SERVING_RUNTIME, "ns") == reader.list(sr.SERVING_RUNTIME, "ns")
    assert len(calls) == len(set(calls)) == 2, calls  # the runtime's GET and the list, each once


def test_unreadable_flag_value_is_reported_not_raised():
    rt = runtime("vllm-runtime", command=VLLM, args=["--speculative-config", "$SPEC"])
    out = sr.effective_command(isvc(), Reader([rt])).as_dict()
    # argv: no shell, vLLM gets the text "$SPEC" itself
    assert out["speculative_config"] is None and "not JSON" in out["speculative_config_error"]
    assert out["source"] == sr.SOURCE_SR and out["runtime"] == {"kind": "ServingRuntime", "name": "vllm-runtime"}


def test_legacy_flag_in_shared_runtime_is_located_and_refused_by_name():
    # KServe huggingfaceserver README shape: the runtime's args carry vLLM's pre-0.10 flags (underscore spelling)
    a = isvc("shared", name="a")
    eff = sr.effective_command(a, Reader([runtime("shared", args=["--speculative_model=/mnt/models/draft", "--num_speculative_tokens", "5"])]))
    where, source = sr.flag_locations(a, eff)
    assert where == ["ServingRuntime shared"] and source == eff.runtime_source
    msg = sr.rollback_refusal(eff, ["ns/a"])
    assert "gets --speculative-model, --num-speculative-tokens from the ServingRuntime shared" in msg and "Nothing was changed" in msg
    assert eff.as_dict()["speculative_config_error"] and "legacy" in eff.as_dict()["speculative_config_error"]


# -- the rollback's second look: the stripped predictor merged into the runtime already read -----------------------------

@pytest.mark.parametrize("rt_command", [None, [], VLLM + ["--model={{.Name}}"]], ids=["no runtime command", "empty", "runtime command"])
@pytest.mark.parametrize("own", [
    {}, {"args": []}, {"args": ["--speculative-config", json.dumps(EAGLE), "--x={{.Labels.modelDir}}"]},
    {"command": ["bash", "-c", 'exec vllm serve "$@" --name {{.Name}}', "bash"]}, {"command": [], "args": ["--port", "1"]},
], ids=["none", "empty args", "args", "script command", "empty command"])
def test_with_own_is_the_merge_of_the_edited_predictor_into_the_same_runtime(rt_command, own):
    """Effective.with_own (what the rollback asks after its strip) gives what selecting and merging the edited object from
    the start gives, for every shape of runtime and predictor command/args KServe's merge treats differently."""
    rt = runtime("vllm-runtime", args=["--speculative-config", json.dumps(NGRAM), "--served-model-name={{.Name}}"], command=rt_command)
    rt["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    before = isvc(args=["--speculative-config", json.dumps(EAGLE)], env=[{"name": "A", "value": "2"}])
    edited = isvc(env=[{"name": "A", "value": "2"}], **own)
    reader = Reader([rt])
    derived = sr.effective_command(before, reader).with_own(edited)
    fresh = sr.effective_command(edited, Reader([rt]))
    assert derived.container == fresh.container and derived.container["env"] == [{"name": "A", "value": "2"}]
    assert (derived.command_from, derived.runtime_args_count, derived.args_reach, derived.sources()) == (
        fresh.command_from, fresh.runtime_args_count, fresh.args_reach, fresh.sources())
    assert derived.container["args"][1] == json.dumps(NGRAM) and "--served-model-name=llama" in derived.container["args"]


def test_rollback_runtime_reads_the_runtime_once_and_plans_the_fix():
    rt = runtime("vllm-runtime", args=["--speculative-config", json.dumps(NGRAM)])
    reads = []

    class Counting(Reader):
        def get(self, kind, namespace, name):
            reads.append(("get", kind, name))
            return super().get(kind, namespace, name)

        def users(self, effective):
            reads.append(("users", effective.runtime_name))
            return ["ns/llama"]

    own = isvc(args=["--speculative-config", json.dumps(EAGLE)])
    stripped = isvc()
    found = sr.rollback_runtime(own, stripped, Counting([rt]), fix="edit")
    assert reads == [("get", sr.SERVING_RUNTIME, "vllm-runtime"), ("users", "vllm-runtime")]
    assert found["runtime"] == {"kind": sr.SERVING_RUNTIME, "name": "vllm-runtime", "source": "inference_service", "fix": "edit"}
    assert found["users"] == ["ns/llama"] and found["previous_config"] == EAGLE
    assert found["fix"]["ops"] == sr.runtime_strip_patch(rt, 0)
    with pytest.raises(ValidationError) as refused:
        sr.rollback_runtime(own, stripped, Counting([rt]))
    assert "runtime_copy" in str(refused.value) and "edit_runtime" in str(refused.value)
    # a runtime without the flag: nothing to fix, nobody listed
    assert sr.rollback_runtime(own, stripped, Reader([runtime("vllm-runtime")]))["users"] is None
