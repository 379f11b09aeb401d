# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """The request and report options spec_benchmark and spec_sweep document in the same words (their arg spec is
    module_utils/bench/run.py protocol_arg_spec; options whose meaning differs between the two stay in each module)."""

    DOCUMENTATION = r"""
options:
  temperature:
    description: Sampling temperature (the guide uses 0).
    type: float
    default: 0.0
  max_tokens:
    description: Maximum output tokens per request.
    type: int
    default: 1024
  seed:
    description: Seed sent with every request and used for the arrival times.
    type: int
    default: 0
  validate_certs:
    description: Verify TLS certificates of https endpoints.
    type: bool
    default: true
  ca_path:
    description: CA bundle for https endpoints.
    type: path
  plots:
    description: Write the PNG plots.
    type: bool
    default: true
  title:
    description: Report title.
    type: str
  progress_file:
    description: Progress log path. Defaults to C(<report_name>-progress.log) in O(report_dir).
    type: path
"""
