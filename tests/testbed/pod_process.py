"""The kubelet stand-in's process mode: a pod whose containers are real processes (kubelet.py hands such pods here).

A pod is in process mode when its annotation `testbed.alauda.io/run` is `process` or the test bed says so
(`kubelet.set_behaviour(match, PodBehaviour(run="process"))`). One `ProcessPod` (the kubelet's pod worker) then:
- pulls and unpacks the images of the containers whose registry the node knows (images.py, `kubelet.add_registry()`;
  a failed pull: `ErrImagePull`, retried) and builds the sandbox (pod_sandbox.py: network and mount namespaces, pod IP
  from the node's pod network, volumes, one root per container: this host's files, or the container's image);
- runs the init containers in order, each to success, then starts the containers;
- writes each container's stdout and stderr, line by line, as CRI records to the log files the kubelet's
  /containerLogs serves (`follow`, `tailLines`, `sinceTime`, `previous`); a restart moves the log to `previous`;
- probes as the kubelet does: startupProbe, then livenessProbe and readinessProbe (httpGet, tcpSocket, exec) with their
  delays, periods, timeouts and thresholds; Ready follows the readiness of every container. Until it passes, a startup
  or readiness probe with a period longer than the kubelet stand-in's `probe_period_max` (1 s by default) runs at that
  period with the failure threshold scaled to keep the probe's time to fail (`probe_cadence`): a pod is seen ready
  within a second of its server, not up to 10 s later; liveness and a passing readiness probe keep their own period;
- binds a termination-log file per container at its `terminationMessagePath` (in the container's own /dev tmpfs by
  default) and fills `terminated.message` from it as the kubelet does (FallbackToLogsOnError: the log's tail when the
  file is empty and the container failed);
- restarts a container that exited per restartPolicy with the kubelet's back-off (the first restart at once, then 10 s
  doubling to 300 s; `testbed.alauda.io/backoff-seconds` sets the base, so a test need not wait 10 s), the container
  `waiting` with reason CrashLoopBackOff meanwhile, `lastState.terminated` and `restartCount` as the kubelet reports;
  a pod with restartPolicy Never or OnFailure ends Succeeded or Failed;
- on deletion sends SIGTERM to every container, SIGKILL after the grace period, removes the sandbox and finishes the
  deletion.
Status goes to the API server as a merge patch of `status` whenever what it says changed.
"""
from __future__ import annotations

import datetime
import http.client
import math
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
import uuid

from . import images, pod_network, pod_services
from .pod_sandbox import (BACKOFF_ANNOTATION, RUN_ANNOTATION, PodConfigError, container_argv, container_env, container_mounts,
                          exec_argv, process_env, sandbox_script, termination_message, volume_sources)

BACKOFF_MAX = 300.0
TICK = 0.1


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


def _stamp(ts) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


def probe_cadence(probe: dict, period_max: float | None) -> tuple[float, int]:
    """(seconds between two runs of ``probe``, failures in a row that fail it): the probe's ``periodSeconds`` and
    ``failureThreshold`` (the kubelet's defaults 10 and 3), with the period at most ``period_max`` seconds (the
    kubelet stand-in's ``probe_period_max``; None: the probe's own) and the failure threshold raised by the same factor,
    so that the time a probe is given before it fails (threshold x period) stays the probe's own. Only the moment a
    passing probe is seen moves: a vLLM predictor's startupProbe (period 10 s) saw its server ready 0-10 s after vLLM's
    `Application startup complete.`, a wait no test asserts anything about; with a 1 s period, within about a second
    (a pod whose server answered 3, 6 and 9 s after it started: Ready after 10.6 s each time, then after 4.6, 7.4 and
    10.6 s). The success threshold is a count of passes, as the kubelet's; a probe that hangs until its timeout is given
    more time to fail, never less."""
    period = float(probe.get("periodSeconds", 10))
    failures = int(probe.get("failureThreshold", 3))
    if period_max is None or period <= period_max:
        return period, failures
    return float(period_max), int(math.ceil(failures * period / period_max))


