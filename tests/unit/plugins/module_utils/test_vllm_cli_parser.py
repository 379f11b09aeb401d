"""vLLM's command line as its own parser reads it (vllm/cli_parser.py, vllm/command_scan.py) and the rollback's checked strip.

The option table is vLLM 0.32's (vllm/cli_registry_releases.py, taken from the installed parser by
hack/vllm_cli_registry.py); the abbreviation rule and nargs are checked here against Python's own argparse built from
that table, the parse of vLLM's FlexibleArgumentParser (dotted keys, ``-O``) against the facts read in its source;
tests/e2e/test_strip_differential.py holds the strip to the installed vLLM's parser itself.
"""
from __future__ import annotations

import argparse
import json
import platform

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import cli_parser
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit as ve
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.cli_registry_releases import RELEASES

NGRAM = '{"method":"ngram","num_speculative_tokens":3}'
REG = cli_parser.registry()


def _stdlib_parser():
    """Python's argparse with vLLM 0.32's option table (what vLLM's parser is, minus FlexibleArgumentParser's rewriting)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=REG.allow_abbrev)
    for dest, nargs, names in RELEASES[REG.release]["options"]:
        if nargs == 0:
            parser.add_argument(*names, dest=dest, action="store_true")
        else:
            parser.add_argument(*names, dest=dest, nargs=nargs)
    parser.add_argument("model_tag", nargs="?")
    return parser


def test_the_table_is_vllm_032s_serve_parser():
    table = RELEASES["0.32"]
    assert table["vllm"] == "0.32.0" and table["allow_abbrev"] is True
    assert set(table["speculative_dests"]) == {"speculative_config", "spec_method", "spec_model", "spec_tokens"}
    assert REG.by_option["-sc"].dest == "speculative_config" and REG.by_option["--served-model-name"].nargs == "+"
    assert table["positionals"] == (("model_tag", "?"),)
    # argparse's abbreviation rule is Python's: the table records the Python vLLM ran on, the readers run on the same minor
    assert table["python"].rsplit(".", 1)[0] == platform.python_version().rsplit(".", 1)[0]


@pytest.mark.parametrize("word", [
    "--speculative", "--speculative-c", "--spec-tok", "--spec-meth", "--spec-mod", "-sc", "-sc=x", "--spec", "--spe", "-s",
    "--port", "--po", "--served", "--max-model", "--no-enable-prefix", "-tp", "-tp2", "--speculative-config=x", "--nope", "-1",
])
def test_option_words_resolve_as_pythons_argparse_resolves_them(word):
    parser = _stdlib_parser()
    ours = cli_parser.parse_optional(REG, word)
    theirs = None
    try:
        theirs = parser._parse_optional(word)  # pylint: disable=protected-access
    except SystemExit:
        theirs = "ambiguous"
    except argparse.ArgumentError:
        theirs = "ambiguous"
    if theirs == "ambiguous" or (isinstance(theirs, tuple) and theirs and theirs[0] == "ambiguous"):
        assert ours[0] == "ambiguous", (word, ours)
    elif theirs is None:
        assert ours is None, word
    else:
        action, option, explicit = theirs[:3]
        assert (ours[0].dest if ours[0] else None, ours[1], ours[2]) == (action.dest if action else None, option, explicit), word


def test_stdlib_argparse_exits_on_ambiguous_abbreviation():
    # what _parse_optional's "ambiguous" means: argparse.error exits (our reading marks the word as an error)
    with pytest.raises(SystemExit):
        _stdlib_parser().parse_args(["--spec", "x"])
    reading = cli_parser.read(["--spec", "x"])
    assert reading.roles[0].kind == "error" and "ambiguous" in reading.roles[0].note


@pytest.mark.parametrize("words", [
    ["m", "--served-model-name", "a", "b", "--port", "1"],
    ["--served-model-name", "a", "b", "-sc", NGRAM, "m"],
    ["--served-model-name", "a", "b", "m"],
    ["m", "--enforce-eager", "--spec-tok", "3", "--spec-method=ngram"],
    ["--api-key", "k1", "k2", "--speculative", NGRAM, "--seed", "0", "m"],
    ["--hf-token", "--port", "1", "m"],
])
def test_the_reading_gives_each_word_to_the_option_argparse_gives_it(words):
    namespace = vars(_stdlib_parser().parse_args(words))
    reading = cli_parser.read(words)
    got = {}
    for index, role in enumerate(reading.roles):
        if role.kind == "value":
            got.setdefault(role.action.dest, []).append(words[index])
        elif role.kind == "option" and role.explicit is not None:
            got.setdefault(role.action.dest, []).append(role.explicit)
        elif role.kind == "positional":
            got.setdefault("model_tag", []).append(words[index])
    for dest, values in got.items():
        want = namespace[dest]
        assert (want if isinstance(want, list) else [want]) == values[-len(want) if isinstance(want, list) else -1:], dest


def test_dotted_keys_are_gathered_per_option_as_written_and_replace_the_json():
    words = ["-sc", NGRAM, "--speculative-config.num_speculative_tokens", "5", "-sc.method=ngram", "--port", "1"]
    reading = cli_parser.read(words)
    assert [(group, action.dest) for group, action, _paths in reading.groups] == [
        ("--speculative-config", "speculative_config"), ("-sc", "speculative_config")]
    assert reading.speculative_indices(REG) == [0, 1, 2, 3, 4]
    # vLLM appends `--speculative-config {"num_speculative_tokens": 5}` then `-sc {"method": "ngram"}`: the last wins whole
    assert vc.find_speculative_config(["vllm", "serve", "m"] + words) == {"method": "ngram"}
    assert vc.find_speculative_config(["vllm", "serve", "m", "-sc", NGRAM, "--speculative-config.num_speculative_tokens", "5"]) == {
        "num_speculative_tokens": 5}
    # an abbreviation before the dot resolves like any option word; nested keys nest
    assert vc.find_speculative_config(["--speculative.method", "ngram", "--speculative.x.y=2"]) == {"method": "ngram", "x": {"y": 2}}
    # `_` in the name part is `-`, not in the key part
    assert vc.find_speculative_config(["--speculative_config.prompt_lookup_max", "4"]) == {"prompt_lookup_max": 4}


def test_shorthand_flags_set_their_keys_over_the_json_or_dotted_config():
    assert vc.find_speculative_config(["--spec-meth", "ngram", "--spec-tok", "3"]) == {"method": "ngram", "num_speculative_tokens": 3}
    assert vc.find_speculative_config(["--speculative.method", "ngram", "--spec-tokens", "2"]) == {
        "method": "ngram", "num_speculative_tokens": 2}


def test_optimization_level_short_forms_are_not_speculative():
    reading = cli_parser.read(["-O3", "-O", "2", "-O=1"])
    assert [r.action.dest for r in reading.roles if r.kind == "option"] == ["optimization_level"] * 3
    assert reading.roles[2].kind == "value"


@pytest.mark.parametrize("items, expected", [
    (["vllm", "serve", "m", "--speculative", NGRAM, "--port", "1"], ["vllm", "serve", "m", "--port", "1"]),
    (["vllm", "serve", "m", "--spec-method", "ngram", "--spec-tok", "3", "--seed", "0"], ["vllm", "serve", "m", "--seed", "0"]),
    (["vllm", "serve", "m", "-sc.method", "ngram", "-sc.num_speculative_tokens=3"], ["vllm", "serve", "m"]),
    (["vllm", "serve", "m", "-sc", NGRAM, "--speculative-config.num_speculative_tokens", "5"], ["vllm", "serve", "m"]),
    # a flag's name inside another flag's JSON value is text, not a flag
    (["vllm", "serve", "m", "--override-generation-config", '{"x": "--speculative-config {} -sc 1"}'], None),
    # -s is an abbreviation of -sc only when no other single-dash option starts with it
    (["vllm", "serve", "m", "--speculative-config=" + NGRAM], ["vllm", "serve", "m"]),
])
def test_strip_argv_forms_the_parser_accepts(items, expected):
    expected = list(items) if expected is None else expected
    assert ve.strip_speculative_config(items) == expected
    assert ve.strip_checked(items) == expected
    assert vc.find_speculative_config(expected) is None


def test_strip_touches_only_the_vllm_invocation():
    script = ("echo starting with --speculative-config '%s' -sc x\npython3 /opt/prefetch.py --speculative-config '%s'\n"
              "exec vllm serve /m --spec-tok 3 --spec-method ngram --port 8080\n" % (NGRAM, NGRAM))
    out = ve.strip_checked(["bash", "-c", script])
    assert out[2] == script.replace(" --spec-tok 3 --spec-method ngram", "")


@pytest.mark.parametrize("script, env, construct", [
    ("eval \"vllm serve /m -sc '%s'\"" % NGRAM, None, "eval"),
    ('eval "vllm serve /m ${EXTRA}"', None, "eval"),
    ('vllm serve /m ${SPEC:+--speculative-config "$SPEC"}', {"SPEC": NGRAM}, "parameter expansion"),
    ("vllm serve /m $EXTRA --port 1", None, "variable"),
    ("vllm serve /m $(cat /etc/extra-args)", None, "command substitution"),
    ("vllm serve /m $EXTRA", {"EXTRA": "-sc " + NGRAM}, "variable"),
    ("vllm serve --api-key a b -sc '%s' /m" % NGRAM, None, "multi-value option"),
])
def test_checked_strip_refuses_what_it_cannot_resolve_naming_the_construct(script, env, construct):
    with pytest.raises(ValidationError) as exc:
        ve.strip_checked(["bash", "-c", script], env)
    assert ": %s " % construct in str(exc.value) and exc.value.field == "command"
    assert exc.value.hint


@pytest.mark.parametrize("script, env, expected", [
    # values known from the pod spec are resolved; quoted values of one-value options are one word whatever they hold
    ("vllm serve /m $EXTRA -sc '%s'" % NGRAM, {"EXTRA": "--seed 1 --max-num-seqs 8"}, "vllm serve /m $EXTRA"),
    ('vllm serve /m --dtype "$DTYPE" -sc \'%s\'' % NGRAM, None, 'vllm serve /m --dtype "$DTYPE"'),
    # the script's own assignments are known too
    ('MODEL=/mnt/models\nexec vllm serve "$MODEL" --spec-method ngram', None, 'MODEL=/mnt/models\nexec vllm serve "$MODEL"'),
    # eval of known text without a flag is clean
    ("eval 'vllm serve /m --port 1'", None, None),
])
def test_checked_strip_resolves_what_the_pod_spec_or_script_says(script, env, expected):
    out = ve.strip_checked(["bash", "-c", script], env)
    assert out == ["bash", "-c", script if expected is None else expected]


def test_checked_strip_passes_through_lists_without_a_flag_unchanged():
    items = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--served-model-name", "a", "b"]
    assert ve.strip_checked(items) == items and ve.strip_checked(None) is None


def test_strip_problems_name_the_construct_and_where():
    problems = vc.strip_problems(["vllm", "serve", "/m", "$(EXTRA_ARGS)"], [{"name": "OTHER", "value": "1"}])
    assert problems == [{"construct": "variable", "text": "$(EXTRA_ARGS)", "where": "argv",
                         "why": "known only at run time, where vLLM's parser may read it as an option"}]
    assert vc.strip_problems(["vllm", "serve", "/m", "$(EXTRA_ARGS)"], [{"name": "EXTRA_ARGS", "value": "--seed"}]) == []


def test_registry_for_an_unknown_release_is_the_newest_table():
    assert cli_parser.registry("0.11").release == "0.32" and json.dumps(RELEASES["0.32"]["speculative_dests"])


def test_a_shorthand_flag_and_the_same_json_key_are_refused_as_vllm_refuses_them():
    with pytest.raises(ValidationError) as exc:
        vc.find_speculative_config(["-sc", NGRAM, "--spec-method", "ngram"])
    assert "mutually exclusive" in str(exc.value) and "method" in str(exc.value)


def test_the_data_file_is_the_generators_rendering():
    import os  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    from tests.paths import REPO  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, os.path.join(REPO, "hack"))
    try:
        import vllm_cli_registry  # pylint: disable=import-outside-toplevel,import-error
    finally:
        sys.path.pop(0)
    with open(vllm_cli_registry.DATA, encoding="utf-8") as handle:
        assert handle.read() == vllm_cli_registry._render(vllm_cli_registry._read())  # pylint: disable=protected-access


@pytest.mark.parametrize("raw, value", [("2k", 2000), ("1K", 1024), ("25.6k", 25600), ("2M", 2 ** 21), ("ngram", "ngram"), ("1.5K", "1.5K"),
                                        ("4", 4), ("[1, 2]", [1, 2])])
def test_dotted_values_are_read_as_flexibleargumentparser_reads_them(raw, value):
    assert vc.find_speculative_config(["--speculative-config.x", raw]) == {"x": value}
