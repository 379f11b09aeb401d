# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Shared `attributes` blocks for the collection's modules."""

    # A module that only reads and computes: check and diff modes are trivially supported.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    description: The module never changes anything, so check mode returns the same result.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
"""

    # A module that writes to a cluster, registry or file system.
    WRITES = r"""
attributes:
  check_mode:
    support: full
    description: Computes what would change (server-side dry run where a cluster is involved) and writes nothing.
  diff_mode:
    support: full
    description: Returns C(diff) with the before and after state of what the module changes.
"""

    ACTION_GROUP = r"""
attributes:
  action_group:
    support: full
    membership:
      - alauda.spec_decoding.spec_decoding
    description: Use C(group/alauda.spec_decoding.spec_decoding) in C(module_defaults) to set cluster auth once.
"""
