#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: spec_benchmark
short_description: A/B benchmark of a baseline and a speculative-decoding vLLM endpoint, with a keep/roll-back decision
version_added: 0.1.0
description:
  - Sends the same fixed list of prompts, in the same order and with identical request parameters, to a baseline
    and a candidate (speculative decoding) OpenAI-compatible endpoint, streaming with usage, and measures every
    request the way C(vllm bench serve) does. TTFT is the first streamed chunk, ITL the gap between chunks (per
    chunk, not per token), E2EL the last chunk, and TPOT = (E2EL - TTFT) / (output tokens - 1) with output tokens
    from C(usage.completion_tokens).
  - Follows the guide's protocol. Temperature 0, a fixed seed and O(max_tokens) (default 1024). At least 3 warmup
    requests per side are discarded. Each prompt runs 5 to 10 times. The report gives medians (not means)
    with p90 and p99, output tokens/s and requests/s. Concurrency and a target request rate are configurable.
  - Reads the candidate's C(/metrics) before and after the measured requests. From the deltas it reports mean
    acceptance length, acceptance rate and per-position rates, and the ceiling conversion
    (speedup / mean acceptance length). It also reports, for both sides, whether prefix caching is on and the
    prefix cache hit rate, so cache effects are not mistaken for speculative-decoding gains.
  - Decides V(keep) only if median TPOT (per-token latency) or the output rate is better beyond the noise at the
    target load (a rank test on the per-request samples), and none of median TTFT, median TPOT and the output rate is
    worse beyond its O(tolerances) by the same test; else V(roll_back) with the reasons. An identical pair is kept
    at most 5% of the time (the error rates are in docs/rollback.md).
  - Flags requests whose stream reached the benchmark in bursts, that is at least 8 chunks with a median gap
    between chunks under 0.1 ms. No engine streams that fast; buffered bytes are read that fast. The cause is an
    ingress, proxy or service mesh that buffers the response (for example nginx C(proxy_buffering)), or a
    benchmark client starved of CPU. Such requests' TTFT is the whole request's latency and their ITL and TPOT
    are near zero. Each side with such requests gets a note. If more than 10% of either side's completed
    requests arrived in bursts, the decision is V(roll_back), because that side was not measured per token.
  - Writes a Markdown and a JSON report and PNG plots (per-position acceptance curve; latency distributions
    baseline vs candidate) to O(report_dir). It refuses, before sending any request, to produce a report
    missing any of the guide's required fields. Those are Hardware (GPU model and count), Model (identifier
    and dtype), Runtime (vLLM version, image), Request parameters, and the baseline and speculative-decoding
    commands.
  - One endpoint can be measured in two phases around a rollout. Run O(phase=baseline) before it (this saves
    the measurements to O(baseline_results)), roll out, then run O(phase=candidate).
  - A module cannot stream output. Progress goes to O(progress_file), one line per request (C(tail -f) it).
  - "Options by group: each option's description starts with its group (ansible-doc lists options alphabetically).
    B(Endpoints): O(baseline_url) and O(candidate_url), their C(*_model) names, O(phase) (both in one run, or one endpoint
    before and after a rollout), and the HTTP settings (O(bearer_token), O(headers), O(timeout), O(validate_certs),
    O(ca_path)). B(Load): what is sent and how hard: O(concurrency) or O(request_rate) with O(arrival), the prompts and the
    protocol (O(temperature), O(max_tokens), O(seed)), and where the requests come from (O(load_from), O(load_job): a Job
    next to the services). B(Report): O(report_dir), O(report_name), O(report_context), O(baseline_results), the decision's
    O(tolerances), O(plots), O(title) and O(progress_file). The k of speculative decoding is chosen with
    M(alauda.spec_decoding.spec_sweep)."
  - "Modes, each with an example in EXAMPLES: both endpoints in one run, from a Job in the cluster (O(load_from=cluster)) or
    from this host at a paced request rate; one endpoint in two phases around a rollout (O(phase))."
author:
  - Alauda Platform Team (@alauda)
