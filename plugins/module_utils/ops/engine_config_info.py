# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the module engine_config_info does: read the engine-config line vLLM printed (from a log file or from the
serving pods of an InferenceService) and compare it with what was expected.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.defaults import ISVC_LABEL
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood as unknown


def _clean_expected(expected):
    """Drop unset keys and refuse expectations no engine can meet, before any log is read."""
    if not expected:
        return None
    out = {k: v for k, v in expected.items() if v is not None}
    method = out.get("method")
    if method is not None and method not in speculative_config.METHOD_NAMES and not method.endswith("_mtp"):
        raise ValidationError("%r is not a vLLM speculative method" % method, field="expected.method",
                              hint="use one of %s (as in --speculative-config)" % ", ".join(sorted(speculative_config.METHOD_NAMES)[:12] + ["..."]))
    tokens = out.get("num_speculative_tokens")
    if tokens is not None and tokens < 1:
        raise ValidationError("must be greater than zero, got %d" % tokens, field="expected.num_speculative_tokens",
                              hint="give the num_speculative_tokens of the deployed --speculative-config, e.g. 3")
    return out or None


def check_one(result, expected):
    """Differences and notes of one scan result against expected (None: nothing to compare)."""
    if not result["found"] or expected is None:
        return [], []
    if not result["speculative_config_printed"]:
        # A vLLM that stops printing the field must not pass for one that runs without speculative decoding.
        return ["the engine line (vLLM %s) prints no speculative_config field, so what the engine runs cannot be compared "
                "(see not_understood)" % result["vllm_version"]], []
    return engine_log.compare_expected(result["speculative_config"], expected, result.get("vllm_version"))


def run_local(params):
    expected = _clean_expected(params["expected"])
    if params["log_text"] is not None:
        result = engine_log.scan_text(params["log_text"])
    else:
        result = engine_log.scan_file(params["log_path"])
    diffs, notes = check_one(result, expected)
    if result["configs_seen"]:
        notes.append("the log holds %d engine starts with different speculative configs; the last one is reported"
                     % result["engine_lines_seen"])
    result.update(expected=expected, differences=diffs, notes=notes)
    return result


