# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Troubleshooting bundle: the diagnosis rules, the describe-like text, the summary and the archive.

``diagnose(snapshot)`` takes what was collected for one InferenceService (plain dicts as the API server returns
them, log tails, the engine_config / spec_metrics results when they ran) and returns findings ordered by how
likely they explain the trouble, each with the evidence and the fix:

``pending_pod`` (unschedulable), ``pods_not_created``, ``image_pull``, ``storage_download`` (storage
initializer / modelcar-init failed), ``oom`` (OOMKilled or CUDA out of memory), ``crash_loop`` (the engine
exits: the error line from the previous log), ``permission_denied``, ``disk_pressure``,
``readiness_deadline`` (progress deadline exceeded or probes killed a still-loading engine, worse with a
draft), ``deployment_mode_change_rejected``, ``modelcar_disabled``, ``acceptance_near_zero``,
``engine_mismatch``, ``starting`` / ``not_ready``, and informational ``min_p_logit_bias``.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import credentials
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as metrics_mod
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

try:
    import yaml
    HAS_YAML = True
except ImportError:  # pragma: no cover
    yaml = None
    HAS_YAML = False

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
# Higher first among errors: the root cause usually comes before its consequences (a pod that cannot pull
# its image also never becomes ready).
CAUSE_PRIORITY = [
    "deployment_mode_change_rejected", "pods_not_created", "pending_pod", "image_pull", "storage_download",
    "disk_pressure", "oom", "permission_denied", "crash_loop", "readiness_deadline", "modelcar_disabled",
    "acceptance_near_zero", "engine_mismatch", "starting", "not_ready", "min_p_logit_bias",
]
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable",
                      "ImageInspectError")
DRAFT_METHODS = ("eagle", "eagle3", "draft_model", "medusa", "mlp_speculator", "mtp", "dflash", "dspark")
STARTUP_DONE = ("Application startup complete", "Uvicorn running on", "Starting vLLM API server", "Available routes are")
CUDA_OOM = re.compile(r"(CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|No available memory for the cache blocks|"
                      r"out of memory|Cannot allocate memory|insufficient memory for the KV cache|"
                      r"is larger than the available KV cache memory)", re.I)
ENGINE_ERRORS = [
    re.compile(p) for p in (
        r"Unsupported speculative method[^\n]*", r"Target and draft model should have the same vocabulary size[^\n]*",
        r"Unexpected keyword argument[^\n]*", r"num_speculative_tokens was provided but without speculative model[^\n]*",
        r"Expected num_speculative_tokens to be greater than zero[^\n]*", r"prompt_lookup_min=\S+ must be <= prompt_lookup_max[^\n]*",
        r"'tensor_parallel_size' is not a valid argument in the speculative_config[^\n]*",
        r"(?m)^(?:\([^)]*\)\s*)?[A-Za-z_][\w.]*(?:Error|Exception|Exit): [^\n]+", r"error: argument [^\n]+",
        r"error: unrecognized arguments[^\n]*", r"(?m)^(?:\([^)]*\)\s*)?ERROR [^\n]+",
    )
]
STORAGE_AUTH = re.compile(r"(401|403|Unauthorized|AccessDenied|Access Denied|InvalidAccessKeyId|SignatureDoesNotMatch|"
                          r"GatedRepoError|RepositoryNotFoundError|NoSuchBucket|NoCredentialsError|invalid credentials|"
                          r"authentication required|denied)", re.I)
MODE_REJECTED = re.compile(r"deploymentMode cannot be changed from '?([A-Za-z]+)'? to '?([A-Za-z]+)'?")
LEGACY_MODES = {"RawDeployment": "Standard", "Serverless": "Knative"}


def normalise_mode(value):
    if not value:
        return None
    return LEGACY_MODES.get(value, value)


# ----------------------------------------------------------------------------------------------------
# small readers over API objects (dicts in the API's camelCase)

def _conditions(obj):
    return [c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if isinstance(c, dict)]


def _condition(obj, ctype):
    for cond in _conditions(obj):
        if cond.get("type") == ctype:
            return cond
    return None


def _container_statuses(pod, init=False):
    status = (pod or {}).get("status") or {}
    return list(status.get("initContainerStatuses" if init else "containerStatuses") or [])


def _pod_name(pod):
    return ((pod or {}).get("metadata") or {}).get("name")


def _events_for(events, kind=None, name=None):
    out = []
    for ev in events or []:
        obj = ev.get("involvedObject") or ev.get("regarding") or {}
        if (kind is None or obj.get("kind") == kind) and (name is None or obj.get("name") == name):
            out.append(ev)
    return out


def _event_text(ev):
    return "%s %s: %s" % (ev.get("type") or "", ev.get("reason") or "", (ev.get("message") or ev.get("note") or "").strip())


def speculative_config_of(isvc):
    """The --speculative-config of the predictor (first container carrying one), or None."""
    try:
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers  # pylint: disable=import-outside-toplevel
        for flag in isvc_readers.isvc_speculative_flags(isvc):
            if flag["present"]:
                return flag["config"] or {"unreadable": flag["error"]}
    except Exception:  # pylint: disable=broad-except
        return None
    return None


def uses_draft(config):
    if not config:
        return False
    method = engine_log.normalize_method(config.get("method")) if config.get("method") else None
    if method in DRAFT_METHODS:
        return True
    return bool(config.get("model")) and method not in ("ngram", "suffix", "ngram_gpu")


def storage_uris(isvc):
    predictor = ((isvc or {}).get("spec") or {}).get("predictor") or {}
    uris = []
    model = predictor.get("model") or {}
    for uri in (model.get("storageUri"), predictor.get("storageUri")):
        if uri:
            uris.append(uri)
    for entry in predictor.get("storageUris") or []:
        if isinstance(entry, dict) and entry.get("uri"):
            uris.append(entry["uri"])
    return uris


def _tail(text, n=8):
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-n:]


