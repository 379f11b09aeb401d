# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stager's entry point: ``python3 artifact_sync.pyz ...`` (the zip's own ``__main__`` runs this module) and
``python3 -m module_utils.artifacts.artifact_sync ...`` from ``plugins/`` (the controller's file server).

``remove ...`` runs the draft remover (``remove.remove_subdir_main``), anything else the stager (``cli.main``).
"""

from __future__ import annotations

import sys

from .cli import main
from .remove import remove_subdir_main

REMOVE = "remove"


def run(argv):
    """The exit code of one command line (without the program name)."""
    if argv[:1] == [REMOVE]:
        return remove_subdir_main(argv[1:])
    return main(argv)


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
