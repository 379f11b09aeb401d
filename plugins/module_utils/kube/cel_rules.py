# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A CRD's validation rules (``x-kubernetes-validations``, CEL) evaluated on an object as kube-apiserver 1.25+ does.

Any CRD: ``rules_of(crd)`` keeps of its ``openAPIV3Schema`` only what the rules need (the rules, the path to them,
and under them the defaults and the types that change a value), per version; ``evaluate(schema, obj)`` checks an
object against one version's kept schema. What kube-apiserver does, and so what this does:

- the object is defaulted first (``default`` of every property that is absent, also inside defaults);
- a rule at a schema node runs with ``self`` = that node's value: the object, a map (``additionalProperties``) or a
  list; a node whose value is absent or null is not checked (nor anything under it); each list item and map value
  runs the rules of ``items`` / ``additionalProperties``;
- ``number`` fields are doubles, ``format: byte`` strings bytes;
- a rule that is false fails with its ``messageExpression`` (when that gives a one-line non-blank string), else its
  ``message``, else ``failed rule: <rule>``, at ``fieldPath`` (relative to the node) or the node's path, with its
  ``reason`` (``FieldValueInvalid`` by default); a rule that cannot be evaluated on this object (a missing key, a
  division by zero) fails too, as it does on the API server;
- transition rules (they read ``oldSelf``) run only against an old object (the object on the cluster), matched by
  property, map key and ``x-kubernetes-list-type: map`` keys; on a create they are not run.

What is not evaluated is returned in ``not_evaluated`` with the reason, never passed in silence: a rule that does not
compile with cel-expr-python (a function of a Kubernetes library not in ``kube/cel_library.py``, a syntax it lacks),
a transition rule without an old object, one with ``optionalOldSelf`` on a create (cel-expr-python takes no empty
optional as a variable), and a rule whose only failure is that no overload takes the value's type: kube-apiserver
types ``self`` from the schema (a ``format: duration`` string is a duration there, a string here), so that error is
this evaluator's, not the object's.

