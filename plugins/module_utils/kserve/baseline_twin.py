# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The baseline twin of a speculative-decoding InferenceService, for an A/B benchmark.

The twin is the same InferenceService under another name with every speculative flag cut out of the
predictor's command and args (the rollback's own strip, ``isvc_patch.plan_strip``), so the only difference
the benchmark measures is speculative decoding. Everything else in ``spec`` is copied as it is: storage
(the draft stays mounted, unused, as after a rollback), resources, runtime, env, replicas. Plain Python,
no Ansible imports.
"""

from __future__ import annotations

import copy
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import owner_marks

TWIN_LABEL = "spec-decoding.alauda.io/baseline-twin"
TWIN_OF_ANNOTATION = "spec-decoding.alauda.io/baseline-twin-of"
DEFAULT_SUFFIX = "-baseline"
# Annotations that describe the source object's own history, not its serving behaviour; and the marks of the source's
# owner (Argo CD, Flux, Helm): the twin is the benchmark's, not the owner's (Argo CD would prune it as part of its app).
DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration", isvc_patch.BACKUP_ANNOTATION) + owner_marks.OWNER_ANNOTATIONS
DROPPED_LABELS = owner_marks.OWNER_LABELS
# KServe names InferenceServices as DNS-1035 labels (the predictor Service takes the name plus "-predictor").
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 63


def twin_metadata(meta, name=None, suffix=DEFAULT_SUFFIX):
    """The twin's metadata from its source's (an InferenceService's or an LLMInferenceService's): its name, the source's
    labels and annotations less DROPPED_*, the twin label and the annotation naming its source."""
    source, namespace = meta.get("name"), meta.get("namespace")
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in DROPPED_ANNOTATIONS}
    annotations[TWIN_OF_ANNOTATION] = "%s/%s" % (namespace, source) if namespace else source
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in DROPPED_LABELS}
    labels[TWIN_LABEL] = "true"
    out = {"name": twin_name(source, name, suffix or DEFAULT_SUFFIX), "labels": labels, "annotations": annotations}
    if namespace:
        out["namespace"] = namespace
    return out


def twin_name(source_name, name=None, suffix=DEFAULT_SUFFIX, field="name"):
    """The twin's name: ``name`` when given, else ``<source_name><suffix>``; checked as a DNS-1035 label."""
    out = name or "%s%s" % (source_name, suffix)
    if not _NAME.match(out) or len(out) > MAX_NAME:
        raise ValidationError("%r is not a valid InferenceService name (a DNS-1035 label: lower case letters, digits and '-', "
                              "starting with a letter, at most %d characters)" % (out, MAX_NAME), field=field,
                              hint="set a shorter or valid name for the baseline twin")
    return out


def is_twin(obj):
    """True when ``obj`` was made by :func:`baseline_twin` (so it may be overwritten or deleted)."""
    labels = (((obj or {}).get("metadata") or {}).get("labels")) or {}
    return labels.get(TWIN_LABEL) == "true"


def baseline_twin(isvc, name=None, suffix=DEFAULT_SUFFIX):
    """The manifest of the baseline twin of ``isvc`` (an InferenceService as read from the API server).

    Raises ValidationError when ``isvc`` runs no speculative decoding (it already is a baseline) or when
    the name is not valid.
    """
    if not isinstance(isvc, dict) or not isinstance((isvc.get("spec") or {}).get("predictor"), dict):
        raise ValidationError("is not an InferenceService with spec.predictor", field="candidate",
                              hint="pass the object returned by kubernetes.core.k8s_info (resources[0])")
    meta = isvc.get("metadata") or {}
    source = meta.get("name")
    if not source:
        raise ValidationError("has no metadata.name", field="candidate", hint="pass the InferenceService as read from the cluster")
    plan = isvc_patch.plan_strip(isvc)
    if not plan.changed:
        raise ValidationError("InferenceService %s runs no --speculative-config, so it already is a baseline" % source,
                              field="candidate", hint="benchmark it as the baseline (benchmark_baseline_name) instead of "
                                                      "deploying a twin, or name the speculative-decoding InferenceService")
    stripped = isvc_patch.apply_patch(isvc, isvc_patch.build_patch(isvc, plan))
    return {
        "apiVersion": isvc.get("apiVersion") or "serving.kserve.io/v1beta1",
        "kind": isvc.get("kind") or "InferenceService",
        "metadata": twin_metadata(meta, name, suffix),
        "spec": copy.deepcopy(stripped["spec"]),
    }
