"""gitops/git_repo and the modules gitops_speculative / gitops_publish against a real Git server on loopback
(tests/testbed/git_server.py: git daemon for git://, git http-backend behind HTTP Basic auth for http://).

No kube-apiserver: the modules run in-process (tests/module_run.py) and git runs for real. Covered: a push to the
branch, a push to a new review branch, a non-fast-forward rejection met once, a protected branch, an unreachable server,
an unknown branch, missing and wrong credentials, and the HTTPS token never in the output or the clone.
"""

from __future__ import annotations

import base64
import json
import os
import textwrap

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import git_repo, manifest_edit
from tests.module_run import run_module
from tests.testbed.git_server import GitServer
from tests.testbed.ssh_git import SSHGitServer
from tests.testbed.ports import free_port

SPEC_JSON = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}'
ISVC = textwrap.dedent("""\
    # Argo CD syncs this file
    apiVersion: serving.kserve.io/v1beta1
    kind: InferenceService
    metadata:
      name: llm
    spec:
      predictor:
        model:
          modelFormat: {name: vllm}
          args:
          - --dtype=half   # keep
          - --speculative-config
          - '%s'
          - --seed=1
    """) % SPEC_JSON
STRIPPED = "".join(line for line in ISVC.splitlines(keepends=True) if "speculative-config" not in line and "method" not in line)
FILES = {"apps/llm/isvc.yaml": ISVC, "apps/llm/kustomization.yaml": "resources:\n  - isvc.yaml\n", "README.md": "serving\n"}


@pytest.fixture(scope="module")
def server():
    with GitServer() as srv:
        yield srv


@pytest.fixture
def repo_name(server, request):
    name = request.node.name.replace("[", "-").replace("]", "")
    server.create_repo(name, FILES)
    return name


def _secrets(server):
    pair = "%s:%s" % (server.username, server.token)
    return [server.token, pair, base64.b64encode(pair.encode()).decode()]


def _tree_text(root):
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as handle:
                out.append(handle.read().decode("latin-1"))
    return "\n".join(out)


def _rollback_args(server, repo_name, **extra):
    args = dict(repo_url=server.http_url(repo_name), branch="main", path="apps/llm", token=server.token, username=server.username,
                name="llm", namespace="serving", reason="acceptance rate below the floor")
    args.update(extra)
    return {k: v for k, v in args.items() if v is not None}


def test_rollback_pushes_to_the_branch_over_https_token_never_shown(server, repo_name, tmp_path):
    before = server.head(repo_name)
    workdir = str(tmp_path / "work")
    check = run_module("gitops_speculative", _rollback_args(server, repo_name, workdir=workdir), check_mode=True, diff=True)
    assert not check.failed, check.msg
    assert check["changed"] is True and check["commit"] is None and server.head(repo_name) == before
    assert "\n-      - --speculative-config\n" in check["diff"]["prepared"]

    result = run_module("gitops_speculative", _rollback_args(server, repo_name, workdir=workdir), diff=True)
    assert not result.failed, result.msg
    assert result["changed"] is True and result["pushed_branch"] == "main" and result["retried"] is False
    assert result["commit"] == server.head(repo_name) != before and result["base"] == before
    assert server.show(repo_name, "main", "apps/llm/isvc.yaml") == STRIPPED
    assert server.changed_files(repo_name, result["commit"]) == ["apps/llm/isvc.yaml"]
    subject = server.log(repo_name)[0]["subject"]
    assert subject == ("Roll back speculative decoding on serving/llm: remove --speculative-config %s (acceptance rate below the floor)"
                       % SPEC_JSON) == result["commit_message"]
    assert server.log(repo_name)[0]["author"] == "alauda.spec_decoding <spec-decoding@alauda.io>"
    assert [r["flag"] for r in result["removed"]] == ["--speculative-config"]
    text = json.dumps(result) + json.dumps(check)
    assert not [s for s in _secrets(server) if s in text]
    assert os.listdir(workdir) == []  # the clone is gone

    again = run_module("gitops_speculative", _rollback_args(server, repo_name))
    assert not again.failed and again["changed"] is False and again["commit"] is None and again["files"] == []
    assert server.head(repo_name) == result["commit"]
    print("rollback commit %s, requests to the http side so far: %d" % (result["commit"][:12], len(server.requests)))