def _last_error_line(text):
    """The most telling error line of a log: a known vLLM speculative error, else the last exception line."""
    if not text:
        return None
    clean = engine_log.strip_ansi(text)
    for regex in ENGINE_ERRORS[:7]:
        found = regex.findall(clean)
        if found:
            return found[-1].strip()
    for group in (ENGINE_ERRORS[7:10], ENGINE_ERRORS[10:]):
        best = None
        for regex in group:
            for match in regex.finditer(clean):
                if best is None or match.start() > best[0]:
                    best = (match.start(), match.group(0).strip())
        if best:
            return best[1]
    return None


def _finding(cause, severity, title, evidence, fix):
    return {"cause": cause, "severity": severity, "title": title, "evidence": [e for e in evidence if e], "fix": fix}


# ----------------------------------------------------------------------------------------------------
# the rules

def diagnose(snap):
    """Findings for one InferenceService snapshot, most likely cause first."""
    findings = []
    isvc = snap.get("isvc")
    pods = snap.get("pods") or []
    events = snap.get("events") or []
    logs = snap.get("logs") or {}
    spec_cfg = speculative_config_of(isvc) if isvc else None
    draft = uses_draft(spec_cfg)
    ready = _condition(isvc, "Ready") if isvc else None
    is_ready = bool(ready and str(ready.get("status")) == "True")
    texts = [_event_text(e) for e in events] + [str(t) for t in snap.get("deploy_errors") or []]
    for obj in [isvc] + list(snap.get("deployments") or []):
        texts += ["%s %s" % (c.get("reason") or "", c.get("message") or "") for c in _conditions(obj)]

    if snap.get("isvc_error"):
        findings.append(_finding("not_found", "error", "the InferenceService could not be read", [snap["isvc_error"]],
                                 "check the name and namespace (kubectl get inferenceservices -A)"))
        return _order(findings)

    _rule_mode_change(snap, isvc, texts, findings)
    _rule_pods_not_created(snap, isvc, pods, events, is_ready, findings)
    for pod in pods:
        _rules_for_pod(pod, events, logs.get(_pod_name(pod)) or {}, draft, spec_cfg, findings)
    _rule_disk(texts, findings)
    _rule_deadline(snap, isvc, pods, texts, logs, draft, spec_cfg, is_ready, findings)
    _rule_modelcar(snap, isvc, findings)
    _rule_acceptance(snap, spec_cfg, logs, findings)
    _rule_engine(snap, findings)
    if isvc and not is_ready and not any(f["severity"] == "error" for f in findings):
        _rule_not_ready(isvc, pods, logs, draft, findings)
    return _order(_dedupe(findings))


def _dedupe(findings):
    merged, order = {}, []
    for f in findings:
        key = (f["cause"], f["title"])
        if key in merged:
            merged[key]["evidence"].extend(e for e in f["evidence"] if e not in merged[key]["evidence"])
        else:
            merged[key] = f
            order.append(key)
    return [merged[k] for k in order]


def _order(findings):
    def key(f):
        prio = CAUSE_PRIORITY.index(f["cause"]) if f["cause"] in CAUSE_PRIORITY else len(CAUSE_PRIORITY)
        return (SEVERITY_ORDER.get(f["severity"], 3), prio)
    return sorted(findings, key=key)


def _rule_mode_change(snap, isvc, texts, findings):
    for text in texts:
        match = MODE_REJECTED.search(text or "")
        if match:
            findings.append(_finding(
                "deployment_mode_change_rejected", "error",
                "the change of serving.kserve.io/deploymentMode from %s to %s was rejected" % (match.group(1), match.group(2)),
                [text.strip()[:400]],
                "the mode cannot change after creation: keep %s, or delete the InferenceService and create it again "
                "with the new mode (plan the downtime)" % match.group(1)))
            return
    live = normalise_mode((((isvc or {}).get("status") or {}).get("deploymentMode")))
    desired = normalise_mode(snap.get("expected_deployment_mode"))
    if live and desired and live != desired:
        findings.append(_finding(
            "deployment_mode_change_rejected", "error",
            "the desired deploymentMode %s differs from the live %s: KServe rejects this change" % (desired, live),
            ["status.deploymentMode=%s, desired annotation serving.kserve.io/deploymentMode=%s" % (live, desired)],
            "keep %s in the inventory/GitOps manifest, or delete and recreate the InferenceService with %s" % (live, desired)))


def _rule_pods_not_created(snap, isvc, pods, events, is_ready, findings):
    if pods or is_ready or not isvc:
        return
    failed = [e for e in events if (e.get("reason") in ("FailedCreate",)) or "forbidden" in (e.get("message") or "").lower()]
    if failed:
        findings.append(_finding("pods_not_created", "error", "no predictor pod could be created",
                                 [_event_text(e) for e in failed[-3:]],
                                 "fix what the event says (quota, LimitRange, admission webhook, missing ServiceAccount)"))
        return
    status = (isvc.get("status") or {})
    failure = ((status.get("modelStatus") or {}).get("lastFailureInfo") or {})
    evidence = ["no predictor pods with label serving.kserve.io/inferenceservice=%s" % isvc["metadata"]["name"]]
    if failure:
        evidence.append("modelStatus.lastFailureInfo: %s %s" % (failure.get("reason") or "", failure.get("message") or ""))
    if not snap.get("deployments"):
        evidence.append("no predictor Deployment either: the KServe controller did not reconcile it")
    findings.append(_finding("pods_not_created", "error", "the InferenceService has no predictor pods", evidence,
                             "check the runtime exists (ServingRuntime/ClusterServingRuntime), the KServe controller logs, "
                             "and minReplicas (0 scales to zero)"))


def _rules_for_pod(pod, events, pod_logs, draft, spec_cfg, findings):
    name = _pod_name(pod)
    status = pod.get("status") or {}
    pod_events = _events_for(events, "Pod", name)
    # pending / unschedulable
    scheduled = _condition(pod, "PodScheduled")
    sched_events = [e for e in pod_events if e.get("reason") == "FailedScheduling"]
    if status.get("phase") == "Pending" and ((scheduled and scheduled.get("status") == "False") or sched_events):
        msg = (scheduled or {}).get("message") or (sched_events[-1].get("message") if sched_events else "")
        findings.append(_finding("pending_pod", "error", "pod %s cannot be scheduled" % name,
                                 ["%s: %s" % ((scheduled or {}).get("reason") or "FailedScheduling", msg)],
                                 "free or add nodes with the requested GPUs/memory, or fix nodeSelector, tolerations and "
                                 "resource requests (a draft model adds memory, not GPUs)"))
    # containers
    for init in (True, False):
        for cs in _container_statuses(pod, init=init):
            _rules_for_container(pod, cs, init, pod_events, pod_logs.get(cs.get("name")) or {}, draft, findings)
    for ev in pod_events:
        if ev.get("reason") in ("Failed",) and re.search(r"pull|image", ev.get("message") or "", re.I):
            findings.append(_finding("image_pull", "error", "pod %s cannot pull an image" % name, [_event_text(ev)],
                                     _pull_fix(ev.get("message") or "")))


