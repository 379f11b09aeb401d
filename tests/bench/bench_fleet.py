"""Benchmark skeleton (issue 53): fleet discovery over N InferenceServices in 10 namespaces against a plain loop of
per-service GETs, side by side on one test bed.

What it does
1. Starts a test bed control plane (etcd, kube-apiserver, kube-controller-manager with the KServe CRDs; no kubelet, no
   KServe stand-in: **no pod is started**, the services are objects only, so nothing here measures a serving engine or
   its /metrics). For each N of --sizes it creates N InferenceServices spread over 10 namespaces, 10% of them with the
   speculative flag (half in their own args, half from a namespace's ServingRuntime), every one naming a runtime: a
   ServingRuntime per namespace and one ClusterServingRuntime.
2. Times, --reps times each, interleaved:
   - fleet: the rollback role's discovery and decision - ``ops/fleet.discover`` (what module fleet_speculative_info runs)
     over the 10 namespaces (one LIST of the services and one of the ServingRuntimes per namespace, one of the
     ClusterServingRuntimes), then ``ops/fleet_rollback.plan`` (filter fleet_rollback_plan: the services the per-service
     tasks run for, which must be exactly those with the flag); the per-service module runs are not timed;
   - loop: what a playbook of ``kubernetes.core.k8s_info`` tasks does per service, in one process: a GET of the service
     and a GET of the runtime it names, through kubernetes' DynamicClient (k8s_info's client; its discovery once, not
     per service). A real k8s_info loop also starts a module process per task (about 1.5 s each on this machine), which
     this lower bound leaves out.
   Both judge the same services: the loop with the collection's reader on what it fetched, so the two answers must match.
3. Prints a table (wall and CPU seconds, API requests and requests per service, the loop's over the fleet's) and the
   growth of the fleet's wall time from the smallest N to the largest, and the targets' verdicts: fleet <= 1.0x the
   loop's wall time at the largest N, growth within 4.4x for 4x the services, at most one request per service.

Not yet here (issue 53): the fleet rollback's writes (tests/integration/test_fleet.py checks them on 8 services), a
kubernetes.core ``k8s`` patch loop, several API servers, the
API server's own request metrics and the controller's peak memory.

Exit status: 1 when a target is missed or the two sides disagree. Usage: python tests/bench/bench_fleet.py
[--sizes 50,100,200] [--reps 3] (`hack/bench.sh fleet`, `make bench-fleet`). One JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(ROOT, ".build", "collections")
LINK = os.path.join(COLLECTIONS, "ansible_collections", "alauda", "spec_decoding")
if not os.path.exists(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(ROOT, LINK)
sys.path.insert(0, ROOT)
sys.path.insert(0, COLLECTIONS)

# pylint: disable=wrong-import-position
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import runtime as srt  # noqa: E402
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet, fleet_rollback  # noqa: E402
from tests.testbed import build as testbed_build  # noqa: E402
from tests.testbed.controlplane import ControlPlane, kserve_crd_dir  # noqa: E402

NAMESPACES = 10
KSERVE = "/apis/serving.kserve.io"
FLAG = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})]


def _runtime(name, namespace=None, args=()):
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime" if namespace else "ClusterServingRuntime",
            "metadata": meta, "spec": {"supportedModelFormats": [{"name": "vLLM", "autoSelect": True}],
                                       "containers": [{"name": "kserve-container", "image": "vllm", "args": ["--port=8080"] + list(args)}]}}


def populate(api, size, run):
    """``size`` services over 10 fresh namespaces; returns the namespaces and the expected {(ns, name): has flag}."""
    namespaces = ["fleet-%s-%d-%02d" % (run, size, i) for i in range(NAMESPACES)]
    expected = {}
    for ns in namespaces:
        api.post("/api/v1/namespaces", {"metadata": {"name": ns}})
        api.post("%s/v1alpha1/namespaces/%s/servingruntimes" % (KSERVE, ns), _runtime("plain", ns))
        api.post("%s/v1alpha1/namespaces/%s/servingruntimes" % (KSERVE, ns), _runtime("spec", ns, FLAG))
    flagged = max(1, size // 10)
    for i in range(size):
        ns, name = namespaces[i % NAMESPACES], "isvc-%04d" % i
        own, shared = i < flagged and i % 2 == 0, i < flagged and i % 2 == 1
        model = {"modelFormat": {"name": "vLLM"}, "storageUri": "pvc://m/x",
                 "runtime": "spec" if shared else ("fleet-csr-%s" % run if i % 3 == 0 else "plain")}
        if own:
            model["args"] = FLAG
        api.post("%s/v1beta1/namespaces/%s/inferenceservices" % (KSERVE, ns),
                 {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": name},
                  "spec": {"predictor": {"model": model}}})
        expected[(ns, name)] = own or shared
    return namespaces, expected


def run_fleet(api_client, namespaces):
    """The rollback role's discovery and decision: fleet_speculative_info's reads, then fleet_rollback_plan's targets (the
    services its per-service tasks would run for; their module runs are not timed)."""
    client = fleet.CountingClient(api_client)
    result = fleet.discover(client, {"namespaces": namespaces, "kinds": ["InferenceService"]})
    targets = {(t["namespace"], t["name"]) for t in fleet_rollback.plan(result)["targets"]}
    return {(r["namespace"], r["name"]): (r["namespace"], r["name"]) in targets for r in result["services"]}, client.total


class _GetReader:
    """The runtime reader the loop judges with: what it fetched with its own GETs (ServingRuntime, then the cluster's)."""

    def __init__(self, runtimes):
        self.runtimes = runtimes
        self.forbidden = []

    def get(self, kind, namespace, name):
        return self.runtimes.get((kind, namespace if kind == srt.SERVING_RUNTIME else None, name))

    def list(self, kind, namespace):  # pylint: disable=unused-argument
        return []


def run_loop(dynamic, names):
    """A GET per service and a GET of the runtime it names (the namespaced one, else the cluster's), as k8s_info tasks
    would, then the same judgement."""
    from kubernetes.dynamic.exceptions import NotFoundError  # pylint: disable=import-outside-toplevel
    isvcs = dynamic.resources.get(api_version="serving.kserve.io/v1beta1", kind="InferenceService")
    srs = dynamic.resources.get(api_version="serving.kserve.io/v1alpha1", kind="ServingRuntime")
    csrs = dynamic.resources.get(api_version="serving.kserve.io/v1alpha1", kind="ClusterServingRuntime")
    requests, out = 0, {}
    for ns, name in names:
        isvc = isvcs.get(name=name, namespace=ns).to_dict()
        requests += 1
        wanted = isvc["spec"]["predictor"]["model"]["runtime"]
        runtimes = {}
        try:
            runtimes[(srt.SERVING_RUNTIME, ns, wanted)] = srs.get(name=wanted, namespace=ns).to_dict()
            requests += 1
        except NotFoundError:
            runtimes[(srt.CLUSTER_SERVING_RUNTIME, None, wanted)] = csrs.get(name=wanted).to_dict()
            requests += 2
        out[(ns, name)] = fleet.isvc_record(isvc, _GetReader(runtimes))["speculative"]
    return out, requests


def _timed(fn, *args):
    wall, cpu = time.perf_counter(), time.process_time()
    answer = fn(*args)
    return answer, time.perf_counter() - wall, time.process_time() - cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="50,100,200")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("fleet rollback's discovery and decision on a test bed: InferenceServices as objects only; no pod is started, "
          "no engine is measured, nothing is written")
    cp = ControlPlane(bin_dir=testbed_build.build())
    cp.start()
    rows, failures = [], []
    try:
        cp.install_crds(kserve_crd_dir())
        api = cp.rest()
        api_client = cp.api_client()
        from kubernetes.dynamic import DynamicClient  # pylint: disable=import-outside-toplevel
        dynamic = DynamicClient(api_client)
        run = uuid.uuid4().hex[:4]
        api.post("%s/v1alpha1/clusterservingruntimes" % KSERVE, _runtime("fleet-csr-%s" % run))
        for size in sizes:
            namespaces, expected = populate(api, size, run)
            fleet_runs, loop_runs = [], []
            for _rep in range(args.reps):
                (answer, requests), wall, cpu = _timed(run_fleet, api_client, namespaces)
                if answer != expected:
                    failures.append("N=%d: the rollback's targets differ from the services made with the flag" % size)
                fleet_runs.append((wall, cpu, requests))
                (answer, requests), wall, cpu = _timed(run_loop, dynamic, sorted(expected))
                if answer != expected:
                    failures.append("N=%d: the loop's answer differs from the services made" % size)
                loop_runs.append((wall, cpu, requests))
            med = [tuple(statistics.median(r[i] for r in runs) for i in range(3)) for runs in (fleet_runs, loop_runs)]
            rows.append({"n": size, "fleet_wall_s": med[0][0], "fleet_cpu_s": med[0][1], "fleet_requests": med[0][2],
                         "loop_wall_s": med[1][0], "loop_cpu_s": med[1][1], "loop_requests": med[1][2]})
    finally:
        cp.stop()
    print("\n%6s | %12s %11s %9s %8s | %12s %11s %9s %8s | %10s" % (
        "N", "fleet wall s", "fleet CPU s", "requests", "req/svc", "loop wall s", "loop CPU s", "requests", "req/svc", "fleet/loop"))
    for row in rows:
        print("%6d | %12.3f %11.3f %9d %8.3f | %12.3f %11.3f %9d %8.3f | %9.2fx" % (
            row["n"], row["fleet_wall_s"], row["fleet_cpu_s"], row["fleet_requests"], row["fleet_requests"] / row["n"],
            row["loop_wall_s"], row["loop_cpu_s"], row["loop_requests"], row["loop_requests"] / row["n"],
            row["fleet_wall_s"] / row["loop_wall_s"]))
    first, last = rows[0], rows[-1]
    growth = last["fleet_wall_s"] / first["fleet_wall_s"]
    allowed = 1.1 * last["n"] / first["n"]
    verdicts = [
        ("fleet wall <= 1.0x the loop's at N=%d" % last["n"], last["fleet_wall_s"] <= last["loop_wall_s"]),
        ("fleet growth N=%d -> %d: %.2fx <= %.2fx" % (first["n"], last["n"], growth, allowed), growth <= allowed),
        ("at most one API request per service", all(r["fleet_requests"] <= r["n"] for r in rows)),
    ]
    for text, met in verdicts:
        print("%-60s %s" % (text, "met" if met else "MISSED"))
    for text in failures:
        print("FAILED: " + text)
    print("(the loop is a lower bound of a kubernetes.core.k8s_info loop: it does not start a module process per service)")
    print(json.dumps({"bench": "fleet", "rows": rows, "growth": growth, "targets_met": all(m for _t, m in verdicts), "failures": failures}))
    return 0 if all(m for _t, m in verdicts) and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
