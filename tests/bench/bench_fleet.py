"""Benchmark (issue 53): the fleet rollback against a kubernetes.core ``k8s_info`` + ``k8s`` patch loop, doing the same
strip on the same N InferenceServices in 10 namespaces over two API servers, side by side in one run.

What it does
1. Starts --clusters test bed control planes (2 by default: the multi-cluster case; each etcd, kube-apiserver,
   kube-controller-manager with the KServe CRDs; no kubelet, no KServe stand-in: **the services have no pods**, they
   are objects only - 200 real engines do not fit here - so the rollback's wait for Ready and its engine-line proof,
   which need pods, are left out of both sides). For each N of --sizes it creates N InferenceServices spread over 10
   namespaces split over the clusters (namespaces 0-4 on the first, 5-9 on the second), 10% of them with the
   speculative flag (half in their own args, half from a namespace's ServingRuntime), every one naming a runtime: a
   ServingRuntime per namespace and one ClusterServingRuntime per cluster.
2. Times, --reps times each, interleaved, the fleet reset to its flags before every side (untimed):
   - fleet: what the rollback role runs over a fleet, per cluster: module ``fleet_speculative_info`` over the cluster's
     namespaces (a LIST per namespace and kind), filter ``fleet_rollback_plan`` (``ops/fleet_rollback.plan``: the
     targets), then per target module ``isvc_speculative`` (state absent, runtime_copy, backup annotation: the role's
     rollback_one.yml strip) - without ``wait`` and the engine-line proof (no pods);
   - loop: what a user writes with kubernetes.core, per service: ``kubernetes.core.k8s_info`` of the service, of the
     runtime it names (the namespace's ServingRuntime, else the ClusterServingRuntime), and where the flag is a
     ``kubernetes.core.k8s`` state=patched merge patch of the args without it (a flag from the shared runtime: a
     ``k8s`` state=present per-service copy of the runtime without the flag, and the service's runtime patched to it).
   Every module, the collection's and kubernetes.core's, runs its real code in this process (tests/module_run.py), so
   the start of a module process per task (1-3 s here, with the load; --playbook-items times it with a real
   ansible-playbook loop) is left out: a playbook pays it for every kubernetes.core task, not for the collection's
   cluster modules, which run in the task's own process (plugins/action, docs/DEVELOPING.md). kubernetes.core caches
   its API client per kubeconfig in the process, for both sides. Both sides take the clusters one after the other (a
   playbook with a host group per cluster would run them in parallel forks, both sides alike). After each side: every
   flagged service has no flag (the collection's discovery on the result) and every other service is unchanged (its
   resourceVersion).
3. Measures each side: wall and CPU seconds of this process (time.process_time), its peak RSS during the side (VmHWM
   of /proc/self/status, reset through /proc/self/clear_refs before the side; the RSS at the start is printed too),
   the API servers' CPU seconds (utime+stime of each kube-apiserver process, /proc/<pid>/stat) and the API requests
   from the API servers themselves: ``apiserver_request_total`` scraped from each /metrics before and after (the
   fleet's also between its discovery and its writes), the KServe group's requests answered as JSON (the clients'; the
   API server's and the controller manager's own informers ask for protobuf), WATCH excluded (the test bed's
   kube-apiserver 1.20 labels a GET by name of a namespaced custom resource LIST: the totals are exact, the GET/LIST
   split is its label); the discovery's
   client-side count (fleet.CountingClient, in the module's result) is printed beside them.
4. Prints one table (medians of --reps) with the growth from the smallest N to the largest and the targets' verdicts:
   fleet wall <= 1.0x the loop's at the largest N; fleet growth within 4.4x (1.1 x the size ratio); a service without
   the flag costs at most one API request (the discovery's server-counted requests over N). With --playbook-items it
   also times a real ansible-playbook loop of k8s_info over that many services of the smallest N (a module process per
   item) and prints what each side would take with a module process per module run.

Exit status: 1 when a target is missed, a side fails or the two sides do not end the same. Usage: python
tests/bench/bench_fleet.py [--sizes 50,100,200] [--reps 3] [--clusters 2] [--playbook-items 10]
(`hack/bench.sh fleet`, `make bench-fleet`). One JSON line at the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import sys
import tempfile
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
from tests.module_run import run_module  # noqa: E402
from tests.testbed import build as testbed_build  # noqa: E402
from tests.testbed.controlplane import ControlPlane, kserve_crd_dir  # noqa: E402

NAMESPACES = 10
KSERVE = "/apis/serving.kserve.io"
ISVC_API, RUNTIME_API = "serving.kserve.io/v1beta1", "serving.kserve.io/v1alpha1"
FLAG_NAME = "--speculative-config"
FLAG = [FLAG_NAME, json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})]
SAMPLE = re.compile(r'^apiserver_request_total\{(.*)\} ([0-9.e+]+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# after the services are made, the controller manager's and the API server's informers take up the new objects: let them
# settle before the first side, whose API server CPU would carry them
SETTLE_S = 3.0


def _runtime(name, namespace=None, args=()):
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": RUNTIME_API, "kind": "ServingRuntime" if namespace else "ClusterServingRuntime",
            "metadata": meta, "spec": {"supportedModelFormats": [{"name": "vLLM", "autoSelect": True}],
                                       "containers": [{"name": "kserve-container", "image": "vllm", "args": ["--port=8080"] + list(args)}]}}


class Cluster:
    """One control plane of the bench: its admin REST client, kubeconfig and kube-apiserver process."""

    def __init__(self, index, control_plane, run):
        self.index, self.cp = index, control_plane
        self.api = control_plane.rest()
        self.kubeconfig = control_plane.kubeconfig
        self.csr = "fleet-csr-%s" % run
        self.namespaces = []
        self.names = {}  # namespace -> the names of its services (the loop's input)

    @property
    def apiserver_pid(self):
        return self.cp.procs["kube-apiserver"].pid


def populate(clusters, size, run):
    """``size`` services over 10 fresh namespaces split over the clusters; returns {(cluster, ns, name): original
    InferenceService} and the set of keys made with the flag."""
    namespaces = ["fleet-%s-%d-%02d" % (run, size, i) for i in range(NAMESPACES)]
    per_cluster = -(-NAMESPACES // len(clusters))
    for cluster in clusters:
        cluster.namespaces = namespaces[cluster.index * per_cluster:(cluster.index + 1) * per_cluster]
        for ns in cluster.namespaces:
            cluster.api.post("/api/v1/namespaces", {"metadata": {"name": ns}})
            cluster.api.post("%s/v1alpha1/namespaces/%s/servingruntimes" % (KSERVE, ns), _runtime("plain", ns))
            cluster.api.post("%s/v1alpha1/namespaces/%s/servingruntimes" % (KSERVE, ns), _runtime("spec", ns, FLAG))
    flagged_count = max(1, size // 10)
    originals, flagged = {}, set()
    for i in range(size):
        ns_index = i % NAMESPACES
        cluster, ns, name = clusters[ns_index // per_cluster], namespaces[ns_index], "isvc-%04d" % i
        own, shared = i < flagged_count and i % 2 == 0, i < flagged_count and i % 2 == 1
        model = {"modelFormat": {"name": "vLLM"}, "storageUri": "pvc://m/x",
                 "runtime": "spec" if shared else (cluster.csr if i % 3 == 0 else "plain")}
        if own:
            model["args"] = list(FLAG)
        originals[(cluster.index, ns, name)] = cluster.api.post(
            "%s/v1beta1/namespaces/%s/inferenceservices" % (KSERVE, ns),
            {"apiVersion": ISVC_API, "kind": "InferenceService", "metadata": {"name": name}, "spec": {"predictor": {"model": model}}})
        if own or shared:
            flagged.add((cluster.index, ns, name))
    return originals, flagged


def reset(clusters, originals, flagged):
    """Put the flag back where it was made (the service's model and annotations as created) and delete the per-service
    runtime copies; then the collection's discovery must find exactly the flagged services. Returns the services'
    resourceVersions."""
    for key in sorted(flagged):
        cluster, (ns, name) = clusters[key[0]], key[1:]
        original = originals[key]
        cluster.api.patch("%s/v1beta1/namespaces/%s/inferenceservices/%s" % (KSERVE, ns, name), [
            {"op": "add", "path": "/metadata/annotations", "value": original["metadata"].get("annotations") or {}},
            {"op": "add", "path": "/spec/predictor/model", "value": original["spec"]["predictor"]["model"]}], patch_type="json")
    for cluster in clusters:
        for ns in cluster.namespaces:
            path = "%s/v1alpha1/namespaces/%s/servingruntimes" % (KSERVE, ns)
            for item in cluster.api.get(path, labelSelector=srt.COPY_FOR_LABEL)["items"]:
                cluster.api.delete("%s/%s" % (path, item["metadata"]["name"]))
    problems, versions = judge(clusters, originals, flagged, expect_flag=True)
    if problems:
        raise RuntimeError("the fleet did not reset: %s" % "; ".join(problems[:5]))
    return versions


def judge(clusters, originals, flagged, expect_flag, versions_before=None):
    """(problems, resourceVersions): the collection's discovery on every cluster (untimed); with expect_flag=False every
    flagged service must have no flag and every other one the resourceVersion it had before the side."""
    problems, versions, found_keys = [], {}, set()
    for cluster in clusters:
        for ns in cluster.namespaces:
            for item in cluster.api.get("%s/v1beta1/namespaces/%s/inferenceservices" % (KSERVE, ns))["items"]:
                versions[(cluster.index, ns, item["metadata"]["name"])] = item["metadata"]["resourceVersion"]
        found = fleet.discover(fleet.CountingClient(cluster.cp.api_client()),
                               {"namespaces": cluster.namespaces, "kinds": ["InferenceService"]})
        for record in found["services"]:
            key = (cluster.index, record["namespace"], record["name"])
            found_keys.add(key)
            if record.get("error") or record.get("undecided"):
                problems.append("%s/%s: %s" % (key[1], key[2], record.get("error") or record.get("undecided")))
            wanted = expect_flag and key in flagged
            if bool(record.get("speculative")) != wanted:
                problems.append("%s/%s: speculative=%s, expected %s" % (key[1], key[2], record.get("speculative"), wanted))
    if len(found_keys) != len(originals):
        problems.append("the discovery found %d services, %d were made" % (len(found_keys), len(originals)))
    if versions_before is not None:
        problems.extend("%s/%s changed without the flag" % key[1:] for key in sorted(originals)
                        if key not in flagged and versions.get(key) != versions_before.get(key))
    return problems, versions


# -- the two sides ---------------------------------------------------------------------------------------------------

MODULE_RUNS = [0]


def _module(name, args):
    MODULE_RUNS[0] += 1
    result = run_module(name, args)
    if result.failed:
        raise RuntimeError("%s %s failed: %s" % (name, args.get("name") or "", result.msg))
    return result


def fleet_discover(cluster):
    """fleet_speculative_info over the cluster's namespaces, then fleet_rollback_plan: (targets, client-counted requests)."""
    found = _module("alauda.spec_decoding.fleet_speculative_info",
                    {"kubeconfig": cluster.kubeconfig, "namespaces": cluster.namespaces, "kinds": ["InferenceService"]})
    the_plan = fleet_rollback.plan(found)
    return the_plan["targets"], the_plan["api_requests"]


def fleet_strip(cluster, targets):
    """The role's per-service strip (rollback_one.yml's isvc_speculative, wait off: no pods); the services changed."""
    changed = 0
    for target in targets:
        result = _module("alauda.spec_decoding.isvc_speculative", {
            "kubeconfig": cluster.kubeconfig, "namespace": target["namespace"], "name": target["name"], "state": "absent",
            "backup": "annotation", "runtime_copy": True, "wait": False})
        changed += bool(result.get("changed"))
    return changed


def _without_flag(args):
    out, skip = [], False
    for arg in args or []:
        if skip:
            skip = False
        elif arg == FLAG_NAME:
            skip = True
        elif not arg.startswith(FLAG_NAME + "="):
            out.append(arg)
    return out


def _has_flag(args):
    return _without_flag(args) != list(args or [])


def _info(cluster, api_version, kind, name, namespace=None):
    args = {"kubeconfig": cluster.kubeconfig, "api_version": api_version, "kind": kind, "name": name}
    if namespace:
        args["namespace"] = namespace
    return _module("kubernetes.core.k8s_info", args).get("resources") or []


def _patched(cluster, namespace, name, model):
    return _module("kubernetes.core.k8s", {
        "kubeconfig": cluster.kubeconfig, "state": "patched", "merge_type": ["merge"],
        "definition": {"apiVersion": ISVC_API, "kind": "InferenceService", "metadata": {"name": name, "namespace": namespace},
                       "spec": {"predictor": {"model": model}}}})


def loop_strip(cluster):
    """The kubernetes.core loop over the cluster's services: k8s_info of each and of its runtime, a k8s patch where the flag
    is. Returns the services changed."""
    changed = 0
    for namespace in cluster.namespaces:
        # a user's loop over the names it is given; the names are the bench's, not listed
        for name in cluster.names[namespace]:
            isvc = _info(cluster, ISVC_API, "InferenceService", name, namespace)[0]
            model = isvc["spec"]["predictor"]["model"]
            if _has_flag(model.get("args")):
                changed += bool(_patched(cluster, namespace, name, {"args": _without_flag(model["args"])}).get("changed"))
                continue
            runtime = (_info(cluster, RUNTIME_API, "ServingRuntime", model["runtime"], namespace)
                       or _info(cluster, RUNTIME_API, "ClusterServingRuntime", model["runtime"]))[0]
            container = runtime["spec"]["containers"][0]
            if not _has_flag(container.get("args")):
                continue
            spec = copy.deepcopy(runtime["spec"])
            spec["containers"][0]["args"] = _without_flag(container["args"])
            for fmt in spec.get("supportedModelFormats") or []:
                fmt["autoSelect"] = False
            copy_name = "%s-%s-nospec" % (name, model["runtime"])
            _module("kubernetes.core.k8s", {"kubeconfig": cluster.kubeconfig, "state": "present", "definition": {
                "apiVersion": RUNTIME_API, "kind": "ServingRuntime",
                "metadata": {"name": copy_name, "namespace": namespace, "labels": {srt.COPY_FOR_LABEL: name}}, "spec": spec}})
            changed += bool(_patched(cluster, namespace, name, {"runtime": copy_name}).get("changed"))
    return changed


# -- what each side costs --------------------------------------------------------------------------------------------

def scrape(cluster):
    """apiserver_request_total of the cluster's API server: {(verb, group, resource, contentType): count}."""
    counts = {}
    for line in cluster.api.request("GET", "/metrics", raw=True).splitlines():
        match = SAMPLE.match(line)
        if match:
            labels = dict(LABEL.findall(match.group(1)))
            key = (labels.get("verb"), labels.get("group"), labels.get("resource") or labels.get("subresource"), labels.get("contentType", ""))
            counts[key] = counts.get(key, 0) + float(match.group(2))
    return counts


def requests_between(before, after):
    """(KServe requests by verb, other requests): the requests the bench's clients made - the KServe group's answered as
    JSON (the API server's and the controller manager's informers ask for protobuf), WATCH left out."""
    by_verb, other = {}, 0
    for key, count in after.items():
        delta = int(round(count - before.get(key, 0)))
        verb, group, resource, content = key
        if delta <= 0 or verb == "WATCH":
            continue
        if group == "serving.kserve.io" and content.startswith("application/json"):
            by_verb[verb] = by_verb.get(verb, 0) + delta
        elif content.startswith("application/json") or resource in ("/api", "/apis", "/openapi/v2", "/version"):
            other += delta
    return by_verb, other


def apiserver_cpu(pid):
    with open("/proc/%d/stat" % pid, encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _rss_kb(field):
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak_rss():
    """Reset the peak RSS (VmHWM) to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


class Meter:
    """Wall and CPU seconds of the phases measured, the API servers' CPU and requests, and the peak RSS."""

    def __init__(self, clusters):
        self.clusters = clusters
        self.wall = self.cpu = 0.0
        self.peak_reset = reset_peak_rss()
        self.rss_start_mb = _rss_kb("VmRSS") / 1024
        self.server_cpu = [apiserver_cpu(c.apiserver_pid) for c in clusters]
        self.module_runs = MODULE_RUNS[0]
        self.scrapes = [[scrape(c) for c in clusters]]

    def phase(self, fn, *args):
        wall, cpu = time.perf_counter(), time.process_time()
        answer = fn(*args)
        self.wall += time.perf_counter() - wall
        self.cpu += time.process_time() - cpu
        return answer

    def mark(self):
        """Scrape the API servers between phases (untimed)."""
        self.scrapes.append([scrape(c) for c in self.clusters])

    def done(self, n):
        peak_mb = _rss_kb("VmHWM") / 1024
        server_cpu = sum(apiserver_cpu(c.apiserver_pid) - before for c, before in zip(self.clusters, self.server_cpu))
        self.mark()
        phases = []
        for first, second in zip(self.scrapes, self.scrapes[1:]):
            by_verb, other = {}, 0
            for before, after in zip(first, second):
                verbs, extra = requests_between(before, after)
                other += extra
                for verb, count in verbs.items():
                    by_verb[verb] = by_verb.get(verb, 0) + count
            phases.append((by_verb, other))
        total = {}
        for by_verb, _other in phases:
            for verb, count in by_verb.items():
                total[verb] = total.get(verb, 0) + count
        requests = sum(total.values())
        return {"wall_s": self.wall, "cpu_s": self.cpu, "peak_rss_mb": peak_mb, "rss_start_mb": self.rss_start_mb,
                "peak_rss_kind": "VmHWM reset before the side" if self.peak_reset else "VmHWM of the process, not reset (clear_refs refused)",
                "module_runs": MODULE_RUNS[0] - self.module_runs, "apiserver_cpu_s": server_cpu, "requests": requests,
                "requests_per_service": requests / n, "by_verb": total,
                "other_requests": sum(o for _v, o in phases), "phases": [sum(v.values()) for v, _o in phases]}


def measure_fleet(clusters, n):
    meter = Meter(clusters)
    plans = [meter.phase(fleet_discover, c) for c in clusters]
    meter.mark()
    changed = sum(meter.phase(fleet_strip, c, targets) for c, (targets, _count) in zip(clusters, plans))
    row = meter.done(n)
    row.update(changed=changed, client_counted_discovery=sum(count for _t, count in plans), discovery_requests=row["phases"][0])
    return row


def measure_loop(clusters, n):
    meter = Meter(clusters)
    changed = sum(meter.phase(loop_strip, c) for c in clusters)
    row = meter.done(n)
    row.update(changed=changed)
    return row


def warm_up(cluster):
    """Import and first-call costs of both sides' modules, once, outside every measure."""
    _info(cluster, "v1", "Namespace", "default")
    _module("kubernetes.core.k8s", {"kubeconfig": cluster.kubeconfig, "state": "patched", "merge_type": ["merge"], "definition": {
        "apiVersion": ISVC_API, "kind": "InferenceService", "metadata": {"name": "absent", "namespace": "default"}, "spec": {}}})
    _module("alauda.spec_decoding.fleet_speculative_info",
            {"kubeconfig": cluster.kubeconfig, "namespaces": ["default"], "kinds": ["InferenceService"]})
    run_module("alauda.spec_decoding.isvc_speculative", {"kubeconfig": cluster.kubeconfig, "namespace": "default", "name": "absent",
                                                         "state": "absent", "wait": False})


def playbook_overhead(cluster, items):
    """A real ansible-playbook loop of kubernetes.core.k8s_info over ``items`` services: the task's seconds per item (a
    module process each), and the same calls in this process, to give the module-process start the sides leave out."""
    from tests.ansible_run import run_playbook  # pylint: disable=import-outside-toplevel
    names = [(ns, name) for ns in cluster.namespaces for name in cluster.names[ns]][:items]
    tasks = ("- name: Read each service\n  kubernetes.core.k8s_info:\n    api_version: %s\n    kind: InferenceService\n"
             "    namespace: '{{ item.0 }}'\n    name: '{{ item.1 }}'\n  loop: %s\n" % (ISVC_API, json.dumps([list(k) for k in names])))
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        run = run_playbook(tmp, tasks=tasks, kubeconfig=cluster.kubeconfig)
    if run.rc != 0:
        raise RuntimeError("the ansible-playbook loop failed: %s" % run.output[-2000:])
    start = time.perf_counter()
    for ns, name in names:
        _info(cluster, ISVC_API, "InferenceService", name, ns)
    in_process = (time.perf_counter() - start) / len(names)
    # the task's own span (the callback's start and end), not ansible-playbook's start and the play around it
    spans = [end - start for _play, tasks in run.timeline for name, start, end, _hosts in tasks if name == "Read each service" and end]
    per_task = (spans[0] if spans else run.wall) / len(names)
    return {"items": len(names), "playbook_wall_s": run.wall, "per_task_s": per_task, "in_process_per_call_s": in_process,
            "start_s": max(0.0, per_task - in_process)}


# -- the run ---------------------------------------------------------------------------------------------------------

def _median_row(runs):
    row = {}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[key] = statistics.median(r[key] for r in runs)
        else:
            row[key] = value
    return row


def run_size(clusters, size, run, reps, failures):
    originals, flagged = populate(clusters, size, run)
    for cluster in clusters:
        cluster.names = {ns: sorted(k[2] for k in originals if k[0] == cluster.index and k[1] == ns) for ns in cluster.namespaces}
    time.sleep(SETTLE_S)
    sides = {"fleet": [], "loop": []}
    for rep in range(reps):
        order = (("fleet", measure_fleet), ("loop", measure_loop))
        for side, measure in order[::-1] if rep % 2 else order:  # each side first in turn
            versions = reset(clusters, originals, flagged)
            row = measure(clusters, size)
            problems, _versions = judge(clusters, originals, flagged, expect_flag=False, versions_before=versions)
            if row["changed"] != len(flagged):
                problems.append("changed %d services, %d have the flag" % (row["changed"], len(flagged)))
            failures.extend("N=%d %s: %s" % (size, side, p) for p in problems[:5])
            sides[side].append(row)
    return {"n": size, "flagged": len(flagged), "fleet": _median_row(sides["fleet"]), "loop": _median_row(sides["loop"])}


def print_table(rows, clusters, overhead):
    print("\nmedians; %d API server(s), N split over them; the services have no pods (200 real engines do not fit here), so "
          "neither side waits for Ready nor proves the engine line" % clusters)
    head = "%5s %5s | %-5s | %7s %6s %8s %6s | %7s %6s %-34s %5s | %8s"
    print(head % ("N", "flag", "side", "wall s", "CPU s", "peak MB", "+MB", "API req", "/svc", "by verb (the API servers' count)",
                  "other", "apisrv s"))
    for row in rows:
        for side in ("fleet", "loop"):
            r = row[side]
            verbs = " ".join("%s=%d" % (v, c) for v, c in sorted(r["by_verb"].items()))
            print("%5d %5d | %-5s | %7.2f %6.2f %8.1f %6.1f | %7d %6.2f %-34s %5d | %8.2f" % (
                row["n"], row["flagged"], side, r["wall_s"], r["cpu_s"], r["peak_rss_mb"], r["peak_rss_mb"] - r["rss_start_mb"],
                r["requests"], r["requests_per_service"],
                verbs, r["other_requests"], r["apiserver_cpu_s"]))
        fl = row["fleet"]
        print("%5s %5s | fleet/loop wall %.2fx, CPU %.2fx, API requests %.2fx, API server CPU %.2fx; fleet discovery %d requests "
              "(client-counted %d), %.3f per service" % (
                  "", "", fl["wall_s"] / row["loop"]["wall_s"], fl["cpu_s"] / row["loop"]["cpu_s"],
                  fl["requests"] / max(1, row["loop"]["requests"]), fl["apiserver_cpu_s"] / max(1e-9, row["loop"]["apiserver_cpu_s"]),
                  fl["discovery_requests"], fl["client_counted_discovery"], fl["discovery_requests"] / row["n"]))
        # the collection's cluster modules run in the task's own process in a playbook (plugins/action, docs/DEVELOPING.md);
        # kubernetes.core's start a module process per task
        print("%5s %5s | module runs: fleet %d, loop %d%s" % (
            "", "", fl["module_runs"], row["loop"]["module_runs"],
            "" if not overhead else "; in a playbook the loop's each start a module process (%.2f s, the playbook loop below): "
            "about %.0f s" % (overhead["start_s"], row["loop"]["wall_s"] + row["loop"]["module_runs"] * overhead["start_s"])))
    print("peak MB: this process's peak RSS during the side (%s), +MB: above its RSS at the side's start (%.1f-%.1f MB). "
          "API req: the KServe group's requests the API servers counted (apiserver_request_total); the test bed's kube-apiserver "
          "(1.20) labels a GET by name of a namespaced custom resource LIST (seen on the wire: k8s_info's and isvc_speculative's "
          "reads are GETs by name), so GET and LIST are the server's labels, the totals are exact. other: the other JSON and "
          "discovery requests they counted in the window (the controller manager's discovery included). apisrv s: the kube-apiservers' CPU seconds." % (
              rows[0]["fleet"]["peak_rss_kind"], min(r[s]["rss_start_mb"] for r in rows for s in ("fleet", "loop")),
              max(r[s]["rss_start_mb"] for r in rows for s in ("fleet", "loop"))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="50,100,200")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clusters", type=int, default=2, choices=(1, 2, 3, 4, 5))
    parser.add_argument("--playbook-items", type=int, default=10, help="services of the real ansible-playbook loop (0: none)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("fleet rollback against a kubernetes.core k8s_info + k8s loop on %d test bed API server(s): InferenceServices as "
          "objects only - the services have no pods (200 real engines do not fit here), no engine is measured, neither side "
          "waits for Ready or proves the engine line; every module runs in this process (no module-process start)" % args.clusters)
    run = uuid.uuid4().hex[:4]
    bin_dir = testbed_build.build()
    planes, rows, failures, overhead = [], [], [], None
    try:
        for _index in range(args.clusters):
            plane = ControlPlane(bin_dir=bin_dir)
            planes.append(plane)
            plane.start()
            plane.install_crds(kserve_crd_dir())
        clusters = [Cluster(i, plane, run) for i, plane in enumerate(planes)]
        for cluster in clusters:
            cluster.api.post("%s/v1alpha1/clusterservingruntimes" % KSERVE, _runtime(cluster.csr))
        for cluster in clusters:  # each kubeconfig's API client is built (and cached by kubernetes.core) here
            warm_up(cluster)
        for size in sizes:
            rows.append(run_size(clusters, size, run, args.reps, failures))
            print("N=%d done: fleet %.2f s, loop %.2f s" % (size, rows[-1]["fleet"]["wall_s"], rows[-1]["loop"]["wall_s"]), flush=True)
            if args.playbook_items and overhead is None:  # at the smallest N, on its services
                overhead = playbook_overhead(clusters[0], args.playbook_items)
    finally:
        for plane in planes:
            plane.stop()
    print_table(rows, args.clusters, overhead)
    first, last = rows[0], rows[-1]
    growth = last["fleet"]["wall_s"] / first["fleet"]["wall_s"]
    loop_growth = last["loop"]["wall_s"] / first["loop"]["wall_s"]
    allowed = 1.1 * last["n"] / first["n"]
    print("growth N=%d -> %d: fleet %.2fx, loop %.2fx (wall); fleet %.2fx, loop %.2fx (CPU; the wall of the fleet is mostly "
          "waiting for the API servers, and moves with the machine's load)" % (
              first["n"], last["n"], growth, loop_growth, last["fleet"]["cpu_s"] / first["fleet"]["cpu_s"],
              last["loop"]["cpu_s"] / first["loop"]["cpu_s"]))
    if overhead:
        print("a real ansible-playbook loop of k8s_info over %d services: %.2f s a task (in this process %.3f s a call): "
              "about %.2f s a task of module-process start that the loop above leaves out (the collection's modules run in "
              "the task's own process in a playbook)" % (
                  overhead["items"], overhead["per_task_s"], overhead["in_process_per_call_s"],
                  overhead["start_s"]))
    verdicts = [
        ("fleet wall <= 1.0x the loop's at N=%d (%.2fx)" % (last["n"], last["fleet"]["wall_s"] / last["loop"]["wall_s"]),
         last["fleet"]["wall_s"] <= last["loop"]["wall_s"]),
        ("fleet growth N=%d -> %d: %.2fx <= %.2fx" % (first["n"], last["n"], growth, allowed), growth <= allowed),
        ("a service without the flag: <= 1 API request (discovery, amortised; max %.3f)"
         % max(r["fleet"]["discovery_requests"] / r["n"] for r in rows),
         all(r["fleet"]["discovery_requests"] <= r["n"] for r in rows)),
    ]
    for text, met in verdicts:
        print("%-78s %s" % (text, "met" if met else "MISSED"))
    for text in failures:
        print("FAILED: " + text)
    print(json.dumps({"bench": "fleet", "clusters": args.clusters, "rows": rows, "growth": growth, "loop_growth": loop_growth,
                      "playbook_overhead": overhead, "targets_met": all(m for _t, m in verdicts), "failures": failures}))
    return 0 if all(m for _t, m in verdicts) and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
