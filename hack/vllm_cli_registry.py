# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Take the option table of an installed vLLM's ``vllm serve`` parser as data, for plugins/module_utils/vllm/cli_parser.py.

    VENV/bin/python hack/vllm_cli_registry.py            print the release's entry as JSON
    VENV/bin/python hack/vllm_cli_registry.py --write    merge it into plugins/module_utils/vllm/cli_registry_releases.py

Run it with the python of a venv where vLLM is installed (the e2e tier's: ``python -m tests.e2e.vllm_install`` prints
it). It builds the parser exactly as ``vllm serve`` does (vLLM's ``vllm/entrypoints/cli/main.py``: a
FlexibleArgumentParser whose ``serve`` subparser comes from ``ServeSubcommand.subparser_init``, which adds the
``model_tag`` positional and calls ``make_arg_parser``, in 0.32 in ``vllm/entrypoints/launchers/cli_args.py``; the
deprecated ``python -m vllm.entrypoints.openai.api_server`` builds the same parser) and records, per
argparse action: dest, nargs (None: one value, 0: none) and option strings; the parser's allow_abbrev, whether it has
negative-number-like options, the Python that runs it (argparse's abbreviation rule is Python's), and which dests set
speculative decoding (``--speculative-config`` and the ``--spec-*`` shorthand flags whose kwargs come from
SpeculativeConfig). Only 0.32 has been taken so far; other releases are read with the newest table.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "plugins", "module_utils", "vllm", "cli_registry_releases.py")

HEADER = '''# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The option table of vLLM's ``vllm serve`` parser per release, as data: written by hack/vllm_cli_registry.py from the
installed vLLM's own parser (``make_arg_parser``, in 0.32 ``vllm/entrypoints/launchers/cli_args.py``, under the
``serve`` subcommand); do not edit by hand. ``options``: ``(dest, nargs, option strings)`` per argparse action (nargs None: one
value; 0: none). Read by vllm/cli_parser.py.
"""

from __future__ import annotations

'''


def serve_parser():
    """The ``serve`` subparser, built as vLLM's CLI builds it."""
    from vllm.entrypoints.cli.serve import ServeSubcommand  # pylint: disable=import-error,import-outside-toplevel
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # pylint: disable=import-error,import-outside-toplevel
    top = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    return ServeSubcommand().subparser_init(subparsers)


def entry():
    import vllm  # pylint: disable=import-error,import-outside-toplevel
    from vllm.config.speculative import SpeculativeConfig  # pylint: disable=import-error,import-outside-toplevel
    parser = serve_parser()
    fields = set(getattr(SpeculativeConfig, "__dataclass_fields__", {}))
    options, positionals, speculative = [], [], set()
    for action in parser._actions:  # pylint: disable=protected-access
        nargs = action.nargs  # argparse gives store_true/const/help/version actions nargs 0; None is one value
        if not action.option_strings:
            positionals.append((action.dest, nargs))
            continue
        options.append((action.dest, nargs, tuple(action.option_strings)))
        if action.dest == "speculative_config" or (action.dest.startswith("spec_") and any(
                name.startswith("--spec-") for name in action.option_strings) and fields):
            speculative.add(action.dest)
    version = vllm.__version__
    return "%d.%d" % tuple(int(p) for p in version.split(".")[:2]), {
        "vllm": version,
        "python": platform.python_version(),
        "allow_abbrev": bool(parser.allow_abbrev),
        "negative_number_optionals": bool(parser._has_negative_number_optionals),  # pylint: disable=protected-access
        "speculative_dests": tuple(sorted(speculative)),
        "positionals": tuple(positionals),
        "options": tuple(options),
    }


def _read():
    if not os.path.exists(DATA):
        return {}
    with open(DATA, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["RELEASES"]:
            return ast.literal_eval(node.value)
    return {}


def _render(releases):
    newest = max(releases, key=lambda r: tuple(int(p) for p in r.split(".")))
    lines = [HEADER, "DEFAULT_RELEASE = %r\n" % newest, "RELEASES = {"]
    for release in sorted(releases, key=lambda r: tuple(int(p) for p in r.split("."))):
        table = releases[release]
        lines.append("    %r: {" % release)
        for key in ("vllm", "python", "allow_abbrev", "negative_number_optionals", "speculative_dests", "positionals"):
            lines.append("        %r: %r," % (key, table[key]))
        lines.append("        'options': (")
        for option in table["options"]:
            lines.append("            %r," % (tuple(option),))
        lines.append("        ),")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--write", action="store_true", help="merge the entry into %s" % os.path.relpath(DATA))
    args = cli.parse_args()
    release, table = entry()
    if not args.write:
        print(json.dumps({release: table}, indent=1))
        return 0
    releases = _read()
    releases[release] = table
    with open(DATA, "w", encoding="utf-8") as handle:
        handle.write(_render(releases))
    print("wrote %s: vLLM %s, %d options" % (DATA, table["vllm"], len(table["options"])), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
