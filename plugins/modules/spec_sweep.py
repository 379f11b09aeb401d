#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: spec_sweep
short_description: Load and k sweep of baseline vs speculative decoding - the break-even load and the best num_speculative_tokens
version_added: 0.2.0
description:
  - Runs the A/B protocol of M(alauda.spec_decoding.spec_benchmark) (same prompts in the same order, temperature 0,
    a fixed seed, warmups, 5 to 10 runs per prompt, medians; its client and statistics) at each load of
    O(request_rates) and/or O(concurrencies), the baseline and the candidate interleaved at each load.
  - Returns per load TTFT, TPOT and ITL medians and p99, output tokens/s, the speedup (candidate tok/s / baseline tok/s)
    and the candidate's acceptance figures from its C(/metrics) deltas.
  - O(ignore:break_even) is the highest load at which the candidate still meets the keep rule of
    M(alauda.spec_decoding.spec_benchmark) (median TTFT, median TPOT and output throughput all at least as good, within
    O(tolerances)), the first at which it does not, the interpolated crossover and the metric that crossed first.
  - Predicts the best C(num_speculative_tokens) among O(k_candidates) from the per-position acceptance rates measured
    over the sweep (expected tokens per step 1 + r_1 + ... + r_k with k slots) against the measured cost of a verify step.
    The prediction is only a recommendation once a measured A/B confirms it. With O(confirm_url) (a server running
    the predicted k) the module measures the current k against it at the target load. When the predicted k is the
    deployed k, the sweep's own A/B at that load is the measurement.
  - The decision for O(target_qps) uses the sweep point at or above it.
  - Checks, before any inference request, that the candidate runs speculative decoding and the baseline does not.
    It reads each side's engine-config line (O(baseline_engine_config), O(candidate_engine_config),
    O(confirm_engine_config), which show what the engine really runs), the C(vllm:spec_decode_*) counters on C(/metrics) and the
    commands in O(report_context). It reads the candidate's k from its engine line, else from the number of
    per-position series, and refuses an engine line whose method or k contradicts O(method), O(current_k),
    O(confirm_k) or the same side's C(/metrics).
  - Writes C(<report_name>.json) after every measurement. O(resume_from) set to that file continues an interrupted
    sweep without measuring finished points again. At the end it writes the Markdown report and PNG plots
    (speedup and TPOT against load with the break-even and target QPS, the per-position curve with the k prediction).
  - A module cannot stream output. Progress (the point, the side, requests done of total) goes to O(progress_file).
  - "Options by group: each option's description starts with its group (ansible-doc lists options alphabetically).
    B(Endpoints): the five servers O(baseline_url), O(candidate_url), O(confirm_url) (the predicted k), O(fixed_url) (the best
    fixed k) and O(schedule_url) (a k schedule), their C(*_model) names, what each engine runs (C(*_engine_config)), and the
    HTTP settings (O(bearer_token), O(headers), O(timeout), O(validate_certs), O(ca_path)).
    B(Load): what is sent and how hard: O(request_rates) and/or O(concurrencies), O(target_qps), the prompts and the protocol
    (O(temperature), O(max_tokens), O(seed)), and where the requests come from (O(load_from), O(load_job): a Job next to the
    service). B(k): the C(num_speculative_tokens) prediction (O(method), O(k_candidates)), its confirmation (O(confirm_k)) and
    the k schedule (O(k_schedule), O(schedule), O(fixed_k)). B(Report): O(report_dir), O(report_name), O(report_context),
    O(resume_from), the decision's O(tolerances), O(plots), O(title) and O(progress_file)."
  - "Modes, each with an example in EXAMPLES: a sweep by request rate (with the k prediction) or by concurrency; from this
    host or from a Job in the cluster (O(load_from=cluster)); the predicted k confirmed on O(confirm_url); a k schedule
    derived (O(k_schedule=true)) and then measured against the best fixed k (O(schedule_url) with O(fixed_url))."
author:
  - Alauda Platform Team (@alauda)