def _pull_fix(text):
    if re.search(r"unauthorized|denied|authentication|401|403|forbidden", text, re.I):
        return ("the registry refused the credentials: put a kubernetes.io/dockerconfigjson Secret in the ServiceAccount's "
                "imagePullSecrets (role alauda.spec_decoding.artifact_credentials) and name that ServiceAccount in the InferenceService")
    if re.search(r"not found|manifest unknown|no such", text, re.I):
        return "the image or tag does not exist: push it (Modelcar: playbooks building the image) or fix the oci:// URI / image name"
    return ("check the image name, that the nodes reach the registry (air gap: mirror it to the internal registry), and the "
            "ServiceAccount's imagePullSecrets")


def _rules_for_container(pod, cs, init, pod_events, clog, draft, findings):
    pod_name = _pod_name(pod)
    cname = cs.get("name")
    waiting = (cs.get("state") or {}).get("waiting") or {}
    terminated = (cs.get("state") or {}).get("terminated") or {}
    last = (cs.get("lastState") or {}).get("terminated") or {}
    where = "pod %s container %s" % (pod_name, cname)
    text_prev, text_cur = clog.get("previous") or "", clog.get("current") or ""
    if waiting.get("reason") in IMAGE_PULL_REASONS:
        image = cs.get("image") or ""
        msg = waiting.get("message") or ""
        is_modelcar = cname.startswith("modelcar")
        findings.append(_finding("image_pull", "error", "%s cannot pull its image%s" % (where, " (the Modelcar model image)" if is_modelcar else ""),
                                 ["%s: %s %s" % (waiting["reason"], image, msg)], _pull_fix(msg)))
        return
    reasons = {terminated.get("reason"), last.get("reason")}
    if "OOMKilled" in reasons:
        findings.append(_finding("oom", "error", "%s was killed for exceeding its memory limit (OOMKilled)" % where,
                                 ["lastState.terminated: reason OOMKilled exitCode %s" % (last.get("exitCode") or terminated.get("exitCode"))],
                                 "raise resources.limits.memory of the predictor (host RAM: weights are loaded through it; a draft adds its "
                                 "own weights), or use a smaller model/draft"))
        return
    oom_line = None
    for text in (text_prev, text_cur):
        match = CUDA_OOM.search(engine_log.strip_ansi(text)) if text else None
        if match:
            oom_line = [line for line in text.splitlines() if match.group(0) in line][-1].strip()
    if oom_line and not init:
        findings.append(_finding("oom", "error", "%s ran out of accelerator memory" % where, [oom_line[:400]],
                                 "the target, the draft (weights and its KV cache) and the target's KV cache must fit: lower "
                                 "gpu_memory_utilization by the draft's share (draft_memory_headroom), max_model_len or max_num_seqs, "
                                 "or use fewer speculative tokens / a smaller draft"))
        return
    crashed = waiting.get("reason") == "CrashLoopBackOff" or int(cs.get("restartCount") or 0) > 0 and last or \
        (init and terminated and int(terminated.get("exitCode") or 0) != 0)
    if init and (crashed or waiting.get("reason") == "CrashLoopBackOff"):
        text = text_cur or text_prev
        line = _last_error_line(text) or (_tail(text, 1) or [""])[0]
        if cname.startswith("modelcar-init"):
            fix = ("the Modelcar image has no non-empty /models (or lacks sh, ls, [): rebuild it with the model files under /models")
        elif STORAGE_AUTH.search(text or ""):
            fix = ("the storage initializer was refused: put the credentials in a Secret bound to the predictor's ServiceAccount "
                   "(HF_TOKEN for hf://, AWS_* keys and serving.kserve.io/s3-* annotations for s3://; role "
                   "alauda.spec_decoding.artifact_credentials) and set serviceAccountName")
        else:
            fix = "read the init container log in the bundle; check the storage URI, network access (air gap) and free disk"
        findings.append(_finding("storage_download", "error", "%s (model download) fails" % where,
                                 [line, "exitCode %s" % (terminated.get("exitCode") or last.get("exitCode"))], fix))
        return
    if init:
        return
    if re.search(r"Permission denied: '?/mnt/models", text_prev + text_cur):
        findings.append(_finding("permission_denied", "error", "%s cannot read the model files" % where,
                                 [ln.strip() for ln in (text_prev + "\n" + text_cur).splitlines() if "Permission denied" in ln][-1:],
                                 "the vLLM container runs as a user that cannot read /mnt/models (Modelcar: KServe issue 4995): "
                                 "set runAsUser to the image's user or make the files world-readable"))
        return
    if crashed:
        line = _last_error_line(text_prev) or _last_error_line(text_cur)
        exit_code = last.get("exitCode", terminated.get("exitCode"))
        killed_by_probe = exit_code in (137, 143) and not line and any(
            re.search(r"(Liveness|Startup) probe failed", e.get("message") or "") for e in pod_events)
        if killed_by_probe:
            return  # handled by the readiness/startup deadline rule
        evidence = ["%s, restarts %s, last exit code %s" % (waiting.get("reason") or "restarted", cs.get("restartCount"), exit_code)]
        if line:
            evidence.append(line[:400])
        else:
            evidence += ["previous log tail: " + ln[:200] for ln in _tail(text_prev, 3)]
        fix = "fix the startup error shown above (the full previous log is in the bundle)"
        if line and re.search(r"speculative|num_speculative_tokens|prompt_lookup|draft", line, re.I):
            fix = ("the speculative config is rejected by this vLLM version: check the method and keys against the vLLM version "
                   "(speculative_config module validates them), then redeploy")
        elif line and re.search(r"No such file|does not appear to have a file named|Can't load|not a valid model|config\.json", line):
            fix = "the model or draft path is wrong or empty: check the storage URI / mount path and the draft path in --speculative-config"
        findings.append(_finding("crash_loop", "error", "%s crashes at startup%s" % (where, ": " + line[:160] if line else ""), evidence, fix))


