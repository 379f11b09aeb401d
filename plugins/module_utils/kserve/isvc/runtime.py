# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the vLLM command of an InferenceService really comes from: its ServingRuntime and KServe's merge.

KServe (v0.20) builds the predictor's ``kserve-container`` from the runtime's container and the predictor's own
fields. This file repeats that merge so the collection reads and edits the command the pod really runs. Pinned to
KServe's own test vectors (tests/fixtures/kserve/runtime_merge.yaml; the runtime choice: runtime_selection.py):

* container: the runtime container named ``kserve-container`` (``MergeServingRuntimeAndInferenceServiceSpecs``,
  pkg/controller/v1beta1/inferenceservice/utils/utils.go); the runtime's other containers are sidecars.
* merge: ``MergeRuntimeContainers`` (same utils.go) = ``MergeContainerWithPatch`` (pkg/utils/container_merge.go): both
  containers as Go marshals them (empty fields left out, so they never override), a strategic merge patch of the
  predictor's over the runtime's (a non-empty ``command`` **replaces** the runtime's; ``env``, ``ports``,
  ``volumeMounts``, ``volumeDevices`` merge by key in apimachinery's order; objects field by field; other lists are
  replaced), an env entry left with both ``value`` and ``valueFrom`` keeps the one the predictor set, an empty name
  falls back to the runtime's; then ``args`` = **runtime args, then the InferenceService's**.
* placeholders: ``ReplacePlaceholders`` (same utils.go) runs the merged container, as JSON text, through a Go template
  with the InferenceService's metadata (``{{.Name}}``, ``{{.Namespace}}``, ``{{.Labels.x}}``, ``{{.Annotations.x}}``:
  a missing key prints ``<no value>``; ``{{index .Labels `x`}}``: a missing key prints nothing).

vLLM's argparse keeps the last ``--speculative-config``; a ``<shell> -c '<script>'`` command passes the args to the
script as ``$0 $1 ...``, so args reach vLLM only when the script uses ``"$@"``/``$*``.

Plain Python, no Ansible imports: modules pass in objects they read, or a reader (runtime_readers.py).
"""

from __future__ import annotations

import copy
import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit as vllm_edit
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import strategic_merge
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc.readers import speculative_config_of
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc.runtime_selection import (
    CLUSTER_SERVING_RUNTIME, GROUP, RUNTIME_VERSION, SERVING_RUNTIME, select_runtime,
)

CONTAINER_NAME = "kserve-container"
SOURCE_ISVC = "inference_service"
SOURCE_SR = "serving_runtime"
SOURCE_CSR = "cluster_serving_runtime"
SOURCE_OF_KIND = {SERVING_RUNTIME: SOURCE_SR, CLUSTER_SERVING_RUNTIME: SOURCE_CSR}
COPY_LABEL = "spec-decoding.alauda.io/runtime-copy-of"
COPY_FOR_LABEL = "spec-decoding.alauda.io/runtime-copy-for"

# corev1.Container fields (the ModelSpec inlines them next to modelFormat, runtime, storageUri, ...).
CONTAINER_FIELDS = ("name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources",
                    "resizePolicy", "restartPolicy", "volumeMounts", "volumeDevices", "livenessProbe", "readinessProbe",
                    "startupProbe", "lifecycle", "terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy",
                    "securityContext", "stdin", "stdinOnce", "tty")
_SCRIPT_ARGS = re.compile(r"\$\{?[@*]|\$\{?[1-9]")


def container_of_model(model):
    """The corev1.Container part of ``spec.predictor.model`` (the ModelSpec inlines it)."""
    return {k: copy.deepcopy(v) for k, v in (model or {}).items() if k in CONTAINER_FIELDS}


def merge_container_with_patch(base, overlay):
    """KServe's ``MergeContainerWithPatch``: the strategic merge patch of ``overlay`` over ``base`` (lists without a
    merge key, ``args`` and ``command`` among them, are replaced), env ``value``/``valueFrom`` conflicts settled for
    the overlay, the base's name when the result has none."""
    patch = strategic_merge.marshal(container_of_model(overlay))
    merged = strategic_merge.merge(strategic_merge.marshal(container_of_model(base)), patch)
    overlay_env = {e.get("name"): e for e in patch.get("env") or []}
    for entry in merged.get("env") or []:
        over = overlay_env.get(entry.get("name"))
        if over is None or not entry.get("value") or not entry.get("valueFrom"):
            continue
        if over.get("valueFrom"):
            entry.pop("value", None)
        elif over.get("value"):
            entry.pop("valueFrom", None)
    if not merged.get("name"):
        merged["name"] = (base or {}).get("name", "")
    return merged


