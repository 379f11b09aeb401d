# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's ``--per-request-spec-decode-metrics``: the releases that have it, what the render writes for the option
``per_request_metrics`` (role variable ``spec_decoding_per_request_metrics``), and where it stands in a command a strip
of the speculative flags edits.

From vLLM 0.32's source: ``vllm/config/observability.py`` ``ObservabilityConfig.per_request_spec_decode_metrics``
(``Literal["none", "summary", "detailed"]``, default ``none``) is the flag ``vllm/engine/arg_utils.py``
``EngineArgs.add_cli_args`` adds; with ``summary`` each response carries ``metrics.speculative_decoding`` (mean acceptance
length, draft acceptance rate, the histogram), ``detailed`` adds the per-step arrays (``n == 1`` only). And
``vllm/config/vllm.py`` ``VllmConfig.__post_init__`` raises "--per-request-spec-decode-metrics requires speculative
decoding to be enabled (via --speculative-config)" for any value but ``none`` without a speculative config: that server
does not start. So the flag goes on the speculative side only, a baseline (the benchmark's twin, a rolled-back service)
must not carry it, and vllm/command_edit.py removes it together with the speculative flags.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import cli_registry_releases
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as spec_core

OPTION = "per_request_metrics"
VARIABLE = "spec_decoding_per_request_metrics"
FLAG = "--per-request-spec-decode-metrics"
DEST = "per_request_spec_decode_metrics"
MODES = ("auto", "summary", "detailed", "off")
# vllm/config/observability.py (0.32): the flag's choices; `none` is vLLM's default, the option's `off` renders nothing.
VLLM_CHOICES = ("none", "summary", "detailed")
# The first release whose serve parser has the flag (docs: ../shared/reference/facts.md, "0.32+"; the 0.32 option table
# in cli_registry_releases.py lists it). A release with an option table of its own is judged by that table.
FIRST_RELEASE = (0, 32)
# FlexibleArgumentParser turns `_` into `-` in a `--` word's name, so both spellings reach the same option.
_SPELLINGS = (FLAG, "--" + DEST)


def release_has_flag(vllm_version):
    """``(has, release text)``: does the vLLM release ``vllm_version`` (None: the newest the collection knows) have
    ``--per-request-spec-decode-metrics``? Its own option table decides when cli_registry_releases.py has one, else
    FIRST_RELEASE (a newer release without a table is read with the newest table, as vllm/cli_parser.py does)."""
    version = spec_core.parse_version(vllm_version) if vllm_version else spec_core.NEWEST_KNOWN
    table = cli_registry_releases.RELEASES.get("%d.%d" % version[:2])
    if table is not None:
        has = any(dest == DEST for dest, _nargs, _names in table["options"])
    else:
        has = tuple(version[:2]) >= FIRST_RELEASE
    return has, spec_core.format_version(version)


def _flag_word(word):
    """Is this argv word the flag (``FLAG``, ``FLAG=value``, the ``_`` spelling)? Returns (is_flag, inline value)."""
    if not isinstance(word, str):
        return False, None
    name, sep, value = word.partition("=")
    if name in _SPELLINGS:
        return True, (value if sep else None)
    return False, None


def given_in(words):
    """True when the words (a render's extra_args) already set the flag."""
    return any(_flag_word(w)[0] for w in (words or ()))


def resolve(mode, vllm_version, speculative, extra_args=()):
    """What the render writes for ``per_request_metrics`` = ``mode`` on a server with ``speculative`` (the validated
    SpeculativeConfig, None for a baseline) for the release ``vllm_version``.

    Returns ``{"mode": "summary"|"detailed"|None, "args": [...] (put before --speculative-config), "note": str|None}``.
    ``auto``: summary where the release has the flag, nothing and a note where not; ``summary``/``detailed`` on a
    release without it are refused (ValidationError naming the option, the release and the fix) before anything is
    written; ``off``: nothing. A baseline never gets the flag (vLLM refuses it without a speculative config)."""
    mode = mode or "auto"
    if mode not in MODES:
        raise ValidationError("%s (role variable %s) %r is not a mode" % (OPTION, VARIABLE, mode), field=OPTION,
                              hint="use one of %s" % ", ".join(MODES))
    out = {"mode": None, "args": [], "note": None}
    if mode == "off":
        return out
    if speculative is None:
        if mode != "auto":
            out["note"] = ("%s %s not rendered: the baseline runs no speculative decoding and vLLM refuses %s without "
                           "--speculative-config" % (VARIABLE, mode, FLAG))
        return out
    if given_in(extra_args):
        if mode != "auto":
            raise ValidationError("%s (role variable %s) is %s and extra_args sets %s too. Nothing was written"
                                  % (OPTION, VARIABLE, mode, FLAG), field=OPTION,
                                  hint="drop %s from spec_decoding_extra_args, or set %s to auto" % (FLAG, VARIABLE))
        out["note"] = "%s is set in extra_args: rendered as written there" % FLAG
        return out
    has, release = release_has_flag(vllm_version)
    if not has:
        if mode == "auto":
            out["note"] = ("vLLM %s has no %s (it exists from vLLM %d.%d): not rendered, so responses carry no per-request "
                           "acceptance; a class's acceptance then takes one benchmark run per class" % ((release, FLAG) + FIRST_RELEASE))
            return out
        raise ValidationError("%s (role variable %s) is %s but vLLM %s has no %s (it exists from vLLM %d.%d; the server exits "
                              "on an unrecognized argument). Nothing was written" % ((OPTION, VARIABLE, mode, release, FLAG) + FIRST_RELEASE),
                              field=OPTION, hint="set %s to auto or off for vLLM %s, or run a vLLM %d.%d or newer image (and set "
                                                 "spec_decoding_vllm_version to it)" % ((VARIABLE, release) + FIRST_RELEASE))
    value = "summary" if mode == "auto" else mode
    out.update(mode=value, args=[FLAG, value])
    return out


def argv_spans(words):
    """The indexes of the flag and its value in an argv list (the value is the next word when it is one of vLLM's
    choices: argparse takes it so), in order."""
    out = []
    i = 0
    while i < len(words):
        is_flag, inline = _flag_word(words[i])
        if is_flag:
            out.append(i)
            if inline is None and i + 1 < len(words) and words[i + 1] in VLLM_CHOICES:
                out.append(i + 1)
                i += 1
        i += 1
    return out


def script_spans(tokens):
    """``(start, end)`` of each flag (with its value) among a script's lexed tokens (vllm/shell_lexer.tokenize), last
    first, so a caller can delete them one by one without moving the others."""
    spans = []
    words = [t for t in tokens if t.kind == "word"]
    for n, tok in enumerate(words):
        is_flag, inline = _flag_word(tok.value if tok.literal else None)
        if not is_flag:
            continue
        end = tok.end
        if inline is None and n + 1 < len(words) and words[n + 1].literal and words[n + 1].value in VLLM_CHOICES:
            end = words[n + 1].end
        spans.append((tok.start, end))
    return sorted(spans, reverse=True)
