# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What each side of a load sweep runs, read before the first request: its engine-config line, its /metrics and its
command. A baseline that runs speculative decoding, a candidate (or confirm server) that does not, and an engine whose
method or k contradicts the sweep's inputs are refused with ``ValidationError`` naming the field.

Plain Python, no Ansible imports; nothing here sends a request (the caller scrapes /metrics).
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError


# -- spec state of each side, before any request ------------------------------------------------------------------
def spec_state_from_metrics(text, model_name=None):
    """``{"speculative": bool | None, "k": int | None}`` from one ``/metrics`` page.

    vLLM registers the ``vllm:spec_decode_*`` counters only when the engine runs with a speculative config
    (``SpecDecodingProm`` returns early without one), and creates one ``..._per_pos`` series per proposed slot at
    start-up, so the series count is the engine's ``num_speculative_tokens``. ``None`` when there is no page.
    """
    if text is None:
        return {"speculative": None, "k": None}
    counters = spec_metrics.parse_prometheus(text)
    name = model_name if model_name in counters.all_model_names else None
    if name:
        counters = spec_metrics.parse_prometheus(text, model_name=name)
    k = len(counters.accepted_per_pos or []) or None
    return {"speculative": bool(counters.found), "k": k}


def spec_state_from_command(command, env=None):
    """True/False whether a vLLM command line sets speculative decoding, None without a command.

    Any speculative flag with a value counts (vllm_command's registry: ``--speculative-config`` and its dotted keys, the
    0.24+ ``--spec-*`` shorthand, and the pre-0.10 flags with which older images run speculative decoding)."""
    if bench_report._blank(command):  # pylint: disable=protected-access
        return None
    return any(occ.has_value for occ in vllm_command.find_occurrences(vllm_command.command_words(command, env)))


ENGINE_FIELDS = {"baseline": "baseline_engine_config", "candidate": "candidate_engine_config", "confirm": "confirm_engine_config"}


def spec_state_from_engine(engine, field):
    """``{"found": bool, "config": dict | None}`` from what a side's engine printed at start-up, ``None`` when not given.

    ``engine``: the result of ``alauda.spec_decoding.engine_config_info`` or ``llmisvc_engine_config`` (``found`` and
    ``speculative_config``, the parsed ``speculative_config=...`` of the "Initializing a V1 LLM engine" line), or
    ``{"line": "<the engine-config line>"}``. The engine line is what the engine really runs: a flag lost on
    the way (a ServingRuntime that drops args, a config the engine rejected and replaced) shows there first.
    """
    if engine is None or engine == {}:
        return None
    if not isinstance(engine, dict):
        raise ValidationError("must be a dict, got %s" % type(engine).__name__, field=field,
                              hint="register the result of alauda.spec_decoding.engine_config_info and pass it")
    if engine.get("line") and "found" not in engine:
        parsed = engine_log.parse_engine_line(engine["line"])
        if parsed is None:
            raise ValidationError("line is not vLLM's engine-config line (\"Initializing a V1 LLM engine (v...) with config: ...\")",
                                  field=field + ".line", hint="give the line as the engine logged it, or the engine_config_info module's result")
        return {"found": True, "config": parsed["speculative_config"]}
    if "found" not in engine:
        raise ValidationError("has neither found/speculative_config nor line", field=field,
                              hint="register the result of alauda.spec_decoding.engine_config_info (found, speculative_config) and pass it")
    config = engine.get("speculative_config")
    if config is not None and not isinstance(config, dict):
        raise ValidationError("speculative_config must be a dict or null, got %r" % (config,), field=field + ".speculative_config",
                              hint="pass the engine_config_info module's result unchanged")
    return {"found": bool(engine["found"]), "config": config}


