"""The README's commands and docs/first-inventory.md's, run verbatim on a clean copy of the checkout (GitOps, no cluster).

The copy holds the files git tracks plus the new ones it does not ignore (`git ls-files -co --exclude-standard`: a git
clone of HEAD would miss uncommitted work), without `.venv`: a new virtualenv would take minutes, so the copy's `.venv`
is a link to the one running this test. `make setup` and `make deploy-eagle3` then run as written; hack/setup.sh finds
the virtualenv with the same requirements stamp (checked first: otherwise it would reinstall into the shared one) and
only links the copy as the collection. Each command runs in a bash that starts from a clean environment (no
ANSIBLE_*, no virtualenv on PATH) and carries the exported environment from one block to the next, as one terminal
would. Blocks and commands that need a cluster or a registry are not run; each is listed below with the reason.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys

import yaml

from tests.ansible_run import REPO

GUIDE = os.path.join(REPO, "docs", "first-inventory.md")
README = os.path.join(REPO, "README.md")
GOLDEN = os.path.join(REPO, "tests", "unit", "golden", "gitops")
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The guide's blocks that are not run, by their first line.
GUIDE_NOT_RUN = {
    "# needs: cluster": "applies to a cluster with KServe and the ServingRuntime (the integration tier's test bed covers the cluster target)",
    "# needs: registry": "builds and pushes a Modelcar image to a registry (tests/integration/test_modelcar.py covers the build and push)",
}
# The README's commands that are not run, and why. Every other README command is run and checked below: a new command
# fails test_readme_commands until it is checked or listed here.
README_NOT_RUN = {
    "make test": "the whole suite, this test included",
    "ansible-playbook -i inventories/example-connected playbooks/deploy-eagle3.yml": "target cluster: needs a cluster",
    "ansible-playbook -i inventories/example-airgapped playbooks/deploy-eagle3.yml --check --diff": "target cluster: needs a cluster",
    "ansible-playbook playbooks/canary.yml -e canary_isvc_name=llama -e canary_namespace=models":
        "a canary on live traffic: needs a cluster (the command goes on with -e ...)",
    "make try-local": "needs the local cluster and vLLM; run by tests/e2e/test_try_local_e2e.py",
}


def _venv():
    """The virtualenv running this test (`.venv` of the checkout under `make test`)."""
    return sys.prefix


def _clean_copy(dest):
    """The checkout's tracked and new files (not ignored ones) under `dest`, and `.venv` linking to the shared virtualenv."""
    listing = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    copied = 0
    for rel in sorted(set(listing.decode().split("\0")) - {""}):
        source = os.path.join(REPO, rel)
        if rel == ".venv" or rel.startswith(".venv/") or not os.path.lexists(source):
            continue  # a tracked file deleted in the working tree is not in the copy either
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
        copied += 1
    assert copied > 100, "only %d files copied from %s" % (copied, REPO)
    stamp = os.path.join(_venv(), ".requirements.sha256")
    with open(stamp, encoding="utf-8") as handle:
        have = handle.read().strip()
    digest = hashlib.sha256()
    for name in ("requirements.txt", "requirements-dev.txt"):
        with open(os.path.join(dest, name), "rb") as handle:
            digest.update(handle.read())
    assert digest.hexdigest() == have, (
        "%s was made for other requirements than the checkout's: make setup in the copy would reinstall into it. "
        "Run make setup in %s first." % (stamp, REPO))
    os.symlink(_venv(), os.path.join(dest, ".venv"))
    assert not os.path.exists(os.path.join(dest, ".build")), "the copy must start without the collection link"
    return os.path.realpath(str(dest))


def _clean_env(home):
    """A new login shell's environment: no ANSIBLE_* settings, no virtualenv, nothing of pytest's."""
    venv_bin = os.path.realpath(os.path.join(_venv(), "bin"))
    path = [p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if p and os.path.realpath(p) != venv_bin and "/.venv/" not in p + "/"]
    env = {"HOME": home, "PATH": os.pathsep.join(path), "LANG": "C.UTF-8", "TERM": "dumb", "USER": os.environ.get("USER", "user")}
    if os.environ.get("TMPDIR"):
        env["TMPDIR"] = os.environ["TMPDIR"]
    return env


class Terminal:
    """One user's terminal in `cwd`: each run is a bash whose exported environment carries over to the next."""

    def __init__(self, cwd, env):
        self.cwd = cwd
        self.env = env
        self.state = os.path.join(os.path.dirname(cwd), "terminal-env.sh")
        with open(self.state, "w", encoding="utf-8") as handle:
            handle.write("")

    def run(self, commands, timeout=600):
        script = "set -eo pipefail\nsource %s\n%s\nexport -p > %s\n" % (shlex.quote(self.state), commands, shlex.quote(self.state))
        proc = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        output = ANSI.sub("", proc.stdout + proc.stderr)
        assert proc.returncode == 0, "this failed (rc %d):\n%s\n--- output ---\n%s" % (proc.returncode, commands, output[-6000:])
        return output


