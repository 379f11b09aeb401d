# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Find every file of a repository directory that gives a serving object (InferenceService, LLMInferenceService,
ServingRuntime) its speculative-decoding flags, and strip them there with the live rollback's own command-line editor
(vllm/command_edit.strip_checked), so that what the owner (Argo CD, Flux) builds from the directory no longer has them.

Where the flag can be:
- a plain manifest (multi-document YAML): the object matched by kind, metadata.name and namespace (a document without
  a namespace is in the owner's destination namespace, ``default_namespace``);
- a kustomize tree: kustomization.yaml ``resources`` / ``bases`` / ``components`` (local directories and files,
  followed), ``patches`` (a file or an inline ``patch:``, strategic-merge or JSON 6902 by content, with ``target``),
  ``patchesStrategicMerge`` and ``patchesJson6902``; ``namespace``, ``namePrefix`` and ``nameSuffix`` are applied to the
  resources as kustomize does. A JSON 6902 op that adds the flag to a command/args list is removed (with the op that adds
  its value), a replace of the whole list is edited;
- the collection's own render (roles/inference_service/tasks/gitops.yml: one manifest per object and a kustomization.yaml
  listing them), which is the two cases above;
- a Helm chart (Chart.yaml in the directory or above it, or an owner that is Helm): refused, naming the chart and the
  values key whose string holds the flag.
Edits keep every other byte of the file (gitops/yaml_roundtrip.py). Each edited file comes back with its unified diff
and what was removed.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import difflib
import os
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import yaml_roundtrip as rt
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc.model import ADDITIONAL_ARGS_ENV
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit, command_line

KINDS = ("InferenceService", "LLMInferenceService", "ServingRuntime")
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
_YAML_SUFFIXES = (".yaml", ".yml", ".json")
_REMOTE_RE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|git@|github\.com/|gitlab\.com/|bitbucket\.org/)|\?ref=|//")


class _Search:
    """What the walk saw: the files read, the object's definitions found, the remote resources not followed, the edits."""

    def __init__(self, root, kind, name, namespace, default_namespace):
        self.root = root
        self.kind, self.name, self.namespace = kind, name, namespace
        self.default_namespace = default_namespace or namespace
        self.read = []
        self.defined_in = []
        self.remote = []
        self.edits = {}  # rel path -> {"file", "before", "after", "removed": [...], "exact"}
        self.visited = set()
        # None: strip the flags (the rollback). Else document_edit(node, kind, where) edits one definition of the object
        # (kind manifest / patch: its spec mapping; json6902: its op list) and returns what it changed (gitops/canary_edit.py).
        self.document_edit = None

    def rel(self, path):
        return os.path.relpath(path, self.root).replace(os.sep, "/")


# -- the flag in one container-like mapping ------------------------------------------------------------------------------------


