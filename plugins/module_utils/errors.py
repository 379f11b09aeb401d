# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Exceptions shared by the collection's plain-Python logic.

Every message names the offending field and says how to fix it, so modules and filters can pass it
to the user unchanged.
"""

from __future__ import annotations


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