def _wrote_line(output, gitops_dir, files):
    """The deploy's closing line naming what it wrote, and where."""
    line = "Wrote %s in %s (" % (", ".join(files), gitops_dir)
    assert line in " ".join(output.split()), "no %r in the output:\n%s" % (line, output[-3000:])


def _load(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _model_arg(manifest):
    script = manifest["spec"]["predictor"]["model"]["command"][2]
    return re.search(r"--model (\S+)", script).group(1)


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def readme_commands():
    """The README's bash commands: a continued line joined, a quoted argument spanning lines kept whole, comments after a
    command kept (bash ignores them)."""
    commands = []
    for block in BASH_BLOCK.findall(_read(README)):
        pending = ""
        for line in block.replace("\\\n", " ").splitlines():
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            pending = pending + "\n" + line if pending else line.strip()
            try:
                shlex.split(pending, comments=True)
            except ValueError:  # an open quote: the argument goes on on the next line
                continue
            commands.append(pending)
            pending = ""
        assert not pending, "unterminated command in the README: %r" % pending
    return commands


def _not_run_reason(command):
    return next((why for start, why in README_NOT_RUN.items() if " ".join(command.split()).startswith(start)), None)


def test_readme_commands(tmp_path):
    copy = _clean_copy(tmp_path / "checkout")
    terminal = Terminal(copy, _clean_env(str(tmp_path)))
    commands = readme_commands()
    to_run = [c for c in commands if _not_run_reason(c) is None]
    gone = [start for start in README_NOT_RUN if not any(" ".join(c.split()).startswith(start) for c in commands)]
    assert not gone, "README commands listed as not run are gone: %s" % gone
    gitops = os.path.join(copy, "gitops-out")

    # make deploy-eagle3: `setup`, then exactly the ansible-playbook command, as the README's comment says.
    main = next(c for c in to_run if c.startswith("make deploy-eagle3"))
    makefile = _read(os.path.join(copy, "Makefile"))
    target = re.search(r"^deploy-eagle3:(.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert target and target.group(1).split() == ["setup"], "Makefile deploy-eagle3 no longer depends on setup alone"
    assert [line.strip() for line in target.group(2).splitlines()] == ["ansible-playbook playbooks/deploy-eagle3.yml"]
    assert main.split("#", 1)[1].split("then:", 1)[1].strip() == "ansible-playbook playbooks/deploy-eagle3.yml"
    output = terminal.run(main)
    _wrote_line(output, gitops, ["models-llama-eagle3.yaml", "kustomization.yaml"])
    assert sorted(os.listdir(gitops)) == ["kustomization.yaml", "models-llama-eagle3.yaml"]
    for name in os.listdir(gitops):
        assert _read(os.path.join(gitops, name)) == _read(os.path.join(GOLDEN, name)), "%s differs from the golden file" % name
    assert os.path.islink(os.path.join(copy, ".build", "collections", "ansible_collections", "alauda", "spec_decoding"))

    # The README's way to put the virtualenv on PATH, then the Deploy and LLMInferenceService blocks.
    activate = "source .venv/bin/activate"
    assert "`%s`" % activate in _read(README) and "`export PATH=$PWD/.venv/bin:$PATH`" in _read(README)
    assert os.path.realpath(terminal.run(activate + "\ncommand -v ansible-playbook").split()[-1]) == \
        os.path.realpath(os.path.join(copy, ".venv", "bin", "ansible-playbook"))
    checks = {
        "ansible-playbook playbooks/deploy-eagle3.yml": ("models-llama-eagle3.yaml", "v1beta1"),
        "ansible-playbook playbooks/deploy-ngram.yml": ("models-llama-ngram.yaml", "v1beta1"),
        "ansible-playbook playbooks/deploy-draft-model.yml": ("models-llama-draft-model.yaml", "v1beta1"),
        "ansible-playbook playbooks/deploy-eagle3.yml -e spec_decoding_resource_kind=LLMInferenceService":
            ("models-llama-eagle3.llmisvc.yaml", "v1alpha2"),
    }
    assert sorted(to_run) == sorted([main] + list(checks)), "README commands not checked here: %s" % (set(to_run) - set(checks) - {main})
    for command in to_run:
        if command == main:
            continue
        filename, version = checks[command]
        output = terminal.run(command)
        manifest = _load(os.path.join(gitops, filename))
        assert manifest["apiVersion"].endswith("/" + version) and manifest["metadata"]["namespace"] == "models"
        assert filename in _load(os.path.join(gitops, "kustomization.yaml"))["resources"]
        _wrote_line(output, gitops, [filename, "kustomization.yaml"])
        if command == "ansible-playbook playbooks/deploy-eagle3.yml":  # the rerun of make deploy-eagle3 changes nothing
            assert re.search(r"llama\s*:\s*ok=\d+\s+changed=0\s", output), output[-1500:]
    assert _load(os.path.join(gitops, "kustomization.yaml"))["resources"] == sorted(checks[c][0] for c in checks)


def guide_blocks():
    """(first line, block) of every bash block of the guide, in order."""
    return [(block.splitlines()[0], block) for block in BASH_BLOCK.findall(_read(GUIDE))]


def test_first_inventory_guide_commands(tmp_path):
    copy = _clean_copy(tmp_path / "checkout")
    terminal = Terminal(copy, _clean_env(str(tmp_path)))
    gitops = os.path.join(copy, "gitops-first")
    rendered = os.path.join(gitops, "models-llama-eagle3.yaml")
    blocks = guide_blocks()
    not_run = [first for first, _b in blocks if first.startswith("# needs:")]
    assert sorted(not_run) == sorted(GUIDE_NOT_RUN), "blocks marked as needing something the test does not know: %s" % not_run
    ran = []

    def storage(expected_uri_key, expected):
        """storageUris sit on the predictor, a storageUri on its model."""
        manifest = _load(rendered)
        predictor = manifest["spec"]["predictor"]
        holder = predictor if expected_uri_key == "storageUris" else predictor["model"]
        assert holder.get(expected_uri_key) == expected, predictor
        assert "storageUri" not in predictor["model"] if expected_uri_key == "storageUris" else "storageUris" not in predictor
        # the inventory's annotation and label, next to the collection's own
        assert manifest["metadata"]["annotations"] == {"serving.kserve.io/deploymentMode": "Standard", "example.com/owner": "search-team"}
        assert manifest["metadata"]["labels"] == {"aml.cpaas.io/runtime-type": "vllm", "team": "search"}
        assert predictor["model"]["runtime"] == "aml-vllm-0.32.0"
        return manifest

    for first, block in blocks:
        if first in GUIDE_NOT_RUN:
            continue
        output = terminal.run(block)
        ran.append(first)
        if "make setup" in block:
            assert os.path.realpath(output.split()[-1]) == os.path.realpath(os.path.join(copy, ".venv", "bin", "ansible-playbook"))
            assert os.path.islink(os.path.join(copy, ".build", "collections", "ansible_collections", "alauda", "spec_decoding"))
        elif "cat > inventories/first/hosts.yml" in block:
            assert sorted(os.listdir(os.path.join(copy, "inventories", "first"))) == ["group_vars", "host_vars", "hosts.yml"]
        elif "ansible-doc -t role alauda.spec_decoding.inference_service" in block:
            for name in ("ENTRY POINT: main", "inference_service_annotations", "inference_service_labels", "inference_service_runtime",
                         "inference_service_kserve_version", "inference_service_oci_model_mode", "inference_service_artifacts"):
                assert name in output, name
        elif "artifact_mode: storage_uris" in block:
            manifest = storage("storageUris", [{"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "mountPath": "/mnt/models/target"},
                                               {"uri": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "mountPath": "/mnt/models/draft"}])
            assert _model_arg(manifest) == "/mnt/models/target"
            assert '"model":"/mnt/models/draft"' in manifest["spec"]["predictor"]["model"]["command"][2]
            _wrote_line(output, gitops, ["models-llama-eagle3.yaml", "kustomization.yaml"])
        elif "artifact_mode: modelcar" in block:
            manifest = storage("storageUri", "oci://registry.internal.example:5000/models/llama31-8b-eagle3:v1")
            assert _model_arg(manifest) == "/mnt/models/target"
            _wrote_line(output, gitops, ["models-llama-eagle3.yaml", "kustomization.yaml"])
        elif "artifact_mode: pvc" in block:
            manifest = storage("storageUri", "pvc://model-store/")
            assert _model_arg(manifest) == "/mnt/models/Meta-Llama-3.1-8B-Instruct"
            _wrote_line(output, gitops, ["models-llama-eagle3.yaml", "kustomization.yaml"])
            # `cat gitops-first/kustomization.yaml`: the one manifest, whichever option rendered it last
            assert "kind: Kustomization\nresources:\n- models-llama-eagle3.yaml\n" in output
            assert sorted(os.listdir(gitops)) == ["kustomization.yaml", "models-llama-eagle3.yaml"]
        else:
            raise AssertionError("a guide block this test runs but does not check: %s" % first)
    assert len(ran) == len(blocks) - len(GUIDE_NOT_RUN) == 6, ran
