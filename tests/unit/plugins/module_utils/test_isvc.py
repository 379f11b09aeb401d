"""InferenceService rendering and KServe's rules (pure functions; the real-CRD checks are in tests/integration)."""
import os
import shlex
import subprocess

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import releases, storage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.testbed import crds


def isvc_crd_path():
    """The real InferenceService CRD, found as the test bed finds it (tests/testbed/crds.py); none fails the test."""
    try:
        return os.path.join(crds.resolve(), "serving.kserve.io_inferenceservices.yaml")
    except crds.CrdsNotFound as exc:
        message = str(exc)
    return pytest.fail(message, pytrace=False)


P = dict(name="llama-eagle3", namespace="models", method="eagle3", artifact_mode="pvc",
         artifacts={"pvc_name": "store"}, runtime="aml-vllm-0.32.0", vllm_version="0.32.0", kserve_version="0.20.0",
         dtype="bfloat16", gpu_memory_utilization=0.9, max_model_len=8192, max_num_seqs=64, seed=42)


def render(existing=None, **over):
    return isvc.render(dict(P, **over), existing=existing)


def test_bash_script_is_valid_shell_and_carries_each_flag_once(tmp_path):
    script = render()["manifest"]["spec"]["predictor"]["model"]["command"][2]
    path = tmp_path / "s.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    words = shlex.split(script.replace("\\\n", " "))
    assert words.count("--speculative-config") == 1 and words.count("--model") == 1
    assert words[words.index("--speculative-config") + 1] == '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'


