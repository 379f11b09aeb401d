"""`make cluster-up` / `make cluster-down`: a local loopback control plane for dry runs.

    python -m tests.testbed.cli up      # build/reuse binaries, start etcd + kube-apiserver + controller manager,
                                        # install the KServe CRDs, run the kubelet + KServe stand-ins in the
                                        # background; prints the kubeconfig path
    python -m tests.testbed.cli status  # prints the kubeconfig path of the running test bed, or exits 1
    python -m tests.testbed.cli down    # stops exactly the processes `up` started and removes the run directory
    python -m tests.testbed.cli export-crds DIR   # writes the serving.kserve.io CRDs of the running test bed into DIR
                                        # (read back with the kubernetes client: usable as ALAUDA_KSERVE_CRDS=DIR)

`up` finds the KServe CRDs first, in the order of tests/testbed/crds.py ($ALAUDA_KSERVE_CRDS, ../shared/kserve-crds,
a cluster named by $ALAUDA_KSERVE_CRDS_KUBECONFIG [+ $ALAUDA_KSERVE_CRDS_CONTEXT]), and stops with those three ways
named, before building anything, when there is none.

The run directory (certs, kubeconfigs, logs, state.json) is a fresh temp dir per run; `.build/testbed/current`
in the checkout points to it.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading

from . import build as _build
from .controlplane import REPO_ROOT, ControlPlane, ControlPlaneError, kserve_crd_dir, stop_from_state, _pid_alive
from .crds import CrdsNotFound, export_from_cluster

POINTER = os.path.join(REPO_ROOT, ".build", "testbed", "current")


def _current() -> str | None:
    try:
        with open(POINTER, encoding="utf-8") as fh:
            state_dir = fh.read().strip()
    except OSError:
        return None
    return state_dir if os.path.isfile(os.path.join(state_dir, "state.json")) else None


def _running(state_dir: str) -> bool:
    import json  # pylint: disable=import-outside-toplevel
    with open(os.path.join(state_dir, "state.json"), encoding="utf-8") as fh:
        procs = json.load(fh).get("processes", {})
    return bool(procs.get("kube-apiserver")) and _pid_alive(procs["kube-apiserver"]["pid"])


def up() -> int:
    state_dir = _current()
    if state_dir and _running(state_dir):
        cp = ControlPlane.attach(state_dir)
        print(f"test bed already running ({cp.server}); kubeconfig:", file=sys.stderr)
        print(cp.kubeconfig)
        return 0
    # The CRDs first: without them there is nothing to test against, so stop before a build of minutes.
    try:
        crds = kserve_crd_dir()
    except CrdsNotFound as exc:
        print(f"cluster-up: {exc}", file=sys.stderr)
        return 1
    try:
        bin_dir = _build.build()
    except _build.BuildError as exc:
        print(f"cluster-up: build failed: {exc}", file=sys.stderr)
        return 1
    cp = ControlPlane(bin_dir=bin_dir)
    try:
        cp.start()
        cp.install_crds(crds)
        log = open(os.path.join(cp.log_dir, "standins.log"), "ab")  # pylint: disable=consider-using-with
        helper = subprocess.Popen([sys.executable, "-m", "tests.testbed.cli", "_standins", cp.state_dir],
                                  cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        log.close()
        cp.add_process("standins", helper)
    except (ControlPlaneError, OSError) as exc:
        cp.stop()
        print(f"cluster-up failed: {exc}", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(POINTER), exist_ok=True)
    with open(POINTER, "w", encoding="utf-8") as fh:
        fh.write(cp.state_dir + "\n")
    print(f"test bed up in {cp.timings['started']:.1f} s at {cp.server} (state {cp.state_dir})", file=sys.stderr)
    print(f"  export KUBECONFIG={cp.kubeconfig}   # stop with: make cluster-down", file=sys.stderr)
    print(f"  pod logs are served from {cp.state_dir}/kubelet-logs/<namespace>/<pod>/<container>.log "
          "(CRI format: '<RFC3339 time> stdout F <line>')", file=sys.stderr)
    print(cp.kubeconfig)
    return 0


def down() -> int:
    state_dir = _current()
    if not state_dir:
        print("cluster-down: no test bed is recorded as running", file=sys.stderr)
        return 0
    stopped = stop_from_state(state_dir)
    shutil.rmtree(state_dir, ignore_errors=True)
    os.remove(POINTER)
    print(f"cluster-down: stopped {', '.join(stopped)}; removed {state_dir}", file=sys.stderr)
    return 0


def status() -> int:
    state_dir = _current()
    if state_dir and _running(state_dir):
        print(ControlPlane.attach(state_dir).kubeconfig)
        return 0
    print("no test bed running", file=sys.stderr)
    return 1


def export_crds(out_dir: str) -> int:
    """Write the serving.kserve.io CRDs of the running test bed into `out_dir`, read with the kubernetes client (the
    same code that copies them out of a user's cluster, tests/testbed/crds.py)."""
    state_dir = _current()
    if not (state_dir and _running(state_dir)):
        print("export-crds: no test bed running (start one with make cluster-up)", file=sys.stderr)
        return 1
    try:
        names = export_from_cluster(ControlPlane.attach(state_dir).kubeconfig, None, out_dir)
    except CrdsNotFound as exc:
        print(f"export-crds: {exc}", file=sys.stderr)
        return 1
    print(f"export-crds: wrote {', '.join(names)} to {out_dir} (use: ALAUDA_KSERVE_CRDS={os.path.abspath(out_dir)})",
          file=sys.stderr)
    return 0


def _standins(state_dir: str) -> int:
    """Background helper of `up`: run the kubelet and KServe stand-ins until SIGTERM."""
    from .kserve_standin import KServeStandIn  # pylint: disable=import-outside-toplevel
    from .kubelet import KubeletStandIn  # pylint: disable=import-outside-toplevel
    cp = ControlPlane.attach(state_dir)
    cp.wait_for_controller_manager()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    kubelet = KubeletStandIn(cp, log_dir=os.path.join(state_dir, "kubelet-logs")).start()
    kserve = KServeStandIn(cp, kubelet=kubelet).start()
    print(f"stand-ins running: node {kubelet.node_name} on 127.0.0.1:{kubelet.port}", flush=True)
    done.wait()
    kserve.stop()
    kubelet.stop()
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["up"]:
        return up()
    if argv[:1] == ["down"]:
        return down()
    if argv[:1] == ["status"]:
        return status()
    if argv[:1] == ["export-crds"] and len(argv) == 2:
        return export_crds(argv[1])
    if argv[:1] == ["_standins"] and len(argv) == 2:
        return _standins(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
