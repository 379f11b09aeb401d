"""The per-release tables (read from each vLLM release's source) drive validate(): every method and key of a release
is accepted for it and refused, with vLLM's own 'added in' / 'removed in' release, for the releases without it."""

import os
import re
import sys

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_releases import RELEASES
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

from tests.paths import REPO

sys.path.insert(0, os.path.join(REPO, "hack"))
import vllm_speculative_tables as tables  # noqa: E402  pylint: disable=wrong-import-position

MINORS = sorted(RELEASES, key=lambda m: tuple(int(p) for p in m.split(".")))
EVERY_METHOD = sorted({m for t in RELEASES.values() for m in t["methods"]})
EVERY_KEY = sorted({k for t in RELEASES.values() for k in t["keys"]})
DRAFT = "/mnt/models/draft"


def _minor(version):
    return tuple(int(p) for p in version.split(".")[:2])


def _config_for(method, table):
    """The smallest config that runs `method` on the release of `table`."""
    config = {"method": method, "num_speculative_tokens": 1}
    omitted = table["model_omitted"].get(method)
    if omitted == "required":
        config["model"] = "my_pkg.MyProposer"
    elif method in core.DRAFT_WEIGHT_METHODS and omitted != "target":
        config["model"] = DRAFT
    if method in core.NGRAM_METHODS:
        config.update(prompt_lookup_min=2, prompt_lookup_max=4)
    return config


# Keys a release refuses without their partners (speculative_rules: vLLM's cross-field rules): the config they need.
PARTNERS = {
    "synthetic_acceptance_rates": {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5]},
    "synthetic_acceptance_length": {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 1.5},
    "index_share_for_mtp_iteration": {"method": "mtp", "model": None},
    "use_heterogeneous_vocab": {"method": "draft_model"},
    "dspark_draft_topk": {"method": "dspark"},
}


def _config_with(base, key, spec, table):
    """`base` with `key` set to a value the release accepts, and the partners the key needs there."""
    config = dict(base, **{key: _value_for(key, spec, table)})
    if key in PARTNERS:  # every table carries the release's cross-field rules (code_rules)
        config.update(PARTNERS[key])
    return {k: v for k, v in config.items() if v is not None}


def _value_for(key, spec, table=None):
    """A value of the type vLLM declares for `key` (its default when it has one, else one of its allowed values)."""
    allowed = (table or {}).get("field_values", {}).get(key)
    if allowed and "object" in allowed:
        return {}
    if allowed:
        return allowed["values"][0]
    default = spec.get("default")
    if default is not None and not isinstance(default, dict):
        return default
    if spec["type"].startswith("list[tuple[int, int, int]]"):
        return [[1, 1, 1]]  # a batch-size schedule: its rules (vllm/speculative_schedule.py) refuse a bare number
    kind = core._kind(key, spec)  # pylint: disable=protected-access
    return {core._BOOL: True, core._NUM: 0.5, core._STR: "x", core.rules.LIST_NUM: [0.5]}.get(kind, 1)  # pylint: disable=protected-access


def _history(name, what):
    return [m for m in MINORS if name in RELEASES[m]["methods" if what == "method" else "keys"]]


def _expected_absence(name, what, minor):
    history = _history(name, what)
    before = [m for m in history if _minor(m) < _minor(minor)]
    if before:
        return "removed in vLLM %s" % MINORS[MINORS.index(before[-1]) + 1]
    return "added in vLLM %s" % history[0]


# --- the data ------------------------------------------------------------------------------------------------

def test_every_minor_release_from_0_10_to_the_newest_has_a_table():
    assert MINORS[0] == "0.10" and MINORS[-1] == "%d.%d" % core.NEWEST_KNOWN[:2]
    assert [_minor(m)[1] for m in MINORS] == list(range(10, _minor(MINORS[-1])[1] + 1))