def _rule_disk(texts, findings):
    for text in texts:
        if re.search(r"no space left on device|DiskPressure|ephemeral-storage|Evicted", text or "", re.I):
            findings.append(_finding("disk_pressure", "error", "a node ran out of disk", [text.strip()[:400]],
                                     "free node disk or add ephemeral storage: Modelcar images and storage-initializer downloads of "
                                     "large models (tens of GB, plus the draft) need room on the node"))
            return


def _deadline_evidence(snap, isvc, texts, pods, events):
    evidence = []
    for text in texts:
        if re.search(r"ProgressDeadlineExceeded|progress deadline|timed out progressing", text or "", re.I):
            evidence.append(text.strip()[:300])
    for pod in pods:
        for ev in _events_for(events, "Pod", _pod_name(pod)):
            if re.search(r"(Startup|Liveness) probe failed|Container .* failed (liveness|startup) probe", ev.get("message") or ""):
                evidence.append(_event_text(ev)[:300])
        for cs in _container_statuses(pod):
            last = (cs.get("lastState") or {}).get("terminated") or {}
            if last.get("exitCode") in (137, 143) and last.get("reason") != "OOMKilled":
                log = (((snap.get("logs") or {}).get(_pod_name(pod)) or {}).get(cs.get("name")) or {}).get("previous") or ""
                if log and not any(s in log for s in STARTUP_DONE) and not _last_error_line(log):
                    evidence.append("pod %s container %s was killed (exit %s) before the API server started"
                                    % (_pod_name(pod), cs.get("name"), last.get("exitCode")))
    return list(dict.fromkeys(evidence))


def _rule_deadline(snap, isvc, pods, texts, logs, draft, spec_cfg, is_ready, findings):
    if is_ready or not isvc:
        return
    evidence = _deadline_evidence(snap, isvc, texts, pods, snap.get("events") or [])
    if not evidence:
        return
    annotations = ((isvc.get("metadata") or {}).get("annotations") or {})
    mode = normalise_mode((isvc.get("status") or {}).get("deploymentMode") or annotations.get("serving.kserve.io/deploymentMode"))
    deadline = annotations.get("serving.knative.dev/progress-deadline")
    deps = snap.get("deployments") or []
    pds = [d.get("spec", {}).get("progressDeadlineSeconds") for d in deps if d.get("spec", {}).get("progressDeadlineSeconds")]
    if deadline:
        evidence.append("serving.knative.dev/progress-deadline=%s" % deadline)
    if pds:
        evidence.append("predictor Deployment progressDeadlineSeconds=%s" % pds[0])
    if spec_cfg:
        evidence.append("speculative config %s" % json.dumps(spec_cfg, sort_keys=True))
    if mode == "Knative":
        knob = "raise the annotation serving.knative.dev/progress-deadline (and the startupProbe) to the measured cold start"
    else:
        knob = ("raise the predictor Deployment's progressDeadlineSeconds (600 s by default in Standard mode; "
                "serving.knative.dev/progress-deadline does not act there) and the startupProbe's failureThreshold x periodSeconds")
    title = ("the readiness/progress deadline is too short for the target + draft cold start" if draft
             else "the readiness/progress deadline expired before the engine became ready")
    fix = ("%s; a draft adds its download, its weights and its compile/graph capture to the start-up: budget target + draft "
           "(measure one cold start, add margin; spec_decoding_startup_timeout_seconds in the deploy role)" % knob) if draft else \
        "%s; check the log tail in the bundle for where start-up stalls" % knob
    findings.append(_finding("readiness_deadline", "error", title, evidence, fix))


def _rule_modelcar(snap, isvc, findings):
    cfg = snap.get("storage_initializer")
    oci = [u for u in storage_uris(isvc) if u.startswith("oci://")]
    if not oci or not isinstance(cfg, dict):
        return
    if cfg.get("enableModelcar") is False or str(cfg.get("enableModelcar")).lower() == "false":
        findings.append(_finding("modelcar_disabled", "error", "the InferenceService uses oci:// but Modelcar is off",
                                 ["inferenceservice-config storageInitializer.enableModelcar=false", "storage URIs: " + ", ".join(oci)],
                                 "set enableModelcar: true in the storageInitializer entry of the inferenceservice-config ConfigMap "
                                 "(and restart the KServe controller), or use storageUris/PVC artifacts"))


def _metrics_from_logs(logs, spec_cfg):
    texts = []
    for containers in (logs or {}).values():
        cur = (containers.get("kserve-container") or {}).get("current")
        if cur:
            texts.append(cur)
    if not texts:
        return None
    try:
        counters = metrics_mod.parse_log_text("\n".join(texts))[0]
        return metrics_mod.summarize(counters, method=(spec_cfg or {}).get("method"))
    except Exception:  # pylint: disable=broad-except
        return None


