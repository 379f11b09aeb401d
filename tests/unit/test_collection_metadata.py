"""Packaging facts other parts rely on: every module is in the action group, every role has an argument spec."""

import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_action_group_lists_exactly_the_modules():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as handle:
        runtime = yaml.safe_load(handle)
    modules = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "plugins", "modules"))
                     if f.endswith(".py") and not f.startswith("_"))
    assert sorted(runtime["action_groups"]["spec_decoding"]) == modules


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