def merge_runtime_container(runtime_side, isvc_container):
    """KServe's ``MergeRuntimeContainers``: ``merge_container_with_patch``, then ``args`` = runtime args + the
    InferenceService's (the InferenceService extends the runtime's flags)."""
    merged = merge_container_with_patch(runtime_side, isvc_container)
    args = list((runtime_side or {}).get("args") or []) + list((isvc_container or {}).get("args") or [])
    if args:
        merged["args"] = args
    else:
        merged.pop("args", None)
    return merged


# ObjectMeta fields a runtime template can print as they are (strings, and the generation number).
_META_FIELDS = {"Name": "name", "Namespace": "namespace", "GenerateName": "generateName", "UID": "uid",
                "ResourceVersion": "resourceVersion", "SelfLink": "selfLink", "Generation": "generation"}
_ACTION = re.compile(r"(\s*)\{\{(- )?\s*(.*?)\s*( -)?\}\}(\s*)", re.S)
_FIELD = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)$")
_MAP_KEY = re.compile(r"\.(Labels|Annotations)\.([A-Za-z_][A-Za-z0-9_]*)$")
_INDEX = re.compile(r"index\s+\.(Labels|Annotations)\s+`([^`]*)`$")
PLACEHOLDER_ERROR = "failed to replace placeholders in serving runtime %s Container %s"


def _template_action(body, meta, fail):
    """The text one ``{{ }}`` action prints, or None when it is not one of the forms runtimes use (left as it is)."""
    if '"' in body or "\\" in body:
        fail("KServe templates the container's JSON, where a double quote turns into \\\" and the template does not parse",
             "quote map keys with backticks: {{index .Labels `key`}}")
    match = _MAP_KEY.match(body)
    if match:
        got = (meta.get(match.group(1).lower()) or {}).get(match.group(2))
        return "<no value>" if got is None else str(got)
    match = _INDEX.match(body)
    if match:
        return str((meta.get(match.group(1).lower()) or {}).get(match.group(2)) or "")
    match = _FIELD.match(body)
    if match and match.group(1) in _META_FIELDS:
        got = meta.get(_META_FIELDS[match.group(1)])
        return "0" if got is None and match.group(1) == "Generation" else str(got or "")
    if match and match.group(1) not in ("Labels", "Annotations", "OwnerReferences", "Finalizers", "ManagedFields",
                                        "CreationTimestamp", "DeletionTimestamp", "DeletionGracePeriodSeconds"):
        fail("can't evaluate field %s in type v1.ObjectMeta" % match.group(1),
             "use {{.Name}}, {{.Namespace}}, {{.Labels.<key>}} or {{.Annotations.<key>}}")
    return None


def replace_placeholders(value, meta, runtime_name=None):
    """KServe's ``ReplacePlaceholders`` on a container (or any part of one) for the template forms runtimes use.

    A form KServe cannot run (a double quote inside ``{{ }}``, an ObjectMeta field that does not exist) raises
    ValidationError with KServe's message: its controller stops there too (InvalidPredictorSpec)."""
    meta = meta or {}
    container = value.get("name") if isinstance(value, dict) else None

    def walk(item, path):
        if isinstance(item, str):
            def repl(match):
                def fail(why, hint):
                    raise ValidationError("%s: %s" % (PLACEHOLDER_ERROR % (runtime_name, container or CONTAINER_NAME), why),
                                          field="%s%s" % (container or CONTAINER_NAME, path), hint=hint)
                printed = _template_action(match.group(3), meta, fail)
                if printed is None:
                    return match.group(0)
                return ("" if match.group(2) else match.group(1)) + printed + ("" if match.group(4) else match.group(5))
            return _ACTION.sub(repl, item)
        if isinstance(item, list):
            return [walk(v, "%s[%d]" % (path, i)) for i, v in enumerate(item)]
        if isinstance(item, dict):
            return {k: walk(v, "%s.%s" % (path, k)) for k, v in item.items()}
        return item

    return walk(value, "")


