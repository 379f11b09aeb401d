# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Git repository worked on through the real ``git`` program: clone one branch, edit files, commit, push to the
branch or to a new branch for review, with one retry after a non-fast-forward rejection.

Credentials never reach argv, the URL, a file in the clone, output or logs:
- SSH: ``GIT_SSH_COMMAND`` with the deploy key and a pinned known_hosts file (StrictHostKeyChecking=yes);
- HTTPS token: an ``http.<origin>/.extraHeader`` Authorization header passed through ``GIT_CONFIG_COUNT`` /
  ``GIT_CONFIG_KEY_<n>`` / ``GIT_CONFIG_VALUE_<n>`` (git >= 2.31 reads configuration from these variables), scoped to
  the repository's own origin so a redirect elsewhere does not carry it.
git runs with no user or system configuration (``GIT_CONFIG_NOSYSTEM``, a HOME of its own), no prompt
(``GIT_TERMINAL_PROMPT=0``, SSH BatchMode) and a timeout per command; every text it prints is scrubbed of the secrets
before it goes into a message.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from urllib.parse import urlsplit

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.credentials import redact
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

DEFAULT_TIMEOUT = 120
DEFAULT_USERNAME = "git"
# Variables passed through to git from the caller's environment: the proxy settings of a site behind one.
_PASSED_ENV = ("PATH", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "all_proxy",
               "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "GIT_SSL_CAINFO")
_SCP_LIKE_RE = re.compile(r"^(?:[^@/:]+@)?[^/:]+:(?!//)")


class GitError(SpecDecodingError):
    """git refused or failed; the message names the option and the fix and holds no secret."""


def _scheme(url):
    """``ssh`` | ``https`` | ``http`` | ``file`` | ``git`` for a repository URL (``git@host:org/repo`` is ssh)."""
    if "://" in url:
        return urlsplit(url).scheme.lower()
    if _SCP_LIKE_RE.match(url):
        return "ssh"
    return "file"


class Credentials:
    """How git authenticates: an SSH key with a pinned known_hosts file, or an HTTPS token (Basic auth), or nothing."""

    def __init__(self, ssh_key_file=None, known_hosts_file=None, token=None, username=None):
        self.ssh_key_file = ssh_key_file or None
        self.known_hosts_file = known_hosts_file or None
        self.token = token or None
        self.username = username or DEFAULT_USERNAME

    def secrets(self):
        """Every text that must never be shown: the token, user:token and its base64 (what the header carries)."""
        if not self.token:
            return []
        pair = "%s:%s" % (self.username, self.token)
        return [base64.b64encode(pair.encode()).decode(), pair, self.token]

    def check(self, url):
        """Refuse a URL and credentials that cannot go together, before git runs."""
        scheme = _scheme(url)
        parts = urlsplit(url) if "://" in url else None
        if parts is not None and parts.password:
            raise ValidationError("the URL carries a password or token; it would be stored in the clone and shown in git's messages",
                                  field="repo_url", hint="remove the credentials from the URL and give them as token (and username)")
        if self.ssh_key_file and self.token:
            raise ValidationError("ssh_key_file and token are both set", field="token", hint="give one: an SSH deploy key or an HTTPS token")
        if bool(self.ssh_key_file) != bool(self.known_hosts_file) and (self.ssh_key_file or scheme == "ssh"):
            raise ValidationError("an SSH key needs the server's pinned host key, and a host key needs the SSH key", field="known_hosts_file",
                                  hint="give both ssh_key_file and known_hosts_file (ssh-keyscan <host> > known_hosts, checked against "
                                       "the fingerprint the Git server publishes)")
        if scheme == "ssh":
            if not self.ssh_key_file:
                raise ValidationError("repo_url %s is an SSH URL and no SSH key is given" % url, field="ssh_key_file",
                                      hint="give ssh_key_file and known_hosts_file (a deploy key with write access), or an https:// "
                                           "repo_url with token")
            for field, path in (("ssh_key_file", self.ssh_key_file), ("known_hosts_file", self.known_hosts_file)):
                if not os.path.isfile(path):
                    raise ValidationError("%s does not exist or is not a file" % path, field=field, hint="give the path of the file on "
                                                                                                         "the host that runs the module")
        elif self.ssh_key_file:
            raise ValidationError("ssh_key_file is given but repo_url %s is not an SSH URL" % url, field="ssh_key_file",
                                  hint="use the repository's ssh:// or git@host:path URL, or a token for https")
        if self.token and scheme not in ("https", "http"):
            raise ValidationError("token is given but repo_url %s is not an http(s) URL" % url, field="token",
                                  hint="use the repository's https:// URL, or an SSH key for an SSH URL")

    def environment(self, url):
        """The variables that carry the credentials to git (none of them is ever printed)."""
        env = {}
        if self.ssh_key_file:
            env["GIT_SSH_COMMAND"] = " ".join(shlex.quote(w) for w in (
                "ssh", "-i", self.ssh_key_file, "-o", "IdentitiesOnly=yes", "-o", "UserKnownHostsFile=" + self.known_hosts_file,
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30", "-F", "/dev/null"))
        else:
            # No SSH configuration of the host's user either (a key from ~/.ssh must not be picked up silently).
            env["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes -o ConnectTimeout=30 -F /dev/null"
        if self.token:
            parts = urlsplit(url)
            origin = "%s://%s/" % (parts.scheme, parts.netloc)
            env["GIT_CONFIG_COUNT"] = "1"
            env["GIT_CONFIG_KEY_0"] = "http.%s.extraHeader" % origin
            env["GIT_CONFIG_VALUE_0"] = "Authorization: Basic " + self.secrets()[0]
        return env


def scrub(text, secrets):
    """The text with every secret (plain or base64, longest first) replaced by ``********`` (artifacts/credentials.redact)."""
    return redact(text or "", secrets, patterns=False, mask="********", min_length=1)


class Repository:
    """One branch of a repository cloned into a work directory of its own.

    ``url``: the repository; ``branch``: the branch cloned and, unless a review branch is given, pushed; ``workdir``:
    where the clone goes (a new directory under it, removed by ``close``; the system's temporary directory if None).
    """

    def __init__(self, url, branch, credentials=None, workdir=None, author_name="alauda.spec_decoding",
                 author_email="spec-decoding@alauda.io", timeout=DEFAULT_TIMEOUT):
        if not url:
            raise ValidationError("is required", field="repo_url", hint="give the repository's URL (the owner's source repoURL)")
        if not branch:
            raise ValidationError("is required", field="branch", hint="give the branch the owner syncs (targetRevision / ref.branch)")
        self.url = url
        self.branch = branch
        self.credentials = credentials or Credentials()
        self.credentials.check(url)
        self.timeout = timeout
        self.author_name = author_name
        self.author_email = author_email
        if workdir:
            os.makedirs(workdir, exist_ok=True)
        self._base = tempfile.mkdtemp(prefix="spec-decoding-git-", dir=workdir or None)
        self.home = os.path.join(self._base, "home")
        os.makedirs(self.home)
        self.root = os.path.join(self._base, "repo")
        self.head = None

    # -- running git ---------------------------------------------------------------------------------------------

    def _env(self):
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
        env.setdefault("PATH", "/usr/bin:/bin")
        env.update({
            "HOME": self.home, "XDG_CONFIG_HOME": self.home, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "", "LC_ALL": "C", "LANG": "C",
            # a stalled transfer (under 1 KB/s for the timeout) ends instead of hanging
            "GIT_HTTP_LOW_SPEED_LIMIT": "1000", "GIT_HTTP_LOW_SPEED_TIME": str(self.timeout),
            "GIT_AUTHOR_NAME": self.author_name, "GIT_AUTHOR_EMAIL": self.author_email,
            "GIT_COMMITTER_NAME": self.author_name, "GIT_COMMITTER_EMAIL": self.author_email,
        })
        env.update(self.credentials.environment(self.url))
        return env

    def scrub(self, text):
        return scrub(text, self.credentials.secrets())

    def git(self, *args, cwd=None, check=True):
        """Run ``git <args>``; returns (rc, stdout, stderr), the texts scrubbed. ``check``: raise GitError on rc != 0."""
        argv = ["git"] + list(args)
        try:
            proc = subprocess.run(argv, cwd=cwd or self.root, env=self._env(), capture_output=True, text=True, timeout=self.timeout,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise GitError("git %s did not finish within %d s (repository %s)" % (args[0], self.timeout, self.url), field="repo_url",
                           hint="check that the Git server is reachable from this host and answering, or raise the timeout") from None
        except FileNotFoundError:
            raise GitError("the git program is not installed on the host that runs the module", field="repo_url",
                           hint="install git (dnf/apt install git, or add it to the execution environment's bindep.txt)") from None
        out, err = self.scrub(proc.stdout), self.scrub(proc.stderr)
        if check and proc.returncode != 0:
            raise GitError("git %s failed: %s" % (args[0], _last_lines(err or out)), field="repo_url",
                           hint="see git's message above")
        return proc.returncode, out, err

    # -- clone ---------------------------------------------------------------------------------------------------

    def clone(self):
        """Clone the branch (depth 1 where the transport allows it). Unreachable server, unknown branch, failed
        authentication and missing credentials each end in a GitError naming the option and the fix."""
        if self.credentials.token:
            self._require_config_env()
        rc, _out, err = self.git("clone", "--quiet", "--no-tags", "--single-branch", "--branch", self.branch, *self._depth(), "--",
                                 self.url, self.root, cwd=self._base, check=False)
        if rc != 0:
            raise self._transport_error("clone", err)
        self.head = self.rev_parse("HEAD")
        return self

    def _depth(self):
        """Shallow (depth 1) where the transport allows it: git ignores --depth for a plain local path and warns."""
        return [] if _scheme(self.url) == "file" and "://" not in self.url else ["--depth", "1"]

    def _require_config_env(self):
        """The token travels in GIT_CONFIG_COUNT/KEY/VALUE, which git reads from 2.31 on; an older git would ignore it
        silently and the server's refusal would blame the token."""
        out = self.git("version", cwd=self._base)[1]
        found = re.search(r"(\d+)\.(\d+)", out)
        if found and (int(found.group(1)), int(found.group(2))) < (2, 31):
            raise GitError("%s cannot take the token from the environment (git 2.31 or newer reads GIT_CONFIG_COUNT)" % out.strip(),
                           field="token", hint="install git 2.31 or newer on the host that runs the module, or use an SSH key")

    def _transport_error(self, action, err):
        text = _last_lines(err)
        low = err.lower()
        url = self.url
        if "remote branch" in low and "not found" in low:
            return GitError("branch %r does not exist in %s (%s)" % (self.branch, url, text), field="branch",
                            hint="give an existing branch (the owner's targetRevision or GitRepository ref.branch)")
        if "host key verification failed" in low or "remote host identification has changed" in low:
            return GitError("the SSH host key of %s is not the one in known_hosts_file (%s)" % (url, text), field="known_hosts_file",
                            hint="put the server's current host key in known_hosts_file (ssh-keyscan, checked against the "
                                 "fingerprint the Git server publishes)")
        if ("terminal prompts disabled" in low or "could not read username" in low or "could not read password" in low) and \
                not self.credentials.token:
            return GitError("%s: the server asks for credentials and none were given (%s)" % (url, text), field="token",
                            hint="give token (and username) for an https URL, or ssh_key_file + known_hosts_file for an SSH URL "
                                 "(the role reads them from rollback_git_credentials_secret)")
        if ("authentication failed" in low or "permission denied" in low or " 401" in low or " 403" in low or "terminal prompts" in low
                or "access denied" in low or "invalid username or password" in low):
            field = "ssh_key_file" if self.credentials.ssh_key_file else "token"
            return GitError("%s refused the credentials on %s (%s)" % (url, action, text), field=field,
                            hint="check that the %s is valid and has write access to the repository" %
                                 ("deploy key" if field == "ssh_key_file" else "token (and username)"))
        if ("does not appear to be a git repository" in low or "repository not found" in low or " 404" in low
                or "not found" in low and "remote branch" not in low):
            return GitError("%s is not a Git repository the server serves (%s)" % (url, text), field="repo_url",
                            hint="check repo_url (the owner's source repoURL / GitRepository url)")
        return GitError("cannot reach %s (%s)" % (url, text), field="repo_url",
                        hint="check repo_url and that the Git server is reachable from this host (DNS, firewall, proxy)")

    # -- files ---------------------------------------------------------------------------------------------------

    def path(self, rel="."):
        """Absolute path of ``rel`` inside the clone; refuses a path that leaves the repository."""
        full = os.path.normpath(os.path.join(self.root, rel or "."))
        if full != self.root and not full.startswith(self.root + os.sep):
            raise ValidationError("%r leaves the repository" % rel, field="path", hint="give a path relative to the repository's root")
        return full

    def read(self, rel):
        with open(self.path(rel), "r", encoding="utf-8") as handle:
            return handle.read()

    def write(self, rel, text):
        full = self.path(rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)

    def rev_parse(self, ref):
        return self.git("rev-parse", ref)[1].strip()

    def status(self):
        """``[(code, path)]`` of what differs from HEAD (git status --porcelain, untracked files included)."""
        self.git("add", "--all")
        out = self.git("status", "--porcelain", "--untracked-files=all")[1]
        return [(line[:2].strip(), line[3:]) for line in out.splitlines() if line.strip()]

    def commit(self, message):
        """Commit everything that differs; returns the new commit's sha, or None when nothing differs."""
        if not self.status():
            return None
        self.git("commit", "--quiet", "--no-verify", "-m", message)
        self.head = self.rev_parse("HEAD")
        return self.head

    # -- push ----------------------------------------------------------------------------------------------------

    def push(self, target_branch=None):
        """Push HEAD to ``target_branch`` (the cloned branch when None). Returns ``"ok"`` or ``"non-fast-forward"``;
        a protected branch, a hook's refusal, an existing review branch or a transport failure raise GitError."""
        target = target_branch or self.branch
        rc, out, err = self.git("push", "--porcelain", "origin", "HEAD:refs/heads/%s" % target, check=False)
        if rc == 0:
            return "ok"
        text = err + "\n" + out
        low = text.lower()
        if "[rejected]" in low or "! " in out and ("fetch first" in low or "non-fast-forward" in low):
            if target_branch and target_branch != self.branch:
                raise GitError("the review branch %r already exists in %s with other commits" % (target, self.url), field="push_branch",
                               hint="give a new push_branch name, or delete the old review branch")
            return "non-fast-forward"
        if "remote rejected" in low or "pre-receive hook declined" in low or "protected branch" in low or "hook declined" in low:
            said = [line.strip()[len("remote:"):].strip() for line in err.splitlines() if line.strip().startswith("remote:")]
            raise GitError(
                "the server refused the push to branch %r of %s (%s)" % (
                    target, self.url, " / ".join([line for line in said if line][-4:] + [line for line in out.splitlines() if line.startswith("!")][-1:])),
                field="push_branch" if target_branch else "branch",
                hint="push to a new branch for review (push_branch, rollback_git_push_branch) and merge it there, or allow this "
                     "identity to push to %r in the repository's branch protection rules" % target)
        raise self._transport_error("push", err or out)

    def remote_branch_exists(self, branch):
        rc, out, err = self.git("ls-remote", "--heads", "origin", "refs/heads/%s" % branch, check=False)
        if rc != 0:
            raise self._transport_error("ls-remote", err)
        return bool(out.strip())

    def refresh(self):
        """Fetch the branch's new head and reset the clone to it (after a non-fast-forward rejection)."""
        rc, _out, err = self.git("fetch", "--quiet", "--no-tags", *self._depth(), "origin", self.branch, check=False)
        if rc != 0:
            raise self._transport_error("fetch", err)
        self.git("reset", "--quiet", "--hard", "FETCH_HEAD")
        self.git("clean", "-q", "-f", "-d")
        self.head = self.rev_parse("HEAD")

    def change(self, edit, message, push_branch=None, dry_run=False):
        """Apply ``edit(repo)`` (it writes files and returns what it did), commit with ``message`` (a string, or a
        function of edit's result) and push to the branch, or to ``push_branch`` (a new branch for review).

        A non-fast-forward rejection (someone pushed in between) is met once: fetch the new head, run ``edit`` again on
        it, commit and push again. Returns ``{"edit", "commit", "pushed_branch", "base", "retried"}``; ``commit`` is None
        when the edit changed nothing (nothing is pushed), and nothing is committed or pushed with ``dry_run``.
        """
        if push_branch and push_branch != self.branch and self.remote_branch_exists(push_branch):
            raise GitError("the review branch %r already exists in %s" % (push_branch, self.url), field="push_branch",
                           hint="give a new push_branch name, or delete the old review branch")
        retried = False
        for attempt in range(2):
            base = self.head
            result = edit(self)
            if dry_run:
                return {"edit": result, "commit": None, "pushed_branch": None, "base": base, "retried": retried,
                        "changes": self.status()}
            changes = self.status()
            sha = self.commit(message(result) if callable(message) else message)
            if sha is None:
                return {"edit": result, "commit": None, "pushed_branch": None, "base": base, "retried": retried, "changes": []}
            if self.push(push_branch) == "ok":
                return {"edit": result, "commit": sha, "pushed_branch": push_branch or self.branch, "base": base,
                        "retried": retried, "changes": changes}
            if attempt == 0:
                self.refresh()
                retried = True
        raise GitError("the push to branch %r of %s was rejected twice as non-fast-forward (others keep pushing to it)" %
                       (self.branch, self.url), field="branch",
                       hint="rerun the task, or push to a new branch for review (push_branch)")

    def close(self):
        shutil.rmtree(self._base, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def source_files(src):
    """The files under ``src`` (relative paths), hidden files and directories left out."""
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for filename in sorted(filenames):
            if not filename.startswith("."):
                yield os.path.relpath(os.path.join(dirpath, filename), src)


def copy_tree(src, dest, prune=False):
    """Copy the files of ``src`` into ``dest`` (bytes and mode); with ``prune`` delete what ``src`` does not have."""
    wanted = set(source_files(src))
    for rel in sorted(wanted):
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(src, rel), target)
        shutil.copymode(os.path.join(src, rel), target)
    if prune and os.path.isdir(dest):
        for rel in set(source_files(dest)) - wanted:
            os.remove(os.path.join(dest, rel))


def _last_lines(text, count=3):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip() and not line.startswith("hint:")]
    return " / ".join(lines[-count:]) or "no message"


# The Git options every gitops module takes (doc fragment alauda.spec_decoding.git_repository).
ARG_SPEC = dict(
    repo_url=dict(type="str", required=True),
    branch=dict(type="str", required=True),
    path=dict(type="str", default="."),
    push_branch=dict(type="str", default=""),
    ssh_key_file=dict(type="path"),
    known_hosts_file=dict(type="path"),
    token=dict(type="str", no_log=True),
    username=dict(type="str", default=DEFAULT_USERNAME),
    author_name=dict(type="str", default="alauda.spec_decoding"),
    author_email=dict(type="str", default="spec-decoding@alauda.io"),
    commit_message=dict(type="str"),
    workdir=dict(type="path"),
    timeout=dict(type="int", default=DEFAULT_TIMEOUT),
)
MUTUALLY_EXCLUSIVE = [("ssh_key_file", "token")]
REQUIRED_TOGETHER = [("ssh_key_file", "known_hosts_file")]
# The Git options' constraints, as a module contract takes them (kube/module.ModuleContract)
CONSTRAINTS = dict(mutually_exclusive=MUTUALLY_EXCLUSIVE, required_together=REQUIRED_TOGETHER)


def repository_from_params(params):
    """A Repository (not cloned yet) from the modules' Git options."""
    credentials = Credentials(ssh_key_file=params.get("ssh_key_file"), known_hosts_file=params.get("known_hosts_file"),
                              token=params.get("token"), username=params.get("username"))
    return Repository(params["repo_url"], params["branch"], credentials, workdir=params.get("workdir"),
                      author_name=params.get("author_name") or "alauda.spec_decoding",
                      author_email=params.get("author_email") or "spec-decoding@alauda.io",
                      timeout=params.get("timeout") or DEFAULT_TIMEOUT)


def change_in_clone(params, edit, message, check_mode=False):
    """What each gitops module does with its Git options: clone the branch, ``Repository.change`` it (check mode: the
    edit and its status, nothing committed or pushed), remove the clone."""
    with repository_from_params(params) as repo:
        repo.clone()
        return repo.change(edit, message, push_branch=params["push_branch"] or None, dry_run=check_mode)
