"""A KServe controller stand-in for the loopback test bed (Standard / raw-deployment mode, and Knative mode below).

It reconciles `serving.kserve.io/v1beta1` InferenceServices the way KServe v0.20's raw-deployment path does,
so product code sees the same objects and status it would see on a real cluster:

- adds the `inferenceservice.finalizers` finalizer and removes it when the InferenceService is deleted
  (owned objects then go through the controller manager's garbage collector, as on a real cluster);
- creates/updates Deployment `<isvc>-predictor` and Service `<isvc>-predictor` (owner reference to the
  InferenceService). Labels as KServe sets them: `app: isvc.<isvc>-predictor` (selector),
  `component: predictor`, `serving.kserve.io/inferenceservice: <isvc>`, plus the InferenceService's own
  labels; the main container is `kserve-container`, built from the runtime KServe picks (a named one, or
  auto-selection: format, protocol, priority, a `workerSpec` only for a predictor with one) merged with the
  predictor.model fields as KServe's MergeRuntimeContainers does (the InferenceService's command replaces the
  runtime's, args are runtime args then the InferenceService's, env merges by name, `{{.Name}}` placeholders filled
  in): tests/testbed/kserve_runtimes.py, pinned to KServe's test vectors; or from `predictor.containers[0]`. A runtime
  KServe refuses (disabled, format or protocol it does not list, a predictor workerSpec without one in the runtime, no
  `kserve-container`) gets KServe's status (modelStatus InvalidSpec with lastFailureInfo, or PredictorReady False)
  and no Deployment. Storage: `pvc://claim/path` (storageUri or storageUris) becomes a PVC volume
  mount with subPath; other URIs get a `storage-initializer` init container and an emptyDir; `oci://` gets
  the Modelcar sidecar `modelcar` and init container `modelcar-init` (in the cluster's `native` OCI mode, and for
  `oci+native://`, an ImageVolume instead: played by an emptyDir mounted with subPath `models`, as the test bed's
  kube-apiserver predates image volumes). The OCI mode is KServe's ResolveOciModelMode of the `storageInitializer` in
  ConfigMap `kserve/inferenceservice-config` (read only for an OCI URI; none: what KServe installs, modelcar). Storage
  KServe refuses (tests/testbed/kserve_storage.py: the webhook's storageUris rules, the pod mutator's OCI checks,
  ValidateStorageURI) gets no Deployment and a Warning Event `InternalError` naming KServe's message, once per
  generation (on a real cluster the webhook refuses the write, or the controller logs that Event);
- the controller manager then makes ReplicaSets and Pods (a new spec => new ReplicaSet => new pods, a real
  rolling update), and the kubelet stand-in binds and runs them;
- status: `PredictorReady` from the Deployment's Available/Progressing/ReplicaFailure conditions with
  KServe's PropagateRawStatus rules (Progressing=True with reason NewReplicaSetAvailable => True, another
  reason => Unknown; Available=False or ReplicaFailure=True => False), `IngressReady` True (no ingress
  class here), `Ready` = both True (knative living condition set), `url`, `address.url`,
  `components.predictor.url`, `modelStatus` (Pending/Loaded, copies), `deploymentMode`, the runtime name, and
  `observedGeneration` = metadata.generation once the Deployment for that generation has been observed by
  the Deployment controller. (KServe itself copies the Deployment's observedGeneration there, which can lag
  or differ in number; tests get the value they can compare with metadata.generation.)

Canary (Standard mode, KServe v0.20 `spec.canary[]`), as kserve/kserve
pkg/controller/v1beta1/inferenceservice/canary_controller_test.go describes it: every entry `{trafficPercent,
predictor: {name, ...}}` gets its own Deployment and Service `<isvc>-predictor-<name>` (pods labelled
`app: isvc.<isvc>-predictor-<name>`, KServe's GetRawServiceLabel of the Deployment name); the stable predictor keeps
`<isvc>-predictor`, or `<isvc>-predictor-<spec.predictor.name>` when it has a name (after a promotion). Replicas split
by the percent: canary `max(1, round(total * percent / 100))` of the stable predictor's minReplicas, the stable one
`total - canary` once the canary is available (never below 1 here, so a one-replica service keeps serving; KServe's test
only shows 4 -> 3 + 1). Removing an entry deletes its Deployment and Service and gives the stable one its replicas
back; a promotion (spec.predictor.name = the canary's name, spec.canary removed) keeps the canary's Deployment
untouched (same name, same pod template: named Deployments carry no generation annotation) and deletes the old
stable one. `status.canaryStatuses[]` = `{name, ready, trafficPercent, modelStatus}` per entry, ready by the same
PropagateRawStatus rules as PredictorReady.

Knative mode (annotation `serving.kserve.io/deploymentMode: Serverless` or `Knative`), as kserve/kserve
pkg/controller/v1beta1/inferenceservice/reconcilers/knative/ksvc_reconciler.go (createKnativeService) and
pkg/apis/serving/v1beta1/inference_service_status.go (PropagateStatus) describe it, with Knative Serving's part played
here too: the Knative Service `<isvc>-predictor` gets a new Revision `<isvc>-predictor-000NN` whenever the pod template
KServe renders changes (a traffic change alone makes none); each revision runs as Deployment `<revision>-deployment`
(pods labelled `serving.knative.dev/revision=<revision>`, `serving.knative.dev/configuration`/`service`
`<isvc>-predictor`, `app=<revision>`, `component: predictor`, `serving.kserve.io/inferenceservice`). Traffic as KServe
writes it: `canaryTrafficPercent: N` with a rolled-out revision gives `[{latestRevision: true, percent: N},
{tag: prev, revisionName: <latestRolledoutRevision>, latestRevision: false, percent: 100-N}]`, otherwise
`[{latestRevision: true, percent: 100}]`; with `serving.kserve.io/enable-tag-routing: "true"` the latest target is
tagged `latest`. Knative routes `latestRevision` to the latest ready revision. Pods run for the latest created
revision and for every revision the traffic names (also at 0%); the others scale to zero (their pods go, the
Deployment stays at 0 replicas). Status: `components.predictor` `latestCreatedRevision`, `latestReadyRevision`,
`latestRolledoutRevision`, `previousRolledoutRevision` (PropagateStatus: a latest ready revision at 100% becomes the
rolled-out one, the one before becomes the previous), `traffic` (resolved revision names, `url` for tagged targets),
`PredictorReady`/`Ready` from the latest created revision's Deployment (Knative's ConfigurationsReady: a canary
revision that is not ready leaves Ready Unknown/False while the previous one keeps serving). No Knative Service,
Route or Revision objects are created (the stand-in cluster has no Knative CRDs).

Test controls (never visible to product code):
    standin.set_behaviour(namespace, name, ready_after=2.0, logs={"kserve-container": "text"})
    standin.set_behaviour(namespace, name, never_ready=True)
    standin.set_behaviour(namespace, name, crash_loop=True, previous_logs={...})
    standin.set_behaviour(namespace, name, pod_ip=host_ipv4(), http={port: {"/metrics": [page1, page2]}})
`deployment="<isvc>-predictor-spec"` limits a behaviour to the pods of that Deployment (one revision); in Knative mode
`revision="<isvc>-predictor-00002"` does that for one revision.
`generation=N` limits a behaviour to pods of that InferenceService generation (pods carry the annotation
`testbed.alauda.io/isvc-generation`). `strict_runtimes=True` reports a missing runtime the way KServe does
(modelStatus InvalidSpec / RuntimeNotRecognized "Waiting for runtime to become available", or NoSupportingRuntime
when none auto-selects; no Deployment); by default a missing runtime is treated as a generic vLLM runtime so
manifests that name a runtime of the real cluster work unchanged.
"""
from __future__ import annotations