def test_clone_over_https_keeps_the_token_out_of_the_clone_and_argv(server, repo_name, monkeypatch):
    seen = []
    real_run = git_repo.subprocess.run

    def spy(argv, **kwargs):
        seen.append(list(argv))
        return real_run(argv, **kwargs)  # pylint: disable=subprocess-run-check  # check is in kwargs
    monkeypatch.setattr(git_repo.subprocess, "run", spy)
    creds = git_repo.Credentials(token=server.token, username=server.username)
    repo = git_repo.Repository(server.http_url(repo_name), "main", creds)
    try:
        repo.clone()
        repo.write("apps/llm/isvc.yaml", STRIPPED)
        out = repo.change(lambda r: None, "strip")
        assert out["commit"] == server.head(repo_name)
        clone_text = _tree_text(repo._base)  # pylint: disable=protected-access  # the clone, its .git and git's HOME
        assert not [s for s in _secrets(server) if s in clone_text]
        assert "extraheader" not in clone_text.lower()
    finally:
        repo.close()
    assert seen and not [a for a in seen if any(s in " ".join(a) for s in _secrets(server))]
    assert not os.path.exists(repo.root)


def test_push_to_a_new_review_branch(server, repo_name):
    before = server.head(repo_name)
    result = run_module("gitops_speculative", _rollback_args(server, repo_name, push_branch="rollback/llm-speculative"))
    assert not result.failed, result.msg
    assert result["pushed_branch"] == "rollback/llm-speculative" and result["changed"] is True
    assert server.head(repo_name) == before  # main untouched
    assert server.head(repo_name, "rollback/llm-speculative") == result["commit"]
    assert server.show(repo_name, "rollback/llm-speculative", "apps/llm/isvc.yaml") == STRIPPED

    taken = run_module("gitops_speculative", _rollback_args(server, repo_name, push_branch="rollback/llm-speculative"))
    assert taken.failed and taken["field"] == "push_branch" and "already exists" in taken.msg


def test_non_fast_forward_refetches_reapplies_and_pushes_once(server, repo_name, monkeypatch):
    real = manifest_edit.strip_in_directory
    calls = []

    def racing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # another user pushes between our clone and our push
            server.commit_file(repo_name, "main", "README.md", "someone else's change\n", "concurrent commit")
        return real(*args, **kwargs)
    monkeypatch.setattr(manifest_edit, "strip_in_directory", racing)
    result = run_module("gitops_speculative", _rollback_args(server, repo_name))
    assert not result.failed, result.msg
    log = server.log(repo_name)
    concurrent_base = log[1]["sha"]
    assert result["retried"] is True and len(calls) == 2
    assert [c["subject"] for c in log[:2]] == [result["commit_message"], "concurrent commit"]
    assert result["base"] == concurrent_base and result["commit"] == log[0]["sha"]
    assert server.show(repo_name, "main", "README.md") == "someone else's change\n"
    assert server.show(repo_name, "main", "apps/llm/isvc.yaml") == STRIPPED


def test_protected_branch_is_a_clear_error(server, repo_name):
    server.protect(repo_name, "main")
    before = server.head(repo_name)
    result = run_module("gitops_speculative", _rollback_args(server, repo_name))
    assert result.failed and result["field"] == "branch"
    assert "refused the push to branch 'main'" in result.msg and "GH006" in result.msg
    assert "push_branch" in result["fix"] and "branch protection" in result["fix"]
    assert server.head(repo_name) == before
    assert not [s for s in _secrets(server) if s in json.dumps(result)]
    # the fix the message names: a branch for review
    review = run_module("gitops_speculative", _rollback_args(server, repo_name, push_branch="rollback/llm"))
    assert not review.failed, review.msg
    assert server.head(repo_name, "rollback/llm") == review["commit"] and server.head(repo_name) == before


