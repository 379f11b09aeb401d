# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The inventory's variables against what the collection reads, before a playbook reads or writes anything.

* A name with one of the collection's prefixes (``spec_decoding_`` and each role's name) that nothing in the collection
  reads is refused, naming the nearest known variable (a misspelt ``spec_decoding_num_speculative_tokens`` otherwise
  changes nothing and says nothing).
* A value outside a role's argument spec is said in one line that names the inventory variable (``spec_decoding_method``,
  not the role's ``inference_service_method``), the value, what is allowed and the nearest choice (role_arguments.py);
  Ansible's own role check prints the whole argument spec instead.
* A draft method with a target URI and no draft is refused with the reason and an example in the target's scheme.

The catalog is read from the collection's own files: every name the roles and playbooks mention (so a variable a role
starts reading is known without a list to keep up), the roles' ``meta/argument_specs.yml``, and which inventory variable
each role variable defaults to (``roles/*/defaults/main.yml``: ``inference_service_method: "{{ spec_decoding_method |
default('none') }}"``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import role_arguments
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.role_arguments import nearest, shown as _shown
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_releases

INVENTORY_PREFIX = "spec_decoding"
SETTING = "spec_decoding_unknown_variables"
SETTING_VALUES = ("refuse", "warn")
# kserve/isvc/render.py and kserve/llmisvc/render.py: needs_draft = method in ("eagle3", "eagle", "draft_model").
DRAFT_METHODS = {
    "eagle3": "EAGLE-3 proposes tokens with a draft head trained for the target, whose own weights vLLM loads beside it",
    "eagle": "EAGLE proposes tokens with a draft head trained for the target, whose own weights vLLM loads beside it",
    "draft_model": "draft_model proposes tokens with a smaller model of the same tokenizer, which vLLM loads beside the target",
}
# Every key of vLLM's SpeculativeConfig some known release takes: spec_decoding_<key> is then meant for spec_decoding_speculative.
SPECULATIVE_KEYS = frozenset(key for table in speculative_releases.RELEASES.values() for key in table["keys"])


def _roles_dir(root):
    return os.path.join(root, "roles")


def _role_names(root):
    return sorted(name for name in os.listdir(_roles_dir(root)) if os.path.isdir(os.path.join(_roles_dir(root), name)))


def _text_files(root):
    for top in (_roles_dir(root), os.path.join(root, "playbooks")):
        for folder, _dirs, files in os.walk(top):
            for name in sorted(files):
                if name.endswith((".yml", ".yaml", ".j2", ".py")):
                    yield os.path.join(folder, name)


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


class Catalog:
    """What the collection reads: ``prefixes``, ``known`` names, ``options`` ({role variable: (role, rules)}),
    ``sources`` ({variable: [role variables that default to it]})."""

    def __init__(self, prefixes, known, options, sources):
        self.prefixes = tuple(prefixes)
        self.known = frozenset(known)
        self.options = options
        self.sources = sources
        self.pattern = re.compile(r"^(?:%s)_[a-z0-9_]+$" % "|".join(re.escape(p) for p in sorted(self.prefixes, key=len, reverse=True)))

    def governed(self, name):
        """True when ``name`` carries one of the collection's prefixes, so the collection should know it."""
        return bool(self.pattern.match(name))


# The catalog is kept in the user's cache (files.CACHE_DIR) under a stamp of every file it is read from and of the code that
# reads it: every playbook's first task reads it in a fresh worker process, and reading it (110 files scanned, 12 argument
# specs parsed) was 0.03 s of each run; the stamp (a stat of each file) costs about 1 ms. Any edit of a role, playbook or
# this code changes the stamp, so a kept catalog is never one of other files.
CATALOG_CACHE = os.path.join(files.CACHE_DIR, "inventory-catalog.json")


def _stamp(root):
    """(path, size, mtime) of the files the catalog is read from and of the code that reads it, as one digest; None when
    one cannot be read (then the catalog is read every time)."""
    entries = []
    try:
        for path in list(_text_files(root)) + [os.path.abspath(__file__), os.path.abspath(role_arguments.__file__)]:
            info = os.stat(path)
            entries.append((path, info.st_size, info.st_mtime_ns))
    except (OSError, AttributeError, TypeError):
        return None
    return hashlib.sha256(json.dumps([os.path.abspath(root), entries]).encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=4)
def catalog(root, cache=CATALOG_CACHE):
    """The catalog of the collection at ``root``: read once per process, and from ``cache`` (a path; None: not kept) while
    none of its files changed."""
    stamp = _stamp(root) if cache else None
    kept = files.read_private_json(cache).get(stamp) if stamp else None
    if isinstance(kept, dict):
        try:
            return _catalog_of(kept)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # not what this code writes: read the files again, and keep that
    data = _read_catalog(root)
    if stamp:
        files.write_private_json(cache, {stamp: data})
    return _catalog_of(data)


def _catalog_of(data):
    return Catalog(data["prefixes"], data["known"], {name: tuple(entry) for name, entry in data["options"].items()}, data["sources"])


def _read_catalog(root):
    """What ``Catalog`` is built from, read from the collection's files, as JSON types (so that it can be kept)."""
    prefixes = [INVENTORY_PREFIX] + _role_names(root)
    mention = re.compile(r"\b(?:%s)_[a-z0-9_]+" % "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True)))
    known = set()
    for path in _text_files(root):
        known.update(mention.findall(_read(path)))
    known.add(SETTING)
    options, sources = {}, {}
    for role in _role_names(root):
        role_options, role_sources = role_arguments.role_spec(root, role)
        options.update((name, [role, rules]) for name, rules in role_options.items())
        for name, source in role_sources.items():
            sources.setdefault(source, []).append(name)
    return {"prefixes": prefixes, "known": sorted(known), "options": options, "sources": sources}


def _nearest_variable(name, cat):
    """The known variable nearest to ``name``: among those of its own prefix, compared without the prefix (which every one of
    them shares, so it would make any two look alike); else among all."""
    prefix = next((p for p in sorted(cat.prefixes, key=len, reverse=True) if name.startswith(p + "_")), None)
    if prefix:
        rest = {k[len(prefix) + 1:]: k for k in cat.known if k.startswith(prefix + "_")}
        found = nearest(name[len(prefix) + 1:], rest)
        if found:
            return rest[found]
    return nearest(name, cat.known)


def unknown_variables(names, cat, values=None):
    """A ValidationError for each of ``names`` with a collection prefix that nothing in the collection reads; ``values``
    ({name: value}, optional) puts the value in the fix when the name is a key of vLLM's speculative config."""
    problems = []
    for name in sorted(set(names)):
        if not cat.governed(name) or name in cat.known:
            continue
        key = name[len(INVENTORY_PREFIX) + 1:] if name.startswith(INVENTORY_PREFIX + "_") else None
        if key in SPECULATIVE_KEYS:
            value = (values or {}).get(name, "...")
            problems.append(ValidationError(
                "no role or playbook of alauda.spec_decoding reads this variable, so it changes nothing: %s is a key of vLLM's "
                "speculative config, which comes from spec_decoding_speculative" % key, field=name,
                hint="set spec_decoding_speculative: {%s: %s} instead (merged over the method's preset)" % (key, _shown(value))))
            continue
        guess = _nearest_variable(name, cat)
        problems.append(ValidationError(
            "no role or playbook of alauda.spec_decoding reads this variable, so it changes nothing%s"
            % ("" if guess else " (no known variable is close)"), field=name,
            hint="%sremove it; or set %s: warn to only warn about unknown variables"
                 % ("rename it to %s (the nearest known variable); or " % guess if guess else "", SETTING)))
    return problems


def option_checks(names, cat, roles=None):
    """(variable given, role variable whose spec its value must pass) for each of ``names`` a role reads: an inventory
    variable through the role variables that default to it, a role variable set directly against its own spec (``names``
    are what the inventory and extra vars set, never a role's defaults). ``roles`` (names, FQCN or short) limits the checks to
    the roles a play runs: one inventory variable may feed roles that allow different values (spec_decoding_target:
    gitops is right for inference_service, not for watch)."""
    running = None if roles is None else {str(r).rsplit(".", 1)[-1] for r in roles}
    given = set(names)
    checks = []
    for name in sorted(given):
        # a role variable set directly does not read the inventory variable it defaults to
        fed = [o for o in cat.sources.get(name, []) if o in cat.options and o not in given]
        for option in fed + ([name] if name in cat.options else []):
            if running is None or cat.options[option][0] in running:
                checks.append((name, option))
    return checks


def draft_problem(method, method_source, artifacts, artifact_mode="auto", staged=False, built=False, resource_kind="InferenceService"):
    """A ValidationError when a draft method has a target URI and nothing that holds a draft (no draft_uri, no Modelcar
    image, no PVC, nothing staged or built), which the render would refuse without saying why; None otherwise.
    ``method_source`` is what set the method (``spec_decoding_method`` or the playbook)."""
    art = artifacts if isinstance(artifacts, dict) else {}
    target = art.get("target_uri")
    if method not in DRAFT_METHODS or resource_kind != "InferenceService" or staged or built or not isinstance(target, str) or not target:
        return None
    if art.get("draft_uri") or artifact_mode not in ("auto", "storage_uris"):
        return None
    if artifact_mode == "auto" and (art.get("modelcar_image") or art.get("pvc_name")):
        return None
    # Imported here: the render pulls in the CRD rules, which the argument checks (role_problems) do not need.
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc_render  # pylint: disable=import-outside-toplevel
    example = isvc_render.draft_uri_example(target, method)
    return ValidationError(
        "%s needs a draft (%s), and spec_decoding_artifacts has target_uri %r but no draft_uri" % (method, DRAFT_METHODS[method], target),
        field=method_source,
        hint="set spec_decoding_artifacts.draft_uri to the draft's location%s, or put target and draft in one Modelcar image "
             "(modelcar_image) or PVC (pvc_name)" % (", e.g. " + example if example else ""))
