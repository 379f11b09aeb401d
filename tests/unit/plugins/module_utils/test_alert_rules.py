"""The PrometheusRule builder (ops/alert_rules.py): names, labels, selectors, expressions, thresholds and refusals.

What the expressions compute on vLLM's series is tested by promtool in tests/unit/test_alert_rules_promtool.py.
"""
import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import alert_rules

BASELINE = {"acceptance_rate": 0.62, "mean_acceptance_length": 2.8, "tpot_p50_ms": 14, "tpot_mean_ms": 15}


def _build(**over):
    settings = {"name": "llama-eagle3", "namespace": "models", "method": "eagle3", "baseline": dict(BASELINE)}
    settings.update(over)
    return alert_rules.build(settings)


def _rules(result):
    return result["manifest"]["spec"]["groups"][0]["rules"]


def test_manifest_is_a_prometheus_rule_named_after_the_service():
    result = _build(rule_labels={"release": "kube-prometheus-stack"})
    manifest = result["manifest"]
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1" and manifest["kind"] == "PrometheusRule"
    assert manifest["metadata"]["name"] == "llama-eagle3-speculative-alerts"
    assert manifest["metadata"]["namespace"] == "models"
    assert manifest["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert result["filename"] == "models-llama-eagle3-speculative-alerts.yaml"
    assert yaml.safe_load(result["manifest_yaml"]) == manifest
    assert [r["alert"] for r in _rules(result)] == [
        "SpeculativeDecodingAcceptanceRateLow", "SpeculativeDecodingAcceptanceLengthLow",
        "SpeculativeDecodingTPOTHigh", "SpeculativeDecodingTPOTHigh"]


def test_every_alert_is_labelled_with_the_service_and_the_check():
    for rule, key in zip(_rules(_build(severity="critical")), BASELINE):
        assert rule["labels"] == {"inferenceservice": "llama-eagle3", "namespace": "models", "check": key, "severity": "critical"}
        assert rule["for"] == "15m"
        assert "models/llama-eagle3" in rule["annotations"]["summary"]
    for rule in _rules(_build(resource_kind="LLMInferenceService")):
        assert rule["labels"]["llminferenceservice"] == "llama-eagle3" and "inferenceservice" not in rule["labels"]


def test_thresholds_apply_the_tolerance_to_each_figure():
    checks = {c["key"]: c for c in _build(tolerance=0.25)["checks"]}
    assert checks["acceptance_rate"]["threshold"] == pytest.approx(0.62 * 0.75)
    # The tolerance applies to what a draft adds beyond the bonus token: 1 + 1.8 x 0.75.
    assert checks["mean_acceptance_length"]["threshold"] == pytest.approx(2.35)
    assert checks["tpot_p50_ms"]["threshold"] == pytest.approx(17.5)
    assert checks["tpot_mean_ms"]["threshold"] == pytest.approx(18.75)
    assert checks["acceptance_rate"]["expr"].startswith("(sum(rate(vllm:spec_decode_num_accepted_tokens_total{")
    assert ") < 0.465\nand on() (sum(rate(vllm:request_success_total{" in checks["acceptance_rate"]["expr"]
    assert ") > 17.5\n" in checks["tpot_p50_ms"]["expr"]


def test_expressions_use_vllm_series_with_the_selector():
    checks = {c["key"]: c for c in _build(window="5m", min_request_rate=0.05)["checks"]}
    sel = 'model_name="llama-eagle3",namespace="models",pod=~"llama-eagle3-predictor-.+"'
    assert checks["acceptance_rate"]["figure"] == (
        "sum(rate(vllm:spec_decode_num_accepted_tokens_total{%s}[5m])) / "
        "sum(rate(vllm:spec_decode_num_draft_tokens_total{%s}[5m]))" % (sel, sel))
    assert checks["mean_acceptance_length"]["figure"] == (
        "1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total{%s}[5m])) / "
        "sum(rate(vllm:spec_decode_num_drafts_total{%s}[5m]))" % (sel, sel))
    assert checks["tpot_p50_ms"]["figure"] == (
        "histogram_quantile(0.5, sum by (le) (rate(vllm:request_time_per_output_token_seconds_bucket{%s}[5m]))) * 1000" % sel)
    assert checks["tpot_mean_ms"]["figure"] == (
        "sum(rate(vllm:request_time_per_output_token_seconds_sum{%s}[5m])) / "
        "sum(rate(vllm:request_time_per_output_token_seconds_count{%s}[5m])) * 1000" % (sel, sel))
    for check in checks.values():
        assert check["expr"].endswith("and on() (sum(rate(vllm:request_success_total{%s}[5m])) > 0.05)" % sel)


def test_selector_label_names_prefix_and_llmisvc_pools():
    sel = alert_rules.selector(alert_rules._settings({  # pylint: disable=protected-access
        "name": "llama", "namespace": "models", "served_model_name": "meta/llama", "method": "ngram",
        "baseline": {"acceptance_rate": 0.5}, "resource_kind": "LLMInferenceService",
        "namespace_label": "kubernetes_namespace", "pod_label": "kubernetes_pod_name"}))
    assert sel == ('model_name="meta/llama",kubernetes_namespace="models",kubernetes_pod_name=~"llama-kserve-.+",'
                   'kubernetes_pod_name!~"llama-kserve-(mn-)?prefill-.+"')
    no_pod = _build(pod_label="", metric_prefix="kserve_vllm:", tpot_metric="time_per_output_token_seconds")["checks"]
    assert "kserve_vllm:spec_decode_num_draft_tokens_total{model_name=\"llama-eagle3\",namespace=\"models\"}[10m]" in no_pod[0]["expr"]
    assert "kserve_vllm:time_per_output_token_seconds_bucket{" in no_pod[2]["expr"]


def test_only_the_baseline_keys_given_become_alerts():
    result = _build(baseline={"tpot_mean_ms": 9.5, "acceptance_rate": None}, method="none")
    assert [(c["alert"], c["key"]) for c in result["checks"]] == [("SpeculativeDecodingTPOTHigh", "tpot_mean_ms")]


@pytest.mark.parametrize("over, field, fragment", [
    ({"baseline": {}}, "inference_service_alerts_baseline", "inference_service_alerts_baseline from the figures recorded"),
    ({"baseline": None}, "inference_service_alerts_baseline", "or turn the alerts off with inference_service_alerts: false"),
    ({"baseline": {"acceptance": 0.5}}, "inference_service_alerts_baseline", "unknown key(s) acceptance"),
    ({"baseline": {"acceptance_rate": None}}, "inference_service_alerts_baseline", "has no figure"),
    ({"baseline": {"acceptance_rate": 62}}, "inference_service_alerts_baseline.acceptance_rate", "as a fraction, e.g. 0.62"),
    ({"baseline": {"acceptance_rate": "high"}}, "inference_service_alerts_baseline.acceptance_rate", "is not a number"),
    ({"baseline": {"acceptance_rate": True}}, "inference_service_alerts_baseline.acceptance_rate", "is not a number"),
    ({"baseline": {"mean_acceptance_length": 1.0}}, "inference_service_alerts_baseline.mean_acceptance_length", "bonus token"),
    ({"baseline": {"tpot_p50_ms": 0}}, "inference_service_alerts_baseline.tpot_p50_ms", "positive latency"),
    ({"method": "none"}, "inference_service_alerts_baseline.acceptance_rate", "without speculative decoding"),
    ({"tolerance": 1}, "inference_service_alerts_tolerance", "fraction in [0, 1)"),
    ({"for": "15 minutes"}, "inference_service_alerts_for", "not a Prometheus duration"),
    ({"window": "0m"}, "inference_service_alerts_window", "not a Prometheus duration"),
    ({"min_request_rate": -1}, "inference_service_alerts_min_request_rate", "negative"),
    ({"pod_label": "pod-name"}, "inference_service_alerts_pod_label", "not a Prometheus label name"),
    ({"namespace_label": ""}, "inference_service_alerts_namespace_label", "not a Prometheus label name"),
    ({"metric_prefix": "vllm-"}, "inference_service_alerts_metric_prefix", "not part of a Prometheus metric name"),
    ({"rule_labels": ["release"]}, "inference_service_alerts_rule_labels", "dict of labels"),
    ({"name": "Llama_3"}, "inference_service_name", "DNS-1123"),
    ({"resource_kind": "Deployment"}, "inference_service_resource_kind", "InferenceService or LLMInferenceService"),
])
def test_bad_input_names_the_variable_and_the_fix(over, field, fragment):
    with pytest.raises(ValidationError) as info:
        _build(**over)
    assert info.value.field == field
    assert str(info.value).startswith(field + ":")
    assert fragment in str(info.value)
    assert "Fix: " in str(info.value)
