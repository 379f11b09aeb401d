# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read an InferenceService object (a dict, as the API server returns it): its predictor containers, whether their
command/args carry ``--speculative-config`` in any form (through ``vllm_command``), Ready and observedGeneration.

Plain Python, no Ansible imports, no API calls (``kube/pods.py`` reads the object from the cluster).
"""

from __future__ import annotations

import copy

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.defaults import DEFAULT_CONTAINER
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.releases import refuse_unknown_speculative_fields


def predictor_containers(isvc):
    """``[(container_name, command_list, args_list)]`` of the predictor: the model spec, then custom containers."""
    predictor = ((isvc or {}).get("spec") or {}).get("predictor") or {}
    found = []
    model = predictor.get("model")
    if isinstance(model, dict):
        found.append((model.get("name") or DEFAULT_CONTAINER, list(model.get("command") or []), list(model.get("args") or [])))
    for container in predictor.get("containers") or []:
        if isinstance(container, dict):
            found.append((container.get("name") or DEFAULT_CONTAINER, list(container.get("command") or []),
                          list(container.get("args") or [])))
    return found


def readiness(isvc):
    """``{ready, generation, observed_generation, up_to_date, reason, message, failed}`` from an InferenceService's
    status. ``failed``: KServe refused the predictor at this generation (``modelStatus.transitionStatus: InvalidSpec``
    with its ``lastFailureInfo``, as KServe's reconcileModel writes for a missing, disabled or unfitting ServingRuntime):
    waiting does not fix it, so it says why in one line; None otherwise."""
    meta = (isvc or {}).get("metadata") or {}
    status = (isvc or {}).get("status") or {}
    generation = meta.get("generation")
    ready_cond = None
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            ready_cond = cond
    observed = status.get("observedGeneration")
    if observed is None and ready_cond is not None:
        observed = ready_cond.get("observedGeneration")
    ready = bool(ready_cond and str(ready_cond.get("status")) == "True")
    up_to_date = generation is not None and observed is not None and int(observed) == int(generation)
    model = status.get("modelStatus") or {}
    failure = model.get("lastFailureInfo") or {}
    failed = None
    if up_to_date and not ready and model.get("transitionStatus") == "InvalidSpec" and failure:
        failed = "KServe refused the predictor (InvalidSpec, %s): %s" % (failure.get("reason"), failure.get("message"))
    return {
        "ready": ready,
        "generation": generation,
        "observed_generation": observed,
        "up_to_date": up_to_date,
        "reason": (ready_cond or {}).get("reason"),
        "message": (ready_cond or {}).get("message"),
        "failed": failed,
    }


# ----------------------------------------------------------------------------------------------------
# --speculative-config in the predictor (the command editor of the rollback part reads every form)

def isvc_speculative_flags(isvc):
    """Per predictor container: does its command+args carry a speculative flag (any form)?

    Returns ``[{container, present, forms, config, error}]``; config is the merged dict vLLM would see
    (None when absent or unreadable, error then says why). Refuses an InferenceService with speculative settings in a
    field KServe 0.20 does not have (kserve/releases.py): the command line would say "no flag" while KServe may run one.
    """
    refuse_unknown_speculative_fields(isvc)
    out = []
    for name, command, args in predictor_containers(isvc):
        occurrences = vllm_command.find_occurrences(command) + vllm_command.find_occurrences(args)
        entry = {"container": name, "present": bool(occurrences), "forms": sorted({o.form for o in occurrences}),
                 "config": None, "error": None}
        if occurrences:
            try:
                entry["config"] = vllm_command.config_from_occurrences(occurrences, field="spec.predictor")
            except ValidationError as exc:
                entry["error"] = str(exc)
        out.append(entry)
    return out


def speculative_config_of(commands):
    """The speculative config vLLM takes from a container's lists read by vllm/command_line.read (``commands``: their
    Commands in argv order, e.g. command then args), or None; raises the ValidationError of a flag that cannot be read.
    vLLM reads them as one argv (config_from_occurrences over all their flags); a list that alone has flags already
    holds that answer (a copy: the Command is shared through read's cache), so only flags in several lists are combined
    again."""
    flagged = [command for command in commands if command.occurrences]
    if len(flagged) > 1:
        return vllm_command.config_from_occurrences([occ for command in flagged for occ in command.occurrences])
    if flagged and flagged[0].config_error is not None:
        raise copy.copy(flagged[0].config_error)  # a fresh one: the Command keeps its own
    return copy.deepcopy(flagged[0].config) if flagged else None
