# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Alerts for teams with Prometheus: a PrometheusRule (monitoring.coreos.com/v1, the Prometheus Operator's CRD) whose
PromQL checks one InferenceService or LLMInferenceService against the baseline recorded when its rollout was verified
or benchmarked.

Checks (each rendered when its baseline key is given), over a rate window ``window`` and held for ``for``:

* ``acceptance_rate``: rate(accepted tokens) / rate(draft tokens) below ``baseline x (1 - tolerance)``;
* ``mean_acceptance_length``: 1 + rate(accepted tokens) / rate(drafts) below ``1 + (baseline - 1) x (1 - tolerance)``:
  the tolerance applies to the tokens a draft adds beyond the bonus token, so both acceptance checks trip together
  (accepted per draft = rate x k);
* ``tpot_p50_ms``: the median of vLLM's TPOT histogram (``histogram_quantile`` over the bucket rates) above
  ``baseline x (1 + tolerance)``; ``tpot_mean_ms``: its sum / count. The histogram's lowest bucket is 10 ms, so a p50
  inside one bucket is interpolated: record its baseline with the same query (``checks[].figure``), or use the mean.

Every check is guarded by the request rate (``vllm:request_success_total``): with no traffic, or less than
``min_request_rate`` requests per second, nothing fires (and with no drafts the ratios are NaN, which never compares).