options:
  baseline_url:
    description:
      - 'Endpoints: Base URL of the baseline server (no speculative decoding).'
    type: str
    required: true
  baseline_model:
    description:
      - 'Endpoints: Served model name of the baseline. Defaults to the first id of C(GET /v1/models).'
    type: str
  candidate_url:
    description:
      - 'Endpoints: Base URL of the speculative-decoding server with the current k.'
    type: str
    required: true
  candidate_model:
    description:
      - 'Endpoints: Served model name of the candidate. Defaults to the first id of C(GET /v1/models).'
    type: str
  confirm_url:
    description:
      - 'Endpoints: Base URL of a server that runs the predicted k (O(confirm_k)), for the confirmation A/B.'
    type: str
  confirm_model:
    description:
      - 'Endpoints: Served model name of O(confirm_url).'
    type: str
  fixed_url:
    description:
      - 'Endpoints: Base URL of a server running the best fixed C(num_speculative_tokens), the baseline side of the schedule''s A/B.'
    type: str
  fixed_model:
    description:
      - 'Endpoints: Served model name of O(fixed_url).'
    type: str
  schedule_url:
    description:
      - 'Endpoints: Base URL of a server running a C(num_speculative_tokens_per_batch_size) schedule, for its A/B against O(fixed_url)
        (the best fixed k) at two loads. Needs O(fixed_url).'
      - The two loads are O(schedule_loads), else the lowest swept load and the highest swept load whose scheduled k differs
        (the k the schedule runs at each load's batch size, which is the concurrency, or the mean requests in flight at a request rate).
      - Per load, the fixed side then the schedule side are measured with the sweep's protocol, after the sweep (resumed like
        it). The result, C(k.schedule_confirmation), gives both sides' TPOT and ITL medians, the speedup (fixed median TPOT /
        schedule median TPOT), the noise (the distribution-free 95% intervals of both medians, from each request's TPOT) and a
        verdict per load, V(confirmed), V(not_confirmed) or V(inconclusive) (within the noise), and overall.
    type: str
  schedule_model:
    description:
      - 'Endpoints: Served model name of O(schedule_url).'
    type: str
  baseline_engine_config:
    description:
      - 'Endpoints: What the baseline''s engine logged at start-up. Either the registered result of M(alauda.spec_decoding.engine_config_info)
        (or M(alauda.spec_decoding.llmisvc_engine_config_info)) for it, of which C(found) and C(speculative_config) are read,
        or a dict whose C(line) is the "Initializing a V1 LLM engine" line.'
      - Refused when the line shows a speculative config. With C(found=false) the check falls back to C(/metrics), with a note.
    type: dict
  candidate_engine_config:
    description:
      - 'Endpoints: As O(baseline_engine_config), for the candidate. Refused when the line shows C(speculative_config=None), or a
        method other than O(method), or a k other than O(current_k) or than its C(/metrics) shows.'
    type: dict
  confirm_engine_config:
    description:
      - 'Endpoints: As O(candidate_engine_config), for O(confirm_url); its k must be O(confirm_k).'
    type: dict
  bearer_token:
    description:
      - 'Endpoints: Bearer token for every endpoint.'
    type: str
  headers:
    description:
      - 'Endpoints: Extra HTTP headers for every endpoint.'
    type: dict
    default: {}
  timeout:
    description:
      - 'Endpoints: Seconds to wait for each response chunk.'
    type: float
    default: 600
  request_rates:
    description:
      - 'Load: Request rates to sweep (requests/s), strictly increasing, each above 0.'
    type: list
    elements: float
  concurrencies:
    description:
      - 'Load: Concurrencies to sweep (requests in flight), strictly increasing, each at least 1.'
    type: list
    elements: int
  max_concurrency:
    description:
      - 'Load: Upper bound of requests in flight at the request-rate points.'
    type: int
    default: 64
  target_qps:
    description:
      - 'Load: The request rate the service really runs. The decision uses the sweep point at or above it. Needs
        O(request_rates) reaching it.'
    type: float
  arrival:
    description:
      - 'Load: Arrival process at the request-rate points, seeded by O(seed).'
    type: str
    choices: [poisson, fixed]
    default: poisson
  api:
    description:
      - 'Load: OpenAI API to call (see M(alauda.spec_decoding.spec_benchmark)).'
    type: str
    choices: [chat, completions]
    default: chat
  workload:
    description:
      - 'Load: Built-in workload, ignored with O(prompts_file).'
    type: str
    choices: [code_refactor, general_chat]
    default: code_refactor
  prompts_file:
    description:
      - 'Load: JSONL prompts, one per line (a JSON string, or an object with C(prompt) or C(messages)).'
      - 'Load: An object may name its request C(class) (for example V(code), V(chat)); the sweep then also reports each class
        (RV(classes)).'
    type: path
  num_prompts:
    description:
      - 'Load: Use only the first N prompts.'
    type: int
  runs_per_prompt:
    description:
      - 'Load: Measured runs of each prompt per side and load (5 to 10).'
    type: int
    default: 5
  warmup:
    description:
      - 'Load: Warmup requests per side and load, discarded (at least 3).'
    type: int
    default: 3
  extra_body:
    description:
      - 'Load: Further request fields sent to every side, for example C(ignore_eos).'
    type: dict
    default: {}
  scrape_metrics:
    description:
      - 'Load: Read C(/metrics) before and after each measurement (acceptance, prefix cache).'
    type: bool
    default: true
  method:
    description:
      - 'k: Speculative method of the candidate (for the range of O(k_candidates)), for example V(ngram).'
    type: str
  current_k:
    description:
      - 'k: The candidate''s C(num_speculative_tokens). Defaults to the number of per-position series on its C(/metrics).'
    type: int
  k_candidates:
    description:
      - 'k: The C(num_speculative_tokens) values to predict among, within 1 and the method''s limit (10 for ngram,
        draft_model, eagle and eagle3, 5 for mtp, 24 for suffix). Only slots measured by the candidate are predicted,
        so run the candidate with the largest k. Defaults to the candidate''s own k. Needs O(method).'
    type: list
    elements: int
  verify_cost_ratio:
    description:
      - 'k: Cost of one proposed token as a fraction of a baseline decode step, for the k model. By default it is
        measured at the lowest load, from both sides'' TPOT and the candidate''s mean acceptance length.'
    type: float
  confirm_k:
    description:
      - 'k: The C(num_speculative_tokens) O(confirm_url) serves. Required with O(confirm_url).'
    type: int
  confirm_load:
    description:
      - 'k: Load of the confirmation A/B. Defaults to the sweep point at or above O(target_qps), else the lowest load.'
    type: float
  k_schedule:
    description:
      - 'k: Derive a C(num_speculative_tokens_per_batch_size) schedule (vLLM 0.24 and newer) from the best k at each load,
        returned in C(k.schedule) of RV(k), drawn in the report beside the measured curve. A prediction, to confirm with an A/B.'
      - The best k at each load (C(k.per_load)) is returned either way when the candidate's k is known.
    type: bool
    default: false
  k_schedule_min_gain:
    description:
      - 'k: Hysteresis of the schedule. Going up in batch size, k changes only where the new k''s expected gain beats the
        held k''s by more than this fraction at that load; k never rises with batch size.'
    type: float
    default: 0.05
  schedule:
    description:
      - 'k: The schedule O(schedule_url) runs (vLLM''s C([[range_start, range_end, k], ...])). Defaults to the one the sweep
        derives with O(k_schedule).'
    type: list
    elements: raw
  schedule_loads:
    description:
      - 'k: The two swept loads of the schedule''s A/B (default as described in O(schedule_url)).'
    type: list
    elements: float
  fixed_k:
    description:
      - 'k: The C(num_speculative_tokens) O(fixed_url) serves; checked against its C(/metrics) (per-position series). Defaults to
        what its C(/metrics) shows.'
    type: int
  report_dir:
    description:
      - 'Report: Folder for the JSON, the report, the plots and the progress log.'
    type: path
    required: true
  report_name:
    description:
      - 'Report: Base name of the report files.'
    type: str
    default: sweep
  report_context:
    description:
      - 'Report: The report''s context, as for M(alauda.spec_decoding.spec_benchmark) (C(gpu_model), C(gpu_count), C(model),
        C(dtype), C(vllm_version), C(image), C(baseline_command), C(candidate_command); optional C(hardware_notes),
        C(candidate_env), C(speculative_config), C(notes)). The report is refused without the required ones.'
    type: dict
    default: {}
  resume_from:
    description:
      - 'Report: A previous run''s JSON (C(<report_dir>/<report_name>.json)); its finished measurements are reused.'
    type: path
  tolerances:
    description:
      - 'Report: How much worse C(ttft), C(tpot) (higher) or C(throughput) (lower) may be and still count, as fractions.'
    type: dict
    default: {}
