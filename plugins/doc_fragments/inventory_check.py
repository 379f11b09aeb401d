# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """The options of the inventory check, shared by the filter and the lookup C(inventory_problems) (one function,
    filter/inventory_problems.py)."""

    DOCUMENTATION = r"""
options:
  method:
    description: The speculative method the playbook sets itself (C(deploy-eagle3.yml) sets V(eagle3)); empty reads C(spec_decoding_method).
    type: str
    default: ""
  method_source:
    description: What set O(method), named in the messages (for example C(playbooks/deploy-eagle3.yml)).
    type: str
    default: ""
  roles:
    description:
      - The roles the play runs (C(ansible_play_role_names)). Values are checked against those roles' argument specs only,
        since one inventory variable may feed roles that allow different values. Omitted, against every role's.
    type: list
    elements: str
"""
