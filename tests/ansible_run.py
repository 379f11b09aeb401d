"""Run real ansible-playbook from tests and read per-task results (json callback).

Shared by the unit, integration and e2e tiers so every test drives the collection the way users do.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PlaybookRun:
    """rc, raw output, per-task host results (in order) and the recap stats."""

    def __init__(self, proc):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        # At -v and above ansible prints a few lines (config file, ...) before the json callback's document.
        start = proc.stdout.find("\n{")
        text = proc.stdout if proc.stdout.startswith("{") else proc.stdout[start + 1:] if start >= 0 else ""
        try:
            data = json.loads(text)
        except ValueError:
            data = {"plays": [], "stats": {}}
        self.tasks = [(t["task"]["name"], host, res) for p in data.get("plays", []) for t in p["tasks"]
                      for host, res in t["hosts"].items()]
        self.stats = data.get("stats", {})

    def result(self, name_fragment):
        """The last result of a task whose name contains `name_fragment`."""
        found = [res for name, _h, res in self.tasks if name_fragment in name]
        assert found, "no task named like %r ran; tasks: %s\n%s" % (name_fragment, [n for n, _h, _r in self.tasks], self.output)
        return found[-1]

    @property
    def failed(self):
        return [res for _n, _h, res in self.tasks if res.get("failed")]

    @property
    def changed(self):
        return sum(s.get("changed", 0) for s in self.stats.values())

    @property
    def output(self):
        return (self.stdout[-6000:] + "\n" + self.stderr[-3000:]).strip()


def run_playbook(tmp_path, playbook=None, tasks=None, extra_vars=None, kubeconfig=None, check=False, diff=False,
                 inventory=None, env=None, timeout=600, verbosity=0):
    """Run `playbook` (a repo-relative path) or an ad-hoc play made of `tasks` (YAML text) on localhost."""
    if playbook is None:
        play = "- hosts: localhost\n  gather_facts: false\n  tasks:\n" + textwrap.indent(textwrap.dedent(tasks), "    ")
        path = os.path.join(str(tmp_path), "play.yml")
        with open(path, "w") as handle:
            handle.write(play)
        playbook = path
    elif not os.path.isabs(playbook):
        playbook = os.path.join(REPO, playbook)
    vars_path = os.path.join(str(tmp_path), "extra-vars.yml")
    with open(vars_path, "w") as handle:
        yaml.safe_dump(dict(extra_vars or {}, ansible_python_interpreter=sys.executable), handle)
    run_env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
                   ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
                   ANSIBLE_DEPRECATION_WARNINGS="false")
    if kubeconfig:
        run_env["K8S_AUTH_KUBECONFIG"] = kubeconfig
    run_env.update(env or {})
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), playbook, "-e", "@" + vars_path]
    cmd += ["-i", inventory if inventory else "localhost,"]
    if inventory is None:
        cmd += ["-c", "local"]
    if check:
        cmd.append("--check")
    if diff:
        cmd.append("--diff")
    if verbosity:
        cmd.append("-" + "v" * verbosity)
    proc = subprocess.run(cmd, cwd=REPO, env=run_env, capture_output=True, text=True, timeout=timeout, check=False)
    return PlaybookRun(proc)
