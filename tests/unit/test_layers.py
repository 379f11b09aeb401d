"""The districts of plugins/module_utils/ and their layer rule (docs/DEVELOPING.md "Districts and layers").

Every import of every file under plugins/ is read (ast, also imports inside functions) and checked:
- a district imports only from itself and from the districts below it
  (errors < kube < vllm < artifacts < kserve < gitops < bench < ops < modules, filters and other plugins);
- a relative import (the stager package's, which runs as a zip application outside the collection) is read as the
  module it names and checked like any other;
- the ``kubernetes`` client package is imported in module_utils/kube/ only (kube/client.py hands it to the rest);
- a module_utils file stays under MAX_LINES lines, unless BIG_FILES says why not.
An exception to the first rule is named in UPWARD_IMPORTS with its reason, and the test fails when one is no longer needed.
"""

from __future__ import annotations

import ast
import os

from tests.paths import REPO

PLUGINS = os.path.join(REPO, "plugins")
MODULE_UTILS = os.path.join(PLUGINS, "module_utils")
PREFIX = "ansible_collections.alauda.spec_decoding.plugins."

# Bottom to top. A district imports only from itself and from the districts before it in this list. artifacts/ imports
# only errors; kserve/ checks a Modelcar image reference with artifacts.registry.ImageRef, so artifacts sits below it.
# gitops/ reads the owner through kube/, edits the flag in Git with vllm/'s command-line editor and finds the object's
# containers with kserve/'s readers; ops/ acts through it.
LAYERS = ("errors", "kube", "vllm", "artifacts", "kserve", "gitops", "bench", "ops")
TOP = len(LAYERS)  # modules, filters, doc fragments and any other plugin: above every district

MAX_LINES = 600

# module_utils files allowed over MAX_LINES, and why. Split a file instead of adding it here when it has two concerns.
BIG_FILES = {
    # Generated data, not code: one table of --speculative-config facts per vLLM release (hack/vllm_speculative_tables.py
    # writes it from each release's source); a release per file would only spread one dict literal over 25 files.
    "vllm/speculative_releases.py": "generated data: one table per vLLM release",
    # Generated data, not code: the x-kubernetes-validations rules of KServe's CRDs per release (hack/kserve_crd_rules.py
    # writes them from the release's config/crd/full/), JSON text in 140-column pieces.
    "kserve/crd_rules_releases.py": "generated data: the CRD rules per KServe release",
}

# Imports that run up a layer, (importing file, imported module) -> why. Each is a known debt, not a pattern.
UPWARD_IMPORTS = {}


def _rel(path):
    return os.path.relpath(path, PLUGINS).replace(os.sep, "/")


def _plugin_files():
    for dirpath, dirnames, filenames in os.walk(PLUGINS):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def district_of(rel):
    """``module_utils/kube/pods.py`` -> ``kube``; ``modules/x.py`` -> None (above every district)."""
    parts = rel.split("/")
    if parts[0] != "module_utils":
        return None
    head = parts[1][:-3] if parts[1].endswith(".py") else parts[1]
    return head


def rank(district):
    return TOP if district is None else LAYERS.index(district)


def _absolute(rel, level, module):
    """The dotted name a relative ``from <level dots><module> import`` in ``rel`` (a plugins/-relative file) reaches, or
    None when it climbs out of plugins/."""
    package = rel.split("/")[:-1]
    if not package or package[0] == ".." or level > len(package):
        return None
    base = package[:len(package) - level + 1]
    return PREFIX + ".".join(base + ([module] if module else []))