def runtime_container(runtime, kind, name=CONTAINER_NAME):
    """(index, container) of ``name`` (``kserve-container``) in the runtime's containers."""
    containers = (runtime.get("spec") or {}).get("containers") or []
    if not containers:
        raise ValidationError("%s %s: no container configuration found in selected serving runtime" % (kind, (runtime.get("metadata") or {}).get("name")),
                              field="spec.containers", hint="give the runtime a container named %s" % name)
    for i, container in enumerate(containers):
        if container.get("name") == name:
            return i, container
    raise ValidationError("%s %s: failed to find %s in ServingRuntime containers" % (kind, (runtime.get("metadata") or {}).get("name"), name),
                          field="spec.containers", hint="name the runtime's vLLM container %s" % name)


# --------------------------------------------------------------------------------------------------
# The effective command
# --------------------------------------------------------------------------------------------------

# An empty list reads the same with any env: read once, here.
_NO_WORDS = vllm_command.read(())


def _command(items, env=None):
    """vLLM's reading of one list of a container (vllm/command_line.read: made once per words and env, so the rollback's
    plan, this merge and the outcome ask the same one; the env as its JSON, vllm_command.env_key's text)."""
    if not items:
        return _NO_WORDS
    return vllm_command.read(tuple(items), json.dumps(env, sort_keys=True) if env else None)


def _args_reach_engine(command):
    """False when the command (its Command) is ``<shell> -c '<script>'`` and the script never reads its arguments."""
    return command.shell_script is None or bool(_SCRIPT_ARGS.search(command.shell_script))


