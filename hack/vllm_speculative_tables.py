# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read one vLLM release's ``--speculative-config`` facts from its source tree, without importing vLLM.

    hack/vllm_speculative_tables.py SRC                 print the release's entry as JSON
    hack/vllm_speculative_tables.py SRC --write         merge it into plugins/module_utils/vllm/speculative_releases.py

SRC is an unpacked vLLM source distribution, a git checkout or an installed package: the directory that holds
``vllm/`` (or ``vllm/`` itself). The release comes from ``vllm/_version.py`` (``--version`` overrides it); the
commit from ``--commit`` or, failing that, ``__commit_id__`` in ``vllm/_version.py`` (setuptools-scm's short
``g<hash>``). The next release is one command away once its source is here. pip will not keep vLLM's source
distribution without building it, but it leaves the unpacked tree when asked not to clean up:
``TMPDIR=/tmp/v pip download --no-deps --no-binary :all: --no-build-isolation --no-clean vllm==X`` fails at the
metadata step and leaves /tmp/v/pip-download-*/vllm_*/; run this on that directory (an installed vLLM works too).

Everything is read with ``ast`` from ``vllm/config/speculative.py`` (``vllm/config.py`` before 0.11),
``vllm/config/utils.py``, ``vllm/engine/arg_utils.py`` (the engine-set keys, whether it rewrites hyphens in the keys,
the ``--spec-*`` shorthand flags) and, from 0.34 on, the per-method speculator configs under
``vllm/v1/worker/gpu/spec_decode/``. Only facts are kept: names, types as written, defaults, versions, the allowed
values of Literal/Enum fields and which of vLLM's cross-field rules (CODE_RULES) the release raises where; what is not
found stays unknown (None, or ``code_rules_unread``), never guessed. Every table 0.10-0.34 was read with this script.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import pprint
import re
import sys

from vllm_command_line_facts import ENGINE_FILE as _ENGINE_FILE, command_line_facts

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "plugins", "module_utils", "vllm", "speculative_releases.py")
LOOKUP_KEYS = ("prompt_lookup_min", "prompt_lookup_max")
# Field types that only the engine sets (the target's and the draft's model/parallel configs).
_ENGINE_TYPES = re.compile(r"\b(ModelConfig|ParallelConfig)\b")
_REGISTRY_DIR = os.path.join("vllm", "v1", "worker", "gpu", "spec_decode")


class SourceError(Exception):
    pass


def _parse(path):
    with open(path, "rb") as handle:
        data = handle.read()
    return ast.parse(data, filename=path), data


def _root(src):
    src = os.path.abspath(src)
    if os.path.isdir(os.path.join(src, "vllm")):
        return src
    if os.path.basename(src) == "vllm" and os.path.isdir(src):
        return os.path.dirname(src)
    raise SourceError("%s holds no vllm/ package" % src)


def _speculative_file(root):
    for rel in (os.path.join("vllm", "config", "speculative.py"), os.path.join("vllm", "config.py")):
        if os.path.isfile(os.path.join(root, rel)):
            return rel
    raise SourceError("no vllm/config/speculative.py or vllm/config.py under %s" % root)