def _plain(value):
    """A ruamel.yaml node as plain Python (lists, dicts, str)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _removed(items, env, where):
    return [{"field": where, "flag": o.flag, "value": o.raw} for o in command_line.find_occurrences(items, env)]


def _strip_list(seq, env, where, drop_empty_from=None, key=None):
    """Strip the flags from a command/args sequence in place; returns what was removed ([] when nothing)."""
    if not isinstance(seq, list) or not all(isinstance(i, str) for i in seq):
        return []
    old = [str(i) for i in seq]
    removed = _removed(old, env, where)
    if not removed:
        return []
    new = command_edit.strip_checked(old, env, field=where)
    if not new and drop_empty_from is not None:
        # an emptied list in a strategic-merge patch would replace the base's list with nothing: drop the key instead
        del drop_empty_from[key]
    else:
        rt.apply_list(seq, new)
    return removed


def _strip_containers(node, where="", drop_empty=False):
    """Strip the flags from every container-like mapping under ``node`` (its command, args and the
    VLLM_ADDITIONAL_ARGS env value of KServe's LLMInferenceService presets). Returns what was removed."""
    removed = []
    if isinstance(node, list):
        for i, item in enumerate(node):
            label = item.get("name") if isinstance(item, dict) and isinstance(item.get("name"), str) else str(i)
            removed += _strip_containers(item, "%s[%s]" % (where, label), drop_empty)
        return removed
    if not isinstance(node, dict):
        return removed
    env_list = node.get("env") if isinstance(node.get("env"), list) else None
    env = command_line.container_env(_plain(env_list)) if env_list is not None else None
    for field in ("command", "args"):
        if isinstance(node.get(field), list):
            removed += _strip_list(node[field], env, "%s.%s" % (where, field) if where else field,
                                   drop_empty_from=node if drop_empty else None, key=field)
    for item in env_list or []:
        if isinstance(item, dict) and item.get("name") == ADDITIONAL_ARGS_ENV and isinstance(item.get("value"), str):
            found = command_line.script_occurrences(item["value"])
            if found:
                removed += [{"field": "%s.env[%s]" % (where, ADDITIONAL_ARGS_ENV), "flag": o.flag, "value": o.raw} for o in found]
                # an empty value would not override a preset's (KServe's merge): one space, which the script expands to nothing
                item["value"] = rt.same_style(item["value"], command_edit.strip_script(item["value"]) or " ")
    for key, value in node.items():
        if key not in ("command", "args", "env") and isinstance(value, (dict, list)):
            removed += _strip_containers(value, "%s.%s" % (where, key) if where else str(key), drop_empty)
    return removed


# -- matching ------------------------------------------------------------------------------------------------------------------


def _matches(doc, search, names, namespace_override, patch=False):
    if not isinstance(doc, dict) or doc.get("kind") != search.kind:
        return False
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    if meta.get("name") not in names:
        return False
    if search.kind == "ClusterServingRuntime":  # pragma: no cover - cluster-scoped
        return True
    namespace = namespace_override or meta.get("namespace") or (None if patch else search.default_namespace)
    return namespace is None or namespace == search.namespace or (patch and meta.get("namespace") in (None, search.namespace))


def _target_matches(target, search, names):
    if not isinstance(target, dict):
        return True  # a patch without a target applies to what its own metadata names
    if target.get("kind") not in (None, search.kind):
        return False
    name = target.get("name")
    if name is not None and not any(re.fullmatch(str(name), n) for n in names):
        return False
    return target.get("namespace") in (None, search.namespace)


# -- files ---------------------------------------------------------------------------------------------------------------------


def _edit_file(search, path, edit_document, what):
    """Edit one YAML file with ``edit_document(tree, index) -> removed list``; records the edit."""
    rel = search.rel(path)
    with open(path, "r", encoding="utf-8") as handle:
        before = handle.read()
    search.read.append(rel)
    try:
        after, results, exact = rt.edit_text(before, edit_document)
    except rt.YAMLError as exc:
        raise ValidationError("%s is not valid YAML: %s" % (rel, str(exc).splitlines()[0] if str(exc) else exc), field="path",
                              hint="fix the file in the repository, or point path at the directory the owner applies") from None
    if not results or after == before:
        return
    removed = [item for result in results for item in result]
    entry = search.edits.setdefault(rel, {"file": rel, "before": before, "after": before, "removed": [], "exact": True, "what": what})
    entry["after"], entry["exact"] = after, entry["exact"] and exact
    entry["removed"] += [dict(item, file=rel) for item in removed]
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write(after)


def _manifest(search, path, names, namespace_override):
    def edit(tree, _index):
        if not _matches(tree, search, names, namespace_override):
            return None
        search.defined_in.append(search.rel(path))
        if search.document_edit is not None:
            return search.document_edit(tree.get("spec"), "manifest", search.rel(path)) or None
        return _strip_containers(tree.get("spec"), "spec") or None
    _edit_file(search, path, edit, "manifest")


def _json6902(ops, where):
    """Strip the flags a JSON 6902 op list adds; returns what was removed. Ops that add single words to the same
    command/args list are read together, in order, as the words they add."""
    removed = []
    if not isinstance(ops, list):
        return removed
    groups = {}
    for position, op in enumerate(ops):
        if not isinstance(op, dict) or op.get("op") not in ("add", "replace") or not isinstance(op.get("path"), str):
            continue
        path, value = op["path"], op.get("value")
        field = "%s %s %s" % (where, op["op"], path)
        match = re.search(r"/(command|args)(?:/(\d+|-))?$", path)
        if match and match.group(2) is not None and isinstance(value, str):
            groups.setdefault(path[:match.start(2) - 1], []).append(position)
        elif match and isinstance(value, list):
            removed += _strip_list(value, None, field)
        elif isinstance(value, (dict, list)):
            removed += _strip_containers(value, field)
    drop = []
    for list_path, positions in groups.items():
        words = [str(ops[p]["value"]) for p in positions]
        found = _removed(words, None, "%s %s" % (where, list_path))
        if not found:
            continue
        new = command_edit.strip_checked(words, None, field="%s %s" % (where, list_path))
        kept = [positions[k] for k in rt._pair(words, new)] if new else []  # pylint: disable=protected-access
        for position, word in zip(kept, new):
            if ops[position]["value"] != word:
                ops[position]["value"] = rt.same_style(ops[position]["value"], word)
        drop += [p for p in positions if p not in kept]
        removed += found
    for position in sorted(drop, reverse=True):
        rt.delete_item(ops, position)
    return removed


def _patch_content(search, tree, names, where):
    """Strip the flags of one patch document (strategic merge or a JSON 6902 op list, told apart by content)."""
    if isinstance(tree, list):
        if search.document_edit is not None:
            return search.document_edit(tree, "json6902", where) or []
        return _json6902(tree, where)
    if _matches(tree, search, names, None, patch=True) or (isinstance(tree, dict) and tree.get("kind") is None):
        search.defined_in.append(where)
        if search.document_edit is not None:
            return search.document_edit(tree.get("spec"), "patch", where) or []
        return _strip_containers(tree.get("spec"), "spec", drop_empty=True)
    return []


def _patch_file(search, path, names):
    def edit(tree, _index):
        return _patch_content(search, tree, names, search.rel(path)) or None
    _edit_file(search, path, edit, "patch")


def _inline_patch(holder, key, search, names, where):
    """An inline patch string: edited as YAML inside the string; the string keeps its style."""
    text = holder[key]
    collected = []

    def edit(tree, _index):
        found = _patch_content(search, tree, names, where)
        collected.extend(found)
        return found or None
    after, _results, _exact = rt.edit_text(str(text), edit)
    if collected:
        holder[key] = rt.same_style(text, after)
    return collected


def _local(search, base, entry):
    if not isinstance(entry, str) or _REMOTE_RE.search(entry):
        if isinstance(entry, str):
            search.remote.append(entry)
        return None
    path = os.path.normpath(os.path.join(base, entry))
    if path != search.root and not path.startswith(search.root + os.sep):
        raise ValidationError("%s refers to %s, outside the repository" % (search.rel(base), entry), field="path",
                              hint="the Git rollback edits only this repository; move the files into it")
    return path


def _kustomization_file(directory):
    return next((os.path.join(directory, n) for n in KUSTOMIZATION_FILES if os.path.isfile(os.path.join(directory, n))), None)


def _walk(search, directory, names, namespace_override):
    """Follow a directory: its kustomization, or every YAML file under it."""
    key = os.path.realpath(directory)
    if key in search.visited:
        return
    search.visited.add(key)
    kfile = _kustomization_file(directory)
    if kfile is None:
        for dirpath, dirnames, filenames in os.walk(directory):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for filename in sorted(filenames):
                if filename.endswith(_YAML_SUFFIXES):
                    _manifest(search, os.path.join(dirpath, filename), names, namespace_override)
        return
    _kustomization(search, directory, kfile, names, namespace_override)


def _kustomization(search, directory, kfile, names, namespace_override):
    with open(kfile, "r", encoding="utf-8") as handle:
        try:
            kust = rt.load(handle.read()) or {}
        except rt.YAMLError as exc:
            raise ValidationError("%s is not valid YAML: %s" % (search.rel(kfile), exc), field="path", hint="fix the kustomization") from None
    search.read.append(search.rel(kfile))
    # kustomize applies an overlay's namespace and name prefix/suffix to everything below it
    namespace = namespace_override or kust.get("namespace")
    inner = [n[len(kust.get("namePrefix") or ""):] for n in names if n.startswith(kust.get("namePrefix") or "")]
    inner = [n[:len(n) - len(kust.get("nameSuffix") or "")] if kust.get("nameSuffix") and n.endswith(kust["nameSuffix"]) else n
             for n in inner] if kust.get("nameSuffix") else inner
    names_here = set(names) | set(inner)
    for key in ("resources", "bases", "components"):
        for entry in kust.get(key) or []:
            path = _local(search, directory, entry)
            if path is None:
                continue
            if os.path.isdir(path):
                _walk(search, path, names_here, namespace)
            elif os.path.isfile(path):
                _manifest(search, path, names_here, namespace)
    inline = []
    # `patches` and the older `patchesJson6902` are both {target, patch | path}; `patchesStrategicMerge` a list of paths
    # or inline documents.
    for key in ("patches", "patchesJson6902"):
        for i, patch in enumerate(kust.get(key) or []):
            if not isinstance(patch, dict) or not _target_matches(patch.get("target"), search, names_here):
                continue
            if isinstance(patch.get("patch"), str):
                inline.append((key, i, "patch"))
            elif isinstance(patch.get("path"), str):
                path = _local(search, directory, patch["path"])
                if path and os.path.isfile(path):
                    _patch_file(search, path, names_here)
    for i, patch in enumerate(kust.get("patchesStrategicMerge") or []):
        path = _local(search, directory, patch) if isinstance(patch, str) and "\n" not in patch else None
        if path and os.path.isfile(path):
            _patch_file(search, path, names_here)
        elif isinstance(patch, str) and "\n" in patch:
            inline.append(("patchesStrategicMerge", i, None))
    if inline:
        def edit(tree, _index):
            found = []
            for list_key, i, item_key in inline:
                holder, key = (tree[list_key][i], item_key) if item_key else (tree[list_key], i)
                found += _inline_patch(holder, key, search, names_here, "%s %s[%d]" % (search.rel(kfile), list_key, i))
            return found or None
        _edit_file(search, kfile, edit, "inline patch")


# -- Helm ----------------------------------------------------------------------------------------------------------------------


def _chart_dir(root, directory):
    """The directory holding Chart.yaml: the path itself, one above it, or one below it."""
    here = directory
    while True:
        if os.path.isfile(os.path.join(here, "Chart.yaml")):
            return here
        if here == root or not here.startswith(root):
            break
        here = os.path.dirname(here)
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if "Chart.yaml" in filenames:
            return dirpath
    return None


def _values_with_flag(node, prefix=""):
    """Dotted keys of the values whose string holds a speculative flag (or whose key names the speculative config)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            dotted = "%s.%s" % (prefix, key) if prefix else str(key)
            if re.search(r"speculative", str(key), re.I) and not isinstance(value, (dict, list)):
                found.append(dotted)
            else:
                found += _values_with_flag(value, dotted)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _values_with_flag(value, "%s[%d]" % (prefix, i))
    elif isinstance(node, str) and (command_line.find_occurrences([node]) or command_line.script_occurrences(node)):
        found.append(prefix)
    return found


def _refuse_helm(search, chart_dir, why):
    chart = "?"
    try:
        with open(os.path.join(chart_dir, "Chart.yaml"), "r", encoding="utf-8") as handle:
            chart = (rt.load(handle.read()) or {}).get("name") or "?"
    except (OSError, rt.YAMLError):
        pass
    keys = []
    for filename in sorted(os.listdir(chart_dir)):
        if re.fullmatch(r"values.*\.ya?ml", filename):
            with open(os.path.join(chart_dir, filename), "r", encoding="utf-8") as handle:
                try:
                    keys += ["%s: %s" % (search.rel(os.path.join(chart_dir, filename)), k) for k in _values_with_flag(rt.load(handle.read()))]
                except rt.YAMLError:
                    continue
    where = ("the values holding the flag: %s" % "; ".join(keys)) if keys else "no values file of the chart holds the flag literally"
    raise ValidationError(
        "%s %s/%s is rendered by the Helm chart %r at %s (%s): a Git rollback edits manifests, not chart values (%s)" % (
            search.kind, search.namespace, search.name, chart, search.rel(chart_dir), why, where),
        field="path",
        hint="remove --speculative-config from the value in the chart's values (or the HelmRelease's spec.values / the Helm "
             "release's values) and let the owner sync it, or use rollback_mode: emergency")


# -- entry point ---------------------------------------------------------------------------------------------------------------


def strip_in_directory(root, path, kind, name, namespace, default_namespace=None, owner_kind=None):
    """Strip the object's speculative flags in every file under ``root``/``path`` that defines them (files are
    rewritten in place). Returns ``{"files": [{file, diff, removed, exact}], "removed": [...], "defined_in": [...],
    "searched": [...]}``; ``files`` is empty when the object is found and carries no flag (already rolled back).
    Refuses a Helm chart, and an object that no file under the path defines."""
    return edit_in_directory(root, path, kind, name, namespace, default_namespace=default_namespace, owner_kind=owner_kind)


def edit_in_directory(root, path, kind, name, namespace, default_namespace=None, owner_kind=None, document_edit=None,
                      path_option="rollback_git_path"):
    """``strip_in_directory`` with another edit of each definition of the object: ``document_edit(node, kind, where)``
    (see ``_Search.document_edit``; None strips the flags). ``path_option`` is the variable the not-found hint names."""
    if kind not in KINDS:
        raise ValidationError("%r is not a serving kind the Git rollback edits" % kind, field="kind", hint="use one of %s" % ", ".join(KINDS))
    root = os.path.realpath(root)
    directory = os.path.normpath(os.path.join(root, path or "."))
    rel_path = os.path.relpath(directory, root)
    if not os.path.isdir(directory):
        raise ValidationError("%r is not a directory of the repository" % (path or "."), field="path",
                              hint="give the directory the owner applies (%s; the Application's spec.source.path, "
                                   "the Kustomization's spec.path)" % path_option)
    search = _Search(root, kind, name, namespace, default_namespace)
    search.document_edit = document_edit
    chart_dir = _chart_dir(root, directory)
    if owner_kind == "helm" or (chart_dir and _kustomization_file(directory) is None):
        if chart_dir is None:
            raise ValidationError("%s %s/%s is managed by Helm and no Chart.yaml is under %r" % (kind, namespace, name, rel_path),
                                  field="path", hint="change the flag in the chart's values (or the HelmRelease's spec.values), "
                                                     "or use rollback_mode: emergency")
        _refuse_helm(search, chart_dir, "owner Helm" if owner_kind == "helm" else "Chart.yaml in the path")
    _walk(search, directory, {name}, None)
    if not search.defined_in:
        remote = (" (remote resources not followed: %s)" % ", ".join(search.remote)) if search.remote else ""
        read = ", ".join(search.read[:12]) or "no YAML file"
        raise ValidationError(
            "no file under %r defines %s %s/%s (read: %s)%s" % (rel_path, kind, namespace, name, read, remote),
            field="path", hint="give the directory the owner applies to this object (%s / path: the Application's "
                               "spec.source.path, the Kustomization's spec.path), or check the object's name and namespace" % path_option)
    files = []
    for rel, entry in sorted(search.edits.items()):
        diff = "".join(difflib.unified_diff(entry["before"].splitlines(keepends=True), entry["after"].splitlines(keepends=True),
                                            fromfile="a/" + rel, tofile="b/" + rel))
        files.append({"file": rel, "diff": diff, "removed": entry["removed"], "exact": entry["exact"], "kind": entry["what"]})
    return {"files": files, "removed": [item for f in files for item in f["removed"]], "defined_in": sorted(set(search.defined_in)),
            "searched": search.read, "remote_resources": search.remote}


def removed_summary(removed):
    """``--speculative-config {...}`` (the first value removed) for a commit message and a result."""
    for item in removed:
        if item.get("flag") == "--speculative-config" and item.get("value"):
            return "--speculative-config %s" % item["value"]
    return ", ".join(sorted({"%s%s" % (i["flag"], (" " + i["value"]) if i.get("value") else "") for i in removed})) or "nothing"