Each rule is compiled once per process (``_programs``), on first use; the Kubernetes libraries are declared once.
"""

from __future__ import annotations

import base64
import copy
import glob
import os
import re
from collections import namedtuple

try:
    from cel_expr_python import cel
    from cel_expr_python.ext.ext_optional import ExtOptional
    from cel_expr_python.ext.ext_strings import ExtStrings
    HAS_CEL = True
except ImportError:  # pragma: no cover - reported by the calling module
    cel = None
    HAS_CEL = False

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError, optional_import
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import cel_library

yaml = optional_import("yaml")[0]  # reported by the calling module
HAS_YAML = yaml is not None

LIBRARY = "cel-expr-python"
RULES = "x-kubernetes-validations"
# Of a schema node under a rule: what defaulting and the value's CEL type need.
_TYPING = ("type", "format", "default", "nullable", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
           "x-kubernetes-embedded-resource", "x-kubernetes-list-type", "x-kubernetes-list-map-keys")
_STRING_LITERAL = re.compile(r"""[rRbB]*('''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")""", re.S)
_OLD_SELF = re.compile(r"\boldSelf\b")
_MISSING = object()

Violation = namedtuple("Violation", "field message rule reason")
NotEvaluated = namedtuple("NotEvaluated", "field rule reason")


class Result(namedtuple("Result", "violations not_evaluated evaluated")):
    """``violations`` and ``not_evaluated`` lists, ``evaluated``: how many rules ran (passed or failed)."""


# -- the schema a CRD's rules need ----------------------------------------------------------------------------------

def _prune(node, under_rule):
    if not isinstance(node, dict):
        return None
    rules = node.get(RULES)
    inner = under_rule or bool(rules)
    out = {}
    props = {}
    for key, child in (node.get("properties") or {}).items():
        kept = _prune(child, inner)
        if kept is not None:
            props[key] = kept
    if props:
        out["properties"] = props
    for key in ("items", "additionalProperties"):
        kept = _prune(node.get(key), inner)
        if kept is not None:
            out[key] = kept
    typed = under_rule and ("default" in node or node.get("type") == "number" or node.get("format") == "byte")
    if not (rules or out or typed):
        return None
    for key in _TYPING:
        if key in node and (inner or key in ("type", "default")):
            out[key] = copy.deepcopy(node[key])
    if rules:
        out[RULES] = copy.deepcopy(rules)
    return out


def rules_of(crd):
    """``{group, kind, versions: {name: kept schema or None}}`` of a CustomResourceDefinition (a dict)."""
    spec = (crd or {}).get("spec") or {}
    versions = {}
    for version in spec.get("versions") or []:
        schema = ((version.get("schema") or {}).get("openAPIV3Schema")) or {}
        versions[version.get("name")] = _prune(schema, False)
    return {"group": spec.get("group"), "kind": (spec.get("names") or {}).get("kind"), "versions": versions}


def iter_rules(schema, path=""):
    """``(path, rule)`` of every rule in a kept schema; list items are ``[*]``, map values ``[*]`` too."""
    if not isinstance(schema, dict):
        return
    for rule in schema.get(RULES) or []:
        yield path, rule
    for key, child in (schema.get("properties") or {}).items():
        yield from iter_rules(child, "%s.%s" % (path, key) if path else key)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from iter_rules(schema[key], path + "[*]")


def load_crds(paths):
    """The rules of every CustomResourceDefinition in ``paths`` (files, or directories of *.yaml / *.yml) that has
    rules, by ``(group, kind)``. Raises ValidationError naming the file that cannot be read."""
    if not HAS_YAML:
        raise ValidationError("PyYAML is needed to read CRD files", field="kserve_crds", hint="pip install PyYAML")
    files = []
    for path in [paths] if isinstance(paths, str) else list(paths or []):
        if os.path.isdir(path):
            files += sorted(glob.glob(os.path.join(path, "*.yaml")) + glob.glob(os.path.join(path, "*.yml")))
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ValidationError("'%s' is neither a CRD file nor a directory" % path, field="kserve_crds",
                                  hint="point it at the directory of the cluster's CRD YAMLs (kubectl get crd NAME -o yaml)")
    found = {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for name in files:
        try:
            with open(name, "rb") as handle:
                raw = handle.read()
            # A file without the word has no rules: not parsed (a 3 MB CRD is seconds of YAML, even with libyaml).
            docs = list(yaml.load_all(raw, Loader=loader)) if b"x-kubernetes-validations" in raw else []  # nosec B506
        except (OSError, yaml.YAMLError) as exc:
            raise ValidationError("cannot read %s: %s" % (name, exc), field="kserve_crds", hint="give readable CRD YAML files") from exc
        for doc in docs:
            items = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]
            for item in items or []:
                if isinstance(item, dict) and item.get("kind") == "CustomResourceDefinition":
                    rules = rules_of(item)
                    found[(rules["group"], rules["kind"])] = rules
    return found


# -- compiling ------------------------------------------------------------------------------------------------------

class _Programs:
    """One CEL environment and every rule compiled once per process."""

    def __init__(self):
        self._env = None
        self._compiled = {}

    def env(self):
        if self._env is None:
            self._env = cel.NewEnv(variables={"self": cel.Type.DYN, "oldSelf": cel.Type.DYN},
                                   extensions=[ExtOptional(), ExtStrings(version=2)],
                                   functions=cel_library.declarations(cel))
        return self._env

    def get(self, text):
        """``(program, None)`` or ``(None, why it does not compile)``."""
        if text not in self._compiled:
            try:
                self._compiled[text] = (self.env().compile(text), None)
            except RuntimeError as exc:
                self._compiled[text] = (None, str(exc).strip().splitlines()[0])
        return self._compiled[text]


_programs = _Programs()


def _require_cel():
    if not HAS_CEL:
        raise ValidationError("the %s library is needed to evaluate the CRDs' x-kubernetes-validations rules" % LIBRARY,
                              field="x-kubernetes-validations", hint="pip install %s (requirements.txt)" % LIBRARY)


def is_transition_rule(text):
    """Whether the rule reads ``oldSelf`` (outside its string literals)."""
    return bool(_OLD_SELF.search(_STRING_LITERAL.sub("''", text)))


def compile_problems(schema):
    """NotEvaluated for every rule of a kept schema that does not compile (the same for every object)."""
    _require_cel()
    out = []
    for path, rule in iter_rules(schema):
        for key in ("rule", "messageExpression"):
            if rule.get(key):
                _program, error = _programs.get(rule[key])
                if error:
                    out.append(NotEvaluated(path or "<root>", rule["rule"], "%s does not compile with %s: %s" % (key, LIBRARY, error)))
    return out


# -- evaluating -----------------------------------------------------------------------------------------------------

def _prepare(node, value):
    """A copy of ``value`` defaulted and typed as the (kept) schema says; parts without schema are shared, not copied."""
    if not isinstance(node, dict) or value is None:
        return value
    if isinstance(value, dict):
        props = node.get("properties") or {}
        extra = node.get("additionalProperties") if isinstance(node.get("additionalProperties"), dict) else None
        out = {key: _prepare(props.get(key) or extra, val) for key, val in value.items()}
        for key, child in props.items():
            if key not in out and "default" in child:
                out[key] = _prepare(child, copy.deepcopy(child["default"]))
        return out
    if isinstance(value, list):
        return [_prepare(node.get("items"), item) for item in value]
    if node.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if node.get("format") == "byte" and isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            return value
    return value


def _join(path, key):
    return "%s.%s" % (path, key) if path else key


def _old_item(old, item, keys):
    if not keys or not isinstance(old, list) or not isinstance(item, dict):
        return _MISSING
    for candidate in old:
        if isinstance(candidate, dict) and all(candidate.get(k) == item.get(k) for k in keys):
            return candidate
    return _MISSING


def _message(rule, activation):
    expression = rule.get("messageExpression")
    if expression:
        program, error = _programs.get(expression)
        if not error:
            result = program.eval(activation)
            text = result.value() if result.type().name() == "STRING" else None
            if isinstance(text, str) and text.strip() and "\n" not in text:
                return text
    return rule.get("message") or "failed rule: %s" % rule["rule"]


def _field(path, rule):
    where = rule.get("fieldPath")
    if not where:
        return path
    return (path + where) if path else where.lstrip(".")


def _check_node(rules, value, old, path, out):
    data = {"self": value}
    if old is not _MISSING:
        data["oldSelf"] = old
    activation = None
    for rule in rules:
        text = rule.get("rule") or ""
        if is_transition_rule(text) and old is _MISSING:
            why = ("optionalOldSelf rule on a create: %s takes no empty optional as oldSelf" % LIBRARY
                   if rule.get("optionalOldSelf") else "transition rule (reads oldSelf): kube-apiserver runs it on an update "
                   "only, and no object on the cluster was given")
            out.not_evaluated.append(NotEvaluated(path or "<root>", text, why))
            continue
        program, error = _programs.get(text)
        if error:
            out.not_evaluated.append(NotEvaluated(path or "<root>", text, "does not compile with %s: %s" % (LIBRARY, error)))
            continue
        if activation is None:
            activation = _programs.env().Activation(data=data)
        result = program.eval(activation)
        kind = result.type().name()
        if kind == "BOOL" and result.value() is True:
            out.evaluated.append(text)
            continue
        if kind == "ERROR" and "no matching overload" in str(result.value()).lower():
            out.not_evaluated.append(NotEvaluated(path or "<root>", text, "%s typed a value differently from the schema: %s"
                                                  % (LIBRARY, result.value())))
            continue
        if kind not in ("BOOL", "ERROR"):
            out.not_evaluated.append(NotEvaluated(path or "<root>", text, "gives a %s, not a bool" % kind.lower()))
            continue
        out.evaluated.append(text)
        message = _message(rule, activation)
        if kind == "ERROR":
            message = "%s (the rule cannot be evaluated on this object: %s)" % (message, result.value())
        out.violations.append(Violation(_field(path, rule), message, text, rule.get("reason") or "FieldValueInvalid"))


def _walk(node, value, old, path, out):
    if value is None or not isinstance(node, dict):
        return
    if node.get(RULES):
        _check_node(node[RULES], value, old, path, out)
    if isinstance(value, dict):
        olds = old if isinstance(old, dict) else {}
        for key, child in (node.get("properties") or {}).items():
            if key in value:
                _walk(child, value[key], olds.get(key, _MISSING), _join(path, key), out)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                _walk(extra, item, olds.get(key, _MISSING), "%s[%s]" % (path, key), out)
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        keys = node.get("x-kubernetes-list-map-keys") if node.get("x-kubernetes-list-type") == "map" else None
        for index, item in enumerate(value):
            _walk(node["items"], item, _old_item(old, item, keys), "%s[%d]" % (path, index), out)


def evaluate(schema, obj, old=None):
    """Check ``obj`` (a dict) against one version's kept schema (``rules_of(crd)["versions"][name]``); ``old`` is the
    object on the cluster for transition rules. Returns a Result; raises ValidationError when cel-expr-python is
    missing."""
    out = Result([], [], [])
    if not schema:
        return out
    _require_cel()
    _walk(schema, _prepare(schema, obj), _prepare(schema, old) if old else _MISSING, "", out)
    return out