@pytest.mark.parametrize("minor", MINORS)
def test_each_table_says_where_it_was_read_from(minor):
    table = RELEASES[minor]
    assert _minor(table["version"]) == _minor(minor)
    assert table["commit"] is None or re.match(r"^[0-9a-f]{40}$", table["commit"])
    assert table["commit"] or table["commit_id"] or "0.15" in minor, "no commit for %s" % minor
    if table["commit"] and table["commit_id"]:
        assert table["commit"].startswith(table["commit_id"].lstrip("g"))
    assert re.match(r"^[0-9a-f]{64}$", table["sha256"]) and table["source"] and table["file"].startswith("vllm/")


def test_the_data_module_is_what_the_generator_writes(tmp_path):
    # regenerate the file from its own data: the layout is the generator's, so a hand edit shows up as a diff
    path = tmp_path / "speculative_releases.py"
    tables.write({k: dict(v) for k, v in RELEASES.items()}, str(path))
    with open(os.path.join(REPO, "plugins", "module_utils", "vllm", "speculative_releases.py"), encoding="utf-8") as handle:
        assert path.read_text() == handle.read()


# --- every method and key of every release ---------------------------------------------------------------------

@pytest.mark.parametrize("minor", MINORS)
def test_every_method_of_a_release_is_accepted_for_it(minor):
    table, version = RELEASES[minor], RELEASES[minor]["version"]
    for method in table["methods"]:
        config = _config_for(method, table)
        if method == "draft_model" and not table["draft_model_supported"]:
            with pytest.raises(ValidationError, match="not supported by vLLM %s" % re.escape(version)):
                core.validate(config, version)
            continue
        result = core.validate(config, version)
        assert result.config == config
        if method in table["mtp_aliases"]:
            assert any("replaces it with 'mtp'" in w for w in result.warnings), method


@pytest.mark.parametrize("minor", MINORS)
def test_every_other_method_is_refused_with_the_release_that_added_or_removed_it(minor):
    table, version = RELEASES[minor], RELEASES[minor]["version"]
    for method in EVERY_METHOD:
        if method in table["methods"]:
            continue
        with pytest.raises(ValidationError) as info:
            core.validate(_config_for(method, table), version)
        message = str(info.value)
        assert message.startswith("config.method:") and _expected_absence(method, "method", minor) in message, message


@pytest.mark.parametrize("minor", MINORS)
def test_every_key_of_a_release_is_accepted_for_it(minor):
    table, version = RELEASES[minor], RELEASES[minor]["version"]
    base = {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 1}
    for key, spec in table["keys"].items():
        if key in base or key == "tensor_parallel_size":
            continue  # base keys are in every config; tensor_parallel_size is a field only for vLLM to refuse it
        config = _config_with(base, key, spec, table)
        assert core.validate(config, version).config == config, key


@pytest.mark.parametrize("minor", MINORS)
def test_every_other_key_is_refused_with_the_release_that_added_or_removed_it(minor):
    table, version = RELEASES[minor], RELEASES[minor]["version"]
    base = {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 1}
    for key in EVERY_KEY:
        if key in table["keys"] or key == "tensor_parallel_size":
            continue
        with pytest.raises(ValidationError) as info:
            core.validate(dict(base, **{key: 1}), version)
        message = str(info.value)
        assert message.startswith("config.%s:" % key), message
        if key in table["engine_keys"]:
            assert "set by the vLLM engine" in message
            continue
        assert _expected_absence(key, "key", minor) in message, message
        if table["unknown_keys"] == "ignored":
            assert "silently drops it" in message, message


# --- what vllm/engine/arg_utils.py does with the command line, per release -------------------------------------

NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
HYPHENATED = {k.replace("_", "-"): v for k, v in NGRAM.items()}
SHORTHAND_VALUES = {"method": "ngram", "model": DRAFT, "num_speculative_tokens": "3"}


def _first_of_the_rest(has):
    """The first minor that has what `has(table)` says (test_command_line_facts_hold_from_one_release_on: so do the later)."""
    return next(m for m in MINORS if has(RELEASES[m]))