def imports(path, rel=None):
    """``[(line, imported dotted name)]`` of one file; ``from X import Y`` gives ``X.Y`` (Y may be a module or a name). A
    relative import gives the absolute name it reaches from ``rel`` (the file's plugins/-relative path, by default where it
    is), its dots and name unchanged when it climbs out of plugins/."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module
            if node.level:
                module = _absolute(rel or _rel(path), node.level, node.module)
                if module is None:
                    out.append((node.lineno, "." * node.level + (node.module or "")))
                    continue
            out.extend((node.lineno, "%s.%s" % (module, alias.name)) for alias in node.names)
    return out


def imported_district(dotted):
    """The district a dotted import reaches (``...module_utils.kube.pods.x`` -> ``kube``), TOP for plugins outside
    module_utils, or False when the import is not of this collection."""
    if not dotted.startswith(PREFIX):
        return False
    parts = dotted[len(PREFIX):].split(".")
    if parts[0] != "module_utils":
        return None
    return parts[1] if len(parts) > 1 else None


def _module_of(dotted):
    """``...module_utils.kube.pods.readiness`` -> ``kube.pods`` (the imported module under module_utils)."""
    parts = dotted[len(PREFIX):].split(".")[1:]
    for cut in range(len(parts), 0, -1):
        candidate = os.path.join(MODULE_UTILS, *parts[:cut])
        if os.path.isfile(candidate + ".py") or os.path.isdir(candidate):
            return ".".join(parts[:cut])
    return ".".join(parts)


FILES = [(_rel(p), p) for p in _plugin_files()]


def test_every_district_is_a_package_and_every_module_utils_file_is_in_a_district():
    for name in sorted(os.listdir(MODULE_UTILS)):
        full = os.path.join(MODULE_UTILS, name)
        if name == "__pycache__":
            continue
        if os.path.isdir(full):
            assert name in LAYERS, "plugins/module_utils/%s/ is no district: add it to LAYERS (and docs/DEVELOPING.md)" % name
            for dirpath, dirnames, _files in os.walk(full):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                assert os.path.isfile(os.path.join(dirpath, "__init__.py")), "%s has no __init__.py" % os.path.relpath(dirpath, REPO)
        else:
            assert name == "errors.py", ("plugins/module_utils/%s sits outside the districts: move it into the one it belongs to "
                                         "(docs/DEVELOPING.md, Districts and layers)" % name)


def layer_problems(rel, path):
    """What is wrong with the imports of one file (plugins/-relative ``rel``), one line per import."""
    here = district_of(rel)
    problems = []
    for line, dotted in imports(path, rel):
        if dotted.startswith("."):
            problems.append("%s:%d imports %s: a relative import out of plugins/ names no module of this collection" % (rel, line, dotted))
            continue
        if dotted == "kubernetes" or dotted.startswith("kubernetes."):
            if here != "kube":
                problems.append("%s:%d imports %s: the kubernetes client package is imported in module_utils/kube/ only "
                                "(take it from module_utils.kube.client)" % (rel, line, dotted))
            continue
        there = imported_district(dotted)
        if there is False:
            continue
        if there is None and here is not None:
            problems.append("%s:%d imports %s: module_utils never imports modules, filters or other plugins" % (rel, line, dotted))
            continue
        if there is None or here is None or there == here:
            continue
        if there not in LAYERS:
            problems.append("%s:%d imports %s: %s is no district (LAYERS)" % (rel, line, dotted, there))
        elif rank(there) > rank(here) and (rel[len("module_utils/"):], _module_of(dotted)) not in UPWARD_IMPORTS:
            problems.append("%s:%d imports %s: %s runs up a layer from %s (order: %s)"
                            % (rel, line, dotted, there, here, " < ".join(LAYERS)))
    return problems


def test_imports_follow_the_layers():
    problems = [problem for rel, path in FILES for problem in layer_problems(rel, path)]
    assert not problems, "imports against the layer rule (docs/DEVELOPING.md, Districts and layers):\n" + "\n".join(problems)


def test_the_exceptions_are_still_needed():
    """An allow-list entry whose import or size is gone is removed, so the lists say what is true."""
    seen = set()
    for rel, path in FILES:
        if rel.startswith("module_utils/"):
            for _line, dotted in imports(path):
                if dotted.startswith(PREFIX + "module_utils."):
                    seen.add((rel[len("module_utils/"):], _module_of(dotted)))
    for key in UPWARD_IMPORTS:
        assert key in seen, "UPWARD_IMPORTS lists %s -> %s, which is no longer imported: remove the entry" % key
    for rel in BIG_FILES:
        path = os.path.join(MODULE_UTILS, rel)
        assert os.path.isfile(path), "BIG_FILES lists %s, which does not exist: remove the entry" % rel
        with open(path, encoding="utf-8") as fh:
            lines = len(fh.readlines())
        assert lines > MAX_LINES, "BIG_FILES lists %s, now %d lines (at most %d): remove the entry" % (rel, lines, MAX_LINES)


def test_no_file_of_the_collection_is_a_link():
    """A symlink is an import no reader of the code sees (the stager Job's script once lived in roles/stage_pvc/files/ and
    was linked into module_utils/artifacts/): plugins/, roles/ and playbooks/ hold files, not links."""
    links = []
    for top in ("plugins", "roles", "playbooks"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(REPO, top)):
            links += [os.path.relpath(os.path.join(dirpath, name), REPO) for name in dirnames + filenames
                      if os.path.islink(os.path.join(dirpath, name))]
    assert not links, "links in the collection (move the file where it is used, or import it): %s" % links


def test_module_utils_files_stay_small():
    big = []
    for rel, path in FILES:
        if not rel.startswith("module_utils/"):
            continue
        with open(path, encoding="utf-8") as fh:
            lines = len(fh.readlines())
        if lines > MAX_LINES and rel[len("module_utils/"):] not in BIG_FILES:
            big.append("%s has %d lines (at most %d)" % (rel, lines, MAX_LINES))
    assert not big, ("split these by concern, or add them to BIG_FILES in tests/unit/test_layers.py with the reason:\n"
                     + "\n".join(big))


def test_the_rule_catches_an_upward_import_and_kubernetes_outside_kube(tmp_path):
    """The checker itself, on a file of the vllm district that imports ops/ and the kubernetes client, and a module that
    imports the kubernetes client: each import is reported with the file, the import and the rule."""
    bad = tmp_path / "bad.py"
    bad.write_text("from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary\n"
                   "from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods\n"
                   "def f():\n    from kubernetes.client import CoreV1Api\n")
    problems = layer_problems("module_utils/vllm/bad.py", str(bad))
    assert problems == [
        "module_utils/vllm/bad.py:1 imports ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.canary: ops runs up a "
        "layer from vllm (order: errors < kube < vllm < artifacts < kserve < gitops < bench < ops)",
        "module_utils/vllm/bad.py:4 imports kubernetes.client.CoreV1Api: the kubernetes client package is imported in "
        "module_utils/kube/ only (take it from module_utils.kube.client)",
    ]
    assert len(layer_problems("modules/bad.py", str(bad))) == 1  # a module may import any district, not kubernetes
    assert layer_problems("module_utils/kube/bad.py", str(bad))[0].endswith("ops runs up a layer from kube (order: %s)" % " < ".join(LAYERS))


def test_relative_imports_are_checked_as_the_modules_they_name(tmp_path):
    """The stager package imports relatively (it also runs as a zip application outside the collection): such an import
    is read as the module it reaches, so one that runs up a layer or climbs out of plugins/ is reported like any other,
    and the package's own (errors, its siblings) pass."""
    bad = tmp_path / "bad.py"
    bad.write_text("from ..ops import canary\nfrom .. import errors\nfrom ...... import elsewhere\n")
    assert layer_problems("module_utils/vllm/bad.py", str(bad)) == [
        "module_utils/vllm/bad.py:1 imports ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.canary: ops runs up a "
        "layer from vllm (order: errors < kube < vllm < artifacts < kserve < gitops < bench < ops)",
        "module_utils/vllm/bad.py:3 imports ......: a relative import out of plugins/ names no module of this collection",
    ]
    common = os.path.join(MODULE_UTILS, "artifacts", "artifact_sync", "common.py")
    assert (PREFIX + "module_utils.errors.ValidationError") in [dotted for _line, dotted in imports(common)]
    assert layer_problems("module_utils/artifacts/artifact_sync/common.py", common) == []
