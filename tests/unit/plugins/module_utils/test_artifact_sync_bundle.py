"""The stager as it is shipped (artifacts/artifact_sync/bundle.py, the stager_zipapp lookup): one zip application built
from the package, the same bytes on every build, standard library only, run the way the Job and the controller run it."""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import subprocess
import sys
import zipfile

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync import bundle
from tests import stager
from tests.ansible_run import run_playbook
from tests.digests import sha256_file
from tests.paths import REPO

PACKAGE = os.path.join(REPO, "plugins", "module_utils", "artifacts", "artifact_sync")


def _model(root):
    os.makedirs(os.path.join(root, "sub"))
    with open(os.path.join(root, "model.safetensors"), "wb") as fh:
        fh.write(os.urandom(3 << 20))
    with open(os.path.join(root, "sub", "config.json"), "w", encoding="utf-8") as fh:
        fh.write('{"architectures": ["LlamaForCausalLM"]}\n')
    return root


def _summary(stdout):
    return json.loads(stdout.strip().splitlines()[-1])["spec_decoding_sync"]


def test_the_zip_holds_every_file_of_the_package_and_errors_and_its_bytes_do_not_change():
    data = bundle.zipapp()
    assert data == bundle.zipapp() and bundle.zipapp_base64() == base64.b64encode(data).decode("ascii")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
        names = [info.filename for info in infos]
        package_files = sorted(n for n in os.listdir(PACKAGE) if n.endswith(".py") and n != "bundle.py")
        assert sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("module_utils/artifacts/artifact_sync/")) == package_files
        assert {"__main__.py", "module_utils/__init__.py", "module_utils/errors.py", "module_utils/artifacts/__init__.py"} <= set(names)
        assert len(names) == len(package_files) + 4
        assert {info.date_time for info in infos} == {(2020, 1, 1, 0, 0, 0)} and {info.external_attr for info in infos} == {0o644 << 16}
        with open(os.path.join(PACKAGE, "syncer.py"), encoding="utf-8") as fh:  # the sources as they are, byte for byte
            assert archive.read("module_utils/artifacts/artifact_sync/syncer.py").decode("utf-8") == fh.read()
        with open(os.path.join(REPO, "plugins", "module_utils", "errors.py"), encoding="utf-8") as fh:
            assert archive.read("module_utils/errors.py").decode("utf-8") == fh.read()
        sources = {name: archive.read(name).decode("utf-8") for name in names}
    for name, text in sources.items():  # the image's python3 has the standard library and nothing else
        for node in ast.walk(ast.parse(text, name)):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = [node.module.split(".")[0]]
            else:
                continue
            assert all(top in sys.stdlib_module_names for top in tops), "%s imports %s" % (name, tops)


def test_the_zip_stages_checks_and_removes_with_nothing_but_the_standard_library(tmp_path):
    """-I -S: no site-packages, no PYTHONPATH, no current directory on sys.path; only the zip."""
    src = _model(str(tmp_path / "src"))
    dest = tmp_path / "pvc" / "model"
    base = [sys.executable, "-I", "-S", stager.zipapp_path()]
    run = subprocess.run(base + ["--quiet", "--source", src, "--dest", str(dest), "--name", "org/model"], capture_output=True, text=True,
                         check=False, cwd=str(tmp_path), timeout=120)
    assert run.returncode == 0, run.stderr
    item = _summary(run.stdout)["items"][0]
    assert item["files"] == 2 and item["copied_files"] == 2 and item["verified_layout"] is True
    for rel in ("model.safetensors", "sub/config.json"):
        assert sha256_file(str(dest / rel)) == sha256_file(os.path.join(src, rel))
    check = subprocess.run(base + ["--quiet", "--check", "--dest", str(dest), "--name", "org/model"], capture_output=True, text=True,
                           check=False, cwd=str(tmp_path), timeout=120)
    assert check.returncode == 0 and _summary(check.stdout)["items"][0]["rehashed"] is True
    removed = subprocess.run(base + ["remove", "--quiet", "--root", str(tmp_path / "pvc"), "--subdir", "model"], capture_output=True,
                             text=True, check=False, cwd=str(tmp_path), timeout=120)
    assert removed.returncode == 0 and _summary(removed.stdout)["items"][0]["removed"] is True and not dest.exists()
    refused = subprocess.run(base + ["remove", "--quiet", "--root", str(tmp_path / "pvc"), "--subdir", "../src"], capture_output=True,
                             text=True, check=False, cwd=str(tmp_path), timeout=120)
    assert refused.returncode == 2 and os.path.isdir(src)


def test_the_controller_runs_the_package_from_plugins_as_the_role_does(tmp_path):
    """The stage_pvc role's file server: ``python -m module_utils.artifacts.artifact_sync`` in plugins/ (here --plan)."""
    src = _model(str(tmp_path / "src"))
    proc = subprocess.run([sys.executable, "-m", "module_utils.artifacts.artifact_sync", "--quiet", "--plan", "--source", src, "--dest",
                           str(tmp_path / "d")], capture_output=True, text=True, check=False, cwd=os.path.join(REPO, "plugins"),
                          env=dict(os.environ, PYTHONPATH=""), timeout=120)
    assert proc.returncode == 0, proc.stderr
    item = _summary(proc.stdout)["items"][0]
    assert item["files"] == 2 and item["bytes"] == (3 << 20) + os.path.getsize(os.path.join(src, "sub", "config.json"))
    assert not os.path.exists(str(tmp_path / "d"))


def test_the_lookup_gives_the_same_zip_through_ansible_playbook(tmp_path):
    run = run_playbook(tmp_path, tasks="""
    - name: Build the stager
      ansible.builtin.set_fact:
        stager_: "{{ lookup('alauda.spec_decoding.stager_zipapp') }}"
    """)
    assert run.rc == 0, run.output
    assert base64.b64decode(run.result("Build the stager")["ansible_facts"]["stager_"]) == bundle.zipapp()
