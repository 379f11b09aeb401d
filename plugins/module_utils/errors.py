# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Exceptions shared by the collection's plain-Python logic.

Every message names the offending field and says how to fix it, so modules and filters can pass it
to the user unchanged.
"""

from __future__ import annotations

import importlib


class SpecDecodingError(Exception):
    """Base class: invalid input or a failed operation, with a user-facing message."""

    def __init__(self, message, field=None, hint=None):
        self.field = field
        self.hint = hint
        text = message
        if field and not message.startswith(field + ":"):
            text = "%s: %s" % (field, message)
        if hint:
            text = "%s. Fix: %s" % (text.rstrip("."), hint)
        super().__init__(text)
        self.message = text

    def result(self):
        """A failed task's keys: the message (it already names the field and says the fix), ``field``, ``fix`` (when
        the error has one) and ``changed=False``."""
        out = {"msg": str(self), "field": self.field, "changed": False}
        if self.hint:
            out["fix"] = self.hint
        return out


class ValidationError(SpecDecodingError):
    """The input is wrong; nothing was written anywhere."""


class ConflictError(SpecDecodingError):
    """Someone else changed the object between our read and our write."""


def optional_import(name):
    """``(module, None)``, or ``(None, the ImportError)`` when the library ``name`` (e.g. ``"yaml"``) is not installed.

    The one optional import of module_utils: a file that needs a third-party library only in some calls imports it
    with this, keeps working without it, and the module that needs it reports the missing library (``HAS_<LIB>``,
    ``missing_required_lib``) instead of failing at import. Standard library only, as the rest of this file: the zip
    applications (the load Job's, the stager's) ship it."""
    try:
        return importlib.import_module(name), None
    except ImportError as exc:
        return None, exc