class Effective:
    """The kserve-container an InferenceService runs, and where each speculative flag in it comes from."""

    def __init__(self, isvc, runtime, kind, container, command_from, runtime_args_count, runtime_index=None, base=None):
        self.isvc = isvc
        self.runtime = runtime
        self.kind = kind
        self.container = container
        self.command_from = command_from  # source of the command list
        self.runtime_args_count = runtime_args_count
        self.runtime_index = runtime_index
        self.base = base  # the runtime's kserve-container as read (with_own merges an edited predictor into it again)
        # vLLM's reading of the merged command and args, each made once (read again with the same words: the same one)
        self.commands = (_command(container.get("command"), container.get("env")), _command(container.get("args"), container.get("env")))
        self.args_reach = _args_reach_engine(self.commands[0])

    def with_own(self, isvc):
        """The Effective of ``isvc``: this InferenceService with only its own command/args edited (the rollback's strip),
        on the runtime already selected and merged. KServe's merge of the other fields does not depend on command and
        args, so only those are merged again, as ``MergeRuntimeContainers`` does (a non-empty command replaces the
        runtime's; the args are the runtime's, then the InferenceService's), and their placeholders replaced: no second
        selection, read or strategic merge."""
        if self.runtime is None:
            return effective_command(isvc, None)  # the predictor's own containers: nothing is merged or read
        own = container_of_model(((isvc.get("spec") or {}).get("predictor") or {}).get("model"))
        lists = {"name": self.container.get("name")}
        command = own.get("command") or self.base.get("command")
        if command:
            lists["command"] = list(command)
        args = list(self.base.get("args") or []) + list(own.get("args") or [])
        if args:
            lists["args"] = args
        lists = replace_placeholders(lists, isvc.get("metadata") or {}, self.runtime_name)
        container = dict(self.container)
        for field in ("command", "args"):
            if field in lists:
                container[field] = lists[field]
            else:
                container.pop(field, None)
        return Effective(isvc, self.runtime, self.kind, container, SOURCE_ISVC if own.get("command") else SOURCE_OF_KIND[self.kind],
                         self.runtime_args_count, runtime_index=self.runtime_index, base=self.base)

    @property
    def runtime_name(self):
        return (self.runtime or {}).get("metadata", {}).get("name")

    @property
    def runtime_source(self):
        return SOURCE_OF_KIND.get(self.kind)

    def occurrences(self):
        """[(occurrence, source, field, reaches_engine)] in argv order."""
        found = []
        for occ in self.commands[0].occurrences:
            found.append((occ, self.command_from, "command", True))
        for occ in self.commands[1].occurrences:
            source = self.runtime_source if occ.index < self.runtime_args_count else SOURCE_ISVC
            found.append((occ, source, "args", self.args_reach))
        return found

    def sources(self):
        """Sources whose flag reaches vLLM, in argv order without repeats."""
        out = []
        for _occ, source, _field, reaches in self.occurrences():
            if reaches and source not in out:
                out.append(source)
        return out

    def source(self):
        """Where the flag vLLM takes (the last whole-config one, else the last of any form) comes from, or None."""
        reaching = [(o, s) for o, s, _f, r in self.occurrences() if r]
        if not reaching:
            return None
        json_ones = [s for o, s in reaching if o.kind == "json"]
        return (json_ones or [reaching[-1][1]])[-1]

    def config(self):
        """The speculative config vLLM receives (vLLM's own precedence), or None."""
        return speculative_config_of(self.commands if self.args_reach else self.commands[:1])

    def ignored(self):
        """Flags in the args that a ``bash -c`` command without ``"$@"`` never passes to vLLM."""
        return [(o, s) for o, s, f, r in self.occurrences() if not r]

    def as_dict(self):
        try:
            config = self.config()
            error = None
        except SpecDecodingError as exc:
            config, error = None, str(exc)
        return {"runtime": {"kind": self.kind, "name": self.runtime_name} if self.runtime else None,
                "command": self.container.get("command") or [], "args": self.container.get("args") or [],
                "command_from": self.command_from, "args_reach_engine": self.args_reach,
                "source": self.source(), "sources": self.sources(), "speculative_config": config,
                "speculative_config_error": error,
                "ignored_flags": [{"source": s, "value": o.raw} for o, s in self.ignored()]}


def effective_command(isvc, reader):
    """Resolve the effective vLLM command of ``isvc`` the way KServe builds its kserve-container.

    The one entry point deploy, verify, rollback and troubleshoot use. ``reader`` is as for select_runtime.
    """
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    meta = isvc.get("metadata") or {}
    model = predictor.get("model")
    if not isinstance(model, dict):
        containers = predictor.get("containers") or []
        if not containers:
            raise ValidationError("InferenceService %s/%s has neither spec.predictor.model nor containers"
                                  % (meta.get("namespace"), meta.get("name")), field="spec.predictor",
                                  hint="set spec.predictor.model (with a runtime) or spec.predictor.containers")
        container = copy.deepcopy(containers[0])
        return Effective(isvc, None, None, container, SOURCE_ISVC, 0)
    runtime, kind = select_runtime(isvc, reader)
    index, base = runtime_container(runtime, kind)
    own = container_of_model(model)
    merged = merge_runtime_container(base, own)
    merged = replace_placeholders(merged, meta, (runtime.get("metadata") or {}).get("name"))
    command_from = SOURCE_ISVC if own.get("command") else SOURCE_OF_KIND[kind]
    return Effective(isvc, runtime, kind, merged, command_from, len(base.get("args") or []), runtime_index=index, base=base)


# --------------------------------------------------------------------------------------------------
# Decisions: deploy double, rollback fixes
# --------------------------------------------------------------------------------------------------