def _const(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _version_info(root):
    path = os.path.join(root, "vllm", "_version.py")
    if not os.path.isfile(path):
        return None, None
    tree, _source = _parse(path)
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and name.id in ("__version__", "__commit_id__"):
                        found[name.id] = _const(node.value)
    return found.get("__version__"), found.get("__commit_id__")


# --- Literal aliases ---------------------------------------------------------------------------------------

def _module_assignments(trees):
    """Module-level NAME = value (and NAME: T = value) of every tree, first definition wins."""
    out = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                out.setdefault(node.targets[0].id, node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                out.setdefault(node.target.id, node.value)
    return out


def _strings(node, names, seen=None):
    """The string values a Literal[...] alias, a tuple or a set of constants stands for (nested aliases resolved)."""
    seen = seen or set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        if node.id in seen or node.id not in names:
            return []
        return _strings(names[node.id], names, seen | {node.id})
    if isinstance(node, ast.Subscript) and _dotted(node.value).endswith("Literal"):
        return _strings(node.slice, names, seen)
    if isinstance(node, ast.Call) and _dotted(node.func).endswith("get_args") and node.args:
        return _strings(node.args[0], names, seen)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        out = []
        for elt in node.elts:
            out.extend(_strings(elt, names, seen))
        return out
    if isinstance(node, ast.Index):  # Python < 3.9 trees
        return _strings(node.value, names, seen)
    return []


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    return ""


# --- the SpeculativeConfig class -----------------------------------------------------------------------------

def _class(tree, name):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _method(cls, name):
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _fields(cls):
    """name -> {"type", "default", constraints...}, and the names that are not constructor arguments."""
    fields, no_init = {}, set()
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name, annotation = node.target.id, ast.unparse(node.annotation)
        if annotation.startswith(("ClassVar", "typing.ClassVar")):
            continue
        entry = {"type": annotation}
        value = node.value
        if value is None:
            entry["required"] = True
        elif isinstance(value, ast.Call) and _dotted(value.func).split(".")[-1] in ("Field", "field"):
            for kw in value.keywords:
                if kw.arg == "default":
                    entry["default"] = _literal_or_text(kw.value)
                elif kw.arg == "default_factory":
                    entry["default_factory"] = ast.unparse(kw.value)
                elif kw.arg in ("gt", "ge", "lt", "le"):
                    entry[kw.arg] = _const(kw.value)
                elif kw.arg == "init" and _const(kw.value) is False:
                    no_init.add(name)
            if "default" not in entry and "default_factory" not in entry and value.args:
                entry["default"] = _literal_or_text(value.args[0])
        else:
            entry["default"] = _literal_or_text(value)
        fields[name] = entry
    return fields, no_init


def _literal_or_text(node):
    value = _const(node)
    if value is None and not (isinstance(node, ast.Constant) and node.value is None):
        return {"expr": ast.unparse(node)}
    return value


def _engine_keys(root):
    """Keys create_speculative_config adds to the user's dict before building SpeculativeConfig."""
    path = os.path.join(root, _ENGINE_FILE)
    if not os.path.isfile(path):
        return set()
    tree, _source = _parse(path)
    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "create_speculative_config":
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "update":
                    for arg in call.args:
                        if isinstance(arg, ast.Dict):
                            keys.update(_const(k) for k in arg.keys if isinstance(k, ast.Constant))
    return {k for k in keys if isinstance(k, str)}


def _unknown_keys(cls, root, spec_rel):
    """'refused' when the class is a pydantic dataclass with extra='forbid', else 'ignored' (pydantic drops extras)."""
    names = [_dotted(d.func if isinstance(d, ast.Call) else d).split(".")[-1] for d in cls.decorator_list]
    if "dataclass" in names:
        for deco in cls.decorator_list:
            if isinstance(deco, ast.Call) and "forbid" in ast.unparse(deco):
                return "refused"
        return "ignored"
    if "config" in names:
        for rel in (os.path.join("vllm", "config", "utils.py"), spec_rel):
            path = os.path.join(root, rel)
            if not os.path.isfile(path):
                continue
            tree, _source = _parse(path)
            # the decorator may come with typing overloads: any definition that forbids extras decides
            defs = [ast.unparse(n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "config"]
            if defs:
                return "refused" if any(re.search(r"extra\s*=\s*['\"]forbid['\"]", d) for d in defs) else "ignored"
    return "ignored"


# --- rules inside __post_init__ (0.10-0.33) or the per-method speculator configs (0.34+) --------------------

def _is_self_attr(node, attr):
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)


def _assigned_method(body):
    """The constant the branch assigns to <obj>.method, 'keep' for a bare pass, None otherwise."""
    for stmt in body:
        if isinstance(stmt, ast.Assign) and any(_is_self_attr(t, "method") for t in stmt.targets):
            value = _const(stmt.value)
            if isinstance(value, str):
                return value
    if all(isinstance(stmt, (ast.Pass, ast.Expr)) for stmt in body):
        return "keep"
    return None


def _raises(body):
    return any(isinstance(stmt, ast.Raise) for stmt in body)


def _conditions(test, names):
    """One branch test -> list of alternatives: ["name_contains", s], ["model_type", [..]], ["architecture", s],
    ["method", [..]] (the method the user gave), ["all", [...]] or ["other", source]."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        out = []
        for value in test.values:
            out.extend(_conditions(value, names))
        return out
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [["all", [c for v in test.values for c in _conditions(v, names)]]]
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        lsrc, rsrc = ast.unparse(left), ast.unparse(right)
        if isinstance(op, ast.In) and isinstance(left, ast.Constant) and isinstance(left.value, str):
            if rsrc.endswith(".lower()"):
                return [["name_contains", left.value]]
            if rsrc.endswith("architectures"):
                return [["architecture", left.value]]
        if isinstance(op, ast.In) and isinstance(left, ast.Name) and left.id in names and rsrc.endswith("architectures"):
            return [["architecture", _const(names[left.id])]]
        if lsrc.endswith("model_type") and isinstance(op, (ast.Eq, ast.In)):
            # `in ("x")` is a plain string in vLLM's source: it is compared as the one name.
            values = [right.value] if isinstance(right, ast.Constant) and isinstance(right.value, str) else _strings(right, names)
            return [["model_type", sorted(set(values))]]
        if _is_self_attr(left, "method") and isinstance(op, (ast.Eq, ast.In)):
            values = [right.value] if isinstance(right, ast.Constant) else _strings(right, names)
            return [["method", sorted(set(values))]]
    return [["other", ast.unparse(test)]]


def _if_chain(node):
    """[(test, body), ...] of an if/elif chain, with (None, body) for a final else."""
    out = []
    while True:
        out.append((node.test, node.body))
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
            continue
        if node.orelse:
            out.append((None, node.orelse))
        return out


def _detection_chain(func, names):
    """The if/elif chain that picks the method from the draft checkpoint: the one with an `"eagle-" in ....lower()` test."""
    for node in ast.walk(func):
        if not isinstance(node, ast.If):
            continue
        chain = _if_chain(node)
        if any(test is not None and "lower()" in ast.unparse(test) for test, _body in chain) and \
                any(_assigned_method(body) == "eagle" for _test, body in chain):
            return chain
    return None


def _chain_rules(chain, names):
    rules, supported_draft = [], True
    for test, body in chain:
        method = _assigned_method(body)
        if test is None:
            # the final else: vLLM's fall-back; it raised NotImplementedError for draft models before 0.15
            if method == "draft_model" and _raises(body):
                supported_draft = False
            continue
        conds = _conditions(test, names)
        if method == "keep":
            continue  # the method the user gave is kept
        if method is None:
            continue
        rules.append({"method": method, "when": conds})
    if not any(r["method"] == "draft_model" for r in rules) and \
            not any(test is not None and _assigned_method(body) == "keep" and ["method", ["draft_model"]] in _conditions(test, names)
                    for test, body in chain):
        supported_draft = supported_draft and not any(test is None and _raises(body) for test, body in chain)
    return rules, supported_draft


def _model_defaults_chain(func, names):
    """Per method, what vLLM does when `model` is omitted: 'target' (loads the target's checkpoint), 'self' (no draft
    weights; the method's own name) or 'required' (it refuses to start)."""
    for node in ast.walk(func):
        if not (isinstance(node, ast.If) and re.search(r"\.model is None", ast.unparse(node.test))
                and "num_speculative_tokens" in ast.unparse(node.test)):
            continue
        inner = next((s for s in node.body if isinstance(s, ast.If)), None)
        out = {}
        for test, body in _if_chain(inner) if inner is not None else []:
            methods = [c[1] for c in _conditions(test, names) if c[0] == "method"] if test is not None else []
            for stmt in body if methods else []:
                if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "model" for t in stmt.targets):
                    kind = "target" if "target_model_config" in ast.unparse(stmt.value) else "self"
                    for method in methods[0]:
                        out.setdefault(method, kind)
            if methods and not any(m in out for m in methods[0]) and any(isinstance(n, ast.Raise) for n in ast.walk(ast.Module(body=body, type_ignores=[]))):
                for method in methods[0]:
                    out.setdefault(method, "required")  # vLLM refuses this method without a `model`
        out.pop("[ngram]", None)
        return out
    return {}


def _lookup_defaults(trees):
    """What vLLM puts in prompt_lookup_min/max when both are omitted, and whether one bound is copied to the other."""
    defaults, copies = {}, False
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And):
                parts = [ast.unparse(v) for v in node.test.values]
                if all(re.search(r"prompt_lookup_m(in|ax) is None$", p) for p in parts) and len(parts) == 2:
                    for stmt in node.body:
                        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
                            for target in stmt.targets:
                                if isinstance(target, ast.Attribute) and target.attr in LOOKUP_KEYS:
                                    defaults[target.attr] = stmt.value.value
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr in LOOKUP_KEYS:
                if any(isinstance(t, ast.Attribute) and t.attr in LOOKUP_KEYS and t.attr != node.value.attr for t in node.targets):
                    copies = True
    return defaults, copies


def _token_defaults(trees):
    """Where num_speculative_tokens comes from when it is omitted (names vLLM assigns it from: n_predict, block_size)."""
    out = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
                if any(isinstance(t, ast.Attribute) and t.attr == "num_speculative_tokens" for t in node.targets):
                    out.add(node.value.id)
    return sorted(out)


def _mtp_aliases(func, names, methods):
    """Methods that vLLM replaces with 'mtp' (the `*_mtp` aliases), from the `if <method> in X: method = "mtp"` test."""
    for node in ast.walk(func):
        if isinstance(node, ast.If) and _assigned_method(node.body) == "mtp":
            for cond in _conditions(node.test, names):
                sets = [cond] if cond[0] == "method" else [c for c in cond[1] if c[0] == "method"] if cond[0] == "all" else []
                for kind, values in sets:
                    if len(values) > 1:
                        return sorted(set(values) & set(methods) - {"mtp"})
    return []


# 0.34+: one SpeculatorConfig class per method, found through a registry dict and a detection order.
def _registry(root, names):
    path = os.path.join(root, _REGISTRY_DIR, "speculator_config.py")
    if not os.path.isfile(path):
        return None
    tree, _source = _parse(path)
    assigns = _module_assignments([tree])
    by_method, order = {}, _strings(assigns.get("_CHECKPOINT_DETECTION_ORDER", ast.Tuple(elts=[])), names)
    table = assigns.get("_CONFIG_BY_METHOD")
    if not isinstance(table, ast.Dict):
        return None
    for key, value in zip(table.keys, table.values):
        if isinstance(value, ast.Call) and len(value.args) == 2:
            module, cls = _const(value.args[0]), _const(value.args[1])
            by_method[_const(key)] = (os.path.join(root, _REGISTRY_DIR, *module.split(".")) + ".py", cls)
    return {"order": order, "classes": by_method, "trees": [tree]}


def _registry_class(path, name, seen=None):
    """(ClassDef, file) of `name` in `path`, following one import of it from another spec_decode module."""
    seen = seen or set()
    if (path, name) in seen or not os.path.isfile(path):
        return None, None
    seen.add((path, name))
    tree, _source = _parse(path)
    cls = _class(tree, name)
    if cls is not None:
        return cls, path
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            sub = os.path.join(_root_of(path), *node.module.split(".")) + ".py"
            return _registry_class(sub, name, seen)
    return None, None


def _root_of(path):
    parts = os.path.abspath(path).split(os.sep)
    return os.sep.join(parts[:len(parts) - 1 - parts[::-1].index("vllm")])


def _class_method(path, name, method, seen=None):
    """The classmethod `method` of class `name` (or of its first base that defines it)."""
    cls, where = _registry_class(path, name)
    if cls is None:
        return None
    func = _method(cls, method)
    if func is not None:
        return func
    for base in cls.bases:
        found = _class_method(where, _dotted(base).split(".")[-1], method)
        if found is not None:
            return found
    return None


def _registry_facts(reg, names):
    rules, model_defaults, trees = [], {}, list(reg["trees"])
    for method in reg["order"]:
        path, cls = reg["classes"][method]
        func = _class_method(path, cls, "matches")
        if func is None:
            continue
        for stmt in ast.walk(func):
            if isinstance(stmt, ast.Return) and stmt.value is not None:
                rules.append({"method": method, "when": _conditions(stmt.value, names)})
    for method, (path, cls) in sorted(reg["classes"].items()):
        if os.path.isfile(path):
            trees.append(_parse(path)[0])
        func = _class_method(path, cls, "default_model")
        if func is not None and "target_model_config" in ast.unparse(func):
            model_defaults[method] = "target"
    for dirpath, _dirs, files in os.walk(os.path.dirname(reg["classes"][reg["order"][0]][0]) if reg["order"] else ""):
        for name in files:
            if name.endswith(".py"):
                trees.append(_parse(os.path.join(dirpath, name))[0])
    return rules, "draft_model" in reg["classes"], model_defaults, trees


def _normalise_rules(rules, names):
    """Names of module-level constants (architectures) resolved; 'model_type in MTPModelTypes' kept as a list."""
    for rule in rules:
        for cond in rule["when"]:
            if cond[0] == "architecture" and not isinstance(cond[1], str):
                cond[1] = str(cond[1])
    return rules


# --- allowed values of Literal / Enum fields, the repr, the method vLLM runs (0.32+ rules) ------------------------

def _imports(tree, root):
    """alias -> (module file, name or None) for every import of a vLLM module in `tree` (also under TYPE_CHECKING)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm"):
            for alias in node.names:
                out[alias.asname or alias.name] = (_module_file(root, node.module), alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("vllm") and alias.asname:
                    out[alias.asname] = (_module_file(root, alias.name), None)
    return out


def _module_file(root, module):
    base = os.path.join(root, *module.split("."))
    return base + ".py" if os.path.isfile(base + ".py") else os.path.join(base, "__init__.py")


def _reexported_class(root, tree, name):
    """`class name` of the module a package's __init__ imports it from (``from vllm.config.load import LoadConfig``)."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            path = _module_file(root, node.module)
            if os.path.isfile(path):
                return _class(_parse(path)[0], name)
    return None


def _enum_members(tree, name):
    """The member names of `class name(Enum)` in `tree`, or None when it is no such class."""
    cls = _class(tree, name)
    if cls is None or not any(_dotted(b).split(".")[-1].endswith("Enum") for b in cls.bases):
        return None
    return [t.id for node in cls.body if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Name) and not t.id.startswith("_")]


