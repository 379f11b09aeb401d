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
    C(SpecDecoding metrics:) lines (vLLM 0.8.5 to 0.33, and the V0 C(Speculative metrics:) form) from
    O(log_text) or O(log_path); every window is parsed and the totals are weighted by drafted tokens.
  - With O(interval) it scrapes twice and reports the window's deltas.
  - Returns RV(diagnosis) with C(status) V(healthy), V(unsuitable_workload) (per-position acceptance collapses
    by slot 2, or a model-free method is almost never accepted), V(likely_draft_mismatch) (a draft-based method
    with acceptance near zero) or V(no_data), and the numbers behind it.
  - No data is not a failure unless thresholds were given.
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

import time

from ansible.module_utils.basic import missing_required_lib
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.urls import open_url

from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import prometheus_text
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

PROM_SOURCES = ("url", "metrics_text", "metrics_path", "name", "pod")


def argument_spec():
    spec = dict(
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
    spec.update(AUTH_ARG_SPEC)
    return spec


class Scraper:
    """Returns the /metrics text(s) of the chosen source; one call per scrape."""

    def __init__(self, module, params):
        self.module = module
        self.params = params
        self.api_client = None
        self.pods = None
        self.targets = None
        self.isvc_method = None
        if params["name"] or params["pod"]:
            from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client  # pylint: disable=import-outside-toplevel
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import (  # pylint: disable=import-outside-toplevel
                readers as isvc_readers,
            )
            module.requires("kubernetes")
            self.k8s_pods = k8s_pods
            self.api_client = get_api_client(module=module).client.client
            if params["name"]:
                isvc = k8s_pods.get_inference_service(self.api_client, params["namespace"], params["name"])
                for flag in isvc_readers.isvc_speculative_flags(isvc):
                    if flag["present"] and flag["config"] and flag["config"].get("method"):
                        self.isvc_method = flag["config"]["method"]
                        break
                pods, _skipped = k8s_pods.list_predictor_pods(self.api_client, params["namespace"], params["name"])
                self.pods = [p["name"] for p in pods]
                if not self.pods:
                    raise ValidationError("InferenceService %s/%s has no running predictor pods to scrape" % (params["namespace"], params["name"]),
                                          field="name", hint="wait until it is Ready, or check name/namespace")
            else:
                self.pods = [params["pod"]]

    def log_counters(self):
        """Parse the SpecDecoding lines of every pod's log, streamed through the API server."""
        params = self.params
        total = spec_metrics.SpecDecodeCounters(source="log")
        windows, count, pods = [], 0, []
        for pod in self.pods:
            chunks = self.k8s_pods.stream_pod_log(self.api_client, params["namespace"], pod, container=params["container"],
                                                  since_seconds=params["since_seconds"], timeout=params["timeout"])
            counters, pod_windows, pod_count = spec_metrics.parse_log(chunks)
            total = total + counters
            windows.extend(dict(w, pod=pod) for w in pod_windows)
            count += pod_count
            pods.append((pod, counters))
        total.source = "log"
        return total, windows[-1000:], count, pods

    def endpoints(self):
        """Per pod: scheme and port of vLLM's HTTP server (read from the pod's spec unless port and scheme are given)."""
        params = self.params
        if self.targets is None:
            port = params["port"]
            targets = {}
            for pod in self.pods:
                if port is not None and str(port).strip().isdigit() and params["scheme"]:
                    targets[pod] = {"scheme": params["scheme"], "port": int(str(port).strip()), "container": params["container"],
                                    "how": "port and scheme given"}
                else:
                    spec = self.k8s_pods.read_pod(self.api_client, params["namespace"], pod)
                    targets[pod] = self.k8s_pods.pod_http_target(spec, container=params["container"], port=port, scheme=params["scheme"])
            self.targets = targets
        return [dict(pod=pod, scheme=t["scheme"], port=t["port"], path="/" + params["proxy_path"].lstrip("/"), how=t["how"])
                for pod, t in self.targets.items()]

    def scrape(self):
        """``{source_name: text}``: one entry per pod, or a single entry."""
        params = self.params
        if self.pods is not None:
            return {e["pod"]: self.k8s_pods.proxy_get(self.api_client, params["namespace"], e["pod"], port=e["port"], scheme=e["scheme"],
                                                      path=params["proxy_path"], timeout=params["timeout"]) for e in self.endpoints()}
        if params["url"]:
            headers = dict(params["headers"] or {})
            if params["bearer_token"]:
                headers["Authorization"] = "Bearer %s" % params["bearer_token"]
            validate = params["validate_certs"] if params["validate_certs"] is not None else True
            try:
                resp = open_url(params["url"], headers=headers, validate_certs=validate, timeout=params["timeout"], method="GET")
                return {params["url"]: to_text(resp.read(), errors="surrogate_or_replace")}
            except Exception as exc:  # pylint: disable=broad-except
                raise ValidationError("GET %s failed: %s" % (params["url"], to_text(exc)), field="url",
                                      hint="check the address, port and path (vLLM serves /metrics on its API port), "
                                           "headers/bearer_token and validate_certs") from exc
        if params["metrics_text"] is not None:
            return {"metrics_text": params["metrics_text"]}
        try:
            with open(params["metrics_path"], "rb") as handle:
                return {params["metrics_path"]: to_text(handle.read(), errors="surrogate_or_replace")}
        except OSError as exc:
            raise ValidationError("cannot read %s: %s" % (params["metrics_path"], exc.strerror or exc), field="metrics_path",
                                  hint="give a readable file holding a /metrics page") from exc


def prometheus_result(scraper, params, method):
    first = {k: spec_metrics.parse_prometheus(v, params["model_name"]) for k, v in scraper.scrape().items()}
    per_source = first
    if params["interval"] and params["interval"] > 0:
        time.sleep(params["interval"])
        second = {k: spec_metrics.parse_prometheus(v, params["model_name"]) for k, v in scraper.scrape().items()}
        per_source = {k: second[k].delta(first.get(k)) for k in second}
    total = spec_metrics.SpecDecodeCounters(source="prometheus")
    for counters in per_source.values():
        total = total + counters
    total.all_model_names = sorted({m for c in first.values() for m in c.all_model_names})
    summary = spec_metrics.summarize(total, method=method, mismatch_rate=params["mismatch_rate"], collapse_rate=params["collapse_rate"])
    if scraper.pods is not None:
        summary["endpoints"] = scraper.endpoints()
    if scraper.pods is not None and params["name"]:
        summary["pods"] = [dict(spec_metrics.summarize(c, method=method, mismatch_rate=params["mismatch_rate"],
                                                       collapse_rate=params["collapse_rate"]), name=k) for k, c in per_source.items()]
    if params["model_name"] and not total.found and total.all_model_names:
        summary["msg"] = "no spec_decode series for model_name %r; the page has model_name %s" % (
            params["model_name"], ", ".join(repr(m) for m in total.all_model_names))
        summary["diagnosis"]["reason"] = summary["msg"]
    if total.reset:
        summary["msg"] += " (a counter went down between the scrapes: the server restarted; the numbers count since that restart)"
    if params["interval"] and summary["has_data"] is False and total.found:
        summary["msg"] = "no drafts during the %s s interval: %s" % (params["interval"], summary["msg"])
    return summary, total.found


def log_result(params, method, scraper=None):
    pods = None
    if scraper is not None:
        counters, windows, total, pods = scraper.log_counters()
    elif params["log_text"] is not None:
        counters, windows, total = spec_metrics.parse_log_text(params["log_text"])
    else:
        counters, windows, total = spec_metrics.parse_log_file(params["log_path"])
    summary = spec_metrics.summarize(counters, method=method, mismatch_rate=params["mismatch_rate"], collapse_rate=params["collapse_rate"])
    summary["windows"] = windows
    summary["windows_total"] = total
    if pods is not None and params["name"]:
        summary["pods"] = [dict(spec_metrics.summarize(c, method=method, mismatch_rate=params["mismatch_rate"],
                                                       collapse_rate=params["collapse_rate"]), name=p) for p, c in pods]
    if not total:
        summary["msg"] = ("no 'SpecDecoding metrics:' lines in the log: they appear every VLLM_LOG_STATS_INTERVAL (10 s) only while "
                          "drafts are made, are missing with --disable-log-stats or --api-server-count > 1, and are printed by the "
                          "API server process. " + summary["diagnosis"]["reason"])
    return summary


def main():
    module = AnsibleK8SModule(
        argument_spec=argument_spec(),
        mutually_exclusive=[PROM_SOURCES, ("log_text", "log_path")],
        required_one_of=[PROM_SOURCES + ("log_text", "log_path")],
        supports_check_mode=True,
        check_k8s=False,
        check_pyyaml=False,
    )
    params = module.params
    has_prom_source = any(params[k] is not None for k in PROM_SOURCES)
    has_log = params["log_text"] is not None or params["log_path"] is not None
    if params["interval"] and params["interval"] > 0 and (params["metrics_text"] is not None or params["metrics_path"]):
        module.fail_json(msg="interval: needs a live source to scrape twice (url, name or pod), not metrics_text/metrics_path")
    if params["interval"] and params["interval"] > 0 and not has_prom_source:
        module.fail_json(msg="interval: log windows are already per interval; give url, name or pod to scrape twice")
    if has_prom_source and not prometheus_text.HAS_PROMETHEUS_CLIENT:
        module.fail_json(msg=missing_required_lib("prometheus_client"), exception=str(prometheus_text.PROMETHEUS_IMPORT_ERROR))
    notes = []
    try:
        method = params["method"]
        summary = None
        scraper = None
        log_scraper = None
        if has_prom_source:
            if params["port"] is not None:
                from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.http_target import check_port  # pylint: disable=import-outside-toplevel
                check_port(params["port"])  # before any API call
            scraper = Scraper(module, params)
            method = method or scraper.isvc_method
            if scraper.pods is not None and params["log_fallback"] and not has_log:
                log_scraper = scraper
            fallback = has_log or log_scraper is not None
            try:
                summary, found = prometheus_result(scraper, params, method)
                if not found and fallback:
                    notes.append("the /metrics page has no spec_decode counters; read the log instead")
                    summary = None
            except SpecDecodingError as exc:
                if not fallback or (isinstance(exc, ValidationError) and exc.field in ("port", "pod")):
                    raise  # a wrong port name or pod is the user's to fix, not a reason to read the log
                notes.append("reading /metrics failed (%s); read the log instead" % exc)
        if summary is None:
            summary = log_result(params, method, log_scraper)
            if params["interval"]:
                notes.append("interval does not apply to log windows; they cover the whole log (limit with since_seconds)")
        failures = spec_metrics.check_thresholds(summary, params["min_mean_acceptance_length"], params["min_acceptance_rate"])
    except SpecDecodingError as exc:
        module.fail_json(msg=str(exc), field=exc.field, changed=False)
    summary.update(interval=params["interval"] or 0, failures=failures, notes=notes, changed=False)
    if failures:
        detail = " (%s)" % summary["msg"] if summary["has_data"] else ""
        module.fail_json(**dict(summary, msg="acceptance below the thresholds: %s%s" % ("; ".join(failures), detail)))
    module.exit_json(**summary)


if __name__ == "__main__":
    main()
