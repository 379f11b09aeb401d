"""A real S3-compatible server on loopback for the tests: moto's S3 (``moto_server``), installed from PyPI on first use into
its own virtualenv under ~/.cache/alauda-spec-decoding/ (moto's boto3/botocore/flask stay out of the project's .venv),
as tests/testbed/registry.py installs the registry's Debian packages when they are missing.

moto answers S3's REST API as AWS does for what the preflight sends: path-style ``GET /bucket/key`` with ``Range``
(206 and the bytes asked for), an object without ``public-read`` refused to an unsigned request (403) and served to a
request signed with SigV4. It does not check the signature's value (its IAM mode is not set up here): the signature
itself is pinned to AWS's published example in tests/unit/test_draft_preflight_reads.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

from tests.testbed import ports

MOTO = "5.2.6"
REQUIREMENTS = ["moto[s3]==%s" % MOTO, "flask", "flask-cors"]
VENV = os.path.join(os.path.expanduser("~"), ".cache", "alauda-spec-decoding", "moto-%s" % MOTO)


def ensure():
    """The path of ``moto_server``, installing it once: the venv is built where it stays (a venv's scripts name their
    own path) and counts only once its stamp is written; a lock keeps parallel test workers from building it twice."""
    binary = os.path.join(VENV, "bin", "moto_server")
    stamp = os.path.join(VENV, ".installed")
    if os.path.exists(stamp):
        return binary
    os.makedirs(os.path.dirname(VENV), exist_ok=True)
    with open(VENV + ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(stamp):
            return binary
        shutil.rmtree(VENV, ignore_errors=True)  # a build cut short
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        pip = subprocess.run([os.path.join(VENV, "bin", "python"), "-m", "pip", "install", "--quiet"] + REQUIREMENTS,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        if pip.returncode:
            raise RuntimeError("pip could not install %s into %s:\n%s" % (" ".join(REQUIREMENTS), VENV, pip.stdout[-4000:]))
        with open(stamp, "w", encoding="utf-8") as handle:
            handle.write(" ".join(REQUIREMENTS) + "\n")
    return binary


class S3Server:
    """moto_server on 127.0.0.1:<port>, its access log in ``log_path``; ``put`` writes an object with unsigned requests
    (moto takes them for bucket and object writes)."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.port = ports.free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log_path = os.path.join(workdir, "moto.log")
        self.proc = None

    def start(self):
        binary = ensure()
        log = open(self.log_path, "wb")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(self.port)], stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2):
                    return self
            except urllib.error.HTTPError:
                return self  # it answers
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start: %s" % open(self.log_path, encoding="utf-8", errors="replace").read())
                time.sleep(0.2)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _send(self, method, path, data=None, headers=None):
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=dict(headers or {}))
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status

    def make_bucket(self, bucket):
        return self._send("PUT", "/%s" % bucket)

    def put(self, bucket, key, data, public=False):
        headers = {"Content-Type": "application/octet-stream"}
        if public:
            headers["x-amz-acl"] = "public-read"
        return self._send("PUT", "/%s/%s" % (bucket, key), data=data, headers=headers)

    def requests(self):
        """[(method, path, status)] from the access log (werkzeug's lines), in order."""
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            text = re.sub(r"\x1b\[[0-9;]*m", "", handle.read())
        return [(m.group(1), m.group(2), int(m.group(3))) for m in re.finditer(r'"(GET|PUT|HEAD|POST) (\S+) HTTP/[0-9.]+" (\d{3})', text)]


@contextlib.contextmanager
def serving(workdir):
    server = S3Server(workdir).start()
    try:
        yield server
    finally:
        server.stop()
