#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: troubleshoot_bundle
short_description: Collect what to look at for failing vLLM InferenceServices into one archive, with a likely cause
version_added: 0.1.0
description:
  - For each named InferenceService reads, through the API server, what the guide says to look at
    the InferenceService (spec, status, conditions, events, as C(kubectl describe) shows them), its predictor
    Deployment, the predictor pods and their events, the last O(tail_lines) lines of every predictor container log
    (init containers too; current and previous instance), and the KServe C(inferenceservice-config)
    C(storageInitializer) settings (Modelcar on or off), and the ServingRuntime or ClusterServingRuntime KServe merges
    into the predictor with the merged command (C(effective_command.json), saying where C(--speculative-config) comes from).
  - Finds the vLLM version and the speculative config in the engine-config line of the logs, and acceptance from the
    C(SpecDecoding metrics:) lines; results of M(alauda.spec_decoding.engine_config_info) and
    M(alauda.spec_decoding.speculative_metrics_info) given in O(engine_results) and O(metrics_results) are used and stored too.
  - Writes one C(tar.gz) archive and a short C(summary.md) beside it that names the likely cause per InferenceService
    (pending pod, image pull, OOM, crash at startup, readiness deadline too short for a draft, acceptance near zero,
    deploymentMode change rejected, Modelcar off, ...), with evidence and the fix.
  - Secret values are redacted everywhere, in the archive and in the returned data - values of the Secrets the pods and
    their ServiceAccount reference (when readable), O(redact), token-like arguments and environment variables.
author:
  - Alauda Platform Team (@alauda)
