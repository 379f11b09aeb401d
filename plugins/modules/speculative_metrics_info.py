#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: speculative_metrics_info
short_description: Read vLLM's speculative-decoding acceptance from /metrics or its SpecDecoding log lines, with a diagnosis
version_added: 0.1.0
description:
  - Reads the C(vllm:spec_decode_*) counters from a /metrics page (O(url), O(metrics_text), O(metrics_path),
    or the predictor pods of an InferenceService / one pod through the API server's pod proxy), sums them over
    C(engine) series (and pods), and derives the acceptance numbers.
  - Without a /metrics source, or when it has no spec_decode counters, reads the periodic
    C(SpecDecoding metrics:) lines (vLLM 0.8.5 to 0.34, and the V0 C(Speculative metrics:) form) from
    O(log_text) or O(log_path); every window is parsed and the totals are weighted by drafted tokens.
  - With O(interval) it scrapes twice and reports the window's deltas.
  - Returns RV(diagnosis) with C(status) V(healthy), V(unsuitable_workload) (per-position acceptance collapses
    by slot 2, or a model-free method is almost never accepted), V(likely_draft_mismatch) (a draft-based method
    with acceptance near zero) or V(no_data), and the numbers behind it.
  - No data is not a failure unless thresholds were given.
  - A spec_decode metric or label, or a C(SpecDecoding metrics:) field, that the collection does not know (a vLLM newer
    than vLLM 0.34) is passed over, listed in RV(not_understood) and named in one warning; what is known is read as before.
author:
  - Alauda Platform Team (@alauda)
options:
  url:
    description: A /metrics URL, e.g. V(http://127.0.0.1:8000/metrics).
    type: str
  metrics_text:
    description: A /metrics page as text.
    type: str
  metrics_path:
    description: Path of a saved /metrics page on the host that runs the module.
    type: path
  name:
    description: InferenceService whose predictor pods are scraped through the API server's pod proxy (counters summed over pods).
    type: str
  pod:
    description: One pod to scrape through the API server's pod proxy.
    type: str
  namespace:
    description: Namespace of O(name) or O(pod).
    type: str
    default: default
  port:
    description:
      - Port of vLLM's HTTP server in the pod, a number or the name of a container port (the pod proxy needs the
        number, so a name is looked up in the pod's spec).
      - Without it, each pod's port is found from its spec - the C(--port) value in the command/args of O(container)
        (what vLLM binds; KServe's C(--http_port) too), else that container's port named C(http)/C(http1)/C(h2c)/C(metrics)
        or its first TCP containerPort, else V(8080) (KServe's default).
    type: str
  scheme:
    description:
      - Scheme the API server uses to reach the pod (C(https:<pod>:<port>) in the proxy path).
      - Without it, V(https) when O(container) runs vLLM with C(--ssl-certfile), else V(http).
    type: str
    choices: [http, https]
  proxy_path:
    description: Path of the metrics page on the pod.
    type: str
    default: /metrics
  log_text:
    description: Log text holding C(SpecDecoding metrics:) lines (used when no /metrics source is given or it has no counters).
    type: str
  log_path:
    description: Path of a log file holding C(SpecDecoding metrics:) lines.
    type: path
  log_fallback:
    description:
      - With O(name) or O(pod), when the pod proxy fails or the page has no spec_decode counters, read the
        C(SpecDecoding metrics:) lines from the pods' logs through the API server instead.
    type: bool
    default: true
  container:
    description: Container running vLLM, whose spec gives the port and scheme and whose log is read by O(log_fallback).
    type: str
    default: kserve-container
  since_seconds:
    description: With O(log_fallback), only read log lines newer than this many seconds.
    type: int
  model_name:
    description: Only count series whose C(model_name) label (the served model name) is this.
    type: str
  method:
    description:
      - Speculative method, used by the diagnosis (a draft-based method near 0% means a mismatched draft;
        a model-free one means an unsuitable workload). With O(name) it defaults to the method in the
        InferenceService's C(--speculative-config).
    type: str
  interval:
    description: Seconds between two scrapes; the result covers only that window. V(0) reports totals since start.
    type: float
    default: 0
  min_mean_acceptance_length:
    description: Fail when the mean acceptance length (1 + accepted/drafts) is below this (or there is no data).
    type: float
  min_acceptance_rate:
    description: Fail when the draft acceptance rate (a fraction, 0.35 for 35%) is below this (or there is no data).
    type: float
  mismatch_rate:
    description: Acceptance at or below this fraction diagnoses a draft-based method as C(likely_draft_mismatch).
    type: float
    default: 0.05
  collapse_rate:
    description: A per-position rate at slot 2 below this diagnoses C(unsuitable_workload).
    type: float
    default: 0.10
  headers:
    description: Extra HTTP headers for O(url).
    type: dict
  bearer_token:
    description: Token sent as C(Authorization Bearer) to O(url).
    type: str
  timeout:
    description: Seconds allowed for each HTTP or API server request.
    type: int
    default: 30
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
  - kubernetes.core.k8s_auth_options
notes:
  - O(validate_certs) applies to O(url) too.
  - The kube auth options are used only with O(name) or O(pod); these need get on pods/proxy, list on pods (O(name))
    and get on pods (to find the port and scheme; not needed when both O(port) as a number and O(scheme) are given).
  - The pod proxy of the API server reaches the pod's own IP; the counters of all predictor pods are summed.
  - Needs the C(prometheus_client) Python library for /metrics sources.
  - Log windows do not print the number of drafts; it is derived from the printed rates (RV(num_drafts_estimated)).
seealso:
  - module: alauda.spec_decoding.engine_config_info
"""

EXAMPLES = r"""
- name: Acceptance of every predictor pod, summed, over a 60 s window
  alauda.spec_decoding.speculative_metrics_info:
    name: llama
    namespace: models
    interval: 60
    min_mean_acceptance_length: 1.5
  register: acceptance

- name: One pod whose vLLM serves TLS on a named container port
  alauda.spec_decoding.speculative_metrics_info:
    pod: llama-predictor-5d9c8b7f6-x2x7q
    namespace: models
    port: https
    scheme: https

- name: From a local vLLM
  alauda.spec_decoding.speculative_metrics_info:
    url: http://127.0.0.1:8000/metrics
    model_name: llama
    method: eagle3

- name: From the log when /metrics is not reachable
  alauda.spec_decoding.speculative_metrics_info:
    log_path: /tmp/vllm.log
"""

RETURN = r"""
source:
  description: Where the numbers come from.
  returned: always
  type: str
  choices: [prometheus, log]
has_data:
  description: Whether there were drafted tokens to measure.
  returned: always
  type: bool
num_drafts:
  description: Number of drafts (speculation steps); estimated from the printed rates for the log source.
  returned: always
  type: int
num_draft_tokens:
  description: Draft tokens proposed.
  returned: always
  type: int
num_accepted_tokens:
  description: Draft tokens accepted.
  returned: always
  type: int
accepted_tokens_per_position:
  description: Accepted tokens per draft position.
  returned: always
  type: list
  elements: int
mean_acceptance_length:
  description: 1 + accepted/drafts (counts the bonus token).
  returned: always
  type: float
  sample: 2.59
draft_acceptance_rate:
  description: accepted/draft tokens, a fraction.
  returned: always
  type: float
  sample: 0.394
per_position_acceptance_rate:
  description: Accepted at position i / drafts.
  returned: always
  type: list
  elements: float
num_drafts_estimated:
  description: Whether RV(num_drafts) was derived from rounded log numbers.
  returned: always
  type: bool
diagnosis:
  description: C(status) (healthy, unsuitable_workload, likely_draft_mismatch, no_data), C(reason) and the numbers behind it.
  returned: always
  type: dict
  sample: {"status": "likely_draft_mismatch", "reason": "draft tokens are almost never accepted (0.0% of 3078 ...)",
           "draft_acceptance_rate": 0.0, "method": "eagle3"}
windows:
  description: Every parsed log window (the last 1000), with its own numbers.
  returned: when source is log
  type: list
  elements: dict
windows_total:
  description: Number of log windows parsed.
  returned: when source is log
  type: int
pods:
  description: Per pod (with O(name)) the pod name and its own summary.
  returned: with name
  type: list
  elements: dict
endpoints:
  description: Per pod scraped through the pod proxy, where /metrics was read and why that port and scheme.
  returned: with name or pod, when /metrics was read through the pod proxy
  type: list
  elements: dict
  sample: [{"pod": "llama-predictor-5d9c8b7f6-x2x7q", "scheme": "http", "port": 8080, "path": "/metrics",
            "how": "port 8080 from containerPort of kserve-container"}]
interval:
  description: Seconds between the two scrapes (0 for totals since start).
  returned: always
  type: float
notes:
  description: How the source was chosen (for example that /metrics failed and the log was read instead).
  returned: always
  type: list
  elements: str
not_understood:
  description:
    - What the sources read hold that the collection does not know (a vLLM newer than it), each passed over.
    - Items have C(source) (V(metrics) or V(spec_decoding_line)), C(name) (metric, label or field), C(reason), C(count)
      (series or lines that carried it), C(value) as printed where there is one, and C(pod) when pods were read. Empty
      when everything was understood.
  returned: always
  type: list
  elements: dict
  sample: [{"source": "metrics", "name": "vllm:spec_decode_num_draft_tokens_per_pos_total", "count": 5,
            "reason": "metric vllm:spec_decode_num_draft_tokens_per_pos_total unknown (not exposed by vLLM 0.10 to 0.34): not read"}]
failures:
  description: Thresholds that were not met.
  returned: always
  type: list
  elements: str
msg:
  description: One human line.
  returned: always
  type: str
"""


from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.urls import open_url

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import speculative_metrics_info
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.prometheus_text import require_prometheus_client


def argument_spec():
    return argspec(
        url=dict(type="str"),
        metrics_text=dict(type="str"),
        metrics_path=dict(type="path"),
        name=dict(type="str"),
        pod=dict(type="str"),
        namespace=dict(type="str", default="default"),
        port=dict(type="str"),
        scheme=dict(type="str", choices=["http", "https"]),
        proxy_path=dict(type="str", default="/metrics"),
        log_text=dict(type="str"),
        log_path=dict(type="path"),
        log_fallback=dict(type="bool", default=True),
        container=dict(type="str", default="kserve-container"),
        since_seconds=dict(type="int"),
        model_name=dict(type="str"),
        method=dict(type="str"),
        interval=dict(type="float", default=0),
        min_mean_acceptance_length=dict(type="float"),
        min_acceptance_rate=dict(type="float"),
        mismatch_rate=dict(type="float", default=spec_metrics.DEFAULT_MISMATCH_RATE),
        collapse_rate=dict(type="float", default=spec_metrics.DEFAULT_COLLAPSE_RATE),
        headers=dict(type="dict"),
        bearer_token=dict(type="str", no_log=True),
        timeout=dict(type="int", default=30),
    )


def http_get(url, headers, validate_certs, timeout):
    """The /metrics page at `url`, through Ansible's open_url (proxy settings and validate_certs as in every module)."""
    resp = open_url(url, headers=headers, validate_certs=validate_certs, timeout=timeout, method="GET")
    return to_text(resp.read(), errors="surrogate_or_replace")


def execute(module):
    params = module.params
    has_prom_source = speculative_metrics_info.check_sources(params)
    if has_prom_source:
        require_prometheus_client(module)
    summary = speculative_metrics_info.read_acceptance(params, connect=lambda: module.api_client, http_get=http_get)
    if summary["not_understood"]:
        module.warn(not_understood.warning(summary["not_understood"]))
    if summary["failures"]:
        detail = " (%s)" % summary["msg"] if summary["has_data"] else ""
        module.fail_json(**dict(summary, msg="acceptance below the thresholds: %s%s" % ("; ".join(summary["failures"]), detail)))
    return summary


CONTRACT = ModuleContract(
    argument_spec, execute,
    constraints=dict(
        mutually_exclusive=[speculative_metrics_info.PROM_SOURCES, ("log_text", "log_path")],
        required_one_of=[speculative_metrics_info.PROM_SOURCES + ("log_text", "log_path")],
    ),
    module_options=dict(check_k8s=False, check_pyyaml=False),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
