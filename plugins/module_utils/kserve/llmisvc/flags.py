# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the speculative flag of an LLMInferenceService is, and how to strip it: every pool, every container, every form
(argv, ``bash -c`` script, ``VLLM_ADDITIONAL_ARGS``), through the presets KServe merges (baseRefs and the well-known ones).

Plain Python, no Ansible imports. What KServe does with the object is in ``model.py``'s docstring.
"""

from __future__ import annotations

import copy
import json

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_edit as vllm_edit
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import strategic_merge
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import merge
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.releases import refuse_unknown_speculative_fields
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc.model import ADDITIONAL_ARGS_ENV, CONFIG_KIND, POOLS, _dig

# Flag spellings a leftover search looks for after a strip (a flag inside a quoted string, e.g. eval "..."):
# every spelling in vllm_command's registry, the legacy pre-0.10 flags included (except the short aliases).
_FLAG_WORDS = tuple(s for s in vllm_command.flag_spellings() if s.startswith("--"))
# ----------------------------------------------------------------------------------------------------------------
# Where the flag is: every pool, every container, every form


def _leftover(texts):
    return [t for t in texts if isinstance(t, str) and any(w in t for w in _FLAG_WORDS)]


# KServe's well-known presets (pkg/controller/v1alpha2/llmisvc/config_merge.go, combineBaseRefsConfig): besides
# spec.baseRefs the controller merges these LLMInferenceServiceConfig objects, chosen by the shape of the spec (the
# resource merged with its baseRefs), looked up in the resource's namespace first, then in KServe's system namespace.
# Their names are the controller's LLM_INFERENCE_SERVICE_CONFIG_PREFIX (default "kserve-") + suffix, unless the
# resource's status.annotations pin another name under "serving.kserve.io/<suffix>" (WellKnownConfigResolver; the
# router-route preset is never pinned). Merge order: well-known presets, then baseRefs, then the resource itself.
WELL_KNOWN_PREFIX = "kserve-"
WELL_KNOWN_PIN_PREFIX = "serving.kserve.io/"
WK_TEMPLATE = "config-llm-template"
WK_DECODE = "config-llm-decode-template"
WK_PREFILL = "config-llm-prefill-template"
WK_WORKER_DP = "config-llm-worker-data-parallel"
WK_DECODE_WORKER_DP = "config-llm-decode-worker-data-parallel"
WK_PREFILL_WORKER_DP = "config-llm-prefill-worker-data-parallel"
WK_WORKER_PP = "config-llm-worker-pipeline-parallel"
WK_DECODE_WORKER_PP = "config-llm-decode-worker-pipeline-parallel"
WK_PREFILL_WORKER_PP = "config-llm-prefill-worker-pipeline-parallel"
WK_SCHEDULER = "config-llm-scheduler"
WK_ROUTE = "config-llm-router-route"
WK_TRACING = "config-llm-tracing"


def _data_parallel(par):
    par = par if isinstance(par, dict) else {}
    return int(par.get("data") or 0) > 0 or int(par.get("dataLocal") or 0) > 0


def _pipeline_parallel(par):
    return int((par if isinstance(par, dict) else {}).get("pipeline") or 0) > 0


def well_known_presets(obj, base_specs=(), config_prefix=WELL_KNOWN_PREFIX):
    """The well-known LLMInferenceServiceConfig names KServe's controller merges into ``obj``, in merge order (first =
    lowest priority). ``base_specs``: the specs of its baseRefs presets (they decide the shape too)."""
    # combineBaseRefsConfig: the resource's spec, each baseRefs preset merged over it (merge.py), decides the shape
    spec = merge.merge_specs((obj or {}).get("spec") or {}, *(base_specs or ()))
    pins = (((obj or {}).get("status") or {}).get("annotations")) or {}

    def name(suffix, pinned=True):
        if pinned and pins.get(WELL_KNOWN_PIN_PREFIX + suffix):
            return pins[WELL_KNOWN_PIN_PREFIX + suffix]
        return (config_prefix if config_prefix is not None else WELL_KNOWN_PREFIX) + suffix

    out = []
    router = spec.get("router") if isinstance(spec.get("router"), dict) else None
    if router is not None:
        scheduler = router.get("scheduler")
        if isinstance(scheduler, dict) and not (((scheduler.get("pool") or {}).get("ref") or {}).get("name")):
            out.append(name(WK_SCHEDULER))
        route = router.get("route")
        if isinstance(route, dict) and not ((route.get("http") or {}).get("refs")):
            out.append(name(WK_ROUTE, pinned=False))
    if spec.get("tracing") is not None:
        out.append(name(WK_TRACING))
    prefill = spec.get("prefill")
    worker = spec.get("worker")
    if isinstance(prefill, dict):
        if prefill.get("worker") is None:
            out.append(name(WK_PREFILL))
        elif _data_parallel(prefill.get("parallelism")):
            out.append(name(WK_PREFILL_WORKER_DP))
        elif _pipeline_parallel(prefill.get("parallelism")):
            out.append(name(WK_PREFILL_WORKER_PP))
        decode_names = (WK_DECODE, WK_DECODE_WORKER_DP, WK_DECODE_WORKER_PP)
    else:
        decode_names = (WK_TEMPLATE, WK_WORKER_DP, WK_WORKER_PP)
    if worker is None:
        out.append(name(decode_names[0]))
    elif _data_parallel(spec.get("parallelism")):
        out.append(name(decode_names[1]))
    elif _pipeline_parallel(spec.get("parallelism")):
        out.append(name(decode_names[2]))
    return out


def preset_layers(obj, presets=None, config_prefix=WELL_KNOWN_PREFIX):
    """What KServe's controller merges, in its order: ``[{source, name, namespace, well_known, spec}]`` - the well-known
    presets found in ``presets``, the baseRefs presets found, then the resource itself (``source`` ``resource``)."""
    presets = presets or {}
    refs = [(ref or {}).get("name") for ref in (((obj or {}).get("spec") or {}).get("baseRefs") or [])]
    base = [(n, presets[n]) for n in refs if presets.get(n)]
    layers = []
    names = well_known_presets(obj, [(p.get("spec") or {}) for _n, p in base], config_prefix)
    for well_known, entries in ((True, [(n, presets[n]) for n in names if presets.get(n)]), (False, base)):
        for name, preset in entries:
            layers.append({"source": "%s/%s" % (CONFIG_KIND, name), "name": name, "well_known": well_known,
                           "namespace": ((preset.get("metadata") or {}).get("namespace")), "spec": preset.get("spec") or {}})
    layers.append({"source": "resource", "name": None, "well_known": False, "namespace": None, "spec": (obj or {}).get("spec") or {}})
    return layers


def _effective_containers(layers, path):
    """Per container name, which layer each part comes from after KServe's merge of the layers (merge.py): ``command`` /
    ``args`` / ``envFrom`` belong to the last layer that sets them non-empty (``args: []`` does not override); an env
    variable's ``value`` and its ``valueFrom`` each belong to the last layer that sets them (``value: ""`` does not
    override, and a ``valueFrom`` over a ``value`` keeps both). Returns ``{name: {"layers": {index: container},
    "fields": {key: index}, "env": {variable: {"value": (index, item index), "valueFrom": (index, item index)}}}}``."""
    out = {}
    for li, layer in enumerate(layers):
        podspec = _dig(layer["spec"], path)
        for container in (podspec or {}).get("containers") or []:
            if not isinstance(container, dict) or not container.get("name"):
                continue
            entry = out.setdefault(container["name"], {"layers": {}, "fields": {}, "env": {}})
            entry["layers"][li] = container
            for key in ("command", "args", "envFrom"):
                if not strategic_merge.omitted(key, container.get(key)):
                    entry["fields"][key] = li
            for ei, item in enumerate(container.get("env") or []):
                if isinstance(item, dict) and item.get("name"):
                    owners = entry["env"].setdefault(item["name"], {})
                    for part in ("value", "valueFrom"):
                        if not strategic_merge.omitted(part, item.get(part)):
                            owners[part] = (li, ei)
    return out


def _owned_view(entry, li):
    """The container of layer ``li`` reduced to what it owns after the merge (an env item keeps the parts it owns, None
    when it owns none, so indices stay those of the layer's own list)."""
    container = entry["layers"][li]
    view = {key: container[key] for key in ("command", "args") if entry["fields"].get(key) == li}
    view["env"] = []
    for ei, item in enumerate(container.get("env") or []):
        owners = entry["env"].get(item.get("name")) if isinstance(item, dict) else None
        parts = {part: item[part] for part in ("value", "valueFrom") if owners and owners.get(part) == (li, ei)}
        view["env"].append(dict(parts, name=item["name"]) if parts else None)
    return view


def env_ref(item):
    """``{kind: ConfigMap|Secret, name, key, optional}`` for an env item set through valueFrom configMapKeyRef /
    secretKeyRef (and no plain value), else None."""
    if not isinstance(item, dict) or item.get("value") not in (None, ""):
        return None
    source = item.get("valueFrom") or {}
    for field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
        ref = source.get(field)
        if isinstance(ref, dict):
            return {"kind": kind, "name": ref.get("name"), "key": ref.get("key"), "optional": bool(ref.get("optional"))}
    return None


def container_flags(container, env_sources=None):
    """The speculative flags of one container: ``[{field, forms, occurrences}]`` for command/args and VLLM_ADDITIONAL_ARGS,
    plus ``unstrippable`` (a flag spelling the token-exact editor does not see as a shell word, e.g. inside eval "...").

    With ``env_sources`` (what read_env_sources returned: ConfigMap values by ``(name, key)``), a VLLM_ADDITIONAL_ARGS set
    through valueFrom is inspected too: a ConfigMap's value is scanned (entry with ``value_from``), a Secret is never
    read (entry with ``opaque``: the reason it cannot be inspected); without it, valueFrom is not looked at."""
    found = []
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    occ = vllm_command.find_occurrences(command) + vllm_command.find_occurrences(args)
    if occ:
        found.append({"field": "command/args", "forms": sorted({o.form for o in occ}), "occurrences": occ})
    env_values = []
    for index, item in enumerate(container.get("env") or []):
        if not isinstance(item, dict) or item.get("name") != ADDITIONAL_ARGS_ENV:
            continue
        field = "env[%d] %s" % (index, ADDITIONAL_ARGS_ENV)
        ref = env_ref(item)
        if ref is None:
            if isinstance(item.get("value"), str):
                words = vllm_command.script_occurrences(item["value"])
                if words:
                    found.append({"field": field, "forms": ["env"], "occurrences": words})
                env_values.append(vllm_edit.strip_script(item["value"]))
            continue
        if env_sources is None:
            continue
        where = "%s from %s %s key %s" % (field, ref["kind"], ref["name"], ref["key"])
        if ref["kind"] == "Secret":
            found.append({"field": where, "forms": ["env_secret"], "occurrences": [], "value_from": ref,
                          "opaque": "the rollback never reads a Secret's value"})
            continue
        source = env_sources.get((ref["name"], ref["key"])) or {"value": None, "reason": "not read"}
        if source.get("value") is None:
            found.append({"field": where, "forms": ["env_configmap"], "occurrences": [], "value_from": ref,
                          "opaque": "ConfigMap %s key %s could not be read (%s)" % (ref["name"], ref["key"], source.get("reason"))})
            continue
        words = vllm_command.script_occurrences(source["value"])
        leftover = _leftover([vllm_edit.strip_script(source["value"])])
        if words or leftover:
            found.append({"field": where, "forms": ["env_configmap"], "occurrences": words, "value_from": ref,
                          "leftover": leftover})
    stripped_cmd = vllm_edit.strip_speculative_config(command) or []
    stripped_args = vllm_edit.strip_speculative_config(args) or []
    unstrippable = _leftover(stripped_cmd + stripped_args + env_values)
    return found, unstrippable


def flags(obj, presets=None, env_sources=None, config_prefix=WELL_KNOWN_PREFIX):
    """Per pool and container: where a speculative flag is in effect after KServe's merge - the resource's own, or a
    preset's (well-known or baseRefs) that the resource does not override. ``presets``: read_presets' result;
    ``env_sources``: read_env_sources' (valueFrom of VLLM_ADDITIONAL_ARGS inspected only with it).
    Returns ``[{pool, container, source, preset, field, forms, config, error, unstrippable[, value_from, opaque]}]``;
    ``preset`` is None, ``well-known`` or ``baseRefs``. Verify and rollback both read the flags here: a resource with
    speculative settings in a field KServe 0.20 does not have is refused (kserve/releases.py)."""
    refuse_unknown_speculative_fields(obj)
    layers = preset_layers(obj, presets, config_prefix)
    out = []
    for pool, info in POOLS.items():
        effective = _effective_containers(layers, info["path"])
        for cname, entry in effective.items():
            resource_index = len(layers) - 1
            for li in sorted(entry["layers"], key=lambda i: (i != resource_index, i)):
                layer = layers[li]
                view = _owned_view(entry, li)
                found, unstrippable = container_flags(view, env_sources)
                if layer["source"] != "resource":
                    unstrippable = []
                for item in found:
                    out.append(_entry(pool, cname, layer, item, unstrippable))
                if unstrippable and not found:
                    out.append({"pool": pool, "container": cname, "source": "resource", "preset": None, "field": "command/args",
                                "forms": [], "config": None, "error": None, "unstrippable": unstrippable})
    return out


def _entry(pool, cname, layer, entry, unstrippable):
    config, error = None, None
    try:
        config = vllm_command.config_from_occurrences(entry["occurrences"], field="%s %s" % (pool, cname))
    except ValidationError as exc:
        error = str(exc)
    out = {"pool": pool, "container": cname, "source": layer["source"],
           "preset": None if layer["source"] == "resource" else ("well-known" if layer["well_known"] else "baseRefs"),
           "field": entry["field"], "forms": entry["forms"], "config": config, "error": error,
           "unstrippable": unstrippable + list(entry.get("leftover") or [])}
    if layer["source"] != "resource":
        out["preset_namespace"] = layer["namespace"]
    for key in ("value_from", "opaque"):
        if key in entry:
            out[key] = entry[key]
    return out


def _pool_field(pool, container, field):
    return "spec.%s.containers[%s].%s" % (".".join(POOLS[pool]["path"]), container, field)


def _override(layers, f):
    """What the LLMInferenceService can set so that KServe's merge replaces the preset's flag-carrying value: ``(key,
    value)`` - the preset's own value without the flag, never empty (an empty value does not override: an env value
    becomes one space, which the presets' scripts expand to nothing) - or None when no such value exists (a preset's
    valueFrom: a value next to it is kept together with it; args that are only the flag)."""
    if f.get("value_from"):
        return None
    layer = next((lay for lay in layers if lay["source"] == f["source"]), None)
    podspec = _dig(layer["spec"], POOLS[f["pool"]]["path"]) if layer else None
    container = next((c for c in (podspec or {}).get("containers") or [] if isinstance(c, dict) and c.get("name") == f["container"]), {})
    if f["field"] != "command/args":
        value = next((e.get("value") for e in container.get("env") or []
                      if isinstance(e, dict) and e.get("name") == ADDITIONAL_ARGS_ENV and e.get("value")), None)
        return None if value is None else ("env", vllm_edit.strip_script(value) or " ")
    for key in ("args", "command"):
        if vllm_command.find_occurrences(list(container.get(key) or [])):
            stripped = vllm_edit.strip_speculative_config(list(container[key]))
            return (key, stripped) if stripped else None
    return None


def _override_yaml(pool, container, key, value):
    lines, indent = ["spec:"], "  "
    for part in POOLS[pool]["path"]:
        lines.append("%s%s:" % (indent, part))
        indent += "  "
    lines += ["%scontainers:" % indent, "%s- name: %s" % (indent, container)]
    if key == "env":
        lines += ["%s  env:" % indent, "%s  - name: %s" % (indent, ADDITIONAL_ARGS_ENV), "%s    value: %s" % (indent, json.dumps(value))]
    else:
        lines.append("%s  %s: %s" % (indent, key, json.dumps(value)))
    return "\n".join(lines)


def _preset_error(f, layers, uncovered=False):
    """The refusal for a flag a preset puts in effect. ``uncovered``: the preset's flag is hidden today by the resource's own
    value, which the strip would empty (KServe's merge ignores an empty value, so the preset's would be back)."""
    name, namespace = f["source"].split("/", 1)[1], f.get("preset_namespace")
    preset = "%s %s/%s" % (CONFIG_KIND, namespace, name)
    if uncovered:
        where = "env[%s]" % ADDITIONAL_ARGS_ENV if f["field"] != "command/args" else "args"
        message = ("removing the speculative flag from pool %s container %s would leave the LLMInferenceService's %s empty, and "
                   "KServe's merge does not let an empty value (\"\" or []) override a preset's: the value of %s (%s, %s), which "
                   "carries the flag too, would be in effect again; nothing was written" % (
                       f["pool"], f["container"], where, preset, f["preset"], f["field"]))
        field = _pool_field(f["pool"], f["container"], where)
    elif f["preset"] == "well-known":
        message = ("the speculative flag of pool %s container %s comes from %s (%s), a well-known preset KServe's controller "
                   "merges into every LLMInferenceService of this shape; the LLMInferenceService does not own it, and stripping the "
                   "resource alone would leave it on" % (f["pool"], f["container"], preset, f["field"]))
        field = "spec.%s" % ".".join(POOLS[f["pool"]]["path"])
    else:
        message = ("the speculative flag of pool %s container %s comes from the preset %s (%s, spec.baseRefs), which this "
                   "LLMInferenceService does not own; stripping the resource alone would leave it on" % (
                       f["pool"], f["container"], preset, f["field"]))
        field = "spec.baseRefs"
    override = _override(layers, f)
    first = ""
    if override:
        first = ("override %s in the LLMInferenceService with a non-empty value without the flag, which KServe's merge puts "
                 "over the preset's (it ignores an empty value):\n%s\nOr " % (
                     ADDITIONAL_ARGS_ENV if override[0] == "env" else override[0],
                     _override_yaml(f["pool"], f["container"], *override)))
    elif f.get("value_from"):
        first = ("a value set in the LLMInferenceService does not replace the preset's valueFrom (KServe's merge keeps both "
                 "and the Deployment is refused): remove the flag from %s %s key %s, or " % (
                     f["value_from"]["kind"], f["value_from"]["name"], f["value_from"]["key"]))
    rest = ["remove the flag from %s (it applies to every LLMInferenceService that merges it)" % preset]
    if f["preset"] == "baseRefs":
        rest.insert(0, "point spec.baseRefs at a copy of %s without the flag" % name)
    return ValidationError(message, field=field, hint=first + ", or ".join(rest) + ", then rerun")


def _after(obj, patch):
    """The resource as the strip's JSON patch leaves it (its ops replace values at plain paths)."""
    out = copy.deepcopy(obj)
    for op in patch:
        if op["op"] != "replace":
            continue
        *parents, last = op["path"].lstrip("/").split("/")
        node = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = copy.deepcopy(op["value"])
    return out


def _in_effect(obj, presets, env_sources, secret_env_has_no_flag, config_prefix):
    found = flags(obj, presets, env_sources, config_prefix)
    if secret_env_has_no_flag:
        found = [f for f in found if (f.get("value_from") or {}).get("kind") != "Secret"]
    return found


def strip(obj, presets=None, env_sources=None, secret_env_has_no_flag=False, config_prefix=WELL_KNOWN_PREFIX):
    """Remove every speculative flag the resource itself carries, token-exact, in every pool and form.

    Returns ``(patch, changes)``: ``patch`` is a JSON patch (list of ops, each with a ``test`` of the old value first)
    or [] when there is nothing to strip; ``changes`` describes each edit. Refuses (ValidationError), before anything is
    written, when a preset supplies the flag (a well-known one KServe merges, or a baseRefs one: the resource does not own
    it), when VLLM_ADDITIONAL_ARGS comes from a ConfigMap that holds the flag or that could not be read, from a Secret
    (never read; unless ``secret_env_has_no_flag``), when a flag sits where it cannot be removed token-exact, and when the
    resource after the patch would still run a flag: KServe's merge ignores an empty value, so a value the strip empties
    gives a preset's value back. The hint of a preset refusal gives the override that works (merge.py)."""
    found = _in_effect(obj, presets, env_sources, secret_env_has_no_flag, config_prefix)
    foreign = [f for f in found if f["source"] != "resource"]
    if foreign:
        raise _preset_error(foreign[0], preset_layers(obj, presets, config_prefix))
    sourced = [f for f in found if f.get("value_from")]
    if sourced:
        f = sourced[0]
        ref = f["value_from"]
        field = _pool_field(f["pool"], f["container"], "env[%s]" % ADDITIONAL_ARGS_ENV)
        set_value = "or set %s with value (without the flag) in the LLMInferenceService's %s instead of valueFrom" % (
            ADDITIONAL_ARGS_ENV, "spec." + ".".join(POOLS[f["pool"]]["path"]))
        if ref["kind"] == "Secret":
            raise ValidationError(
                "pool %s container %s takes %s from Secret %s key %s (valueFrom secretKeyRef); the rollback never reads a "
                "Secret's value, so it cannot tell whether it holds a speculative flag, and cannot remove one token-exact"
                % (f["pool"], f["container"], ADDITIONAL_ARGS_ENV, ref["name"], ref["key"]), field=field,
                hint="remove any speculative flag from that Secret's key yourself and rerun with secret_env_has_no_flag: true "
                     "(rollback_llmisvc_secret_env_has_no_flag; the engine line on every pod still proves it), %s" % set_value)
        if f.get("opaque"):
            raise ValidationError(
                "pool %s container %s takes %s from ConfigMap %s key %s (valueFrom configMapKeyRef), which could not be "
                "inspected: %s" % (f["pool"], f["container"], ADDITIONAL_ARGS_ENV, ref["name"], ref["key"], f["opaque"]), field=field,
                hint="let the rollback read that ConfigMap (get configmaps in the namespace), %s" % set_value)
        raise ValidationError(
            "pool %s container %s takes %s from ConfigMap %s key %s (valueFrom configMapKeyRef), which holds the speculative "
            "flag; the rollback edits only the LLMInferenceService (token-exact) and does not edit a ConfigMap other "
            "workloads may read" % (f["pool"], f["container"], ADDITIONAL_ARGS_ENV, ref["name"], ref["key"]), field=field,
            hint="remove the flag from ConfigMap %s key %s (kubectl edit configmap %s), %s, then rerun" % (
                ref["name"], ref["key"], ref["name"], set_value))
    bad = [f for f in found if f["unstrippable"]]
    if bad:
        raise ValidationError("pool %s container %s has a speculative flag inside a quoted string (%r), which cannot be removed "
                              "token-exact" % (bad[0]["pool"], bad[0]["container"], bad[0]["unstrippable"][0][:200]),
                              field="spec.%s" % ".".join(POOLS[bad[0]["pool"]]["path"]),
                              hint="move the flag out of the eval string into %s or the argv, then rerun" % ADDITIONAL_ARGS_ENV)
    spec = (obj or {}).get("spec") or {}
    patch, changes = [], []
    for pool, info in POOLS.items():
        podspec = _dig(spec, info["path"])
        base = "/spec/" + "/".join(info["path"]) + "/containers"
        for ci, container in enumerate((podspec or {}).get("containers") or []):
            for key in ("command", "args"):
                if key not in container:
                    continue
                old = list(container.get(key) or [])
                new = vllm_edit.strip_speculative_config(old)
                if new != old:
                    path = "%s/%d/%s" % (base, ci, key)
                    patch += [{"op": "test", "path": path, "value": old}, {"op": "replace", "path": path, "value": new}]
                    changes.append({"pool": pool, "container": container.get("name"), "field": key, "before": old, "after": new})
            for ei, item in enumerate(container.get("env") or []):
                if isinstance(item, dict) and item.get("name") == ADDITIONAL_ARGS_ENV and isinstance(item.get("value"), str):
                    new = vllm_edit.strip_script(item["value"])
                    if new != item["value"]:
                        path = "%s/%d/env/%d/value" % (base, ci, ei)
                        patch += [{"op": "test", "path": path, "value": item["value"]}, {"op": "replace", "path": path, "value": new}]
                        changes.append({"pool": pool, "container": container.get("name"), "field": "env " + ADDITIONAL_ARGS_ENV,
                                        "before": item["value"], "after": new})
    after = _after(obj, patch)
    left = _in_effect(after, presets, env_sources, secret_env_has_no_flag, config_prefix) if patch else []
    if left:
        f = left[0]
        if f["source"] != "resource":
            raise _preset_error(f, preset_layers(after, presets, config_prefix), uncovered=True)
        raise ValidationError("pool %s container %s would still run a speculative flag after the strip (%s); nothing was written"
                              % (f["pool"], f["container"], f["field"]), field="spec.%s" % ".".join(POOLS[f["pool"]]["path"]),
                              hint="remove the flag from the LLMInferenceService by hand, then rerun")
    return patch, changes