requirements:
  - prometheus_client
  - matplotlib >= 3.8 (for the PNG plots, O(plots=true))
extends_documentation_fragment:
  - alauda.spec_decoding.benchmark_protocol
  - alauda.spec_decoding.load_job
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
notes:
  - In check mode with O(load_from=cluster) the first load Job's objects are sent as a server-side dry run (the API server's
    admission and the identity's rights answer) and nothing is measured; the result has C(load_job) and no sweep.
  - C(changed) is always false. The module sends inference requests and writes only its own report files.
  - The plots are drawn with matplotlib on the host that runs the module, axes labelled with units. Without it,
    O(plots=true) is refused before the first request, naming the package and how to install it; set O(plots=false)
    to run without plots.
seealso:
  - module: alauda.spec_decoding.spec_benchmark
"""

EXAMPLES = r"""
- name: Read what each engine really runs from its predictor log
  alauda.spec_decoding.engine_config_info:
    name: "{{ item }}"
    namespace: models
    expected_from_inference_service: false
  loop: [llama-baseline, llama-ngram]
  register: engines

- name: Up to what load does ngram pay, and with which k
  alauda.spec_decoding.spec_sweep:
    baseline_url: http://llama-baseline.models.svc
    candidate_url: http://llama-ngram.models.svc
    request_rates: [1, 2, 4, 8]
    target_qps: 4
    method: ngram
    k_candidates: [1, 2, 3, 4, 5]
    report_dir: /tmp/tune
    report_context: "{{ my_context }}"
    # what each engine really runs, from its start-up log (refused before any request if it contradicts the sweep)
    baseline_engine_config: "{{ engines.results[0] }}"
    candidate_engine_config: "{{ engines.results[1] }}"
  register: sweep