def run_cluster(connect, params, warn):
    """(result, problem or None) of every predictor pod's log; `connect()` returns the kubernetes ApiClient, `warn(text)`
    passes a warning on."""
    # Imported here so a log_text/log_path run needs neither the kubernetes library nor a cluster.
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers  # pylint: disable=import-outside-toplevel

    expected = _clean_expected(params["expected"])
    api_client = connect()
    ns, name = params["namespace"], params["name"]
    isvc = k8s_pods.get_inference_service(api_client, ns, name)
    flags = isvc_readers.isvc_speculative_flags(isvc)
    isvc_info = dict(isvc_readers.readiness(isvc), flags=flags, speculative_flag_present=any(f["present"] for f in flags))
    if expected is None and params["expected_from_inference_service"]:
        with_flag = [f for f in flags if f["present"]]
        if with_flag and with_flag[0]["config"] is not None:
            expected = engine_log.expected_from_flag(with_flag[0]["config"])
        elif with_flag:
            warn("the predictor's speculative flag could not be read (%s); the engine line is not compared"
                 % with_flag[0]["error"])
        elif not with_flag and flags:
            expected = {"enabled": False}
    pods, skipped = k8s_pods.list_predictor_pods(api_client, ns, name, label_selector=params["label_selector"])
    out = {"inference_service": isvc_info, "skipped_pods": [_brief(p) for p in skipped], "expected": expected}
    if not pods:
        out.update(found=False, pods=[], vllm_version=None, engine=None, speculative_config=None, line=None,
                   log_warnings=[], differences=[], notes=[], not_understood=[])
        return out, ("no predictor pods of InferenceService %s/%s (label %s=%s%s): not deployed yet, scaled to zero, "
                     "or wrong name/namespace" % (ns, name, ISVC_LABEL, name,
                                                  ", " + params["label_selector"] if params["label_selector"] else ""))
    pod_results, warnings, diffs_all, notes_all, problems, not_understood = [], [], [], [], [], []
    for pod in pods:
        entry = {"name": pod["name"], "found": False, "vllm_version": None, "engine": None, "speculative_config": None,
                 "differences": [], "error": None}
        if params["container"] not in pod["containers"]:
            entry["error"] = "pod has no container %r (containers: %s); set container" % (params["container"], ", ".join(pod["containers"]))
            problems.append("%s: %s" % (pod["name"], entry["error"]))
            pod_results.append(entry)
            continue
        try:
            chunks = k8s_pods.stream_pod_log(api_client, ns, pod["name"], container=params["container"],
                                             since_seconds=params["since_seconds"], tail_lines=params["tail_lines"],
                                             previous=params["previous"], timeout=params["timeout"])
            result = engine_log.scan_chunks(chunks)
        except SpecDecodingError as exc:
            entry["error"] = str(exc)
            problems.append("%s: %s" % (pod["name"], exc))
            pod_results.append(entry)
            continue
        entry.update(found=result["found"], vllm_version=result["vllm_version"], engine=result["engine"],
                     speculative_config=result["speculative_config"], line=result["line"],
                     engine_lines_seen=result["engine_lines_seen"])
        for warning in result["log_warnings"]:
            warnings.append(dict(warning, pod=pod["name"]))
        unknown.add(not_understood, result["not_understood"], pod=pod["name"])
        diffs, notes = check_one(result, expected)
        entry["differences"] = diffs
        if result["speculative_config"] and (not isvc_info["speculative_flag_present"] or (expected or {}).get("enabled") is False):
            # A proposer with no flag on the resource (or after a rollback): the pod's own command says whether a flag
            # explains it (KServe merged one from the runtime) or the served checkpoint is a speculator.
            entry["speculative_source"] = _flagless_source(api_client, ns, pod["name"], params["container"], result)
        diffs_all.extend("pod %s: %s" % (pod["name"], d) for d in diffs)
        notes_all.extend(n for n in notes if n not in notes_all)
        if not result["found"]:
            problems.append("%s: no engine-config line in container %s (%d bytes read)" % (pod["name"], params["container"], result["bytes_scanned"]))
        pod_results.append(entry)
    first = next((p for p in pod_results if p["found"]), None)
    configs = []
    for entry in pod_results:
        if entry["found"] and entry["speculative_config"] not in configs:
            configs.append(entry["speculative_config"])
    if len(configs) > 1:
        diffs_all.append("predictor pods run different speculative configs: %s" % "; ".join(
            "%s: %s" % (p["name"], engine_log.format_config(p["speculative_config"])) for p in pod_results if p["found"]))
    out.update(
        found=all(p["found"] for p in pod_results),
        pods=pod_results,
        vllm_version=first["vllm_version"] if first else None,
        engine=first["engine"] if first else None,
        speculative_config=first["speculative_config"] if first else None,
        line=first.get("line") if first else None,
        log_warnings=warnings,
        differences=diffs_all,
        notes=notes_all,
        not_understood=not_understood,
    )
    for entry in pod_results:
        entry.pop("line", None)
    if problems:
        return out, "engine-config line missing on %d of %d predictor pods: %s. Hint: %s" % (
            len(problems), len(pod_results), "; ".join(problems), engine_log.NOT_FOUND_HINT)
    return out, None


def _flagless_source(api_client, namespace, pod_name, container_name, result):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    try:
        pod = k8s_pods.read_pod(api_client, namespace, pod_name)
    except SpecDecodingError:
        return None  # the log already says what runs; without the pod spec the source stays unnamed
    container = next((c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == container_name), {})
    return engine_log.flagless_source(result, (container.get("command") or []) + (container.get("args") or []), container.get("env"))


def _brief(pod):
    return {"name": pod["name"], "phase": pod["phase"], "reason": pod.get("reason")}


def engine_config(params, connect=None, warn=None):
    """Module engine_config's (result, failure message or None): the engine line found (per pod with a name), the
    differences from what was expected, and why the task fails (no line, or an engine that differs).
    `connect` and `warn` as for run_cluster."""
    if params["name"]:
        result, problem = run_cluster(connect, params, warn)
    else:
        result = run_local(params)
        problem = None
        if not result["found"]:
            problem = "no engine-config line (\"Initializing a V1 LLM engine (v...) with config:\") in the log (%d bytes read). Hint: %s" % (
                result["bytes_scanned"], engine_log.NOT_FOUND_HINT)
    result.pop("bytes_scanned", None)
    result.pop("speculative_config_printed", None)
    result["changed"] = False
    # The first pod whose proposer no flag explains (a speculators checkpoint, or unexplained); None for a local log.
    result["speculative_source"] = next((p["speculative_source"] for p in result.get("pods") or [] if p.get("speculative_source")), None)
    if not problem and result["differences"]:
        problem = "the running engine differs from what was requested: %s. Requested %s; engine line: %s" % (
            "; ".join(result["differences"]), engine_log.format_expected(result["expected"] or {})
            if (result["expected"] or {}).get("enabled", True) else "speculative_config=None",
            engine_log.format_config(result["speculative_config"]))
        if result["speculative_source"]:
            problem += ". %s. Fix: %s" % (result["speculative_source"]["message"], result["speculative_source"]["fix"])
    return result, problem