options:
  baseline_url:
    description:
      - 'Endpoints: Base URL of the baseline server (no speculative decoding), for example V(http://llama.ns.svc:8080).
        A trailing C(/v1) is accepted.'
      - Required unless O(phase=candidate).
    type: str
  baseline_model:
    description:
      - 'Endpoints: Served model name of the baseline. Defaults to the first id of the server''s C(GET /v1/models).'
    type: str
  candidate_url:
    description:
      - 'Endpoints: Base URL of the speculative-decoding server. Required unless O(phase=baseline).'
    type: str
  candidate_model:
    description:
      - 'Endpoints: Served model name of the candidate. Defaults to the first id of the server''s C(GET /v1/models).'
    type: str
  phase:
    description:
      - 'Endpoints: V(both) measures O(baseline_url) and then O(candidate_url) and writes the report.'
      - V(baseline) measures O(baseline_url) only and saves the measurements to O(baseline_results).
      - V(candidate) measures O(candidate_url), loads the baseline measurements from O(baseline_results), and
        writes the report. The request parameters must equal those of the baseline phase.
    type: str
    choices: [both, baseline, candidate]
    default: both
  bearer_token:
    description:
      - 'Endpoints: Bearer token for both endpoints (C(Authorization) header).'
    type: str
  headers:
    description:
      - 'Endpoints: Extra HTTP headers for both endpoints.'
    type: dict
    default: {}
  timeout:
    description:
      - 'Endpoints: Seconds to wait for each response chunk before the request counts as failed.'
    type: float
    default: 600
  concurrency:
    description:
      - 'Load: Requests in flight at once (the target load).'
    type: int
    default: 1
  request_rate:
    description:
      - 'Load: Target requests per second. Requests are released at this rate and still bounded by O(concurrency).
        Unset means all at once.'
    type: float
  arrival:
    description:
      - 'Load: Arrival process for O(request_rate). V(poisson) gives exponential gaps, V(fixed) equal gaps. Both are
        seeded by O(seed).'
    type: str
    choices: [poisson, fixed]
    default: poisson
  api:
    description:
      - 'Load: OpenAI API to call. V(chat) sends C(messages) to C(/v1/chat/completions); a plain prompt is one user
        message with one text part, the request shape of C(vllm bench serve --backend openai-chat).
        V(completions) sends C(prompt) to C(/v1/completions).'
    type: str
    choices: [chat, completions]
    default: chat
  workload:
    description:
      - 'Load: Built-in workload. V(code_refactor) asks to add docstrings and type hints to a 30-line Python class and
        return it whole. V(general_chat) asks to explain a concept in at least 800 words.'
      - Ignored when O(prompts_file) is given.
    type: str
    choices: [code_refactor, general_chat]
    default: code_refactor
  prompts_file:
    description:
      - 'Load: JSONL file of prompts, one per line. Each line is a JSON string, or an object with C(prompt) or
        C(messages), an optional C(id) and an optional C(class) (a request class such as V(code): the report then adds a
        decision per class, see RV(report_json)). The file order is kept.'
    type: path
  num_prompts:
    description:
      - 'Load: Use only the first N prompts of the workload or file.'
    type: int
  runs_per_prompt:
    description:
      - 'Load: Measured runs of each prompt (the guide asks for 5 to 10). Rounds go over the prompts in order.'
    type: int
    default: 5
  warmup:
    description:
      - 'Load: Warmup requests per side, discarded (at least 3).'
    type: int
    default: 3
  extra_body:
    description:
      - 'Load: Further request fields sent to both sides, for example C(ignore_eos) or C(top_p). The report lists them
        as sampling switches. They cannot override the fields the module sets.'
    type: dict
    default: {}
  scrape_metrics:
    description:
      - 'Load: Read C(/metrics) of both sides before and after the measured requests (acceptance and prefix cache).'
    type: bool
    default: true
  report_dir:
    description:
      - 'Report: Folder for the report, plots, raw per-request measurements and the progress log.'
    type: path
    required: true
  report_name:
    description:
      - 'Report: Base name of the report files.'
    type: str
    default: report
  report_context:
    description:
      - 'Report: The report''s context. Fields the module cannot measure are read from the cluster by the
        C(alauda.spec_decoding.benchmark) role or given by the user.'
      - Keys are C(gpu_model), C(gpu_count), C(model) (identifier), C(dtype), C(vllm_version), C(image),
        C(baseline_command) and C(candidate_command) (string or argv list). These are required.
      - Without C(model) or C(dtype), they are read from C(candidate_command) (C(--served-model-name) or C(--model);
        C(--dtype)), also inside C(bash -c) scripts, with C($VARS) expanded from C(candidate_env) (a dict or
        KServe's list of C(name)/C(value)).
      - Optional keys are C(candidate_env), C(hardware_notes), C(speculative_config) and C(notes).
    type: dict
    default: {}
  baseline_results:
    description:
      - 'Report: File holding the baseline phase''s measurements. Defaults to C(baseline-results.json) in O(report_dir).'
    type: path
  tolerances:
    description:
      - 'Report: How much worse a metric may be and still count as improved, as a fraction. Keys are C(ttft) and
        C(tpot) (median latency may be up to that fraction higher) and C(throughput) (output tokens/s may be up
        to that fraction lower). Each defaults to 0.'
    type: dict
    default: {}
requirements:
  - prometheus_client (for O(scrape_metrics=true))
  - matplotlib >= 3.8 (for the PNG plots, O(plots=true))
extends_documentation_fragment:
  - alauda.spec_decoding.benchmark_protocol
  - alauda.spec_decoding.load_job
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
notes:
  - C(changed) is always false. The module only sends inference requests and writes its own report files; with
    O(load_from=cluster) it also creates the load Job and deletes it again.
  - In check mode with O(load_from=cluster) the load Job's objects are sent as a server-side dry run (the API server's
    admission and the identity's rights answer) and nothing is measured; the result has C(load_job) and no decision.
    A load from the controller measures in check mode too (it changes nothing).
  - The plots are drawn with matplotlib on the host that runs the module. Without it, O(plots=true) is refused
    before the first request, naming the package and how to install it; set O(plots=false) to run without plots.
  - Prefix caching is on by default in vLLM V1. Either turn it off on both sides (C(--no-enable-prefix-caching))
    or read the hit rates in the report.
  - Whether prefix caching is on is read from the C(enable_prefix_caching) label of the C(vllm:cache_config_info)
    gauge (vLLM 0.10 and later). If it is on for one side only, the report notes it and the fix (the same
    setting on both InferenceServices). If the server has no such gauge, the setting is reported as unknown.
seealso:
  - name: vllm bench serve
    description: The reference benchmark whose metric definitions this module follows.
    link: https://docs.vllm.ai/en/latest/cli/bench/serve.html
"""

EXAMPLES = r"""
- name: A/B the deployed pair and decide (cluster-internal URLs, so the requests come from a Job in models)
  alauda.spec_decoding.spec_benchmark:
    baseline_url: http://llama-baseline-predictor.models.svc.cluster.local
    candidate_url: http://llama-eagle3-predictor.models.svc.cluster.local
    load_job:
      namespace: models
      image: vllm/vllm-openai:v0.32.0
    workload: code_refactor
    concurrency: 4
    report_dir: /tmp/spec-bench
    report_context:
      gpu_model: NVIDIA-A100-SXM4-80GB
      gpu_count: 1
      model: meta-llama/Llama-3.1-8B-Instruct
      dtype: bfloat16
      vllm_version: 0.32.0
      image: vllm/vllm-openai:v0.32.0
      baseline_command: "python3 -m vllm.entrypoints.openai.api_server --model /mnt/models"
      candidate_command: "python3 -m vllm.entrypoints.openai.api_server --model /mnt/models --speculative-config '{...}'"
  register: bench

- name: Show the decision
  ansible.builtin.debug:
    msg: "{{ bench.decision }}: {{ bench.reasons | join('; ') }} (report {{ bench.report_markdown }})"

- name: A/B from a Job next to the services (what load_from=auto does for these cluster-internal URLs off the cluster)
  alauda.spec_decoding.spec_benchmark:
    baseline_url: http://llama-baseline-predictor.models.svc.cluster.local
    candidate_url: http://llama-eagle3-predictor.models.svc.cluster.local
    load_from: cluster
    load_job:
      namespace: models
      image: vllm/vllm-openai:v0.32.0
      node_selector:
        node-role.kubernetes.io/worker: ""
    report_dir: /tmp/spec-bench
    report_context: "{{ my_context }}"

- name: A/B from this host at a paced request rate (Poisson arrivals, seeded), through the ingress both services share
  alauda.spec_decoding.spec_benchmark:
    baseline_url: https://llama-baseline.apps.example.com
    candidate_url: https://llama-eagle3.apps.example.com
    load_from: controller
    request_rate: 2.0
    arrival: poisson
    seed: 42
    bearer_token: "{{ my_token }}"
    tolerances: {ttft: 0.05, tpot: 0.0, throughput: 0.02}
    report_dir: /tmp/spec-bench-paced
    report_context: "{{ my_context }}"

- name: One endpoint, two phases - before the rollout (an address this host reaches, so the requests go from here)
  alauda.spec_decoding.spec_benchmark:
    phase: baseline
    baseline_url: https://llama.apps.example.com
    report_dir: /tmp/spec-bench

- name: One endpoint, two phases - after the rollout
  alauda.spec_decoding.spec_benchmark:
    phase: candidate
    candidate_url: https://llama.apps.example.com
    report_dir: /tmp/spec-bench
    report_context: "{{ my_context }}"
"""

RETURN = r"""
load_job:
  description:
    - The load Job sent as a server-side dry run (check mode with O(load_from=cluster)); nothing was measured.
  returned: in check mode with O(load_from=cluster)
  type: dict
  sample: {namespace: models, name: spec-decoding-load-1a2b3c4d, image: "vllm/vllm-openai:v0.32.0", dry_run: true}
decision:
  description: V(keep) or V(roll_back). Not returned for O(phase=baseline).
  returned: when a report was written
  type: str
  sample: keep
reasons:
  description: Why the decision came out as it did.
  returned: when a report was written
  type: list
  elements: str
speedup:
  description: Output tokens/s of the candidate divided by the baseline's.
  returned: when a report was written
  type: float
  sample: 1.62
comparison:
  description: Medians and changes, wall-time delta, acceptance numbers and ceiling conversion.
  returned: when a report was written
  type: dict
acceptance:
  description:
    - The candidate's speculative-decoding numbers over the measured run, from C(/metrics) deltas. The keys
      are C(mean_acceptance_length), C(acceptance_rate) (a fraction), C(per_position) and the counts.
  returned: when a report was written and the candidate exposes the counters
  type: dict
baseline:
  description:
    - Baseline summary (medians, p90, p99, throughputs), prefix cache and warmup info.
    - C(prefix_cache) holds C(hits) and C(queries) (tokens) and C(hit_rate) over the measured requests, from
      C(/metrics) deltas, and C(enabled). C(enabled) is V(true) or V(false) from the C(enable_prefix_caching)
      label of C(vllm:cache_config_info) read after the measured requests, or null when the server does not
      expose it. If engines disagree, it is V(true) when any engine caches. C(prefix_cache) is null when
      C(/metrics) was not read or has neither the counters nor the gauge. Baselines saved before C(enabled)
      existed lack the key (unknown).
    - The summary's C(burst_delivered) counts the completed requests whose stream arrived in bursts (at least 8
      chunks, median gap between chunks under 0.1 ms). C(burst_delivered_median_gap_ms) is the median gap between
      those requests' chunks (null when there are none). Baselines saved before these keys existed count as 0.
    - C(client) says whether the side's load client kept up with its schedule, C(kept_up) (with C(why) when not), from
      C(send_lag_ms) (C(p50), C(p99), C(max)) and C(cpu_ratio_max) (the client's CPU over its measured requests, of a
      core); C(sent_from) is V(controller) or V(load_job) (then C(pods), C(start_skew_s)). Baselines saved before it
      existed lack the key.
  returned: always
  type: dict
