#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_config_info
short_description: Prove which speculative config the running vLLM engine uses, from its engine-config log line
version_added: 0.1.0
description:
  - Finds vLLM's C(Initializing a V1 LLM engine (vX) with config:) line (and the V0 and older forms) in a
    log, wherever a process prefix, a collector timestamp or colour codes put it, and parses the vLLM
    version and C(speculative_config=SpeculativeConfig(method=..., model=..., num_spec_tokens=...)) or C(None).
  - Reads the log from O(log_text), O(log_path), or from every predictor pod of an InferenceService
    through the API server (O(name), O(namespace)); every pod is checked, not just the first.
  - Compares with O(expected) (or, for an InferenceService, with the C(--speculative-config) its predictor
    carries) and fails with both sides printed when they differ. C(*_mtp) aliases compare as C(mtp); a
    method vLLM guessed because the request omitted it is explained.
  - Also returns the speculative-decoding warnings the log carries (async scheduling disabled, min_p and
    logit_bias, deprecated method names) as RV(log_warnings).
  - Logs are streamed line by line (also from the API server), so memory stays bounded on huge logs.
author:
  - Alauda Platform Team (@alauda)
options:
  log_text:
    description: The log as text.
    type: str
  log_path:
    description: Path of a log file on the host that runs the module.
    type: path
  name:
    description:
      - Name of the InferenceService whose predictor pods' logs are read (label
        C(serving.kserve.io/inferenceservice=<name>)).
    type: str
  namespace:
    description: Namespace of the InferenceService.
    type: str
    default: default
  label_selector:
    description: Extra label selector ANDed with the InferenceService label, e.g. V(component=predictor).
    type: str
  container:
    description: Container whose log holds the vLLM output.
    type: str
    default: kserve-container
  since_seconds:
    description: With O(name), only read log lines newer than this many seconds.
    type: int
  tail_lines:
    description: With O(name), only read the last this many lines of each pod's log.
    type: int
  previous:
    description: With O(name), read the log of the previous (restarted) container instance.
    type: bool
    default: false
  expected:
    description:
      - What the engine must run. Keys left out are not compared.
    type: dict
    suboptions:
      enabled:
        description:
          - V(false) requires C(speculative_config=None) (for example after a rollback); V(true) requires
            speculative decoding without saying which.
        type: bool
      method:
        description: Expected method; C(*_mtp) aliases are normalised to C(mtp) as vLLM prints them.
        type: str
      model:
        description: Expected draft model path as vLLM sees it (for example V(/mnt/models/draft)).
        type: str
      num_speculative_tokens:
        description: Expected number of speculative tokens.
        type: int
  expected_from_inference_service:
    description:
      - When reading an InferenceService and O(expected) is not given, compare with the C(--speculative-config)
        (any form) found in its predictor's command/args; a predictor without the flag means C(enabled=false).
    type: bool
    default: true
  timeout:
    description: Seconds allowed for each API server request.
    type: int
    default: 60
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
  - kubernetes.core.k8s_auth_options
notes:
  - The kube auth options are used only with O(name).
  - Needs get/list on pods and get on pods/log (and get on inferenceservices) with O(name).
  - From vLLM 0.24 only data-parallel rank 0 prints the engine line.
seealso:
  - module: alauda.spec_decoding.speculative_metrics_info
"""

EXAMPLES = r"""
- name: Every predictor pod runs EAGLE-3 with the requested draft
  alauda.spec_decoding.engine_config_info:
    name: llama
    namespace: models
    expected:
      method: eagle3
      model: /mnt/models/draft
      num_speculative_tokens: 3
  register: engine

- name: After a rollback the engine runs without a proposer
  alauda.spec_decoding.engine_config_info:
    name: llama
    namespace: models
    expected:
      enabled: false

- name: Parse a saved log
  alauda.spec_decoding.engine_config_info:
    log_path: /tmp/vllm.log
"""

RETURN = r"""
found:
  description: Whether the engine-config line was found (in every pod, when reading an InferenceService).
  returned: always
  type: bool
vllm_version:
  description: vLLM version from the line (of the first pod that printed it).
  returned: always
  type: str
  sample: "0.32.0"
engine:
  description: V(V1) or V(V0).
  returned: always
  type: str
  sample: V1
speculative_config:
  description: The printed speculative config, or null when the engine runs without one.
  returned: always
  type: dict
  sample: {"method": "eagle3", "model": "/mnt/models/draft", "num_spec_tokens": 3}
line:
  description: The engine-config line, colour codes removed.
  returned: when found
  type: str
pods:
  description: Per predictor pod (with O(name)).
  returned: with name
  type: list
  elements: dict
  sample: [{"name": "llama-predictor-7d9f-abcde", "found": true, "vllm_version": "0.32.0", "engine": "V1",
            "speculative_config": {"method": "ngram", "model": null, "num_spec_tokens": 5}, "differences": []}]
skipped_pods:
  description: Pods left out (being deleted, or finished), with the reason.
  returned: with name
  type: list
  elements: dict
engine_lines_seen:
  description: How many engine-config lines the log holds (a restarted engine prints another; the last one is reported).
  returned: with log_text or log_path
  type: int
configs_seen:
  description: The distinct configs of those lines when they differ (empty otherwise).
  returned: with log_text or log_path
  type: list
  elements: dict
log_warnings:
  description: Speculative-decoding warnings in the log, deduplicated, with a count (and the pod).
  returned: always
  type: list
  elements: dict
  sample: [{"kind": "async_scheduling_disabled", "level": "WARNING", "count": 1,
            "message": "Async scheduling not supported with ngram-based speculative decoding and will be disabled."}]
