"""A real Git server on loopback for the test bed: bare repositories under one temporary folder, served two ways.

- ``git://127.0.0.1:<port>/<repo>.git``: ``git daemon --export-all --enable=receive-pack`` (anonymous clone and push);
- ``http://127.0.0.1:<port>/<repo>.git``: ``git http-backend`` (Git's smart HTTP, CGI) behind a small threaded
  ``http.server`` that asks for HTTP Basic auth ``<username>:<token>`` on every request, as a Git host does for an
  HTTPS token (401 with ``WWW-Authenticate: Basic``; a wrong token is 401 again, so git reports "Authentication failed").

Helpers for tests: ``create_repo(name, files)`` (a bare repository whose ``main`` holds the files of a folder or a
{path: text} dict, one commit), ``head(name, branch)``, ``commit_file(name, branch, path, text)`` (another user's commit
straight into the bare repository: it bypasses hooks, as a merged pull request would), ``protect(name, branch)`` (a
pre-receive hook that declines every push to that branch with GitHub's GH006 text), ``log(name, branch)``, ``show``,
``stop()``. Everything here is the test bed's, free of the product's code.
"""
from __future__ import annotations

import base64
import http.server
import os
import shutil
import subprocess
import tempfile
import threading
import time

from .ports import free_port

AUTHOR_ENV = {"GIT_AUTHOR_NAME": "Test Bed", "GIT_AUTHOR_EMAIL": "testbed@example.invalid",
              "GIT_COMMITTER_NAME": "Test Bed", "GIT_COMMITTER_EMAIL": "testbed@example.invalid"}
# GitHub's words when a protected branch refuses a push (the hook's stderr reaches the pusher as "remote: ..." lines).
PROTECTED_HOOK = """#!/bin/sh
# Installed by tests/testbed/git_server.py protect(): refuse pushes to protected branches like GitHub does.
status=0
while read -r old new ref; do
  case " {refs} " in
    *" $ref "*)
      echo "error: GH006: Protected branch update failed for $ref." >&2
      echo "error: Changes must be made through a pull request. (protected branch hook declined)" >&2
      status=1 ;;
  esac
done
exit $status
"""


class GitServerError(RuntimeError):
    """A git command of the server's helpers failed (the message carries git's stderr)."""


