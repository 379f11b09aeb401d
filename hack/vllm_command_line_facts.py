# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one vLLM release's ``vllm/engine/arg_utils.py`` does with the command line's speculative settings, read with
``ast`` (vLLM is never imported). Part of hack/vllm_speculative_tables.py, which writes these facts into each release's
table:

``hyphen_keys``: ``EngineArgs.create_speculative_config`` rewrites the keys of the ``--speculative-config`` dict with
``k.replace("-", "_")`` (a dict comprehension over ``....speculative_config.items()``); without it a hyphenated key
reaches SpeculativeConfig as written, where it is an unknown key.

``shorthand_flags``: flag -> key, for the ``add_argument`` calls in ``add_cli_args`` whose kwargs are
``get_kwargs(SpeculativeConfig)[key]`` (``--spec-method``, ``--spec-model``, ``--spec-tokens``).
"""

from __future__ import annotations

import ast
import hashlib
import os

ENGINE_FILE = os.path.join("vllm", "engine", "arg_utils.py")


def _text(node):
    """The string a constant node holds, else None."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _rewrites_hyphens(node):
    """``{<k>.replace("-", "_"): v for k, v in ....speculative_config.items()}``."""
    key = node.key if isinstance(node, ast.DictComp) else None
    return isinstance(key, ast.Call) and isinstance(key.func, ast.Attribute) and key.func.attr == "replace" \
        and [_text(a) for a in key.args] == ["-", "_"] \
        and any(ast.unparse(gen.iter).endswith("speculative_config.items()") for gen in node.generators)


def _shorthand_flags(func):
    """flag -> key of the add_argument calls in `func` that take SpeculativeConfig's kwargs for one key."""
    from_spec = {target.id for node in ast.walk(func) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                 and ast.unparse(node.value.func).endswith("get_kwargs") and node.value.args
                 and ast.unparse(node.value.args[0]) == "SpeculativeConfig"
                 for target in node.targets if isinstance(target, ast.Name)}
    flags = {}
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        names = [_text(a) for a in node.args if (_text(a) or "").startswith("--")]
        for kw in node.keywords:
            value = kw.value
            if kw.arg is None and isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) \
                    and value.value.id in from_spec and _text(value.slice):
                flags.update((name, _text(value.slice)) for name in names)
    return flags


def command_line_facts(root):
    """The facts of the release whose source is under `root` (the directory holding vllm/); None without the file."""
    path = os.path.join(root, ENGINE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as handle:
        source = handle.read()
    hyphens, flags = False, {}
    for func in ast.walk(ast.parse(source, filename=path)):
        if isinstance(func, ast.FunctionDef) and func.name == "create_speculative_config":
            hyphens = hyphens or any(_rewrites_hyphens(node) for node in ast.walk(func))
        if isinstance(func, ast.FunctionDef) and func.name == "add_cli_args":
            flags.update(_shorthand_flags(func))
    return {"engine_file": ENGINE_FILE.replace(os.sep, "/"), "engine_sha256": hashlib.sha256(source).hexdigest(),
            "hyphen_keys": hyphens, "shorthand_flags": dict(sorted(flags.items()))}
