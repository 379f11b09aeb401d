"""The runtime check a deploy makes at render time: kserve_facts records the runtime reads (RecordingReader), the render
answers the same lookups from that snapshot (SnapshotReader) and refuses a second --speculative-config before anything is
written. The cluster side (kserve_facts against a real API server) is in tests/integration/test_kserve_facts.py."""
import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime_readers
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.unit.plugins.module_utils.test_isvc import P
from tests.unit.plugins.module_utils.test_serving_runtime import VLLM, Reader, runtime

NGRAM = '{"method":"ngram","num_speculative_tokens":2}'


def snapshot(namespaced=(), cluster=(), runtime_name="aml-vllm-0.32.0", namespace="models"):
    """What kserve_facts hands the render: the reads of resolving `runtime_name` in `namespace`, as plain data."""
    data = runtime_readers.record_runtime_reads(Reader(namespaced, cluster), namespace, runtime_name)
    return json.loads(json.dumps(data))  # through JSON, as it travels through Ansible facts


def test_snapshot_holds_exactly_the_reads_of_the_named_runtime():
    rt = runtime("aml-vllm-0.32.0", args=["--port=8080"], command=VLLM, namespace=None)
    snap = snapshot(cluster=[rt])
    # namespaced first (absent), then cluster-scoped: both lookups recorded, nothing listed
    assert snap["get"] == {"ServingRuntime/models/aml-vllm-0.32.0": None, "ClusterServingRuntime/aml-vllm-0.32.0": rt}
    assert snap["list"] == {} and snap["forbidden"] == []


def test_render_refuses_a_flag_the_runtime_also_carries():
    rt = runtime("aml-vllm-0.32.0", args=["--port=8080", "--speculative-config", NGRAM], command=VLLM, namespace="models")
    params = dict(P, runtimes=snapshot(namespaced=[rt]), command_style="args")
    with pytest.raises(ValidationError) as err:
        isvc.render(params)
    msg = str(err.value)
    assert msg.startswith("runtime_flag: InferenceService models/llama-eagle3: --speculative-config would appear twice")
    assert "ServingRuntime aml-vllm-0.32.0" in msg and "spec_decoding_runtime_flag: replace" in msg and "Fix:" in msg


def test_replace_lets_the_inference_service_win_with_a_warning():
    rt = runtime("aml-vllm-0.32.0", args=["--port=8080", "--speculative-config", NGRAM], command=VLLM, namespace="models")
    rendered = isvc.render(dict(P, runtimes=snapshot(namespaced=[rt]), runtime_flag="replace", command_style="args"))
    check = rendered["runtime_check"]
    # the runtime's args come first, the InferenceService's last: vLLM takes the eagle3 config of the service
    assert check["sources"] == ["serving_runtime", "inference_service"] and check["source"] == "inference_service"
    assert check["speculative_config"]["method"] == "eagle3"
    assert any("ServingRuntime aml-vllm-0.32.0 also sets --speculative-config" in w for w in rendered["warnings"])
    assert "runtime_object" not in check


def test_clean_runtime_passes_and_names_the_source():
    rt = runtime("aml-vllm-0.32.0", args=["--port=8080"], command=VLLM, namespace=None)
    check = isvc.render(dict(P, runtimes=snapshot(cluster=[rt]), command_style="args"))["runtime_check"]
    assert check["source"] == "inference_service" and check["runtime"]["kind"] == "ClusterServingRuntime"


def test_missing_runtime_warns_and_a_snapshot_of_another_runtime_is_an_error():
    rendered = isvc.render(dict(P, runtimes=snapshot()))
    assert rendered["runtime_check"]["runtime"] is None
    assert any("No ServingRuntimes or ClusterServingRuntimes with the name: aml-vllm-0.32.0" in w for w in rendered["warnings"])
    with pytest.raises(ValidationError) as err:
        isvc.render(dict(P, runtime="other", runtimes=snapshot()))
    assert str(err.value).startswith("runtimes: the runtimes read from the cluster do not cover ServingRuntime/models/other")


def test_without_runtimes_there_is_no_check():
    assert isvc.render(dict(P))["runtime_check"] is None


def test_a_runtime_kserve_refuses_for_the_model_format_or_protocol_is_refused_by_the_render():
    """KServe's reconcileModel refuses a named runtime that does not list the predictor's modelFormat (or its
    protocolVersion): the render says so with KServe's words and names the option that set the field."""
    rt = runtime("aml-vllm-0.32.0", args=["--port=8080"], command=VLLM, namespace="models", formats=[{"name": "vLLM", "autoSelect": True}])
    with pytest.raises(ValidationError) as err:
        isvc.render(dict(P, runtimes=snapshot(namespaced=[rt]), command_style="args"))
    msg = str(err.value)
    assert err.value.field == "model_format"
    assert "specified runtime aml-vllm-0.32.0 does not support specified framework/version" in msg
    assert "the ServingRuntime aml-vllm-0.32.0 supports the model formats vLLM" in msg
    assert "spec.predictor.model.modelFormat (model_format, role variable spec_decoding_model_format)" in msg
    assert msg.endswith("Nothing was written")
    # the same runtime with the predictor's format listed renders; a protocol it does not list does not
    assert isvc.render(dict(P, runtimes=snapshot(namespaced=[rt]), command_style="args", model_format="vLLM"))["runtime_check"]
    v1 = runtime("aml-vllm-0.32.0", args=["--port=8080"], command=VLLM, namespace="models", protocolVersions=["v1"])
    with pytest.raises(ValidationError) as err:
        isvc.render(dict(P, runtimes=snapshot(namespaced=[v1]), command_style="args"))
    assert err.value.field == "protocol_version" and "does not support specified protocol version" in str(err.value)
