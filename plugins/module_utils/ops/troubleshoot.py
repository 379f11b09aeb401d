# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Troubleshooting bundle: what troubleshoot_bundle reads from the cluster for each InferenceService (``Collector``),
the describe-like text, the summary and the archive. The diagnosis is ``troubleshoot_rules.diagnose``.

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
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import files as local_files
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import storage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as metrics_mod
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError, optional_import
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner as gitops_owner
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait
# The rules' readers over API objects serve the describe text and the summary too.
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.troubleshoot_rules import (
    _condition, _conditions, _container_statuses, _events_for, _pod_name, diagnose, speculative_config_of, storage_uris,
)

yaml = optional_import("yaml")[0]
HAS_YAML = yaml is not None


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
    if snap.get("preflight") is not None:
        lines.append("Draft preflight (re-run read-only for this bundle; docs/preflight.md):")
        lines.extend("  " + line.strip() for line in preflight_report(snap["preflight"]))
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
    if snap.get("owner") is not None:
        # a live fix of a managed object lasts until the owner's next sync: say who that is before anyone patches
        lines.append("- " + gitops_owner.summary(snap["owner"]))
    eng = snap.get("engine_line_config")
    if eng is not None:
        lines.append("- Engine-config line: speculative_config=%s" % json.dumps(eng, sort_keys=True))
    cfg = snap.get("storage_initializer")
    if isinstance(cfg, dict):
        mode, how = storage.resolve_oci_mode(cfg)
        modelcar = "%s (inferenceservice-config storageInitializer: %s)" % ("off" if mode == storage.OCI_DISABLED else "on, %s mode" % mode, how)
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
    with local_files.replacing(path) as tmp, tarfile.open(tmp, "w:gz") as tar:
        for rel in sorted(files):
            data = credentials.redact(files[rel], secrets).encode("utf-8")
            info = tarfile.TarInfo("%s/%s" % (root, rel))
            info.size = len(data)
            info.mtime = int(time.time())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
            names.append(info.name)
    return names


# The bundle module troubleshoot_bundle writes: what it reads from the cluster, and the archive.

KSERVE_CONFIGMAP = "inferenceservice-config"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
BUNDLE_DEFAULTS = {"tail_lines": 500, "timeout": 60}  # troubleshoot_bundle's defaults of these options