def _rule_acceptance(snap, spec_cfg, logs, findings):
    result = snap.get("metrics")
    if not (isinstance(result, dict) and result.get("has_data")):
        from_logs = _metrics_from_logs(logs, spec_cfg)
        if from_logs and from_logs.get("has_data"):
            result = from_logs
    if not (isinstance(result, dict) and result.get("has_data")):
        return
    snap["metrics_used"] = result
    diag = result.get("diagnosis") or {}
    rate = result.get("draft_acceptance_rate")
    if diag.get("status") in ("likely_draft_mismatch", "unsuitable_workload") or (rate is not None and rate <= 0.05):
        evidence = ["draft acceptance %.1f%%, mean acceptance length %s, %s draft tokens (source %s)" % (
            100 * (rate or 0), "%.2f" % result["mean_acceptance_length"] if result.get("mean_acceptance_length") else "n/a",
            result.get("num_draft_tokens"), result.get("source"))]
        if result.get("per_position_acceptance_rate"):
            evidence.append("per position " + ", ".join("%.3f" % (v or 0) for v in result["per_position_acceptance_rate"]))
        if diag.get("status") == "likely_draft_mismatch" or (rate is not None and rate <= 0.05 and uses_draft(spec_cfg)):
            fix = ("the draft/head does not match the target (other base model, fine-tune, tokenizer or revision) or is untrained: "
                   "use the draft published for this exact target, or roll back (playbooks/rollback.yml)")
        else:
            fix = ("the workload gives the proposer little to predict (high temperature, little prompt/output overlap): lower "
                   "num_speculative_tokens, switch method, or roll back; see docs/when-it-pays.md")
        severity = "error" if (rate is not None and rate <= 0.05) else "warning"
        how = "almost never accepted" if (rate or 0) <= 0.05 else "poorly accepted"
        findings.append(_finding("acceptance_near_zero", severity, "speculation is %s: %s" % (how, diag.get("reason") or ""), evidence, fix))


def _rule_engine(snap, findings):
    eng = snap.get("engine")
    if not isinstance(eng, dict):
        return
    diffs = []
    for pod in eng.get("pods") or []:
        diffs += ["pod %s: %s" % (pod.get("name"), d) for d in pod.get("differences") or []]
    if diffs:
        findings.append(_finding("engine_mismatch", "error", "the running engine's speculative config differs from the InferenceService's flag",
                                 diffs[:6], "the pods run an older revision or vLLM guessed the method: wait for the rollout, "
                                            "set method explicitly, and redeploy"))
    for warning in eng.get("log_warnings") or []:
        if warning.get("kind") == "min_p_logit_bias":
            findings.append(_finding("min_p_logit_bias", "info", "requests with min_p or logit_bias are affected by speculative decoding",
                                     [warning.get("line") or warning.get("text") or "min_p and logit_bias parameters won't work with speculative decoding."],
                                     "from vLLM 0.24 such requests get HTTP 400; older builds ignore the parameters. "
                                     "See docs/when-it-pays.md"))
            break


def _rule_not_ready(isvc, pods, logs, draft, findings):
    ready = _condition(isvc, "Ready") or {}
    evidence = ["Ready=%s %s %s" % (ready.get("status"), ready.get("reason") or "", ready.get("message") or "")]
    still_loading = False
    for pod in pods:
        cur = ((logs.get(_pod_name(pod)) or {}).get("kserve-container") or {}).get("current") or ""
        unready = [cs.get("name") for cs in _container_statuses(pod) if not cs.get("ready")]
        if unready:
            evidence.append("pod %s phase %s, not ready: %s" % (_pod_name(pod), (pod.get("status") or {}).get("phase"), ", ".join(unready)))
            if not any(s in cur for s in STARTUP_DONE):
                still_loading = True
                evidence += ["log tail: " + ln[:200] for ln in _tail(cur, 2)]
    if still_loading:
        findings.append(_finding("starting", "warning",
                                 "the engine is still starting%s" % (" (target + draft cold start)" if draft else ""), evidence,
                                 "wait, and make sure the progress deadline and startupProbe cover the measured cold start"
                                 + (" including the draft" if draft else "") + "; see docs/when-it-pays.md (cold-start budget)"))
    else:
        findings.append(_finding("not_ready", "warning", "the InferenceService is not ready", evidence,
                                 "the engine started but readiness fails: check the readinessProbe path/port (vLLM serves /health "
                                 "on its --port) and the events in the bundle"))


# ----------------------------------------------------------------------------------------------------
# text

def describe(snap):
    """A ``kubectl describe``-like text of the InferenceService: spec summary, status, conditions, events."""
    isvc = snap.get("isvc") or {}
    meta = isvc.get("metadata") or {}
    status = isvc.get("status") or {}
    lines = ["Name:         %s" % meta.get("name"), "Namespace:    %s" % meta.get("namespace"),
             "Generation:   %s (observed %s)" % (meta.get("generation"), status.get("observedGeneration")),
             "Annotations:"]
    for key, value in sorted((meta.get("annotations") or {}).items()):
        if key != "kubectl.kubernetes.io/last-applied-configuration":
            lines.append("  %s: %s" % (key, value))
    lines.append("Deployment mode: %s" % status.get("deploymentMode"))
    lines.append("URL:          %s" % status.get("url"))
    lines.append("Storage URIs: %s" % (", ".join(storage_uris(isvc)) or "-"))
    predictor = ((isvc.get("spec") or {}).get("predictor") or {})
    lines.append("ServiceAccount: %s" % (predictor.get("serviceAccountName") or "default"))
    lines.append("Speculative config: %s" % json.dumps(speculative_config_of(isvc), sort_keys=True))
    lines.append("Conditions:")
    lines.append("  %-16s %-8s %-28s %s" % ("Type", "Status", "Reason", "Message"))
    for cond in _conditions(isvc):
        lines.append("  %-16s %-8s %-28s %s" % (cond.get("type"), cond.get("status"), cond.get("reason") or "", cond.get("message") or ""))
    model_status = status.get("modelStatus")
    if model_status:
        lines.append("Model status: %s" % json.dumps(model_status, sort_keys=True))
    lines.append("Events:")
    events = _events_for(snap.get("events"), "InferenceService", meta.get("name"))
    if not events:
        lines.append("  <none>")
    for ev in events:
        when = ev.get("lastTimestamp") or ev.get("eventTime") or ""
        lines.append("  %-8s %-24s %s x%s  %s" % (ev.get("type"), ev.get("reason"), when, ev.get("count") or 1, (ev.get("message") or "").strip()))
    return "\n".join(lines) + "\n"


def pod_line(pod):
    status = pod.get("status") or {}
    parts = []
    for cs in _container_statuses(pod, init=True) + _container_statuses(pod):
        state = cs.get("state") or {}
        word = next(iter(state), "?")
        reason = (state.get(word) or {}).get("reason") or ""
        parts.append("%s=%s%s%s r%s" % (cs.get("name"), word, "/" + reason if reason else "", " ready" if cs.get("ready") else "",
                                        cs.get("restartCount", 0)))
    return "%s  phase=%s  %s" % (_pod_name(pod), status.get("phase"), "; ".join(parts))