def test_unreachable_repository_and_unknown_branch(server, repo_name):
    dead = run_module("gitops_speculative", _rollback_args(server, repo_name, repo_url="http://127.0.0.1:%d/x.git" % free_port(),
                                                           timeout=20))
    assert dead.failed and dead["field"] == "repo_url" and dead.msg.startswith("repo_url: cannot reach http://127.0.0.1:")
    branch = run_module("gitops_speculative", _rollback_args(server, repo_name, branch="release-9"))
    assert branch.failed and branch["field"] == "branch" and "branch 'release-9' does not exist" in branch.msg
    missing = run_module("gitops_speculative", _rollback_args(server, "no-such-repo"))
    assert missing.failed and missing["field"] == "repo_url", missing.msg


def test_missing_and_wrong_credentials(server, repo_name):
    args = _rollback_args(server, repo_name)
    del args["token"]
    missing = run_module("gitops_speculative", args)
    assert missing.failed and missing["field"] == "token" and "none were given" in missing.msg
    assert "rollback_git_credentials_secret" in missing["fix"]
    wrong = run_module("gitops_speculative", _rollback_args(server, repo_name, token="not-the-token-9f8e"))
    assert wrong.failed and wrong["field"] == "token" and "refused the credentials" in wrong.msg
    assert "not-the-token-9f8e" not in json.dumps(wrong)


def test_ssh_options_are_checked_before_git_runs(server, repo_name, tmp_path):
    ssh_url = "git@git.example.invalid:platform/serving.git"
    no_key = run_module("gitops_speculative", _rollback_args(server, repo_name, repo_url=ssh_url, token=None))
    assert no_key.failed and no_key["field"] == "ssh_key_file" and "SSH URL" in no_key.msg
    key = tmp_path / "id"
    key.write_text("k")
    no_hosts = run_module("gitops_speculative", _rollback_args(server, repo_name, repo_url=ssh_url, token=None, ssh_key_file=str(key)))
    assert no_hosts.failed and "known_hosts_file" in no_hosts.msg
    both = run_module("gitops_speculative", _rollback_args(server, repo_name, ssh_key_file=str(key), known_hosts_file=str(key)))
    assert both.failed and "mutually exclusive" in both.msg
    in_url = run_module("gitops_speculative", _rollback_args(server, repo_name, repo_url="https://u:p4ss@example.invalid/r.git"))
    assert in_url.failed and in_url["field"] == "repo_url" and "p4ss" not in in_url.msg  # (the invocation echoes the option as given)

    creds = git_repo.Credentials(ssh_key_file="/keys/id ed", known_hosts_file="/keys/known_hosts")
    env = creds.environment(ssh_url)
    assert env["GIT_SSH_COMMAND"].startswith("ssh -i '/keys/id ed' -o IdentitiesOnly=yes -o UserKnownHostsFile=/keys/known_hosts "
                                             "-o StrictHostKeyChecking=yes")
    assert "GIT_CONFIG_COUNT" not in env
    token_env = git_repo.Credentials(token="t0k", username="u").environment("https://git.example.com:8443/org/r.git")
    assert token_env["GIT_CONFIG_KEY_0"] == "http.https://git.example.com:8443/.extraHeader"
    assert token_env["GIT_CONFIG_VALUE_0"] == "Authorization: Basic " + base64.b64encode(b"u:t0k").decode()


@pytest.fixture(scope="module")
def sshd(server):
    with SSHGitServer(server.root) as srv:
        yield srv


