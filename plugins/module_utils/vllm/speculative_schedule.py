# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``num_speculative_tokens_per_batch_size``: the k vLLM drafts at each batch size (its "dynamic speculative decoding").

Which releases have the key is data (speculative_releases.RELEASES, read from each release's source; first in
0.24). What a schedule must look like is vLLM's ``validate_and_normalize_dynamic_sd_schedule`` and what it means
is ``build_dynamic_sd_schedule_lookup`` (``vllm/v1/spec_decode/dynamic/utils.py``, byte-identical from 0.24.0 to
0.34.0); the rules below say the same in this collection's words and are pinned by vLLM's own test vectors
(tests/fixtures/vllm/dynamic_sd_schedule.json). vLLM only checks a schedule when the scheduler is built, so a bad
one is a server that does not start: refused here before a rollout.

A schedule is a list of ``[range_start, range_end, k]`` with inclusive batch-size ranges: the first starts at 1,
ranges do not overlap, ``k >= 0`` (0 = no drafts at that batch size). A gap between ranges and the batch sizes
after the last range keep the previous k; every k is capped at ``num_speculative_tokens``.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command

KEY = "num_speculative_tokens_per_batch_size"
EXAMPLE = "[[1, 8, 3], [9, 32, 2], [33, 256, 1]]"
# vLLM 0.32.0 ``VllmConfig._maybe_disable_dynamic_sd_for_data_parallel`` (vllm/config/vllm.py): with a data-parallel size
# above 1 the engine drops the schedule ("Dynamic speculative decoding is not supported with data parallelism ...
# Disabling num_speculative_tokens_per_batch_size and falling back to static num_speculative_tokens") and runs the fixed k.
DATA_PARALLEL_FLAGS = ("--data-parallel-size", "-dp")


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def normalise(schedule, field=KEY):
    """The schedule as sorted ``[[start, end, k], ...]``, or a ValidationError naming the entry and the fix."""
    if not isinstance(schedule, (list, tuple)):
        raise ValidationError("must be a list of [range_start, range_end, num_speculative_tokens] entries, got %s"
                              % type(schedule).__name__, field=field, hint="write it as vLLM does, e.g. %s" % EXAMPLE)
    if not schedule:
        # Refused although vLLM 0.32 builds its engine config with []: its scheduler then drafts the fixed k, but the GPU
        # model runner V2 (vllm/v1/worker/gpu/cudagraph_utils.py) calls build_dynamic_sd_schedule_lookup, which raises.
        raise ValidationError("is empty (vLLM: 'must not be empty' where its GPU model runner reads the schedule; elsewhere "
                              "it drafts the fixed num_speculative_tokens)", field=field,
                              hint="give at least [[1, <largest batch size>, k]], or drop the key for a fixed k")
    entries = []
    for index, entry in enumerate(schedule):
        where = "%s[%d]" % (field, index)
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise ValidationError("is %r, not a 3-item [range_start, range_end, num_speculative_tokens] (vLLM: 'must be a "
                                  "3-item sequence')" % (entry,), field=where, hint="e.g. [1, 8, 3]: batch sizes 1 to 8 draft 3 tokens")
        if not all(_whole(v) for v in entry):
            raise ValidationError("is %r: every item must be a whole number" % (list(entry),), field=where,
                                  hint="write bare numbers, e.g. [1, 8, 3]")
        start, end, k = entry
        if start <= 0 or end <= 0:
            raise ValidationError("batch-size range (%d, %d) is not positive" % (start, end), field=where,
                                  hint="batch sizes count requests: start at 1")
        if start > end:
            raise ValidationError("range start %d is above its end %d" % (start, end), field=where, hint="write [%d, %d, %d]" % (end, start, k))
        if k < 0:
            raise ValidationError("num_speculative_tokens %d is negative (vLLM: 'values must be >= 0')" % k, field=where,
                                  hint="use 0 to stop drafting at these batch sizes")
        entries.append([start, end, k])
    entries.sort(key=lambda e: e[0])
    for before, after in zip(entries, entries[1:]):
        if after[0] <= before[1]:
            raise ValidationError("ranges %s and %s overlap (vLLM: 'Batch-size ranges must be non-overlapping and sorted')"
                                  % (before, after), field=field, hint="start the second range at %d" % (before[1] + 1))
    if entries[0][0] != 1:
        raise ValidationError("the first range starts at %d; vLLM needs it to start at 1 so every batch size has a k "
                              "('must start at 1')" % entries[0][0], field=field,
                              hint="begin with [1, %d, k]" % (entries[0][0] - 1) if entries[0][0] > 1 else "begin at 1")
    return entries


def check(schedule, num_speculative_tokens, field=KEY):
    """``(entries, warnings)``: ``normalise`` plus what vLLM does without a word (caps a k above the deployed
    ``num_speculative_tokens``)."""
    entries = normalise(schedule, field)
    warnings = []
    if _whole(num_speculative_tokens):
        above = [e for e in entries if e[2] > num_speculative_tokens]
        if above:
            warnings.append("%s: %s ask for more than num_speculative_tokens=%d; vLLM caps them at %d without a word, so "
                            "write %d there (or raise num_speculative_tokens)" % (
                                field, ", ".join(str(e) for e in above), num_speculative_tokens, num_speculative_tokens,
                                num_speculative_tokens))
    return entries, warnings


def data_parallel_warning(config, command=None, data_parallel_size=None, field=KEY):
    """The warning for a schedule vLLM will drop because the server runs data-parallel, else None: the larger of
    ``--data-parallel-size`` / ``-dp`` in ``command`` (argv list or shell line) and ``data_parallel_size``, above 1."""
    if not isinstance(config, dict) or config.get(KEY) is None:
        return None
    flag = vllm_command.option_value(command, DATA_PARALLEL_FLAGS) if command else None
    sizes = [int(v) for v in (data_parallel_size, flag) if v is not None and str(v).isdigit()]
    size = max(sizes) if sizes else 1
    if size <= 1:
        return None
    return ("%s: the server runs data-parallel size %d, and vLLM (0.32) then disables the schedule at start-up ('Dynamic "
            "speculative decoding is not supported with data parallelism') and drafts a fixed num_speculative_tokens=%s: drop the "
            "schedule, or serve one data-parallel rank per replica" % (field, size, config.get("num_speculative_tokens")))


def k_at(schedule, batch_size, num_speculative_tokens):
    """The k vLLM drafts at ``batch_size`` under ``schedule`` (a gap or the tail keeps the previous k; capped at
    ``num_speculative_tokens``)."""
    entries = normalise(schedule)
    k = entries[0][2]
    for start, _end, value in entries:
        if start > batch_size:
            break
        k = value
    return min(k, num_speculative_tokens)


def describe(schedule):
    """``"1-8: k=3; 9-32: k=2; 33+: k=1"``: the batch sizes each k really covers (a gap keeps the previous k, the
    last k holds beyond its range, as in vLLM)."""
    entries = normalise(schedule)
    parts = []
    for index, (start, _end, k) in enumerate(entries):
        if index == len(entries) - 1:
            span = "%d+" % start
        else:
            stop = entries[index + 1][0] - 1
            span = "%d" % start if start == stop else "%d-%d" % (start, stop)
        parts.append("%s: k=%d" % (span, k))
    return "; ".join(parts)
