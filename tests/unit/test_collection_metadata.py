"""Packaging facts other parts rely on: every module is in the action group, every role has an argument spec, the
modules' earlier names still resolve (with a deprecation)."""

import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_action_group_lists_exactly_the_modules():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as handle:
        runtime = yaml.safe_load(handle)
    modules = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "plugins", "modules"))
                     if f.endswith(".py") and not f.startswith("_"))
    assert sorted(runtime["action_groups"]["spec_decoding"]) == modules


# Read-only modules were renamed to Ansible's `_info` names; meta/runtime.yml routes the earlier names to them until 2.0.0.
RENAMED = {
    "kserve_facts": "kserve_info",
    "engine_config": "engine_config_info",
    "spec_metrics": "speculative_metrics_info",
    "llmisvc_engine_config": "llmisvc_engine_config_info",
    "canary_observe": "canary_observe_info",
}

# What ansible-playbook does with a task's module name: ansible's module loader resolves it through meta/runtime.yml's
# plugin_routing. Run in a child process: the loader installs ansible's collection finder, which would re-import
# `ansible_collections` under the other tests of this process.
_RESOLVE = """
import json, sys
from ansible.plugins.loader import init_plugin_loader, module_loader
init_plugin_loader([sys.argv[1]])
out = {}
for name in sys.argv[2:]:
    ctx = module_loader.find_plugin_with_context("alauda.spec_decoding." + name)
    out[name] = dict(resolved=ctx.resolved, fqcn=ctx.resolved_fqcn, path=ctx.plugin_resolved_path, deprecated=ctx.deprecated,
                     removal_version=ctx.removal_version, warnings=ctx.deprecation_warnings)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def resolved_old_names():
    collections = os.path.join(ROOT, ".build", "collections")
    proc = subprocess.run([sys.executable, "-c", _RESOLVE, collections] + sorted(RENAMED), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_earlier_module_name_runs_the_info_module_with_a_deprecation(resolved_old_names, old):
    new = RENAMED[old]
    got = resolved_old_names[old]
    assert not os.path.exists(os.path.join(ROOT, "plugins", "modules", old + ".py")), "the redirect, not a file, serves " + old
    assert got["resolved"] and got["fqcn"] == "alauda.spec_decoding." + new
    assert os.path.realpath(got["path"]) == os.path.join(os.path.realpath(ROOT), "plugins", "modules", new + ".py")
    assert got["deprecated"] and got["removal_version"] == "2.0.0"
    assert got["warnings"] == ["alauda.spec_decoding.%s has been deprecated. Use alauda.spec_decoding.%s instead (same options and "
                               "return values)." % (old, new)]


def test_plugin_routing_lists_exactly_the_renamed_modules():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as handle:
        routing = yaml.safe_load(handle)["plugin_routing"]
    assert set(routing) == {"modules"}
    assert {old: entry["redirect"] for old, entry in routing["modules"].items()} == {
        old: "alauda.spec_decoding." + new for old, new in RENAMED.items()}


def test_every_role_has_typed_argument_specs():
    roles_dir = os.path.join(ROOT, "roles")
    roles = [r for r in os.listdir(roles_dir) if os.path.isdir(os.path.join(roles_dir, r))] if os.path.isdir(roles_dir) else []
    for role in roles:
        spec_path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        assert os.path.exists(spec_path), "role %s has no meta/argument_specs.yml" % role
        with open(spec_path) as handle:
            spec = yaml.safe_load(handle)
        options = spec["argument_specs"]["main"].get("options", {})
        for name, opt in options.items():
            assert name.startswith(role + "_"), "role %s: variable %s is not prefixed with the role name" % (role, name)
            assert "type" in opt, "role %s: option %s has no type" % (role, name)


def test_galaxy_metadata():
    with open(os.path.join(ROOT, "galaxy.yml")) as handle:
        galaxy = yaml.safe_load(handle)
    assert (galaxy["namespace"], galaxy["name"], galaxy["version"]) == ("alauda", "spec_decoding", "0.1.0")
    assert "kubernetes.core" in galaxy["dependencies"]


def test_execution_environment_definition_is_accepted_by_ansible_builder(tmp_path):
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    builder = os.path.join(os.path.dirname(sys.executable), "ansible-builder")
    proc = subprocess.run([builder, "create", "-f", os.path.join(ROOT, "execution-environment.yml"), "-c", str(tmp_path / "ctx")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    containerfile = (tmp_path / "ctx" / "Dockerfile").read_text()
    assert "ansible-galaxy" in containerfile
    with open(os.path.join(ROOT, "meta", "execution-environment.yml")) as handle:
        meta_ee = yaml.safe_load(handle)
    assert os.path.exists(os.path.join(ROOT, meta_ee["dependencies"]["python"]))
