# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the verify role records and prints for an LLMInferenceService, from the results it registered (the filter
``llmisvc_verify_summary``): one line for the resource, one per pool, one per decode pod measured.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood as unknown


def _acceptance_results(acceptance):
    """The items of a registered loop of speculative_metrics_info that ran (skipped ones left out), each with its pod."""
    if acceptance is None:
        return []
    results = acceptance.get("results", []) if isinstance(acceptance, dict) else acceptance
    if not isinstance(results, (list, tuple)):
        raise ValidationError("is a %s, not the registered result of a loop" % type(results).__name__, field="acceptance",
                              hint="pass the registered result of the loop of speculative_metrics_info over the decode pods")
    ran = []
    for index, item in enumerate(results):
        if not isinstance(item, dict):
            raise ValidationError("is a %s, not a module result" % type(item).__name__, field="acceptance.results[%d]" % index,
                                  hint="pass the registered result of the loop unchanged")
        if item.get("skipped"):
            continue
        pod = item.get(item.get("ansible_loop_var") or "item")
        if not pod:
            raise ValidationError("names no pod (no loop variable)", field="acceptance.results[%d]" % index,
                                  hint="register the result of a loop over the decode pods' names")
        ran.append((pod, item))
    return ran


def verify_summary(namespace, name, pools, acceptance=None, generation=None):
    """What the verify role records and prints for an LLMInferenceService, from the results it registered.

    ``pools``: the ``pools`` of llmisvc_engine_config_info (per pool: workload, pods, groups, engine_pod,
    speculative_config, as ``engine_report`` returns them); ``acceptance``: the registered loop of speculative_metrics_info
    over the decode pods (its ``results``; skipped items are left out), or None when no metrics were read;
    ``generation``: the generation isvc_wait found Ready. Returns ``{"metrics": {pod: {mean_acceptance_length,
    draft_acceptance_rate, diagnosis, msg}}, "lines": [...]}``: the acceptance figures of every decode pod and one line
    for the resource, one per pool and one per decode pod measured."""
    if not isinstance(pools, dict) or not all(isinstance(v, dict) for v in pools.values()):
        raise ValidationError("is not the pools of an engine report", field="pools",
                              hint="pass the registered result of llmisvc_engine_config_info (its pools)")
    ran = _acceptance_results(acceptance)
    lines = ["LLMInferenceService %s/%s: Ready at generation %s" % (namespace, name, "?" if generation is None else generation)]
    for pool, info in pools.items():
        workload = info.get("workload")
        where = "%s %s, " % (workload.get("kind"), workload.get("name")) if isinstance(workload, dict) else ""
        groups = info.get("groups")
        leaders = (", %d group(s), leaders %s" % (len(groups), " ".join(g.get("leader") or "none" for g in groups))
                   if isinstance(groups, list) else "")
        spec = info.get("speculative_config")
        running = ("method=%s model=%s num_spec_tokens=%s" % (spec.get("method"), spec.get("model"), spec.get("num_spec_tokens"))
                   if spec else "speculative_config=None")
        lines.append("pool %s (%s%d pod(s)%s, engine line from %s): %s"
                     % (pool, where, len(info.get("pods") or []), leaders, info.get("engine_pod") or "none", running))
    metrics, passed_over = {}, []
    for info in pools.values():
        passed_over += info.get("not_understood") or []
    for pod, item in ran:
        metrics[pod] = {key: item.get(key) for key in ("mean_acceptance_length", "draft_acceptance_rate", "diagnosis", "msg")}
        lines.append("acceptance on %s: %s" % (pod, item.get("msg")))
        passed_over += item.get("not_understood") or []
    # A vLLM newer than the tables: what was read is above, what was passed over is said, never dropped.
    said = unknown.summary_line(passed_over)
    if said:
        lines.append(said)
    return {"metrics": metrics, "lines": lines}