class Collector:
    """Reads one InferenceService's objects and logs through the cluster service (kube/service.py), as plain dicts;
    every API error becomes a note, never a failure."""

    def __init__(self, cluster, params):
        self.service = kube_service.service_of(cluster)
        self.api_client = self.service.api_client
        self.params = params
        self.notes = []
        self.secret_values = []

    def _try(self, what, func, *args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception as exc:  # pylint: disable=broad-except
            self.notes.append("%s: %s" % (what, kube_service.api_error_message(exc) if hasattr(exc, "status") else exc))
            return None

    def storage_initializer(self):
        for ns in self.params["kserve_namespaces"]:
            try:
                cm = self.service.get(kube_service.CONFIG_MAP, KSERVE_CONFIGMAP, ns, timeout=self.params["timeout"])
            except Exception:  # pylint: disable=broad-except
                continue
            data = dict(cm.get("data") or {})
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
        try:
            return self.service.pod_log_text(ns, pod, container=container, tail_lines=self.params["tail_lines"], previous=previous,
                                             timeout=self.params["timeout"])
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
            sa = self._try("ServiceAccount %s/%s" % (ns, sa_name), self.service.get, kube_service.SERVICE_ACCOUNT, sa_name, ns,
                           timeout=self.params["timeout"]) or {}
            for ref in (sa.get("secrets") or []) + (sa.get("imagePullSecrets") or []):
                if ref.get("name"):
                    names.add(ref["name"])
        for name in sorted(names):
            try:
                secret = self.service.get(kube_service.SECRET, name, ns, timeout=self.params["timeout"])
            except Exception:  # pylint: disable=broad-except
                self.notes.append("Secret %s/%s not readable: its values are redacted by pattern only" % (ns, name))
                continue
            import base64  # pylint: disable=import-outside-toplevel
            data = dict(secret.get("data") or {})
            if secret.get("type") == "kubernetes.io/service-account-token":
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
            effective = serving_runtime.effective_command(snap["isvc"], runtime_readers.ClientReader(self.service))
        except SpecDecodingError as exc:
            self.notes.append("runtime of %s/%s not resolved: %s" % (snap["namespace"], snap["name"], exc))
            return
        snap["runtime"] = effective.runtime
        snap["effective_command"] = effective.as_dict()

    def collect(self, ns, name):
        snap = {"namespace": ns, "name": name, "pods": [], "events": [], "deployments": [], "logs": {}}
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
        timeout = self.params["timeout"]
        try:
            snap["isvc"] = self.service.request("GET", kube_service.INFERENCE_SERVICE.path(name, ns), timeout=timeout)
        except ApiException as exc:
            snap["isvc"] = None
            snap["isvc_error"] = "InferenceService %s/%s: %s" % (ns, name, kube_service.api_error_message(exc))
        if snap.get("isvc"):
            self.runtime(snap)
            # Argo CD / Flux / Helm: read_owner answers an API refusal itself (readable false); anything else is a note
            snap["owner"] = self._try("reading the owner of %s/%s" % (ns, name), gitops_owner.read_owner, self.api_client, snap["isvc"])
        selector = "%s=%s" % (ISVC_LABEL, name)
        pods = self._try("listing pods", self.service.list, kube_service.POD, ns, selector=selector, timeout=timeout) or []
        snap["pods"] = sorted(pods, key=lambda p: p["metadata"]["name"])
        snap["deployments"] = self._try("listing deployments", self.service.list, kube_service.DEPLOYMENT, ns, selector=selector,
                                        timeout=timeout) or []
        related = {name} | {p["metadata"]["name"] for p in snap["pods"]} | {d["metadata"]["name"] for d in snap["deployments"]}
        prefixes = tuple(d["metadata"]["name"] + "-" for d in snap["deployments"]) + ("%s-predictor" % name,)
        for ev in self._try("listing events", self.service.list, kube_service.EVENT, ns, timeout=timeout) or []:
            obj = ev.get("involvedObject") or {}
            obj_name = obj.get("name") or ""
            if obj_name in related or (obj.get("kind") == "ReplicaSet" and obj_name.startswith(prefixes)):
                snap["events"].append(ev)
        snap["events"].sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        for pod in snap["pods"]:
            pname = pod["metadata"]["name"]
            statuses = {cs["name"]: cs for cs in ((pod.get("status") or {}).get("initContainerStatuses") or [])
                        + ((pod.get("status") or {}).get("containerStatuses") or [])}
            containers = [c["name"] for c in (pod["spec"].get("initContainers") or [])] + [c["name"] for c in pod["spec"]["containers"]]
            entry = {}
            for cname in containers:
                cs = statuses.get(cname) or {}
                logs = {"current": self.log(ns, pname, cname, False) if kube_wait.container_started(cs) else None}
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


# ----------------------------------------------------------------------------------------------------
# preflight: the draft checked against its target from the checkpoints' metadata, shown in describe.txt and preflight.json

def preflight_of(api_client, snap):
    """The draft preflight (ops/draft_preflight.py) re-run on the collected InferenceService, read-only and warn only:
    the bundle starts no Job (a PVC's checkpoints are said not read) and reaches nothing on the internet (the air-gapped
    rules refuse hub and public hosts). None without an InferenceService or a speculative flag; a check that cannot run is
    a result with ``skipped`` saying why."""
    # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_preflight
    isvc = snap.get("isvc")
    if not isvc or not speculative_config_of(isvc):
        return None
    params = dict(draft_preflight.PARAM_DEFAULTS, preflight="warn", air_gapped=True, namespace=snap["namespace"], pvc_job=False,
                  pvc_job_off_reason="the troubleshooting bundle starts no Job", vllm_version=snap.get("vllm_version"))
    try:
        return draft_preflight.preflight(params, connect=lambda: api_client, isvc=isvc)
    except Exception as exc:  # pylint: disable=broad-except
        # a bundle is collected for a broken service: a preflight that cannot run is said, never the bundle's failure
        return {"method": (speculative_config_of(isvc) or {}).get("method"), "skipped": "not run: %s" % exc, "checks": [], "warnings": []}


def preflight_report(result):
    # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import draft_preflight
    return draft_preflight.report(result)


def _files_for(snap, findings, secrets):
    base = "%s/%s/" % (snap["namespace"], snap["name"])
    files = {}
    snap = dict(snap)
    for key in ("isvc", "pods", "deployments", "events", "engine", "metrics", "runtime", "effective_command", "preflight"):
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
    for key, fname in (("engine", "engine_config.json"), ("metrics", "spec_metrics.json"), ("preflight", "preflight.json")):
        if snap.get(key) is not None:
            files[base + fname] = json.dumps(snap[key], sort_keys=True, indent=2, default=str) + "\n"
    files[base + "findings.json"] = json.dumps(findings, sort_keys=True, indent=2) + "\n"
    if snap.get("owner") is not None:
        files[base + "owner.json"] = json.dumps(snap["owner"], sort_keys=True, indent=2) + "\n"
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


def bundle(cluster, params, check_mode=False, diff=False):
    """Collect every named InferenceService, diagnose it and write the archive and the summary (only the member names
    with check_mode); returns troubleshoot_bundle's result. ``cluster``: the ClusterService (or a bare ApiClient). Run
    check_inputs first."""
    collector = Collector(cluster, params)
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
        snap["preflight"] = preflight_of(collector.api_client, snap)
        sections.append(service_summary(snap, findings))
        likely = next((f for f in findings if f["severity"] == "error"), None)
        services.append({"namespace": snap["namespace"], "name": snap["name"], "likely_cause": likely["cause"] if likely else
                         (findings[0]["cause"] if findings else "none"), "vllm_version": snap["vllm_version"],
                         "modelcar": storage.resolve_oci_mode(snap["storage_initializer"])[0] != storage.OCI_DISABLED
                         if snap["storage_initializer"] is not None else None,
                         "owner": snap.get("owner"), "findings": findings})
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
