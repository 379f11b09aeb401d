"""Benchmark: a no-op redeploy with `playbooks/deploy-eagle3.yml` against a bare `kubernetes.core.k8s` apply of the same
manifest, side by side on the test bed (issue 29).

What it does
1. Starts one test bed (tests/testbed: etcd + kube-apiserver + kube-controller-manager with the KServe CRDs, the kubelet
   and KServe stand-ins; the binaries come from `python -m tests.testbed.build`), makes a namespace and deploys
   llama-eagle3 once with deploy-eagle3.yml in apply mode (spec_decoding_target=cluster) with the integration tests'
   variables (tests/integration/test_deploy.py BASE_VARS: PVC artifacts, wait for Ready, verify off). The KServe
   stand-in makes it Ready. Untimed.
2. The bare side is a one-task playbook: `kubernetes.core.k8s` server-side apply of the manifest that deploy's render
   produced (its `Render the InferenceService` result), under the same field manager, from a file (`src:`).
   One untimed run of it, then --reps timed runs of each side, interleaved (deploy, bare, deploy, bare, ...). Every run
   has Python's default bytecode writing (RUN_ENV), as a user's ansible-playbook has.
   Every run must report changed=0 and leave the InferenceService's resourceVersion as it was: a redeploy that
   changes something is not a no-op, and the script stops with the run's output.
3. Prints the median wall time of each side (and its CPU seconds, ansible-playbook and its children), the ratio
   deploy / bare, and per side the median time of each step of the run from the json callback's task durations:
   ansible-playbook's start up to its play (interpreter start, collection and playbook loading), each task from its
   start to the next one's (what the task took, plus the include or conditional handling before the next), and the
   end of the last task to the process's exit. When the ratio is over the target, the steps the deploy spends beyond
   the bare apply are listed, most expensive first.

Exit status: 1 when the ratio of the medians is over --target (1.2), or a run fails or changes something.

Usage: python tests/bench/bench_deploy.py [--reps 5] [--target 1.2] (`hack/bench.sh deploy` runs it). One JSON line at
the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(ROOT, ".build", "collections")
LINK = os.path.join(COLLECTIONS, "ansible_collections", "alauda", "spec_decoding")
if not os.path.exists(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(ROOT, LINK)
sys.path.insert(0, ROOT)
sys.path.insert(0, COLLECTIONS)

# pylint: disable=wrong-import-position
from tests.ansible_run import run_playbook  # noqa: E402
from tests.integration.test_deploy import BASE_VARS, GROUP, PLURAL, VERSION  # noqa: E402
from tests.testbed import build as testbed_build  # noqa: E402
from tests.testbed.controlplane import ControlPlane, kserve_crd_dir  # noqa: E402
from tests.testbed.fixtures import module_namespace  # noqa: E402
from tests.testbed.kserve_standin import KServeStandIn  # noqa: E402
from tests.testbed.kubelet import KubeletStandIn  # noqa: E402

PLAYBOOK = "playbooks/deploy-eagle3.yml"
NAME = "llama-eagle3"
FIELD_MANAGER = "alauda-spec-decoding"  # the deploy role's (inference_service_field_manager)
STARTUP = "(ansible-playbook start up to the play: interpreter, collections, playbook and roles loaded)"
PLAY = "(play start up to its first task)"
EXIT = "(last task's end up to the exit)"
APPLY = "apply"
BARE_TASK = """\
- name: Apply the InferenceService
  kubernetes.core.k8s:
    state: present
    src: {src}
    apply: true
    server_side_apply:
      field_manager: {manager}