def check_engine_states(engines, metrics_states, method=None, current_k=None, confirm_k=None):
    """Refuse, from each side's engine line, a baseline that runs speculative decoding, a candidate or confirm server
    that does not, and an engine whose method or k contradicts the sweep's inputs or the same side's /metrics.

    ``engines``: ``{side: spec_state_from_engine(...)}`` (``None`` values: not given). Returns
    ``(notes, engine_k)``: what could not be checked, and the candidate's k as its engine printed it.
    """
    notes, engine_k = [], None
    wants = {"baseline": False, "candidate": True, "confirm": True}
    for side, state in engines.items():
        field = ENGINE_FIELDS[side]
        if state is None:
            continue
        if not state["found"]:
            notes.append("the %s's engine-config line was not found (%s.found is false), so its speculative config was "
                         "checked on /metrics only" % (side, field))
            continue
        config = state["config"]
        printed = engine_log.format_config(config)
        if not wants[side]:
            if config is not None:
                raise ValidationError("shows %s: the baseline's engine runs speculative decoding, so it is no baseline" % printed,
                                      field=field, hint="give the engine line of the same model served without --speculative-config")
            continue
        if config is None:
            raise ValidationError("shows speculative_config=None: the %s's engine runs without speculative decoding" % side, field=field,
                                  hint="check that --speculative-config reached vLLM (alauda.spec_decoding.engine_config_info with "
                                       "expected) and point %s_url at that server" % side)
        got_method = engine_log.normalize_method(config.get("method"))
        want_method = engine_log.normalize_method(speculative_config.printed_method(method))
        if want_method and got_method and got_method != want_method:
            raise ValidationError("is %s, but the %s's engine runs method %r (%s)" % (method, side, got_method, printed), field="method",
                                  hint="set method to %s, the method the k candidates are checked against" % got_method)
        k = config.get("num_spec_tokens")
        seen = (metrics_states.get(side) or {}).get("k")
        if isinstance(k, int) and seen is not None and seen != k:
            raise ValidationError("shows num_spec_tokens=%d, but %s_url's /metrics has %d per-position series: the log and the URL "
                                  "are of different servers" % (k, side, seen), field=field,
                                  hint="give the engine line of the server %s_url serves" % side)
        if side == "candidate" and isinstance(k, int):
            engine_k = k
            if current_k is not None and current_k != k:
                raise ValidationError("is %d, but the candidate's engine runs num_spec_tokens=%d" % (current_k, k), field="current_k",
                                      hint="leave current_k unset (it is read from the engine line) or set it to %d" % k)
        if side == "confirm" and isinstance(k, int) and confirm_k is not None and confirm_k != k:
            raise ValidationError("is %d, but the confirm server's engine runs num_spec_tokens=%d" % (confirm_k, k), field="confirm_k",
                                  hint="deploy the predicted k there, or set confirm_k to %d" % k)
    return notes, engine_k


def describe_checks(states, engines):
    """What the report says each side was found to run, before the first request."""
    out = {}
    for side, state in states.items():
        engine = engines.get(side)
        seen = state.get("speculative")
        out[side] = {
            "engine_line": (engine_log.format_config(engine["config"]) if engine and engine["found"] else
                            "not found in the log" if engine else "not given"),
            "metrics": ("no /metrics page" if seen is None else
                        "vllm:spec_decode_* counters, %s per-position series" % state.get("k") if seen else
                        "no vllm:spec_decode_* counters"),
        }
    return out


def check_spec_states(states, commands=None):
    """Refuse a candidate that does not run speculative decoding and a baseline that does (``ValidationError``).

    ``states``: ``{side: spec_state_from_metrics(...)}`` for ``baseline``, ``candidate`` and optionally ``confirm``
    (with ``"expected_k"``); ``commands``: ``{side: True/False/None}`` from ``spec_state_from_command``.
    Returns notes for what could not be checked.
    """
    notes = []
    wants = {"baseline": False, "candidate": True, "confirm": True, "schedule": True, "schedule_fixed": True}
    fields = {"baseline": "baseline_url", "candidate": "candidate_url", "confirm": "confirm_url", "schedule": "schedule_url",
              "schedule_fixed": "fixed_url"}
    for side, state in states.items():
        seen = state.get("speculative")
        if seen is None:
            notes.append("the %s has no /metrics page, so whether it runs speculative decoding was not checked" % side)
        elif seen != wants[side]:
            if wants[side]:
                raise ValidationError("shows no speculative decoding: its /metrics has no vllm:spec_decode_* counters, which vLLM "
                                      "registers whenever a speculative config is set", field=fields[side],
                                      hint="point %s at the server started with --speculative-config" % fields[side])
            raise ValidationError("shows speculative decoding (vllm:spec_decode_* counters on its /metrics, k=%s): it is not a "
                                  "baseline" % state.get("k"), field=fields[side],
                                  hint="point baseline_url at the same model served without --speculative-config")
        expected = state.get("expected_k")
        if seen and expected is not None and state.get("k") is not None and state["k"] != expected:
            raise ValidationError("serves num_speculative_tokens=%d (per-position series on /metrics), not the k=%d to confirm" % (
                state["k"], expected), field=fields[side], hint="deploy the recommended k there, or set %s to what it serves" % (
                    "fixed_k" if side == "schedule_fixed" else "confirm_k"))
    for side, flagged in (commands or {}).items():
        if flagged is None or flagged == wants[side]:
            continue
        field = "report_context.%s_command" % side
        if wants[side]:
            raise ValidationError("has no --speculative-config: the candidate's command does not enable speculative decoding",
                                  field=field, hint="give the command the candidate really runs")
        raise ValidationError("sets --speculative-config: the baseline's command enables speculative decoding",
                              field=field, hint="the baseline is the same command without --speculative-config")
    return notes