import copy
import datetime
import hashlib
import json
import threading
import time
import urllib.parse

from . import kserve_model_status, kserve_runtimes, kserve_storage
from .kubelet import PodBehaviour
from .wake import EVERYTHING, RESYNC_SECONDS, WatchWaker, WorkQueue, owner_key

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
FINALIZER = "inferenceservice.finalizers"
GEN_ANNOTATION = "testbed.alauda.io/isvc-generation"
REVISION_LABEL = "serving.knative.dev/revision"
CONFIGURATION_LABEL = "serving.knative.dev/configuration"
SERVICE_LABEL = "serving.knative.dev/service"
TEMPLATE_ANNOTATION = "testbed.alauda.io/revision-template"
TAG_ROUTING_ANNOTATION = "serving.kserve.io/enable-tag-routing"
HASH_ANNOTATION = "testbed.alauda.io/spec-hash"
DEFAULT_RUNTIME_IMAGE = "registry.invalid/kserve/vllm-standin:latest"
STORAGE_INITIALIZER_IMAGE = "kserve/storage-initializer:v0.20.0"
INGRESS_DOMAIN = "example.com"
COMPONENT_FIELDS = {"model", "containers", "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric",
                    "scaleMetricType", "containerConcurrency", "timeout", "canaryTrafficPercent", "logger",
                    "batcher", "labels", "annotations", "deploymentStrategy", "autoScaling", "storageUri",
                    "storageUris", "storage", "workerSpec", "sklearn", "xgboost", "tensorflow", "pytorch",
                    "triton", "onnx", "huggingface", "pmml", "lightgbm", "paddle", "initContainers", "volumes"}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _normalise_mode(value: str | None) -> str:
    return {"RawDeployment": "Standard", "Serverless": "Knative"}.get(value or "Standard", value or "Standard")


def apply_or_create(api, base_path: str, desired: dict, same, spec_keys=None) -> dict:
    """A controller's write of one object it owns: read ``<base_path>/<name>``, create it on 404, return the live object
    when ``same(live, desired)`` says nothing changed, else replace it (PUT) with ``desired``'s labels and annotations and
    its ``spec`` (only the ``spec_keys`` that ``desired`` sets, when given: the rest of the live spec, with the API
    server's defaults, stays). ``same`` may adjust ``desired`` first (e.g. keep a pod-template annotation)."""
    from .rest import ApiError  # pylint: disable=import-outside-toplevel
    meta = desired["metadata"]
    try:
        live = api.get(f"{base_path}/{meta['name']}")
    except ApiError as exc:
        if exc.status != 404:
            raise
        return api.post(base_path, desired)
    if same(live, desired):
        return live
    live["metadata"]["labels"] = meta["labels"]
    live["metadata"]["annotations"] = meta["annotations"]
    if spec_keys is None:
        live["spec"] = desired["spec"]
    else:
        live["spec"].update({k: desired["spec"][k] for k in spec_keys if k in desired["spec"]})
    return api.put(f"{base_path}/{meta['name']}", live)


