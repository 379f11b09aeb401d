"""Issue #49 per release: the allowed values of Literal/Enum fields and vLLM's cross-field rules, read from every
release's source (hack/vllm_speculative_tables.py), are applied for that release only.

A value outside a release's Literal is refused where the release declares the Literal and accepted where its type also
takes any string or where the release does not have the Literal; a cross-field rule refuses only from the release that
raises it; a rule the tables could not read is named in a warning instead of being guessed."""

import os
import sys

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_rules as rules
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_releases import RELEASES

from tests.paths import REPO

sys.path.insert(0, os.path.join(REPO, "hack"))
import vllm_speculative_tables as tables  # noqa: E402  pylint: disable=wrong-import-position

MINORS = sorted(RELEASES, key=lambda m: tuple(int(p) for p in m.split(".")))
BASE = {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}
BOGUS = "no_such_value_x"


def _closed_literals(minor):
    return sorted(k for k, v in RELEASES[minor]["field_values"].items() if "values" in v and not v.get("open"))


def _open_literals(minor):
    return sorted(k for k, v in RELEASES[minor]["field_values"].items() if "values" in v and v.get("open"))


def _refusal(config, version):
    with pytest.raises(ValidationError) as info:
        core.validate(config, version)
    return str(info.value)


# --- the data ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("minor", MINORS)
def test_every_release_was_read_for_literals_and_rules(minor):
    table = RELEASES[minor]
    assert isinstance(table["field_values"], dict) and isinstance(table["code_rules"], dict)
    assert isinstance(table["code_rules_unread"], dict) and not set(table["code_rules"]) & set(table["code_rules_unread"])
    assert set(table["code_rules"]) | set(table["code_rules_unread"]) <= {r[0] for r in tables.CODE_RULES}
    # every Literal/Enum field the table names is one of the release's keys
    assert set(table["field_values"]) <= set(table["keys"])
    # 0.34 picks the method in per-method speculator configs, which the generator does not read: unknown, not guessed
    assert (table["method_from_model"] is None) == (minor == "0.34")


def test_what_the_tables_hold_follows_vllms_history():
    # facts checked against the sdists: quantization a closed Literal up to 0.18, open (`| str`) from 0.19;
    # rejection_sample_method from 0.18, 'fly' from 0.33; kv_cache_dtype from 0.26, open from 0.33
    assert not RELEASES["0.18"]["field_values"]["quantization"]["open"] and RELEASES["0.19"]["field_values"]["quantization"]["open"]
    assert "rejection_sample_method" not in RELEASES["0.17"]["keys"] and "rejection_sample_method" in RELEASES["0.18"]["field_values"]
    assert "fly" not in RELEASES["0.32"]["field_values"]["rejection_sample_method"]["values"]
    assert "fly" in RELEASES["0.33"]["field_values"]["rejection_sample_method"]["values"]
    assert "kv_cache_dtype" not in RELEASES["0.25"]["keys"] and not RELEASES["0.26"]["field_values"]["kv_cache_dtype"]["open"]
    assert RELEASES["0.33"]["field_values"]["kv_cache_dtype"]["open"]
    # the cross-field rules appear with their keys: synthetic acceptance in 0.20, the vocabulary rules in 0.25,
    # 'adaptive only with DSpark' in 0.28-0.29, replaced by 'not with use_local_argmax_reduction' in 0.30
    assert "synthetic_keys_need_synthetic" not in RELEASES["0.19"]["code_rules"] and "synthetic_keys_need_synthetic" in RELEASES["0.20"]["code_rules"]
    assert [m for m in MINORS if "adaptive_only_dspark" in RELEASES[m]["code_rules"]] == ["0.28", "0.29"]
    assert "adaptive_not_local_argmax" in RELEASES["0.30"]["code_rules"]
    assert sorted(RELEASES["0.34"]["code_rules_unread"]) == ["index_share_only_mtp", "suffix_limits"]
    # 0.10-0.16 wrote the ngram-from-model rule inside an `and`; it is read there too
    assert RELEASES["0.10"]["method_from_model"] == {"names": {"[ngram]": "ngram", "ngram": "ngram"}, "custom_class_path": False}


