# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The benchmark's load from inside the cluster: the collection's own client as a Job next to the InferenceService.

Why: ``status.address.url`` of an InferenceService is a cluster-internal name (``<isvc>-predictor.<ns>.svc.cluster.local``):
from a bastion or a laptop it does not resolve, and through an ingress an A/B measures the network and the ingress's
buffering as much as the engine. The Job sends the same prompts with the same pacing, warmups and protocol as the
controller would (``load_job_pod``, the same ``bench/client.py``), and brings back the raw measurements; the controller
computes every statistic and writes the report as before, so both modes give the same report from the same records.

What is created, all in the InferenceService's namespace, named ``spec-decoding-load-<8 hex>``, labelled
``app.kubernetes.io/managed-by: alauda.spec_decoding``:

- a ConfigMap: the client as a zip application (``bundle``) and the request (prompts, parameters, the sides' URLs);
- a Secret, only with a bearer token or extra headers (the pod reads them from its environment; the ConfigMap, the Job
  and the result never carry them);
- a Job (``backoffLimit: 0``, ``activeDeadlineSeconds``, ``ttlSecondsAfterFinished``) whose one pod runs ``python3`` in
  the serving runtime's image by default (already on the nodes, also in an air-gapped cluster), with no service
  account token (it never calls the API), no privilege escalation and no capabilities.

The ConfigMap and the Secret are owned by the Job, so the Job's TTL removes all three when a run is interrupted; a
finished run deletes them itself (``keep`` leaves them for a look). The pod's log is the progress; its result is read
from the log's last lines (size-bounded, see ``load_job_pod``). The identity that runs the playbook needs create, patch
and delete on configmaps and secrets, create, get and delete on jobs, list on pods and get on pods/log in that namespace
(docs/rbac/benchmark.yaml).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import json
import os
import time
import uuid
import zipfile
from urllib.parse import urlsplit

from ansible_collections.alauda.spec_decoding.plugins.module_utils import errors
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import client as bench_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job_merge
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import load_job_pod
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import metrics as spec_metrics
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import prometheus_text

LOAD_FROM = ("auto", "controller", "cluster")
CONTAINER = "load"
MOUNT = "/etc/spec-decoding-load"
NAME_PREFIX = "spec-decoding-load-"
LABEL = "alauda.io/spec-decoding-load"
MANAGED_BY = {"app.kubernetes.io/managed-by": "alauda.spec_decoding", "app.kubernetes.io/component": "benchmark-load"}
# Kept after the run ends, so a run interrupted on the controller still cleans up after itself.
TTL_SECONDS = 3600
# The log is read whole; the result is at most load_job_pod.MAX_RESULT_BYTES, the progress one line per request.
MAX_LOG_BYTES = 12 * 1024 * 1024
# The creates and the owner patches are Update operations under this manager (managedFields say who wrote them).
FIELD_MANAGER = "alauda-spec-decoding-benchmark"
# The metric families the controller reads from the pod's two scrapes (acceptance, prefix cache); the rest of a
# /metrics page (hundreds of histogram lines) stays in the pod.
METRIC_PREFIXES = tuple(spec_metrics.SPEC_PREFIXES) + tuple(bench_client.PREFIX_CACHE_PREFIXES) + (bench_client.CACHE_CONFIG_INFO,)
# Whether the client kept up with its schedule (every run says it; a run over either bound gives no decision): the 99th
# percentile of the send lag (bench/stream_client.py: how late a request went out against its release, once a stream
# slot was free for it) and the client's CPU over the measured requests (its event loop thread's CPU seconds / wall
# seconds). One event loop is one core at most: at 0.9 of it the loop is late to read the chunks and that lateness lands
# in ITL and TPOT; 100 ms late at p99 is no longer the arrival process the protocol asked for.
MAX_SEND_LAG_P99_MS = 100.0
MAX_CLIENT_CPU = 0.9
# The files of the zip application, in import order (what load_job_pod imports, and it).
_SHIPPED = (errors, prometheus_text, bench_client.stream_client, bench_client, load_job_pod)
_MAIN = ("import sys\n"
         "from %s import main\n"
         "sys.exit(main())\n") % load_job_pod.__name__


def _service():
    """kube/service.py, imported on first use: its calls import the kubernetes library (about a second), which a
    benchmark sent from the controller never needs."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service  # pylint: disable=import-outside-toplevel
    return kube_service


class LoadJobError(SpecDecodingError):
    """The in-cluster load Job could not be run, or its pod failed."""


def options_spec():
    """The suboptions of the ``load_job`` option (spec_benchmark; doc fragment alauda.spec_decoding.load_job)."""
    return dict(
        namespace=dict(type="str"),
        image=dict(type="str"),
        python=dict(type="str", default="python3"),
        image_pull_policy=dict(type="str", choices=["Always", "IfNotPresent", "Never"], default="IfNotPresent"),
        image_pull_secrets=dict(type="list", elements="str", default=[], no_log=False),
        service_account_name=dict(type="str"),
        node_selector=dict(type="dict", default={}),
        tolerations=dict(type="list", elements="dict", default=[]),
        resources=dict(type="dict", default={"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}),
        pod_annotations=dict(type="dict", default={}),
        timeout=dict(type="int", default=3600),
        pods=dict(type="int", default=1),
        keep=dict(type="bool", default=False),
        kubeconfig=dict(type="raw"),
        context=dict(type="str"),
        host=dict(type="str"),
        api_key=dict(type="str", no_log=True),
        ca_cert=dict(type="path"),
        validate_certs=dict(type="bool"),
    )


_AUTH = ("kubeconfig", "context", "host", "api_key", "ca_cert", "validate_certs")


def cluster_internal(url):
    """True for a Service's cluster-internal name (``<svc>.<ns>.svc`` or ``<svc>.<ns>.svc.<cluster domain>``): it
    resolves only inside the cluster."""
    host = (urlsplit(url or "").hostname or "").rstrip(".")
    return host.endswith(".svc") or ".svc." in host


def choose(load_from, urls, environ=None):
    """``"cluster"`` or ``"controller"``. ``auto``: from inside the cluster (a pod: ``KUBERNETES_SERVICE_HOST`` is set)
    the controller sends; outside it the Job does when a URL is cluster-internal (both sides then measured from the same
    place), else the controller (URLs given by the user, an ingress)."""
    if load_from != "auto":
        return load_from
    if (os.environ if environ is None else environ).get("KUBERNETES_SERVICE_HOST"):
        return "controller"
    return "cluster" if any(cluster_internal(url) for url in urls) else "controller"


def check_options(options):
    """ValidationError naming the field, before anything is created."""
    if not options.get("namespace"):
        raise ValidationError("is required when the load runs in the cluster", field="load_job.namespace",
                              hint="set the InferenceService's namespace (the benchmark role passes benchmark_namespace)")
    if not options.get("image"):
        raise ValidationError("is required when the load runs in the cluster", field="load_job.image",
                              hint="set an image with python3, e.g. the serving runtime's (the roles pass the candidate's "
                                   "when they read it from the cluster; else benchmark_load_image or tune_load_job.image), or "
                                   "send from here with load_from=controller (benchmark_load_from, tune_load_from)")
    if options.get("timeout", 0) < 60:
        raise ValidationError("must be at least 60 seconds, got %r" % options.get("timeout"), field="load_job.timeout")
    if options.get("pods") is not None and int(options["pods"]) < 1:
        raise ValidationError("must be at least 1, got %r" % options.get("pods"), field="load_job.pods")


def check_pods(options, concurrency, requests):
    """Each pod needs a stream slot and a request of its own: refuse more pods than the concurrency or the measured requests."""
    pods = int(options.get("pods") or 1)
    if pods > 1 and (pods > concurrency or pods > requests):
        raise ValidationError("%d pods for a concurrency of %d and %d measured requests: a pod would have no stream slot or no request"
                              % (pods, concurrency, requests), field="load_job.pods",
                              hint="use at most %d pods, or raise concurrency" % max(1, min(concurrency, requests)))


# -- what is created --------------------------------------------------------------------------------------------


def _zip_entry(path):
    info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))  # fixed: the same sources give the same bytes
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def bundle():
    """The zip application the pod runs: the shipped modules under their package paths (empty package files), and a
    ``__main__``. Sources are read through each module's loader, so this works from a file tree and from Ansible's
    module payload (a zip) alike."""
    buf = io.BytesIO()
    packages = set()
    with zipfile.ZipFile(buf, "w") as archive:
        for module in _SHIPPED:
            source = module.__spec__.loader.get_source(module.__name__)
            archive.writestr(_zip_entry(module.__name__.replace(".", "/") + ".py"), source)
            parts = module.__name__.split(".")[:-1]
            packages.update("/".join(parts[:i]) + "/__init__.py" for i in range(1, len(parts) + 1))
        for path in sorted(packages):
            archive.writestr(_zip_entry(path), "")
        archive.writestr(_zip_entry("__main__.py"), _MAIN)
    return buf.getvalue()


def arg_spec():
    """The options ``load_from`` and ``load_job`` of spec_benchmark and spec_sweep (doc fragment alauda.spec_decoding.load_job).
    A fresh dict on every call."""
    return dict(load_from=dict(type="str", choices=list(LOAD_FROM), default="auto"),
                load_job=dict(type="dict", default={}, options=options_spec()))


def job_request(params, sides, prompts, request_params, ca_text=None, scrape_only=False):
    """The request the pod reads: ``sides`` as ``[(name, Endpoint)]`` in measuring order; ``scrape_only``: read each
    side's served model and /metrics, send no inference request."""
    return {
        "scrape_only": scrape_only,
        "api": params["api"], "timeout": params["timeout"], "validate_certs": params["validate_certs"],
        "ca_path": MOUNT + "/ca.crt" if ca_text else None, "scrape_metrics": params["scrape_metrics"],
        "metric_prefixes": list(METRIC_PREFIXES), "prompts": prompts, "params": request_params,
        "protocol": {key: params.get(key) for key in ("warmup", "runs_per_prompt", "concurrency", "request_rate", "arrival", "seed")},
        "sides": [{"name": name, "url": endpoint.url, "model": endpoint.model, "field": endpoint.field} for name, endpoint in sides],
    }


def manifests(name, options, request, secret_env=None, ca_text=None, code=None):
    """``(ConfigMap, Secret or None, Job)`` for one run; ``secret_env``: the environment the Secret gives the pod."""
    namespace = options["namespace"]
    labels = dict(MANAGED_BY, **{LABEL: name})
    meta = {"name": name, "namespace": namespace, "labels": labels}
    data = {"request.json": json.dumps(request, sort_keys=True)}
    if ca_text:
        data["ca.crt"] = ca_text
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": dict(meta), "data": data,
                 "binaryData": {"load.pyz": base64.b64encode(code if code is not None else bundle()).decode("ascii")}}
    secret = None
    env = []
    if secret_env:
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": dict(meta), "type": "Opaque",
                  "stringData": dict(secret_env)}
        env = [{"name": key, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}} for key in sorted(secret_env)]
    container = {
        "name": CONTAINER, "image": options["image"], "imagePullPolicy": options["image_pull_policy"],
        # -E -S: the image's PYTHONPATH and site-packages stay out (the client needs only the standard library), and
        # the zip application is first on sys.path
        "command": [options["python"], "-E", "-S", MOUNT + "/load.pyz", MOUNT + "/request.json"],
        "env": env, "resources": options["resources"],
        "volumeMounts": [{"name": "load", "mountPath": MOUNT, "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec = {
        "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container], "volumes": [{"name": "load", "configMap": {"name": name}}],
    }
    for option, field in (("service_account_name", "serviceAccountName"), ("node_selector", "nodeSelector"), ("tolerations", "tolerations")):
        if options.get(option):
            pod_spec[field] = options[option]
    if options.get("image_pull_secrets"):
        pod_spec["imagePullSecrets"] = [{"name": secret_name} for secret_name in options["image_pull_secrets"]]
    template_meta = {"labels": dict(labels)}
    if options.get("pod_annotations"):
        template_meta["annotations"] = dict(options["pod_annotations"])
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": dict(meta),
           "spec": {"backoffLimit": 0, "activeDeadlineSeconds": int(options["timeout"]), "ttlSecondsAfterFinished": TTL_SECONDS,
                    "template": {"metadata": template_meta, "spec": pod_spec}}}
    pods = int(options.get("pods") or 1)
    if pods > 1:  # one pod per shard, all at once; each finds its shard in JOB_COMPLETION_INDEX (load_job_pod)
        job["spec"].update(completionMode="Indexed", completions=pods, parallelism=pods)
    return configmap, secret, job


# -- the result -------------------------------------------------------------------------------------------------


def parse_log(text):
    """``(progress lines, result dict or None)`` of the pod's log."""
    lines = text.splitlines()
    try:
        begin = len(lines) - 1 - lines[::-1].index(load_job_pod.BEGIN)
        end = lines.index(load_job_pod.END, begin)
    except ValueError:
        return lines, None
    try:
        result = json.loads(gzip.decompress(base64.b64decode("".join(lines[begin + 1:end]))).decode("utf-8"))
    except (ValueError, OSError, binascii.Error, EOFError):
        return lines[:begin], None
    if not isinstance(result, dict) or result.get("schema") != load_job_pod.RESULT_SCHEMA:
        return lines[:begin], None
    return lines[:begin], result


# -- running it -------------------------------------------------------------------------------------------------


def api_client_for(options):
    """kubernetes.core's authenticated ApiClient from the ``load_job`` options (K8S_AUTH_* and the kubeconfig's defaults
    for the rest, as in kubernetes.core's modules)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import authenticated_api_client  # pylint: disable=import-outside-toplevel
    return authenticated_api_client(**{key: options.get(key) for key in _AUTH})


def module_api_client(module):
    """The client for a module's ``load_job`` options; fails the module, the Ansible way, without the kubernetes library
    (only a load from the cluster needs it: about a second to import, which a load from the controller never pays)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import HAS_KUBERNETES  # pylint: disable=import-outside-toplevel
    if not HAS_KUBERNETES:
        from ansible.module_utils.basic import missing_required_lib  # pylint: disable=import-outside-toplevel
        module.fail_json(msg=missing_required_lib("kubernetes"), field="load_from")
    return api_client_for(module.params["load_job"])


def _resource(kind):
    kube_service = _service()
    return {"ConfigMap": kube_service.CONFIG_MAP, "Secret": kube_service.SECRET, "Job": kube_service.JOB}[kind]


def _api_error(action, obj, exc, hint=None):
    what = "%s %s/%s" % (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
    return LoadJobError("%s %s failed: %s" % (action, what, _service().api_error_message(exc)), field="load_job",
                        hint=hint or "the identity needs create, patch and delete on configmaps and secrets, create, get and "
                                     "delete on jobs, list on pods and get on pods/log in the namespace (docs/rbac/benchmark.yaml)")


class Run:
    """One load Job: ``start()``, ``wait()`` for its pod's end, ``result()``, ``delete()``; every call through the
    cluster service (kube/service.py)."""

    def __init__(self, cluster, options, objects, clock=time.monotonic, sleep=time.sleep, interval=1.0):
        self.service, self.options = _service().service_of(cluster), options
        self.configmap, self.secret, self.job = objects
        self.name = self.job["metadata"]["name"]
        self.namespace = options["namespace"]
        self.clock, self.sleep, self.interval = clock, sleep, interval
        self.created = []
        self.pod = None
        self.pods = []  # every pod of the Job once it ended, in completion index order
        self.expected = int(options.get("pods") or 1)

    def start(self, dry_run=False):
        """Create the objects (all three as a server-side dry run with ``dry_run``: admission and RBAC answer, nothing
        is stored)."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
        for obj in [o for o in (self.configmap, self.secret, self.job) if o is not None]:
            try:
                created = self.service.create(_resource(obj["kind"]), obj, namespace=self.namespace, field_manager=FIELD_MANAGER,
                                              dry_run=dry_run)
            except ApiException as exc:
                raise _api_error("creating", obj, exc) from exc
            if not dry_run:
                self.created.append((obj["kind"], created))
            if obj["kind"] == "Job" and self.expected > 1 and ((created or {}).get("spec") or {}).get("completionMode") != "Indexed":
                # an API server before Kubernetes 1.21 (1.22 without the alpha gate) drops the field: N pods would each
                # send the whole schedule as shard 0
                raise LoadJobError("the API server made %s/%s a Job without completionMode: Indexed, so its %d pods could not "
                                   "tell their shards apart" % (self.namespace, self.name, self.expected), field="load_job.pods",
                                   hint="Indexed Jobs need Kubernetes 1.22 or later (1.21 with the IndexedJob feature gate); on "
                                        "this cluster use load_job.pods: 1")
        if dry_run:
            return
        # The ConfigMap and the Secret go with the Job (its TTL, or a delete with Background propagation).
        owner = dict(self.created[-1][1])
        reference = [{"apiVersion": "batch/v1", "kind": "Job", "name": self.name, "uid": owner["metadata"]["uid"],
                      "blockOwnerDeletion": False}]
        for kind, _obj in self.created[:-1]:
            try:
                self.service.merge_patch(_resource(kind), self.name, {"metadata": {"ownerReferences": reference}},
                                         namespace=self.namespace, field_manager=FIELD_MANAGER)
            except ApiException as exc:
                raise _api_error("patching the owner of", {"kind": kind, "metadata": {"namespace": self.namespace, "name": self.name}},
                                 exc, hint="the identity needs patch on configmaps and secrets in the namespace") from exc

    def _pods(self):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
        try:
            return self.service.list(_service().POD, self.namespace, selector="%s=%s" % (LABEL, self.name))
        except ApiException as exc:
            raise _api_error("listing the pods of", self.job, exc) from exc

    def wait(self):
        """The Job's pod after it ended (Succeeded or Failed; the first failed one of several); LoadJobError when a pod
        cannot start, the Job failed without a pod, or the time is up.

        The wait is kube/wait.py's one loop on its table's Job row, through the cluster service: ended (Complete, or
        Failed: a failed pod's log says why, so result() reads it), its pods looked at every ``interval`` for one that
        cannot start (kube_wait.STUCK_REASONS: a pod's state does not change the Job); an API server outage is waited out."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client  # pylint: disable=import-outside-toplevel
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait  # pylint: disable=import-outside-toplevel
        try:
            job, _elapsed = self.service.wait_for(self.namespace, self.name, _service().JOB, timeout=self.options["timeout"] + 60,
                                                  interval=self.interval, clock=self.clock, sleep=self.sleep, on_timeout=self._timed_out,
                                                  finished=True, pod_selector="%s=%s" % (LABEL, self.name), pod_interval=self.interval)
        except kube_wait.PodCannotStart as exc:
            raise LoadJobError("the load Job's pod %s/%s cannot start: %s: %s" % (self.namespace, exc.pod, exc.reason, exc.detail),
                               field="load_job.image", hint="give an image the nodes can pull and run, with python3 "
                                                            "(load_job.image, load_job.image_pull_secrets, load_job.python)") from exc
        except kube_client.ApiException as exc:
            raise _api_error("reading", self.job, exc) from exc
        ended = [p for p in self._pods() if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")]
        failed = [p for p in ended if p["status"]["phase"] == "Failed"]
        if not ended:
            # ended without a pod that ran (its deadline passed before one started, the pod was deleted): the Job says why
            condition = kube_wait.job_end(job)
            raise LoadJobError("the load Job %s/%s failed: %s: %s" % (
                self.namespace, self.name, condition.get("reason"), condition.get("message") or ""), field="load_job",
                hint="see the Job's events (kubectl describe job -n %s %s)" % (self.namespace, self.name))
        # a failed pod fails the run (backoffLimit 0): its log says why
        self.pods = failed[:1] or sorted(ended, key=_completion_index)[:self.expected]
        self.pod = self.pods[0]
        return self.pod

    def _timed_out(self, _job, _elapsed, _why):
        raise LoadJobError("the load Job %s/%s did not end within %d s" % (self.namespace, self.name, self.options["timeout"]),
                           field="load_job.timeout", hint="raise load_job.timeout, or measure fewer requests")

    def log(self, pod=None):
        pod = pod or self.pod
        return self.service.pod_log_text(self.namespace, pod["metadata"]["name"], max_bytes=MAX_LOG_BYTES, container=CONTAINER)

    def result(self):
        """``(progress lines, result)``, the pods' results merged (load_job_merge) when there are several; LoadJobError
        for a pod that failed or printed no result."""
        if len(self.pods) <= 1:
            return self._pod_result(self.pod)
        lines, results = [], []
        if sorted(_completion_index(pod) for pod in self.pods) != list(range(self.expected)):
            raise LoadJobError("the load Job %s/%s's pods carry the completion indexes %s, not 0 to %d: their shards cannot be "
                               "merged" % (self.namespace, self.name, sorted(_completion_index(p) for p in self.pods), self.expected - 1),
                               field="load_job.pods", hint="on this cluster use load_job.pods: 1")
        for pod in self.pods:
            progress, result = self._pod_result(pod)
            lines.extend("pod %s: %s" % (_completion_index(pod), line) for line in progress)
            results.append(result)
        return lines, load_job_merge.merge_results(results)

    def _pod_result(self, pod):
        progress, result = parse_log(self.log(pod))
        phase = pod["status"].get("phase")
        if result is not None and result.get("error"):
            error = result["error"]
            raise LoadJobError("the load Job's pod %s/%s: %s" % (self.namespace, pod["metadata"]["name"], error.get("msg")),
                               field=error.get("field") or "load_job", hint=error.get("fix"))
        if result is None or phase != "Succeeded":
            tail = "\n".join(progress[-20:]) or "(empty)"
            ended = ""
            for status in pod["status"].get("containerStatuses") or []:
                terminated = (status.get("state") or {}).get("terminated") or {}
                if terminated:  # a runtime that could not start the command says why here (StartError ...)
                    ended = " (exit code %s, %s%s)" % (terminated.get("exitCode"), terminated.get("reason"),
                                                       ": " + terminated["message"].strip() if terminated.get("message") else "")
            raise LoadJobError("the load Job's pod %s/%s ended %s%s without a result; the end of its log:\n%s" % (
                self.namespace, pod["metadata"]["name"], phase, ended, tail), field="load_job",
                hint="check that load_job.image has %s (3.8 or later)" % self.options["python"])
        return progress, result

    def delete(self):
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
        for kind, _obj in reversed(self.created):
            try:
                # a 404 is no error: it is gone (the Job's TTL, or someone else)
                self.service.delete(_resource(kind), self.name, self.namespace, propagation="Background" if kind == "Job" else None)
            except ApiException as exc:
                raise _api_error("deleting", {"kind": kind, "metadata": {"namespace": self.namespace, "name": self.name}}, exc) from exc
        self.created = []


def prepare(cluster, params, sides, prompts, request_params, name=None, scrape_only=False):
    """The Run of the ``load_job`` options, nothing created yet; ValidationError for a missing option."""
    options = params["load_job"]
    check_options(options)
    if scrape_only:
        options = dict(options, pods=1)  # a look at /metrics: one pod reads it
    elif prompts:  # (a dry run of the sweep's Job has none: its loads come later, each checked then)
        check_pods(options, params.get("concurrency") or 1, len(prompts) * params["runs_per_prompt"])
    ca_text = None
    if params.get("ca_path"):
        with open(params["ca_path"], encoding="utf-8") as handle:
            ca_text = handle.read()
    secret_env = {}
    if params.get("bearer_token"):
        secret_env[load_job_pod.TOKEN_ENV] = params["bearer_token"]
    if params.get("headers"):
        secret_env[load_job_pod.HEADERS_ENV] = json.dumps(params["headers"])
    name = name or NAME_PREFIX + uuid.uuid4().hex[:8]
    request = job_request(params, sides, prompts, request_params, ca_text, scrape_only)
    request["pods"] = int(options.get("pods") or 1)
    objects = manifests(name, options, request, secret_env, ca_text)
    return Run(cluster, options, objects)


def dry_run(cluster, params, sides, prompts, request_params):
    """Check mode: the objects go to the API server as a server-side dry run; the module's result (``load_job``:
    ``{"namespace", "name", "image", "dry_run"}``), nothing measured."""
    run = prepare(cluster, params, sides, prompts, request_params)
    run.start(dry_run=True)
    job = {"namespace": run.namespace, "name": run.name, "image": run.options["image"], "dry_run": True}
    return {"changed": False, "load_job": job,
            "msg": "check mode: the load Job %s/%s passed the API server's dry run; nothing measured" % (run.namespace, run.name)}


def measure(cluster, params, sides, prompts, request_params, progress, name=None, scrape_only=False):
    """Measure ``sides`` (``[(name, Endpoint)]``) from a Job in the cluster: ``{side: {"model", "records", "duration_s",
    "warmup", "metrics_before", "metrics_after"}}`` (``scrape_only``: ``{side: {"model", "metrics_after"}}``, no inference
    request sent). The pod's progress lines go to ``progress``."""
    run = prepare(cluster, params, sides, prompts, request_params, name=name, scrape_only=scrape_only)
    progress.line("load from the cluster: Job %s/%s, image %s" % (run.namespace, run.name, run.options["image"]))
    try:
        run.start()
        pod = run.wait()
        lines, result = run.result()
        for line in lines:
            progress.line("job: " + line)
        progress.line("load Job %s/%s pod %s %s" % (run.namespace, run.name, pod["metadata"]["name"], pod["status"]["phase"]))
        if not scrape_only:
            kept_up(result["sides"], run.expected, progress)
        return result["sides"]
    finally:
        if not run.options.get("keep"):
            run.delete()


def _completion_index(pod):
    """An Indexed Job's pod's index (its annotation, Kubernetes 1.21+); 0 for the one pod of a plain Job."""
    return int(((pod.get("metadata") or {}).get("annotations") or {}).get("batch.kubernetes.io/job-completion-index") or 0)


def client_summary(side):
    """Whether the client kept up with its schedule, by this collection's bounds (load_job_merge.client_summary with
    MAX_SEND_LAG_P99_MS and MAX_CLIENT_CPU), for a side measured by the load Job's pods or from the controller."""
    return load_job_merge.client_summary(side, MAX_SEND_LAG_P99_MS, MAX_CLIENT_CPU)


def kept_up(sides, pods, progress):
    """Whether the client kept up with its schedule, per side (load_job_merge.client_summary, kept as the side's
    ``client_summary``) and in the progress log; a ValidationError naming the figures and the fix (more pods) instead
    of measurements a decision cannot trust."""
    summaries = {}
    for name, side in sides.items():
        summaries[name] = side["client_summary"] = dict(client_summary(side), sent_from="load_job")
        progress.line(load_job_merge.describe(name, summaries[name]))
    refused = load_job_merge.refusal(summaries, pods)
    if refused is not None:
        raise refused
    return summaries
