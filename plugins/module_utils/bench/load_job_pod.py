# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the in-cluster load Job runs (see ``load_job``): the benchmark's own client, next to the InferenceService.

The Job's image is the serving runtime's (it has ``python3``); this file, ``bench/client.py``, ``bench/stream_client.py``
(the event loop the client runs its streams in), ``vllm/prometheus_text.py`` and ``errors.py`` reach the pod as one zip
application in a ConfigMap (``load_job.bundle``), so only the standard library is needed (``prometheus_client`` is not
used here: the pod sends the metric lines, the controller parses them).

The request (``request.json`` in the same ConfigMap) says which sides to measure, in order, with the prompts, the
request parameters and the protocol (warmups, repeats, concurrency, rate, arrival, seed) the controller checked. The
bearer token and extra headers come from the Job's Secret through the environment, never from the ConfigMap.

Each finished request is a progress line on stderr (the pod's log). The result is printed last on stdout between two
marker lines, as gzip + base64 in lines of 76 characters: per side the measured records, the durations, the warmup
and the two ``/metrics`` scrapes reduced to the families the controller reads. A refused or failed run prints the
error (message, field, fix) as its result and exits 1.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
import os
import sys
import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import prometheus_text

RESULT_SCHEMA = "alauda.spec_decoding/load-job-result/v1"
BEGIN = "--- alauda.spec_decoding load result (gzip, base64) ---"
END = "--- end of alauda.spec_decoding load result ---"
TOKEN_ENV = "SPEC_DECODING_BEARER_TOKEN"
HEADERS_ENV = "SPEC_DECODING_HEADERS"
# The biggest result the pod prints (compressed): kubelets rotate a container's log at 10 MiB by default
# (containerLogMaxSize), and the controller reads the log whole.
MAX_RESULT_BYTES = 6 * 1024 * 1024
# Kubernetes gives each pod of an Indexed Job its index here (batch/v1 Job, completionMode: Indexed).
INDEX_ENV = "JOB_COMPLETION_INDEX"


def _scrape(endpoint, request):
    text = bench_client.scrape(endpoint, request["scrape_metrics"])
    return None if text is None else prometheus_text.filter_lines(text, request["metric_prefixes"])


def _scrape_into(scrapes, endpoint, request):
    scrapes["before"] = _scrape(endpoint, request)
    # the measured requests start now: the wall clock, the pods' common time (the client's CPU: measure_side's "client")
    scrapes["epoch"] = time.time()


def shard_concurrency(concurrency, index, count):
    """This pod's share of the run's concurrency: the pods' shares add up to it (the first ones take the remainder)."""
    return concurrency // count + (1 if index < concurrency % count else 0)


def _progress(label, done, total, record):
    sys.stderr.write(bench_client.request_line(label, done, total, record) + "\n")
    sys.stderr.flush()


def measure(request, token=None, headers=None, index=0):
    """``{"schema", "sides": {name: {...}}}`` for the request's sides; raises SpecDecodingError. With
    ``request["pods"]`` > 1 this pod (``index``) sends its shard of the schedule (bench/client.py ``measure_side``)
    with its share of the concurrency; each side then also says when its measured requests started (``epoch``) and
    what the client used (``client``: CPU seconds over wall seconds), which load_job.merge_results puts together."""
    out = {"schema": RESULT_SCHEMA, "sides": {}, "index": index}
    protocol = request["protocol"]
    pods = int(request.get("pods") or 1)
    if pods > 1 and index is None:
        raise SpecDecodingError("this pod has no %s: the Job is not an Indexed Job, and each of its %d pods would send the whole "
                                "schedule" % (INDEX_ENV, pods), field="load_job.pods",
                                hint="Indexed Jobs need Kubernetes 1.22 or later; on this cluster use load_job.pods: 1")
    index = index or 0
    out["index"] = index
    shard = (index, pods) if pods > 1 else None
    concurrency = shard_concurrency(protocol["concurrency"], index, pods) if shard else protocol["concurrency"]
    ca_path = request.get("ca_path")
    for side in request["sides"]:
        endpoint = bench_client.Endpoint(side["url"], model=side.get("model"), api=request["api"], token=token, headers=headers,
                                         timeout=request["timeout"], validate_certs=request["validate_certs"], ca_path=ca_path,
                                         field=side["field"])
        if request.get("scrape_only"):  # what each side runs, before any inference request (the sweep's first look)
            endpoint.resolve_model()
            out["sides"][side["name"]] = {"model": endpoint.model, "metrics_after": _scrape(endpoint, dict(request, scrape_metrics=True))}
            continue
        scrapes = {}
        before = functools.partial(_scrape_into, scrapes, endpoint, request)

        sys.stderr.write("%s: %s, %d warmup + %d measured requests\n" % (
            side["name"], side["url"], protocol["warmup"], len(request["prompts"]) * protocol["runs_per_prompt"]))
        result = bench_client.measure_side(
            endpoint, request["prompts"], request["params"], runs_per_prompt=protocol["runs_per_prompt"], warmup=protocol["warmup"],
            concurrency=concurrency, request_rate=protocol["request_rate"], arrival=protocol["arrival"],
            seed=protocol["seed"], progress=_progress, label=side["name"], before_measure=before, shard=shard)
        out["sides"][side["name"]] = {
            "model": endpoint.model, "records": result["records"], "duration_s": result["duration_s"], "warmup": result["warmup"],
            "metrics_before": scrapes.get("before"), "metrics_after": _scrape(endpoint, request), "epoch": scrapes["epoch"],
            "client": result["client"]}
    return out


def encode(result):
    """The result's printed lines (without the markers)."""
    packed = base64.b64encode(gzip.compress(json.dumps(result, separators=(",", ":")).encode("utf-8"))).decode("ascii")
    return [packed[i:i + 76] for i in range(0, len(packed), 76)]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as handle:
        request = json.load(handle)
    token = os.environ.get(TOKEN_ENV) or None
    headers = json.loads(os.environ.get(HEADERS_ENV) or "{}")
    code = 0
    try:
        index = os.environ.get(INDEX_ENV)
        result = measure(request, token=token, headers=headers, index=int(index) if index not in (None, "") else None)
    except SpecDecodingError as exc:
        result, code = {"schema": RESULT_SCHEMA, "error": exc.result()}, 1
    lines = encode(result)
    size = sum(len(line) for line in lines)
    if size > MAX_RESULT_BYTES:
        result, code = {"schema": RESULT_SCHEMA, "error": {
            "msg": "the measurements are %d bytes compressed, over the %d a pod log carries safely" % (size, MAX_RESULT_BYTES),
            "field": "load_job", "fix": "measure fewer requests or fewer max_tokens per run, or set load_from=controller"}}, 1
        lines = encode(result)
    sys.stdout.write("\n".join([BEGIN] + lines + [END]) + "\n")
    sys.stdout.flush()
    return code