# --- Literal / Enum values, per release ----------------------------------------------------------------------------

@pytest.mark.parametrize("minor", MINORS)
def test_a_value_outside_a_closed_literal_is_refused_for_that_release(minor):
    version = RELEASES[minor]["version"]
    closed = _closed_literals(minor)
    assert closed, "every release has at least one closed Literal (quantization, later the sampling methods)"
    for key in closed:
        message = _refusal(dict(BASE, **{key: BOGUS}), version)
        assert message.startswith("config.%s:" % key) and BOGUS in message and version in message, message


@pytest.mark.parametrize("minor", MINORS)
def test_a_value_outside_the_literal_is_accepted_where_the_type_also_takes_any_string(minor):
    version = RELEASES[minor]["version"]
    for key in _open_literals(minor):
        assert core.validate(dict(BASE, **{key: BOGUS}), version).config[key] == BOGUS


@pytest.mark.parametrize("minor", MINORS)
def test_each_allowed_value_of_a_sampling_literal_is_accepted(minor):
    version = RELEASES[minor]["version"]
    for key in ("draft_sample_method", "moe_backend"):
        for value in RELEASES[minor]["field_values"].get(key, {}).get("values", []):
            assert core.validate(dict(BASE, **{key: value}), version).config[key] == value


def test_a_literal_value_is_refused_where_the_release_has_it_and_accepted_where_it_is_open():
    # kv_cache_dtype: CacheDType in 0.26-0.32, `CacheDType | str` from 0.33
    assert "config.kv_cache_dtype" in _refusal(dict(BASE, kv_cache_dtype="fp7"), "0.32.0")
    assert core.validate(dict(BASE, kv_cache_dtype="fp7"), "0.33.0").config["kv_cache_dtype"] == "fp7"
    # quantization: a closed Literal up to 0.18
    assert "config.quantization" in _refusal(dict(BASE, quantization="my_quant"), "0.18.0")
    assert core.validate(dict(BASE, quantization="my_quant"), "0.19.0").config["quantization"] == "my_quant"
    # rejection_sample_method 'fly' is 0.33's
    assert "config.rejection_sample_method" in _refusal(dict(BASE, rejection_sample_method="fly"), "0.32.0")
    assert core.validate(dict(BASE, rejection_sample_method="fly"), "0.33.0").config["rejection_sample_method"] == "fly"
    # attention_backend: a member name in any case, 'auto' means unset (SpeculativeConfig._parse_attention_backend, 0.21+)
    assert core.validate(dict(BASE, attention_backend="cpu_attn"), "0.21.0").config["attention_backend"] == "cpu_attn"
    assert "attention_backend" not in core.validate(dict(BASE, attention_backend="auto"), "0.21.0").config
    assert "config.attention_backend" in _refusal(dict(BASE, attention_backend="NO_SUCH_BACKEND"), "0.21.0")


# --- cross-field rules, per release --------------------------------------------------------------------------------

def test_synthetic_keys_without_synthetic_are_refused_from_the_release_that_refuses_them():
    config = dict(BASE, synthetic_acceptance_length=2.0)
    assert "rejection_sample_method='synthetic'" in _refusal(config, "0.20.0")
    assert "rejection_sample_method='synthetic'" in _refusal(config, "0.32.0")


def test_adaptive_verification_follows_each_releases_rule():
    config = dict(BASE, enable_adaptive_verification=True)
    for version in ("0.28.0", "0.29.0"):  # 'Adaptive verification only supported with DSpark'
        assert _refusal(config, version).startswith("config.enable_adaptive_verification:")
    assert core.validate(config, "0.30.0").config["enable_adaptive_verification"] is True
    both = dict(config, use_local_argmax_reduction=True)  # 0.30+: not with use_local_argmax_reduction
    assert _refusal(both, "0.30.0").startswith("config.enable_adaptive_verification:")