def _before_validators(cls):
    """key -> source of its @field_validator(key, mode="before") (vLLM parses some strings there first)."""
    out = {}
    for node in cls.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and _dotted(deco.func).endswith("field_validator") and "before" in ast.unparse(deco):
                for arg in deco.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        out[arg.value] = ast.unparse(node)
    return out


def _field_values(root, spec_tree, cls, fields, names):
    """key -> {"values": [...], "open": bool, ...} for every field whose type names a Literal alias or an Enum.

    "open": the type also admits any str (``QuantizationMethods | str``), so pydantic passes other names on. An Enum
    field parsed by a before-validator that upper-cases the name (AttentionBackendEnum[value.upper()]) has
    "by_name_any_case"; the strings that validator turns into None are "none_aliases"."""
    imports = _imports(spec_tree, root)
    validators = _before_validators(cls)
    out = {}
    for key, spec in fields.items():
        if key == "method":
            continue  # the methods are the table's own list
        parts = [p.strip() for p in re.split(r"[|\[\],]", spec["type"]) if p.strip()]
        values, enum = [], None
        for part in parts:
            name = part.split(".")[-1]
            if name in names:
                values.extend(_strings(names[name], names))
                continue
            where = imports.get(part.split(".")[0]) if "." in part else imports.get(name)
            if where is None or not os.path.isfile(where[0]):
                continue
            tree = _parse(where[0])[0]
            nested = _class(tree, name) or _reexported_class(root, tree, name)
            if nested is not None and "config" in [_dotted(d).split(".")[-1] for d in nested.decorator_list]:
                # a nested vLLM config (draft_load_config: LoadConfig): pydantic builds it from a mapping of its fields
                out[key] = {"object": name, "keys": sorted(_fields(nested)[0])}
                break
            found = _strings(_module_assignments([tree]).get(name, ast.Tuple(elts=[])), _module_assignments([tree]))
            members = _enum_members(tree, name)
            if found:
                values.extend(found)
            elif members:
                values.extend(members)
                enum = name
        if not values or key in out:
            continue
        entry = {"values": sorted(set(values)), "open": "str" in parts}
        if enum:
            entry["enum"] = enum
            source = validators.get(key, "")
            entry["by_name_any_case"] = ".upper()" in source
            entry["none_aliases"] = sorted(set(re.findall(r"\.lower\(\)\s*==\s*['\"]([^'\"]+)['\"]", source)))
        out[key] = entry
    return out


