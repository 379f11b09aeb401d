# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one patch writer: every JSON patch (and JSON merge patch) the collection sends goes through ``json_patch`` /
``merge_patch`` here, under a named field manager, as a server-side dry run in check mode; the server-side apply is
``kube/apply.py`` (kubernetes.core's own code). Also the JSON-pointer reading the patches are planned and checked with
(``escape_pointer``, ``apply_patch``, ``tests_hold``).

Why one place: the rollback, the draft removal, the LLMInferenceService strip and the GitOps pause each wrote the same
request with its own conflict rule, one of them without the fallback older kubernetes clients need. Here the request is
``kube.client.request`` by path (no typed API class: it works with the generated client before and after its 2024
rewrite, so no content-type fallback is needed), and a refusal because the object changed since it was read (HTTP 409,
or a 422 whose ``test`` op no longer holds on a fresh read) is one exception, ``PatchConflict``: the patch is all or
nothing, so nothing was written, and the caller re-plans or says so.
"""

from __future__ import annotations

import copy

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ConflictError, SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.ssa_conflicts import ROLLBACK_FIELD_MANAGER

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


# ----------------------------------------------------------------------------------------------------
# JSON pointers and patches (RFC 6901 / RFC 6902), as far as the collection's patches use them


def escape_pointer(token):
    """Escape one JSON-pointer reference token (RFC 6901)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def apply_patch(obj, ops):
    """Apply a JSON patch (test, add, replace, remove) to a copy of ``obj`` (for diffs, plans and tests)."""
    doc = copy.deepcopy(obj)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        key = int(last) if isinstance(parent, list) else last
        if op["op"] == "test":
            if parent[key] != op["value"]:
                raise ValueError("test failed at %s" % op["path"])
        elif op["op"] in ("add", "replace"):
            parent[key] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[key]
    return doc


def tests_hold(obj, ops):
    """True when every ``test`` op of ``ops`` holds on ``obj`` (a missing path does not hold)."""
    for op in ops:
        if op.get("op") != "test":
            continue
        try:
            apply_patch(obj, [op])
        except (ValueError, KeyError, IndexError, TypeError):
            return False
    return True


# ----------------------------------------------------------------------------------------------------
# The writes


def object_path(group, version, plural, name=None, namespace=None):
    """The API path of a resource (``group`` "" for the core API), its collection without ``name``; cluster-scoped
    without ``namespace``."""
    path = "/api/%s" % version if not group else "/apis/%s/%s" % (group, version)
    if namespace:
        path += "/namespaces/%s" % namespace
    path += "/" + plural
    return path + ("/" + name if name else "")


class PatchConflict(ConflictError):
    """The API server refused the patch because the object changed since it was read: nothing was written.
    ``api_error`` is the client's ApiException."""

    def __init__(self, api_error):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.pods import api_error_message  # pylint: disable=import-outside-toplevel
        super().__init__("the object changed between read and write; nothing was written (%s)" % api_error_message(api_error),
                         hint="run again: it plans on the fresh object")
        self.api_error = api_error
        self.status = getattr(api_error, "status", None)


def refused_by_a_test(api_error, ops, read=None):
    """True when ``api_error`` means the object changed since the patch was planned: a 409, or a 422 on a patch with
    ``test`` ops whose tested values no longer hold on a fresh ``read()`` (gone or unreadable counts as changed). The
    API server words a failed test differently across versions (some only "the server rejected our request due to an
    error in our request"), so the object itself is the judge; without ``read`` the answer's text is."""
    status = getattr(api_error, "status", None)
    if status == 409:
        return True
    if status != 422 or not any(op.get("op") == "test" for op in ops):
        return False
    if read is None:
        body = getattr(api_error, "body", None)
        return "test" in (body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or ""))
    try:
        fresh = read()
    except SpecDecodingError:
        return True
    return fresh is None or not tests_hold(fresh, ops)


def json_patch(api_client, path, ops, field_manager=ROLLBACK_FIELD_MANAGER, dry_run=False, read=None):
    """Send ``ops`` (a JSON patch) to the object at ``path`` as ``field_manager`` (a later server-side apply that
    conflicts with this edit then names it: kube/ssa_conflicts.py), a server-side dry run when ``dry_run``; the object
    as the API server answered. Raises ``PatchConflict`` when the object changed since it was read (``read()`` gives
    it afresh, see refused_by_a_test), the client's ApiException for any other refusal (the caller says what it was
    writing)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException, request  # pylint: disable=import-outside-toplevel
    query = {"fieldManager": field_manager, "dryRun": "All" if dry_run else None}
    try:
        return request(api_client, "PATCH", path, query=query, body=ops, content_type=JSON_PATCH)
    except ApiException as exc:
        if refused_by_a_test(exc, ops, read):
            raise PatchConflict(exc) from exc
        raise


def merge_patch(api_client, path, body, field_manager=None, dry_run=False):
    """Send ``body`` as a JSON merge patch (RFC 7386) to the object at ``path``; the object as answered. A merge patch has
    no ``test``, so nothing is a conflict: the client's ApiException for any refusal."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
    query = {"fieldManager": field_manager, "dryRun": "All" if dry_run else None}
    return request(api_client, "PATCH", path, query=query, body=body, content_type=MERGE_PATCH)


def create(api_client, path, body, field_manager=ROLLBACK_FIELD_MANAGER, dry_run=False):
    """POST ``body`` to the collection at ``path`` as ``field_manager`` (a server-side dry run when ``dry_run``); the
    object as created. The client's ApiException for any refusal (409: it exists)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import request  # pylint: disable=import-outside-toplevel
    query = {"fieldManager": field_manager, "dryRun": "All" if dry_run else None}
    return request(api_client, "POST", path, query=query, body=body)