class _Container:
    """One container of the pod: its process, its log writers, its probe state and what the kubelet reports for it."""

    def __init__(self, spec: dict, init: bool):
        self.spec = spec
        self.name = spec["name"]
        self.init = init
        self.proc = None
        self.started_at = None
        self.restarts = 0
        self.last_terminated = None
        self.termination_log = None  # host file bound at terminationMessagePath
        self.image = None        # images.Image when the container runs in its image's root filesystem
        self.working_dir = spec.get("workingDir") or "/"
        self.terminated = None   # the current instance's end, when it ended and is not restarted
        self.waiting = {"reason": "ContainerCreating"}
        self.next_start = 0.0
        self.instance = 0        # bumps at each start: log followers of the old instance stop
        self.writers = []
        self.started = False     # startupProbe passed (or none)
        self.ready = False
        self.probe_state = {}    # probe kind -> {"next": t, "ok": n, "fail": n}

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ProcessPod:
    """The pod worker for one process-mode pod (a thread)."""

    def __init__(self, kubelet, pod: dict):
        self.kubelet = kubelet
        self.pod = pod
        meta = pod["metadata"]
        self.ns, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = os.path.join(kubelet.pods_dir, self.uid)
        self.pod_ip = None
        self.sandbox = None
        self.roots = {}
        self.service_proxy = None
        self.init_containers = [_Container(c, True) for c in pod["spec"].get("initContainers") or []]
        self.containers = [_Container(c, False) for c in pod["spec"].get("containers") or []]
        self.restart_policy = pod["spec"].get("restartPolicy", "Always")
        base = (meta.get("annotations") or {}).get(BACKOFF_ANNOTATION)
        self.backoff_base = float(base) if base else kubelet.backoff_seconds
        self.start_time = _now()
        self.config_error = None
        self.config_reason = None
        self.phase = "Pending"
        self.grace = None       # set when the pod is being deleted
        self.done = threading.Event()
        self._wake = threading.Event()
        self._last_status = None
        self._transitions = {}  # condition type -> (status, lastTransitionTime)
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.ns}/{self.name}", daemon=True)

    # ------------------------------------------------------------------ control from the kubelet

    def start(self) -> "ProcessPod":
        self.thread.start()
        return self

    def terminate(self, grace: float) -> None:
        """Deletion: stop the containers (SIGTERM, SIGKILL after `grace` seconds) and finish the deletion."""
        with self._lock:
            if self.grace is None or grace < self.grace:
                self.grace = grace
        self._wake.set()

    def container(self, name: str):
        for c in self.containers + self.init_containers:
            if c.name == name:
                return c
        return None

    # ------------------------------------------------------------------ the worker

    def _run(self) -> None:
        api = self.kubelet.cp.rest()
        try:
            self._lifecycle(api)
        except Exception as exc:  # pylint: disable=broad-except
            if not self.kubelet.stopping:
                self.kubelet.errors.append(f"kubelet: process pod {self.ns}/{self.name}: {exc!r}")
        finally:
            try:
                self._stop_all(0 if self.kubelet.stopping else (self.grace or 0))
                self._teardown()
                if self.grace is not None and not self.kubelet.stopping:
                    self.kubelet.finish_deletion(api, self.ns, self.name, self.uid)
            finally:
                api.close()
                self.done.set()

    def _deleting(self) -> bool:
        return self.grace is not None or self.kubelet.stopping

    def _lifecycle(self, api) -> None:
        while not self._deleting():
            try:
                self._make_sandbox(api)
                break
            except PodConfigError as exc:
                self.config_error = str(exc)
                self.config_reason = getattr(exc, "reason", "CreateContainerConfigError")
                self._post(api)
                self._wake.wait(1.0)
                self._wake.clear()
        self.config_error = None
        for c in self.init_containers:
            while not self._deleting():
                self._step(api, c)
                if c.terminated is not None and c.terminated["exitCode"] == 0:
                    break
                if self.phase == "Failed":
                    return self._idle(api)
                self._post(api)
                self._wake.wait(TICK)
        while not self._deleting():
            for c in self.containers:
                self._step(api, c)
                self._probe(c)
            self._post(api)
            if self.phase in ("Succeeded", "Failed"):
                return self._idle(api)
            self._wake.wait(TICK)
        return None

    def _idle(self, api) -> None:
        self._post(api)
        self._teardown()
        while not self._deleting():
            self._wake.wait(1.0)

    # ------------------------------------------------------------------ sandbox

    def _read(self, api):
        from .rest import ApiError  # pylint: disable=import-outside-toplevel

        def read(kind, namespace, name):
            path = f"/api/v1/namespaces/{namespace}/{kind}/{name}" if namespace else f"/api/v1/{kind}/{name}"
            try:
                return api.get(path)
            except ApiError as exc:
                if exc.status == 404:
                    return None
                raise
        return read

    def _make_sandbox(self, api) -> None:
        read = self._read(api)
        os.makedirs(os.path.join(self.dir, "tmp"), mode=0o1777, exist_ok=True)
        os.chmod(os.path.join(self.dir, "tmp"), 0o1777)
        sources = volume_sources(self.pod, self.dir, read)
        if self.pod_ip is None:
            self.pod_ip = self.kubelet.network.allocate_ip()
        # Cluster DNS for the pod (pod_services.py): the Services as they are now, in the pod's own /etc/hosts.
        services = api.get("/api/v1/services").get("items") or []
        hosts = pod_services.write_hosts(self.dir, pod_services.hosts_text(services, self.ns, self.name, self.pod_ip))
        roots = []
        secrets = None
        for c in self.init_containers + self.containers:
            root = os.path.join(self.dir, "roots", c.name)
            os.makedirs(root, exist_ok=True)
            self.roots[c.name] = root
            layer = None
            if self.kubelet.images.knows(c.spec.get("image")):
                if secrets is None:  # the pod's pull Secrets (ServiceAccount ones included by admission); a missing one is skipped
                    secrets = [s for s in (read("secrets", self.ns, ref.get("name"))
                                           for ref in self.pod["spec"].get("imagePullSecrets") or []) if s is not None]
                c.image = self.kubelet.images.get(c.spec["image"], _pull_policy(c.spec), secrets)
                c.working_dir = c.spec.get("workingDir") or c.image.config.get("WorkingDir") or "/"
                layer = (c.image.rootfs, os.path.join(self.dir, "layers", c.name))
            c.termination_log = os.path.join(self.dir, "termination", c.name)
            os.makedirs(os.path.dirname(c.termination_log), exist_ok=True)
            with open(c.termination_log, "w", encoding="utf-8"):
                os.chmod(c.termination_log, 0o666)
            mounts = container_mounts(self.pod, c.spec, sources) + [
                (c.termination_log, os.path.normpath(c.spec.get("terminationMessagePath") or "/dev/termination-log"), False),
                (hosts, "/etc/hosts", True)]
            roots.append((root, mounts, c.working_dir, layer))
            image_config = c.image.config if c.image else None
            c.env = process_env(self.pod, container_env(self.pod, c.spec, self.pod_ip, read), image_config)
            c.argv = container_argv(c.spec, c.env, image_config)
        script = sandbox_script(self.pod_ip, roots, os.path.join(self.dir, "tmp"),
                                [path for path, memory in sources.values() if memory])
        proc = subprocess.Popen(["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", script],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            proc.kill()
            err = proc.stderr.read().decode(errors="replace")
            proc.wait()
            raise PodConfigError(f"pod sandbox failed: {err.strip() or 'no output'}")
        self.sandbox = proc
        self.kubelet.network.attach(self.pod_ip, f"/proc/{proc.pid}/ns/net")
        self.service_proxy = pod_services.ServiceProxy(self.kubelet.cp.rest, self.kubelet.network, f"/proc/{proc.pid}/ns/net",
                                                       services)
        self.phase = "Pending"

    def _teardown(self) -> None:
        if self.service_proxy is not None:
            self.service_proxy.close()
            self.service_proxy = None
        if self.sandbox is not None:
            if self.pod_ip:
                self.kubelet.network.detach(self.pod_ip)
            self.sandbox.kill()
            self.sandbox.wait()
            self.sandbox = None
        if self.grace is not None or self.kubelet.stopping:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ containers

    def _start(self, c: _Container) -> None:
        log = self.kubelet.container_log(self.ns, self.name, c.name)
        if c.instance:
            log.rotate()
        with open(c.termination_log, "w", encoding="utf-8"):
            pass  # each instance starts with an empty termination-log, as the kubelet gives it a new file
        c.proc = subprocess.Popen(exec_argv(self.sandbox.pid, self.roots[c.name], c.working_dir, c.argv),
                                  env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        c.instance += 1
        c.started_at = _now()
        c.started_mono = time.monotonic()
        c.waiting = None
        c.terminated = None
        c.started = "startupProbe" not in c.spec
        c.ready = False
        c.probe_state = {}
        c.writers = [log.pipe(c.proc.stdout, "stdout"), log.pipe(c.proc.stderr, "stderr")]

    def _restart_allowed(self, c: _Container, code: int) -> bool:
        if c.init:
            return code != 0 and self.restart_policy != "Never"
        return self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0)

    def _step(self, api, c: _Container) -> None:  # pylint: disable=unused-argument
        now = time.monotonic()
        if c.proc is None:
            if c.terminated is None and now >= c.next_start:
                self._start(c)
            return
        code = c.proc.poll()
        if code is None:
            return
        for writer in c.writers:
            writer.join(timeout=2)
        exit_code = code if code >= 0 else 128 - code
        finished = {"exitCode": exit_code,
                    "reason": "Completed" if code == 0 else "Error", "startedAt": _stamp(c.started_at),
                    "finishedAt": _stamp(_now()), "containerID": self._cid(c)}
        message = termination_message(c.termination_log, c.spec.get("terminationMessagePolicy") or "File", exit_code,
                                      (line for _stamp_, line in self.kubelet.read_records(self.ns, self.name, c.name) or []))
        if message:
            finished["message"] = message
        if code < 0:
            finished["signal"] = -code
        c.proc = None
        c.ready = False
        if not self._restart_allowed(c, code):
            c.terminated = finished
            self._settle_phase()
            return
        c.last_terminated = finished
        # The kubelet's back-off: none before the first restart, then base, doubling, at most 300 s.
        delay = 0.0 if c.restarts == 0 else min(self.backoff_base * 2 ** (c.restarts - 1), BACKOFF_MAX)
        c.restarts += 1
        c.next_start = now + delay
        if delay:
            c.waiting = {"reason": "CrashLoopBackOff",
                         "message": f"back-off {delay:g}s restarting failed container={c.name} pod={self.name}_{self.ns}"
                                    f"({self.uid})"}
            return
        self._start(c)

    def _settle_phase(self) -> None:
        if any(c.init and c.terminated and c.terminated["exitCode"] for c in self.init_containers):
            self.phase = "Failed"
            return
        if self.containers and all(c.terminated is not None for c in self.containers):
            self.phase = "Succeeded" if all(c.terminated["exitCode"] == 0 for c in self.containers) else "Failed"

    def _cid(self, c: _Container) -> str:
        return "process://" + uuid.uuid5(uuid.NAMESPACE_URL, f"{self.uid}/{c.name}/{c.instance}").hex

    def _stop_all(self, grace: float) -> None:
        """SIGTERM to every running container's process group, SIGKILL to what still runs after `grace` seconds."""
        running = [c for c in self.containers + self.init_containers if c.running]
        for c in running:
            _signal_group(c.proc, signal.SIGTERM)
        start = time.monotonic()
        # A shorter grace given meanwhile (a forced delete, the kubelet stopping) cuts the wait short.
        while any(c.proc.poll() is None for c in running):
            limit = 0.0 if self.kubelet.stopping else min(grace, self.grace if self.grace is not None else grace)
            if time.monotonic() - start >= limit:
                break
            time.sleep(0.05)
        for c in running:
            if c.proc.poll() is None:
                _signal_group(c.proc, signal.SIGKILL)
                c.proc.wait()
            for writer in c.writers:
                writer.join(timeout=2)

    # ------------------------------------------------------------------ probes

    def _probe(self, c: _Container) -> None:
        if not c.running:
            return
        now = time.monotonic()
        if not c.started:
            result = self._due(c, "startupProbe", now)
            if result is True:
                c.started = True
            elif result is False:
                _signal_group(c.proc, signal.SIGKILL)  # the startup probe gave up: the kubelet kills, then restarts
            return
        if "livenessProbe" in c.spec and self._due(c, "livenessProbe", now) is False:
            _signal_group(c.proc, signal.SIGKILL)
            return
        if "readinessProbe" not in c.spec:
            c.ready = True
            return
        result = self._due(c, "readinessProbe", now)
        if result is not None:
            c.ready = result

    def _due(self, c: _Container, kind: str, now: float):
        """Run `kind` if its period came; True/False once its success/failure threshold is reached, else None."""
        probe = c.spec.get(kind)
        if not probe:
            return True
        state = c.probe_state.setdefault(kind, {"next": c.started_mono + probe.get("initialDelaySeconds", 0),
                                                "ok": 0, "fail": 0, "result": None})
        if now < state["next"]:
            return state["result"] if kind == "readinessProbe" else None
        # the short cadence only until the probe passes (startup, readiness until Ready): what it buys is a pod seen
        # ready soon after its server; liveness and a passing readiness probe keep their own period, as every probe of
        # every running pod at 1 s cost the integration tier CPU for nothing
        fast = kind != "livenessProbe" and state["result"] is not True
        period, failures = probe_cadence(probe, self.kubelet.probe_period_max if fast else None)
        state["next"] = now + period
        if self._run_probe(c, probe):
            state["ok"], state["fail"] = state["ok"] + 1, 0
            if state["ok"] >= probe.get("successThreshold", 1):
                state["result"] = True
        else:
            state["ok"], state["fail"] = 0, state["fail"] + 1
            if state["fail"] >= failures:
                state["result"] = False
        return state["result"]

    def _port(self, c: _Container, port) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        return -1

    def _run_probe(self, c: _Container, probe: dict) -> bool:
        timeout = probe.get("timeoutSeconds", 1)
        netns = f"/proc/{self.sandbox.pid}/ns/net"
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                sock = pod_network.connect(get.get("host") or self.pod_ip, self._port(c, get["port"]), netns, timeout)
                if get.get("scheme", "HTTP").upper() == "HTTPS":
                    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                    sock = ctx.wrap_socket(sock)
                conn = http.client.HTTPConnection(self.pod_ip, timeout=timeout)
                conn.sock = sock
                headers = {"User-Agent": "kube-probe/1.20", "Accept": "*/*"}
                headers.update({h["name"]: h["value"] for h in get.get("httpHeaders") or []})
                conn.request("GET", get.get("path") or "/", headers=headers)
                status = conn.getresponse().status
                conn.close()
                return 200 <= status < 400
            if "tcpSocket" in probe:
                sock = pod_network.connect(probe["tcpSocket"].get("host") or self.pod_ip,
                                           self._port(c, probe["tcpSocket"]["port"]), netns, timeout)
                sock.close()
                return True
            if "exec" in probe:
                argv = exec_argv(self.sandbox.pid, self.roots[c.name], c.working_dir, probe["exec"]["command"])
                return subprocess.run(argv, env=c.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, timeout=timeout, check=False).returncode == 0
        except (OSError, http.client.HTTPException, subprocess.TimeoutExpired, ssl.SSLError):
            return False
        return False

    # ------------------------------------------------------------------ status

    def _container_status(self, c: _Container) -> dict:
        out = {"name": c.name, "image": c.spec.get("image") or "", "imageID": c.image.image_id if c.image else "",
               "containerID": self._cid(c),
               "restartCount": c.restarts, "ready": bool(c.running and c.started and c.ready),
               "started": bool(c.running and c.started)}
        if self.config_error is not None:
            out["state"] = {"waiting": {"reason": self.config_reason, "message": self.config_error}}
        elif c.running:
            out["state"] = {"running": {"startedAt": _stamp(c.started_at)}}
        elif c.terminated is not None:
            out["state"] = {"terminated": c.terminated}
        else:
            out["state"] = {"waiting": dict(c.waiting or {"reason": "PodInitializing"})}
        if c.last_terminated is not None:
            out["lastState"] = {"terminated": c.last_terminated}
        if c.init:
            out.pop("started")
        return out

    def status(self) -> dict:
        initialized = all(c.terminated is not None and c.terminated["exitCode"] == 0 for c in self.init_containers)
        ready = initialized and all(c.running and c.started and c.ready for c in self.containers)
        if self.phase not in ("Succeeded", "Failed") and initialized and any(
                c.running or c.last_terminated is not None for c in self.containers):
            self.phase = "Running"
        start = _stamp(self.start_time)

        def cond(kind, ok, reason=None, message=None):
            # lastTransitionTime: when the condition last changed status, as the kubelet reports it (the pod's start
            # for the first status)
            value = "True" if ok else "False"
            seen = self._transitions.get(kind)
            if seen is None or seen[0] != value:
                seen = self._transitions[kind] = (value, start if seen is None else _stamp(_now()))
            out = {"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": seen[1]}
            if not ok and reason:
                out.update(reason=reason, message=message)
            return out
        names = [c.name for c in self.containers if not (c.running and c.started and c.ready)]
        unready = f"containers with unready status: [{' '.join(names)}]"
        status = {
            "phase": self.phase, "hostIP": "127.0.0.1", "startTime": start,
            "conditions": [
                cond("Initialized", initialized, "ContainersNotInitialized", "containers with incomplete status"),
                cond("Ready", ready, "ContainersNotReady", unready),
                cond("ContainersReady", ready, "ContainersNotReady", unready),
                cond("PodScheduled", True)],
            "initContainerStatuses": [self._container_status(c) for c in self.init_containers],
            "containerStatuses": [self._container_status(c) for c in self.containers],
        }
        if self.pod_ip and self.sandbox is not None or self.phase in ("Succeeded", "Failed"):
            status["podIP"] = self.pod_ip
            status["podIPs"] = [{"ip": self.pod_ip}] if self.pod_ip else []
        return status

    def _post(self, api) -> None:
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        status = self.status()
        if status == self._last_status:
            return
        try:
            api.patch(f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status", {"status": status})
            self._last_status = status
        except ApiError as exc:
            if exc.status == 404:
                self.terminate(0)
            elif exc.status != 409:
                raise


def _pull_policy(spec: dict) -> str:
    """imagePullPolicy, defaulted as the API server does: Always for `:latest` or no tag, else IfNotPresent."""
    if spec.get("imagePullPolicy"):
        return spec["imagePullPolicy"]
    image = spec.get("image") or ""
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    return "Always" if "@" not in image and tag in ("", "latest") else "IfNotPresent"


def _signal_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ContainerLog:
    """A container's log files as the kubelet keeps them: `<container>.log` (CRI records: time, stream, tag, line) and,
    after a restart, `<container>.previous.log` (the instance before)."""

    def __init__(self, current: str, previous: str):
        self.current, self.previous = current, previous
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(current), exist_ok=True)

    def rotate(self) -> None:
        with self._lock:
            if os.path.exists(self.current):
                os.replace(self.current, self.previous)

    def write(self, stream: str, line: bytes, partial: bool = False) -> None:
        stamp = _now().strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
        text = line.decode("utf-8", errors="replace").replace("\n", "")
        try:
            with self._lock, open(self.current, "a", encoding="utf-8") as fh:
                fh.write(f"{stamp} {stream} {'P' if partial else 'F'} {text}\n")
        except FileNotFoundError:
            pass  # the kubelet stopped and removed its logs while the process still wrote

    def pipe(self, source, stream: str) -> threading.Thread:
        """Copy `source` (a pipe) line by line into the log until it closes; returns the thread doing it."""
        def copy():
            with source:
                for raw in iter(source.readline, b""):
                    self.write(stream, raw.rstrip(b"\n").rstrip(b"\r"))
        thread = threading.Thread(target=copy, name=f"log-{stream}", daemon=True)
        thread.start()
        return thread


class ProcessMode:
    """The KubeletStandIn's side of process mode (a mixin, so kubelet.py stays about scripted pods)."""

    def _process_mode(self, pod: dict) -> bool:
        if (pod["metadata"].get("annotations") or {}).get(RUN_ANNOTATION) == "process":
            return True
        return self.behaviour_for(pod).run == "process"

    def _handle_process_pod(self, api, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        with self._lock:
            worker = self._process.get(meta["uid"])
        if worker is None:
            if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                if meta.get("deletionTimestamp"):
                    self.finish_deletion(api, meta["namespace"], meta["name"], meta["uid"])
                return
            worker = ProcessPod(self, pod)
            with self._lock:
                self._process[meta["uid"]] = worker
            worker.start()
        if meta.get("deletionTimestamp"):
            grace = meta.get("deletionGracePeriodSeconds")
            worker.terminate(float(spec.get("terminationGracePeriodSeconds", 30) if grace is None else grace))

    def add_registry(self, host: str, *, tls_verify: bool = True, ca_file: str | None = None, username: str | None = None,
                     password: str | None = None) -> None:
        """Make `host` (`127.0.0.1:PORT`) a registry this node pulls process-mode images from (its containers then run in
        their images), with its TLS settings and, optionally, node-wide credentials (what a node's auth.json gives; a
        pod's imagePullSecrets are tried first)."""
        self.images.registries[host] = images.RegistryAccess(tls_verify, ca_file, username, password)

    def remove_registry(self, host: str) -> None:
        self.images.registries.pop(host, None)

    def process_pod(self, namespace: str, name: str):
        """The ProcessPod running namespace/name, or None."""
        with self._lock:
            for worker in self._process.values():
                if (worker.ns, worker.name) == (namespace, name):
                    return worker
        return None

    def container_log(self, namespace: str, pod: str, container: str) -> ContainerLog:
        return ContainerLog(self._log_path(namespace, pod, container), self._log_path(namespace, pod, container, True))

    def _follow_token(self, namespace: str, pod: str, container: str):
        """None for a scripted pod (its log is followed until the client leaves); for a process-mode container, what
        identifies the running instance: a follow ends when it changes, as the kubelet's ends with the container."""
        worker = self.process_pod(namespace, pod)
        c = worker.container(container) if worker is not None else None
        if c is None:
            return None if worker is None else ("gone",)
        # Running until its log writers have copied the last lines too: the process can exit before they read its pipes
        # to the end, and a follow that ended at the exit would miss what it printed last.
        return (c.instance, c.running or any(writer.is_alive() for writer in c.writers))

    def finish_deletion(self, api, namespace: str, name: str, uid: str) -> None:
        """The containers stopped: delete the pod object for good, as the kubelet does."""
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        with self._lock:
            self._process.pop(uid, None)
        try:
            api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}",
                       {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def port_forward(self, namespace: str, pod: str, port: int):
        """A listener on 127.0.0.1 whose connections reach the pod's `port` in its own network namespace (what
        `kubectl port-forward` gives). Returns (host, port); closed when the kubelet stops."""
        import socket  # pylint: disable=import-outside-toplevel
        worker = self.process_pod(namespace, pod)
        if worker is None or worker.pod_ip is None:
            raise LookupError(f"pod {namespace}/{pod} is not a running process-mode pod")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.5)
        address, stop = worker.pod_ip, self._stop

        def accept():
            with listener:
                while not stop.is_set():
                    try:
                        conn, _address = listener.accept()
                    except socket.timeout:
                        continue
                    try:
                        upstream = self.network.dial(address, int(port))
                    except OSError:
                        conn.close()
                        continue
                    threading.Thread(target=pod_network.splice, args=(conn, upstream, stop), daemon=True).start()
        threading.Thread(target=accept, name=f"port-forward-{namespace}/{pod}:{port}", daemon=True).start()
        return "127.0.0.1", listener.getsockname()[1]