def test_args_style_renders_an_argv_list():
    model = render(command_style="args")["manifest"]["spec"]["predictor"]["model"]
    assert model["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert model["args"][model["args"].index("--model") + 1] == "/mnt/models/target"
    assert model["args"][-2:] == ["--speculative-config", '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}']


def test_baseline_is_identical_but_for_the_flag_and_headroom():
    base = render(method="none")["manifest"]
    eagle = render(gpu_memory_utilization=0.9, draft_memory_headroom=0)["manifest"]
    assert "--speculative-config" not in base["spec"]["predictor"]["model"]["command"][2]
    # the speculative side also carries --per-request-spec-decode-metrics (per_request_metrics auto), right before the flag
    assert eagle["spec"]["predictor"]["model"]["command"][2].split(" \\\n  --per-request-spec-decode-metrics summary \\\n  --speculative-config")[0] \
        + "\n" == base["spec"]["predictor"]["model"]["command"][2]


def test_knative_mode_sets_progress_deadline_standard_sets_startup_probe():
    kn = render(deployment_mode="Serverless", startup_timeout_seconds=900)["manifest"]
    assert kn["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Knative"
    assert kn["metadata"]["annotations"]["serving.knative.dev/progress-deadline"] == "900s"
    std = render()["manifest"]
    assert "serving.knative.dev/progress-deadline" not in std["metadata"]["annotations"]
    probe = std["spec"]["predictor"]["model"]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 300


def test_kserve_version_detection_from_the_real_crd():
    with open(isvc_crd_path()) as handle:
        crd = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version, evidence = releases.kserve_version_from_crd(crd)
    assert version == (0, 20, 0) and "canary" in evidence
    predictor = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    del predictor["canary"]
    assert releases.kserve_version_from_crd(crd)[0] == (0, 16, 0)
    del predictor["predictor"]["properties"]["storageUris"]
    assert releases.kserve_version_from_crd(crd)[0] == (0, 15, 0)


def test_auto_mode_explains_its_choice():
    art = {"target_uri": "hf://a/t", "draft_uri": "hf://a/d", "modelcar_image": "r/x:1", "pvc_name": "p"}
    assert isvc.choose_artifact_mode(art, True, (0, 20, 0))[0] == "storage_uris"
    mode, why = isvc.choose_artifact_mode(art, True, (0, 15, 0))
    assert mode == "modelcar"
    mode, why = isvc.choose_artifact_mode(art, True, (0, 15, 0), oci_mode="disabled")
    assert mode == "pvc" and "every KServe" in why
    # an oci+native:// image is mounted as an ImageVolume whatever the cluster's mode
    native = dict(art, modelcar_image="oci+native://registry.local/m/x:1")
    assert isvc.choose_artifact_mode(native, True, (0, 15, 0), oci_mode="disabled")[0] == "modelcar"
    assert isvc.choose_artifact_mode({}, False, (0, 15, 0))[0] == "single"


@pytest.mark.parametrize("entries,version,field", [
    ([{"uri": "oci://r/t:1", "mountPath": "/mnt/a/t"}, {"uri": "oci://r/d:1", "mountPath": "/mnt/b/d"}], (0, 19, 0), "storage_uris"),
    ([{"uri": "oci://r/t:1", "mountPath": "/mnt/a/t"}], (0, 18, 0), "storage_uris[0].uri"),
    ([{"uri": "hf://a", "mountPath": "/mnt/a"}], (0, 15, 0), "storage_uris"),
    ([{"uri": "pvc://a/x", "mountPath": "/mnt/a"}, {"uri": "pvc://b/y", "mountPath": "/mnt/a"}], (0, 20, 0), "storage_uris[1].mountPath"),
    ([{"uri": "ftp://a", "mountPath": "/mnt/a"}], (0, 20, 0), "storage_uris[0].uri"),
])
def test_storage_uris_rules(entries, version, field):
    with pytest.raises(ValidationError) as info:
        storage.check_storage_uris(entries, version)
    assert str(info.value).startswith(field + ":"), str(info.value)


def test_pvc_paths_need_no_common_parent():
    storage.check_storage_uris([{"uri": "pvc://a/x", "mountPath": "/a"}, {"uri": "pvc://b/y", "mountPath": "/b"}], (0, 20, 0))


@pytest.mark.parametrize("over,field", [
    ({"name": "x" * 64}, "name"),
    ({"namespace": "Models"}, "namespace"),
    ({"deployment_mode": "Raw"}, "deployment_mode"),
    ({"method": "lookahead"}, "method"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"draft_memory_headroom": 0.95}, "draft_memory_headroom"),
    ({"max_model_len": 0}, "max_model_len"),
    ({"min_replicas": 3, "max_replicas": 1}, "min_replicas"),
    ({"artifacts": {"pvc_name": "store", "draft_subdir": "../x"}}, "artifacts.draft_subdir"),
    ({"artifact_mode": "modelcar", "artifacts": {}}, "artifacts.modelcar_image"),
    ({"artifacts": {"pvc_name": "Store_1"}}, "artifacts.pvc_name"),
    ({"speculative": {"model": "/mnt/models/other"}}, "speculative.model"),
    ({"speculative": {"method": "ngram"}}, "speculative.method"),
    ({"method": "none", "speculative": {"num_speculative_tokens": 3}}, "speculative"),
    ({"extra_args": ["--num-speculative-tokens", "3"]}, "extra_args"),
    ({"method": "draft_model", "vllm_version": "0.11.0"}, "speculative.method"),
])
def test_bad_render_input_names_the_field(over, field):
    with pytest.raises(ValidationError) as info:
        render(**over)
    assert str(info.value).startswith(field + ":") and "Fix:" in str(info.value), str(info.value)


def test_deployment_mode_change_refused_and_legacy_equal():
    existing = {"metadata": {"annotations": {"serving.kserve.io/deploymentMode": "RawDeployment"}}}
    render(existing=existing)  # Standard == RawDeployment
    with pytest.raises(ValidationError, match="^deployment_mode: .*Standard mode"):
        render(existing=existing, deployment_mode="Knative")


def test_yaml_is_deterministic_and_kustomization_sorted():
    manifest = render()["manifest"]
    assert isvc.to_yaml(manifest) == isvc.to_yaml(yaml.safe_load(isvc.to_yaml(manifest)))
    assert isvc.kustomization(["b.yaml", "a.yaml", "b.yaml"]).endswith("resources:\n- a.yaml\n- b.yaml\n")


def test_custom_class_renders_the_proposers_import_path_where_vllm_has_the_method():
    # vLLM 0.22-0.33 load a proposer class by import path (vllm/config/speculative.py): no draft weights to mount, the
    # model is the class; the release tables refuse it elsewhere, with what to write instead.
    known = {"model": "known_curve_proposer.KnownCurveProposer", "num_speculative_tokens": 3}
    out = render(method="custom_class", speculative=known)
    args = shlex.split(out["manifest"]["spec"]["predictor"]["model"]["command"][2].replace("\\\n", " "))
    assert args[args.index("--speculative-config") + 1] == \
        '{"method":"custom_class","model":"known_curve_proposer.KnownCurveProposer","num_speculative_tokens":3}'
    assert out["artifacts"].draft_path is None and "storageUris" not in out["manifest"]["spec"]["predictor"]
    with pytest.raises(ValidationError, match="needs 'model'") as caught:
        render(method="custom_class", speculative={"num_speculative_tokens": 3})
    assert caught.value.field == "speculative.model"
    with pytest.raises(ValidationError, match="removed in vLLM 0.34") as caught:
        render(method="custom_class", speculative=known, vllm_version="0.34.0")
    assert caught.value.field == "speculative.method"