def service_summary(snap, findings):
    """The Markdown section of one InferenceService."""
    isvc = snap.get("isvc") or {}
    ns, name = snap.get("namespace"), snap.get("name")
    likely = next((f for f in findings if f["severity"] == "error"), None) or (findings[0] if findings else None)
    lines = ["## %s/%s: likely cause %s" % (ns, name, likely["cause"] if likely else "none found"), ""]
    if likely:
        lines.append("**%s**" % likely["title"])
        lines.append("")
    ready = _condition(isvc, "Ready") or {}
    lines.append("- Ready: %s %s %s" % (ready.get("status", "n/a"), ready.get("reason") or "", (ready.get("message") or "")[:200]))
    lines.append("- Generation %s, observed %s, deploymentMode %s" % (
        (isvc.get("metadata") or {}).get("generation"), (isvc.get("status") or {}).get("observedGeneration"),
        (isvc.get("status") or {}).get("deploymentMode")))
    lines.append("- Speculative config (flag): %s" % json.dumps(speculative_config_of(isvc) if isvc else None, sort_keys=True))
    lines.append("- vLLM version: %s" % (snap.get("vllm_version") or "unknown (no engine-config line read)"))
    eng = snap.get("engine_line_config")
    if eng is not None:
        lines.append("- Engine-config line: speculative_config=%s" % json.dumps(eng, sort_keys=True))
    cfg = snap.get("storage_initializer")
    if isinstance(cfg, dict):
        modelcar = ("on" if str(cfg.get("enableModelcar", True)).lower() != "false" else "off") + " (inferenceservice-config storageInitializer)"
    else:
        modelcar = "unknown (inferenceservice-config not readable)"
    lines.append("- Modelcar: %s" % modelcar)
    used = snap.get("metrics_used") or (snap.get("metrics") if isinstance(snap.get("metrics"), dict) else None)
    if used and used.get("has_data"):
        lines.append("- Acceptance: %s" % (used.get("msg") or metrics_mod.describe(used)))
    pods = snap.get("pods") or []
    lines.append("- Pods (%d):" % len(pods))
    for pod in pods:
        lines.append("  - " + pod_line(pod))
    lines.append("")
    if findings:
        lines.append("Findings:")
        for i, f in enumerate(findings, 1):
            lines.append("%d. [%s] %s (%s)" % (i, f["severity"], f["title"], f["cause"]))
            for ev in f["evidence"][:6]:
                lines.append("   - %s" % ev)
            lines.append("   - Fix: %s" % f["fix"])
    else:
        lines.append("No problem found: Ready, engine line matches, acceptance healthy or not measured.")
    lines.append("")
    return "\n".join(lines)


def summary_markdown(sections, generated=None):
    head = ["# Speculative decoding troubleshooting summary", "",
            "Generated %s by alauda.spec_decoding.troubleshoot_bundle. Secret values are redacted." % (
                generated or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())), ""]
    return "\n".join(head) + "\n" + "\n".join(sections)


# ----------------------------------------------------------------------------------------------------
# archive

def dump(obj):
    if HAS_YAML:
        return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False, allow_unicode=True)
    return json.dumps(obj, sort_keys=True, indent=2, default=str) + "\n"


def write_archive(path, files, secrets=None, root="troubleshoot"):
    """Write ``{relative path: text}`` into a tar.gz at ``path`` (every text redacted first). Returns the member names."""
    names = []
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for rel in sorted(files):
            data = credentials.redact(files[rel], secrets).encode("utf-8")
            info = tarfile.TarInfo("%s/%s" % (root, rel))
            info.size = len(data)
            info.mtime = int(time.time())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
            names.append(info.name)
    os.replace(tmp, path)
    return names


# The bundle module troubleshoot_bundle writes: what it reads from the cluster, and the archive.

KSERVE_CONFIGMAP = "inferenceservice-config"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
BUNDLE_DEFAULTS = {"tail_lines": 500, "timeout": 60}  # troubleshoot_bundle's defaults of these options


