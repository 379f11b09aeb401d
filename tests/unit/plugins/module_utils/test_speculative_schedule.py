"""num_speculative_tokens_per_batch_size: vLLM's own test vectors (ported as data), the releases that have the key."""

import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_schedule as sched
from tests.paths import capture_path

with open(capture_path("", "dynamic_sd_schedule.json"), encoding="utf-8") as _handle:
    VECTORS = json.load(_handle)

DRAFT = {"method": "draft_model", "model": "/mnt/models/draft", "num_speculative_tokens": 3}


@pytest.mark.parametrize("case", VECTORS["lookups"], ids=lambda c: c["test"])
def test_vllm_lookup_vectors(case):
    """vLLM's test_dynamic_sd.py: the k at each batch size (gaps and the tail keep the previous k, capped at k)."""
    got = {size: sched.k_at(case["schedule"], int(size), case["num_speculative_tokens"]) for size in case["expect"]}
    assert got == case["expect"]


@pytest.mark.parametrize("case", VECTORS["refused"], ids=lambda c: c["test"])
def test_vllm_refusal_vectors(case):
    with pytest.raises(ValidationError) as err:
        sched.normalise(case["schedule"])
    assert case["vllm_says"] in str(err.value)
    assert err.value.field.startswith(sched.KEY)
    assert err.value.hint


@pytest.mark.parametrize("schedule, field, words", [
    ([[0, 4, 3]], sched.KEY + "[0]", "not positive"),
    ([[1, 4, 3], [9, 8, 1]], sched.KEY + "[1]", "above its end"),
    ([[1, 4, "3"]], sched.KEY + "[0]", "whole number"),
    ([[1, 4, True]], sched.KEY + "[0]", "whole number"),
    ({"1": 3}, sched.KEY, "must be a list"),
])
def test_rules_beyond_the_vectors(schedule, field, words):
    """vLLM's rules file also refuses non-positive and reversed ranges; pydantic refuses non-numbers."""
    with pytest.raises(ValidationError) as err:
        sched.normalise(schedule)
    assert err.value.field == field
    assert words in str(err.value)


def test_unsorted_entries_are_sorted_as_vllm_does():
    assert sched.normalise([(9, 32, 1), (1, 8, 3)]) == [[1, 8, 3], [9, 32, 1]]


def test_describe_says_what_each_k_covers():
    assert sched.describe([[1, 16, 3], [32, 128, 2], [256, 2048, 0]]) == "1-31: k=3; 32-255: k=2; 256+: k=0"
    assert sched.describe([[1, 1, 3], [2, 64, 1]]) == "1: k=3; 2+: k=1"


@pytest.mark.parametrize("version", ["0.24.0", "0.32.0", "0.34.0", None])
def test_accepted_from_the_release_that_added_it(version):
    schedule = [[2, 64, 1], [1, 1, 3]]
    result = core.validate(dict(DRAFT, num_speculative_tokens_per_batch_size=schedule), vllm_version=version)
    assert result.config[sched.KEY] == [[1, 1, 3], [2, 64, 1]]
    assert '"num_speculative_tokens_per_batch_size":[[1,1,3],[2,64,1]]' in result.json


@pytest.mark.parametrize("version, tail", [("0.23.0", "Unexpected keyword argument"), ("0.20.0", "Unexpected keyword argument"),
                                           ("0.11.0", "silently drops it")])
def test_refused_before_the_release_that_added_it(version, tail):
    with pytest.raises(ValidationError) as err:
        core.validate(dict(DRAFT, method="eagle3", num_speculative_tokens_per_batch_size=[[1, 8, 3]]), vllm_version=version)
    assert err.value.field == "config.num_speculative_tokens_per_batch_size"
    assert "was added in vLLM 0.24 (you target %s)" % version in str(err.value)
    assert tail in str(err.value)
    assert "upgrade the runtime image to vLLM 0.24 or newer, or drop it" == err.value.hint


def test_the_first_release_with_the_key_is_the_tables_own():
    """The release comes from the tables read from vLLM's source (0.24), not from a constant here."""
    assert core.releases_with(sched.KEY, "key")[0] == "0.24"


def test_validate_refuses_a_bad_schedule_with_the_config_field():
    with pytest.raises(ValidationError) as err:
        core.validate(dict(DRAFT, num_speculative_tokens_per_batch_size=[[2, 8, 3]]), vllm_version="0.32.0")
    assert err.value.field == "config.num_speculative_tokens_per_batch_size"
    assert "must start at 1" in str(err.value)
    assert err.value.hint == "begin with [1, 1, k]"


def test_a_k_above_num_speculative_tokens_is_a_warning():
    """vLLM caps it (test_dynamic_sd_clamps_k_to_runtime_max): allowed, but said."""
    result = core.validate(dict(DRAFT, num_speculative_tokens_per_batch_size=[[1, 8, 5], [9, 64, 1]]), vllm_version="0.32.0")
    capped = [w for w in result.warnings if "caps them at 3" in w]
    assert len(capped) == 1 and "[1, 8, 5]" in capped[0] and "[9, 64, 1]" not in capped[0]
