# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: speculative_alert_rules
short_description: A PrometheusRule that alerts when speculative decoding falls below its recorded baseline
version_added: 0.1.0
description:
  - Takes the alert settings of one InferenceService or LLMInferenceService and returns a C(monitoring.coreos.com/v1)
    C(PrometheusRule) (the Prometheus Operator's CRD) with one alert per baseline figure, in PromQL over vLLM's own
    counters and histograms.
  - C(SpeculativeDecodingAcceptanceRateLow) when rate(accepted tokens) / rate(draft tokens) falls below
    C(acceptance_rate) x (1 - C(tolerance)); C(SpeculativeDecodingAcceptanceLengthLow) when 1 + rate(accepted) /
    rate(drafts) falls below 1 + (C(mean_acceptance_length) - 1) x (1 - C(tolerance));
    C(SpeculativeDecodingTPOTHigh) when the median (C(tpot_p50_ms), C(histogram_quantile) over the buckets) or the mean
    (C(tpot_mean_ms), sum / count) of vLLM's TPOT histogram rises above the baseline x (1 + C(tolerance)).
  - Every alert holds for C(for) and is silent while the service serves no more than C(min_request_rate) requests per
    second. Alerts carry the labels C(inferenceservice) (or C(llminferenceservice)), C(namespace), C(check) and C(severity).
  - Series are selected by C(model_name) (the served model name), the namespace label and the pod label Prometheus adds
    when it scrapes through a PodMonitor or ServiceMonitor (C(namespace), C(pod); settings C(namespace_label),
    C(pod_label)), pods matched by KServe's workload names.
  - A missing or empty C(baseline) is refused, naming the role variable and the fix.
author:
  - Alauda Platform Team (@alauda)
options:
  _input:
    description:
      - Settings with keys C(name), C(namespace), C(resource_kind) (V(InferenceService) or V(LLMInferenceService)),
        C(served_model_name) (default C(name)), C(method) (V(none) refuses the acceptance keys), C(baseline) (a dict
        with any of C(acceptance_rate), C(mean_acceptance_length), C(tpot_p50_ms), C(tpot_mean_ms)), C(tolerance)
        (0.2), C(for) (15m), C(window) (10m, the rate window), C(min_request_rate) (0.01), C(severity) (warning),
        C(rule_labels) (labels on the PrometheusRule for your Prometheus' ruleSelector), C(namespace_label) (namespace),
        C(pod_label) (pod; empty drops the pod matcher), C(metric_prefix) (vllm:), C(tpot_metric)
        (request_time_per_output_token_seconds; time_per_output_token_seconds on vLLM 0.10).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Write the PrometheusRule next to the InferenceService
  ansible.builtin.copy:
    content: "{{ rules.manifest_yaml }}"
    dest: "gitops/{{ rules.filename }}"
    mode: "0644"
  vars:
    rules: >-
      {{ {'name': 'llama-eagle3', 'namespace': 'models', 'method': 'eagle3',
          'baseline': {'acceptance_rate': 0.62, 'mean_acceptance_length': 2.8, 'tpot_p50_ms': 14}}
         | alauda.spec_decoding.speculative_alert_rules }}
"""

RETURN = r"""
_value:
  description:
    - C(manifest) (the PrometheusRule), C(manifest_yaml) (deterministic YAML), C(filename)
      (C(<namespace>-<name>-speculative-alerts.yaml)) and C(checks) (per alert C(alert), C(key), C(figure) (the PromQL of
      the figure, to record a baseline with the same query), C(baseline), C(threshold), C(expr)).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import alert_rules


def speculative_alert_rules(settings):
    if not isinstance(settings, dict):
        raise AnsibleFilterError("speculative_alert_rules: expects a dict of settings, got %s" % type(settings).__name__)
    try:
        return alert_rules.build(settings)
    except SpecDecodingError as exc:
        raise AnsibleFilterError("speculative_alert_rules: %s" % exc) from exc


class FilterModule:
    """Prometheus alerts."""

    def filters(self):
        return {"speculative_alert_rules": speculative_alert_rules}
