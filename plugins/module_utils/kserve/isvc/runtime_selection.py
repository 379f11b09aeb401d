# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which ServingRuntime KServe (v0.20) gives an InferenceService's ``spec.predictor.model``.

Pinned to KServe's own test vectors (tests/fixtures/kserve/runtime_selection.yaml):

* a named runtime (``spec.predictor.model.runtime``): a ServingRuntime of the InferenceService's namespace, else a
  ClusterServingRuntime of that name (``GetServingRuntime``, pkg/controller/v1beta1/inferenceservice/utils/utils.go);
  then ``reconcileModel`` (pkg/controller/v1beta1/inferenceservice/components/predictor.go) refuses it when it is
  disabled, when the model sets a ``protocolVersion`` the runtime does not list, or when none of its
  ``supportedModelFormats`` (autoSelect or not) matches ``modelFormat``; and a predictor with a ``workerSpec`` needs a
  runtime with one (``multiNodeProcess``, same file). A named runtime with a ``workerSpec`` serves a single-node
  predictor.
* without a name KServe auto-selects (``ModelSpec.GetSupportingRuntimes``, pkg/apis/serving/v1beta1/predictor_model.go):
  enabled single-model runtimes with a ``workerSpec`` exactly when the predictor has one, an ``autoSelect: true``
  format entry matching ``modelFormat`` (name, or name:version), and the model's protocol (v1 when unset) among their
  ``protocolVersions`` (a runtime without any supports every protocol). Namespaced ones first; each group sorted by
  protocol priority (v1 < v2 < grpc-v1 < grpc-v2 < none), newest first, name, then by the ``priority`` of the runtime's
  first format entry of that name (highest first, unset last, ties keep that order).

Plain Python on a reader: ``reader.get(kind, namespace, name)`` returns the object or None, ``reader.list(kind,
namespace)`` the items (runtime_readers.py).
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

GROUP = "serving.kserve.io"
RUNTIME_VERSION = "v1alpha1"
SERVING_RUNTIME = "ServingRuntime"
CLUSTER_SERVING_RUNTIME = "ClusterServingRuntime"
RUNTIME_FIELD = "spec.predictor.model.runtime"
# pkg/constants ProtocolVersion (GetProtocolVersionInt): v1 < v2 < grpc-v1 < grpc-v2 < Unknown (also: no protocolVersions).
_PROTOCOL_RANK = {"v1": 1, "v2": 2, "grpc-v1": 3, "grpc-v2": 4}
_UNKNOWN_PROTOCOL = 5
# KServe's messages (predictor.go, utils.go), kept word for word so users can search them.
NOT_FOUND = "No ServingRuntimes or ClusterServingRuntimes with the name: %s"
DISABLED = "specified runtime %s is disabled"
NO_PROTOCOL = "specified runtime %s does not support specified protocol version"
NO_FORMAT = "specified runtime %s does not support specified framework/version"
NO_WORKER_SPEC = "you cannot set WorkerSpec in the InferenceService if the ServingRuntime does not have a WorkerSpec"
NONE_SUPPORTS = "no runtime found to support predictor with model type: %s"


def model_protocol(model):
    """``ModelSpec.GetProtocol``: the model's ``protocolVersion``, v1 when unset."""
    return (model or {}).get("protocolVersion") or "v1"


def protocol_priority(spec):
    """``GetProtocolVersionPriority``: the best-ranked protocol the runtime lists (Unknown without any)."""
    versions = (spec or {}).get("protocolVersions") or []
    return min((_PROTOCOL_RANK.get(v, _UNKNOWN_PROTOCOL) for v in versions), default=_UNKNOWN_PROTOCOL)


def supports_protocol(spec, protocol):
    """``IsProtocolVersionSupported``: a runtime without protocolVersions (or a model without a protocol) fits."""
    versions = (spec or {}).get("protocolVersions") or []
    return not protocol or not versions or protocol in versions


def _model_label(model):
    fmt = (model or {}).get("modelFormat") or {}
    if fmt.get("version") is not None:
        return "mt:%s:%s" % (fmt.get("name"), fmt.get("version"))
    return "mt:%s" % fmt.get("name")


def runtime_supports_model(model, spec):
    """``RuntimeSupportsModel``: the runtime lists the model's format (name, or name:version). Without a named runtime
    only ``autoSelect: true`` entries count."""
    named = bool((model or {}).get("runtime"))
    labels = set()
    for fmt in (spec or {}).get("supportedModelFormats") or []:
        if named or fmt.get("autoSelect") is True:
            labels.add("mt:%s" % fmt.get("name"))
            if fmt.get("version") is not None:
                labels.add("mt:%s:%s" % (fmt.get("name"), fmt.get("version")))
    return _model_label(model) in labels


def format_priority(spec, format_name):
    """``GetPriority``: the priority of the runtime's first format entry named ``format_name`` (None when unset)."""
    for fmt in (spec or {}).get("supportedModelFormats") or []:
        if fmt.get("name") == format_name:
            return fmt.get("priority")
    return None


def is_multinode(obj):
    """A runtime spec or a predictor with a ``workerSpec`` (KServe tests the pointer: ``workerSpec: {}`` counts)."""
    return (obj or {}).get("workerSpec") is not None


