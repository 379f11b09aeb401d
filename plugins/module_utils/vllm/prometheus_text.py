# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one reader of Prometheus text exposition (vLLM's ``/metrics`` page).

Callers name the metric families they want by name prefix; only those lines reach prometheus_client's
parser (a /metrics page has hundreds of histogram lines nobody here reads)::

    for sample in parse_samples(text, ("prefix_cache_", "gpu_prefix_cache_")):
        sample.name, sample.labels, sample.value

A prefix is matched against the metric name without its namespace, the part up to the last ``:``
(``vllm:prefix_cache_hits_total`` -> ``prefix_cache_hits_total``), so ``prefix_cache_`` does not select
``vllm:external_prefix_cache_hits_total``. Names without a ``:`` are matched whole.

Plain Python, no Ansible imports; ``prometheus_client`` is imported guardedly and its absence is reported
by the calling module (``missing_required_lib("prometheus_client")`` when ``HAS_PROMETHEUS_CLIENT`` is false).
"""

from __future__ import annotations

import math
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

try:
    from prometheus_client.parser import text_string_to_metric_families
    HAS_PROMETHEUS_CLIENT = True
    PROMETHEUS_IMPORT_ERROR = None
except ImportError as _exc:  # pragma: no cover - exercised by the sanity import test
    text_string_to_metric_families = None
    HAS_PROMETHEUS_CLIENT = False
    PROMETHEUS_IMPORT_ERROR = _exc

_SAMPLE_NAME_RE = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")


def _wanted(name, prefixes):
    return name.rpartition(":")[2].startswith(prefixes)


def filter_lines(text, prefixes):
    """The exposition lines (samples and their ``# HELP`` / ``# TYPE`` lines) of the metrics named by ``prefixes``.

    ``text`` is str or bytes; ``prefixes`` a tuple of name prefixes (see the module docstring). Returns the
    kept lines, newline-terminated, or ``""``. A line is kept by its metric name, not by words in a help
    text or a label value.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    prefixes = tuple(prefixes)
    if not text:
        return ""
    # Find the candidate lines with str.find over the whole page (C speed) rather than looping over its
    # lines in Python: a page has thousands of histogram lines and a few dozen wanted ones.
    spans = set()
    for prefix in prefixes:
        pos = text.find(prefix)
        while pos >= 0:
            start = text.rfind("\n", 0, pos) + 1
            end = text.find("\n", pos)
            end = len(text) if end < 0 else end
            spans.add((start, end))
            pos = text.find(prefix, end)
    kept = []
    for start, end in sorted(spans):
        line = text[start:end].rstrip("\r")
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and _wanted(parts[2], prefixes):
                kept.append(line)
            continue
        match = _SAMPLE_NAME_RE.match(line)
        if match and _wanted(match.group(1), prefixes):
            kept.append(line)
    return "\n".join(kept) + "\n" if kept else ""


def parse_samples(text, prefixes, field="metrics"):
    """The samples of the metrics named by ``prefixes`` in exposition ``text``, parsed by prometheus_client.

    Returns a list of prometheus_client ``Sample`` tuples (``.name``, ``.labels`` dict, ``.value`` float).
    ``_created`` series (counter creation timestamps) and samples without a value (NaN) are left out;
    nothing is summed or filtered by label, that is the caller's business.

    Raises ValidationError (naming ``field``) when prometheus_client is missing or the selected lines are not
    valid exposition text.
    """
    if not HAS_PROMETHEUS_CLIENT:
        raise ValidationError("the prometheus_client Python library is missing", field=field,
                              hint="pip install prometheus_client on the host that runs the module")
    filtered = filter_lines(text, prefixes)
    if not filtered:
        return []
    try:
        families = list(text_string_to_metric_families(filtered))
    except (ValueError, TypeError, IndexError) as exc:
        raise ValidationError("the %s lines are not valid Prometheus text: %s" % ("/".join("%s*" % p for p in prefixes), exc),
                              field=field, hint="point at vLLM's /metrics endpoint (Prometheus text format)") from exc
    samples = []
    for family in families:
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            value = sample.value
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            samples.append(sample)
    return samples


def require_prometheus_client(module):
    """Fail the task, the Ansible way, when the prometheus_client library (the /metrics parser) is not installed."""
    if not HAS_PROMETHEUS_CLIENT:
        # Imported here: the in-cluster load Job (bench/load_job_pod.py) runs this file without Ansible.
        from ansible.module_utils.basic import missing_required_lib  # pylint: disable=import-outside-toplevel
        module.fail_json(msg=missing_required_lib("prometheus_client"), exception=str(PROMETHEUS_IMPORT_ERROR))