"""


# Python's default: ansible-playbook writes and reads the bytecode of the collection's files (plugin_utils/bytecode_cache.py).
# A PYTHONDONTWRITEBYTECODE inherited from the shell that runs the bench (a sandbox or CI image may set it) would
# measure every redeploy compiling them from source again, which a user's ansible-playbook does not; empty is unset.
RUN_ENV = {"PYTHONDONTWRITEBYTECODE": ""}


def steps(run):
    """[(step, seconds, key)] of one run: its start up to the play, the play's start up to its first task, each task up to
    the next task's start (the last one up to its end), then the rest up to the exit; they add up to the run's wall time.
    `key` pairs a step with the same step of the other side: the server-side apply task is "apply" on both."""
    (play_start, tasks), = run.timeline  # one host, one play (a serial batch would be a play of its own)
    out = [(STARTUP, play_start - run.started, STARTUP), (PLAY, (tasks[0][1] if tasks else play_start) - play_start, PLAY)]
    last_end = play_start
    for i, (name, start, end, hosts) in enumerate(tasks):
        results = list(hosts.values())
        state = ("skipped" if any(r.get("skipped") for r in results) else "changed" if any(r.get("changed") for r in results)
                 else "ok" if results else "include")
        last_end = tasks[i + 1][1] if i + 1 < len(tasks) else (end or start)
        label = "%s [%s]" % (name, state)
        out.append((label, last_end - start, APPLY if any(r.get("action") == "kubernetes.core.k8s" for r in results) else label))
    out.append((EXIT, run.started + run.wall - last_end, EXIT))
    return out


def check_noop(run, what, rest, path, version):
    """Stop when the run failed, reported a change or wrote the InferenceService."""
    if run.rc != 0:
        raise SystemExit("%s failed (rc %d):\n%s" % (what, run.rc, run.output))
    if run.changed != 0:
        changed = [name for name, _h, res in run.tasks if res.get("changed")]
        raise SystemExit("%s is not a no-op: changed=%d (%s); the InferenceService already holds what it renders, so nothing "
                         "should change:\n%s" % (what, run.changed, ", ".join(changed), run.output))
    now = rest.get(path)["metadata"]["resourceVersion"]
    if now != version:
        raise SystemExit("%s wrote the InferenceService (resourceVersion %s -> %s) although it reported changed=0" % (what, version, now))


def table(title, runs):
    """Median seconds of each step over `runs` (all ran the same steps); prints them and returns [(step, seconds)]."""
    per_run = [steps(run) for run in runs]
    names = [name for name, _s, _k in per_run[0]]
    if any([name for name, _s, _k in other] != names for other in per_run[1:]):
        raise SystemExit("%s: the runs did not run the same tasks: %s" % (title, [[n for n, _s, _k in o] for o in per_run]))
    med = [(name, statistics.median(r[i][1] for r in per_run), key) for i, (name, _s, key) in enumerate(per_run[0])]
    total = statistics.median(run.wall for run in runs)
    print("\n%s: median seconds per step over %d runs, share of the median wall time %.2f s" % (title, len(runs), total))
    for name, secs, _key in med:
        print("  %6.2f s %4.0f%%  %s" % (secs, 100 * secs / total, name))
    return med


def start_testbed():
    """The test bed the integration tier runs on (tests/testbed/fixtures.py), started once for this script."""
    cp = ControlPlane(bin_dir=testbed_build.build())
    cp.start()
    kubelet = kserve = None
    try:
        cp.install_crds(kserve_crd_dir())
        cp.wait_for_controller_manager()
        kubelet = KubeletStandIn(cp).start()
        kserve = KServeStandIn(cp, kubelet=kubelet).start()
    except BaseException:
        stop_testbed(cp, kubelet, kserve)
        raise
    return cp, kubelet, kserve


def stop_testbed(cp, kubelet, kserve):
    for standin in (kserve, kubelet):
        if standin is not None:
            standin.stop()
    cp.stop()


def bench(cp, kserve, work, reps):  # pylint: disable=too-many-locals
    with module_namespace(cp, "bench-deploy") as namespace:
        kserve.set_behaviour(namespace, NAME, ready_after=0.0)
        deploy_vars = dict(BASE_VARS, spec_decoding_namespace=namespace, spec_decoding_isvc_name=NAME)
        first = run_playbook(work, PLAYBOOK, extra_vars=deploy_vars, kubeconfig=cp.kubeconfig, env=RUN_ENV)
        if first.rc != 0:
            raise SystemExit("the first deploy failed (rc %d):\n%s" % (first.rc, first.output))
        manifest = os.path.join(work, "inferenceservice.json")
        with open(manifest, "w", encoding="utf-8") as handle:
            json.dump(first.result("Render the InferenceService")["manifest"], handle)
        bare_play = BARE_TASK.format(src=manifest, manager=FIELD_MANAGER)
        rest = cp.rest()
        try:
            path = "/apis/%s/%s/namespaces/%s/%s/%s" % (GROUP, VERSION, namespace, PLURAL, NAME)
            version = rest.get(path)["metadata"]["resourceVersion"]
            print("first deploy (creates %s/%s, waits for Ready): %.2f s wall, %.2f CPU s; resourceVersion %s" % (
                namespace, NAME, first.wall, first.cpu, version), flush=True)
            warm = run_playbook(work, tasks=bare_play, kubeconfig=cp.kubeconfig, env=RUN_ENV)
            check_noop(warm, "the untimed bare apply", rest, path, version)
            runs = {"deploy": [], "bare": []}
            for rep in range(reps):
                deploy = run_playbook(work, PLAYBOOK, extra_vars=deploy_vars, kubeconfig=cp.kubeconfig, env=RUN_ENV)
                check_noop(deploy, "redeploy %d" % (rep + 1), rest, path, version)
                runs["deploy"].append(deploy)
                bare = run_playbook(work, tasks=bare_play, kubeconfig=cp.kubeconfig, env=RUN_ENV)
                check_noop(bare, "bare apply %d" % (rep + 1), rest, path, version)
                runs["bare"].append(bare)
                print("rep %d: redeploy %.2f s (%.2f CPU s) | bare apply %.2f s (%.2f CPU s)  (load %.1f)" % (
                    rep + 1, deploy.wall, deploy.cpu, bare.wall, bare.cpu, os.getloadavg()[0]), flush=True)
        finally:
            rest.close()
    return runs


def main():  # pylint: disable=too-many-locals
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--reps", type=int, default=5, help="timed runs of each side (default 5)")
    parser.add_argument("--target", type=float, default=1.2, help="highest ratio deploy / bare apply that passes (default 1.2)")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="bench-deploy-")
    print("starting the test bed (cpus %d; load average %s)" % (os.cpu_count(), " ".join("%.1f" % x for x in os.getloadavg())),
          flush=True)
    testbed = start_testbed()
    try:
        runs = bench(testbed[0], testbed[2], work, args.reps)
    finally:
        stop_testbed(*testbed)
        shutil.rmtree(work, ignore_errors=True)

    med = {side: statistics.median(run.wall for run in side_runs) for side, side_runs in runs.items()}
    cpu = {side: statistics.median(run.cpu for run in side_runs) for side, side_runs in runs.items()}
    ratio = med["deploy"] / med["bare"]
    deploy_steps = table("redeploy (%s, changed=0)" % PLAYBOOK, runs["deploy"])
    bare_steps = table("bare apply (one kubernetes.core.k8s task, changed=0)", runs["bare"])
    print()
    print("median of %d, wall: redeploy %.2f s, bare apply %.2f s (CPU s: %.2f, %.2f; load average %.1f)" % (
        args.reps, med["deploy"], med["bare"], cpu["deploy"], cpu["bare"], os.getloadavg()[0]))
    print("per rep, wall: redeploy %s | bare apply %s" % (" ".join("%.2f" % r.wall for r in runs["deploy"]),
                                                          " ".join("%.2f" % r.wall for r in runs["bare"])))
    print("ratio redeploy / bare apply: %.2f  (CPU s ratio %.2f)" % (ratio, cpu["deploy"] / cpu["bare"]))
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        print("note: load average %.1f on %d CPUs: other work left no idle core, so every step's wall time stretches with its CPU"
              " time; the CPU s ratio is the steadier figure" % (os.getloadavg()[0], os.cpu_count() or 1))
    if ratio > args.target:
        # The bare run's steps are the floor every ansible-playbook run pays; what the deploy spends beyond them is the rest.
        bare = {key: secs for _name, secs, key in bare_steps}
        extra = sorted(((secs - bare.get(key, 0.0), name) for name, secs, key in deploy_steps), reverse=True)
        print("where the %.2f s over the bare apply go (each step of the redeploy minus the same step of the bare run):" % (
            med["deploy"] - med["bare"]))
        small = [secs for secs, _name in extra if abs(secs) < 0.05]
        for secs, name in extra:
            if abs(secs) >= 0.05:
                print("  %+6.2f s  %s" % (secs, name))
        print("  %+6.2f s  in %d other steps of less than 0.05 s each (skipped tasks, includes)" % (sum(small), len(small)))
    print(json.dumps({"bench_deploy": {
        "reps": args.reps, "median_s": {k: round(v, 3) for k, v in med.items()}, "cpu_s": {k: round(v, 3) for k, v in cpu.items()},
        "ratio": round(ratio, 3), "walls": {k: [round(r.wall, 3) for r in v] for k, v in runs.items()},
        "steps_s": {"deploy": [(n, round(s, 3)) for n, s, _k in deploy_steps], "bare": [(n, round(s, 3)) for n, s, _k in bare_steps]}}},
        sort_keys=True))
    passed = ratio <= args.target
    print("target: ratio redeploy / bare apply %.2f <= %.2f: %s" % (ratio, args.target, "PASS" if passed else "MISS"))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