expected:
  description: What was compared against (from O(expected) or the InferenceService's flag), null when nothing was.
  returned: always
  type: dict
differences:
  description: Human-readable differences between RV(expected) and the engine (empty on success).
  returned: always
  type: list
  elements: str
notes:
  description: Explanations that are not failures (method aliases, a method vLLM guessed).
  returned: always
  type: list
  elements: str
inference_service:
  description:
    - Ready/generation state and the speculative flag found in each predictor container (with O(name)).
    - C(flags) items have C(container), C(present), C(forms), C(config), C(error).
  returned: with name
  type: dict
  sample: {"ready": true, "generation": 2, "observed_generation": 2, "up_to_date": true,
           "speculative_flag_present": true, "flags": [{"container": "kserve-container", "present": true, "forms": ["argv"],
           "config": {"method": "ngram", "num_speculative_tokens": 5}, "error": null}]}
"""

from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError


def argument_spec():
    spec = dict(
        log_text=dict(type="str"),
        log_path=dict(type="path"),
        name=dict(type="str"),
        namespace=dict(type="str", default="default"),
        label_selector=dict(type="str"),
        container=dict(type="str", default="kserve-container"),
        since_seconds=dict(type="int"),
        tail_lines=dict(type="int"),
        previous=dict(type="bool", default=False),
        expected=dict(type="dict", options=dict(
            enabled=dict(type="bool"),
            method=dict(type="str"),
            model=dict(type="str"),
            num_speculative_tokens=dict(type="int", no_log=False),
        )),
        expected_from_inference_service=dict(type="bool", default=True),
        timeout=dict(type="int", default=60),
    )
    spec.update(AUTH_ARG_SPEC)
    return spec


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
    return engine_log.compare_expected(result["speculative_config"], expected)


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


def run_cluster(module, params):
    # Imported here so a log_text/log_path run needs neither the kubernetes library nor a cluster.
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers  # pylint: disable=import-outside-toplevel

    expected = _clean_expected(params["expected"])
    module.requires("kubernetes")
    api_client = get_api_client(module=module).client.client
    ns, name = params["namespace"], params["name"]
    isvc = k8s_pods.get_inference_service(api_client, ns, name)
    flags = isvc_readers.isvc_speculative_flags(isvc)
    isvc_info = dict(isvc_readers.readiness(isvc), flags=flags, speculative_flag_present=any(f["present"] for f in flags))
    if expected is None and params["expected_from_inference_service"]:
        with_flag = [f for f in flags if f["present"]]
        if with_flag and with_flag[0]["config"] is not None:
            expected = engine_log.expected_from_flag(with_flag[0]["config"])
        elif with_flag:
            module.warn("the predictor's speculative flag could not be read (%s); the engine line is not compared"
                        % with_flag[0]["error"])
        elif not with_flag and flags:
            expected = {"enabled": False}
    pods, skipped = k8s_pods.list_predictor_pods(api_client, ns, name, label_selector=params["label_selector"])
    out = {"inference_service": isvc_info, "skipped_pods": [_brief(p) for p in skipped], "expected": expected}
    if not pods:
        out.update(found=False, pods=[], vllm_version=None, engine=None, speculative_config=None, line=None,
                   log_warnings=[], differences=[], notes=[])
        return out, ("no predictor pods of InferenceService %s/%s (label %s=%s%s): not deployed yet, scaled to zero, "
                     "or wrong name/namespace" % (ns, name, k8s_pods.ISVC_LABEL, name,
                                                  ", " + params["label_selector"] if params["label_selector"] else ""))
    pod_results, warnings, diffs_all, notes_all, problems = [], [], [], [], []
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
        diffs, notes = check_one(result, expected)
        entry["differences"] = diffs
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
    )
    for entry in pod_results:
        entry.pop("line", None)
    if problems:
        return out, "engine-config line missing on %d of %d predictor pods: %s. Hint: %s" % (
            len(problems), len(pod_results), "; ".join(problems), engine_log.NOT_FOUND_HINT)
    return out, None


def _brief(pod):
    return {"name": pod["name"], "phase": pod["phase"], "reason": pod.get("reason")}


def main():
    module = AnsibleK8SModule(
        argument_spec=argument_spec(),
        mutually_exclusive=[("log_text", "log_path", "name")],
        required_one_of=[("log_text", "log_path", "name")],
        supports_check_mode=True,
        check_k8s=False,
        check_pyyaml=False,
    )
    params = module.params
    try:
        if params["name"]:
            result, problem = run_cluster(module, params)
        else:
            result = run_local(params)
            problem = None
            if not result["found"]:
                problem = "no engine-config line (\"Initializing a V1 LLM engine (v...) with config:\") in the log (%d bytes read). Hint: %s" % (
                    result["bytes_scanned"], engine_log.NOT_FOUND_HINT)
    except SpecDecodingError as exc:
        module.fail_json(msg=str(exc), field=exc.field, changed=False)
    result.pop("bytes_scanned", None)
    result["changed"] = False
    if problem:
        module.fail_json(msg=problem, **result)
    if result["differences"]:
        module.fail_json(msg="the running engine differs from what was requested: %s. Requested %s; engine line: %s" % (
            "; ".join(result["differences"]), engine_log.format_expected(result["expected"] or {})
            if (result["expected"] or {}).get("enabled", True) else "speculative_config=None",
            engine_log.format_config(result["speculative_config"])), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
