# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """The Git repository options of the gitops modules (plugins/module_utils/gitops/git_repo.py ARG_SPEC)."""

    DOCUMENTATION = r"""
options:
  repo_url:
    description:
      - The Git repository (the owner's source, for example the Argo CD Application's C(spec.source.repoURL) or the
        Flux GitRepository's C(spec.url)).
      - An C(ssh://) or C(git@host:path) URL needs O(ssh_key_file) and O(known_hosts_file); an C(https://) URL takes
        O(token). Credentials in the URL itself are refused.
    type: str
    required: true
  branch:
    description:
      - The branch to clone and to push to (the Application's C(targetRevision), the GitRepository's C(ref.branch)).
    type: str
    required: true
  path:
    description:
      - The directory of the repository the change is about, relative to its root (the Application's
        C(spec.source.path), the Kustomization's C(spec.path)).
    type: str
    default: "."
  push_branch:
    description:
      - Empty pushes to O(branch). A name pushes the commit to that new branch instead, for review (a merge request);
        an existing branch of that name is refused.
    type: str
    default: ""
  ssh_key_file:
    description:
      - Private SSH key (a deploy key with write access) for an SSH O(repo_url), used through C(GIT_SSH_COMMAND) only.
    type: path
  known_hosts_file:
    description:
      - The server's pinned host key (C(known_hosts) format); host key checking is strict.
    type: path
  token:
    description:
      - Token (or password) for an C(https://) O(repo_url), sent as HTTP Basic authorization with O(username) through
        git's C(GIT_CONFIG_*) environment variables (never in a command line, the URL, a file of the clone or the output).
    type: str
  username:
    description:
      - The user name that goes with O(token).
    type: str
    default: git
  author_name:
    description:
      - Author and committer name of the commit.
    type: str
    default: alauda.spec_decoding
  author_email:
    description:
      - Author and committer e-mail of the commit.
    type: str
    default: spec-decoding@alauda.io
  commit_message:
    description:
      - The commit message; without it the module writes one that says what changed and why.
      - (Not C(message), which Ansible reserves for itself.)
    type: str
  workdir:
    description:
      - Directory where the clone is made (in a new directory, removed at the end). Default the system's temporary directory.
    type: path
  timeout:
    description:
      - Seconds each git command may take (a clone, a push).
    type: int
    default: 120
requirements:
  - git (the C(git) program, 2.31 or newer) on the host that runs the module
"""
