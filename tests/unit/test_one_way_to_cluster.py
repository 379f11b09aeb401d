"""One way to the cluster (issue #46): the cluster service (kube/service.py) is the only place in module_utils that builds
an API client or stands for the cluster, and kube/writer.py the only one that sends a patch.

Every file under plugins/module_utils/ is read with ast (docstrings and comments that name the classes do not count):
- a call of ``ApiClient``, ``CoreV1Api``, ``CustomObjectsApi``, ``BatchV1Api``, ``AppsV1Api``, ``DynamicClient``, or any use
  of ``new_client_from_config``, outside the files of BUILDS_CLIENTS;
- a class whose name ends in ``Cluster`` (one that stands for the cluster beside the service);
- a PATCH request (``request(..., "PATCH", ...)``) or a patch content type passed to a call, outside kube/writer.py.
An allow-list entry whose hit is gone fails the test too, so the lists say what is true.
"""

from __future__ import annotations

import ast
import os

from tests.paths import REPO

MODULE_UTILS = os.path.join(REPO, "plugins", "module_utils")

CLIENT_CLASSES = ("ApiClient", "CoreV1Api", "CustomObjectsApi", "BatchV1Api", "AppsV1Api", "DynamicClient")
CLIENT_FACTORIES = ("new_client_from_config",)
PATCH_CONTENT_TYPES = ("application/merge-patch+json", "application/json-patch+json", "application/strategic-merge-patch+json")

# module_utils files that may build an API client: the service and the files it is made of. kube/client.py hands the
# typed classes out by name (``__getattr__``), kube/pods.py answers the service's pod reads, and kube/wait.py (the
# service's wait_for) watches with kubernetes' ``watch.Watch().stream``, which takes a typed API's list function.
BUILDS_CLIENTS = {"kube/service.py", "kube/client.py", "kube/pods.py", "kube/wait.py"}
# The one patch writer.
WRITES_PATCHES = {"kube/writer.py"}

# Known hits still to remove, (file, what) -> why, e.g. ("ops/rollback.py", "class Cluster"): "#46: ...". Each is a
# debt with its issue, not a pattern; none is left.
ALLOWED = {}


def _name(node):
    """The called name of a call's function: ``f`` for ``f(...)`` and ``x.y.f(...)``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def hits(rel, source):
    """``[(line, what)]``: what in one module_utils file (``rel``, relative to module_utils/) goes to the cluster another way."""
    tree = ast.parse(source, rel)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name.endswith("Cluster"):
            found.append((node.lineno, "class %s" % node.name))
        elif isinstance(node, (ast.Name, ast.Attribute)) and _name(node) in CLIENT_FACTORIES and rel not in BUILDS_CLIENTS:
            found.append((node.lineno, _name(node)))
        elif isinstance(node, ast.Call):
            called = _name(node.func)
            if called in CLIENT_CLASSES and rel not in BUILDS_CLIENTS:
                found.append((node.lineno, "%s()" % called))
            if rel in WRITES_PATCHES:
                continue
            values = list(node.args) + [keyword.value for keyword in node.keywords]
            constants = [value.value for value in values if isinstance(value, ast.Constant) and isinstance(value.value, str)]
            if called == "request" and "PATCH" in constants:
                found.append((node.lineno, "a PATCH request"))
            found.extend((node.lineno, "a patch content type (%s)" % value) for value in constants if value in PATCH_CONTENT_TYPES)
    return sorted(found)


def _module_utils_files():
    for dirpath, dirnames, filenames in os.walk(MODULE_UTILS):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, MODULE_UTILS).replace(os.sep, "/"), path


def _all_hits():
    out = {}
    for rel, path in _module_utils_files():
        with open(path, encoding="utf-8") as fh:
            for line, what in hits(rel, fh.read()):
                out.setdefault((rel, what), []).append(line)
    return out


def test_only_the_cluster_service_builds_clients_stands_for_the_cluster_and_writes_patches():
    found = _all_hits()
    problems = ["module_utils/%s:%s %s" % (rel, ",".join(map(str, lines)), what) for (rel, what), lines in sorted(found.items())
                if (rel, what) not in ALLOWED and not (rel == "kube/service.py" and what == "class ClusterService")]
    assert not problems, ("these reach the cluster another way than the cluster service (kube/service.ClusterService: its "
                          "reads, its patch writer kube/writer.py, its wait_for; add a typed read to it if one is missing):\n"
                          + "\n".join(problems))


def test_the_allowed_hits_are_still_there():
    found = _all_hits()
    for key, why in ALLOWED.items():
        assert key in found, "ALLOWED lists %s (%s), which is gone: remove the entry" % (key, why)


def test_the_check_catches_each_way_around_the_service():
    source = ("from kubernetes import client, config\n"
              "class DraftCluster:\n"
              "    def __init__(self, api_client):\n"
              "        self.core = client.CoreV1Api(api_client)\n"
              "        self.other = config.new_client_from_config()\n"
              "def patch(api_client, path, body):\n"
              "    return request(api_client, 'PATCH', path, body=body, content_type='application/merge-patch+json')\n"
              '"""Docstrings may name CustomObjectsApi(api_client) and application/json-patch+json."""\n')
    assert hits("ops/bad.py", source) == [
        (2, "class DraftCluster"), (4, "CoreV1Api()"), (5, "new_client_from_config"), (7, "a PATCH request"),
        (7, "a patch content type (application/merge-patch+json)"),
    ]
    # the service may build the client; only the writer may patch
    assert hits("kube/service.py", source) == [(2, "class DraftCluster"), (7, "a PATCH request"),
                                               (7, "a patch content type (application/merge-patch+json)")]
    assert hits("kube/writer.py", source) == [(2, "class DraftCluster"), (4, "CoreV1Api()"), (5, "new_client_from_config")]
