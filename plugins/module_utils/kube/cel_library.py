# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CEL functions kube-apiserver adds to CRD validation rules, for ``kube/cel_rules.py``.

kube-apiserver (k8s.io/apiserver/pkg/cel/library) adds to standard CEL: the list library (``isSorted``, ``sum``,
``min``, ``max``; its list ``indexOf``/``lastIndexOf`` are not here: cel-expr-python lets no function be declared
twice and the strings extension declares them for strings), the regex library (``find``, ``findAll``), the URL library
(``url``, ``isURL``, ``getScheme`` ...), the quantity library (``quantity``, ``isQuantity``, ``compareTo`` ...) and
cel-go's sets extension (``sets.contains``, ``sets.equivalent``, ``sets.intersects``). The strings and optional
extensions come with cel-expr-python itself (``kube/cel_rules.py`` turns them on).

cel-expr-python hands Python functions plain values only, so a URL and a quantity are one-key maps here
(``{"kubernetes.URL": "https://..."}``, ``{"kubernetes.Quantity": "<exact value as a fraction>"}``): every function of
those libraries works on them and two quantities of one value compare equal, as on the API server. What differs:
``type(quantity('1'))`` is a map here. The IP/CIDR, format and semver libraries (Kubernetes 1.31+) are not here:
a rule that calls them does not compile and is listed as not evaluated, never passed.
"""

from __future__ import annotations

import re
from fractions import Fraction
from urllib.parse import urlsplit, parse_qs

QUANTITY = "kubernetes.Quantity"
URL = "kubernetes.URL"
_QUANTITY_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_INT64 = (-(2 ** 63), 2 ** 63 - 1)


class CelFunctionError(ValueError):
    """A Kubernetes CEL function was called with a value it refuses (the API server's evaluation error)."""


# -- lists ----------------------------------------------------------------------------------------------------------

def _is_sorted(items):
    return all(items[i] <= items[i + 1] for i in range(len(items) - 1))


def _sum(items):
    total = 0
    for item in items:
        total += item
    return total


def _min(items):
    if not items:
        raise CelFunctionError("min of an empty list")
    return min(items)


def _max(items):
    if not items:
        raise CelFunctionError("max of an empty list")
    return max(items)


# -- regex ----------------------------------------------------------------------------------------------------------

def _find(text, pattern):
    match = re.search(pattern, text)
    return match.group(0) if match else ""


def _find_all(text, pattern, limit=-1):
    found = [m.group(0) for m in re.finditer(pattern, text)]
    return found if limit < 0 else found[:limit]


# -- URLs -----------------------------------------------------------------------------------------------------------

def _parse_url(text):
    # Go's url.ParseRequestURI: an absolute URL or an absolute path, nothing relative.
    parts = urlsplit(text)
    if not (parts.scheme or text.startswith("/")) or " " in text:
        raise CelFunctionError("URL parse error during conversion from string: %s" % text)
    return parts


def _url(text):
    _parse_url(text)
    return {URL: text}


def _is_url(text):
    try:
        _parse_url(text)
    except (CelFunctionError, ValueError):
        return False
    return True


def _url_part(name):
    def get(url):
        parts = urlsplit(url[URL])
        if name == "scheme":
            return parts.scheme
        if name == "host":
            return parts.netloc.rsplit("@", 1)[-1]
        if name == "hostname":
            return parts.hostname or ""
        if name == "port":
            return "" if parts.port is None else str(parts.port)
        if name == "path":
            return parts.path
        return dict(parse_qs(parts.query, keep_blank_values=True))
    return get


# -- quantities -----------------------------------------------------------------------------------------------------

def parse_quantity(text):
    """resource.Quantity's value as an exact Fraction; CelFunctionError for what ParseQuantity refuses."""
    match = _QUANTITY_RE.match(text.strip()) if isinstance(text, str) else None
    if not match or text != text.strip():
        raise CelFunctionError("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    number, suffix = Fraction(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * 1024 ** _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * Fraction(10) ** _DECIMAL[suffix]
    if suffix:
        return number * Fraction(10) ** int(suffix[1:])
    return number


def _q(value):
    return Fraction(value[QUANTITY])


def _quantity(fraction):
    return {QUANTITY: str(fraction)}


def _as_integer(value):
    number = _q(value)
    if number.denominator != 1 or not _INT64[0] <= number <= _INT64[1]:
        raise CelFunctionError("cannot convert value to integer")
    return int(number)


def _is_quantity(text):
    try:
        parse_quantity(text)
    except CelFunctionError:
        return False
    return True


def _sign(value):
    number = _q(value)
    return (number > 0) - (number < 0)


def _compare(a, b):
    x, y = _q(a), _q(b)
    return (x > y) - (x < y)


# -- sets (cel-go ext.Sets) -----------------------------------------------------------------------------------------

def _sets_contains(items, subset):
    return all(any(x == y for y in items) for x in subset)


def _sets_intersects(a, b):
    return any(x == y for x in a for y in b)


def declarations(cel):
    """The FunctionDecls to give ``cel.NewEnv(functions=...)``: ``cel`` is the ``cel_expr_python.cel`` module."""
    t = cel.Type
    dyn, string, boolean, integer = t.DYN, t.STRING, t.BOOL, t.INT
    lst, obj = t.List(t.DYN), t.Map(t.STRING, t.DYN)

    def decl(name, *overloads):
        return cel.FunctionDecl(name, [cel.Overload(oid, ret, params, is_member=member, impl=impl)
                                       for oid, ret, params, member, impl in overloads])

    return [
        decl("isSorted", ("list_is_sorted", boolean, [lst], True, _is_sorted)),
        decl("sum", ("list_sum", dyn, [lst], True, _sum)),
        decl("min", ("list_min", dyn, [lst], True, _min)),
        decl("max", ("list_max", dyn, [lst], True, _max)),
        decl("find", ("string_find", string, [string, string], True, _find)),
        decl("findAll", ("string_find_all", t.List(string), [string, string], True, _find_all),
             ("string_find_all_n", t.List(string), [string, string, integer], True, _find_all)),
        decl("url", ("string_to_url", obj, [string], False, _url)),
        decl("isURL", ("is_url_string", boolean, [string], False, _is_url)),
        decl("getScheme", ("url_get_scheme", string, [obj], True, _url_part("scheme"))),
        decl("getHost", ("url_get_host", string, [obj], True, _url_part("host"))),
        decl("getHostname", ("url_get_hostname", string, [obj], True, _url_part("hostname"))),
        decl("getPort", ("url_get_port", string, [obj], True, _url_part("port"))),
        decl("getEscapedPath", ("url_get_escaped_path", string, [obj], True, _url_part("path"))),
        decl("getQuery", ("url_get_query", t.Map(string, t.List(string)), [obj], True, _url_part("query"))),
        decl("quantity", ("string_to_quantity", obj, [string], False, lambda text: _quantity(parse_quantity(text)))),
        decl("isQuantity", ("is_quantity_string", boolean, [string], False, _is_quantity)),
        decl("isInteger", ("quantity_is_integer", boolean, [obj], True, lambda q: _q(q).denominator == 1)),
        decl("asInteger", ("quantity_get_int", integer, [obj], True, _as_integer)),
        decl("asApproximateFloat", ("quantity_get_float", t.DOUBLE, [obj], True, lambda q: float(_q(q)))),
        decl("sign", ("quantity_sign", integer, [obj], True, _sign)),
        decl("add", ("quantity_add", obj, [obj, obj], True, lambda a, b: _quantity(_q(a) + _q(b))),
             ("quantity_add_int", obj, [obj, integer], True, lambda a, b: _quantity(_q(a) + b))),
        decl("sub", ("quantity_sub", obj, [obj, obj], True, lambda a, b: _quantity(_q(a) - _q(b))),
             ("quantity_sub_int", obj, [obj, integer], True, lambda a, b: _quantity(_q(a) - b))),
        decl("isLessThan", ("quantity_less", boolean, [obj, obj], True, lambda a, b: _compare(a, b) < 0)),
        decl("isGreaterThan", ("quantity_greater", boolean, [obj, obj], True, lambda a, b: _compare(a, b) > 0)),
        decl("compareTo", ("quantity_compare", integer, [obj, obj], True, _compare)),
        decl("sets.contains", ("list_sets_contains_list", boolean, [lst, lst], False, _sets_contains)),
        decl("sets.equivalent", ("list_sets_equivalent_list", boolean, [lst, lst], False,
                                 lambda a, b: _sets_contains(a, b) and _sets_contains(b, a))),
        decl("sets.intersects", ("list_sets_intersects_list", boolean, [lst, lst], False, _sets_intersects)),
    ]