def test_heterogeneous_vocab_with_local_argmax_is_refused_only_where_vllm_refuses_it():
    config = {"method": "draft_model", "model": "/mnt/models/draft", "num_speculative_tokens": 3,
              "use_heterogeneous_vocab": True, "use_local_argmax_reduction": True}
    assert core.validate(config, "0.32.0").config["use_heterogeneous_vocab"] is True
    assert _refusal(config, "0.33.0").startswith("config.use_local_argmax_reduction:")


def test_ngram_named_by_model_runs_ngram_in_the_oldest_release_too():
    result = core.validate({"model": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}, "0.10.0")
    assert result.method == "ngram"
    assert any("vLLM 0.10.0 runs 'ngram'" in w for w in result.warnings), result.warnings


def test_a_rule_the_tables_could_not_read_is_named_not_guessed():
    # 0.34 checks index_share_for_mtp_iteration in its MTP speculator config (not read): accepted, with the file named
    result = core.validate(dict(BASE, index_share_for_mtp_iteration=True), "0.34.0")
    assert result.config["index_share_for_mtp_iteration"] is True
    text = "\n".join(result.warnings)
    assert "index_share_only_mtp" in text and "vllm/v1/worker/gpu/spec_decode/mtp/config.py" in text and "left to vLLM" in text
    assert "not checked against the draft path" in text
    # the same config is refused where the rule is in SpeculativeConfig
    assert _refusal(dict(BASE, index_share_for_mtp_iteration=True), "0.33.0").startswith("config.index_share_for_mtp_iteration:")
    assert rules.has_rule(RELEASES["0.34"], "index_share_only_mtp") is None
    assert rules.has_rule(RELEASES["0.33"], "index_share_only_mtp") is True
    assert rules.has_rule(RELEASES["0.28"], "index_share_only_mtp") is False
    assert rules.has_rule({"keys": {}}, "index_share_only_mtp") is None


# --- the generator on the older ways of writing these ----------------------------------------------------------------

OLD_POST_INIT = '''
class SpeculativeConfig:
    def __post_init__(self):
        if self.method is None and (self.model is not None and self.model in ("ngram", "[ngram]")):
            self.method = "ngram"

    def _verify_args(self):
        if self.num_speculative_tokens is None:
            raise ValueError("num_speculative_tokens must be provided with speculative model unless the draft model "
                             "config contains an n_predict parameter.")
        if self.rejection_sample_method != "synthetic" and self.synthetic_acceptance_length is not None:
            raise ValueError("synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
                             "rejection_sample_method='synthetic'.")
'''


def test_generator_reads_the_older_forms_and_marks_rules_raised_elsewhere(tmp_path):
    import ast  # pylint: disable=import-outside-toplevel
    cls = ast.parse(OLD_POST_INIT).body[0]
    post_init = cls.body[0]
    assert tables._method_from_model(post_init, {}) == {  # pylint: disable=protected-access
        "names": {"[ngram]": "ngram", "ngram": "ngram"}, "custom_class_path": False}
    other = tmp_path / "vllm" / "v1" / "worker" / "gpu" / "spec_decode" / "mtp"
    other.mkdir(parents=True)
    (other / "config.py").write_text('def check(x):\n    raise ValueError("index_share_for_mtp_iteration is only "\n'
                                     '                     "supported with method=\'mtp\'")\n')
    found, unread = tables._code_rules(cls, str(tmp_path))  # pylint: disable=protected-access
    assert found == {"k_required_without_draft_config": "SpeculativeConfig._verify_args",
                     "synthetic_keys_need_synthetic": "SpeculativeConfig._verify_args"}
    assert unread == {"index_share_only_mtp": "vllm/v1/worker/gpu/spec_decode/mtp/config.py"}
