# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""KServe's CRD validation rules (``x-kubernetes-validations``, CEL) checked on every manifest the collection renders,
before anything is written: a manifest a Kubernetes 1.25+ API server would refuse (KServe documents 1.32+ for
LLMInferenceService) is refused here with the rule's own message and field, also where the API server is older and
cannot evaluate the rules (the test bed's 1.20 cannot).

Where the rules come from:
- by default the KServe release the collection ships as data (``crd_rules_releases.py``, written by
  ``hack/kserve_crd_rules.py`` from that release's CRDs): the newest shipped release not newer than the cluster's
  KServe; a KServe newer than every shipped release gets the newest one, with a warning;
- ``kserve_crds`` (the isvc_manifest option, role variable ``inference_service_kserve_crds``): a CRD file or a
  directory of them, such as the cluster's own (``kubectl get crd -o yaml``): its rules replace the shipped ones.

The evaluation itself (defaulting, ``self`` per schema node, messages, fields, what is not evaluated) is
``kube/cel_rules.py``.
"""

from __future__ import annotations

import json
import os

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import cel_rules
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import crd_rules_releases

HAS_CEL = cel_rules.HAS_CEL
LIBRARY = cel_rules.LIBRARY
_cache = {}


def _version_key(text):
    return tuple(int(part) for part in text.split("."))


def releases():
    """The KServe releases whose rules are shipped, oldest first ("0.20", ...)."""
    return sorted(crd_rules_releases.RELEASES, key=_version_key)


def release_for(kserve_version=None):
    """``(release, warning or None)``: the shipped release to check a cluster of ``kserve_version`` (a tuple) against."""
    known = releases()
    if kserve_version is None:
        return known[-1], None
    wanted = tuple(kserve_version[:2])
    older = [r for r in known if _version_key(r) <= wanted]
    if not older:
        return known[0], None
    if wanted > _version_key(known[-1]):
        return known[-1], ("KServe %s is newer than the releases whose CRD rules the collection ships (newest %s): the "
                           "manifest is checked against the %s rules; set kserve_crds to the cluster's CRDs to check it "
                           "against its own" % (".".join(str(p) for p in kserve_version), known[-1], known[-1]))
    return older[-1], None


def shipped(release):
    """``{(group, kind): rules}`` of a shipped release (parsed once per process)."""
    key = ("release", release)
    if key not in _cache:
        data = json.loads(crd_rules_releases.RELEASES[release]["rules"])
        _cache[key] = {(entry["group"], entry["kind"]): entry for entry in data.values()}
    return _cache[key]


def _signature(path):
    files = [path] if os.path.isfile(path) else [os.path.join(path, n) for n in sorted(os.listdir(path))] if os.path.isdir(path) else []
    return tuple((name, os.path.getmtime(name), os.path.getsize(name)) for name in files if os.path.isfile(name))


def user_rules(path):
    """``{(group, kind): rules}`` of the CRDs in ``path`` (read once per process while the files are unchanged)."""
    path = os.path.expanduser(path)
    signature = _signature(path)
    if not signature and os.path.isdir(path):
        raise ValidationError("directory '%s' holds no CRD files" % path, field="kserve_crds",
                              hint="put the CRD YAMLs there (kubectl get crd llminferenceservices.serving.kserve.io -o yaml > llmisvc.yaml)")
    key = ("user", path, signature)
    if key not in _cache:
        _cache[key] = cel_rules.load_crds(path)
    return _cache[key]


def _rules_for(kserve_crds, kserve_version):
    if kserve_crds:
        return user_rules(kserve_crds), "the CRDs in %s" % kserve_crds, None
    release, warning = release_for(kserve_version)
    return shipped(release), "KServe %s's CRDs (shipped with the collection)" % release, warning


def check(manifest, kserve_crds=None, existing=None, kserve_version=None):
    """Raise ValidationError when ``manifest`` breaks a CEL rule of its CRD; else return
    ``{source, evaluated, not_evaluated: [{field, rule, reason}], warnings}``.

    ``existing`` is the object on the cluster (transition rules run against it); ``kserve_version`` (a tuple) picks the
    shipped release when ``kserve_crds`` (a path) is not given.
    """
    group, _sep, version = str(manifest.get("apiVersion") or "").rpartition("/")
    kind = manifest.get("kind")
    rules, source, warning = _rules_for(kserve_crds, kserve_version)
    warnings = [warning] if warning else []
    out = {"source": source, "evaluated": 0, "not_evaluated": [], "warnings": warnings}
    crd = rules.get((group, kind))
    if crd is None:
        return out
    if version not in crd["versions"]:
        out["not_evaluated"].append({"field": "apiVersion", "rule": "*", "reason": "%s has no %s version %s" % (source, kind, version)})
        warnings.append("%s: the x-kubernetes-validations rules are not checked: %s has no version %s" % (kind, source, version))
        return out
    result = cel_rules.evaluate(crd["versions"][version], manifest, old=existing)
    out["evaluated"] = len(result.evaluated)
    for item in result.not_evaluated:
        out["not_evaluated"].append(item._asdict())
        warnings.append("%s %s: x-kubernetes-validations rule not evaluated (%s): %s" % (kind, item.field, item.reason, item.rule))
    if result.violations:
        first = result.violations[0]
        more = "; ".join("%s: %s" % (v.field, v.message) for v in result.violations[1:])
        raise ValidationError("%s (x-kubernetes-validations rule `%s` of %s, %s %s)%s"
                              % (first.message, first.rule, source, kind, version, ("; also " + more) if more else ""),
                              field=first.field,
                              hint="a Kubernetes API server that evaluates CRD rules (1.25+; KServe documents 1.32+ for "
                                   "LLMInferenceService) refuses this manifest with the same message: change the value that "
                                   "renders %s%s" % (first.field, "" if kserve_crds else
                                                     ", or set kserve_crds to your cluster's own CRDs if its KServe differs"))
    return out
