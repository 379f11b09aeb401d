# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The routing plan's HTTPRoute (bench/routing_plan.py) as a file of the deploy's GitOps directory: its name next to the
InferenceService's manifest (``<namespace>-<name>.httproute.yaml`` beside ``<namespace>-<name>.yaml``) and its text in the
deploy's deterministic YAML (kserve/isvc/render.to_yaml), so a rerun with the same decisions writes the same bytes and
commits nothing. The benchmark role's routes_gitops.yml writes it with kustomization.yaml and commits the directory.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc

ROUTE_KINDS = ("HTTPRoute",)
# k8s.io/apimachinery validation: an object name (DNS-1123 subdomain) and a namespace (DNS-1123 label)
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _checked(route):
    if not isinstance(route, dict) or route.get("kind") not in ROUTE_KINDS:
        raise ValidationError("is not an HTTPRoute manifest", field="route",
                              hint="pass what the routing_plan filter returns with render=httproute")
    meta = route.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not _SUBDOMAIN.match(name) or len(name) > 253:
        raise ValidationError("metadata.name %r is not a Kubernetes object name" % (name,), field="benchmark_routing_plan.name",
                              hint="lowercase letters, digits, '-' and '.', such as llama-classes")
    if namespace is not None and (not isinstance(namespace, str) or not _LABEL.match(namespace) or len(namespace) > 63):
        raise ValidationError("metadata.namespace %r is not a namespace name" % (namespace,), field="benchmark_routing_plan.namespace",
                              hint="a DNS-1123 label such as models")
    return name, namespace


def route_filename(route):
    """``<namespace>-<name>.httproute.yaml`` (``<name>.httproute.yaml`` without a namespace): next to the deploy's
    ``<namespace>-<name>.yaml`` of the InferenceService, and never the same name as one."""
    name, namespace = _checked(route)
    return "%s.httproute.yaml" % ("%s-%s" % (namespace, name) if namespace else name)


def _plain(value):
    """Plain dicts, lists and scalars: a value that comes through Ansible's templating is a subclass YAML's SafeDumper
    does not represent."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def manifest_yaml(route):
    """The route's file text: sorted keys, block style, as the deploy writes its manifests."""
    _checked(route)
    return isvc.to_yaml(_plain(route))
