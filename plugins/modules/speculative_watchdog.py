#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: speculative_watchdog
short_description: Watch the acceptance of speculative decoding on live traffic against a recorded baseline
version_added: 0.2.0
description:
  - Measures O(count) windows of O(interval) seconds on every serving pod of an InferenceService or LLMInferenceService
    (two reads of vLLM's C(/metrics) through the API server's pod proxy per window) and compares each window with the
    baseline recorded when the rollout was verified or benchmarked, with the checks in O(checks) (the collection's
    analysis engine, the one the canary uses).
  - Each window gets a verdict - C(pass), C(fail), C(inconclusive) (too few requests, a difference inside the noise) or
    C(error) (C(/metrics) unreadable, never counted as a failure); the budgets (O(failure_limit), O(inconclusive_limit),
    O(consecutive_error_limit)) give the state - C(healthy), C(degraded) (reported), C(collapsed) (the failure budget is
    spent - RV(action) is C(roll_back)), C(no_traffic) and C(unknown) (never act).
  - The module itself rolls nothing back; C(playbooks/watch.yml) (role C(alauda.spec_decoding.watch)) rolls the flag back
    on C(collapsed) with the rollback role, which proves it by the engine line C(speculative_config=None) on every pod.
  - O(record_baseline=true) measures one window and keeps it as the baseline in the ConfigMap
    C(<name>-spec-decoding-baseline) next to the resource (owned by it). A ConfigMap and not an annotation, because
    KServe copies the InferenceService's annotations into the pod template - an annotation would roll the pods.
  - O(services) watches several services at once (the watch role's fleet form) - their windows are measured together, one
    wait of O(interval) per window for all of them and each pod's C(/metrics) read once per window, so a run takes about
    O(count) x O(interval) whatever the number of services; each service keeps its own baseline, windows, state and action
    (RV(services)).
author:
  - Alauda Platform Team (@alauda)
options:
  name:
    description: InferenceService (or LLMInferenceService) name. Required unless O(services) is given.
    type: str
    required: false
  namespace:
    description: Its namespace. Required with O(name).
    type: str
    required: false
  services:
    description:
      - The services to watch together instead of O(name) - each C({namespace, name}). Their windows are measured at the same
        time; RV(services) gives each one's result. With O(record_baseline) one window is measured for all of them, and when
        one cannot be a baseline none is written.
      - Not with O(request_classes).
    type: list
    elements: dict
  resource_kind:
    description: What O(name) is.
    type: str
    choices: [InferenceService, LLMInferenceService]
    default: InferenceService
  api_version:
    description: API version of an LLMInferenceService.
    type: str
    default: v1alpha2
  record_baseline:
    description: Measure one window and record it as the baseline (writes the ConfigMap; a server-side dry run in check mode).
    type: bool
    default: false
  baseline_source:
    description: What the recorded baseline comes from, for the record (e.g. C(verify), C(benchmark)).
    type: str
    default: verify
  baseline:
    description: Baseline figures to compare with instead of the recorded ones (a window's figures, as RV(baseline) returns them).
    type: dict
  checks:
    description:
      - The checks per window (default - acceptance rate at most 50% below the baseline, mean acceptance length at most 30%
        below, median TPOT at most 50% above as a dry run). Each C({name, figure, min | max | better + tolerance, dry_run});
        see M(alauda.spec_decoding.canary_observe_info) O(checks) for the figures.
      - "Against the baseline: C({name: acceptance, figure: acceptance_rate, better: higher, tolerance: 0.3}) (up to 30% below
        it passes). A bound: C({name: tpot-bound, figure: tpot_median, max: 80}) (ms). Reported, never deciding: add
        C(dry_run: true). Given checks replace the default ones (see EXAMPLES)."
    type: list
    elements: dict
  interval:
    description: Seconds of live traffic per window.
    type: float
    default: 300
  count:
    description: Windows per run.
    type: int
    default: 3
  failure_limit:
    description: Failed windows tolerated; one more is C(collapsed).
    type: int
    default: 1
  inconclusive_limit:
    description: Inconclusive windows tolerated; one more ends the run (C(no_traffic) or C(degraded)).
    type: int
    default: 3
  consecutive_error_limit:
    description: Windows in a row with unreadable C(/metrics) tolerated; one more ends the run C(unknown).
    type: int
    default: 1
  initial_delay:
    description: Seconds before the first window.
    type: float
    default: 0
  min_requests:
    description: Finished requests a window needs to be judged (fewer - C(no_traffic)).
    type: int
    default: 20
  confidence:
    description:
      - How sure the decision must be. A window's deciding checks share V(1 - confidence) as their false-fail rate, and
        the run's O(count) windows share it by the failure budget, so an unchanged engine is called C(collapsed) at most
        that often (docs/rollback.md gives the measured rates). Each check's noise test is chosen for its figure (ranks
        on the histogram buckets, exceedances for p99, the draft as the unit for acceptance).
    type: float
    default: 0.95
  model_name:
    description: Count only series of this served model name.
    type: str
  container:
    description: Container whose port serves C(/metrics) (V(main) for an LLMInferenceService).
    type: str
    default: kserve-container
  port:
    description: Port of C(/metrics) (default from the pod spec).
    type: str
  scheme:
    description: C(http) or C(https) (default from the pod spec).
    type: str
    choices: [http, https]
  timeout:
    description: Seconds for each C(/metrics) request.
    type: int
    default: 30
  request_classes:
    description:
      - Watch per request class instead (issue 52) - the classes the routing plan sends to this speculative service (the
        annotation of the plan's route). vLLM's C(/metrics) carry no class, so the watchdog sends each class's C(probes)
        itself to the serving pods (the pod proxy), reads the acceptance in each response's C(metrics.speculative_decoding)
        (vLLM 0.32+ with C(--per-request-spec-decode-metrics)) and judges it against the class's baseline (the ConfigMap
        C(<name>-spec-decoding-class-baseline), recorded with O(record_baseline=true)) with the acceptance checks.
      - A class that collapses gets RV(action=route_back) and RV(route) - the route without that class's rule, so its requests
        take the default rule, the baseline; the other classes stay. The module writes nothing; the watch role writes RV(route)
        with the benchmark role's routing write modes (Git or server-side apply).
      - Keys - C(probes) (class to a list of prompts, required), C(route) (the route's manifest, e.g. from Git) or C(route_name)
        (the live HTTPRoute; for an LLMInferenceService its own router is read), C(model) (default O(model_name), else O(name)),
        C(max_tokens) (default 64), C(baseline) (class to C(requests) and C(acceptance) with its counters - the A/B report's
        per-class C(acceptance) will do - instead of the recorded ones).
    type: dict
extends_documentation_fragment:
  - alauda.spec_decoding.inference_service
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
  - prometheus_client
"""

EXAMPLES = r"""
- name: Record the baseline right after the rollout was verified
  alauda.spec_decoding.speculative_watchdog:
    name: llama
    namespace: models
    record_baseline: true
    interval: 600

- name: Three 5-minute windows against it
  alauda.spec_decoding.speculative_watchdog:
    name: llama
    namespace: models
  register: watched

- name: Own checks - two against the baseline, a latency bound, and one that is only reported
  alauda.spec_decoding.speculative_watchdog:
    name: llama
    namespace: models
    checks:
      - {name: acceptance, figure: acceptance_rate, better: higher, tolerance: 0.3}
      - {name: acceptance-length, figure: mean_acceptance_length, better: higher, tolerance: 0.2}
      - {name: tpot-bound, figure: tpot_median, max: 80}  # ms, whatever the baseline was
      - {name: first-position, figure: position_1_rate, min: 0.5, dry_run: true}
  register: watched

- name: Several services at once - one window for all of them, a result per service
  alauda.spec_decoding.speculative_watchdog:
    services:
      - {namespace: models, name: llama}
      - {namespace: models, name: qwen}
    interval: 300
    count: 3
  register: watched_fleet

- name: Per request class - a class whose acceptance collapsed goes back to the baseline, the others stay
  alauda.spec_decoding.speculative_watchdog:
    name: llama-ngram
    namespace: models
    min_requests: 8
    request_classes:
      route_name: report-classes
      probes:
        code: "{{ lookup('ansible.builtin.file', 'probes/code.json') | from_json }}"
        summarize: "{{ lookup('ansible.builtin.file', 'probes/summarize.json') | from_json }}"
  register: watched_classes
"""

RETURN = r"""
state:
  description: C(healthy), C(degraded), C(collapsed), C(no_traffic), C(unknown) - or C(recorded) with O(record_baseline).
  returned: always
  type: str
action:
  description: C(roll_back) when C(collapsed), else C(none); with O(request_classes) C(route_back) when a class collapsed.
  returned: always
  type: str
would_roll_back:
  description: True in check mode when the state is C(collapsed).
  returned: when windows were measured
  type: bool
reasons:
  description: Why - the run's end and the last window's check results.
  returned: always
  type: list
  elements: str
analysis:
  description: The run - C(phase), C(message), C(counts), C(budgets), every window's verdict, reasons, checks and figures.
  returned: when windows were measured
  type: dict
baseline:
  description: The baseline compared with (where it came from, when recorded) or, with O(record_baseline), the one recorded.
  returned: without O(request_classes)
  type: dict
classes:
  description: With O(request_classes), per class its C(state), C(verdict), C(reasons) and probe C(figures).
  returned: with O(request_classes)
  type: list
  elements: dict
routed_back:
  description: With O(request_classes), the classes whose acceptance collapsed (RV(action) is C(route_back)).
  returned: with O(request_classes)
  type: list
  elements: str
route:
  description: With O(request_classes) and a collapsed class, the route's manifest without that class's rule; else null.
  returned: with O(request_classes)
  type: dict
services:
  description:
    - With O(services), one result per service in their order - C(namespace), C(name) and the keys a single service's run
      returns (C(state), C(action), C(would_roll_back), C(analysis), C(baseline), C(reasons), C(msg)). RV(state) is then the
      most urgent of theirs and RV(action) C(roll_back) when any collapsed.
  returned: with O(services)
  type: list
  elements: dict
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import INFERENCE_SERVICE_ARG_SPEC, ModuleContract, argspec
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import watchdog
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import watchdog_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.prometheus_text import require_prometheus_client


def argument_spec():
    return argspec(
        INFERENCE_SERVICE_ARG_SPEC,
        resource_kind=dict(type="str", default="InferenceService", choices=["InferenceService", "LLMInferenceService"]),
        api_version=dict(type="str", default="v1alpha2"),
        record_baseline=dict(type="bool", default=False),
        baseline_source=dict(type="str", default="verify"),
        baseline=dict(type="dict"),
        checks=dict(type="list", elements="dict"),
        interval=dict(type="float", default=300),
        count=dict(type="int", default=3),
        failure_limit=dict(type="int", default=1),
        inconclusive_limit=dict(type="int", default=3),
        consecutive_error_limit=dict(type="int", default=1),
        initial_delay=dict(type="float", default=0),
        min_requests=dict(type="int", default=20),
        confidence=dict(type="float", default=0.95),
        model_name=dict(type="str"),
        container=dict(type="str", default="kserve-container"),
        port=dict(type="str"),
        scheme=dict(type="str", choices=["http", "https"]),
        timeout=dict(type="int", default=30),
        request_classes=dict(type="dict"),
        # after the shared block: name and namespace are not required with services
        name=dict(type="str"),
        namespace=dict(type="str"),
        services=dict(type="list", elements="dict"),
    )


def execute(module):
    if module.params.get("request_classes"):
        return watchdog_classes.watch_classes(module.api_client, module.params, check_mode=module.check_mode)
    require_prometheus_client(module)
    if module.params.get("services") is not None:
        return watchdog.watch_services(module.api_client, module.params, watchdog.service_list(module.params["services"]),
                                       check_mode=module.check_mode)
    return watchdog.watch(module.api_client, module.params, check_mode=module.check_mode)


CONTRACT = ModuleContract(argument_spec, execute, constraints=dict(
    required_one_of=[("name", "services")],
    required_together=[("name", "namespace")],
    mutually_exclusive=[("name", "services"), ("services", "request_classes")],
))


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
