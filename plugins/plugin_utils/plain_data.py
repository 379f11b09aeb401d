# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filters' side of plain data: :func:`plain_arguments` converts a filter's arguments once, at the boundary.

Why: ansible-core 2.19 passes a filter its variables as lazy template containers whose deep copies copy their templating
context (module_utils/kube/plain_data.py says what that cost); :func:`plain` itself lives there, so module_utils code
uses the same conversion.
"""

from __future__ import annotations

import functools

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.plain_data import plain

__all__ = ("plain", "plain_arguments")


def plain_arguments(func):
    """``func`` called with its positional and keyword arguments made :func:`plain`."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*[plain(a) for a in args], **{k: plain(v) for k, v in kwargs.items()})
    return wrapper