def test_command_line_facts_hold_from_one_release_on():
    # "from vLLM X" in the messages is true only if no later release drops the fact again
    for has in (lambda t: t["hyphen_keys"], lambda t: bool(t["shorthand_flags"])):
        assert [has(RELEASES[m]) for m in MINORS] == [_minor(m) >= _minor(_first_of_the_rest(has)) for m in MINORS]
    assert (_first_of_the_rest(lambda t: t["hyphen_keys"]), _first_of_the_rest(lambda t: bool(t["shorthand_flags"]))) == ("0.26", "0.22")
    for minor in MINORS:
        table = RELEASES[minor]
        assert table["engine_file"] == "vllm/engine/arg_utils.py" and re.match(r"^[0-9a-f]{64}$", table["engine_sha256"])
        # every flag a release has is one the command-line reader knows, setting the same key
        assert all(core.SHORTHAND_FLAGS.get(f) == k for f, k in table["shorthand_flags"].items()), minor


@pytest.mark.parametrize("minor", MINORS)
def test_hyphenated_keys_are_accepted_where_vllm_rewrites_them_and_refused_before(minor):
    table, version = RELEASES[minor], RELEASES[minor]["version"]
    if table["hyphen_keys"]:
        assert core.validate(HYPHENATED, version).config == NGRAM
        assert core.from_preset("ngram", {"num-speculative-tokens": 3}, version).config["num_speculative_tokens"] == 3
        return
    with pytest.raises(ValidationError) as info:
        core.validate(HYPHENATED, version)
    message = str(info.value)
    assert message.startswith("config.num-speculative-tokens: key 'num-speculative-tokens' is written with hyphens: vLLM %s" % version)
    assert "from %s" % _first_of_the_rest(lambda t: t["hyphen_keys"]) in message
    assert ("refuses it" if table["unknown_keys"] == "refused" else "silently drops it") in message, message
    assert "write it with underscores: 'num_speculative_tokens'" in message
    with pytest.raises(ValidationError, match="^overrides.num-speculative-tokens: "):
        core.from_preset("ngram", {"num-speculative-tokens": 3}, version)
    assert core.validate(NGRAM, version).config == NGRAM


@pytest.mark.parametrize("minor", MINORS)
def test_shorthand_flags_are_accepted_from_the_release_that_has_them(minor):
    table, version = RELEASES[minor], RELEASES[minor]["version"]
    for flag, key in core.SHORTHAND_FLAGS.items():
        value = SHORTHAND_VALUES[key]
        # argparse's '=' form and FlexibleArgumentParser's '_' spelling are the same flag
        for words in ([flag, value], ["%s=%s" % (flag, value)], ["--" + flag[2:].replace("-", "_"), value]):
            command = ["vllm", "serve", "/m"] + words
            if flag in table["shorthand_flags"]:
                assert core.check_command(command, vllm_version=version) == []
                continue
            with pytest.raises(ValidationError) as info:
                core.check_command(command, vllm_version=version, field="extra_args")
            since = _first_of_the_rest(lambda t, f=flag: f in t["shorthand_flags"])
            assert str(info.value).startswith("extra_args: uses %s, which exists only from vLLM %s (you target %s"
                                              % (flag, since, version))
            assert "put '%s' inside --speculative-config" % key in str(info.value)


# --- what the hand tables got wrong ----------------------------------------------------------------------------

EAGLE3 = {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3}


@pytest.mark.parametrize("key,value", [
    ("rejection_sample_method", "standard"), ("attention_backend", "FLASH_ATTN"), ("kv_cache_dtype", "fp8"),
    ("draft_sample_method", "greedy"), ("parallel_drafting", True), ("moe_backend", "triton"),
])
def test_keys_vllm_033_accepts_are_accepted(key, value):
    config = dict(EAGLE3, **{key: value})
    assert core.validate(config, "0.33.0").config == config