candidate:
  description: Candidate summary, as for RV(baseline).
  returned: when the candidate was measured
  type: dict
notes:
  description:
    - The report's notes, also in its Notes section. They cover prefix cache differences, missing or idle
      speculative-decoding counters, and burst-delivered requests on either side.
  returned: when a report was written
  type: list
  elements: str
report_markdown:
  description: Path of the Markdown report.
  returned: when a report was written
  type: str
report_json:
  description: Path of the JSON report; its C(classes) holds the per-class section when the prompts name request classes.
  returned: when a report was written
  type: str
plots:
  description: Paths of the PNG plots (C(acceptance), C(latency)).
  returned: when a report was written
  type: dict
requests_file:
  description: Path of the raw per-request measurements (JSON).
  returned: always
  type: str
baseline_results:
  description: Path of the saved baseline measurements.
  returned: when O(phase=baseline)
  type: str
progress_file:
  description: Path of the progress log. With O(load_from=cluster) it also has the Job's own progress lines.
  returned: when something was measured
  type: str
"""


import functools

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job as bench_load_job
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import run as bench_run
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.prometheus_text import require_prometheus_client


def argument_spec():
    return dict(
        **bench_load_job.arg_spec(),
        baseline_url=dict(type="str"),
        candidate_url=dict(type="str"),
        phase=dict(type="str", choices=["both", "baseline", "candidate"], default="both"),
        baseline_results=dict(type="path"),
        concurrency=dict(type="int", default=1),
        request_rate=dict(type="float"),
        **bench_run.protocol_arg_spec(report_name="report"),
    )


def execute(module):
    if module.params["scrape_metrics"]:
        require_prometheus_client(module)

    return bench_run.benchmark(module.params, api_client=functools.partial(bench_load_job.module_api_client, module),
                               check_mode=module.check_mode)


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        required_if=[
            ("phase", "both", ("baseline_url", "candidate_url")),
            ("phase", "baseline", ("baseline_url",)),
            ("phase", "candidate", ("candidate_url",)),
        ],
    ),
    failure=dict(
        unexpected="spec_benchmark",
        unexpected_types=OSError,  # a report file that cannot be written
    ),
    cluster=False,
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
