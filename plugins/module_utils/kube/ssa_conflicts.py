# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Read the field managers out of a server-side apply conflict message.

The API server answers a conflicting apply with HTTP 409 and
``Apply failed with N conflict(s): conflict(s) with "<manager>" [using <apiVersion>]: <fields>``.
kubernetes.core passes that body on inside its failure message, JSON- or bytes-escaped, so quotes may be
preceded by backslashes. The deploy uses the manager names to decide whether it may take fields back:
only from the collection's own rollback, never silently from a person's or another tool's edit.
"""

from __future__ import annotations

import re

# The rollback/roll-forward patches (isvc_speculative) are Update operations under this manager.
ROLLBACK_FIELD_MANAGER = "alauda-spec-decoding-rollback"

# The API server quotes the manager twice (printManager's %q inside %q), e.g.
# conflict with "\"alauda-spec-decoding-rollback\" using serving.kserve.io/v1beta1", and JSON/bytes reprs add escapes.
_CONFLICT = re.compile(r'conflicts? with (?:\\*")+(?P<manager>[^"\\]+)')


def conflict_managers(message):
    """Field managers named in a server-side apply conflict message, in order, without repeats.

    Returns [] when the message is not a conflict (any other failure).
    """
    text = message if isinstance(message, str) else str(message or "")
    if "conflict" not in text:
        return []
    seen = []
    for match in _CONFLICT.finditer(text):
        manager = match.group("manager")
        if manager not in seen:
            seen.append(manager)
    return seen
