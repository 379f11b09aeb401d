# pylint: disable=unidiomatic-typecheck  # the exact builtin type is what is under test
"""module_utils/kube/plain_data.py and plugin_utils/plain_data.py: what a filter hands the collection's module_utils is
builtin data, whatever subclass Ansible passed in (lazy template containers, tagged str), so their deep copies copy data
and no templating context, and YAML's SafeDumper can write it; the module_utils that take templated values use the same
helper."""
from collections import UserDict

import yaml

from ansible.module_utils._internal._datatag import AnsibleTagHelper  # pylint: disable=import-error,no-name-in-module
from ansible._internal._datatag._tags import Origin  # pylint: disable=import-error,no-name-in-module

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_gitops
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import plain_data
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import alert_rules
from ansible_collections.alauda.spec_decoding.plugins.plugin_utils.plain_data import plain, plain_arguments


class _Str(str):
    pass


def test_plain_gives_builtin_types_all_the_way_down():
    tagged = AnsibleTagHelper.tag("vllm serve", [Origin(path="/inventory.yml", line_num=3)])
    assert type(tagged) is not str  # what ansible-core 2.19 hands a filter
    value = UserDict({_Str("spec"): (tagged, True, 3, 1.5, None, [_Str("a")])})
    out = plain(value)
    assert out == {"spec": ["vllm serve", True, 3, 1.5, None, ["a"]]}
    assert type(out) is dict and type(next(iter(out))) is str
    items = out["spec"]
    assert [type(v) for v in items] == [str, bool, int, float, type(None), list] and type(items[5][0]) is str


def test_plain_arguments_converts_positional_and_keyword_arguments():
    seen = []

    @plain_arguments
    def fake_filter(obj, name=None):
        seen.append((obj, name))
        return obj

    fake_filter(UserDict({"a": (1, 2)}), name=_Str("twin"))
    assert seen == [({"a": [1, 2]}, "twin")] and type(seen[0][1]) is str and fake_filter.__name__ == "fake_filter"


def _tagged(text):
    return AnsibleTagHelper.tag(text, [Origin(path="/inventory.yml", line_num=7)])


def test_the_filters_and_module_utils_share_one_plain():
    assert plain is plain_data.plain
    assert not hasattr(alert_rules, "_plain") and not hasattr(routing_gitops, "_plain")


def test_tagged_values_reach_yaml_as_builtin_text_in_the_alert_rules_and_the_route_file():
    with_tags = alert_rules.build(UserDict({_Str("name"): _tagged("llama-eagle3"), "namespace": _tagged("models"),
                                            "method": "eagle3", "baseline": UserDict({"acceptance_rate": 0.62}),
                                            "rule_labels": {_Str("release"): _tagged("kube-prometheus-stack")}}))
    manifest = with_tags["manifest"]
    assert type(manifest["metadata"]["name"]) is str and manifest["metadata"]["name"] == "llama-eagle3-speculative-alerts"
    assert yaml.safe_load(with_tags["manifest_yaml"])["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
             "metadata": {"name": "llama-classes", "namespace": "models"},
             "spec": UserDict({_Str("parentRefs"): ({"name": _tagged("inference-gateway")},)})}
    text = routing_gitops.manifest_yaml(route)
    assert "!!python" not in text
    assert yaml.safe_load(text)["spec"] == {"parentRefs": [{"name": "inference-gateway"}]}