- name: Confirm the predicted k on a second endpoint, reusing the sweep's measurements
  alauda.spec_decoding.spec_sweep:
    baseline_url: http://llama-baseline.models.svc
    candidate_url: http://llama-ngram.models.svc
    request_rates: [1, 2, 4, 8]
    target_qps: 4
    method: ngram
    k_candidates: [1, 2, 3, 4, 5]
    confirm_url: http://llama-ngram-k2.models.svc
    confirm_k: "{{ sweep.k.prediction.predicted_k }}"
    resume_from: /tmp/tune/sweep.json
    report_dir: /tmp/tune
    report_context: "{{ my_context }}"

# Load: a concurrency sweep whose requests come from a Job next to the services (cluster-internal URLs), so the
# controller's network is not in the timings; one Job per measurement, so a rerun with resume_from goes on from there.
- name: Concurrency sweep from inside the cluster
  alauda.spec_decoding.spec_sweep:
    baseline_url: http://llama-baseline-predictor.models.svc.cluster.local
    candidate_url: http://llama-eagle3-predictor.models.svc.cluster.local
    concurrencies: [1, 4, 16, 32]
    method: eagle3
    load_from: cluster
    load_job:
      namespace: models
      image: vllm/vllm-openai:v0.32.0  # the runtime image the nodes already have; it needs only python3
      node_selector:
        node-role.kubernetes.io/worker: ""
    report_dir: /tmp/tune-cluster
    report_context: "{{ my_context }}"