@pytest.mark.parametrize("key,removed_in", [("disable_by_batch_size", "0.17"), ("speculative_token_tree", "0.21")])
def test_keys_vllm_removed_are_refused_with_the_release(key, removed_in):
    with pytest.raises(ValidationError) as info:
        core.validate(dict(EAGLE3, **{key: 4 if key == "disable_by_batch_size" else "[(0,)]"}), "0.33.0")
    assert str(info.value).startswith("config.%s: '%s' was removed in vLLM %s (you target 0.33.0)" % (key, key, removed_in))
    assert "Fix:" in str(info.value)
    # and accepted by the last release that had it
    last = "0.%d.0" % (int(removed_in.split(".")[1]) - 1)
    assert key in core.validate(dict(EAGLE3, **{key: 4 if key == "disable_by_batch_size" else "[(0,)]"}), last).config


@pytest.mark.parametrize("alias", ["minimax_m2_mtp", "bailing_mtp", "hunyuan_mtp", "openpangu_mtp"])
def test_mtp_aliases_no_release_has_are_refused(alias):
    with pytest.raises(ValidationError, match="unknown method '%s'" % alias):
        core.validate({"method": alias, "num_speculative_tokens": 1}, "0.33.0")


def test_mtp_alias_is_what_vllm_runs_as_mtp():
    result = core.validate({"method": "deepseek_mtp", "num_speculative_tokens": 1}, "0.33.0")
    assert any("replaces it with 'mtp'" in w for w in result.warnings)
    # 0.10 has no 'mtp': deepseek_mtp is the method there, and 'mtp' arrives in 0.11
    assert not any("replaces" in w for w in core.validate({"method": "deepseek_mtp", "num_speculative_tokens": 1}, "0.10.2").warnings)
    with pytest.raises(ValidationError, match="'mtp' was added in vLLM 0.11"):
        core.validate({"method": "mtp", "num_speculative_tokens": 1}, "0.10.2")


def test_medusa_and_mlp_speculator_removed_in_033_say_what_to_use():
    for method in ("medusa", "mlp_speculator"):
        with pytest.raises(ValidationError) as info:
            core.validate({"method": method, "model": DRAFT, "num_speculative_tokens": 3}, "0.33.0")
        assert "was removed in vLLM 0.33" in str(info.value) and "eagle3 or draft_model" in str(info.value)
        assert core.validate({"method": method, "model": DRAFT, "num_speculative_tokens": 3}, "0.32.0")


def test_ngram_without_bounds_gets_vllms_defaults():
    text = "\n".join(core.validate({"method": "ngram", "num_speculative_tokens": 5}, "0.33.0").warnings)
    assert "vLLM 0.33.0 defaults them to 5 and 5" in text


def test_dspark_without_a_draft_path_loads_the_target_checkpoint():
    result = core.validate({"method": "dspark", "num_speculative_tokens": 3}, "0.33.0")
    assert any("from the target model's checkpoint" in w for w in result.warnings)


@pytest.mark.parametrize("path,version,method", [
    ("/models/EAGLE3-LLaMA3.1-Instruct-8B", "0.33.0", "eagle3"),
    ("/models/EAGLE-LLaMA3-Instruct-8B", "0.33.0", "eagle"),
    ("/models/Qwen3-8B-DFlash-b16", "0.33.0", "dflash"),
    ("deepseek-ai/dspark_qwen3_8b_block7", "0.33.0", "dspark"),
    ("/models/Qwen3-8B-DFlash-b16", "0.19.0", "draft_model"),     # dflash arrived in 0.20
    ("/models/EAGLE3-LLaMA3.1-Instruct-8B", "0.10.2", "eagle"),   # 0.10 read 'eagle3-' as eagle
    ("/mnt/models/draft", "0.33.0", "draft_model"),
])
def test_method_guessed_from_the_draft_path_follows_each_releases_rules(path, version, method):
    assert core.guessed_method(path, version) == method


def test_guess_names_what_vllm_may_still_read_from_the_draft_config():
    text = "\n".join(core.validate({"model": DRAFT, "num_speculative_tokens": 3}, "0.32.0").warnings)
    assert "pick 'draft_model'" in text and "'medusa'" in text and "'mtp'" in text


