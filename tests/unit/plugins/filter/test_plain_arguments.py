# pylint: disable=unidiomatic-typecheck  # the exact builtin type is what is under test
"""plugin_utils/plain_data.py: what a filter hands the collection's module_utils is builtin data, whatever subclass
Ansible passed in (lazy template containers, tagged str), so their deep copies copy data and no templating context."""
from collections import UserDict

from ansible.module_utils._internal._datatag import AnsibleTagHelper  # pylint: disable=import-error,no-name-in-module
from ansible._internal._datatag._tags import Origin  # pylint: disable=import-error,no-name-in-module

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