def same_spec_hash(live: dict, desired: dict) -> bool:
    """The ``same`` of apply_or_create for objects the stand-ins label with the hash of what they render."""
    return (live["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) == desired["metadata"]["annotations"][HASH_ANNOTATION]


class ControllerLoop:
    """A controller stand-in's reconcile thread, driven like a real controller (tests/testbed/wake.py): watches on its
    resources, on the Deployments it owns and on what its reconcile reads put the keys of the objects to reconcile into
    a work queue (``event_keys`` maps an event to them), and the loop GETs and reconciles only those. A full pass (list
    and reconcile every object) runs at start, when a watch lists again, on ``wake()`` and every ``idle_interval``
    seconds (the resync for what no watch reports). Subclasses set the class attributes, ``event_keys(event)`` and
    ``reconcile(api, obj)``; ``self.cp``, ``idle_interval``, ``errors`` are theirs."""

    LIST_PATH = ""
    DEPLOYMENT_SELECTOR = ""
    NAME = "controller stand-in"
    FINALIZER_NAME = ""
    RETRY_SECONDS = 1.0  # a reconcile that failed (not a 404/409) is tried again after this, as a rate-limited requeue

    def _init_loop(self, controlplane, idle_interval):
        self.cp = controlplane
        self.idle_interval = idle_interval
        self._stop = threading.Event()
        self._queue = WorkQueue()
        self._queue.add(EVERYTHING)  # the first pass lists everything
        self._thread = None
        self.errors = []
        self.reconciles = 0

    def _finalized(self, api, obj: dict, path: str) -> bool:
        """KServe's finalizer handling: added on a new object, removed once it is being deleted. True when that
        was all this pass had to do (the caller returns; the next event brings the object back)."""
        meta = obj["metadata"]
        finalizers = meta.get("finalizers") or []
        if meta.get("deletionTimestamp"):
            if self.FINALIZER_NAME in finalizers:
                api.patch(path, {"metadata": {"finalizers": [f for f in finalizers if f != self.FINALIZER_NAME],
                                              "resourceVersion": meta["resourceVersion"]}})
            return True
        if self.FINALIZER_NAME not in finalizers:
            api.patch(path, {"metadata": {"finalizers": finalizers + [self.FINALIZER_NAME], "resourceVersion": meta["resourceVersion"]}})
            return True
        return False

    def start(self):
        self._thread = threading.Thread(target=self._loop, name=self.NAME.replace(" ", "-"), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._queue.close()
        if self._thread:
            self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def wake(self) -> None:
        """Run a full pass now (a behaviour set in this process changes nothing the API server could report)."""
        self._queue.add(EVERYTHING)

    def watched_paths(self) -> list:
        """What wakes the loop: its resources and the Deployments it owns; subclasses add what their reconcile reads."""
        return [self.LIST_PATH, "/apis/apps/v1/deployments?labelSelector=" + urllib.parse.quote(self.DEPLOYMENT_SELECTOR)]

    @staticmethod
    def event_keys(event: dict) -> list:
        """The keys (namespace, name) a watch event of watched_paths() makes dirty; (namespace, None): every object of
        that namespace, EVERYTHING: all of them."""
        raise NotImplementedError

    def _on_event(self, event: dict) -> None:
        for key in self.event_keys(event):
            self._queue.add(key)

    def _namespaced(self, ns: str) -> str:
        """LIST_PATH for one namespace: /apis/<group>/<version>/namespaces/<ns>/<plural>."""
        prefix, _sep, plural = self.LIST_PATH.rpartition("/")
        return f"{prefix}/namespaces/{ns}/{plural}"

    def _objects(self, api, keys) -> list:
        """The live objects of the keys taken from the queue: one LIST for EVERYTHING or a namespace, else a GET each
        (404: deleted since, nothing to do)."""
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        if EVERYTHING in keys:
            return api.get(self.LIST_PATH)["items"]
        namespaces = sorted({ns for ns, name in keys if name is None})
        objs = [obj for ns in namespaces for obj in api.get(self._namespaced(ns))["items"]]
        for ns, name in sorted(k for k in keys if k[1] is not None and k[0] not in namespaces):
            try:
                objs.append(api.get(f"{self._namespaced(ns)}/{name}"))
            except ApiError as exc:
                if exc.status != 404:
                    raise
        return objs

    def _loop(self) -> None:
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        api = self.cp.rest()
        waker = WatchWaker(self.cp, self.watched_paths(), self._on_event, self.wake, self._stop,
                           name=self.NAME.replace(" ", "-")).start()
        waker.wait_started(10)  # one first full pass after every watch is open, not one per watch
        last_full = time.monotonic()
        try:
            while not self._stop.is_set():
                # Woken by the keys watch events name (or wake()); the resync interval covers what no watch reports.
                keys = self._queue.take(last_full + self.idle_interval)
                if keys is None:
                    break
                if EVERYTHING in keys:
                    last_full = time.monotonic()
                try:
                    objs = self._objects(api, keys)
                except Exception as exc:  # pylint: disable=broad-except
                    if not self._stop.is_set():
                        self.errors.append(f"{self.NAME} loop: {exc!r}")
                        for key in keys:
                            self._queue.add_after(key, time.monotonic() + self.RETRY_SECONDS)
                    continue
                for obj in objs:
                    meta = obj["metadata"]
                    try:
                        self.reconcile(api, obj)
                    except ApiError as exc:
                        if exc.status not in (404, 409):
                            self.errors.append(f"reconcile {meta['namespace']}/{meta['name']}: {exc}")
                            self._queue.add_after((meta["namespace"], meta["name"]), time.monotonic() + self.RETRY_SECONDS)
                    except Exception as exc:  # pylint: disable=broad-except
                        if not self._stop.is_set():
                            self.errors.append(f"{self.NAME} loop: {exc!r}")
                            self._queue.add_after((meta["namespace"], meta["name"]), time.monotonic() + self.RETRY_SECONDS)
        finally:
            self._stop.set()
            waker.stop()
            api.close()


def isvc_event_keys(event: dict) -> list:
    """What a watch event makes the KServe stand-in reconcile (KServe's controller watches and Owns the same): an
    InferenceService itself; for a Deployment, Service or Pod, the InferenceService that owns it (ownerReference or the
    `serving.kserve.io/inferenceservice` label); for a ServingRuntime, every InferenceService of its namespace; for a
    ClusterServingRuntime, every InferenceService (a predictor names or auto-selects its runtime)."""
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    kind = obj.get("kind")
    if kind == "InferenceService":
        return [(meta.get("namespace"), meta.get("name"))]
    if kind == "ServingRuntime":
        return [(meta.get("namespace"), None)]
    if kind == "ClusterServingRuntime":
        return [EVERYTHING]
    if kind == "Pod" and not model_load_failed(obj):
        return []  # a pod's other changes reach the status through its Deployment's
    key = owner_key(obj, "InferenceService", "serving.kserve.io/inferenceservice")
    return [key] if key else []


def model_load_failed(pod: dict) -> bool:
    """A predictor pod whose storage-initializer or kserve-container KServe counts as failed to load (terminated with
    Error, or in CrashLoopBackOff): the one pod change that reaches status.modelStatus without changing the Deployment."""
    status = pod.get("status") or {}
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        if cs.get("name") in (kserve_model_status.KSERVE_CONTAINER, kserve_model_status.STORAGE_INITIALIZER):
            state = cs.get("state") or {}
            if (state.get("terminated") or {}).get("reason") == "Error" or \
                    (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff":
                return True
    return False


class KServeStandIn(ControllerLoop):
    """Reconciles InferenceServices in a background thread. start()/stop() or a context manager."""

    LIST_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
    DEPLOYMENT_SELECTOR = "component=predictor"
    NAME = "kserve stand-in"
    FINALIZER_NAME = FINALIZER
    event_keys = staticmethod(isvc_event_keys)

    def __init__(self, controlplane, kubelet=None, strict_runtimes: bool = False,
                 progress_deadline_seconds: int | None = None, idle_interval: float = RESYNC_SECONDS):
        self._init_loop(controlplane, idle_interval)
        self.kubelet = kubelet
        self.strict_runtimes = strict_runtimes
        self.progress_deadline_seconds = progress_deadline_seconds
        self._oci_mode = "modelcar"  # of the pass running now (one loop thread)
        self._refused = {}  # uid -> generation whose storage refusal was reported

    def watched_paths(self) -> list:
        # The runtime a predictor resolves to is read on every pass: a new or edited runtime wakes the loop too.
        # Predictor pods too, for modelStatus (KServe's FailedToLoad): isvc_event_keys passes on only a pod that failed to
        # load, so a crash reaches the status at once, not at the next resync, and other pod updates cost no pass.
        return super().watched_paths() + [f"/apis/{GROUP}/v1alpha1/servingruntimes", f"/apis/{GROUP}/v1alpha1/clusterservingruntimes",
                                          "/api/v1/pods?labelSelector=" + urllib.parse.quote(self.DEPLOYMENT_SELECTOR)]

    # ---------------------------------------------------------------------------------------------
    # test controls

    def set_behaviour(self, namespace: str, name: str, ready_after: float | None = 0.0, never_ready: bool = False,
                      logs: dict | None = None, log_text: str | None = None, previous_logs: dict | None = None,
                      crash_loop: bool = False, generation: int | None = None, pod_ip: str = "127.0.0.1",
                      http: dict | None = None, https: bool = False, deployment: str | None = None,
                      revision: str | None = None) -> None:
        """How predictor pods of namespace/name behave (delegated to the kubelet stand-in).

        `http={port: {path: [responses]}}` with `pod_ip=host_ipv4()` serves real HTTP on the pods (reachable through
        the API server's pod proxy), see `PodBehaviour`."""
        if self.kubelet is None:
            raise RuntimeError("set_behaviour needs the kubelet stand-in (KServeStandIn(cp, kubelet=...))")
        logs = dict(logs or {})
        if log_text is not None:
            logs["kserve-container"] = log_text
        behaviour = PodBehaviour(ready_after=None if never_ready else ready_after, logs=logs,
                                 previous_logs=dict(previous_logs or {}), crash_loop=crash_loop, pod_ip=pod_ip,
                                 http=dict(http or {}), https=https)

        def match(pod):
            meta = pod["metadata"]
            if meta["namespace"] != namespace or \
                    (meta.get("labels") or {}).get("serving.kserve.io/inferenceservice") != name:
                return False
            if deployment is not None and (meta.get("labels") or {}).get("app") != f"isvc.{deployment}":
                return False
            if revision is not None and (meta.get("labels") or {}).get(REVISION_LABEL) != revision:
                return False
            return generation is None or (meta.get("annotations") or {}).get(GEN_ANNOTATION) == str(generation)
        self.kubelet.set_behaviour(match, behaviour)

    # ---------------------------------------------------------------------------------------------
    # reconcile

    def reconcile(self, api, isvc: dict) -> None:
        meta = isvc["metadata"]
        ns, name = meta["namespace"], meta["name"]
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}/{name}"
        if self._finalized(api, isvc, path):
            return  # the patch's watch event brings the object back
        self.reconciles += 1
        predictor = (isvc.get("spec") or {}).get("predictor") or {}
        predictors = [predictor] + [(c or {}).get("predictor") or {} for c in (isvc.get("spec") or {}).get("canary") or []]
        oci = any(kserve_storage.parse_oci_scheme(e["uri"])[2] for p in predictors for e in storage_entries(p))
        config = self.storage_initializer(api) if oci else {}
        problem = self._storage_problem(isvc, config)
        if problem:
            self._refuse_storage(api, isvc, problem)
            return
        self._oci_mode = kserve_storage.oci_model_mode(config)
        status = copy.deepcopy(isvc.get("status") or {})
        status["deploymentMode"] = _normalise_mode((meta.get("annotations") or {}).get(
            "serving.kserve.io/deploymentMode"))
        try:
            runtime, runtime_kind = self._resolve_runtime(api, predictor, ns)
            self._container(predictor, runtime, meta)  # a runtime KServe cannot build the container from stops here too
        except kserve_runtimes.Refusal as refusal:
            self._write_status(api, isvc, self._refused_status(status, refusal, meta.get("generation")))
            return
        if runtime_kind:
            status.pop("servingRuntimeName", None)
            status.pop("clusterServingRuntimeName", None)
            status["servingRuntimeName" if runtime_kind == "ServingRuntime" else "clusterServingRuntimeName"] = \
                runtime["metadata"]["name"]
        if status["deploymentMode"] == "Knative":
            self._reconcile_knative(api, isvc, predictor, runtime, status)
            return
        stable_name = _deployment_name(name, predictor.get("name"))
        deployment = self._desired_deployment(isvc, predictor, runtime, stable_name)
        canaries = []
        for entry in (isvc.get("spec") or {}).get("canary") or []:
            cpred = entry.get("predictor") or {}
            try:
                crt, _kind = self._resolve_runtime(api, cpred, ns)
            except kserve_runtimes.Refusal:
                crt = runtime
            cname = _deployment_name(name, cpred.get("name") or "canary")
            canaries.append((entry, self._desired_deployment(isvc, cpred, crt, cname)))
        total = deployment["spec"]["replicas"]
        live_canaries = []
        for entry, desired in canaries:
            percent = int(entry.get("trafficPercent") or 0)
            desired["spec"]["replicas"] = max(1, int(round(total * percent / 100.0)))
            _rehash(desired)
            live_canaries.append((entry, self._apply_deployment(api, desired)))
            self._apply_service(api, isvc, desired["metadata"]["name"])
        available = sum(min(int((c.get("status") or {}).get("availableReplicas") or 0), c["spec"]["replicas"]) for _e, c in live_canaries)
        if available:
            deployment["spec"]["replicas"] = max(1, total - available)
            _rehash(deployment)
        live = self._apply_deployment(api, deployment)
        self._apply_service(api, isvc, stable_name)
        self._delete_stale(api, isvc, {stable_name} | {c["metadata"]["name"] for _e, c in live_canaries})
        status = self._status(isvc, status, live, live_canaries, api=api)
        self._write_status(api, isvc, status)

    # -- Knative mode -----------------------------------------------------------------------------

    def _reconcile_knative(self, api, isvc: dict, predictor: dict, runtime: dict, status: dict) -> None:
        """One pass of KServe's Knative path plus Knative Serving's: revision per pod-template change, traffic from
        canaryTrafficPercent, pods for the revisions the traffic names, and PropagateStatus."""
        meta = isvc["metadata"]
        name, ns = meta["name"], meta["namespace"]
        ksvc = f"{name}-predictor"
        base = f"/apis/apps/v1/namespaces/{ns}/deployments"
        template, digest = self._revision_template(isvc, predictor, runtime, ksvc)
        revisions = self._revisions(api, ns, name, ksvc)
        latest = revisions[-1] if revisions else None
        if latest is None or (latest["metadata"].get("annotations") or {}).get(TEMPLATE_ANNOTATION) != digest:
            number = _revision_number(latest["metadata"]["labels"][REVISION_LABEL]) + 1 if latest else 1
            latest = api.post(base, self._revision_deployment(isvc, ksvc, "%s-%05d" % (ksvc, number), template, digest, predictor))
            revisions.append(latest)
        by_name = {d["metadata"]["labels"][REVISION_LABEL]: d for d in revisions}
        created = latest["metadata"]["labels"][REVISION_LABEL]
        old = dict((status.get("components") or {}).get("predictor") or {})
        ready_now = [r for r, d in by_name.items() if _revision_ready(d)]
        if old.get("latestReadyRevision") in by_name:
            ready_now.append(old["latestReadyRevision"])
        latest_ready = max(ready_now, key=_revision_number) if ready_now else None
        # KServe createKnativeService: the route's traffic targets, from the status KServe read before this pass.
        canary_pct = predictor.get("canaryTrafficPercent")
        last = old.get("latestRolledoutRevision")
        targets = [{"latestRevision": True, "percent": int(canary_pct) if canary_pct is not None and last else 100}]
        if (meta.get("annotations") or {}).get(TAG_ROUTING_ANNOTATION) == "true":
            targets[0]["tag"] = "latest"
        if canary_pct is not None and last and int(canary_pct) < 100:
            targets.append({"tag": "prev", "revisionName": last, "latestRevision": False, "percent": 100 - int(canary_pct)})
        # Knative's route: latestRevision resolves to the latest ready revision; tagged targets get their own URL.
        traffic = []
        if latest_ready is not None:
            for target in targets:
                entry = dict(target, revisionName=target.get("revisionName") or latest_ready)
                if entry.get("tag"):
                    entry["url"] = f"http://{entry['tag']}-{ksvc}-{ns}.{INGRESS_DOMAIN}"
                traffic.append(entry)
        routed = {t["revisionName"] for t in traffic} | {created}
        replicas = max(1, int(predictor.get("minReplicas") or 1))
        for rev, dep in by_name.items():
            want = replicas if rev in routed else 0
            if dep["spec"].get("replicas") != want:
                by_name[rev] = api.patch(f"{base}/{dep['metadata']['name']}", {"spec": {"replicas": want}})
        status.pop("canaryStatuses", None)
        self._write_status(api, isvc, self._knative_status(isvc, status, old, by_name, created, latest_ready, traffic))

    def _revision_template(self, isvc: dict, predictor: dict, runtime: dict, ksvc: str):
        """(pod template, digest) KServe renders into the Knative Service for this predictor."""
        desired = self._desired_deployment(isvc, predictor, runtime, ksvc)
        tpl = copy.deepcopy(desired["spec"]["template"])
        (tpl["metadata"].get("annotations") or {}).pop(GEN_ANNOTATION, None)
        tpl["metadata"]["labels"].pop("app", None)
        digest = hashlib.sha256(json.dumps(tpl, sort_keys=True).encode()).hexdigest()[:16]
        return tpl, digest

    def _revisions(self, api, ns: str, name: str, ksvc: str) -> list:
        items = api.get(f"/apis/apps/v1/namespaces/{ns}/deployments",
                        labelSelector=f"serving.kserve.io/inferenceservice={name},{CONFIGURATION_LABEL}={ksvc}")["items"]
        items = [d for d in items if not d["metadata"].get("deletionTimestamp")]
        return sorted(items, key=lambda d: _revision_number(d["metadata"]["labels"][REVISION_LABEL]))

    def _revision_deployment(self, isvc: dict, ksvc: str, rev: str, template: dict, digest: str, predictor: dict) -> dict:
        meta = isvc["metadata"]
        tpl = copy.deepcopy(template)
        tpl["metadata"]["labels"].update({REVISION_LABEL: rev, CONFIGURATION_LABEL: ksvc, SERVICE_LABEL: ksvc, "app": rev})
        tpl["metadata"].setdefault("annotations", {})[GEN_ANNOTATION] = str(meta.get("generation"))
        labels = dict(self._labels(isvc), app=rev)
        labels.update({REVISION_LABEL: rev, CONFIGURATION_LABEL: ksvc, SERVICE_LABEL: ksvc})
        spec = {"replicas": max(1, int(predictor.get("minReplicas") or 1)), "selector": {"matchLabels": {REVISION_LABEL: rev}},
                "template": tpl}
        if self.progress_deadline_seconds:
            spec["progressDeadlineSeconds"] = self.progress_deadline_seconds
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": f"{rev}-deployment", "namespace": meta["namespace"], "labels": labels,
                             "annotations": {TEMPLATE_ANNOTATION: digest}, "ownerReferences": self._owner(isvc)},
                "spec": spec}

    def _knative_status(self, isvc: dict, status: dict, old: dict, by_name: dict, created: str, latest_ready, traffic) -> dict:
        meta = isvc["metadata"]
        name, ns = meta["name"], meta["namespace"]
        component = {k: v for k, v in old.items() if k in ("latestRolledoutRevision", "previousRolledoutRevision")}
        # KServe PropagateStatus: the latest ready revision at 100% through latestRevision is the rolled-out one.
        for entry in traffic:
            if entry["revisionName"] == latest_ready and entry.get("latestRevision") and \
                    component.get("latestRolledoutRevision") != latest_ready and entry.get("percent") == 100:
                if component.get("latestRolledoutRevision"):
                    component["previousRolledoutRevision"] = component["latestRolledoutRevision"]
                component["latestRolledoutRevision"] = latest_ready
        component["latestCreatedRevision"] = created
        if latest_ready:
            component["latestReadyRevision"] = latest_ready
        component["traffic"] = traffic
        pred, observed = self._propagate(by_name[created])
        if pred["status"] == "True" and not traffic:
            pred = {"type": "PredictorReady", "status": "Unknown", "reason": "RoutesNotReady"}
        if pred["status"] == "True":
            component["url"] = f"http://{name}-predictor-{ns}.{INGRESS_DOMAIN}"
            component["address"] = {"url": f"http://{name}-predictor.{ns}.svc.cluster.local"}
        status["components"] = dict(status.get("components") or {}, predictor=component)
        ingress = {"type": "IngressReady", "status": "True"}
        ready = {"type": "Ready", "status": "True"} if pred["status"] == "True" else \
            dict({k: v for k, v in pred.items() if k != "type" and v}, type="Ready")
        status["conditions"] = _merge_conditions(status.get("conditions"), [ingress, pred, ready])
        status["url"] = f"http://{name}-{ns}.{INGRESS_DOMAIN}"
        status["address"] = {"url": f"http://{name}-predictor.{ns}.svc.cluster.local"}
        copies = int((by_name[created].get("status") or {}).get("readyReplicas") or 0)
        loaded = ready["status"] == "True" and created == latest_ready
        prev_active = ((status.get("modelStatus") or {}).get("states") or {}).get("activeModelState") or "Pending"
        status["modelStatus"] = {"transitionStatus": "UpToDate" if loaded else "InProgress",
                                 "states": {"activeModelState": "Loaded" if loaded else prev_active,
                                            "targetModelState": "Loaded" if loaded else "Pending"},
                                 "copies": {"failedCopies": 0, "totalCopies": copies}}
        if observed:
            status["observedGeneration"] = meta.get("generation")
        return status

    def _resolve_runtime(self, api, predictor: dict, ns: str):
        """(runtime, kind) of the predictor (kserve_runtimes.choose_runtime on the runtimes listed now); a custom
        predictor gets (an empty runtime, None). Without strict_runtimes a runtime that is missing (named, or none to
        auto-select) is a generic vLLM one (kind None), so manifests naming a runtime of a real cluster run here;
        every other refusal (disabled, format, protocol, workerSpec) is KServe's, a kserve_runtimes.Refusal."""
        model = predictor.get("model")
        if model is None:
            return {"spec": {"containers": []}, "metadata": {"name": ""}}, None
        namespaced = api.get(f"/apis/{GROUP}/v1alpha1/namespaces/{ns}/servingruntimes")["items"]
        cluster = api.get(f"/apis/{GROUP}/v1alpha1/clusterservingruntimes")["items"]
        try:
            return kserve_runtimes.choose_runtime(predictor, namespaced, cluster)
        except kserve_runtimes.Refusal as refusal:
            missing = refusal.reason == "RuntimeNotRecognized" or refusal.message.startswith("No runtime found")
            if self.strict_runtimes or not missing:
                raise
        generic = {"metadata": {"name": model.get("runtime") or "kserve-vllm-standin"},
                   "spec": {"containers": [{"name": "kserve-container", "image": DEFAULT_RUNTIME_IMAGE,
                                            "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]}}
        return generic, None

    @staticmethod
    def _refused_status(status: dict, refusal, generation) -> dict:
        """The status KServe writes when reconcileModel / buildPodSpec refuses the predictor: modelStatus InvalidSpec,
        target FailedToLoad, lastFailureInfo {reason, message} (UpdateModelTransitionStatus) with the conditions still
        Unknown; for a workerSpec without one in the runtime, PredictorReady False with the reason instead."""
        now = _now()
        if refusal.condition:
            failed = {"status": "False", "reason": refusal.reason, "message": refusal.message, "lastTransitionTime": now}
            conditions = [{"type": "IngressReady", "status": "Unknown", "lastTransitionTime": now},
                          dict(failed, type="PredictorReady"), dict(failed, type="Ready")]
        else:
            conditions = [{"type": kind, "status": "Unknown", "lastTransitionTime": now}
                          for kind in ("IngressReady", "PredictorReady", "Ready")]
            # KServe leaves activeModelState "" on a new object; the 1.20 API server refuses "" there (as null), so it
            # is left out and the CRD's default (Pending) fills it in.
            states = dict((status.get("modelStatus") or {}).get("states") or {}, targetModelState="FailedToLoad")
            if not states.get("activeModelState"):
                states.pop("activeModelState", None)
            status["modelStatus"] = dict(status.get("modelStatus") or {}, transitionStatus="InvalidSpec", states=states,
                                         lastFailureInfo={"reason": refusal.reason, "message": refusal.message})
        status["conditions"] = _merge_conditions(status.get("conditions"), conditions)
        status["observedGeneration"] = generation
        return status

    # -- objects ----------------------------------------------------------------------------------

    def _labels(self, isvc: dict) -> dict:
        name = isvc["metadata"]["name"]
        labels = dict(isvc["metadata"].get("labels") or {})
        labels.update({"app": f"isvc.{name}-predictor", "component": "predictor",
                       "serving.kserve.io/inferenceservice": name})
        return labels

    def _owner(self, isvc: dict) -> list:
        return [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "name": isvc["metadata"]["name"],
                 "uid": isvc["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]

    @staticmethod
    def _container(predictor: dict, runtime: dict, meta: dict | None = None) -> dict:
        """The predictor's `kserve-container`: `predictor.containers[0]` for a custom predictor, else the runtime's
        merged with `predictor.model` as KServe v0.20 does it (kserve_runtimes.runtime_container, written apart from
        the collection's plugins/module_utils/kserve/isvc/runtime.py)."""
        if predictor.get("model") is None and predictor.get("containers"):
            container = copy.deepcopy(predictor["containers"][0])
            container["name"] = "kserve-container"
            return container
        container = kserve_runtimes.runtime_container(predictor, runtime, meta)
        container.setdefault("image", DEFAULT_RUNTIME_IMAGE)
        return container

    def _desired_deployment(self, isvc: dict, predictor: dict, runtime: dict, dep_name: str | None = None) -> dict:
        meta = isvc["metadata"]
        name = meta["name"]
        dep_name = dep_name or f"{name}-predictor"
        labels = self._labels(isvc)
        labels["app"] = f"isvc.{dep_name}"
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                       if k != "kubectl.kubernetes.io/last-applied-configuration"}
        container = self._container(predictor, runtime, meta)
        pod_spec = {k: copy.deepcopy(v) for k, v in predictor.items() if k not in COMPONENT_FIELDS}
        pod_spec["containers"] = [container] + [copy.deepcopy(c) for c in (predictor.get("containers") or [])[1:]]
        if predictor.get("initContainers"):
            pod_spec["initContainers"] = copy.deepcopy(predictor["initContainers"])
        if predictor.get("volumes"):
            pod_spec["volumes"] = copy.deepcopy(predictor["volumes"])
        if predictor.get("model") is not None:
            # buildPodSpec: the runtime's pod fields (its volumes for its mounts ...) under the predictor's, then the
            # runtime's other containers and the predictor's own after the merged kserve-container
            pod_spec = kserve_runtimes.merge_pod_spec(runtime, pod_spec)
            pod_spec["containers"] = [container] + kserve_runtimes.sidecars(runtime, predictor)
        self._add_storage(pod_spec, container, storage_entries(predictor), self._oci_mode)
        template_annotations = dict(annotations)
        if dep_name == f"{name}-predictor":
            # Named (canary / promoted) Deployments keep their pod template across generations, as KServe's do.
            template_annotations[GEN_ANNOTATION] = str(meta.get("generation"))
        replicas = max(1, int(predictor.get("minReplicas") or 1))
        spec = {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": f"isvc.{dep_name}"}},
            "template": {"metadata": {"labels": labels, "annotations": template_annotations}, "spec": pod_spec},
        }
        if self.progress_deadline_seconds:
            spec["progressDeadlineSeconds"] = self.progress_deadline_seconds
        digest = hashlib.sha256(json.dumps({"spec": spec, "labels": labels}, sort_keys=True).encode()).hexdigest()
        dep_annotations = dict(annotations)
        dep_annotations[HASH_ANNOTATION] = digest[:16]
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": dep_name, "namespace": meta["namespace"], "labels": labels,
                             "annotations": dep_annotations, "ownerReferences": self._owner(isvc)},
                "spec": spec}

    # -- storage ------------------------------------------------------------------------------------

    @staticmethod
    def storage_initializer(api) -> dict:
        """The storageInitializer settings of ConfigMap kserve/inferenceservice-config; what KServe installs when absent."""
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        try:
            config_map = api.get("/api/v1/namespaces/kserve/configmaps/inferenceservice-config")
        except ApiError as exc:
            if exc.status != 404:
                raise
            return dict(kserve_storage.INSTALLED_STORAGE_INITIALIZER)
        return json.loads((config_map.get("data") or {}).get("storageInitializer") or "{}")

    @staticmethod
    def _storage_problem(isvc: dict, storage_initializer: dict) -> str | None:
        """KServe's refusal of the predictor's storage: the webhook (storageUri with storageUris, the storageUris rules), the
        pod mutator's OCI checks, then the predictor reconcile's ValidateStorageURI."""
        predictor = (isvc.get("spec") or {}).get("predictor") or {}
        single = (predictor.get("model") or {}).get("storageUri") or predictor.get("storageUri")
        listed = predictor.get("storageUris")
        problem = kserve_storage.storage_uris_error(listed, storage_initializer, single if listed is not None else None)
        if problem:
            return problem
        if single is not None:
            problem = kserve_storage.storage_uri_error(single)
            return "StorageURI not supported: " + problem if problem else None
        return None

    def _refuse_storage(self, api, isvc: dict, problem: str) -> None:
        meta = isvc["metadata"]
        if self._refused.get(meta["uid"]) == meta.get("generation"):
            return
        self._refused[meta["uid"]] = meta.get("generation")
        now = _now()
        api.post(f"/api/v1/namespaces/{meta['namespace']}/events", {
            "metadata": {"generateName": meta["name"] + "."},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": "InternalError", "message": problem, "type": "Warning", "count": 1,
            "firstTimestamp": now, "lastTimestamp": now, "source": {"component": "kserve-stand-in"}})

    @staticmethod
    def _add_storage(pod_spec: dict, container: dict, uris: list, oci_mode: str = "modelcar") -> None:
        volumes = pod_spec.setdefault("volumes", [])
        mounts = container.setdefault("volumeMounts", [])
        init = pod_spec.setdefault("initContainers", [])
        for i, entry in enumerate(uris):
            uri, mount = entry["uri"], entry["mountPath"]
            explicit, normalised, is_oci = kserve_storage.parse_oci_scheme(uri)
            mode = (explicit or oci_mode) if is_oci else None
            if mode == "native":
                # ConfigureOciNativeToContainer: an ImageVolume named after the path, mounted read-only with subPath models
                name = mount.strip("/").replace("/", "-") or "oci-model"
                volumes.append({"name": name, "emptyDir": {}})
                mounts.append({"name": name, "mountPath": mount, "subPath": "models", "readOnly": True})
                continue
            if is_oci and not mode and not entry.get("single"):
                continue  # a storageUris entry while OCI is off: KServe's injector skips it
            if mode:
                uri = normalised
            if uri.startswith("pvc://"):
                claim, _sep, sub = uri[len("pvc://"):].partition("/")
                vol = f"kserve-pvc-source-{i}" if i else "kserve-pvc-source"
                volumes.append({"name": vol, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
                m = {"name": vol, "mountPath": mount, "readOnly": True}
                if sub:
                    m["subPath"] = sub
                mounts.append(m)
            elif mode:
                image = uri[len("oci://"):]
                pod_spec["shareProcessNamespace"] = True
                pod_spec["containers"].append({
                    "name": "modelcar" if i == 0 else f"modelcar-{i}", "image": image,
                    "args": kserve_storage.modelcar_args(mount),
                    "volumeMounts": [{"name": "kserve-provision-location", "mountPath": mount.rsplit("/", 1)[0] or "/"}],
                })
                init.append({"name": "modelcar-init" if i == 0 else f"modelcar-init-{i}", "image": image,
                             "args": kserve_storage.modelcar_init_args(image)})
                if not any(v["name"] == "kserve-provision-location" for v in volumes):
                    volumes.append({"name": "kserve-provision-location", "emptyDir": {}})
                    mounts.append({"name": "kserve-provision-location", "mountPath": mount.rsplit("/", 1)[0] or "/",
                                   "readOnly": True})
            else:
                if not any(v["name"] == "kserve-provision-location" for v in volumes):
                    volumes.append({"name": "kserve-provision-location", "emptyDir": {}})
                    mounts.append({"name": "kserve-provision-location", "mountPath": "/mnt/models",
                                   "readOnly": True})
                init.append({"name": "storage-initializer" if i == 0 else f"storage-initializer-{i}",
                             "image": STORAGE_INITIALIZER_IMAGE, "args": [uri, mount],
                             "volumeMounts": [{"name": "kserve-provision-location", "mountPath": "/mnt/models"}]})
        if not volumes:
            pod_spec.pop("volumes")
        if not mounts:
            container.pop("volumeMounts")
        if not init:
            pod_spec.pop("initContainers")

    @staticmethod
    def _same_pods(live: dict, desired: dict) -> bool:
        """A spec change that leaves this predictor's pod template as it was (a canary added, removed or re-weighted) does
        not roll its pods: keep the generation annotation of the pods that run (KServe's Deployment stays untouched too)."""
        live_tpl = copy.deepcopy(live["spec"]["template"])
        want_tpl = copy.deepcopy(desired["spec"]["template"])
        live_gen = (live_tpl["metadata"].get("annotations") or {}).pop(GEN_ANNOTATION, None)
        (want_tpl["metadata"].get("annotations") or {}).pop(GEN_ANNOTATION, None)
        if live_gen is not None and GEN_ANNOTATION in (desired["spec"]["template"]["metadata"].get("annotations") or {}) and \
                _strip_defaults(live_tpl) == _strip_defaults(want_tpl):
            desired["spec"]["template"]["metadata"]["annotations"][GEN_ANNOTATION] = live_gen
            _rehash(desired)
        return same_spec_hash(live, desired)

    @staticmethod
    def _apply_deployment(api, desired: dict) -> dict:
        return apply_or_create(api, f"/apis/apps/v1/namespaces/{desired['metadata']['namespace']}/deployments", desired,
                               KServeStandIn._same_pods, spec_keys=("template", "replicas", "progressDeadlineSeconds"))

    def _apply_service(self, api, isvc: dict, svc_name: str | None = None) -> None:
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        name, ns = isvc["metadata"]["name"], isvc["metadata"]["namespace"]
        svc_name = svc_name or f"{name}-predictor"
        try:
            api.get(f"/api/v1/namespaces/{ns}/services/{svc_name}")
            return
        except ApiError as exc:
            if exc.status != 404:
                raise
        api.post(f"/api/v1/namespaces/{ns}/services", {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": svc_name, "namespace": ns, "labels": dict(self._labels(isvc), app=f"isvc.{svc_name}"),
                         "ownerReferences": self._owner(isvc)},
            "spec": {"selector": {"app": f"isvc.{svc_name}"},
                     "ports": [{"name": svc_name, "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})

    @staticmethod
    def _delete_stale(api, isvc: dict, keep: set) -> None:
        """Delete this InferenceService's predictor Deployments/Services that no longer have a predictor (a removed canary,
        the old stable one after a promotion)."""
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        name, ns = isvc["metadata"]["name"], isvc["metadata"]["namespace"]
        selector = f"serving.kserve.io/inferenceservice={name},component=predictor"
        for base in (f"/apis/apps/v1/namespaces/{ns}/deployments", f"/api/v1/namespaces/{ns}/services"):
            for item in api.get(base, labelSelector=selector)["items"]:
                if item["metadata"]["name"] in keep or item["metadata"].get("deletionTimestamp"):
                    continue
                try:
                    api.delete(f"{base}/{item['metadata']['name']}", {"propagationPolicy": "Background"})
                except ApiError as exc:
                    if exc.status != 404:
                        raise

    # -- status -----------------------------------------------------------------------------------

    @staticmethod
    def _propagate(deployment: dict) -> tuple:
        """(PredictorReady-style condition, observed) of one predictor Deployment: KServe's PropagateRawStatus."""
        dstatus = deployment.get("status") or {}
        conds = {c["type"]: c for c in dstatus.get("conditions") or []}
        observed = dstatus.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 1)
        # KServe PropagateRawStatus
        pred = {"type": "PredictorReady", "status": "False", "reason": ""}
        avail = conds.get("Available")
        if avail and avail["status"] == "True":
            pred = {"type": "PredictorReady", "status": "True", "reason": avail.get("reason", ""),
                    "message": avail.get("message", "")}
        prog = conds.get("Progressing")
        if prog:
            if prog["status"] == "False":
                if prog.get("message"):
                    pred = {"type": "PredictorReady", "status": "False", "reason": prog.get("reason", ""),
                            "message": prog["message"]}
            elif prog["status"] == "True":
                pred = {"type": "PredictorReady", "status": "True" if prog.get("reason") == "NewReplicaSetAvailable"
                        else "Unknown", "reason": prog.get("reason", ""), "message": prog.get("message", "")}
        if avail and avail["status"] == "False":
            pred = {"type": "PredictorReady", "status": "False", "reason": avail.get("reason", ""),
                    "message": avail.get("message", "")}
        failure = conds.get("ReplicaFailure")
        if failure and failure["status"] == "True":
            pred = {"type": "PredictorReady", "status": "False", "reason": failure.get("reason", ""),
                    "message": failure.get("message", "")}
        if not observed:
            pred = {"type": "PredictorReady", "status": "Unknown", "reason": "DeploymentNotObserved",
                    "message": "waiting for the Deployment controller to observe the new spec"}
        if pred["status"] == "True":
            # knative MarkTrue keeps neither reason nor message
            pred = {"type": "PredictorReady", "status": "True"}
        return pred, observed

    def _status(self, isvc: dict, status: dict, deployment: dict, canaries=(), api=None) -> dict:
        meta = isvc["metadata"]
        name, ns = meta["name"], meta["namespace"]
        dstatus = deployment.get("status") or {}
        pred, observed = self._propagate(deployment)
        canary_statuses = []
        for entry, live in canaries:
            cpred, cobserved = self._propagate(live)
            observed = observed and cobserved
            cready = cpred["status"] == "True" and cobserved
            copies = int((live.get("status") or {}).get("readyReplicas") or 0)
            canary_statuses.append({
                "name": (entry.get("predictor") or {}).get("name") or "canary", "ready": cready,
                "trafficPercent": int(entry.get("trafficPercent") or 0),
                "modelStatus": {"transitionStatus": "UpToDate" if cready else "InProgress",
                                "states": {"activeModelState": "Loaded" if cready else "Pending",
                                           "targetModelState": "Loaded" if cready else "Pending"},
                                "copies": {"failedCopies": 0, "totalCopies": copies}}})
        if canary_statuses:
            status["canaryStatuses"] = canary_statuses
        else:
            status.pop("canaryStatuses", None)
        ingress = {"type": "IngressReady", "status": "True"}
        if pred["status"] == "True":
            ready = {"type": "Ready", "status": "True"}
        else:
            ready = {k: v for k, v in pred.items() if k != "type" and v}
            ready["type"] = "Ready"
        status["conditions"] = _merge_conditions(status.get("conditions"), [ingress, pred, ready])
        component = dict((status.get("components") or {}).get("predictor") or {})
        if pred["status"] == "True":
            component["url"] = f"http://{name}-predictor-{ns}.{INGRESS_DOMAIN}"
        status["components"] = dict(status.get("components") or {}, predictor=component)
        status["url"] = f"http://{name}-{ns}.{INGRESS_DOMAIN}"
        status["address"] = {"url": f"http://{name}-predictor.{ns}.svc.cluster.local"}
        ready_copies = int(dstatus.get("readyReplicas") or 0)
        old_model = status.get("modelStatus") or {}
        if ready["status"] != "True" and api is not None:
            # KServe's PropagateModelStatus over the predictor pods, newest first; listed only while not Ready.
            status["modelStatus"], _requeue = kserve_model_status.propagate_model_status(
                old_model, False, self._predictor_pods(api, deployment))
            states = status["modelStatus"].get("states")
            if states is not None and not states.get("activeModelState"):
                # KServe's Go zero value "" is refused by the test bed's kube-apiserver 1.20 (422, "null" for the enum's
                # ""); the CRD's default, which the old stand-in wrote too, stands in for it
                states["activeModelState"] = "Pending"
        else:
            model_state = "Loaded" if ready["status"] == "True" else "Pending"
            prev_active = (old_model.get("states") or {}).get("activeModelState") or "Pending"
            status["modelStatus"] = {
                "transitionStatus": "UpToDate" if model_state == "Loaded" else "InProgress",
                "states": {"activeModelState": "Loaded" if model_state == "Loaded" else prev_active,
                           "targetModelState": model_state},
                "copies": {"failedCopies": 0, "totalCopies": ready_copies},
            }
            if old_model.get("lastFailureInfo"):
                status["modelStatus"]["lastFailureInfo"] = old_model["lastFailureInfo"]  # KServe keeps the last failure
        if observed:
            status["observedGeneration"] = meta.get("generation")
        return status

    @staticmethod
    def _predictor_pods(api, deployment: dict) -> list:
        """The Deployment's pods as KServe's ListPodsByLabel gives them (label `app`), newest first."""
        selector = ",".join(f"{k}={v}" for k, v in sorted((deployment["spec"]["selector"].get("matchLabels") or {}).items()))
        items = api.get(f"/api/v1/namespaces/{deployment['metadata']['namespace']}/pods", labelSelector=selector)["items"]
        return sorted(items, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]), reverse=True)

    @staticmethod
    def _write_status(api, isvc: dict, status: dict) -> None:
        old = isvc.get("status") or {}
        if _strip_times(old) == _strip_times(status):
            return
        meta = isvc["metadata"]
        body = {"apiVersion": isvc["apiVersion"], "kind": isvc["kind"], "metadata": meta, "spec": isvc.get("spec"),
                "status": status}
        api.put(f"/apis/{GROUP}/{VERSION}/namespaces/{meta['namespace']}/{PLURAL}/{meta['name']}/status", body)


def _deployment_name(isvc_name: str, predictor_name: str | None) -> str:
    """KServe's PredictorServiceName(isvc, name): `<isvc>-predictor`, or `<isvc>-predictor-<name>` for a named predictor."""
    return f"{isvc_name}-predictor-{predictor_name}" if predictor_name else f"{isvc_name}-predictor"


def _revision_number(revision: str) -> int:
    """00002 of `<isvc>-predictor-00002` (Knative names a Configuration's revisions by its generation)."""
    return int(revision.rsplit("-", 1)[-1])


def _revision_ready(deployment: dict) -> bool:
    """A revision is ready once its Deployment, scaled up, has all its pods available at its current spec."""
    dstatus = deployment.get("status") or {}
    conds = {c["type"]: c for c in dstatus.get("conditions") or []}
    return bool(deployment["spec"].get("replicas")) and \
        dstatus.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 1) and \
        (conds.get("Available") or {}).get("status") == "True" and \
        int(dstatus.get("readyReplicas") or 0) >= int(deployment["spec"]["replicas"])


def _strip_defaults(template: dict) -> str:
    """A pod template without the fields the API server defaults, to compare what the stand-in wrote with what it reads."""
    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if v not in (None, {}, []) and k not in _DEFAULTED}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value
    return json.dumps(clean(template), sort_keys=True)


_DEFAULTED = {"terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy", "restartPolicy", "dnsPolicy",
              "schedulerName", "terminationGracePeriodSeconds", "protocol", "creationTimestamp"}


def _rehash(deployment: dict) -> None:
    spec, meta = deployment["spec"], deployment["metadata"]
    digest = hashlib.sha256(json.dumps({"spec": spec, "labels": meta["labels"]}, sort_keys=True).encode()).hexdigest()
    meta["annotations"][HASH_ANNOTATION] = digest[:16]


def _strip_times(status: dict) -> str:
    status = copy.deepcopy(status)
    for cond in status.get("conditions") or []:
        cond.pop("lastTransitionTime", None)
    return json.dumps(status, sort_keys=True)


def _merge_conditions(old, new) -> list:
    """Knative-style: keep lastTransitionTime when the status did not change; sorted by type."""
    old_by_type = {c["type"]: c for c in old or []}
    merged = []
    for cond in new:
        cond = {k: v for k, v in cond.items() if v not in (None, "")}
        prev = old_by_type.get(cond["type"])
        cond["lastTransitionTime"] = prev.get("lastTransitionTime") if prev and prev.get("status") == cond["status"] \
            and prev.get("lastTransitionTime") else _now()
        merged.append(cond)
    return sorted(merged, key=lambda c: c["type"])


def storage_entries(predictor: dict) -> list:
    """[{uri, mountPath[, single]}] of a predictor: its storageUri at /mnt/models (single), then its storageUris."""
    model = predictor.get("model") or {}
    uris = []
    if model.get("storageUri") or predictor.get("storageUri"):
        uris.append({"uri": model.get("storageUri") or predictor.get("storageUri"), "mountPath": "/mnt/models", "single": True})
    for entry in predictor.get("storageUris") or []:
        uris.append({"uri": entry["uri"], "mountPath": entry.get("mountPath") or "/mnt/models"})
    return uris
