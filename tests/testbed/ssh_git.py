"""A real OpenSSH server on loopback in front of the test bed's Git repositories (tests/testbed/git_server.py), for the
SSH transport of gitops/git_repo: a deploy key in an authorized_keys file, the server's own host key to pin, and
``git-upload-pack`` / ``git-receive-pack`` run by sshd as for any Git host that speaks SSH.

sshd comes from Debian's openssh-server package, installed by hack/test.sh before the unit tier (``python -m
tests.testbed.ssh_git`` prints its path). Its postinst starts ssh.service where systemd runs the machine; the tests need
only the binary, so a service this install started is stopped and disabled again (as tests/promtool.py does for
prometheus). The server here runs as the test's own user with its own configuration, host key and pid file in a
temporary directory, and accepts only that user's login with the one deploy key.

Usage: python -m tests.testbed.ssh_git   (prints sshd's path; exit 1 naming the failed step)
"""
from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from tests.testbed import build
from tests.testbed.ports import free_port

PACKAGE = "openssh-server"
SSHD = "/usr/sbin/sshd"
INSTALL_HINT = ("sshd is missing: it comes with Debian's openssh-server package, which hack/test.sh installs before the unit "
                "tier (`python -m tests.testbed.ssh_git`; by hand: `apt-get install -y --no-install-recommends openssh-server`)")


def ensure() -> str:
    if os.access(SSHD, os.X_OK):
        return SSHD
    build.ensure_packages([PACKAGE])
    if os.path.isdir("/run/systemd/system"):
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        subprocess.run(sudo + ["systemctl", "disable", "--now", "ssh.service"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not os.access(SSHD, os.X_OK):
        raise build.BuildError("apt-get installed %s but %s is missing" % (PACKAGE, SSHD))
    return SSHD


def _keygen(path: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", os.path.basename(path), "-f", path], check=True,
                   stdout=subprocess.DEVNULL)
    with open(path + ".pub", encoding="utf-8") as handle:
        return handle.read().strip()


class SSHGitServer:
    """sshd on 127.0.0.1 serving the bare repositories under ``root`` (a GitServer's). ``deploy_key`` is the private key
    the server accepts, ``known_hosts`` a file pinning the server's host key, ``url(path)`` an ssh:// URL."""

    def __init__(self, root: str):
        self.root = root
        self.user = getpass.getuser()
        self.dir = tempfile.mkdtemp(prefix="testbed-sshd-")
        self.port = free_port()
        self.proc = None
        self.deploy_key = os.path.join(self.dir, "deploy_key")
        self.other_key = os.path.join(self.dir, "other_key")  # a key the server does not accept
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        self.wrong_known_hosts = os.path.join(self.dir, "wrong_known_hosts")  # another server's host key for this address

    def url(self, path: str) -> str:
        return "ssh://%s@127.0.0.1:%d%s" % (self.user, self.port, path)

    def start(self) -> "SSHGitServer":
        sshd = ensure()
        host_pub = _keygen(os.path.join(self.dir, "host_ed25519"))
        other_host_pub = _keygen(os.path.join(self.dir, "other_host_ed25519"))
        deploy_pub = _keygen(self.deploy_key)
        _keygen(self.other_key)
        authorized = os.path.join(self.dir, "authorized_keys")
        for path, text in ((authorized, deploy_pub), (self.known_hosts, "[127.0.0.1]:%d %s" % (self.port, " ".join(host_pub.split()[:2]))),
                           (self.wrong_known_hosts, "[127.0.0.1]:%d %s" % (self.port, " ".join(other_host_pub.split()[:2])))):
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
        config = os.path.join(self.dir, "sshd_config")
        with open(config, "w", encoding="utf-8") as handle:
            handle.write("\n".join([
                "Port %d" % self.port, "ListenAddress 127.0.0.1", "HostKey %s" % os.path.join(self.dir, "host_ed25519"),
                "AuthorizedKeysFile %s" % authorized, "PidFile %s" % os.path.join(self.dir, "sshd.pid"),
                "AllowUsers %s" % self.user, "PubkeyAuthentication yes", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password", "UsePAM no",
                # the temporary directory is the test's, not a home directory sshd would check the modes of
                "StrictModes no", "LogLevel ERROR", ""]))
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # the privilege separation directory root's sshd needs
        self.proc = subprocess.Popen([sshd, "-D", "-e", "-f", config], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("sshd exited %s: %s" % (self.proc.returncode, self.proc.stderr.read().decode(errors="replace")))
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    if sock.recv(64).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("sshd did not answer on 127.0.0.1:%d within 15 s" % self.port)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main() -> int:
    try:
        print(ensure())
    except build.BuildError as exc:
        print("sshd install failed: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