options:
  names:
    description:
      - InferenceServices to look at, V(name) (in O(namespace)) or V(namespace/name).
    type: list
    elements: str
    required: true
  namespace:
    description: Namespace for names given without one.
    type: str
    default: default
  tail_lines:
    description: Lines kept from the end of every container log.
    type: int
    default: 500
  dest:
    description: Directory that receives the archive and the summary (created if missing).
    type: path
    required: true
  archive_name:
    description: File name of the archive; default C(troubleshoot-<UTC time>.tar.gz).
    type: str
  engine_results:
    description: Registered results of M(alauda.spec_decoding.engine_config_info), keyed by V(namespace/name).
    type: dict
    default: {}
  metrics_results:
    description: Registered results of M(alauda.spec_decoding.speculative_metrics_info), keyed by V(namespace/name).
    type: dict
    default: {}
  kserve_namespaces:
    description: Namespaces searched, in order, for the C(inferenceservice-config) ConfigMap.
    type: list
    elements: str
    default: [kserve, kubeflow, opendatahub, redhat-ods-applications, default]
  expected_deployment_mode:
    description: The deploymentMode the inventory or GitOps manifest asks for; a difference from the live one is reported.
    type: str
  deploy_errors:
    description: Error text of a failed deploy or GitOps sync (for example the webhook's message), searched by the rules.
    type: list
    elements: str
    default: []
  redact:
    description: Extra values to hide (tokens, passwords); never written, never returned.
    type: list
    elements: str
    default: []
  read_referenced_secrets:
    description:
      - Read the Secrets the pods (C(secretKeyRef), C(envFrom)) and their ServiceAccount reference, only to redact their values
        wherever they appear in logs. Needs get on secrets; without it only the other redaction applies.
    type: bool
    default: true
  timeout:
    description: Seconds allowed for each API server request.
    type: int
    default: 60
extends_documentation_fragment:
  - alauda.spec_decoding.attributes.WRITES
  - alauda.spec_decoding.attributes.ACTION_GROUP
  - kubernetes.core.k8s_auth_options
notes:
  - Needs get/list on inferenceservices, pods, pods/log, events, deployments and configmaps in the KServe namespace.
  - In check mode everything is read and diagnosed, nothing is written (RV(members) lists what would be written).
  - Always reports C(changed) (a new archive each run).
seealso:
  - module: alauda.spec_decoding.engine_config_info
  - module: alauda.spec_decoding.speculative_metrics_info
"""

EXAMPLES = r"""
- name: Bundle for two InferenceServices
  alauda.spec_decoding.troubleshoot_bundle:
    names: [models/llama-eagle3, models/llama-ngram]
    dest: ./troubleshoot-out
    tail_lines: 300
  register: bundle

- name: Print the likely causes
  ansible.builtin.debug:
    msg: "{{ bundle.summary }}"
"""

RETURN = r"""
archive:
  description: Path of the archive (not written in check mode).
  returned: always
  type: str
  sample: /work/troubleshoot-out/troubleshoot-20250101T120000Z.tar.gz
summary_path:
  description: Path of the summary written beside the archive.
  returned: always
  type: str
summary:
  description: The summary text (Markdown), redacted.
  returned: always
  type: str
members:
  description: Files in the archive.
  returned: always
  type: list
  elements: str
services:
  description: Per InferenceService C(namespace), C(name), C(likely_cause), C(vllm_version), C(modelcar) and C(findings)
    (each with C(cause), C(severity), C(title), C(evidence), C(fix)).
  returned: always
  type: list
  elements: dict
  sample: [{"namespace": "models", "name": "llama-eagle3", "likely_cause": "readiness_deadline", "vllm_version": "0.32.0",
            "findings": [{"cause": "readiness_deadline", "severity": "error", "title": "...", "evidence": ["..."], "fix": "..."}]}]
"""

import json
import os
import re
import time

from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import credentials
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import troubleshoot
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError

KSERVE_CONFIGMAP = "inferenceservice-config"
ISVC_LABEL = "serving.kserve.io/inferenceservice"


def argument_spec():
    spec = dict(
        names=dict(type="list", elements="str", required=True),
        namespace=dict(type="str", default="default"),
        tail_lines=dict(type="int", default=500),
        dest=dict(type="path", required=True),
        archive_name=dict(type="str"),
        engine_results=dict(type="dict", default={}),
        metrics_results=dict(type="dict", default={}),
        kserve_namespaces=dict(type="list", elements="str", default=["kserve", "kubeflow", "opendatahub", "redhat-ods-applications", "default"]),
        expected_deployment_mode=dict(type="str"),
        deploy_errors=dict(type="list", elements="str", default=[]),
        redact=dict(type="list", elements="str", default=[], no_log=True),
        read_referenced_secrets=dict(type="bool", default=True),
        timeout=dict(type="int", default=60),
    )
    spec.update(AUTH_ARG_SPEC)
    return spec


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
            runtime as serving_runtime,
        )
        try:
            effective = serving_runtime.effective_command(snap["isvc"], serving_runtime.ClientReader(self.api_client))
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
        files[base + "inferenceservice.yaml"] = troubleshoot.dump(snap["isvc"])
        files[base + "describe.txt"] = troubleshoot.describe(snap)
    else:
        files[base + "error.txt"] = (snap.get("isvc_error") or "") + "\n"
    if snap.get("runtime") is not None:
        files[base + "%s.yaml" % snap["runtime"].get("kind", "ServingRuntime").lower()] = troubleshoot.dump(snap["runtime"])
    if snap.get("effective_command") is not None:
        files[base + "effective_command.json"] = json.dumps(snap["effective_command"], sort_keys=True, indent=2, default=str) + "\n"
    files[base + "events.yaml"] = troubleshoot.dump(snap["events"])
    if snap["deployments"]:
        files[base + "deployments.yaml"] = troubleshoot.dump(snap["deployments"])
    for pod in snap["pods"]:
        pname = pod["metadata"]["name"]
        files[base + "pods/%s.yaml" % pname] = troubleshoot.dump(pod)
        pod_events = [e for e in snap["events"] if (e.get("involvedObject") or {}).get("name") == pname]
        files[base + "pods/%s.events.yaml" % pname] = troubleshoot.dump(pod_events)
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
            raise ValidationError("must be at least 1, got %d" % params[key], field=key, hint="use the default (%s)" % argument_spec()[key]["default"])
    name = params["archive_name"]
    if name is not None and (not name or name != os.path.basename(name) or name.startswith(".")):
        raise ValidationError("%r is not a plain file name" % name, field="archive_name",
                              hint="give a file name such as troubleshoot-llama.tar.gz; the directory is dest")
    if os.path.exists(params["dest"]) and not os.path.isdir(params["dest"]):
        raise ValidationError("%s exists and is not a directory" % params["dest"], field="dest", hint="give a directory for the bundle")


def main():
    module = AnsibleK8SModule(argument_spec=argument_spec(), supports_check_mode=True)
    params = module.params
    try:
        check_inputs(params)
    except SpecDecodingError as exc:
        module.fail_json(msg=str(exc), field=exc.field)
    module.requires("kubernetes")
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client  # pylint: disable=import-outside-toplevel
    api_client = get_api_client(module=module).client.client
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
        findings = troubleshoot.diagnose(snap)
        snap["vllm_version"], snap["engine_line_config"] = _engine_facts(snap)
        sections.append(troubleshoot.service_summary(snap, findings))
        likely = next((f for f in findings if f["severity"] == "error"), None)
        services.append({"namespace": snap["namespace"], "name": snap["name"], "likely_cause": likely["cause"] if likely else
                         (findings[0]["cause"] if findings else "none"), "vllm_version": snap["vllm_version"],
                         "modelcar": (str((snap["storage_initializer"] or {}).get("enableModelcar", True)).lower() != "false")
                         if snap["storage_initializer"] is not None else None,
                         "findings": findings})
        files.update(_files_for(snap, findings, secrets))
    if kserve_cfg is not None:
        files["kserve/inferenceservice-config.yaml"] = troubleshoot.dump(credentials.redact_obj(kserve_cfg, secrets))
    if collector.notes:
        files["collection-notes.txt"] = "\n".join(collector.notes) + "\n"
    summary = credentials.redact(troubleshoot.summary_markdown(sections), secrets)
    files["summary.md"] = summary
    files["summary.json"] = json.dumps(services, sort_keys=True, indent=2) + "\n"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    archive_name = params["archive_name"] or "troubleshoot-%s.tar.gz" % stamp
    archive = os.path.join(params["dest"], archive_name)
    stem = archive_name[:-len(".tar.gz")] if archive_name.endswith(".tar.gz") else archive_name
    summary_path = os.path.join(params["dest"], stem + "-summary.md")
    members = sorted("%s/%s" % (stem, rel) for rel in files)
    if not module.check_mode:
        os.makedirs(params["dest"], exist_ok=True)
        members = troubleshoot.write_archive(archive, files, secrets, root=stem)
        with open(summary_path, "w", encoding="utf-8") as handle:
            handle.write(summary)
    services = credentials.redact_obj(services, secrets)
    extra = {}
    if module._diff:  # pylint: disable=protected-access
        extra["diff"] = {"before": "", "after": "".join(m + "\n" for m in members), "before_header": archive, "after_header": archive}
    module.exit_json(changed=True, archive=archive, summary_path=summary_path, summary=summary,
                     members=members, services=services, notes=[credentials.redact(n, secrets) for n in collector.notes], **extra)


if __name__ == "__main__":
    main()