def test_patch_release_uses_its_minors_table_and_newer_uses_the_newest_with_a_warning():
    assert core.validate(dict(EAGLE3, enforce_eager=True), "0.11.2")
    with pytest.raises(ValidationError, match="'suffix' was added in vLLM 0.12"):
        core.validate({"method": "suffix", "num_speculative_tokens": 3}, "0.11.2")
    result = core.validate(dict(EAGLE3, rejection_sample_method="standard"), "0.99.1")
    assert any("newer than %s" % core.format_version(core.NEWEST_KNOWN) in w for w in result.warnings)


def test_unknown_keys_follow_each_releases_policy():
    # pydantic dataclasses ignored extra keys until vLLM's config decorator forbade them (0.16)
    assert any("silently drops" in w for w in core.validate(dict(EAGLE3, lookahead=3), "0.15.0").warnings)
    with pytest.raises(ValidationError, match="unknown key 'lookahead': vLLM 0.16.0 refuses it"):
        core.validate(dict(EAGLE3, lookahead=3), "0.16.0")


def test_method_names_is_every_method_of_every_release():
    assert core.METHOD_NAMES == frozenset(EVERY_METHOD)


# --- the generator, on a small source tree -----------------------------------------------------------------------

TINY_SPECULATIVE = '''
from typing import Literal, get_args
from pydantic import Field
MTPModelTypes = Literal["foo_mtp", "mtp"]
SpeculativeMethod = Literal["ngram", "eagle", "eagle3", "draft_model", MTPModelTypes]
SampleMethod = Literal["greedy", "probabilistic"]


@config
class SpeculativeConfig:
    num_speculative_tokens: int = Field(default=None, gt=0)
    model: str | None = None
    method: SpeculativeMethod | None = None
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    new_knob: bool = False
    sample_method: SampleMethod = "greedy"
    target_model_config: SkipValidation[ModelConfig] = None

    def __post_init__(self):
        if self.method is None and SpeculativeConfig._is_custom_proposer_path(self.model):
            self.method = "custom_class"
        elif self.method is None:
            if self.model in ("ngram", "[ngram]"):
                self.method = "ngram"
            else:
                self.method = "draft_model"
        if self.method in get_args(MTPModelTypes) and self.method != "mtp":
            self.method = "mtp"
        if self.model is None and self.num_speculative_tokens is not None:
            if self.method == "mtp":
                self.model = self.target_model_config.model
            elif self.method == "ngram":
                self.model = "ngram"
            else:
                raise ValueError("no model")
        if self.method == "ngram":
            if self.prompt_lookup_min is None and self.prompt_lookup_max is None:
                self.prompt_lookup_min = 3
                self.prompt_lookup_max = 7
            elif self.prompt_lookup_min is None:
                self.prompt_lookup_min = self.prompt_lookup_max
        else:
            if self.method in ("eagle", "eagle3"):
                pass
            elif "eagle-" in self.draft_model_config.model.lower():
                self.method = "eagle"
            elif self.draft_model_config.hf_config.model_type in get_args(MTPModelTypes):
                self.method = "mtp"
            elif self.method == "draft_model":
                pass
            else:
                raise NotImplementedError("unsupported")
            if self.num_speculative_tokens is None:
                self.num_speculative_tokens = n_predict

    def __repr__(self):
        model = None if self.method in ("ngram", "custom_class") else self.draft_model_config.model
        return f"SpeculativeConfig({model=})"
'''

TINY_ARG_UTILS = '''
class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        vllm_group.add_argument("--speculative-config", "-sc", **vllm_kwargs["speculative_config"])
        speculative_kwargs = get_kwargs(SpeculativeConfig)
        vllm_group.add_argument("--spec-tokens", **speculative_kwargs["num_speculative_tokens"])
        vllm_group.add_argument("--other-flag", **other_kwargs["num_speculative_tokens"])

    def create_speculative_config(self, target_model_config):
        self.speculative_config = {
            k.replace("-", "_"): v for k, v in self.speculative_config.items()
        }
        self.other = {k.replace("-", "_"): v for k, v in self.other_config.items()}
        return SpeculativeConfig(**self.speculative_config)
'''