def _sorted_group(runtimes, model, multinode):
    protocol = model_protocol(model)
    # protocol priority asc, creationTimestamp desc (RFC 3339 text sorts in time order; none = oldest), name asc
    items = sorted(runtimes or [], key=lambda rt: (rt.get("metadata") or {}).get("name") or "")
    items.sort(key=lambda rt: (rt.get("metadata") or {}).get("creationTimestamp") or "", reverse=True)
    items.sort(key=lambda rt: protocol_priority(rt.get("spec")))
    fits = [rt for rt in items
            if not (rt.get("spec") or {}).get("disabled")
            and not (rt.get("spec") or {}).get("multiModel")
            and runtime_supports_model(model, rt.get("spec"))
            and supports_protocol(rt.get("spec"), protocol)
            and is_multinode(rt.get("spec")) == multinode]
    fmt_name = ((model or {}).get("modelFormat") or {}).get("name")

    def by_priority(rt):
        priority = format_priority(rt.get("spec"), fmt_name)
        return (1, 0) if priority is None else (0, -priority)
    return sorted(fits, key=by_priority)


def supporting_runtimes(model, reader, namespace, multinode=False):
    """``GetSupportingRuntimes`` for a single-model predictor: [(runtime, kind)], the one KServe picks first."""
    model = dict(model or {}, runtime=None)
    found = [(rt, SERVING_RUNTIME) for rt in _sorted_group(reader.list(SERVING_RUNTIME, namespace), model, multinode)]
    return found + [(rt, CLUSTER_SERVING_RUNTIME) for rt in _sorted_group(reader.list(CLUSTER_SERVING_RUNTIME, None), model, multinode)]


def get_serving_runtime(reader, name, namespace, where=None):
    """``GetServingRuntime``: (runtime, kind), the namespaced one first; ValidationError with KServe's message."""
    runtime = reader.get(SERVING_RUNTIME, namespace, name)
    if runtime is not None:
        return runtime, SERVING_RUNTIME
    runtime = reader.get(CLUSTER_SERVING_RUNTIME, None, name)
    if runtime is not None:
        return runtime, CLUSTER_SERVING_RUNTIME
    raise ValidationError(_at(where, NOT_FOUND % name), field=RUNTIME_FIELD,
                          hint="create the runtime or name an existing ServingRuntime/ClusterServingRuntime")


def _at(where, message):
    return "%s: %s" % (where, message) if where else message


def _formats(spec):
    return ", ".join("%s%s" % (f.get("name"), ":%s" % f["version"] if f.get("version") is not None else "")
                     for f in (spec or {}).get("supportedModelFormats") or []) or "none"


def check_named_runtime(runtime, kind, name, predictor, where=None):
    """``reconcileModel``'s checks of a named runtime (and ``multiNodeProcess``'s of its workerSpec), in KServe's order."""
    spec = runtime.get("spec") or {}
    model = predictor.get("model") or {}
    who = "the %s %s" % (kind, name)
    if spec.get("disabled"):
        raise ValidationError(_at(where, DISABLED % name), field=RUNTIME_FIELD, hint="enable %s or name another runtime" % who)
    protocol = model.get("protocolVersion")
    if protocol and not supports_protocol(spec, protocol):
        raise ValidationError(_at(where, NO_PROTOCOL % name), field="spec.predictor.model.protocolVersion",
                              hint="%s lists protocolVersions %s: set spec.predictor.model.protocolVersion to one of them, or name "
                                   "a runtime that supports %s in %s" % (who, ", ".join(spec["protocolVersions"]), protocol, RUNTIME_FIELD))
    if not runtime_supports_model(dict(model, runtime=name), spec):
        fmt = model.get("modelFormat") or {}
        wanted = "%s%s" % (fmt.get("name"), ":%s" % fmt["version"] if fmt.get("version") is not None else "")
        raise ValidationError(_at(where, NO_FORMAT % name), field="spec.predictor.model.modelFormat",
                              hint="%s supports the model formats %s: set spec.predictor.model.modelFormat to one of them, name a "
                                   "runtime that supports %s in %s, or add %s to the runtime's supportedModelFormats"
                                   % (who, _formats(spec), wanted, RUNTIME_FIELD, wanted))
    if is_multinode(predictor) and not is_multinode(spec):
        raise ValidationError(_at(where, NO_WORKER_SPEC), field="spec.predictor.workerSpec",
                              hint="remove spec.predictor.workerSpec, or name a runtime with a workerSpec in %s" % RUNTIME_FIELD)


def select_runtime(isvc, reader):
    """(runtime object, kind) KServe uses for the InferenceService, or (None, None) for a custom predictor."""
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    model = predictor.get("model")
    if not isinstance(model, dict):
        return None, None
    meta = isvc.get("metadata") or {}
    namespace = meta.get("namespace")
    where = "InferenceService %s/%s" % (namespace, meta.get("name"))
    wanted = model.get("runtime")
    if wanted:
        runtime, kind = get_serving_runtime(reader, wanted, namespace, where)
        check_named_runtime(runtime, kind, wanted, predictor, where)
        return runtime, kind
    multinode = is_multinode(predictor)
    found = supporting_runtimes(model, reader, namespace, multinode)
    if found:
        return found[0]
    fmt = model.get("modelFormat") or {}
    raise ValidationError(_at(where, NONE_SUPPORTS % "{%s %s}" % (fmt.get("name"), fmt.get("version", "<nil>"))), field=RUNTIME_FIELD,
                          hint="set %s, or give a runtime an autoSelect entry for this modelFormat and protocol%s"
                               % (RUNTIME_FIELD, " with a workerSpec (the predictor has one)" if multinode else
                                  " without a workerSpec (KServe auto-selects a runtime with one only for a predictor with a workerSpec)"))