def _repr_model_none(cls, names):
    """The methods SpeculativeConfig.__repr__ prints with model=None (``model = None if method in (...) else ...``)."""
    func = _method(cls, "__repr__")
    for node in ast.walk(func) if func is not None else []:
        if isinstance(node, ast.IfExp) and isinstance(node.body, ast.Constant) and node.body.value is None:
            test = node.test
            if isinstance(test, ast.Compare) and isinstance(test.ops[0], (ast.In, ast.Eq)):
                return sorted(set(_strings(test.comparators[0], names)))
    return []


def _method_from_model(post_init, names):
    """What __post_init__ makes of an omitted method from `model` before it looks at the draft: names that select a
    method (``self.model in ("ngram", "[ngram]")``) and whether a dotted class path selects custom_class
    (``SpeculativeConfig._is_custom_proposer_path``)."""
    by_name, custom_path = {}, False
    for node in ast.walk(post_init):
        if not isinstance(node, ast.If):
            continue
        for test, body in _if_chain(node):
            method = _assigned_method(body)
            if test is None or method in (None, "keep"):
                continue
            text = ast.unparse(test)
            if "_is_custom_proposer_path" in text:
                custom_path = True
            # 0.32: `if self.model in ("ngram", "[ngram]")`; 0.10-0.16 (vllm/config.py, then vllm/config/speculative.py,
            # SpeculativeConfig.__post_init__): `if self.method is None and (self.model is not None and self.model in (...))`
            for part in _and_parts(test):
                if isinstance(part, ast.Compare) and isinstance(part.ops[0], ast.In) and ast.unparse(part.left).endswith(".model"):
                    for value in _strings(part.comparators[0], names):
                        by_name.setdefault(value, method)
    return {"names": dict(sorted(by_name.items())), "custom_class_path": custom_path}