Series and labels (facts.md section 1, the collection's captures in tests/fixtures/vllm): vLLM's counters carry
``model_name`` (the served model name) and ``engine``; the namespace and pod labels are the ones Prometheus adds when
it scrapes the pods through a PodMonitor or ServiceMonitor (``namespace``, ``pod``). Their names are settings
(``namespace_label``, ``pod_label``; an empty ``pod_label`` drops the pod matcher), and so is the metric prefix (a
PodMonitor that relabels ``vllm:`` to ``kserve_vllm:`` needs ``metric_prefix``). Pods are matched by KServe's workload
names: ``<name>-predictor-...`` (an InferenceService, Standard and Knative modes), ``<name>-kserve-...`` without the
prefill pool (an LLMInferenceService).

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import math
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import canary_window
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import model as llmisvc_model
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.plain_data import plain
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics

API_VERSION = "monitoring.coreos.com/v1"
KIND = "PrometheusRule"
PREFIX = "inference_service_alerts_"
# Counter names after the metric prefix (vllm/metrics.py and bench/canary_window.py hold vLLM's names).
_COUNTER = {field: base + "_total" for base, field in spec_metrics.V1_COUNTERS.items()}
REQUESTS = canary_window.COUNTERS["request_success"]
TPOT_HISTOGRAM = canary_window.HISTOGRAMS["tpot"]
# vLLM 0.10 and earlier: the per-token histogram the later releases renamed to inter_token_latency_seconds.
LEGACY_TPOT_HISTOGRAM = "time_per_output_token_seconds"

DEFAULTS = {
    "tolerance": 0.2,
    "for": "15m",
    "window": "10m",
    "min_request_rate": 0.01,
    "severity": "warning",
    "rule_labels": {},
    "namespace_label": "namespace",
    "pod_label": "pod",
    "metric_prefix": "vllm:",
    "tpot_metric": TPOT_HISTOGRAM,
}
# Baseline keys: (alert name, direction in which the check fires); rules follow this order.
BASELINE_KEYS = {
    "acceptance_rate": ("SpeculativeDecodingAcceptanceRateLow", "below"),
    "mean_acceptance_length": ("SpeculativeDecodingAcceptanceLengthLow", "below"),
    "tpot_p50_ms": ("SpeculativeDecodingTPOTHigh", "above"),
    "tpot_mean_ms": ("SpeculativeDecodingTPOTHigh", "above"),
}
BASELINE_EXAMPLE = '{"acceptance_rate": 0.62, "mean_acceptance_length": 2.8, "tpot_p50_ms": 14}'
BASELINE_HINT = ("set %sbaseline from the figures recorded when the rollout was verified or benchmarked, e.g. %s "
                 "(any of acceptance_rate, mean_acceptance_length, tpot_p50_ms, tpot_mean_ms), or turn the alerts off "
                 "with inference_service_alerts: false" % (PREFIX, BASELINE_EXAMPLE))
_DURATION = re.compile(r"^(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_PREFIX = re.compile(r"^(?:[a-zA-Z_:][a-zA-Z0-9_:]*)?$")


def _number(value, field, hint):
    if isinstance(value, bool):
        raise ValidationError("%r is not a number" % (value,), field=field, hint=hint)
    if not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValidationError("%r is not a number" % (value,), field=field, hint=hint) from None
    if not math.isfinite(value):
        raise ValidationError("%r is not a finite number" % (value,), field=field, hint=hint)
    return float(value)


def _duration(value, field):
    if not isinstance(value, str) or not value or not _DURATION.match(value) or not re.search(r"[1-9]", value):
        raise ValidationError("%r is not a Prometheus duration" % (value,), field=field, hint="write e.g. 10m, 1h30m or 90s")
    return value


def _baseline(baseline, speculative):
    field = PREFIX + "baseline"
    if not baseline:
        raise ValidationError("is empty: the alerts compare each window with the baseline recorded when the rollout was "
                              "verified or benchmarked, and there is none", field=field, hint=BASELINE_HINT)
    if not isinstance(baseline, dict):
        raise ValidationError("must be a dict, got %s" % type(baseline).__name__, field=field, hint=BASELINE_HINT)
    unknown = sorted(set(baseline) - set(BASELINE_KEYS))
    if unknown:
        raise ValidationError("unknown key(s) %s" % ", ".join(map(str, unknown)), field=field, hint=BASELINE_HINT)
    out = {}
    for key in BASELINE_KEYS:
        if baseline.get(key) is None:
            continue
        sub = "%s.%s" % (field, key)
        value = _number(baseline[key], sub, BASELINE_HINT)
        if key == "acceptance_rate" and not 0 < value <= 1:
            raise ValidationError("%s is not a fraction in (0, 1]" % value, field=sub,
                                  hint="give accepted / draft tokens as a fraction, e.g. 0.62 for 62%")
        if key == "mean_acceptance_length" and value <= 1:
            raise ValidationError("%s leaves nothing to lose: a mean acceptance length counts the bonus token, so 1 means no "
                                  "draft token was accepted when the baseline was recorded" % value, field=sub,
                                  hint="record the baseline on a rollout whose drafts are accepted (verify.yml or the benchmark)")
        if key.startswith("tpot") and value <= 0:
            raise ValidationError("%s is not a positive latency" % value, field=sub, hint="give milliseconds per output token, e.g. 14")
        if key in ("acceptance_rate", "mean_acceptance_length") and not speculative:
            raise ValidationError("is set but the service runs without speculative decoding (method none): vLLM exposes no "
                                  "acceptance counters", field=sub, hint="deploy with a speculative method, or keep only the tpot_* keys")
        out[key] = value
    if not out:
        raise ValidationError("has no figure (every key is null)", field=field, hint=BASELINE_HINT)
    return out


def _quote(value):
    """A PromQL double-quoted string."""
    return '"%s"' % str(value).replace("\\", "\\\\").replace('"', '\\"')


def selector(settings):
    """The label matchers of one service's serving pods (a PromQL ``{...}`` body)."""
    name, kind = settings["name"], settings["resource_kind"]
    matchers = ["model_name=%s" % _quote(settings["served_model_name"]),
                "%s=%s" % (settings["namespace_label"], _quote(settings["namespace"]))]
    pod = settings["pod_label"]
    if pod:
        # DNS-1123 labels (checked in _settings) hold no regex metacharacter: the name goes in as it is.
        if kind == llmisvc_model.KIND:
            # Decode pool (<name>-kserve-...) and multi-node groups (<name>-kserve-mn-...); the prefill pool never drafts.
            matchers.append("%s=~%s" % (pod, _quote("%s-kserve-.+" % name)))
            matchers.append("%s!~%s" % (pod, _quote("%s-kserve-(mn-)?prefill-.+" % name)))
        else:
            matchers.append("%s=~%s" % (pod, _quote("%s-predictor-.+" % name)))
    return ",".join(matchers)


def figures(settings):
    """PromQL of each figure, keyed by baseline key (TPOT in milliseconds), plus ``requests`` (requests per second)."""
    sel, window, prefix = selector(settings), settings["window"], settings["metric_prefix"]

    def rate(metric):
        return "sum(rate(%s%s{%s}[%s]))" % (prefix, metric, sel, window)

    tpot = settings["tpot_metric"]
    return {
        "acceptance_rate": "%s / %s" % (rate(_COUNTER["num_accepted_tokens"]), rate(_COUNTER["num_draft_tokens"])),
        "mean_acceptance_length": "1 + %s / %s" % (rate(_COUNTER["num_accepted_tokens"]), rate(_COUNTER["num_drafts"])),
        "tpot_p50_ms": "histogram_quantile(0.5, sum by (le) (rate(%s%s_bucket{%s}[%s]))) * 1000" % (prefix, tpot, sel, window),
        "tpot_mean_ms": "%s / %s * 1000" % (rate(tpot + "_sum"), rate(tpot + "_count")),
        "requests": rate(REQUESTS),
    }


def threshold(key, baseline, tolerance):
    """The value past which a check fires, to 6 significant digits (0.62 x 0.75 reads 0.465 in the rule, not 0.46499999999999997)."""
    if key == "acceptance_rate":
        value = baseline * (1 - tolerance)
    elif key == "mean_acceptance_length":
        value = 1 + (baseline - 1) * (1 - tolerance)
    else:
        value = baseline * (1 + tolerance)
    return float("%.6g" % value)


_SHOWN = {
    "acceptance_rate": ("draft acceptance rate", "{{ $value | humanizePercentage }}", lambda v: "%.1f%%" % (v * 100)),
    "mean_acceptance_length": ("mean acceptance length", "{{ $value | printf \"%.2f\" }}", lambda v: "%.2f" % v),
    "tpot_p50_ms": ("median TPOT", "{{ $value | printf \"%.2f\" }} ms", lambda v: "%.2f ms" % v),
    "tpot_mean_ms": ("mean TPOT", "{{ $value | printf \"%.2f\" }} ms", lambda v: "%.2f ms" % v),
}


def _settings(raw):
    raw = plain(dict(raw or {}))  # Ansible hands tagged str/dict subclasses, which the YAML dumper cannot represent
    s = dict(DEFAULTS)
    s.update({k: v for k, v in raw.items() if v is not None})
    kind = s.get("resource_kind") or "InferenceService"
    if kind not in llmisvc_model.RESOURCE_KINDS:
        raise ValidationError("%r is not a kind the alerts know" % (kind,), field="inference_service_resource_kind",
                              hint="use InferenceService or LLMInferenceService")
    s["resource_kind"] = kind
    isvc.check_dns1123(s.get("name"), "inference_service_name")
    isvc.check_dns1123(s.get("namespace"), "inference_service_namespace")
    s["served_model_name"] = s.get("served_model_name") or s["name"]
    s["tolerance"] = _number(s["tolerance"], PREFIX + "tolerance", "give a fraction in [0, 1), e.g. 0.2 for 20%")
    if not 0 <= s["tolerance"] < 1:
        raise ValidationError("%s is not a fraction in [0, 1)" % s["tolerance"], field=PREFIX + "tolerance",
                              hint="give e.g. 0.2: fire when a figure is 20% worse than its baseline")
    s["for"] = _duration(s["for"], PREFIX + "for")
    s["window"] = _duration(s["window"], PREFIX + "window")
    s["min_request_rate"] = _number(s["min_request_rate"], PREFIX + "min_request_rate", "give requests per second, e.g. 0.01")
    if s["min_request_rate"] < 0:
        raise ValidationError("%s is negative" % s["min_request_rate"], field=PREFIX + "min_request_rate",
                              hint="give requests per second, 0 or more (0: any traffic at all)")
    for key in ("namespace_label", "pod_label"):
        value = s[key]
        if not isinstance(value, str) or (value and not _LABEL_NAME.match(value)) or (key == "namespace_label" and not value):
            raise ValidationError("%r is not a Prometheus label name" % (value,), field=PREFIX + key,
                                  hint="use the label your PodMonitor/ServiceMonitor scrape adds, e.g. namespace and pod"
                                  + ("; an empty pod_label drops the pod matcher" if key == "pod_label" else ""))
    for key, pattern in (("metric_prefix", _METRIC_PREFIX), ("tpot_metric", _LABEL_NAME)):
        if not isinstance(s[key], str) or not pattern.match(s[key]):
            raise ValidationError("%r is not part of a Prometheus metric name" % (s[key],), field=PREFIX + key,
                                  hint="e.g. vllm: (metric_prefix) or %s (tpot_metric; %s on vLLM 0.10)" % (TPOT_HISTOGRAM, LEGACY_TPOT_HISTOGRAM))
    if not isinstance(s["rule_labels"], dict):
        raise ValidationError("must be a dict of labels", field=PREFIX + "rule_labels",
                              hint="give the labels your Prometheus' ruleSelector matches, e.g. {\"release\": \"prometheus\"}")
    if not isinstance(s["severity"], str) or not s["severity"]:
        raise ValidationError("must be a non-empty string", field=PREFIX + "severity", hint="e.g. warning or critical")
    s["baseline"] = _baseline(s.get("baseline"), speculative=(s.get("method") or "none") != "none")
    return s


def build(raw):
    """Settings -> ``{"manifest", "manifest_yaml", "filename", "checks"}`` (``checks``: alert, key, figure, threshold, expr)."""
    s = _settings(raw)
    name, namespace, kind = s["name"], s["namespace"], s["resource_kind"]
    owner_label = kind.lower()
    exprs = figures(s)
    guard = "%s > %s" % (exprs["requests"], _num(s["min_request_rate"]))
    what = "%s %s/%s" % (kind, namespace, name)
    rules, checks = [], []
    for key, value in s["baseline"].items():
        alert, direction = BASELINE_KEYS[key]
        limit = threshold(key, value, s["tolerance"])
        op = "<" if direction == "below" else ">"
        expr = "(%s) %s %s\nand on() (%s)" % (exprs[key], op, _num(limit), guard)
        label, template, show = _SHOWN[key]
        labels = {"severity": s["severity"], owner_label: name, "namespace": namespace, "check": key}
        annotations = {
            "summary": "%s of %s is %s its baseline" % (label[0].upper() + label[1:], what, direction),
            "description": ("The %s of %s over %s is %s, %s %s (baseline %s, tolerance %d%%), while it serves more than %s "
                            "requests/s. Acceptance collapses on long contexts, after the target model is updated under an "
                            "unchanged draft, or when traffic changes shape: check the engine line and acceptance with "
                            "playbooks/verify.yml, and roll the flag back with playbooks/rollback.yml if it stays."
                            % (label, what, s["window"], template, direction, show(limit), show(value),
                               round(s["tolerance"] * 100), _num(s["min_request_rate"]))),
        }
        rules.append({"alert": alert, "expr": expr, "for": s["for"], "labels": labels, "annotations": annotations})
        checks.append({"alert": alert, "key": key, "figure": exprs[key], "baseline": value, "threshold": limit, "expr": expr})
    meta_labels = {"app.kubernetes.io/managed-by": "alauda.spec_decoding", "app.kubernetes.io/name": name}
    meta_labels.update({str(k): str(v) for k, v in s["rule_labels"].items()})
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "%s-speculative-alerts" % name, "namespace": namespace, "labels": meta_labels},
        "spec": {"groups": [{"name": "speculative-decoding.%s.%s" % (namespace, name), "rules": rules}]},
    }
    return {"manifest": manifest, "manifest_yaml": isvc.to_yaml(manifest), "checks": checks,
            "filename": "%s-%s-speculative-alerts.yaml" % (namespace, name)}


def _num(value):
    """A number as PromQL reads it back unchanged (repr keeps every digit; integral floats lose their .0)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
