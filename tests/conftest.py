"""Make `ansible_collections.alauda.spec_decoding` importable when pytest runs from the checkout.

`make setup` links the checkout into .build/collections; this falls back to creating that link so a
plain `pytest tests/unit` works too.
"""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_COLLECTIONS = os.path.join(_ROOT, ".build", "collections")
_LINK = os.path.join(_COLLECTIONS, "ansible_collections", "alauda", "spec_decoding")

if not os.path.exists(_LINK):
    os.makedirs(os.path.dirname(_LINK), exist_ok=True)
    os.symlink(_ROOT, _LINK)
if _COLLECTIONS not in sys.path:
    sys.path.insert(0, _COLLECTIONS)