def _and_parts(test):
    """The operands of a chain of `and`s (the test itself when it is none)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [part for value in test.values for part in _and_parts(value)]
    return [test]


# The cross-field rules speculative_rules.py applies, each found by the refusal vLLM raises for it inside the
# SpeculativeConfig method named (0.32/0.33 wording; read per release: a rule is on where its message is in that method).
CODE_RULES = (
    ("synthetic_exactly_one", "_resolve_synthetic_acceptance_rates", "requires exactly one of"),
    ("synthetic_keys_need_synthetic", "_verify_args", "are only valid with rejection_sample_method"),
    ("heterogeneous_vocab_draft_model", "_verify_args", "use_heterogeneous_vocab only works with"),
    ("heterogeneous_vocab_greedy", "_verify_args", "use_heterogeneous_vocab currently only supports greedy"),
    ("heterogeneous_vocab_local_argmax", "_verify_args", "not compatible with use_local_argmax_reduction"),
    ("fly_not_extract_hidden_states", "_verify_args", "FLy is not compatible with method"),
    ("fly_min_tokens", "_verify_args", "FLy requires num_speculative_tokens"),
    ("fly_window_below_k", "_verify_args", "FLy requires fly_window_size"),
    ("k_required_without_draft_config", "_verify_args", "num_speculative_tokens must be provided with speculative model"),
    ("index_share_only_mtp", "__post_init__", "index_share_for_mtp_iteration is only supported"),
    ("adaptive_not_local_argmax", "__post_init__", "Adaptive verification estimates"),
    ("adaptive_only_dspark", "__post_init__", "Adaptive verification only supported with DSpark"),
    ("dspark_topk_only_dspark", "__post_init__", "dspark_draft_topk is only supported by DSpark"),
    ("suffix_limits", "_validate_suffix_decoding", "suffix_decoding_max_tree_depth="),
)


def _code_rules(cls, root):
    """({rule: "SpeculativeConfig.<method>"} for the CODE_RULES whose refusal this release raises in that method,
    {rule: file} for those whose message this release raises elsewhere, in code not read here: unknown, not absent)."""
    found, elsewhere = {}, {}
    for rule, func_name, message in CODE_RULES:
        func = _method(cls, func_name)
        texts = [n.value for n in ast.walk(func) if isinstance(n, ast.Constant) and isinstance(n.value, str)] if func else []
        if any(message in text for text in texts):
            found[rule] = "SpeculativeConfig.%s" % func_name
            continue
        where = _file_saying(root, message)
        if where:
            elsewhere[rule] = where  # 0.34 moved some into the per-method speculator configs (vllm/v1/worker/gpu/spec_decode/)
    return found, elsewhere


def _file_saying(root, message):
    """The first file under vllm/config, vllm/engine or the spec_decode packages whose text holds `message`."""
    first_word = message.split()[0].encode()  # a message may be split over literals that the parser joins
    for top in (os.path.join("vllm", "config"), os.path.join("vllm", "engine"), _REGISTRY_DIR, os.path.join("vllm", "v1", "spec_decode")):
        for dirpath, _dirs, files in sorted(os.walk(os.path.join(root, top))):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                if not name.endswith(".py"):
                    continue
                tree, data = _parse(path)
                if first_word in data and any(isinstance(n, ast.Constant) and isinstance(n.value, str) and message in n.value
                                              for n in ast.walk(tree)):
                    return os.path.relpath(path, root).replace(os.sep, "/")
    return None


def _detect_scope(post_init, chain, names):
    """(methods the draft-path rules never override: the chain's own `pass` branch before its first name rule,
    methods handled by the branches before the one that holds the chain)."""
    keeps = []
    for test, body in chain:
        conds = _conditions(test, names) if test is not None else []
        if any(c[0] == "name_contains" for c in conds):
            break
        if _assigned_method(body) == "keep":
            keeps.extend(v for c in conds if c[0] == "method" for v in c[1])
    first = chain[0][0]
    handled = []
    for node in ast.walk(post_init):
        if not isinstance(node, ast.If):
            continue
        outer = _if_chain(node)
        if outer[-1][0] is None and any(sub is first for stmt in outer[-1][1] for sub in ast.walk(stmt)):
            for test, _body in outer[:-1]:
                handled.extend(v for c in _conditions(test, names) if c[0] == "method" for v in c[1])
            if handled:
                break
    return sorted(set(keeps)), sorted(set(handled))


# --- one release -------------------------------------------------------------------------------------------

def read_release(src, version=None, commit=None, source=None):
    root = _root(src)
    spec_rel = _speculative_file(root)
    spec_path = os.path.join(root, spec_rel)
    spec_tree, spec_bytes = _parse(spec_path)
    found_version, found_commit = _version_info(root)
    version = version or found_version
    if not version:
        raise SourceError("no vllm/_version.py under %s: give --version" % root)
    config_trees = [spec_tree]
    config_dir = os.path.join(root, "vllm", "config")
    if os.path.isdir(config_dir):
        for name in sorted(os.listdir(config_dir)):
            if name.endswith(".py") and name != "speculative.py":
                config_trees.append(_parse(os.path.join(config_dir, name))[0])
    names = _module_assignments(config_trees)

    cls = _class(spec_tree, "SpeculativeConfig")
    if cls is None:
        raise SourceError("no class SpeculativeConfig in %s" % spec_rel)
    methods = sorted(set(_strings(names["SpeculativeMethod"], names)))
    fields, no_init = _fields(cls)
    engine = _engine_keys(root) | no_init | {n for n, f in fields.items() if _ENGINE_TYPES.search(f["type"])}
    post_init = _method(cls, "__post_init__")
    if post_init is None:
        raise SourceError("SpeculativeConfig has no __post_init__ in %s" % spec_rel)

    reg = _registry(root, names)
    if reg is not None:
        rules, draft_supported, model_defaults, rule_trees = _registry_facts(reg, names)
        detect_keeps, detect_skips = None, None  # 0.34+: each speculator config's own matches(); not read here
    else:
        chain = _detection_chain(post_init, names)
        if chain is None:
            raise SourceError("no method-detection chain in SpeculativeConfig.__post_init__ (%s)" % spec_rel)
        rules, draft_supported = _chain_rules(chain, names)
        model_defaults = _model_defaults_chain(post_init, names)
        rule_trees = []
        detect_keeps, detect_skips = _detect_scope(post_init, chain, names)
    lookup_defaults, lookup_copies = _lookup_defaults([spec_tree] + rule_trees)
    code_rules, code_rules_unread = _code_rules(cls, root)
    mtp_types = sorted(set(_strings(names["MTPModelTypes"], names))) if "MTPModelTypes" in names else \
        sorted(set(_strings(names["MTP_MODEL_TYPES"], names))) if "MTP_MODEL_TYPES" in names else []
    entry = {
        "version": version,
        # the full commit when the caller knows it; commit_id is what the release's own _version.py says (short)
        "commit": commit,
        "commit_id": found_commit if isinstance(found_commit, str) else None,
        "source": source or "vllm %s source" % version,
        "file": spec_rel.replace(os.sep, "/"),
        "sha256": hashlib.sha256(spec_bytes).hexdigest(),
        "methods": methods,
        "mtp_aliases": _mtp_aliases(post_init, names, methods),
        "mtp_model_types": mtp_types,
        "keys": {k: v for k, v in sorted(fields.items()) if k not in engine},
        "engine_keys": sorted(k for k in fields if k in engine),
        "unknown_keys": _unknown_keys(cls, root, spec_rel),
        "lookup_defaults": lookup_defaults,
        "lookup_copies_other_bound": lookup_copies,
        "num_speculative_tokens_from": _token_defaults([spec_tree] + rule_trees),
        "model_omitted": dict(sorted(model_defaults.items())),
        "draft_model_supported": draft_supported,
        "detect_rules": _normalise_rules(rules, names),
        "detect_fallback": "draft_model",
        # Added for issue #49 and read for every release since; a table without them is from an older run of this script.
        "field_values": _field_values(root, spec_tree, cls, {k: v for k, v in fields.items() if k not in engine}, names),
        "repr_model_none": _repr_model_none(cls, names),
        # 0.34+ choose the method in per-method speculator configs (their matches()), not read for this: None
        "method_from_model": _method_from_model(post_init, names) if reg is None else None,
        "detect_keeps": detect_keeps,
        "detect_skips": detect_skips,
        # the CODE_RULES this release has (absent: it does not refuse that; a table without the key was not read for
        # them), and those it raises in code this script does not read (speculative_rules treats them as unknown)
        "code_rules": code_rules,
        "code_rules_unread": code_rules_unread,
    }
    facts = command_line_facts(root)
    if facts is None:
        raise SourceError("no %s under %s" % (_ENGINE_FILE.replace(os.sep, "/"), root))
    entry.update(facts)
    if commit and not re.match(r"^[0-9a-f]{40}$", commit):
        raise SourceError("--commit %r is not 40 hex digits" % commit)
    short = (entry["commit_id"] or "").lstrip("g")
    if commit and short and not commit.startswith(short):
        raise SourceError("--commit %s is not the tree's own commit %s (vllm/_version.py)" % (commit, entry["commit_id"]))
    return entry


def minor_key(version):
    match = re.match(r"^v?(\d+)\.(\d+)", str(version))
    if not match:
        raise SourceError("%r is not a vLLM version" % version)
    return "%d.%d" % (int(match.group(1)), int(match.group(2)))


def _sort_key(minor):
    return tuple(int(p) for p in minor.split("."))


def with_diffs(releases):
    """Each release's methods and keys added and removed against the previous release in the table."""
    previous = None
    for minor in sorted(releases, key=_sort_key):
        entry = releases[minor]
        if previous is None:
            for name in ("keys_added", "keys_removed", "methods_added", "methods_removed"):
                entry[name] = []
        else:
            entry["keys_added"] = sorted(set(entry["keys"]) - set(previous["keys"]))
            entry["keys_removed"] = sorted(set(previous["keys"]) - set(entry["keys"]))
            entry["methods_added"] = sorted(set(entry["methods"]) - set(previous["methods"]))
            entry["methods_removed"] = sorted(set(previous["methods"]) - set(entry["methods"]))
        previous = entry
    return releases