def runtime_flag_problem(effective, policy="refuse"):
    """Deploy check. Returns (error message or None, warnings) for the rendered InferenceService.

    A flag in the runtime that reaches vLLM together with the InferenceService's own: vLLM keeps the last one
    (the InferenceService's args come after the runtime's), so ``policy`` ``replace`` lets the InferenceService's
    win (a warning), ``refuse`` refuses. A runtime flag with none in the InferenceService is always refused (the
    service would run a config the deploy did not ask for).
    """
    if policy not in ("refuse", "replace"):
        raise ValidationError("must be replace or refuse, got %r" % (policy,), field="runtime_flag",
                              hint="use refuse (the default) or replace")
    sources = effective.sources()
    warnings = []
    if effective.ignored():
        warnings.append("%s %s sets --speculative-config in its args, but the command is a shell script that does not pass "
                        "its arguments (\"$@\") to vLLM: that flag is ignored" % (effective.kind, effective.runtime_name))
    runtime_src = effective.runtime_source
    if runtime_src is None or runtime_src not in sources:
        return None, warnings
    who = "%s %s" % (effective.kind, effective.runtime_name)
    if SOURCE_ISVC not in sources:
        return ("the %s sets --speculative-config for every InferenceService that uses it, and this one would run it "
                "although the deploy does not ask for it" % who), warnings
    if policy == "replace":
        warnings.append("the %s also sets --speculative-config; the InferenceService's comes last in the merged command, "
                        "so vLLM takes it" % who)
        return None, warnings
    return ("--speculative-config would appear twice: in the %s and in the InferenceService (vLLM takes the last one)"
            % who), warnings


EMPTY_RESULT = {"changed": False, "runtime": None, "runtime_object": None, "source": None, "sources": [],
                "speculative_config": None, "speculative_config_error": None, "command": [], "args": [],
                "command_from": None, "args_reach_engine": True, "ignored_flags": []}


def resolve(isvc, reader, runtime_flag=None, missing_runtime="fail"):
    """The merged command of ``isvc`` and, with ``runtime_flag`` (refuse | replace), the deploy check.

    Returns (result dict, warnings, problem, effective): ``result`` as ``Effective.as_dict()`` plus ``runtime_object``;
    ``problem`` is the deploy's refusal message (naming the runtime and its kind, and the fixes) or None; ``effective`` the
    Effective itself (None when the runtime was not found), for callers that go on with it (the users of the runtime). ``missing_runtime='warn'`` turns
    a runtime that cannot be found (or read) into a warning and an empty result instead of a ValidationError."""
    warnings = []
    try:
        effective = effective_command(isvc, reader)
    except ValidationError as exc:
        if missing_runtime != "warn" or exc.field != "spec.predictor.model.runtime":
            raise
        why = " (servingruntimes/clusterservingruntimes not readable: 403 Forbidden)" if getattr(reader, "forbidden", None) else ""
        warnings.append("%s%s; the runtime's command could not be merged in" % (exc, why))
        return dict(EMPTY_RESULT), warnings, None, None
    result = effective.as_dict()
    result.update(changed=False, runtime_object=effective.runtime)
    if getattr(reader, "forbidden", None):
        warnings.append("clusterservingruntimes are not readable with these credentials (403): only ServingRuntimes of %s were "
                        "considered" % (isvc.get("metadata") or {}).get("namespace"))
    problem = None
    if runtime_flag:
        problem, more = runtime_flag_problem(effective, runtime_flag)
        warnings.extend(more)
        if problem:
            meta = isvc["metadata"]
            problem = ("runtime_flag: InferenceService %s/%s: %s. Nothing was written. Fix: remove --speculative-config from the "
                       "%s %s (or give this service its own runtime without it)%s" % (
                           meta.get("namespace"), meta.get("name"), problem, effective.kind, effective.runtime_name,
                           ", or set spec_decoding_runtime_flag: replace to let the InferenceService's flag win"
                           if SOURCE_ISVC in effective.sources() else ""))
    return result, warnings, problem, effective