class Collector:
    """Reads one InferenceService's objects and logs; every API error becomes a note, never a failure."""

    def __init__(self, api_client, params):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import client  # pylint: disable=import-outside-toplevel
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.params = params
        self.notes = []
        self.secret_values = []

    def plain(self, obj):
        return self.api_client.sanitize_for_serialization(obj)

    def _try(self, what, func, *args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception as exc:  # pylint: disable=broad-except
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
            self.notes.append("%s: %s" % (what, k8s_pods.api_error_message(exc) if hasattr(exc, "status") else exc))
            return None

    def storage_initializer(self):
        for ns in self.params["kserve_namespaces"]:
            try:
                cm = self.core.read_namespaced_config_map(KSERVE_CONFIGMAP, ns, _request_timeout=self.params["timeout"])
            except Exception:  # pylint: disable=broad-except
                continue
            data = dict(cm.data or {})
            parsed = {"namespace": ns, "data": {}}
            for key, value in data.items():
                try:
                    parsed["data"][key] = json.loads(value)
                except ValueError:
                    parsed["data"][key] = value
            return parsed
        self.notes.append("ConfigMap %s not found (or not readable) in %s" % (KSERVE_CONFIGMAP, ", ".join(self.params["kserve_namespaces"])))
        return None

    def log(self, ns, pod, container, previous):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
        try:
            chunks = k8s_pods.stream_pod_log(self.api_client, ns, pod, container=container, tail_lines=self.params["tail_lines"],
                                             previous=previous, timeout=self.params["timeout"])
            return b"".join(chunks).decode("utf-8", "replace")
        except SpecDecodingError as exc:
            if not previous:
                self.notes.append(str(exc))
            return None

    def referenced_secrets(self, ns, pods, sa_names):
        names = set()
        for pod in pods:
            spec = pod.get("spec") or {}
            for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
                for env in c.get("env") or []:
                    ref = ((env.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name")
                    if ref:
                        names.add(ref)
                for src in c.get("envFrom") or []:
                    ref = (src.get("secretRef") or {}).get("name")
                    if ref:
                        names.add(ref)
        for sa_name in sa_names:
            sa = self._try("ServiceAccount %s/%s" % (ns, sa_name), self.core.read_namespaced_service_account, sa_name, ns,
                           _request_timeout=self.params["timeout"])
            for ref in (getattr(sa, "secrets", None) or []) + (getattr(sa, "image_pull_secrets", None) or []):
                names.add(ref.name)
        for name in sorted(names):
            try:
                secret = self.core.read_namespaced_secret(name, ns, _request_timeout=self.params["timeout"])
            except Exception:  # pylint: disable=broad-except
                self.notes.append("Secret %s/%s not readable: its values are redacted by pattern only" % (ns, name))
                continue
            import base64  # pylint: disable=import-outside-toplevel
            data = dict(secret.data or {})
            if secret.type == "kubernetes.io/service-account-token":
                data = {k: v for k, v in data.items() if k == "token"}   # namespace and ca.crt are not secret
            for value in data.values():
                try:
                    text = base64.b64decode(value).decode("utf-8")
                except (ValueError, UnicodeDecodeError):
                    continue
                self.secret_values.append(text)
                if text.startswith("{"):
                    try:
                        for entry in (json.loads(text).get("auths") or {}).values():
                            for key in ("password", "auth", "identitytoken"):
                                if entry.get(key):
                                    self.secret_values.append(str(entry[key]))
                    except (ValueError, AttributeError):
                        pass

    def runtime(self, snap):
        """The ServingRuntime/ClusterServingRuntime KServe merges into the predictor, and the merged command."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import (  # pylint: disable=import-outside-toplevel
            runtime as serving_runtime, runtime_readers,
        )
        try:
            effective = serving_runtime.effective_command(snap["isvc"], runtime_readers.ClientReader(self.api_client))
        except SpecDecodingError as exc:
            self.notes.append("runtime of %s/%s not resolved: %s" % (snap["namespace"], snap["name"], exc))
            return
        snap["runtime"] = effective.runtime
        snap["effective_command"] = effective.as_dict()

    def collect(self, ns, name):
        snap = {"namespace": ns, "name": name, "pods": [], "events": [], "deployments": [], "logs": {}}
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
        try:
            snap["isvc"] = self.custom.get_namespaced_custom_object("serving.kserve.io", "v1beta1", ns, "inferenceservices", name,
                                                                    _request_timeout=self.params["timeout"])
        except ApiException as exc:
            from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
            snap["isvc"] = None
            snap["isvc_error"] = "InferenceService %s/%s: %s" % (ns, name, k8s_pods.api_error_message(exc))
        if snap.get("isvc"):
            self.runtime(snap)
        selector = "%s=%s" % (ISVC_LABEL, name)
        pods = self._try("listing pods", self.core.list_namespaced_pod, ns, label_selector=selector, _request_timeout=self.params["timeout"])
        snap["pods"] = [self.plain(p) for p in sorted((pods.items if pods else []), key=lambda p: p.metadata.name)]
        deps = self._try("listing deployments", self.apps.list_namespaced_deployment, ns, label_selector=selector,
                         _request_timeout=self.params["timeout"])
        snap["deployments"] = [self.plain(d) for d in (deps.items if deps else [])]
        related = {name} | {p["metadata"]["name"] for p in snap["pods"]} | {d["metadata"]["name"] for d in snap["deployments"]}
        prefixes = tuple(d["metadata"]["name"] + "-" for d in snap["deployments"]) + ("%s-predictor" % name,)
        events = self._try("listing events", self.core.list_namespaced_event, ns, _request_timeout=self.params["timeout"])
        for ev in (events.items if events else []):
            obj = ev.involved_object
            if obj and (obj.name in related or (obj.kind == "ReplicaSet" and obj.name.startswith(prefixes))):
                snap["events"].append(self.plain(ev))
        snap["events"].sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        for pod in snap["pods"]:
            pname = pod["metadata"]["name"]
            statuses = {cs["name"]: cs for cs in ((pod.get("status") or {}).get("initContainerStatuses") or [])
                        + ((pod.get("status") or {}).get("containerStatuses") or [])}
            containers = [c["name"] for c in (pod["spec"].get("initContainers") or [])] + [c["name"] for c in pod["spec"]["containers"]]
            entry = {}
            for cname in containers:
                cs = statuses.get(cname) or {}
                started = bool(cs.get("state", {}).get("running") or cs.get("state", {}).get("terminated") or cs.get("lastState"))
                logs = {"current": self.log(ns, pname, cname, False) if started else None}
                if int(cs.get("restartCount") or 0) > 0 or (cs.get("lastState") or {}).get("terminated"):
                    logs["previous"] = self.log(ns, pname, cname, True)
                entry[cname] = logs
            snap["logs"][pname] = entry
        if self.params["read_referenced_secrets"]:
            sa_names = {((p.get("spec") or {}).get("serviceAccountName") or "default") for p in snap["pods"]}
            if snap.get("isvc"):
                sa_names.add((((snap["isvc"].get("spec") or {}).get("predictor") or {}).get("serviceAccountName") or "default"))
            self.referenced_secrets(ns, snap["pods"], sa_names)
        return snap


def _engine_facts(snap):
    """vLLM version and engine speculative config from the collected logs (current first, then previous)."""
    version, config = None, None
    for containers in snap["logs"].values():
        for key in ("current", "previous"):
            text = (containers.get("kserve-container") or {}).get(key)
            if not text:
                continue
            res = engine_log.scan_text(text)
            if res.get("found"):
                version = version or res.get("vllm_version")
                if config is None:
                    config = res.get("speculative_config") or {}
    eng = snap.get("engine")
    if isinstance(eng, dict):
        version = version or eng.get("vllm_version")
    return version, config


def _files_for(snap, findings, secrets):
    base = "%s/%s/" % (snap["namespace"], snap["name"])
    files = {}
    snap = dict(snap)
    for key in ("isvc", "pods", "deployments", "events", "engine", "metrics", "runtime", "effective_command"):
        if snap.get(key) is not None:
            snap[key] = credentials.redact_obj(snap[key], secrets)
    if snap.get("isvc") is not None:
        files[base + "inferenceservice.yaml"] = dump(snap["isvc"])
        files[base + "describe.txt"] = describe(snap)
    else:
        files[base + "error.txt"] = (snap.get("isvc_error") or "") + "\n"
    if snap.get("runtime") is not None:
        files[base + "%s.yaml" % snap["runtime"].get("kind", "ServingRuntime").lower()] = dump(snap["runtime"])
    if snap.get("effective_command") is not None:
        files[base + "effective_command.json"] = json.dumps(snap["effective_command"], sort_keys=True, indent=2, default=str) + "\n"
    files[base + "events.yaml"] = dump(snap["events"])
    if snap["deployments"]:
        files[base + "deployments.yaml"] = dump(snap["deployments"])
    for pod in snap["pods"]:
        pname = pod["metadata"]["name"]
        files[base + "pods/%s.yaml" % pname] = dump(pod)
        pod_events = [e for e in snap["events"] if (e.get("involvedObject") or {}).get("name") == pname]
        files[base + "pods/%s.events.yaml" % pname] = dump(pod_events)
        for cname, logs in (snap["logs"].get(pname) or {}).items():
            for key, suffix in (("current", ".log"), ("previous", ".previous.log")):
                if logs.get(key) is not None:
                    files[base + "logs/%s/%s%s" % (pname, cname, suffix)] = logs[key]
    for key, fname in (("engine", "engine_config.json"), ("metrics", "spec_metrics.json")):
        if snap.get(key) is not None:
            files[base + fname] = json.dumps(snap[key], sort_keys=True, indent=2, default=str) + "\n"
    files[base + "findings.json"] = json.dumps(findings, sort_keys=True, indent=2) + "\n"
    return files


_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_inputs(params):
    """Refuse bad names and paths before the API server is asked or anything is written."""
    for i, item in enumerate(params["names"]):
        parts = str(item).split("/")
        if len(parts) > 2 or not all(len(p) <= 63 and _DNS1123.match(p) for p in parts):
            raise ValidationError("%r is not an InferenceService name or namespace/name" % (item,), field="names[%d]" % i,
                                  hint="give lowercase DNS-1123 names, e.g. llama-eagle3 or models/llama-eagle3")
    for key in ("tail_lines", "timeout"):
        if params[key] < 1:
            raise ValidationError("must be at least 1, got %d" % params[key], field=key, hint="use the default (%s)" % BUNDLE_DEFAULTS[key])
    name = params["archive_name"]
    if name is not None and (not name or name != os.path.basename(name) or name.startswith(".")):
        raise ValidationError("%r is not a plain file name" % name, field="archive_name",
                              hint="give a file name such as troubleshoot-llama.tar.gz; the directory is dest")
    if os.path.exists(params["dest"]) and not os.path.isdir(params["dest"]):
        raise ValidationError("%s exists and is not a directory" % params["dest"], field="dest", hint="give a directory for the bundle")


def bundle(api_client, params, check_mode=False, diff=False):
    """Collect every named InferenceService, diagnose it and write the archive and the summary (only the member names
    with check_mode); returns troubleshoot_bundle's result. Run check_inputs first."""
    collector = Collector(api_client, params)
    targets = []
    for item in params["names"]:
        ns, _sep, name = item.rpartition("/")
        targets.append((ns or params["namespace"], name))
    kserve_cfg = collector.storage_initializer()
    storage_cfg = ((kserve_cfg or {}).get("data") or {}).get("storageInitializer") if kserve_cfg else None
    sections, services, files = [], [], {}
    snaps = []
    for ns, name in targets:
        snap = collector.collect(ns, name)
        key = "%s/%s" % (ns, name)
        snap["engine"] = params["engine_results"].get(key) or params["engine_results"].get(name)
        snap["metrics"] = params["metrics_results"].get(key) or params["metrics_results"].get(name)
        snap["storage_initializer"] = storage_cfg if isinstance(storage_cfg, dict) else None
        snap["deploy_errors"] = params["deploy_errors"]
        snap["expected_deployment_mode"] = params["expected_deployment_mode"]
        snaps.append(snap)
    secrets = [v for v in list(params["redact"]) + collector.secret_values if v]
    for snap in snaps:
        findings = diagnose(snap)
        snap["vllm_version"], snap["engine_line_config"] = _engine_facts(snap)
        sections.append(service_summary(snap, findings))
        likely = next((f for f in findings if f["severity"] == "error"), None)
        services.append({"namespace": snap["namespace"], "name": snap["name"], "likely_cause": likely["cause"] if likely else
                         (findings[0]["cause"] if findings else "none"), "vllm_version": snap["vllm_version"],
                         "modelcar": (str((snap["storage_initializer"] or {}).get("enableModelcar", True)).lower() != "false")
                         if snap["storage_initializer"] is not None else None,
                         "findings": findings})
        files.update(_files_for(snap, findings, secrets))
    if kserve_cfg is not None:
        files["kserve/inferenceservice-config.yaml"] = dump(credentials.redact_obj(kserve_cfg, secrets))
    if collector.notes:
        files["collection-notes.txt"] = "\n".join(collector.notes) + "\n"
    summary = credentials.redact(summary_markdown(sections), secrets)
    files["summary.md"] = summary
    files["summary.json"] = json.dumps(services, sort_keys=True, indent=2) + "\n"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    archive_name = params["archive_name"] or "troubleshoot-%s.tar.gz" % stamp
    archive = os.path.join(params["dest"], archive_name)
    stem = archive_name[:-len(".tar.gz")] if archive_name.endswith(".tar.gz") else archive_name
    summary_path = os.path.join(params["dest"], stem + "-summary.md")
    members = sorted("%s/%s" % (stem, rel) for rel in files)
    if not check_mode:
        os.makedirs(params["dest"], exist_ok=True)
        members = write_archive(archive, files, secrets, root=stem)
        with open(summary_path, "w", encoding="utf-8") as handle:
            handle.write(summary)
    services = credentials.redact_obj(services, secrets)
    extra = {}
    if diff:
        extra["diff"] = {"before": "", "after": "".join(m + "\n" for m in members), "before_header": archive, "after_header": archive}
    return dict(changed=True, archive=archive, summary_path=summary_path, summary=summary,
                members=members, services=services, notes=[credentials.redact(n, secrets) for n in collector.notes], **extra)
