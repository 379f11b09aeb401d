# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KServe releases the collection knows, and what a newer one may bring.

* ``KNOWN_RELEASES`` / ``NEWEST_KNOWN``; ``rules_release(version)`` gives the release whose rules apply (a newer KServe
  gets the newest known rules and a warning naming it: it is never refused for its number).
* The spec fields of KServe v0.20's InferenceService and LLMInferenceService CRDs (config/crd/full at tag v0.20.0, plus
  ``rolloutStrategy`` of the LLMInferenceService CRD in ../shared/kserve-crds, which the test bed installs as v0.20).
  ``newer_crd_fields(crd)`` names the fields a cluster's InferenceService CRD has and v0.20's has not: a newer KServe.
  ``kserve_version_from_crd(crd)``: the lowest release whose CRD has the fields a cluster's has (kserve_info's read; here,
  not in the render, so the read does not import the render).
* ``unknown_speculative_fields(obj)``: fields of a resource that v0.20 does not have and whose name says they carry
  speculative settings (KServe has an open proposal for ``spec.speculator`` on LLMInferenceService). The collection
  finds speculative decoding in vLLM's command line only; ``refuse_unknown_speculative_fields`` makes verify and rollback
  refuse such a resource instead of reporting "no flag".

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

KNOWN_RELEASES = ((0, 15, 0), (0, 16, 0), (0, 19, 0), (0, 20, 0))
NEWEST_KNOWN = KNOWN_RELEASES[-1]

ISVC_SPEC_FIELDS = frozenset(("canary", "explainer", "predictor", "transformer"))
PREDICTOR_FIELDS = frozenset((
    "activeDeadlineSeconds", "affinity", "annotations", "autoScaling", "automountServiceAccountToken", "batcher",
    "canaryTrafficPercent", "containerConcurrency", "containers", "deploymentStrategy", "dnsConfig", "dnsPolicy",
    "enableServiceLinks", "hostAliases", "hostIPC", "hostNetwork", "hostPID", "hostUsers", "hostname", "hostnameOverride",
    "huggingface", "imagePullSecrets", "initContainers", "labels", "lightgbm", "logger", "maxReplicas", "minReplicas", "model",
    "name", "nodeName", "nodeSelector", "onnx", "os", "overhead", "paddle", "pmml", "preemptionPolicy", "priority",
    "priorityClassName", "pytorch", "readinessGates", "resourceClaims", "resources", "restartPolicy", "runtimeClassName",
    "scaleMetric", "scaleMetricType", "scaleTarget", "schedulerName", "schedulingGates", "securityContext", "serviceAccount",
    "serviceAccountName", "setHostnameAsFQDN", "shareProcessNamespace", "sklearn", "storageContainerName", "storageUris",
    "subdomain", "tensorflow", "terminationGracePeriodSeconds", "timeout", "tolerations", "topologySpreadConstraints",
    "triton", "volumes", "workerSpec", "xgboost"))
LLMISVC_SPEC_FIELDS = frozenset((
    "annotations", "baseRefs", "kvCacheOffloading", "labels", "model", "parallelism", "prefill", "replicas",
    "rolloutStrategy", "router", "scaling", "storageInitializer", "template", "tracing", "worker"))
LLMISVC_POOL_FIELDS = frozenset((
    "annotations", "kvCacheOffloading", "labels", "parallelism", "replicas", "rolloutStrategy", "scaling", "template", "worker"))
# Words that mark a field as speculative settings (lowercase, matched inside the field name).
SPECULATIVE_WORDS = ("specul",)
_IMAGE_TAG = re.compile(r":v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$")


def format_release(version):
    return "%d.%d.%d" % tuple(version)


def rules_release(version):
    """``(release whose rules apply, warning or None)`` for a cluster of KServe ``version`` (a tuple)."""
    version = tuple(version)
    if version > NEWEST_KNOWN:
        return NEWEST_KNOWN, newer_warning("KServe %s" % format_release(version))
    return version, None


def newer_warning(what):
    return ("%s is newer than the KServe releases this collection knows (up to %s): its rules are taken as %s's. Check the "
            "rendered manifest against that release's notes, or upgrade the collection" % (
                what, format_release(NEWEST_KNOWN), format_release(NEWEST_KNOWN)))


def _props(node, *path):
    for key in path:
        node = ((node or {}).get("properties") or {}).get(key)
    return set(((node or {}).get("properties") or {}))


