"""prometheus_text: the collection's one /metrics reader (line filter by metric name + prometheus_client's parser).

Expected lines and numbers are read from the capture files with plain string operations, not with the code under test.
"""
import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import prometheus_text
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

from tests.paths import read_capture  # noqa: E402  pylint: disable=wrong-import-position


def read(folder):
    return read_capture(folder, "metrics.txt")


def test_filter_keeps_the_named_families_only():
    text = read("ngram")
    expected = [line for line in text.splitlines()
                if line.startswith(("vllm:prefix_cache_", "# HELP vllm:prefix_cache_", "# TYPE vllm:prefix_cache_"))]
    assert len(expected) == 12  # metrics.txt lines 105-116: queries and hits, _total and _created
    assert prometheus_text.filter_lines(text, ("prefix_cache_",)) == "\n".join(expected) + "\n"
    # Lines that merely mention the words are not taken: the HELP text of vllm:prompt_tokens_cached_by_source
    # names vllm:prefix_cache_hits, the cache_config_info gauge has a prefix_cache_retention_interval label,
    # and vllm:external_prefix_cache_* is another family.
    assert "vllm:prefix_cache_hits" in text.split("# HELP vllm:prompt_tokens_cached_by_source_total", 1)[1].split("\n", 1)[0]
    assert 'prefix_cache_retention_interval="0"' in text
    assert "vllm:external_prefix_cache_hits_total{" in text
    assert prometheus_text.filter_lines(text.encode(), ("prefix_cache_",)) == "\n".join(expected) + "\n"  # bytes too
    assert prometheus_text.filter_lines(text, ("no_such_family_",)) == ""
    assert prometheus_text.filter_lines("", ("prefix_cache_",)) == ""


def test_samples_from_a_capture():
    text = read("ngram")
    samples = prometheus_text.parse_samples(text, ("prefix_cache_", "cache_config_info"))
    literal = {}
    for line in text.splitlines():
        if line.startswith(("vllm:prefix_cache_", "vllm:cache_config_info{")) and "_created{" not in line:
            literal[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
    assert literal == {"vllm:prefix_cache_queries_total": 540.0, "vllm:prefix_cache_hits_total": 0.0, "vllm:cache_config_info": 1.0}
    assert {s.name: s.value for s in samples} == literal  # no _created series
    assert len(samples) == 3
    info = [s for s in samples if s.name == "vllm:cache_config_info"][0]
    assert info.labels["enable_prefix_caching"] == "True" and info.labels["engine"] == "0" and "model_name" not in info.labels


def test_nan_samples_are_left_out():
    text = "# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\"} NaN\n" \
           "vllm:prefix_cache_queries_total{engine=\"1\"} 4.0\n"
    assert [(s.labels["engine"], s.value) for s in prometheus_text.parse_samples(text, ("prefix_cache_",))] == [("1", 4.0)]


def test_invalid_lines_name_the_field_and_the_fix():
    bad = 'vllm:prefix_cache_hits_total{engine="0" 12\n'
    with pytest.raises(ValidationError, match=r"^scrape: the prefix_cache_\* lines are not valid Prometheus text: .*Fix: point at "
                                              r"vLLM's /metrics endpoint"):
        prometheus_text.parse_samples(bad, ("prefix_cache_",), field="scrape")
    # The same page, lines of other families only: those are never parsed.
    assert prometheus_text.parse_samples(bad, ("spec_decode_",)) == []


def test_missing_library_is_reported_by_both_callers(monkeypatch):
    monkeypatch.setattr(prometheus_text, "HAS_PROMETHEUS_CLIENT", False)
    text = read("ngram")
    with pytest.raises(ValidationError) as err:
        prometheus_text.parse_samples(text, ("prefix_cache_",))
    assert str(err.value) == ("metrics: the prometheus_client Python library is missing. "
                              "Fix: pip install prometheus_client on the host that runs the module")
    with pytest.raises(ValidationError, match="^metrics: the prometheus_client Python library is missing"):
        spec_metrics.parse_prometheus(text)
    # The benchmark has measured already when it reads the page: the prefix cache becomes unknown, no crash.
    assert bench_client.prefix_cache_counters(text) is None and bench_client.prefix_caching_enabled(text) is None