def flag_locations(isvc, effective=None):
    """``(locations, source)``: where the predictor's vLLM gets a speculative flag from, as verify reports it.

    With a runtime (``effective`` from ``effective_command``): each source in command-line order, the predictor's own
    as ``kserve-container`` and the runtime's as ``<kind> <name>``. Without one (a custom predictor, or a runtime that
    could not be read): every predictor container (``spec.predictor.model``, then ``spec.predictor.containers``) whose
    command or args carry the flag in any form. ``source`` is ``effective.source()``, or ``inference_service`` when
    only the predictor's containers carry it, else None.
    """
    if effective is not None and effective.runtime is not None:
        where = ["kserve-container" if source == SOURCE_ISVC else "%s %s" % (effective.kind, effective.runtime_name)
                 for source in effective.sources()]
        return where, effective.source()
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    containers = ([predictor["model"]] if predictor.get("model") is not None else []) + list(predictor.get("containers") or [])
    where = []
    for container in containers:
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        if vllm_edit.strip_speculative_config(argv) != argv:
            where.append(container.get("name") or "kserve-container")
    return where, (SOURCE_ISVC if where else None)


def _strip_container(container, env=None):
    """(new command, new args) of a runtime container without any speculative flag (vLLM's reading of each list; the strip
    reads no env, so ``env``, the merged container's, only finds the reading the Effective already made)."""
    return tuple(None if container.get(field) is None else list(_command(container[field], env).stripped) for field in ("command", "args"))


def runtime_strip_patch(runtime, index, env=None):
    """JSON patch (test + replace) removing the speculative flags from the runtime's kserve-container, or [] (``env``: as
    for _strip_container)."""
    container = runtime["spec"]["containers"][index]
    new_command, new_args = _strip_container(container, env)
    ops = []
    for field, new in (("command", new_command), ("args", new_args)):
        old = container.get(field)
        if old is None or old == new:
            continue
        path = "/spec/containers/%d/%s" % (index, field)
        ops.append({"op": "test", "path": path, "value": old})
        ops.append({"op": "replace", "path": path, "value": new})
    return ops


def copy_name(isvc_name, runtime_name):
    """DNS-1123 name of the per-service runtime copy (at most 63 characters)."""
    name = "%s-%s-nospec" % (isvc_name, runtime_name)
    if len(name) > 63:
        import hashlib  # pylint: disable=import-outside-toplevel
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = "%s-%s" % (name[:63 - 9].rstrip("-"), digest)
    return name


def render_runtime_copy(effective):
    """A namespaced ServingRuntime: the InferenceService's runtime without the speculative flags.

    Auto-selection is switched off (``autoSelect: false``) so other InferenceServices of the namespace keep their
    runtime; the labels name the original and the service it was made for.
    """
    runtime = effective.runtime
    meta = effective.isvc["metadata"]
    spec = copy.deepcopy(runtime.get("spec") or {})
    container = spec["containers"][effective.runtime_index]
    new_command, new_args = _strip_container(container, effective.container.get("env"))
    for field, new in (("command", new_command), ("args", new_args)):
        if new:
            container[field] = new
        else:
            container.pop(field, None)
    for fmt in spec.get("supportedModelFormats") or []:
        fmt["autoSelect"] = False
    labels = {COPY_LABEL: "%s.%s" % (effective.kind.lower(), effective.runtime_name),
              COPY_FOR_LABEL: meta["name"], "app.kubernetes.io/managed-by": "alauda.spec_decoding"}
    annotations = {k: v for k, v in ((runtime.get("metadata") or {}).get("annotations") or {}).items()
                   if k != "kubectl.kubernetes.io/last-applied-configuration"}
    body = {"apiVersion": "%s/%s" % (GROUP, RUNTIME_VERSION), "kind": SERVING_RUNTIME,
            "metadata": {"name": copy_name(meta["name"], effective.runtime_name), "namespace": meta["namespace"],
                         "labels": labels},
            "spec": spec}
    if annotations:
        body["metadata"]["annotations"] = annotations
    return body


