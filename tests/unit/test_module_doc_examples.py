"""The load generators' and the live-traffic judges' documentation as ansible-doc renders it (issue #48):

- spec_sweep's and spec_benchmark's own options each say their group first (Endpoints, Load, k, Report): ansible-doc has no
  option groups and lists options alphabetically;
- their EXAMPLES cover each mode (spec_sweep: request rate, concurrency, in-cluster load, confirmation, k schedule and its
  A/B against the best fixed k; spec_benchmark: in-cluster, paced from this host, two phases) with documented options only;
- the `checks` of the canary (canary_observe_info) and the watchdog have examples, in their EXAMPLES and in docs/rollback.md,
  and every example check is one the analysis engine accepts (bench/analysis.check_spec), with each form shown."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import analysis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = ("spec_sweep", "spec_benchmark", "speculative_watchdog", "canary_observe_info")
GROUPS = {"spec_sweep": ("Endpoints", "Load", "k", "Report"), "spec_benchmark": ("Endpoints", "Load", "Report")}
# options that come from the shared doc fragments (benchmark_protocol, load_job): placed in a group by the description
FRAGMENT_OPTIONS = {"temperature", "max_tokens", "seed", "validate_certs", "ca_path", "plots", "title", "progress_file",
                    "load_from", "load_job"}


@pytest.fixture(scope="module")
def docs():
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "collections"), ANSIBLE_NOCOLOR="1")
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-doc"), "--json", "-t", "module"]
                         + ["alauda.spec_decoding.%s" % name for name in MODULES],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    data = json.loads(out.stdout)
    return {name.split(".")[-1]: entry for name, entry in data.items()}


def _examples(entry):
    return yaml.safe_load(entry["examples"])


def _text(description):
    return " ".join(description) if isinstance(description, list) else description


@pytest.mark.parametrize("module", sorted(GROUPS))
def test_every_own_option_says_its_group_and_the_description_lists_the_groups(docs, module):
    options = docs[module]["doc"]["options"]
    ungrouped = {name: _text(opt["description"])[:60] for name, opt in options.items()
                 if name not in FRAGMENT_OPTIONS and not _text(opt["description"]).startswith(tuple(g + ": " for g in GROUPS[module]))}
    assert not ungrouped, ungrouped
    overview = [d for d in docs[module]["doc"]["description"] if d.startswith("Options by group")]
    assert len(overview) == 1, docs[module]["doc"]["description"]
    for group in GROUPS[module]:
        assert "B(%s)" % group in overview[0]
    # every option, the fragments' too, is named in the overview
    named = set(re.findall(r"O\(([a-z_]+)", overview[0]))
    missing = {name for name in FRAGMENT_OPTIONS if name in options} - named
    assert not missing, missing


@pytest.mark.parametrize("module", sorted(GROUPS))
def test_the_examples_use_documented_options_only(docs, module):
    options = set(docs[module]["doc"]["options"])
    for task in _examples(docs[module]):
        args = task.get("alauda.spec_decoding.%s" % module)
        if args is not None:
            assert set(args) <= options, (task["name"], set(args) - options)


def test_spec_sweep_has_an_example_for_each_mode(docs):
    calls = [t["alauda.spec_decoding.spec_sweep"] for t in _examples(docs["spec_sweep"]) if "alauda.spec_decoding.spec_sweep" in t]
    modes = {
        "request rate with the k prediction": lambda a: "request_rates" in a and "k_candidates" in a,
        "concurrency": lambda a: "concurrencies" in a,
        "in-cluster load": lambda a: a.get("load_from") == "cluster" and (a.get("load_job") or {}).get("namespace"),
        "confirmation of the predicted k": lambda a: "confirm_url" in a and "confirm_k" in a,
        "k schedule derived": lambda a: a.get("k_schedule") is True and "schedule_url" not in a,
        "the schedule against the best fixed k": lambda a: "schedule_url" in a and "fixed_url" in a,
    }
    assert {mode: any(test(a) for a in calls) for mode, test in modes.items()} == {mode: True for mode in modes}


def test_spec_benchmark_has_an_example_for_each_mode(docs):
    calls = [t["alauda.spec_decoding.spec_benchmark"] for t in _examples(docs["spec_benchmark"])
             if "alauda.spec_decoding.spec_benchmark" in t]
    modes = {
        "in-cluster load": lambda a: a.get("load_from") == "cluster",
        "paced from this host": lambda a: a.get("load_from") == "controller" and "request_rate" in a,
        "two phases": lambda a: a.get("phase") in ("baseline", "candidate"),
    }
    assert {mode: any(test(a) for a in calls) for mode, test in modes.items()} == {mode: True for mode in modes}


def _doc_checks():
    """The check lists of docs/rollback.md's YAML blocks (canary_checks, watch_checks)."""
    with open(os.path.join(ROOT, "docs", "rollback.md"), encoding="utf-8") as handle:
        text = handle.read()
    found = {}
    for block in re.findall(r"^ *```yaml\n(.*?)^ *```", text, re.S | re.M):
        data = yaml.safe_load(textwrap.dedent(block))
        if isinstance(data, dict):
            found.update({k: v for k, v in data.items() if k in ("canary_checks", "watch_checks")})
    return found


def _forms(checks):
    specs = [analysis.check_spec(c) for c in checks]  # raises on a check the engine refuses
    return {"baseline" if "better" in s else "bound" for s in specs} | ({"dry_run"} if any(s["dry_run"] for s in specs) else set())


@pytest.mark.parametrize("module", ["canary_observe_info", "speculative_watchdog"])
def test_the_checks_have_examples_the_engine_accepts_in_the_module_docs(docs, module):
    checks = [c for t in _examples(docs[module]) for c in (t.get("alauda.spec_decoding.%s" % module) or {}).get("checks") or []]
    assert _forms(checks) == {"baseline", "bound", "dry_run"}, checks


def test_the_checks_have_examples_the_engine_accepts_in_the_rollback_guide():
    found = _doc_checks()
    assert set(found) == {"canary_checks", "watch_checks"}, found
    for checks in found.values():
        assert _forms(checks) >= {"baseline", "dry_run"}, checks
