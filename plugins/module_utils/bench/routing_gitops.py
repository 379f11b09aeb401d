# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The routing plan's HTTPRoute (bench/routing_plan.py) as a file of the deploy's GitOps directory: its name next to the
InferenceService's manifest (``<namespace>-<name>.httproute.yaml`` beside ``<namespace>-<name>.yaml``) and its text in the
deploy's deterministic YAML (kserve/isvc/render.to_yaml), so a rerun with the same decisions writes the same bytes and
commits nothing. The benchmark role's routes_gitops.yml writes it with kustomization.yaml and commits the directory.

For an LLMInferenceService the rules live in the resource itself (``spec.router.route``, kserve/llmisvc/router.py): a
second file for the same object would make kustomize refuse the directory, so ``llmisvc_manifest`` sets the route in the
deploy's own manifest of the speculative LLMInferenceService (``<namespace>-<name>.llmisvc.yaml``, written with the same
deterministic YAML, so only the route's lines change and a rerun with the same decisions writes the same bytes).

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError, optional_import
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import crd_rules
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import render as isvc
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import render as llmisvc_render
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import router as llmisvc_router
# a value that comes through Ansible's templating is a subclass YAML's SafeDumper does not represent: plain() makes it builtin
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.plain_data import plain

yaml = optional_import("yaml")[0]  # PyYAML comes with ansible-core; the filter runs on the controller

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


def manifest_yaml(route):
    """The route's file text: sorted keys, block style, as the deploy writes its manifests."""
    _checked(route)
    return isvc.to_yaml(plain(route))


def llmisvc_filename(route_object):
    """The deploy's GitOps file of the LLMInferenceService ``route_object`` names (kserve/llmisvc/render.manifest_filename)."""
    if not isinstance(route_object, dict) or route_object.get("kind") != llmisvc_router.KIND:
        raise ValidationError("is not an LLMInferenceService route", field="route",
                              hint="pass what the routing_plan filter returns with render=llmisvc")
    _name, namespace = _checked(dict(route_object, kind=ROUTE_KINDS[0]))
    if not namespace:
        raise ValidationError("has no metadata.namespace, so its GitOps file cannot be named", field="benchmark_routing_plan.namespace",
                              hint="give the LLMInferenceService's namespace (benchmark_namespace)")
    return llmisvc_render.manifest_filename(route_object)


def llmisvc_manifest(route_object, manifest_text):
    """``{filename, content}``: the deploy's manifest ``manifest_text`` of that LLMInferenceService with the route set
    (``router.with_route``: the router's other fields kept, a router naming its own HTTPRoutes refused) and the plan's
    summary annotation."""
    filename = llmisvc_filename(route_object)
    manifest = yaml.safe_load(manifest_text) if isinstance(manifest_text, str) and manifest_text.strip() else None
    meta = (manifest.get("metadata") or {}) if isinstance(manifest, dict) else {}
    wanted = route_object["metadata"]
    if not isinstance(manifest, dict) or (meta.get("name"), meta.get("namespace")) != (wanted["name"], wanted.get("namespace")):
        raise ValidationError("the GitOps directory has no manifest of LLMInferenceService %s/%s (%s)" % (
            wanted.get("namespace"), wanted["name"], filename), field="benchmark_gitops_dir",
            hint="deploy the LLMInferenceService in GitOps mode into this directory first, or write the route with write=apply")
    out = llmisvc_router.with_route(plain(manifest), plain(route_object["spec"]["router"]["route"]))
    annotations = dict(out["metadata"].get("annotations") or {})
    annotations.update(plain(route_object["metadata"].get("annotations") or {}))
    out["metadata"]["annotations"] = annotations
    crd_rules.check(out)  # KServe's CEL rules on the whole manifest, as the deploy's render checks it
    return {"filename": filename, "content": isvc.to_yaml(out)}