def test_rollback_over_ssh_with_a_deploy_key_and_a_pinned_host_key(server, sshd, repo_name):
    """The SSH transport for real: OpenSSH's sshd on loopback, the deploy key it accepts, its host key pinned. A host key
    that is not the pinned one, and a key the server does not accept, are each a message naming the option to fix, and
    nothing is pushed."""
    url = sshd.url(server.path(repo_name))
    before = server.head(repo_name)
    ssh_args = dict(repo_url=url, token=None, username=None, ssh_key_file=sshd.deploy_key, known_hosts_file=sshd.known_hosts)
    spoofed_args = {**ssh_args, "known_hosts_file": sshd.wrong_known_hosts}
    spoofed = run_module("gitops_speculative", _rollback_args(server, repo_name, **spoofed_args))
    assert spoofed.failed and spoofed["field"] == "known_hosts_file" and "host key" in spoofed.msg, spoofed.msg
    refused_args = {**ssh_args, "ssh_key_file": sshd.other_key}
    refused = run_module("gitops_speculative", _rollback_args(server, repo_name, **refused_args))
    assert refused.failed and refused["field"] == "ssh_key_file", (refused.msg, refused.get("field"))
    assert server.head(repo_name) == before
    print("spoofed host key: %s\nkey not accepted: %s" % (spoofed.msg, refused.msg))

    result = run_module("gitops_speculative", _rollback_args(server, repo_name, **ssh_args))
    assert not result.failed, result.msg
    assert result["changed"] is True and result["commit"] == server.head(repo_name) != before
    assert server.show(repo_name, "main", "apps/llm/isvc.yaml") == STRIPPED
    with open(sshd.deploy_key, encoding="utf-8") as handle:
        private = handle.read().split("\n")[1]  # a line of the key's body
    assert private not in json.dumps(result) + json.dumps(spoofed) + json.dumps(refused)


def test_publish_commits_the_rendered_directory_only_when_the_tree_differs(server, repo_name, tmp_path):
    render = tmp_path / "render"
    render.mkdir()
    (render / "llm.yaml").write_text(STRIPPED)
    (render / "kustomization.yaml").write_text("resources:\n- llm.yaml\n")
    (render / ".hidden").write_text("x")
    args = dict(src=str(render), repo_url=server.git_url(repo_name), branch="main", path="deploy/llm", commit_message="Deploy llm")
    check = run_module("gitops_publish", args, check_mode=True)
    assert not check.failed, check.msg
    assert check["changed"] is True and check["commit"] is None
    assert sorted(f["file"] for f in check["files"]) == ["deploy/llm/kustomization.yaml", "deploy/llm/llm.yaml"]

    first = run_module("gitops_publish", args, diff=True)
    assert not first.failed, first.msg
    assert first["changed"] is True and first["commit"] == server.head(repo_name)
    assert server.show(repo_name, "main", "deploy/llm/llm.yaml") == STRIPPED
    assert sorted(server.changed_files(repo_name, first["commit"])) == ["deploy/llm/kustomization.yaml", "deploy/llm/llm.yaml"]
    assert "+++ b/deploy/llm/llm.yaml" in first["diff"]["prepared"]

    again = run_module("gitops_publish", args)
    assert not again.failed and again["changed"] is False and again["commit"] is None
    assert server.head(repo_name) == first["commit"]

    (render / "kustomization.yaml").unlink()
    pruned = run_module("gitops_publish", dict(args, prune=True))
    assert pruned["changed"] is True and pruned["files"] == [{"status": "D", "file": "deploy/llm/kustomization.yaml"}]


def test_publish_over_https_with_token(server, repo_name, tmp_path):
    render = tmp_path / "render"
    render.mkdir()
    (render / "isvc.yaml").write_text(ISVC)
    result = run_module("gitops_publish", dict(src=str(render), repo_url=server.http_url(repo_name), branch="main", path="apps/llm",
                                               token=server.token, username=server.username))
    assert not result.failed, result.msg
    assert result["changed"] is False  # the same bytes are there already
    (render / "isvc.yaml").write_text(STRIPPED)
    changed = run_module("gitops_publish", dict(src=str(render), repo_url=server.http_url(repo_name), branch="main", path="apps/llm",
                                                token=server.token, username=server.username))
    assert changed["changed"] is True and changed["files"] == [{"status": "M", "file": "apps/llm/isvc.yaml"}]
    assert server.show(repo_name, "main", "apps/llm/isvc.yaml") == STRIPPED
    assert not [s for s in _secrets(server) if s in json.dumps(changed)]


def test_repository_refuses_a_path_outside_and_scrubs(server, repo_name):
    repo = git_repo.Repository(server.git_url(repo_name), "main")
    try:
        repo.clone()
        with pytest.raises(ValidationError):
            repo.path("../outside")
    finally:
        repo.close()
    assert git_repo.scrub("a s3cr3t and czNjcjN0", ["s3cr3t", "czNjcjN0"]) == "a ******** and ********"
    with pytest.raises(SpecDecodingError):
        git_repo.Repository("", "main")