def newer_crd_fields(crd):
    """Fields the InferenceService CRD's v1beta1 schema has and KServe v0.20's has not (``spec.x``,
    ``spec.predictor.y``), sorted; empty for v0.20 and older."""
    try:
        schema = next(v for v in crd["spec"]["versions"] if v.get("name") == "v1beta1")["schema"]["openAPIV3Schema"]
    except (KeyError, TypeError, StopIteration):
        return []
    spec = _props(schema, "spec")
    predictor = _props(schema, "spec", "predictor")
    return sorted(["spec." + f for f in spec - ISVC_SPEC_FIELDS] + ["spec.predictor." + f for f in predictor - PREDICTOR_FIELDS])


def release_from_image(image):
    """The release an image tag names (``kserve/storage-initializer:v0.21.0`` -> (0, 21, 0)), or None (``latest``)."""
    match = _IMAGE_TAG.search(str(image or ""))
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def _speculative(name):
    return any(word in str(name).lower() for word in SPECULATIVE_WORDS)


def unknown_speculative_fields(obj):
    """Paths of fields KServe v0.20 does not have and whose name marks them as speculative settings: directly under
    ``spec`` and ``spec.predictor`` of an InferenceService, ``spec`` and ``spec.prefill`` of an LLMInferenceService."""
    spec = (obj or {}).get("spec") or {}
    if (obj or {}).get("kind") == "LLMInferenceService":
        places = (("spec", spec, LLMISVC_SPEC_FIELDS), ("spec.prefill", spec.get("prefill"), LLMISVC_POOL_FIELDS))
    else:
        places = (("spec", spec, ISVC_SPEC_FIELDS), ("spec.predictor", spec.get("predictor"), PREDICTOR_FIELDS))
    found = []
    for where, node, known in places:
        if isinstance(node, dict):
            found += ["%s.%s" % (where, key) for key in sorted(node) if key not in known and _speculative(key)]
    return found


def refuse_unknown_speculative_fields(obj):
    """Raise when ``obj`` carries speculative settings in a field the collection does not know: verify cannot say
    whether speculative decoding runs, and a rollback would report "no flag" while KServe keeps it on."""
    found = unknown_speculative_fields(obj)
    if not found:
        return
    meta = (obj or {}).get("metadata") or {}
    raise ValidationError(
        "%s %s/%s carries %s, a field KServe %s does not have: a newer KServe may run speculative decoding from it, which "
        "this collection can neither see nor strip, so it refuses to verify or roll back; nothing was written" % (
            obj.get("kind") or "InferenceService", meta.get("namespace"), meta.get("name"), ", ".join(found),
            format_release(NEWEST_KNOWN)),
        field=found[0],
        hint="remove %s from the resource (its GitOps source, or kubectl edit) and put the speculative settings in vLLM's "
             "--speculative-config, or use a collection release that knows the field" % ", ".join(found))


def kserve_version_from_crd(crd):
    """Lowest KServe release whose InferenceService CRD has the fields this one has.

    `spec.canary` arrived in v0.20 (several oci:// storageUris work from then), `spec.predictor.storageUris`
    in v0.16. Returns (version, evidence).
    """
    try:
        versions = crd["spec"]["versions"]
        schema = next(v for v in versions if v.get("name") == "v1beta1")["schema"]["openAPIV3Schema"]
        spec = schema["properties"]["spec"]["properties"]
    except (KeyError, TypeError, StopIteration):
        return (0, 15, 0), "the InferenceService CRD has no readable v1beta1 schema: assuming KServe 0.15 (no storageUris)"
    predictor = (spec.get("predictor") or {}).get("properties") or {}
    newer = newer_crd_fields(crd)
    if newer:
        return NEWEST_KNOWN, "the CRD has %s, which KServe %s's has not: %s" % (
            ", ".join(newer), format_release(NEWEST_KNOWN), newer_warning("this KServe"))
    if "canary" in spec and "storageUris" in predictor:
        return (0, 20, 0), "the CRD has spec.canary and spec.predictor.storageUris (KServe 0.20+)"
    if "storageUris" in predictor:
        return (0, 16, 0), "the CRD has spec.predictor.storageUris (KServe 0.16+)"
    return (0, 15, 0), "the CRD has no spec.predictor.storageUris (KServe before 0.16)"