# k: derive a num_speculative_tokens_per_batch_size schedule (vLLM 0.24 and newer) from the best k at each load. The
# candidate runs the largest k, so every slot is measured.
- name: Sweep and derive a k schedule
  alauda.spec_decoding.spec_sweep:
    baseline_url: http://llama-baseline.models.svc
    candidate_url: http://llama-ngram-k5.models.svc
    concurrencies: [1, 2, 4, 8, 16, 32]
    method: ngram
    k_candidates: [1, 2, 3, 4, 5]
    k_schedule: true
    k_schedule_min_gain: 0.05
    report_dir: /tmp/tune-schedule
    report_context: "{{ my_context }}"
  register: schedule_sweep

# Endpoints: the schedule (deployed on schedule_url) against the best fixed k (fixed_url), at two of the swept loads;
# resume_from reuses the sweep, so only the schedule's A/B is measured. k.schedule_confirmation has the verdicts.
- name: Confirm the schedule against the best fixed k
  alauda.spec_decoding.spec_sweep:
    baseline_url: http://llama-baseline.models.svc
    candidate_url: http://llama-ngram-k5.models.svc
    concurrencies: [1, 2, 4, 8, 16, 32]
    method: ngram
    k_candidates: [1, 2, 3, 4, 5]
    k_schedule: true
    schedule_url: http://llama-ngram-schedule.models.svc
    schedule: "{{ schedule_sweep.k.schedule.schedule }}"
    fixed_url: http://llama-ngram-k3.models.svc
    fixed_k: 3
    schedule_loads: [1, 16]
    resume_from: /tmp/tune-schedule/sweep.json
    report_dir: /tmp/tune-schedule
    report_context: "{{ my_context }}"
  register: schedule_ab
"""

RETURN = r"""
load_job:
  description:
    - The first load Job sent as a server-side dry run (check mode with O(load_from=cluster)); nothing was measured.
  returned: in check mode with O(load_from=cluster)
  type: dict
  sample: {namespace: models, name: spec-decoding-load-1a2b3c4d, image: "vllm/vllm-openai:v0.32.0", dry_run: true}
points:
  description:
    - One entry per load, with C(kind), C(load), C(speedup), C(decision), C(reasons), and per side (C(baseline), C(candidate))
      C(ttft_ms), C(tpot_ms), C(itl_ms) (C(median), C(p99)), C(output_throughput), C(completed), C(failed); the candidate
      also has C(acceptance).
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: list
  elements: dict
break_even:
  description:
    - C(status) (V(crossed), V(pays_everywhere), V(pays_nowhere)), C(last_keep_load), C(first_roll_back_load),
      C(crossover_load) (null with a C(reason) when it pays everywhere or nowhere), C(crossed_first), C(reason).
    - For the request-rate points, else the concurrency points.
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: dict
break_even_by_kind:
  description: The break-even of each load kind swept.
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: dict
decision:
  description: The keep/roll_back decision at the sweep point at or above O(target_qps) (C(load), C(decision), C(speedup)).
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: dict
classes:
  description:
    - Per request class, when the prompts name classes (O(prompts_file)), over the request-rate loads (else the concurrencies),
      C(kind), C(target_qps), C(classes), C(counters_check) (per load, the per-request sums against the candidate's /metrics
      deltas), C(speculative_classes) (the classes the guard sends to the speculative pool at O(target_qps)), C(notes).
    - Each of C(classes) has C(class) (null for prompts without one), C(loads) (per load C(requests), C(acceptance) from the
      responses' own C(metrics.speculative_decoding) or not reported, C(latency) medians with their 95% intervals,
      C(output_rate), C(speedup), C(decision), C(reasons)), C(break_even) (as RV(break_even)), C(break_even_text),
      C(target) (with O(target_qps), the decision at its sweep point with C(confidence) and C(gain_confidence)) and C(guard)
      (with O(target_qps), C(pool) V(speculative) or V(baseline), C(break_even_load), C(reason)).
  returned: when the prompts name request classes
  type: dict
