# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The troubleshooting rules: ``diagnose(snapshot)`` takes what was collected for one InferenceService (plain dicts as
the API server returns them, log tails, the engine_config / spec_metrics results when they ran) and returns findings
ordered by how likely they explain the trouble, each with the evidence and the fix:

``pending_pod`` (unschedulable), ``pods_not_created``, ``image_pull``, ``storage_download`` (storage
initializer / modelcar-init failed), ``oom`` (OOMKilled or CUDA out of memory), ``crash_loop`` (the engine
exits: the error line from the previous log), ``permission_denied``, ``disk_pressure``,
``readiness_deadline`` (progress deadline exceeded or probes killed a still-loading engine, worse with a
draft), ``deployment_mode_change_rejected``, ``modelcar_disabled``, ``acceptance_near_zero``,
``engine_mismatch``, ``starting`` / ``not_ready``, and informational ``min_p_logit_bias``.

Apart from the collectors (troubleshoot.py): the rules read a snapshot, never the cluster. Plain Python, no Ansible
imports.
"""

from __future__ import annotations

import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import storage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as metrics_mod
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import spec_decoding_log

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
    # a bare oci:// follows the cluster's OCI mode; oci+native:// is mounted whatever the mode
    oci = [u for u in storage_uris(isvc) if storage.parse_oci_scheme(u) == ("", u, True)]
    if not oci or not isinstance(cfg, dict):
        return
    mode, how = storage.resolve_oci_mode(cfg)
    if mode == storage.OCI_DISABLED:
        findings.append(_finding("modelcar_disabled", "error", "the InferenceService uses oci:// but the storage initializer has OCI images off",
                                 ["inferenceservice-config storageInitializer: " + how, "storage URIs: " + ", ".join(oci)],
                                 "set enableModelcar: true (or ociModelMode: modelcar or native) in the storageInitializer entry of the "
                                 "inferenceservice-config ConfigMap (and restart the KServe controller), or use storageUris/PVC artifacts"))


def _metrics_from_logs(logs, spec_cfg):
    texts = []
    for containers in (logs or {}).values():
        cur = (containers.get("kserve-container") or {}).get("current")
        if cur:
            texts.append(cur)
    if not texts:
        return None
    try:
        counters = spec_decoding_log.parse_log_text("\n".join(texts))[0]
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
