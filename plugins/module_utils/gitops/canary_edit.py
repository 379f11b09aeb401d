# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The canary's steps made in the Git repository that Argo CD or Flux syncs (canary_rollout write_mode=git): the
InferenceService's ``spec.predictor.canaryTrafficPercent`` set or removed and its ``--speculative-config`` added or
stripped, in the files that define the object (found as the Git rollback finds them: gitops/manifest_edit.py), with
only the edited lines changed (gitops/yaml_roundtrip.py).

What a step asks for is an *intent* (ops/canary_git.git_intent makes it from the step's plan). Knative mode:
``{"canaryTrafficPercent": N}`` sets the share (``None`` removes the key) and ``{"speculative_config": "<json>"}`` sets
the flag (``None`` strips it, with the rollback's editor); a key left out is left as it is. Standard mode (KServe's
``spec.canary``): ``{"canary": {name, trafficPercent, make}}`` sets the entry's share, or adds the entry, whose predictor
``make`` builds from the predictor in Git (in a full manifest only: a kustomize patch holds part of the predictor);
``{"canary": None}`` removes ``spec.canary``; ``{"promote": {name, speculative_config}}`` gives the predictor the flag and
the canary's name and removes ``spec.canary``, which is what KServe's promotion makes of it. Where the object has several
definitions (a kustomize base and the patches of an overlay, applied in that order):

- the share is set where a definition already has it (every one that has it), else added to the last definition (a
  strategic-merge patch or the manifest gets the key first in ``spec.predictor``; a JSON 6902 patch gets a first ``add``
  op);
  removed from every definition;
- the flag is set in the last definition that has it, else in the last one whose predictor container has a
  ``command``/``args`` list (a strategic-merge patch replaces the list whole, so the last list is the one that runs);
  stripped from every definition.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import manifest_edit
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import yaml_roundtrip as rt
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit, command_line

PERCENT = "canaryTrafficPercent"
PERCENT_PATH = "/spec/predictor/" + PERCENT
FLAG = "speculative_config"
CANARY, PROMOTE = "canary", "promote"  # Standard mode: the spec.canary entry; the promotion
_LIST_PATH = re.compile(r"^/spec/predictor/(?:model|containers/0)/(command|args)$")


def _predictor(spec):
    return spec.get("predictor") if isinstance(spec, dict) and isinstance(spec.get("predictor"), dict) else None


def _container(predictor):
    """The vLLM container of a predictor mapping: ``model``, else ``containers[0]`` (as ops/canary reads it)."""
    if not isinstance(predictor, dict):
        return None
    if isinstance(predictor.get("model"), dict):
        return predictor["model"]
    containers = predictor.get("containers")
    if isinstance(containers, list) and containers and isinstance(containers[0], dict):
        return containers[0]
    return None


def _str_list(value):
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _lists(node, kind):
    """{field: sequence} of the predictor container's command/args string lists in one definition (JSON 6902: the ops
    that add or replace the whole list)."""
    if kind == "json6902":
        out = {}
        for op in node:
            match = _LIST_PATH.match(str(op.get("path"))) if isinstance(op, dict) and op.get("op") in ("add", "replace") else None
            if match and _str_list(op.get("value")):
                out[match.group(1)] = op["value"]
        return out
    container = _container(_predictor(node))
    return {field: container[field] for field in ("command", "args") if container is not None and _str_list(container.get(field))}


def _percent_ops(ops):
    return [i for i, op in enumerate(ops) if isinstance(op, dict) and op.get("path") == PERCENT_PATH and op.get("op") in ("add", "replace")]


def _canary_entries(node, kind, name):
    """Positions of the spec.canary entries named ``name`` in a manifest or strategic-merge patch."""
    entries = node.get(CANARY) if kind != "json6902" and isinstance(node, dict) and isinstance(node.get(CANARY), list) else []
    return [i for i, e in enumerate(entries) if isinstance(e, dict) and isinstance(e.get("predictor"), dict) and e["predictor"].get("name") == name]


def _survey(node, kind, where, name=None):
    """What one definition has: the share, a command/args list, the flag, a spec.canary entry named ``name``."""
    lists = _lists(node, kind)
    if kind == "json6902":
        has_percent = bool(_percent_ops(node))
    else:
        has_percent = PERCENT in (_predictor(node) or {})
    return {"kind": kind, "where": where, "percent": has_percent, "lists": bool(lists),
            "flag": any(command_line.find_occurrences([str(i) for i in seq]) for seq in lists.values()),
            "entry": bool(name and _canary_entries(node, kind, name)), "has_canary": kind != "json6902" and isinstance(node, dict) and CANARY in node}


def _set_percent(node, kind, value, where):
    if kind == "json6902":
        positions = _percent_ops(node)
        changed = [p for p in positions if node[p]["value"] != value]
        for position in changed:
            node[position]["value"] = value
        if not positions:
            # first in the list: the op list is the document's top level, and a new first item keeps the file's own
            # indentation (its lines go where the document starts)
            node.insert(0, {"op": "add", "path": PERCENT_PATH, "value": value})
        return [{"file": where, "field": PERCENT_PATH, "change": "set", "value": value}] if changed or not positions else []
    predictor = _predictor(node)
    if predictor is None:
        node["predictor"] = predictor = {}
    if predictor.get(PERCENT) == value:
        return []
    rt.set_key(predictor, PERCENT, value)
    return [{"file": where, "field": "spec.predictor." + PERCENT, "change": "set", "value": value}]


def _remove_percent(node, kind, where):
    if kind == "json6902":
        positions = _percent_ops(node)
        for position in reversed(positions):
            rt.delete_item(node, position)
        return [{"file": where, "field": PERCENT_PATH, "change": "removed", "value": None}] if positions else []
    predictor = _predictor(node)
    if predictor is None or PERCENT not in predictor:
        return []
    old = predictor[PERCENT]
    rt.delete_key(predictor, PERCENT)
    return [{"file": where, "field": "spec.predictor." + PERCENT, "change": "removed", "value": old}]


def _set_flag(node, kind, canonical_json, where):
    """``--speculative-config <canonical_json>`` in the definition's command/args, as the live canary sets it
    (vllm/command_edit.set_speculative_config_in: the value replaced where the flag is, else appended)."""
    lists = _lists(node, kind)
    plain = {field: [str(i) for i in seq] for field, seq in lists.items()}
    command, args = command_edit.set_speculative_config_in(plain.get("command"), plain.get("args"), canonical_json)
    changes = []
    for field, new in (("command", command), ("args", args)):
        if field in lists and new is not None and list(new) != plain[field]:
            rt.sync_list(lists[field], list(new))
            changes.append({"file": where, "field": field, "flag": "--speculative-config", "change": "set", "value": canonical_json})
    return changes


def _strip_flag(node, kind, where):
    if kind == "json6902":
        removed = manifest_edit._json6902(node, where)  # pylint: disable=protected-access  # the rollback's own strip
    else:
        removed = manifest_edit._strip_containers(node, "spec", drop_empty=kind == "patch")  # pylint: disable=protected-access
    return [dict(item, file=where, change="removed") for item in removed]


def _set_entry(node, want, where):
    """Standard mode: the spec.canary entry named ``want["name"]`` on ``want["trafficPercent"]``; a new entry's predictor
    is ``want["make"]`` of this manifest's predictor (as plain data; ruamel.yaml writes it in block style)."""
    positions = _canary_entries(node, "manifest", want["name"])
    if positions:
        entry = node[CANARY][positions[0]]
        if entry.get("trafficPercent") == want["trafficPercent"]:
            return []
        rt.set_key(entry, "trafficPercent", want["trafficPercent"])
        return [{"file": where, "field": "spec.canary[%s].trafficPercent" % want["name"], "change": "set", "value": want["trafficPercent"]}]
    predictor = manifest_edit._plain(_predictor(node))  # pylint: disable=protected-access
    new = {"trafficPercent": want["trafficPercent"], "predictor": want["make"](predictor)}
    if isinstance(node.get(CANARY), list):
        node[CANARY].append(new)
    else:
        node[CANARY] = [new]
    return [{"file": where, "field": "spec.canary", "change": "set", "value": "entry %s on %s%%" % (want["name"], want["trafficPercent"])}]


def _remove_canary(node, kind, where):
    if kind == "json6902":
        positions = [i for i, op in enumerate(node) if isinstance(op, dict) and str(op.get("path")).startswith("/spec/canary")]
        for position in reversed(positions):
            rt.delete_item(node, position)
        return [{"file": where, "field": "/spec/canary", "change": "removed", "value": None}] if positions else []
    if not isinstance(node, dict) or CANARY not in node:
        return []
    rt.delete_key(node, CANARY)
    return [{"file": where, "field": "spec.canary", "change": "removed", "value": None}]


def _promote(node, kind, want, where):
    """The predictor with the flag and the canary's name (KServe keeps that Deployment), spec.canary gone."""
    changes = _set_flag(node, kind, want[FLAG], where) if want.get(FLAG) else []
    predictor = _predictor(node)
    if predictor is not None and predictor.get("name") != want["name"]:
        rt.set_key(predictor, "name", want["name"])
        changes.append({"file": where, "field": "spec.predictor.name", "change": "set", "value": want["name"]})
    return changes


def _choose_standard(surveys, intent, rel_path):
    """Standard mode: (definitions whose spec.canary entry gets the share, the one a new entry goes into, the one the
    promotion gives the flag)."""
    want = intent.get(CANARY)
    entry_at, add_at, promote_at = {i for i, s in enumerate(surveys) if s["entry"]}, None, None
    with_lists = [i for i, s in enumerate(surveys) if s["flag"] or s["lists"]]
    if want and not entry_at:
        full = [i for i in with_lists if surveys[i]["kind"] == "manifest"]
        if not full or full[-1] != (with_lists or [None])[-1]:
            raise ValidationError(
                "the canary's spec.canary entry needs the whole predictor, and under %r it is built by kustomize from a base and "
                "patches (read: %s)" % (rel_path, ", ".join(s["where"] for s in surveys)), field="canary_mode",
                hint="add the spec.canary entry to the overlay by hand (the predictor plus --speculative-config and name), or run "
                     "the InferenceService in Knative mode, whose canary is canaryTrafficPercent on the predictor")
        add_at = full[-1]
    if intent.get(PROMOTE):
        if not with_lists:
            raise ValidationError("no definition under %r has a command or args list on its predictor's container" % rel_path,
                                  field="path", hint="write the vLLM arguments as spec.predictor.model.args in the manifest")
        promote_at = with_lists[-1]
    return entry_at, add_at, promote_at


def _choose(surveys, intent, rel_path):
    """Which definitions (by their order in the walk) get the share and the flag."""
    percent_at, flag_at = set(), None
    if intent.get(PERCENT) is not None:
        percent_at = {i for i, s in enumerate(surveys) if s["percent"]} or {len(surveys) - 1}
    if intent.get(FLAG) is not None:
        with_flag = [i for i, s in enumerate(surveys) if s["flag"]]
        with_lists = [i for i, s in enumerate(surveys) if s["lists"]]
        if not (with_flag or with_lists):
            raise ValidationError(
                "no definition of the InferenceService under %r has a command or args list on its predictor's container "
                "(read: %s), so there is no place for --speculative-config" % (rel_path, ", ".join(s["where"] for s in surveys)),
                field="path", hint="write the vLLM arguments as spec.predictor.model.args (or command) in the manifest or the "
                                   "overlay's patch, as the inference_service role renders them, then run the step again")
        flag_at = (with_flag or with_lists)[-1]
    return percent_at, flag_at


def edit_canary_in_directory(root, path, name, namespace, intent, default_namespace=None, owner_kind=None, path_option="canary_git_path"):
    """Make the InferenceService's definitions under ``root``/``path`` say what ``intent`` asks (files rewritten in
    place). Returns manifest_edit.edit_in_directory's result, whose ``removed`` lists every change ({file, field, change
    set|removed, value, flag for the flag}); ``files`` is empty when Git already says it (a rerun of the step)."""
    intent = dict(intent or {})
    unknown = set(intent) - {PERCENT, FLAG, CANARY, PROMOTE}
    if unknown:
        raise ValidationError("unknown canary edit %s" % ", ".join(sorted(unknown)), field="intent",
                              hint="use %s and %s (Knative), %s or %s (Standard)" % (PERCENT, FLAG, CANARY, PROMOTE))
    standard = CANARY in intent or PROMOTE in intent
    canary_name = (intent.get(CANARY) or intent.get(PROMOTE) or {}).get("name")
    surveys = []

    def survey(node, kind, where):
        surveys.append(_survey(node, kind, where, canary_name))
    # the first walk reads (nothing is written: the edit returns nothing), the second one edits the chosen definitions,
    # met in the same order
    manifest_edit.edit_in_directory(root, path, "InferenceService", name, namespace, default_namespace=default_namespace,
                                    owner_kind=owner_kind, document_edit=survey, path_option=path_option)
    if standard:
        entry_at, add_at, promote_at = _choose_standard(surveys, intent, path or ".")
    else:
        percent_at, flag_at = _choose(surveys, intent, path or ".")
    seen = []

    def edit_standard(node, kind, where, index):
        if intent.get(CANARY):
            return _set_entry(node, intent[CANARY], where) if index in entry_at or index == add_at else []
        changes = _promote(node, kind, intent[PROMOTE], where) if intent.get(PROMOTE) and index == promote_at else []
        return changes + _remove_canary(node, kind, where)

    def edit(node, kind, where):
        index = len(seen)
        seen.append(where)
        if standard:
            return edit_standard(node, kind, where, index)
        changes = []
        if PERCENT in intent:
            if intent[PERCENT] is None:
                changes += _remove_percent(node, kind, where)
            elif index in percent_at:
                changes += _set_percent(node, kind, int(intent[PERCENT]), where)
        if FLAG in intent:
            if intent[FLAG] is None:
                changes += _strip_flag(node, kind, where)
            elif index == flag_at:
                changes += _set_flag(node, kind, intent[FLAG], where)
        return changes
    return manifest_edit.edit_in_directory(root, path, "InferenceService", name, namespace, default_namespace=default_namespace,
                                           owner_kind=owner_kind, document_edit=edit, path_option=path_option)


def changes_summary(changes):
    """``canaryTrafficPercent 10, --speculative-config {...} set`` for a commit message."""
    words = []
    for item in changes:
        what = item.get("flag") or item["field"].rsplit(".", 1)[-1].rsplit("/", 1)[-1]
        if item["change"] == "set":
            text = "%s %s" % (what, item["value"])
        else:
            text = "%s removed" % what
        if text not in words:
            words.append(text)
    return ", ".join(words) or "nothing"
