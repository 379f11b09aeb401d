"""Docs check: every fenced YAML block in README.md and docs/*.md parses, every `ansible-playbook ... playbooks/X.yml`
example names an existing playbook that passes `ansible-playbook --syntax-check` with the example's inventory, and
every relative link resolves."""
from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DEFAULT_INVENTORY = "inventories/local"
# Inventories a guide's own commands write before they use them: not in the checkout, so not syntax-checked here;
# tests/unit/test_first_inventory_guide.py runs those commands (and so the playbooks with that inventory) on a clean copy.
WRITTEN_BY_GUIDE = {"inventories/first": "docs/first-inventory.md"}


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _rel(path):
    return os.path.relpath(path, ROOT)


def yaml_blocks():
    for path in DOCS:
        text = _read(path)
        for match in FENCE.finditer(text):
            if match.group(1).lower() in ("yaml", "yml"):
                line = text[:match.start()].count("\n") + 1
                yield pytest.param(path, match.group(2), id="%s:%d" % (_rel(path), line))


def playbook_examples():
    """(doc, line, inventory, playbook) for every ansible-playbook command naming playbooks/X.yml."""
    found = []
    for path in DOCS:
        text = _read(path).replace("\\\n", " ")
        for lineno, line in enumerate(text.splitlines(), 1):
            for cmd in re.findall(r"ansible-playbook\s[^`\n#]*", line):
                try:
                    words = shlex.split(cmd)
                except ValueError:
                    words = cmd.split()
                books = [w for w in words if re.match(r"^playbooks/[\w.-]+\.ya?ml$", w)]
                if not books:
                    continue
                inventory = DEFAULT_INVENTORY
                for i, word in enumerate(words):
                    if word in ("-i", "--inventory", "--inventory-file") and i + 1 < len(words):
                        inventory = words[i + 1]
                    elif word.startswith("--inventory="):
                        inventory = word.split("=", 1)[1]
                if WRITTEN_BY_GUIDE.get(inventory) != _rel(path):
                    found.append((_rel(path), lineno, inventory, books[0]))
    return found


@pytest.mark.parametrize("path, block", list(yaml_blocks()))
def test_yaml_examples_parse(path, block):
    try:
        list(yaml.safe_load_all(block))
    except yaml.YAMLError as exc:
        pytest.fail("%s: a YAML example does not parse: %s" % (_rel(path), exc))


def test_docs_exist_and_have_examples():
    names = [_rel(p) for p in DOCS]
    assert "docs/when-it-pays.md" in names and "docs/playbooks.md" in names
    examples = playbook_examples()
    books = {book for _d, _l, _i, book in examples}
    for playbook in glob.glob(os.path.join(ROOT, "playbooks", "*.yml")):
        rel = _rel(playbook)
        assert rel in books, "playbook %s has no usage example in README.md or docs/" % rel
    for rel in sorted(books):
        inventories = {inv for _d, _l, inv, book in examples if book == rel}
        cluster_books = ("playbooks/credentials.yml", "playbooks/verify.yml", "playbooks/rollback.yml", "playbooks/troubleshoot.yml",
                         "playbooks/benchmark.yml")
        if rel.startswith("playbooks/deploy") or rel in cluster_books:
            assert {"inventories/example-airgapped", "inventories/example-connected"} & inventories, \
                "%s has no example with the air-gapped or connected inventory" % rel


def _syntax_check(inventory, playbooks):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "--syntax-check", "-i", inventory] + list(playbooks)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_playbook_examples_pass_syntax_check():
    examples = playbook_examples()
    assert examples, "no ansible-playbook examples found"
    problems = []
    for doc, line, inventory, book in examples:
        if not os.path.isfile(os.path.join(ROOT, book)):
            problems.append("%s:%d names %s, which does not exist" % (doc, line, book))
        if not os.path.exists(os.path.join(ROOT, inventory)):
            problems.append("%s:%d uses inventory %s, which does not exist" % (doc, line, inventory))
    assert not problems, "\n".join(problems)
    by_inventory = {}
    for _d, _l, inv, book in examples:
        by_inventory.setdefault(inv, set()).add(book)
    failed = []
    for inv, books in sorted(by_inventory.items()):
        # one run per inventory (ansible-playbook takes several playbooks); on failure, one per playbook names the culprit
        if _syntax_check(inv, sorted(books)).returncode == 0:
            continue
        for book in sorted(books):
            res = _syntax_check(inv, [book])
            if res.returncode != 0:
                failed.append("ansible-playbook --syntax-check -i %s %s:\n%s%s" % (inv, book, res.stdout[-1500:], res.stderr[-1500:]))
    assert not failed, "\n\n".join(failed)


def test_relative_links_resolve():
    broken = []
    for path in DOCS:
        text = FENCE.sub("", _read(path))
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            local = target.split("#", 1)[0]
            if local and not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), local))):
                broken.append("%s: link to %s does not resolve" % (_rel(path), target))
    assert not broken, "\n".join(broken)


DOC_ASSIGNMENT = re.compile(r"^\s*(DOCUMENTATION|EXAMPLES|RETURN)\s*=", re.M)


def _plugin_doc_blocks():
    """(plugin file, block name, text) of every DOCUMENTATION / EXAMPLES / RETURN string in plugins/ (modules, filters,
    doc fragments): ansible-doc parses each as YAML, and a stray ``: `` in a plain line breaks it."""
    # This runs at collection, in every worker: a file that assigns no such name at the start of a line (most of
    # module_utils) is not parsed, and only module and class bodies are read (where these strings live), not every node
    # (parsing and walking all of plugins/ took 3.6 s a worker).
    import ast  # pylint: disable=import-outside-toplevel
    for path in sorted(glob.glob(os.path.join(ROOT, "plugins", "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
        if "fragments" not in path and not DOC_ASSIGNMENT.search(source):
            continue
        tree = ast.parse(source, path)
        bodies = [tree.body] + [node.body for node in tree.body if isinstance(node, ast.ClassDef)]
        for node in (statement for body in bodies for statement in body):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN") or \
                            isinstance(target, ast.Name) and target.id.isupper() and "fragments" in path:
                        yield _rel(path), target.id, node.value.value


@pytest.mark.parametrize("path, name, text", list(_plugin_doc_blocks()))
def test_plugin_documentation_is_yaml(path, name, text):
    """Cheaper than ansible-doc over the built collection (the build tier and sanity do that), and it fails here, first."""
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as exc:
        pytest.fail("%s %s does not parse as YAML (ansible-doc fails on it): %s" % (path, name, exc))
