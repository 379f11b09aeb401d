#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: canary_observe_info
short_description: Measure both revisions of a speculative-decoding canary on live traffic and decide
version_added: 0.2.0
description:
  - Reads C(/metrics) of every pod of the stable and of the canary revision (through the API server's pod proxy, as
    M(alauda.spec_decoding.speculative_metrics_info) does), waits O(window) seconds of live traffic and reads them again.
  - Per revision, from the deltas of vLLM's server-side histograms (C(vllm:time_to_first_token_seconds),
    C(vllm:request_time_per_output_token_seconds), C(vllm:inter_token_latency_seconds),
    C(vllm:e2e_request_latency_seconds)) - medians and p99 as Prometheus' C(histogram_quantile) computes them - the
    finished requests, the output tokens per second of request time, and the canary's acceptance figures.
  - Decides with the benchmark's keep rule (median TTFT, median TPOT, output rate; see M(alauda.spec_decoding.spec_benchmark)) -
    C(promote) or C(roll_back), over O(count) windows within the budgets (O(failure_limit), O(inconclusive_limit),
    O(consecutive_error_limit)). No decision (C(none)) while a side has fewer than O(min_requests) finished requests (the
    window is extended up to O(max_window) first) or a pod's metrics are missing (named in C(missing)).
  - Only reads; C(changed) is always false.
author:
  - Alauda Platform Team (@alauda)