def test_generator_reads_a_release_from_source(tmp_path):
    pkg = tmp_path / "vllm"
    (pkg / "config").mkdir(parents=True)
    (pkg / "engine").mkdir()
    (pkg / "config" / "speculative.py").write_text(TINY_SPECULATIVE)
    (pkg / "engine" / "arg_utils.py").write_text(TINY_ARG_UTILS)
    (pkg / "config" / "utils.py").write_text("def config(cls):\n    return dataclass(cls, config=ConfigDict(extra=\"forbid\"))\n")
    (pkg / "_version.py").write_text("__version__ = version = '0.99.0'\n__commit_id__ = commit_id = 'gabc1234'\n")
    entry = tables.read_release(str(tmp_path))
    assert entry["version"] == "0.99.0" and entry["commit_id"] == "gabc1234" and entry["commit"] is None
    assert entry["methods"] == ["draft_model", "eagle", "eagle3", "foo_mtp", "mtp", "ngram"]
    assert entry["mtp_aliases"] == ["foo_mtp"]
    assert sorted(entry["keys"]) == ["method", "model", "new_knob", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                                     "sample_method"]
    assert entry["keys"]["new_knob"] == {"type": "bool", "default": False}
    assert entry["keys"]["num_speculative_tokens"]["gt"] == 0
    assert entry["engine_keys"] == ["target_model_config"]
    assert entry["unknown_keys"] == "refused"
    assert entry["lookup_defaults"] == {"prompt_lookup_min": 3, "prompt_lookup_max": 7} and entry["lookup_copies_other_bound"]
    assert entry["model_omitted"] == {"mtp": "target", "ngram": "self"}
    assert entry["draft_model_supported"] is True and entry["num_speculative_tokens_from"] == ["n_predict"]
    assert entry["detect_rules"] == [{"method": "eagle", "when": [["name_contains", "eagle-"]]},
                                     {"method": "mtp", "when": [["model_type", ["foo_mtp", "mtp"]]]}]
    assert entry["hyphen_keys"] is True and entry["shorthand_flags"] == {"--spec-tokens": "num_speculative_tokens"}
    # issue #49: Literal values, the method from the names, what the draft path may override, the repr's model=None
    assert entry["field_values"] == {"sample_method": {"values": ["greedy", "probabilistic"], "open": False}}
    assert entry["method_from_model"] == {"names": {"[ngram]": "ngram", "ngram": "ngram"}, "custom_class_path": True}
    assert entry["detect_keeps"] == ["eagle", "eagle3"] and entry["detect_skips"] == ["ngram"]
    assert entry["repr_model_none"] == ["custom_class", "ngram"]
    assert entry["engine_file"] == "vllm/engine/arg_utils.py"
    # a release that passes the dict on as written, and has no shorthand flags
    (pkg / "engine" / "arg_utils.py").write_text(TINY_ARG_UTILS.replace("self.speculative_config.items()", "x.items()")
                                                 .replace("get_kwargs(SpeculativeConfig)", "get_kwargs(ModelConfig)"))
    older = tables.read_release(str(tmp_path))
    assert older["hyphen_keys"] is False and older["shorthand_flags"] == {}
    (pkg / "engine" / "arg_utils.py").unlink()
    with pytest.raises(tables.SourceError, match="no vllm/engine/arg_utils.py"):
        tables.read_release(str(tmp_path))
    (pkg / "engine" / "arg_utils.py").write_text(TINY_ARG_UTILS)
    with pytest.raises(tables.SourceError, match="not the tree's own commit"):
        tables.read_release(str(tmp_path), commit="f" * 40)
    # --write merges it and computes what changed against the previous release
    data = tmp_path / "releases.py"
    tables.write({"0.98": dict(RELEASES[MINORS[-1]], version="0.98.0"), "0.99": entry}, str(data))
    merged = tables.load(str(data))
    assert merged["0.99"]["keys_added"] == ["new_knob", "sample_method"] and "rejection_sample_method" in merged["0.99"]["keys_removed"]