checks:
  description:
    - Per side (C(baseline), C(candidate), C(confirm)) what was found before the first request, C(engine_line) (the
      printed speculative config, V(not found in the log) or V(not given)) and C(metrics).
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: dict
  sample: {"baseline": {"engine_line": "speculative_config=None", "metrics": "no vllm:spec_decode_* counters"},
           "candidate": {"engine_line": "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5)",
                         "metrics": "vllm:spec_decode_* counters, 5 per-position series"}}
k:
  description:
    - C(prediction) (table of expected tokens, cost and gain per k, C(predicted_k)), C(confirmation) (C(status) V(confirmed),
      V(rejected) or V(not_measured), measured speedups beside the prediction), C(recommended_k) (set only from a measured
      A/B), C(current_k) and C(reason).
    - C(per_load) (the candidate's k known) the best k at each load from that load's curve and verify cost, with
      C(batch_size), C(gains), C(measured_speedup); C(schedule) (with O(k_schedule)) C(schedule) (vLLM's
      C([[range_start, range_end, k], ...]) or null), C(describe), C(steps) (per load the held and chosen k and why), C(notes).
    - C(schedule_confirmation) (with O(schedule_url)) C(status) (V(confirmed), V(not_confirmed), V(inconclusive)), C(schedule),
      C(describe), C(fixed_k), C(loads) (per load C(load), C(batch_size), C(scheduled_k), C(schedule) and C(fixed) with
      C(tpot_ms) and C(itl_ms) medians, C(speedup), C(noise), C(verdict), C(reason)), C(reason), C(notes).
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: dict
resumed:
  description: Measurements reused from O(resume_from).
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: int
measured:
  description: Measurements taken in this run.
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: int
report_markdown:
  description: Path of the Markdown report.
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: str
report_json:
  description: Path of the JSON report (also the resume file).
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: str
plots:
  description: Paths of the PNG plots (C(load), C(k); C(classes) when the prompts name request classes).
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: dict
notes:
  description: What could not be checked or needs attention.
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: list
  elements: str
progress_file:
  description: Path of the progress log.
  returned: when the sweep ran (not in check mode with O(load_from=cluster))
  type: str
"""


import functools

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job as bench_load_job
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep as spec_sweep
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.prometheus_text import require_prometheus_client


def argument_spec():
    return dict(
        baseline_url=dict(type="str", required=True),
        candidate_url=dict(type="str", required=True),
        request_rates=dict(type="list", elements="float"),
        concurrencies=dict(type="list", elements="int"),
        max_concurrency=dict(type="int", default=64),
        target_qps=dict(type="float"),
        method=dict(type="str"),
        k_candidates=dict(type="list", elements="int"),
        current_k=dict(type="int"),
        verify_cost_ratio=dict(type="float"),
        baseline_engine_config=dict(type="dict"),
        candidate_engine_config=dict(type="dict"),
        confirm_engine_config=dict(type="dict"),
        confirm_url=dict(type="str"),
        confirm_model=dict(type="str"),
        confirm_k=dict(type="int"),
        confirm_load=dict(type="float"),
        k_schedule=dict(type="bool", default=False),
        k_schedule_min_gain=dict(type="float", default=0.05),
        schedule_url=dict(type="str"),
        schedule_model=dict(type="str"),
        schedule=dict(type="list", elements="raw"),
        fixed_url=dict(type="str"),
        fixed_model=dict(type="str"),
        fixed_k=dict(type="int"),
        schedule_loads=dict(type="list", elements="float"),
        resume_from=dict(type="path"),
        **bench_run.protocol_arg_spec(report_name="sweep"),
        **bench_load_job.arg_spec(),
    )


def execute(module):
    require_prometheus_client(module)
    return spec_sweep.run_sweep(module.params, api_client=functools.partial(bench_load_job.module_api_client, module),
                                check_mode=module.check_mode)


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        required_one_of=[("request_rates", "concurrencies")],
        required_by={"confirm_url": ("confirm_k",), "confirm_engine_config": ("confirm_url",), "k_candidates": ("method",)},
        required_together=[("schedule_url", "fixed_url")],
    ),
    failure=dict(
        unexpected="spec_sweep",
        unexpected_types=OSError,  # a report file that cannot be written
    ),
    cluster=False,
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