options:
  canary_name:
    description: Name of the canary predictor (Standard mode).
    type: str
    default: spec
  selectors:
    description:
      - Label selectors of the pods of each revision (keys C(stable), C(canary)); default from the InferenceService
        (what M(alauda.spec_decoding.canary_rollout) returns as C(selectors)).
    type: dict
  window:
    description: Seconds of live traffic to observe.
    type: float
    default: 300
  max_window:
    description: Seconds the window may grow to while a side has fewer than O(min_requests) requests (default O(window)).
    type: float
  min_requests:
    description: Finished requests each revision needs in the window before any decision.
    type: int
    default: 20
  tolerances:
    description: How much worse (a fraction) each metric may be and still count (keys C(ttft), C(tpot), C(throughput)).
    type: dict
  p99_tolerance:
    description:
      - How much worse (a fraction, may exceed 1) the canary's p99 TTFT and p99 TPOT may be than the stable revision's;
        a worse tail rolls back even when the medians win. V(null) leaves the tails out of the decision.
      - The tails decide only when both sides finished at least 100 requests in the window (below that a p99 is the
        slowest request or two); otherwise they are reported with C(passed=null) and a reason saying so.
    type: float
    default: 0.5
  model_name:
    description: Count only series of this served model name.
    type: str
  container:
    description: Container whose port serves C(/metrics).
    type: str
    default: kserve-container
  port:
    description: Port of C(/metrics) (default from the pod spec, see M(alauda.spec_decoding.speculative_metrics_info)).
    type: str
  scheme:
    description: C(http) or C(https) (default from the pod spec).
    type: str
    choices: [http, https]
  percent:
    description: The canary's traffic share, for the report.
    type: int
  timeout:
    description: Seconds for each C(/metrics) request.
    type: int
    default: 30
  count:
    description:
      - Windows of O(window) seconds to measure (Argo Rollouts' C(count)); each gets a verdict - C(pass), C(fail),
        C(inconclusive) (too few requests, a check not measurable, or a measured difference inside the noise) or C(error)
        (a C(/metrics) read failed; never counted as a failure).
    type: int
    default: 1
  failure_limit:
    description: Failed windows tolerated; one more ends the analysis C(failed) - C(roll_back) (Argo's C(failureLimit)).
    type: int
    default: 0
  inconclusive_limit:
    description:
      - Inconclusive windows tolerated; one more ends the analysis C(inconclusive) - decision C(none), the canary stays
        where it is (Argo's C(inconclusiveLimit)).
    type: int
    default: 0
  consecutive_error_limit:
    description:
      - Windows in a row whose C(/metrics) could not be read that are tolerated; one more ends the analysis C(error) -
        decision C(none), nothing rolled back (Argo's C(consecutiveErrorLimit)).
    type: int
    default: 4
  initial_delay:
    description: Seconds to wait before the first window (warm-up; Argo's C(initialDelay)).
    type: float
    default: 0
  checks:
    description:
      - More checks on the canary's window besides the keep rule and the p99 guard, the stable revision as the baseline.
        Each C({name, figure, min | max | better + tolerance, dry_run}); C(figure) one of C(acceptance_rate),
        C(mean_acceptance_length), C(position_<n>_rate), C(requests), C(output_rate), C(ttft|tpot|itl|e2el_median|p99|mean).
      - A C(dry_run) check is evaluated and reported, never decides.
    type: list
    elements: dict
    default: []
  confidence:
    description:
      - How sure (0.5 to 1) the decision must be. The window's deciding checks (the keep rule's guards, the p99 guard and
        O(checks)) share V(1 - confidence) as their false-fail rate, and O(count) windows share it too, so an unchanged
        engine is rolled back at most that often; each check's noise test is chosen for its figure (ranks on the
        histogram buckets, exceedances for p99, the draft as the unit for acceptance). A difference no test is sure of
        is C(inconclusive).
    type: float
    default: 0.95
extends_documentation_fragment:
  - alauda.spec_decoding.inference_service
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
  - prometheus_client
"""

EXAMPLES = r"""
- name: Observe 10 minutes of live traffic, at least 50 requests per side
  alauda.spec_decoding.canary_observe_info:
    name: llama
    namespace: models
    window: 600
    max_window: 1800
    min_requests: 50
  register: observed

- name: The same, with checks of the canary's window beside the keep rule (the stable revision is the baseline)
  alauda.spec_decoding.canary_observe_info:
    name: llama
    namespace: models
    window: 600
    checks:
      - {name: acceptance, figure: acceptance_rate, better: higher, tolerance: 0.3}  # up to 30% below stable passes
      - {name: ttft-p99-bound, figure: ttft_p99, max: 2000}  # a bound, in ms
      - {name: first-position, figure: position_1_rate, min: 0.5, dry_run: true}  # reported, never decides
  register: observed
"""

RETURN = r"""
decision:
  description: C(promote), C(roll_back) or C(none) (not enough evidence).
  returned: always
  type: str
reasons:
  description: Why.
  returned: always
  type: list
  elements: str
checks:
  description: The keep rule's checks (metric, baseline = stable, candidate = canary, limit, passed).
  returned: always
  type: list
  elements: dict
stable:
  description: Figures of the stable revision (requests, C(ttft_ms)/C(tpot_ms)/C(itl_ms)/C(e2el_ms) with median, p99, mean, count).
  returned: always
  type: dict
canary:
  description: Figures of the canary revision, plus C(acceptance) (the spec_metrics summary of the window).
  returned: always
  type: dict
missing:
  description: Pods per side whose C(/metrics) could not be read or had no vLLM histograms.
  returned: always
  type: dict
window_s:
  description: Seconds actually observed.
  returned: always
  type: float
extended:
  description: How many times the window was extended for too few requests.
  returned: always
  type: int
selectors:
  description: The label selectors used.
  returned: always
  type: dict
report:
  description: The report (JSON-ready) - window, both revisions' figures, the decision and why.
  returned: always
  type: dict
verdict:
  description: The analysis' phase - C(successful), C(failed), C(inconclusive) or C(error).
  returned: always
  type: str
confidence:
  description: How sure (0..1) the deciding window's failed comparison is that the canary is worse (null when none failed).
  returned: always
  type: float
analysis:
  description: The windows' verdicts and reasons, their counts and the budgets.
  returned: always
  type: dict
next_step:
  description: What to do when the decision is C(none) (the canary stays at its step).
  returned: always
  type: str
markdown:
  description: The report as Markdown.
  returned: always
  type: str
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import INFERENCE_SERVICE_ARG_SPEC, ModuleContract, argspec
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary_steps
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.prometheus_text import require_prometheus_client


def argument_spec():
    return argspec(
        INFERENCE_SERVICE_ARG_SPEC,
        canary_name=dict(type="str", default="spec"),
        selectors=dict(type="dict"),
        window=dict(type="float", default=300),
        max_window=dict(type="float"),
        min_requests=dict(type="int", default=20),
        tolerances=dict(type="dict"),
        p99_tolerance=dict(type="float", default=0.5),  # canary_window.DEFAULT_P99_TOLERANCE
        model_name=dict(type="str"),
        container=dict(type="str", default="kserve-container"),
        port=dict(type="str"),
        scheme=dict(type="str", choices=["http", "https"]),
        timeout=dict(type="int", default=30),
        percent=dict(type="int"),
        count=dict(type="int", default=1),
        failure_limit=dict(type="int", default=0),
        inconclusive_limit=dict(type="int", default=0),
        consecutive_error_limit=dict(type="int", default=4),
        initial_delay=dict(type="float", default=0),
        checks=dict(type="list", elements="dict", default=[]),
        confidence=dict(type="float", default=0.95),
    )


def execute(module):
    require_prometheus_client(module)
    return canary_steps.observe_canary(lambda: module.api_client, module.params)


CONTRACT = ModuleContract(argument_spec, execute)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
