"""Run real ansible-playbook from tests and read per-task results (json callback).

Shared by the unit, integration and e2e tiers so every test drives the collection the way users do.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import resource
import subprocess
import sys
import textwrap
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every ansible-playbook run of this process: (playbook, wall seconds, CPU seconds of it and its children). tests/conftest.py
# reports them per test (the cost table of `make test`, see hack/test_summary.py).
PLAYBOOK_RUNS = []


def _epoch(stamp):
    """Seconds since the epoch of one of the json callback's timestamps (UTC, ISO 8601 with a trailing Z)."""
    return datetime.datetime.fromisoformat(stamp.rstrip("Z")).replace(tzinfo=datetime.timezone.utc).timestamp()


def children_cpu():
    """CPU seconds (user + system) of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _callback_document(stdout):
    """The json callback's document in ansible-playbook's stdout, and what was wrong when none was found.

    At -v and above ansible prints a few lines (config file, ...) before it, and anything else a process wrote to the
    same stdout may come before or after it: every line that starts with "{" is tried, and the first that decodes to
    the callback's document (it has "plays") wins; text after it is ignored."""
    decoder = json.JSONDecoder()
    problem = "stdout holds no line starting with '{' (no json callback document); it starts with %r" % stdout[:300]
    for match in re.finditer(r"(?m)^\{", stdout):
        try:
            data, _end = decoder.raw_decode(stdout, match.start())
        except ValueError as exc:
            problem = "the json callback's document did not decode (%s); stdout starts with %r" % (exc, stdout[:300])
            continue
        if isinstance(data, dict) and "plays" in data:
            return data, None
    return {"plays": [], "stats": {}}, problem


class PlaybookRun:
    """rc, raw output, per-task host results (in order) and the recap stats."""

    def __init__(self, proc):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        data, self.parse_problem = _callback_document(proc.stdout)
        self.tasks = [(t["task"]["name"], host, res) for p in data.get("plays", []) for t in p["tasks"]
                      for host, res in t["hosts"].items()]
        self.stats = data.get("stats", {})
        # When each play and task started and ended (epoch seconds; a task without a host result, e.g. an include,
        # has no end): [(play start, [(task name, start, end or None, host results), ...]), ...].
        self.timeline = [(_epoch(p["play"]["duration"]["start"]),
                          [(t["task"]["name"], _epoch(t["task"]["duration"]["start"]),
                            _epoch(t["task"]["duration"]["end"]) if "end" in t["task"]["duration"] else None, t["hosts"])
                           for t in p["tasks"]]) for p in data.get("plays", [])]
        # Set by run_playbook: when ansible-playbook was started (epoch seconds), its wall and CPU seconds (with its children).
        self.started = self.wall = self.cpu = None

    def result(self, name_fragment):
        """The last result of a task whose name contains `name_fragment`."""
        found = [res for name, _h, res in self.tasks if name_fragment in name]
        assert found, "no task named like %r ran; tasks: %s%s\n%s" % (
            name_fragment, [n for n, _h, _r in self.tasks], "\n" + self.parse_problem if self.parse_problem else "", self.output)
        return found[-1]

    def case_tasks(self, case_id):
        """Names of the tasks one case of `run_cases` ran, in order (its include and rescue excluded)."""
        names = [name for name, _h, _r in self.tasks]
        start, end = names.index("case %s" % case_id), names.index("done %s" % case_id)
        return [n.split(" : ", 1)[-1] for n in names[start + 1:end] if not n.startswith("failed ")]

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
    started, wall0, cpu0 = time.time(), time.monotonic(), children_cpu()
    proc = subprocess.run(cmd, cwd=REPO, env=run_env, capture_output=True, text=True, timeout=timeout, check=False)
    # A run in a thread (the fault tests) may overlap another child's exit: the CPU is then shared out roughly.
    PLAYBOOK_RUNS.append((os.path.relpath(playbook, REPO), time.monotonic() - wall0, children_cpu() - cpu0))
    run = PlaybookRun(proc)
    run.started, run.wall, run.cpu = started, PLAYBOOK_RUNS[-1][1], PLAYBOOK_RUNS[-1][2]
    return run


DID_NOT_FAIL = "__DID_NOT_FAIL__"


def cases_play(cases, always=None, name="cases"):
    """One play that runs each `(case_id, task)` in its own block/rescue, so a failing case is recorded and the next
    one still runs. Each case's result is `{msg, task}`: the failure message and the name of the task that failed, or
    msg DID_NOT_FAIL. `always(case_id)` gives tasks to run after each case (e.g. a witness of what it wrote)."""
    tasks = [{"name": "Start", "ansible.builtin.set_fact": {"cases_out": {}}}]
    for cid, task in cases:
        failed = {"name": "failed %s" % cid, "ansible.builtin.set_fact": {"cases_out": (
            "{{ cases_out | combine({%r: {'msg': ansible_failed_result.msg | default(ansible_failed_result | string), "
            "'task': ansible_failed_task.name}}) }}" % cid)}}
        block = {"name": "block %s" % cid, "block": [dict(task, name="case %s" % cid)], "rescue": [failed]}
        # The `done` marker runs for every case (it bounds the case's tasks in the run's task list); it records
        # DID_NOT_FAIL only when the rescue did not record a failure first.
        block["always"] = [{"name": "done %s" % cid, "ansible.builtin.set_fact": {"cases_out": (
            "{{ cases_out if %r in cases_out else cases_out | combine({%r: {'msg': %r}}) }}" % (cid, cid, DID_NOT_FAIL))}}]
        if always:
            block["always"] += always(cid)
        tasks.append(block)
    tasks.append({"name": "cases results", "ansible.builtin.debug": {"var": "cases_out"}})
    return [{"name": name, "hosts": "localhost", "gather_facts": False, "tasks": tasks}]


def run_cases(tmp_path, cases, always=None, **kwargs):
    """Run `cases_play(cases)` with one ansible-playbook (one interpreter start and collection load for all of them);
    returns (PlaybookRun, {case_id: {msg, task}})."""
    path = os.path.join(str(tmp_path), "cases.yml")
    with open(path, "w") as handle:
        yaml.safe_dump(cases_play(cases, always), handle, sort_keys=False, width=1000)
    run = run_playbook(tmp_path, path, **kwargs)
    return run, run.result("cases results")["cases_out"]
