# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the module speculative_metrics_info does: read speculative-decoding acceptance from vLLM's /metrics (a URL, a
file, text, or the serving pods of an InferenceService) or, failing that, from its log.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import time
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import http_target
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood as unknown
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import spec_decoding_log


PROM_SOURCES = ("url", "metrics_text", "metrics_path", "name", "pod")


def check_sources(params):
    """Refuse an interval without a live source to scrape twice; returns whether a /metrics source is given."""
    has_prom_source = any(params[k] is not None for k in PROM_SOURCES)
    if params["interval"] and params["interval"] > 0 and (params["metrics_text"] is not None or params["metrics_path"]):
        raise ValidationError("needs a live source to scrape twice (url, name or pod), not metrics_text/metrics_path", field="interval")
    if params["interval"] and params["interval"] > 0 and not has_prom_source:
        raise ValidationError("log windows are already per interval; give url, name or pod to scrape twice", field="interval")
    return has_prom_source


class Scraper:
    """Returns the /metrics text(s) of the chosen source; one call per scrape."""

    def __init__(self, params, connect=None, http_get=None):
        """`connect()` returns the authenticated kubernetes ApiClient (called only with name or pod);
        `http_get(url, headers, validate_certs, timeout)` returns the text at a URL (for url)."""
        self.params = params
        self.http_get = http_get
        self.api_client = None
        self.pods = None
        self.targets = None
        self.isvc_method = None
        if params["name"] or params["pod"]:
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import (  # pylint: disable=import-outside-toplevel
                readers as isvc_readers,
            )
            self.k8s_pods = k8s_pods
            self.api_client = connect()
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

    def log_counters(self, not_understood):
        """Parse the SpecDecoding lines of every pod's log, streamed through the API server; what a line holds that is not
        understood goes to the list `not_understood`, with the pod."""
        params = self.params
        total = spec_metrics.SpecDecodeCounters(source="log")
        windows, count, pods = [], 0, []
        for pod in self.pods:
            chunks = self.k8s_pods.stream_pod_log(self.api_client, params["namespace"], pod, container=params["container"],
                                                  since_seconds=params["since_seconds"], timeout=params["timeout"])
            pod_unknown = []
            counters, pod_windows, pod_count = spec_decoding_log.parse_log(chunks, not_understood=pod_unknown)
            unknown.add(not_understood, pod_unknown, pod=pod)
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
                    targets[pod] = http_target.pod_http_target(spec, container=params["container"], port=port, scheme=params["scheme"])
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
                return {params["url"]: self.http_get(params["url"], headers, validate, params["timeout"])}
            except Exception as exc:  # pylint: disable=broad-except
                raise ValidationError("GET %s failed: %s" % (params["url"], exc), field="url",
                                      hint="check the address, port and path (vLLM serves /metrics on its API port), "
                                           "headers/bearer_token and validate_certs") from exc
        if params["metrics_text"] is not None:
            return {"metrics_text": params["metrics_text"]}
        try:
            with open(params["metrics_path"], "rb") as handle:
                return {params["metrics_path"]: handle.read().decode("utf-8", "surrogateescape")}
        except OSError as exc:
            raise ValidationError("cannot read %s: %s" % (params["metrics_path"], exc.strerror or exc), field="metrics_path",
                                  hint="give a readable file holding a /metrics page") from exc


def _parse_pages(scraper, params, not_understood):
    """``{source: SpecDecodeCounters}`` of one scrape; what a page holds that is not understood goes to `not_understood`
    (with the pod when pods are scraped)."""
    out = {}
    for source, text in scraper.scrape().items():
        page_unknown = []
        out[source] = spec_metrics.parse_prometheus(text, params["model_name"], not_understood=page_unknown)
        unknown.add(not_understood, page_unknown, **({"pod": source} if scraper.pods is not None else {}))
    return out


def prometheus_result(scraper, params, method, not_understood):
    first = _parse_pages(scraper, params, not_understood)
    per_source = first
    if params["interval"] and params["interval"] > 0:
        time.sleep(params["interval"])
        # The second scrape reads the same families: what it does not understand was listed from the first.
        second = _parse_pages(scraper, params, [])
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


def log_result(params, method, not_understood, scraper=None):
    pods = None
    if scraper is not None:
        counters, windows, total, pods = scraper.log_counters(not_understood)
    elif params["log_text"] is not None:
        counters, windows, total = spec_decoding_log.parse_log_text(params["log_text"], not_understood=not_understood)
    else:
        counters, windows, total = spec_decoding_log.parse_log_file(params["log_path"], not_understood=not_understood)
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


def read_acceptance(params, connect=None, http_get=None):
    """Module spec_metrics' result: the summary of the chosen source (the log where /metrics has nothing and a log is
    allowed), with ``interval``, ``failures`` (thresholds not met), ``notes`` (how the source was chosen) and
    ``not_understood`` (what the sources read held that this collection does not know, not_understood.py).
    `connect` and `http_get` as for Scraper."""
    has_prom_source = any(params[k] is not None for k in PROM_SOURCES)
    has_log = params["log_text"] is not None or params["log_path"] is not None
    notes = []
    not_understood = []
    method = params["method"]
    summary = None
    scraper = None
    log_scraper = None
    if has_prom_source:
        if params["port"] is not None:
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.http_target import check_port  # pylint: disable=import-outside-toplevel
            check_port(params["port"])  # before any API call
        scraper = Scraper(params, connect, http_get)
        method = method or scraper.isvc_method
        if scraper.pods is not None and params["log_fallback"] and not has_log:
            log_scraper = scraper
        fallback = has_log or log_scraper is not None
        try:
            summary, found = prometheus_result(scraper, params, method, not_understood)
            if not found and fallback:
                notes.append("the /metrics page has no spec_decode counters; read the log instead")
                summary = None
        except SpecDecodingError as exc:
            if not fallback or (isinstance(exc, ValidationError) and exc.field in ("port", "pod")):
                raise  # a wrong port name or pod is the user's to fix, not a reason to read the log
            notes.append("reading /metrics failed (%s); read the log instead" % exc)
    if summary is None:
        summary = log_result(params, method, not_understood, log_scraper)
        if params["interval"]:
            notes.append("interval does not apply to log windows; they cover the whole log (limit with since_seconds)")
    failures = spec_metrics.check_thresholds(summary, params["min_mean_acceptance_length"], params["min_acceptance_rate"])
    summary.update(interval=params["interval"] or 0, failures=failures, notes=notes, not_understood=not_understood, changed=False)
    return summary