def git(*args, cwd=None, env=None, input_bytes=None) -> str:
    """Run git (no user or system config: the test bed must not depend on the machine's ~/.gitconfig); stdout text."""
    full_env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0", **AUTHOR_ENV)
    full_env.update(env or {})
    proc = subprocess.run(["git", *args], cwd=cwd, env=full_env, input=input_bytes, capture_output=True, timeout=60, check=False)
    if proc.returncode:
        raise GitServerError(f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode(errors="replace")


class _BasicAuthGitHandler(http.server.BaseHTTPRequestHandler):
    """One smart-HTTP request: check Basic auth, then run `git http-backend` as CGI and relay its answer."""

    server_version = "testbed-git-http"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin  # quiet: the tests print what matters
        self.server.owner.requests.append(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else '?'}")

    def _authorised(self) -> bool:
        owner = self.server.owner
        header = self.headers.get("Authorization") or ""
        if not header.startswith("Basic "):
            return False
        try:
            user, _sep, token = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return user == owner.username and token == owner.token

    def _body(self) -> bytes:
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        owner = self.server.owner
        body = self._body()
        if not self._authorised():
            owner.auth_failures += 1
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="testbed git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _sep, query = self.path.partition("?")
        env = dict(os.environ, GIT_PROJECT_ROOT=owner.root, GIT_HTTP_EXPORT_ALL="1", REQUEST_METHOD=self.command,
                   PATH_INFO=path, QUERY_STRING=query, CONTENT_TYPE=self.headers.get("Content-Type") or "",
                   CONTENT_LENGTH=str(len(body)), REMOTE_USER=owner.username, REMOTE_ADDR=self.client_address[0],
                   GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        if self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        proc = subprocess.run(["git", "http-backend"], env=env, input=body, capture_output=True, timeout=120, check=False)
        head, _sep, payload = proc.stdout.partition(b"\r\n\r\n")
        if not _sep:
            head, _sep, payload = proc.stdout.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _colon, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = _handle  # noqa: N815  (http.server's naming)
    do_POST = _handle  # noqa: N815


class GitServer:
    """Bare repositories under `root` (a fresh temporary folder by default) served over git:// and Basic-auth http://."""

    def __init__(self, root: str | None = None, username: str = "git-user", token: str = "test-token-s3cr3t"):
        self._own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix="testbed-git-")
        self.username = username
        self.token = token
        self.git_port = None
        self.http_port = None
        self.requests = []  # "METHOD path -> status" of the http:// side, for tests that assert what was asked
        self.auth_failures = 0
        self._daemon = None
        self._httpd = None
        self._http_thread = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "GitServer":
        self.git_port = free_port()
        self._daemon = subprocess.Popen(  # pylint: disable=consider-using-with  # stopped in stop()
            ["git", "daemon", "--enable=receive-pack", "--export-all", "--reuseaddr", "--listen=127.0.0.1",
             f"--port={self.git_port}", f"--base-path={self.root}", "--informative-errors"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env=dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull))
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _BasicAuthGitHandler)
        self._httpd.daemon_threads = True
        self._httpd.owner = self
        self.http_port = self._httpd.server_address[1]
        self._http_thread = threading.Thread(target=self._httpd.serve_forever, name="testbed-git-http", daemon=True)
        self._http_thread.start()
        self._wait_daemon()
        return self

    def _wait_daemon(self, timeout: float = 15.0) -> None:
        """Until `git ls-remote` answers on git:// (the daemon listens a moment after it starts)."""
        probe = "testbed-probe.git"
        if not os.path.isdir(os.path.join(self.root, probe)):
            git("init", "--bare", "-q", os.path.join(self.root, probe))
        deadline = time.monotonic() + timeout
        while True:
            if self._daemon.poll() is not None:
                raise GitServerError(f"git daemon exited with {self._daemon.returncode} (port {self.git_port})")
            try:
                git("ls-remote", self.git_url(probe))
                return
            except GitServerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._daemon is not None:
            # git daemon forks a child per connection; they share its session (start_new_session): end the group.
            try:
                os.killpg(self._daemon.pid, 15)
            except ProcessLookupError:
                pass
            try:
                self._daemon.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self._daemon.pid, 9)
                self._daemon.wait(timeout=5)
            self._daemon = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ addresses
    @staticmethod
    def _repo_name(name: str) -> str:
        return name if name.endswith(".git") else name + ".git"

    def path(self, name: str) -> str:
        """The bare repository's folder on this machine."""
        return os.path.join(self.root, self._repo_name(name))

    def git_url(self, name: str) -> str:
        """Anonymous git:// URL (clone and push)."""
        return f"git://127.0.0.1:{self.git_port}/{self._repo_name(name)}"

    def http_url(self, name: str) -> str:
        """http:// URL that needs Basic auth `username:token` (no credentials in it)."""
        return f"http://127.0.0.1:{self.http_port}/{self._repo_name(name)}"

    def auth_env(self, username: str | None = None, token: str | None = None) -> dict:
        """Environment for a git client to send Basic auth as a header (git's GIT_CONFIG_COUNT channel, nothing in argv)."""
        raw = f"{username or self.username}:{token if token is not None else self.token}".encode()
        return {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
                "GIT_CONFIG_VALUE_0": "Authorization: Basic " + base64.b64encode(raw).decode()}

    # ------------------------------------------------------------------ repositories
    def create_repo(self, name: str, files, branch: str = "main", message: str = "initial commit") -> str:
        """A new bare repository whose `branch` holds `files` (a folder, copied recursively, or {relative path: text});
        returns the commit sha. An existing repository of that name is an error (tests use unique names)."""
        bare = self.path(name)
        if os.path.exists(bare):
            raise GitServerError(f"repository {name} exists already in {self.root}")
        git("init", "--bare", "-q", f"--initial-branch={branch}", bare)
        with tempfile.TemporaryDirectory(prefix="testbed-git-seed-") as work:
            if isinstance(files, (str, os.PathLike)):
                shutil.copytree(files, work, dirs_exist_ok=True)
            else:
                for rel, text in files.items():
                    _write(os.path.join(work, rel), text)
            return self._commit_tree(bare, branch, work, message, parent=None)

    def commit_file(self, name: str, branch: str, path: str, text: str | None, message: str | None = None) -> str:
        """Another user's commit on `branch`: `path` set to `text` (None: deleted), written straight into the bare
        repository (no hooks, like a merged pull request). Returns the new commit sha."""
        bare = self.path(name)
        parent = self.head(name, branch)
        with tempfile.TemporaryDirectory(prefix="testbed-git-edit-") as work:
            index = os.path.join(work, ".index")
            env = {"GIT_INDEX_FILE": index}
            git("--git-dir", bare, "read-tree", parent, env=env)
            if text is None:
                git("--git-dir", bare, "update-index", "--force-remove", path, env=env)
            else:
                blob = git("--git-dir", bare, "hash-object", "-w", "--stdin", input_bytes=text.encode()).strip()
                git("--git-dir", bare, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}", env=env)
            tree = git("--git-dir", bare, "write-tree", env=env).strip()
        commit = git("--git-dir", bare, "commit-tree", tree, "-p", parent, "-m", message or f"edit {path}").strip()
        git("--git-dir", bare, "update-ref", f"refs/heads/{branch}", commit, parent)
        return commit

    def _commit_tree(self, bare: str, branch: str, work: str, message: str, parent: str | None) -> str:
        index = os.path.join(tempfile.mkdtemp(prefix="testbed-git-index-"), "index")
        try:
            env = {"GIT_INDEX_FILE": index}
            git("--git-dir", bare, "--work-tree", work, "add", "-A", ".", env=env)
            tree = git("--git-dir", bare, "write-tree", env=env).strip()
        finally:
            shutil.rmtree(os.path.dirname(index), ignore_errors=True)
        args = ["--git-dir", bare, "commit-tree", tree, "-m", message] + (["-p", parent] if parent else [])
        commit = git(*args).strip()
        git("--git-dir", bare, "update-ref", f"refs/heads/{branch}", commit)
        return commit

    def head(self, name: str, branch: str = "main") -> str:
        """The commit sha `branch` points at."""
        return git("--git-dir", self.path(name), "rev-parse", f"refs/heads/{branch}").strip()

    def branches(self, name: str) -> list[str]:
        out = git("--git-dir", self.path(name), "for-each-ref", "--format=%(refname:short)", "refs/heads/")
        return out.split()

    def show(self, name: str, rev: str, path: str) -> str:
        """The text of `path` at `rev` (a branch or sha)."""
        return git("--git-dir", self.path(name), "show", f"{rev}:{path}")

    def log(self, name: str, branch: str = "main") -> list[dict]:
        """Commits of `branch`, newest first: {sha, subject, body, author}."""
        out = git("--git-dir", self.path(name), "log", "--format=%H%x1f%s%x1f%b%x1f%an <%ae>%x1e", f"refs/heads/{branch}")
        rows = []
        for record in out.split("\x1e"):
            fields = record.strip("\n").split("\x1f")
            if len(fields) == 4:
                rows.append({"sha": fields[0], "subject": fields[1], "body": fields[2].strip(), "author": fields[3]})
        return rows

    def changed_files(self, name: str, rev: str) -> list[str]:
        """Paths the commit `rev` changed against its first parent."""
        return git("--git-dir", self.path(name), "diff-tree", "--no-commit-id", "--name-only", "-r", rev).split()

    def protect(self, name: str, branch: str = "main") -> None:
        """Decline every push to `branch` from now on (a pre-receive hook with GitHub's GH006 message)."""
        hook = os.path.join(self.path(name), "hooks", "pre-receive")
        refs = set()
        if os.path.exists(hook):
            with open(hook, encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("  case "):
                        refs.update(line.split('"')[1].split())
        refs.add(f"refs/heads/{branch}")
        os.makedirs(os.path.dirname(hook), exist_ok=True)
        with open(hook, "w", encoding="utf-8") as fh:
            fh.write(PROTECTED_HOOK.replace("{refs}", " ".join(sorted(refs))))
        os.chmod(hook, 0o755)


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
