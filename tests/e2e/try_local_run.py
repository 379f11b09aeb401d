"""`make try-local` as a user runs it, started in the background so that it can run beside another test.

tests/e2e/test_try_local_e2e.py asserts what the run printed and what it left in its test bed. The run itself is one
``make try-local`` process in a user's environment, with its own test bed (a control plane, the kubelet and KServe
stand-ins in the background: nothing it shares with the pytest session's test bed) and two vLLM starts, one after the
other. It spends most of its 60 s waiting for vLLM, so it runs beside a test that leaves most of a core idle (the e2e
conftest's ``START_BESIDE``, the test module's ``start_early``): the watchdog's; the try-local test then waits for what is
left of it. Run alone, the test starts it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from tests.ansible_run import REPO
from tests.testbed import cli
from tests.testbed.controlplane import ControlPlane
from tests.testbed.rest import ApiError

NAMESPACE, NAME = "models", "tiny-eagle3"
ISVC = "/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices/%s" % (NAMESPACE, NAME)


def user_env():
    """A user's shell: this run's virtualenv, PYTHONPATH and Ansible settings left out (the Makefile sets its own)."""
    venv_bin = os.path.realpath(os.path.dirname(sys.executable))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANSIBLE_", "PYTEST_", "K8S_AUTH_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV", "KUBECONFIG")}
    env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                                  if p and os.path.realpath(p) != venv_bin)
    return env


def testbed_running():
    return subprocess.run([sys.executable, "-m", "tests.testbed.cli", "status"], cwd=REPO, capture_output=True, check=False).returncode == 0


def attach():
    with open(cli.POINTER, encoding="utf-8") as handle:
        return ControlPlane.attach(handle.read().strip())


def pods(api):
    return api.get("/api/v1/namespaces/%s/pods" % NAMESPACE, labelSelector="serving.kserve.io/inferenceservice=%s" % NAME)["items"]


def stop_the_service(api):
    """Delete the InferenceService and wait until its pods (real vLLM processes) are gone."""
    try:
        api.delete(ISVC)
    except ApiError as exc:
        if exc.status != 404:
            raise
    deadline = time.monotonic() + 120
    while pods(api) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not pods(api), [p["metadata"]["name"] for p in pods(api)]


class TryLocalRun:
    """One background ``make try-local``: ``start()`` (idempotent), ``wait()`` for its CompletedProcess, ``clean_up()``
    stops what it started (the InferenceService and its vLLM pod always, the test bed when none ran before it)."""

    def __init__(self):
        self.proc = None
        self.was_running = None
        self.started = None
        self.seconds = None
        self.cleaned = False
        self._out = self._err = None

    def start(self):
        if self.proc is None:
            self.was_running = testbed_running()
            self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # pylint: disable=consider-using-with
            self.started = time.monotonic()
            # its own process group (start_new_session): a run that outlives its limit is killed with what make started
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                ["make", "try-local"], cwd=REPO, env=user_env(), stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
                text=True, start_new_session=True)
        return self

    def wait(self, timeout=2400):
        """The run's CompletedProcess (stdout, stderr as text); a run longer than ``timeout`` seconds from its start is
        killed (its process group) and raises subprocess.TimeoutExpired, as subprocess.run would."""
        self.start()
        try:
            self.proc.wait(timeout=max(1.0, timeout - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self._kill()
            raise
        if self.seconds is None:
            self.seconds = round(time.monotonic() - self.started, 1)
        self._out.seek(0)
        self._err.seek(0)
        return subprocess.CompletedProcess(["make", "try-local"], self.proc.returncode, self._out.read(), self._err.read())

    def _kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def clean_up(self):
        """Stop the InferenceService (its vLLM pod) and, when the run started the test bed, the test bed (idempotent)."""
        if self.proc is None or self.cleaned:
            return
        self.cleaned = True
        if self.proc.poll() is None:
            self._kill()
        api = None
        try:
            if os.path.exists(cli.POINTER) and testbed_running():
                api = attach().rest()
                stop_the_service(api)
        finally:
            if api is not None:
                api.close()
            if not self.was_running:
                subprocess.run([sys.executable, "-m", "tests.testbed.cli", "down"], cwd=REPO, capture_output=True, check=True, timeout=120)


# The session's run: started beside the watchdog test (the test module's start_early), the test waits for it and cleans up;
# after a run whose test never ran (a session stopped early) the conftest's pytest_sessionfinish does (stop_early).
RUN = TryLocalRun()