def users_of_runtime(kind, name, namespace, isvcs, namespaced_names=None):
    """``namespace/name`` of every InferenceService that uses the runtime (by spec or by KServe's status).

    ``namespaced_names`` maps a namespace to the ServingRuntime names it has: for a ClusterServingRuntime a
    same-named ServingRuntime in a service's namespace wins, as in GetServingRuntime.
    """
    users = []
    for isvc in isvcs or []:
        meta = isvc.get("metadata") or {}
        status = isvc.get("status") or {}
        model = ((isvc.get("spec") or {}).get("predictor") or {}).get("model") or {}
        ns = meta.get("namespace")
        if kind == SERVING_RUNTIME:
            hit = ns == namespace and (status.get("servingRuntimeName") == name or model.get("runtime") == name)
        else:
            shadowed = name in ((namespaced_names or {}).get(ns) or ())
            hit = status.get("clusterServingRuntimeName") == name or (model.get("runtime") == name and not shadowed)
        if hit:
            users.append("%s/%s" % (ns, meta.get("name")))
    return sorted(set(users))


def rollback_runtime(isvc, stripped, reader, fix=None):
    """The rollback's question to the runtime, from one selection and one merge: after the InferenceService's own strip
    (``stripped``: the object as the strip leaves it), does the runtime still pass a speculative flag to vLLM?

    ``fix``: None (refuse), ``"copy"`` (a per-service runtime copy without the flag) or ``"edit"`` (strip the shared
    runtime). Returns ``{"runtime": {kind, name, source, fix[, copy]}, "users", "previous_config", "fix"}``: ``source``
    where the flag vLLM ran with came from; ``users`` the InferenceServices sharing the runtime, read only when its flag
    remains (else None); ``previous_config`` the config vLLM ran with (None when unreadable or the flag does not remain);
    ``fix`` None, ``{"fix": "copy", "body"}`` or ``{"fix": "edit", "kind", "name", "runtime", "ops"}``. Raises the refusal
    (rollback_refusal) when the flag remains and no fix is asked, and effective_command's ValidationError when the runtime
    cannot be merged in."""
    before = effective_command(isvc, reader)
    out = {"runtime": {"kind": before.kind, "name": before.runtime_name, "source": before.source(), "fix": "none"},
           "users": None, "previous_config": None, "fix": None}
    if before.runtime is None:
        return out
    after = before.with_own(stripped)
    if after.runtime_source not in after.sources():
        return out
    out["users"] = users = reader.users(after)
    try:
        out["previous_config"] = before.config()
    except SpecDecodingError:
        pass
    if fix == "copy":
        body = render_runtime_copy(after)
        out["runtime"].update(fix="copy", copy=body["metadata"]["name"])
        out["fix"] = {"fix": "copy", "body": body}
    elif fix == "edit":
        out["runtime"]["fix"] = "edit"
        out["fix"] = {"fix": "edit", "kind": after.kind, "name": after.runtime_name, "runtime": after.runtime,
                      "ops": runtime_strip_patch(after.runtime, after.runtime_index, after.container.get("env"))}
    else:
        raise ValidationError(rollback_refusal(after, users))
    return out


def rollback_refusal(effective, users):
    """The message a rollback gives when, after stripping the InferenceService, the runtime's flag still reaches vLLM."""
    meta = effective.isvc["metadata"]
    who = "%s %s" % (effective.kind, effective.runtime_name)
    names = vllm_command.flag_names([o for o, s, _f, r in effective.occurrences() if r and s == effective.runtime_source])
    return ("InferenceService %s/%s gets %s from the %s (shared by: %s); stripping the InferenceService "
            "alone would leave the engine running speculative decoding, and the runtime is not edited silently. Nothing was "
            "changed. Fix: either run the rollback with runtime_copy (role: spec_decoding_rollback_runtime_copy: true), which "
            "creates the ServingRuntime %s/%s (the runtime without the flag, autoSelect off) and points this InferenceService "
            "at it, or with edit_runtime (role: spec_decoding_rollback_edit_runtime: true), which strips the flag from the %s "
            "itself and so from every InferenceService listed"
            % (meta["namespace"], meta["name"], ", ".join(names) or "--speculative-config", who, ", ".join(users) or "no other InferenceService",
               meta["namespace"], copy_name(meta["name"], effective.runtime_name), who))
