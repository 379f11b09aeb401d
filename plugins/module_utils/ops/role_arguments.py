# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A role's variables against its argument spec, one line per problem.

Ansible's own role check (``validate_argument_spec``, prepended to every role with a ``meta/argument_specs.yml``) names
the role's variable and, on failure, prints the role's whole argument spec. Here the same rules, checked by the same
validator, give one line each: the variable (the inventory's ``spec_decoding_method`` when the value came from it,
not the role's ``inference_service_method``), the value, what is allowed and the nearest choice.

Read per role (its ``meta/argument_specs.yml`` and ``defaults/main.yml`` only): the role ``argument_check`` runs this
before every role of the collection, in a fresh worker process each time, so it must stay cheap.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.errors import ArgumentValueError

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError, optional_import

yaml = optional_import("yaml")[0]  # PyYAML comes with ansible-core on the controller

# Keys of an argument spec that are documentation, not rules (ArgumentSpecValidator does not take them).
_DOC_KEYS = ("description", "short_description", "version_added", "author", "notes", "seealso")
# A role variable that defaults to exactly one other variable: `name: "{{ other | default(...) }}"` or `name: "{{ other }}"`.
SOURCE_RE = re.compile(r"""^([a-z][a-z0-9_]*):\s*["']?\{\{\s*([a-z][a-z0-9_]*)\s*(?:\|\s*default\([^|]*\)\s*)?\}\}["']?\s*$""")
_MAX_VALUE = 80
COLLECTION = "alauda.spec_decoding"


def spec_rules(spec):
    """An option's spec without its documentation, sub-options included (what ArgumentSpecValidator takes)."""
    rules = {k: v for k, v in (spec or {}).items() if k not in _DOC_KEYS}
    if isinstance(rules.get("options"), dict):
        rules["options"] = {name: spec_rules(sub) for name, sub in rules["options"].items()}
    return rules


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


@functools.lru_cache(maxsize=32)
def role_spec(root, role):
    """``(options, sources)`` of role ``role`` of the collection at ``root``: ``options`` {role variable: rules} of its
    ``meta/argument_specs.yml`` (entry point main, empty without one), ``sources`` {role variable: the variable its default
    reads} from its ``defaults/main.yml`` (``inference_service_method: "{{ spec_decoding_method | default('none') }}"``)."""
    folder = os.path.join(root, "roles", role)
    options, sources = {}, {}
    spec_path = os.path.join(folder, "meta", "argument_specs.yml")
    if os.path.exists(spec_path):
        loader = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
        specs = (yaml.load(_read(spec_path), Loader=loader) or {}).get("argument_specs") or {}  # nosec - CSafeLoader/SafeLoader
        options = {name: spec_rules(spec) for name, spec in ((specs.get("main") or {}).get("options") or {}).items()}
    defaults_path = os.path.join(folder, "defaults", "main.yml")
    if os.path.exists(defaults_path):
        for line in _read(defaults_path).splitlines():
            match = SOURCE_RE.match(line)
            if match and match.group(1) != match.group(2):
                sources[match.group(1)] = match.group(2)
    return options, sources


def nearest(name, candidates):
    """The candidate closest to ``name`` (difflib), or None when none is close."""
    # Imported here: only a refusal needs it, and the argument check runs in a fresh worker before every role.
    import difflib  # pylint: disable=import-outside-toplevel
    found = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.7)
    return found[0] if found else None


def shown(value):
    """``value`` as a message shows it: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= _MAX_VALUE else text[:_MAX_VALUE - 3] + "..."


def choice_problem(name, value, choices, where=""):
    """One line: the variable, the value, the allowed values and the nearest of them; ``where`` (`` (read by ...)``) says
    which role reads it."""
    allowed = [str(c) for c in choices]
    guess = nearest(str(value), allowed)
    return ValidationError("%s must be one of %s%s" % (shown(value), ", ".join(allowed), where), field=name,
                           hint="set %s: %s" % (name, guess) if guess else "set %s to one of them" % name)


def type_problem(name, value, rules, detail, where=""):
    """One line: the variable, the value, the type (and element type) the role takes, and Ansible's reason."""
    wanted = rules.get("type") or "str"
    if rules.get("elements"):
        wanted = "%s of %s" % (wanted, rules["elements"])
    example = rules.get("default")
    return ValidationError("%s is not a valid %s (%s)%s" % (shown(value), wanted, detail.replace("\n", " "), where), field=name,
                           hint="give a %s%s" % (wanted, ", e.g. %s: %s" % (name, shown(example)) if example not in (None, "", [], {}) else ""))


def _has_no_log(rules):
    return bool(rules.get("no_log")) or any(_has_no_log(sub) for sub in (rules.get("options") or {}).values() if isinstance(sub, dict))


def plain(value):
    """``value`` as plain dicts, lists and tuples (its strings and numbers as they are). The validator deep-copies what it
    checks, and a variable's value as Ansible hands it over is a lazy container whose deep copy copies its templar with
    every variable of the play: 26,000 copies and 0.05-0.1 s for the ten values of a no-op deploy's inventory check."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def value_problem(name, option, rules, value, where=""):
    """The one-line problem of ``value`` of variable ``name`` against the rules of role variable ``option``, found by
    Ansible's own validator (the one the role's argument check runs: ansible/plugins/action/validate_argument_spec.py),
    or None. The value of an option with ``no_log`` (or a sub-option with it) is not shown, nor a secret in Ansible's
    reason."""
    result = ArgumentSpecValidator({option: rules}).validate({option: plain(value)})
    errors = result.errors.errors
    if not errors:
        return None
    first = errors[0]
    detail = str(first)
    secret = _has_no_log(rules)
    value_shown = "********" if secret else value
    if isinstance(first, ArgumentValueError) and rules.get("choices") and detail.startswith("value of %s must be one of" % option):
        return choice_problem(name, value_shown, rules["choices"], where)
    if secret:
        # The validator lists the no_log values it met, as a module's result is cleaned of them (AnsibleModule.no_log_values).
        detail = remove_values(detail, result._no_log_values)  # pylint: disable=protected-access
    return type_problem(name, value_shown, rules, detail.replace("'%s'" % option, name).replace(option, name), where)


def role_problems(role, values, options, sources, untemplated=None):
    """One line each for what role ``role``'s argument check refuses in ``values`` ({variable: value} of the role's
    variables as the role reads them and of the variables their defaults read; an undefined one absent): a value outside
    its rules (``options``, from role_spec) or a required variable not set. A value that came from the variable the role's
    default reads (``sources``; it equals that variable's value) is named by that variable, the role's own name beside it.
    ``untemplated`` ({variable: reason}) lists the variables whose value could not be templated."""
    reader = "%s.%s" % (COLLECTION, role)
    problems = []
    for option in sorted(options):
        rules = options[option]
        source = sources.get(option)
        from_source = source in values and option in values and values[source] == values[option]
        name = source if from_source else option
        where = " (read by %s as %s)" % (reader, option) if from_source else " (read by %s)" % reader
        if option in (untemplated or {}):
            problems.append(ValidationError("cannot be templated (%s)%s" % (untemplated[option], where), field=option,
                                            hint="define what it refers to%s, or give a plain value" % (" (%s)" % source if source else "")))
        elif option in values:
            problem = value_problem(name, option, rules, values[option], where)
            if problem is not None:
                problems.append(problem)
        elif rules.get("required"):
            problems.append(ValidationError("is required by %s and not set" % reader, field=option,
                                            hint="set %s%s" % (option, " (or %s, which it defaults to)" % source if source else "")))
    return problems