HEADER = '''# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What each vLLM release's ``--speculative-config`` accepts, read from that release's own source.

GENERATED by hack/vllm_speculative_tables.py (one release per run); do not edit by hand. Facts only: method
names, key names, types as vLLM writes them, defaults, and the release and commit each entry was read from.
speculative_config.validate() reads nothing else about vLLM.
"""

from __future__ import annotations

'''


def load(path=DATA):
    if not os.path.isfile(path):
        return {}
    tree, _source = _parse(path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "RELEASES" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def write(releases, path=DATA):
    releases = with_diffs(releases)
    ordered = {k: releases[k] for k in sorted(releases, key=_sort_key)}
    body = pprint.pformat(ordered, width=150, sort_dicts=False)
    with open(path, "w") as handle:
        # The dict opens on its own line, every line indented alike: pprint's alignment then meets pep8's continuation rules.
        handle.write(HEADER + "RELEASES = (\n" + "".join("    " + line + "\n" for line in body.splitlines()) + ")\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("src", help="vLLM source tree (the directory holding vllm/)")
    parser.add_argument("--version", help="the release, when the tree has no vllm/_version.py")
    parser.add_argument("--commit", help="the commit the tree is (40 hex when known)")
    parser.add_argument("--source", help="where the tree came from, e.g. 'PyPI sdist vllm-0.33.0.tar.gz'")
    parser.add_argument("--write", action="store_true", help="merge into %s" % os.path.relpath(DATA))
    parser.add_argument("--data", default=DATA, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        entry = read_release(args.src, version=args.version, commit=args.commit, source=args.source)
    except SourceError as exc:
        print("vllm_speculative_tables: %s" % exc, file=sys.stderr)
        return 2
    if args.write:
        releases = load(args.data)
        releases[minor_key(entry["version"])] = entry
        write(releases, args.data)
        print("%s: vLLM %s (%d methods, %d keys)" % (os.path.relpath(args.data), entry["version"], len(entry["methods"]), len(entry["keys"])))
    else:
        json.dump(entry, sys.stdout, indent=1, sort_keys=True)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
