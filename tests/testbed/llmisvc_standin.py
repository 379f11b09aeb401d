"""A KServe LLMInferenceService controller stand-in for the loopback test bed (single-node workloads).

Written from kserve/kserve's source (pkg/controller/v1alpha1/llmisvc/, pkg/apis/serving/v1alpha2/
llm_inference_service_lifecycle.go) so product code sees the objects and status a real cluster shows:

- finalizer ``serving.kserve.io/llmisvc-finalizer`` added, removed on deletion (owned objects then go through the
  controller manager's garbage collector);
- ``spec.baseRefs``: each ``LLMInferenceServiceConfig`` is looked up in the object's namespace, then in the system
  namespace (``kserve``); a missing one gives ``PresetsCombined=False`` (reason ``CombineBaseError``) and nothing else
  is reconciled (the controller returns before the workloads). Presets merge under the resource as KServe's MergeSpecs
  merges them (llmisvc_merge.py: a strategic merge patch from the zero spec, so an empty value - ``value: ""``,
  ``args: []`` - never overrides a preset's; containers and env merge by name, ``command``/``args`` are replaced);
- Deployment ``<name>-kserve`` from ``spec.template`` (pod labels ``app.kubernetes.io/component=
  llminferenceservice-workload``, ``app.kubernetes.io/name``, ``app.kubernetes.io/part-of=llminferenceservice``,
  ``kserve.io/component=workload``, ``llm-d.ai/role`` = ``decode`` with a prefill pool else ``both``), and
  ``<name>-kserve-prefill`` from ``spec.prefill.template`` (component ``llminferenceservice-workload-prefill``, role
  ``prefill``); a removed prefill pool's Deployment is deleted. Model: ``pvc://claim/path`` becomes a read-only PVC
  mount at /mnt/models (subPath), ``oci://`` the Modelcar sidecar (in the cluster's native OCI mode, and for
  ``oci+native://``, an ImageVolume: an emptyDir with subPath ``models`` here), ``hf://``/``s3://`` a storage-initializer
  init container; a URI attachModelArtifacts refuses (tests/testbed/kserve_storage.py) writes no workload and sets
  ``MainWorkloadReady`` (``WorkerWorkloadReady`` with ``spec.worker``) False, reason ``ReconcileSingleNodeWorkloadError``
  (``ReconcileMultiNodeWorkloadError``), with KServe's message; ``spec.worker`` / ``spec.prefill.worker`` run the pool
  as a LeaderWorkerSet instead (see LLMISvcStandIn._lws and _lws_controller; the LWS CRD, trimmed, is installed by install_crd);
- status as ``propagateDeploymentStatus`` + the living condition set: ``MainWorkloadReady`` /
  ``PrefillWorkloadReady`` True when the Deployment's ``Available`` is True, else False with its reason (or
  ``Progressing`` when there is no Available condition yet); ``WorkloadsReady`` = first False sub-condition, else
  True; ``RouterReady`` True (no router sub-conditions without spec.router); ``Ready`` True when PresetsCombined,
  WorkloadsReady and RouterReady are; ``observedGeneration`` = metadata.generation after every reconcile (knative's
  PostProcessReconcile bumps it whether or not the reconcile succeeded). Like the real controller, Ready can be True at
  a new generation while the Deployment still rolls out (Available stays True on the old pods): a waiter has to look
  at the rollout itself.

Test controls (never visible to product code), delegated to the kubelet stand-in:
    standin.set_behaviour(namespace, name, pool="decode", logs={"main": text}, ready_after=0.2, generation=2)
Pods carry the annotation ``testbed.alauda.io/isvc-generation`` = the LLMInferenceService generation they were made for.
"""
from __future__ import annotations

import copy
import hashlib
import json
import time
import urllib.parse

from . import kserve_storage
from .kserve_standin import GEN_ANNOTATION, HASH_ANNOTATION, ControllerLoop, KServeStandIn, _now, same_spec_hash, apply_or_create
from .kubelet import PodBehaviour
from .llmisvc_merge import merge_spec
from .wake import EVERYTHING, RESYNC_SECONDS, owner_key

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1alpha2", "llminferenceservices"
CONFIG_PLURAL = "llminferenceserviceconfigs"
FINALIZER = "serving.kserve.io/llmisvc-finalizer"
SYSTEM_NAMESPACE = "kserve"
CRD_FILE = "serving.kserve.io_llminferenceservices.yaml"
PART_OF = "llminferenceservice"
COMPONENTS = {"decode": "llminferenceservice-workload", "prefill": "llminferenceservice-workload-prefill"}
STORAGE_INITIALIZER_IMAGE = "kserve/storage-initializer:v0.20.0"
# Multi-node pools (workload_multi_node.go): LeaderWorkerSet names and the leader/worker pod components.
LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
MN_SUFFIX = {"decode": "-kserve-mn", "prefill": "-kserve-mn-prefill"}
MN_COMPONENTS = {"decode": ("llminferenceservice-workload-leader", "llminferenceservice-workload-worker"),
                 "prefill": ("llminferenceservice-workload-leader-prefill", "llminferenceservice-workload-worker-prefill")}
# set_behaviour(pool=...) also takes the multi-node roles
COMPONENTS.update({"decode_leader": MN_COMPONENTS["decode"][0], "decode_worker": MN_COMPONENTS["decode"][1],
                   "prefill_leader": MN_COMPONENTS["prefill"][0], "prefill_worker": MN_COMPONENTS["prefill"][1]})
LWS_LABELS = {"name": "leaderworkerset.sigs.k8s.io/name", "group": "leaderworkerset.sigs.k8s.io/group-index",
              "worker": "leaderworkerset.sigs.k8s.io/worker-index", "revision": "leaderworkerset.sigs.k8s.io/template-revision-hash",
              "group_key": "leaderworkerset.sigs.k8s.io/group-key"}
LWS_ANNOTATIONS = {"size": "leaderworkerset.sigs.k8s.io/size", "leader": "leaderworkerset.sigs.k8s.io/leader-name"}


def _discovery(api, path) -> list:
    from .rest import ApiError  # pylint: disable=import-outside-toplevel
    try:
        return api.get(path).get("resources") or []
    except ApiError:
        return []


def lws_crd_body() -> dict:
    """A minimal LeaderWorkerSet CRD (kubernetes-sigs/lws config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml).

    Kept from upstream: group, names (short name lws), the one version v1 (served, storage), the status and scale
    subresources, the spec fields with their defaults and enums (replicas 1; size 1; restartPolicy
    RecreateGroupOnPodRestart; rolloutStrategy.type RollingUpdate with maxUnavailable 1 / maxSurge 0; startupPolicy
    LeaderCreated) and the status schema (conditions as metav1.Condition, readyReplicas, updatedReplicas, replicas,
    hpaPodSelector, observedGeneration of newer releases). Trimmed: the two pod templates are
    ``x-kubernetes-preserve-unknown-fields`` objects instead of the 1.2 MB inlined PodTemplateSpec schema (the API
    server then keeps every pod field as written), volumeClaimTemplates likewise."""
    def integer(minimum=None, default=None):
        out = {"type": "integer", "format": "int32"}
        if minimum is not None:
            out["minimum"] = minimum
        if default is not None:
            out["default"] = default
        return out
    free = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    int_or_string = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
    condition = {"type": "object", "required": ["lastTransitionTime", "message", "reason", "status", "type"], "properties": {
        "lastTransitionTime": {"type": "string", "format": "date-time"}, "message": {"type": "string", "maxLength": 32768},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "reason": {"type": "string", "maxLength": 1024, "minLength": 1, "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]}, "type": {"type": "string", "maxLength": 316}}}
    spec = {"type": "object", "required": ["leaderWorkerTemplate"], "properties": {
        "replicas": integer(default=1),
        "leaderWorkerTemplate": {"type": "object", "required": ["workerTemplate"], "properties": {
            "leaderTemplate": free, "workerTemplate": free, "size": integer(default=1),
            "restartPolicy": {"type": "string", "default": "RecreateGroupOnPodRestart",
                              "enum": ["Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"]},
            "subGroupPolicy": {"type": "object", "properties": {
                "subGroupPolicyType": {"type": "string", "default": "LeaderWorker", "enum": ["LeaderWorker", "LeaderExcluded"]},
                "subGroupSize": integer()}},
            "volumeClaimTemplates": {"type": "array", "items": free},
            "persistentVolumeClaimRetentionPolicy": free}},
        "rolloutStrategy": {"type": "object", "properties": {
            "type": {"type": "string", "default": "RollingUpdate", "enum": ["RollingUpdate"]},
            "rollingUpdateConfiguration": {"type": "object", "properties": {
                "partition": integer(default=0), "maxUnavailable": dict(int_or_string, default=1),
                "maxSurge": dict(int_or_string, default=0)}}}},
        "startupPolicy": {"type": "string", "default": "LeaderCreated", "enum": ["LeaderCreated", "LeaderReady"]},
        "networkConfig": {"type": "object", "properties": {
            "subdomainPolicy": {"type": "string", "enum": ["Shared", "UniquePerReplica"]}}}}}
    status = {"type": "object", "properties": {
        "conditions": {"type": "array", "items": condition, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        "readyReplicas": integer(), "updatedReplicas": integer(), "replicas": integer(), "hpaPodSelector": {"type": "string"},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{LWS_PLURAL}.{LWS_GROUP}"},
            "spec": {"group": LWS_GROUP, "scope": "Namespaced",
                     "names": {"kind": "LeaderWorkerSet", "listKind": "LeaderWorkerSetList", "plural": LWS_PLURAL,
                               "singular": "leaderworkerset", "shortNames": ["lws"]},
                     "versions": [{"name": LWS_VERSION, "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                       "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                       "metadata": {"type": "object"}, "spec": spec, "status": status}}},
                                   "subresources": {"status": {}, "scale": {
                                       "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                                       "labelSelectorPath": ".status.hpaPodSelector"}}}]}}


def crd_body(crd_dir: str) -> dict:
    """The LLMInferenceService CRD as a Kubernetes 1.20 API server accepts it.

    Two edits, both needed on 1.20 only: the `default: ""` lines are dropped (controlplane._load_crd, as for the other
    KServe CRDs), and then every property named in `x-kubernetes-list-map-keys` that lost its default is made required
    in its list items (1.20: "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required
    property"; 12 places, all `imagePullSecrets[].name`). 1.20 also ignores the CRD's `x-kubernetes-validations` (CEL
    arrived in 1.25), so those rules are not enforced here."""
    import os  # pylint: disable=import-outside-toplevel
    from .controlplane import _load_crd  # pylint: disable=import-outside-toplevel
    body = copy.deepcopy(_load_crd(os.path.join(crd_dir, CRD_FILE)))

    def walk(node):
        if isinstance(node, dict):
            keys, items = node.get("x-kubernetes-list-map-keys"), node.get("items")
            if keys and isinstance(items, dict):
                props = items.get("properties") or {}
                required = items.setdefault("required", [])
                required += [k for k in keys if "default" not in (props.get(k) or {}) and k not in required]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(body)
    return body


def _pruned(obj, schema, path="") -> list:
    """Fields of obj the API server would drop silently (not in the structural schema, no preserve-unknown-fields)."""
    out = []
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return out
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                out += _pruned(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += _pruned(value, extra, f"{path}.{key}")
            elif props is not None or extra is False:
                out.append(f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(obj):
            out += _pruned(value, schema["items"], f"{path}[{i}]")
    return out


def _cel_rules(crd_dir: str) -> dict:
    """The real CRD's x-kubernetes-validations per version, read from the file as it is (with its defaults) on first use."""
    import os  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import cel_rules  # pylint: disable=import-outside-toplevel
    from .controlplane import _load_crd  # pylint: disable=import-outside-toplevel
    if crd_dir not in _CEL_RULES:
        _CEL_RULES[crd_dir] = cel_rules.rules_of(_load_crd(os.path.join(crd_dir, CRD_FILE), as_is=True))["versions"]
    return _CEL_RULES[crd_dir]


_CEL_RULES: dict = {}


def schema_errors(manifest: dict, crd_dir: str) -> list:
    """What the real LLMInferenceService CRD says about a manifest: schema violations (types, required, enums, ranges),
    fields it would prune and its CEL rules (x-kubernetes-validations) that fail or cannot be evaluated, read from the CRD
    file itself (not from the rules the collection ships). Empty: a 1.32 API server takes it."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import cel_rules  # pylint: disable=import-outside-toplevel
    import jsonschema  # pylint: disable=import-outside-toplevel
    import os  # pylint: disable=import-outside-toplevel
    from .controlplane import _load_crd  # pylint: disable=import-outside-toplevel
    body = _load_crd(os.path.join(crd_dir, CRD_FILE))
    version = manifest["apiVersion"].rsplit("/", 1)[-1]
    schema = next(v for v in body["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
    meta_free = dict(manifest)
    meta_free.pop("metadata", None)
    errors = [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(meta_free)]  # no check_schema: 2 MB meta-check is slow
    errors += [f"{p}: not in the schema (the API server would drop it)" for p in _pruned(meta_free, schema)]
    cel = cel_rules.evaluate(_cel_rules(crd_dir)[version], manifest)
    errors += [f"{v.field}: {v.message} (CEL rule {v.rule})" for v in cel.violations]
    return errors + [f"{n.field}: CEL rule not evaluated ({n.reason}): {n.rule}" for n in cel.not_evaluated]


def config_crd_body(crd_dir: str) -> dict:
    """A CRD for LLMInferenceServiceConfig, derived from the LLMInferenceService one.

    ../shared/kserve-crds has no LLMInferenceServiceConfig CRD. In KServe's types (llm_inference_service_types.go)
    `LLMInferenceServiceConfig.Spec` is the same `LLMInferenceServiceSpec`, with `model` optional for configs; so the
    derived CRD keeps the spec schema, drops `model.uri` from required, and renames the kind (short name llmconfig)."""
    body = crd_body(crd_dir)
    body["metadata"] = {"name": f"{CONFIG_PLURAL}.{GROUP}"}
    body["spec"]["names"] = {"kind": "LLMInferenceServiceConfig", "listKind": "LLMInferenceServiceConfigList",
                             "plural": CONFIG_PLURAL, "singular": "llminferenceserviceconfig", "shortNames": ["llmconfig"]}
    for version in body["spec"]["versions"]:
        version.pop("additionalPrinterColumns", None)
        version.pop("subresources", None)
        schema = version["schema"]["openAPIV3Schema"]
        schema["properties"].pop("status", None)
        model = schema["properties"]["spec"]["properties"].get("model") or {}
        model.pop("required", None)
        schema["properties"]["spec"].pop("required", None)
    return body


def install_crd(controlplane, crd_dir: str, timeout: float = 180.0) -> str:
    """Create the LLMInferenceService CRD (see crd_body) and the derived LLMInferenceServiceConfig one (config_crd_body);
    wait until discovery lists both in both versions (clients
    such as kubernetes.core find resources through discovery, which lags behind the resource path itself)."""
    from .rest import ApiError  # pylint: disable=import-outside-toplevel
    body = crd_body(crd_dir)
    api = controlplane.rest(timeout=timeout)
    name = body["metadata"]["name"]
    try:
        for crd in (body, config_crd_body(crd_dir), lws_crd_body()):
            try:
                api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            except ApiError as exc:
                if exc.status != 409:
                    raise
        deadline = time.monotonic() + timeout
        for path in [f"/apis/{GROUP}/{v['name']}" for v in body["spec"]["versions"] if v.get("served")]:
            while True:
                try:
                    listed = {r.get("name") for r in api.get(path).get("resources") or []}
                    if {PLURAL, CONFIG_PLURAL} <= listed:
                        break
                except ApiError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"discovery {path} does not list {PLURAL} after {timeout} s")
                time.sleep(0.05)
        while LWS_PLURAL not in {r.get("name") for r in _discovery(api, f"/apis/{LWS_GROUP}/{LWS_VERSION}")}:
            if time.monotonic() > deadline:
                raise RuntimeError(f"discovery /apis/{LWS_GROUP}/{LWS_VERSION} does not list {LWS_PLURAL} after {timeout} s")
            time.sleep(0.05)
    finally:
        api.close()
    return name


def refresh_discovery_cache(kubeconfig: str) -> None:
    """Rewrite kubernetes.core's discovery cache for this API server after a CRD was added.

    kubernetes.core keeps API discovery in ``$TMPDIR/k8srcp-<sha256 of host and OS user>.json`` and does not refresh it
    when a group version is missing. Test beds reuse loopback ports, so a file left by an earlier control plane on the
    same port (with the four default KServe CRDs) would hide serving.kserve.io/v1alpha2 from the k8s module."""
    from kubernetes import config as kube_config  # pylint: disable=import-outside-toplevel
    from ansible_collections.kubernetes.core.plugins.module_utils.client.discovery import LazyDiscoverer  # pylint: disable=import-outside-toplevel
    from ansible_collections.kubernetes.core.plugins.module_utils.k8sdynamicclient import K8SDynamicClient  # pylint: disable=import-outside-toplevel
    api_client = kube_config.new_client_from_config(config_file=kubeconfig)
    try:
        K8SDynamicClient(api_client, discoverer=LazyDiscoverer).resources.invalidate_cache()
    finally:
        api_client.close()


def lws_size(parallelism: dict | None) -> int | None:
    """ParallelismSpec.GetSize: data-parallel: max(data / dataLocal, 1) pods per group; else pipeline; else unset (1)."""
    if not parallelism:
        return None
    data, local = parallelism.get("data"), parallelism.get("dataLocal")
    if (data or 0) > 0 or (local or 0) > 0:
        return max(max(data or 1, 1) // max(local or 1, 1), 1)
    if (parallelism.get("pipeline") or 0) > 0:
        return parallelism["pipeline"]
    return None


def llmisvc_event_keys(event: dict) -> list:
    """What a watch event makes the LLMInferenceService stand-in reconcile: the LLMInferenceService itself; for what it
    owns (Deployments and LeaderWorkerSets by ownerReference; the multi-node pods, owned by their LeaderWorkerSet, by the
    `app.kubernetes.io/name` label with `app.kubernetes.io/part-of=llminferenceservice`), the owner; for an
    LLMInferenceServiceConfig (a preset baseRefs name), every LLMInferenceService of its namespace, or of every
    namespace for one in the system namespace (where baseRefs fall back to)."""
    obj = event.get("object") or {}
    meta = obj.get("metadata") or {}
    kind = obj.get("kind")
    if kind == "LLMInferenceService":
        return [(meta.get("namespace"), meta.get("name"))]
    if kind == "LLMInferenceServiceConfig":
        return [EVERYTHING] if meta.get("namespace") == SYSTEM_NAMESPACE else [(meta.get("namespace"), None)]
    key = owner_key(obj, "LLMInferenceService", "app.kubernetes.io/name", part_of=("app.kubernetes.io/part-of", PART_OF))
    return [key] if key else []


class LLMISvcStandIn(ControllerLoop):
    """Reconciles LLMInferenceServices in a background thread. start()/stop() or a context manager."""

    LIST_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
    DEPLOYMENT_SELECTOR = f"app.kubernetes.io/part-of={PART_OF}"
    NAME = "llmisvc stand-in"
    FINALIZER_NAME = FINALIZER
    event_keys = staticmethod(llmisvc_event_keys)

    def __init__(self, controlplane, kubelet=None, idle_interval: float = RESYNC_SECONDS):
        self._init_loop(controlplane, idle_interval)
        self.kubelet = kubelet
        self._oci_mode = "modelcar"  # of the pass running now (one loop thread)

    @staticmethod
    def model_problem(uri: str, storage_initializer: dict) -> str | None:
        """attachModelArtifacts' refusal of spec.model.uri, as the pool condition's message shows it."""
        problem = kserve_storage.model_uri_error(uri, storage_initializer)
        return "failed to attach model artifacts to main deployment: " + problem if problem else None

    def _model_refusal(self, api, spec: dict) -> dict | None:
        """The pool condition a refused spec.model.uri gives (None: go on, with self._oci_mode set for the mounts)."""
        uri = ((spec.get("model") or {}).get("uri")) or ""
        config = KServeStandIn.storage_initializer(api) if kserve_storage.parse_oci_scheme(uri)[2] else {}
        self._oci_mode = kserve_storage.oci_model_mode(config)
        problem = self.model_problem(uri, config)
        if problem is None:
            return None
        multi = spec.get("worker") is not None
        return {"type": "WorkerWorkloadReady" if multi else "MainWorkloadReady", "status": "False",
                "reason": "ReconcileMultiNodeWorkloadError" if multi else "ReconcileSingleNodeWorkloadError", "message": problem}

    def watched_paths(self) -> list:
        # Presets (baseRefs) and the multi-node pools' pods are read on every pass.
        return super().watched_paths() + [f"/apis/{GROUP}/{VERSION}/{CONFIG_PLURAL}", f"/apis/{LWS_GROUP}/{LWS_VERSION}/{LWS_PLURAL}",
                                          "/api/v1/pods?labelSelector=" + urllib.parse.quote(LWS_LABELS["name"])]

    def set_behaviour(self, namespace: str, name: str, pool: str | None = None, ready_after: float | None = 0.0,
                      never_ready: bool = False, logs: dict | None = None, generation: int | None = None,
                      pod: str | None = None, pod_ip: str | None = None, http: dict | None = None) -> None:
        """How the pods of namespace/name behave (all pools, or one `pool`; one `generation`; one pod by name prefix
        `pod`), delegated to the kubelet stand-in; `pod_ip` and `http` serve scripted pages as PodBehaviour does."""
        if self.kubelet is None:
            raise RuntimeError("set_behaviour needs the kubelet stand-in (LLMISvcStandIn(cp, kubelet=...))")
        extra = {"pod_ip": pod_ip, "http": dict(http)} if http else {}
        behaviour = PodBehaviour(ready_after=None if never_ready else ready_after, logs=dict(logs or {}), **extra)

        def match(p):
            meta = p["metadata"]
            labels = meta.get("labels") or {}
            if meta["namespace"] != namespace or labels.get("app.kubernetes.io/name") != name or labels.get("app.kubernetes.io/part-of") != PART_OF:
                return False
            if pool is not None and labels.get("app.kubernetes.io/component") != COMPONENTS[pool]:
                return False
            if pod is not None and not meta["name"].startswith(pod):
                return False
            return generation is None or (meta.get("annotations") or {}).get(GEN_ANNOTATION) == str(generation)
        self.kubelet.set_behaviour(match, behaviour)

    # -- reconcile ----------------------------------------------------------------------------------

    def _presets(self, api, obj):
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        found, missing = [], []
        for ref in (obj.get("spec") or {}).get("baseRefs") or []:
            for ns in (obj["metadata"]["namespace"], SYSTEM_NAMESPACE):
                try:
                    found.append(api.get(f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{CONFIG_PLURAL}/{ref['name']}"))
                    break
                except ApiError as exc:
                    if exc.status != 404:
                        raise
            else:
                missing.append(ref["name"])
        return found, missing

    def reconcile(self, api, obj: dict) -> None:
        meta = obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}/{name}"
        if self._finalized(api, obj, path):
            return
        self.reconciles += 1
        old_status = obj.get("status") or {}
        conds = {}
        presets, missing = self._presets(api, obj)
        if missing:
            conds["PresetsCombined"] = {"type": "PresetsCombined", "status": "False", "reason": "CombineBaseError",
                                        "message": "failed to combine base-configurations: LLMInferenceServiceConfig %s not found"
                                                   % ", ".join(missing)}
        else:
            conds["PresetsCombined"] = {"type": "PresetsCombined", "status": "True"}
            spec = merge_spec(presets, obj.get("spec") or {})
            prefill_spec = spec.get("prefill")
            prefill = (prefill_spec or {}).get("template")
            refused = self._model_refusal(api, spec)
            if refused:
                conds[refused["type"]] = refused  # the controller returns before it writes a workload
            for pool, podspec, worker in () if refused else (("decode", spec.get("template"), spec.get("worker")),
                                                             ("prefill", prefill, (prefill_spec or {}).get("worker"))):
                cond_type = "MainWorkloadReady" if pool == "decode" else "PrefillWorkloadReady"
                dep_name = name + ("-kserve" if pool == "decode" else "-kserve-prefill")
                lws_name = name + MN_SUFFIX[pool]
                if worker is not None:
                    # reconcileMultiNodeWorkload: the pool runs as a LeaderWorkerSet; the single-node Deployment is
                    # deleted and its condition cleared (Mark*WorkloadUnset).
                    self._delete(api, ns, dep_name)
                    mn_cond = "WorkerWorkloadReady" if pool == "decode" else "PrefillWorkerWorkloadReady"
                    desired = self._lws(obj, spec, pool, podspec, worker, lws_name, has_prefill=prefill_spec is not None)
                    live = self._lws_controller(api, self._apply_lws(api, desired))
                    conds[mn_cond] = self._propagate(mn_cond, live)
                    continue
                self._delete_lws(api, ns, lws_name)
                if podspec is None:
                    self._delete(api, ns, dep_name)
                    continue
                desired = self._deployment(obj, spec, pool, podspec, dep_name, has_prefill=prefill is not None)
                live = KServeStandIn._apply_deployment(api, desired)  # pylint: disable=protected-access
                conds[cond_type] = self._propagate(cond_type, live)
            sub = [conds[c] for c in ("MainWorkloadReady", "WorkerWorkloadReady", "PrefillWorkloadReady",
                                      "PrefillWorkerWorkloadReady") if c in conds]
            bad = next((c for c in sub if c["status"] == "False"), None)
            conds["WorkloadsReady"] = ({"type": "WorkloadsReady", "status": "False", "reason": bad.get("reason"),
                                        "message": bad.get("message")} if bad else {"type": "WorkloadsReady", "status": "True"})
            conds["RouterReady"] = {"type": "RouterReady", "status": "True"}
        top = [conds.get(c) for c in ("PresetsCombined", "WorkloadsReady", "RouterReady")]
        failing = next((c for c in top if c is None or c["status"] != "True"), None)
        if failing is None:
            conds["Ready"] = {"type": "Ready", "status": "True"}
        elif failing is not None and failing.get("type"):
            conds["Ready"] = {"type": "Ready", "status": failing["status"], "reason": failing.get("reason"),
                              "message": failing.get("message")}
        else:
            conds["Ready"] = {"type": "Ready", "status": "Unknown"}
        previous = {c["type"]: c for c in old_status.get("conditions") or []}
        conditions = []
        for cond in sorted(conds.values(), key=lambda c: c["type"]):
            cond = {k: v for k, v in cond.items() if v not in (None, "")}
            prev = previous.get(cond["type"])
            same = prev is not None and all(prev.get(k) == cond.get(k) for k in ("status", "reason", "message"))
            cond["lastTransitionTime"] = prev.get("lastTransitionTime") if same else _now()
            conditions.append(cond)
        status = {"observedGeneration": meta.get("generation"), "conditions": conditions,
                  "url": f"http://{name}.{ns}.svc.cluster.local"}
        if status != old_status:
            api.put(f"{path}/status", dict(obj, status=status))

    @staticmethod
    def _propagate(cond_type: str, deployment: dict) -> dict:
        """propagateDeploymentStatus: the Deployment's Available condition decides."""
        for cond in (deployment.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Available":
                if cond.get("status") == "True":
                    return {"type": cond_type, "status": "True"}
                return {"type": cond_type, "status": "False", "reason": cond.get("reason"), "message": cond.get("message")}
        return {"type": cond_type, "status": "False", "reason": "Progressing"}

    @staticmethod
    def _delete(api, ns, dep_name):
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        try:
            api.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/{dep_name}", {"propagationPolicy": "Background"})
        except ApiError as exc:
            if exc.status != 404:
                raise

    # -- multi-node: the LeaderWorkerSet KServe writes, and the LWS controller's part ------------------------------

    def _lws(self, obj, spec, pool, podspec, worker, lws_name, has_prefill):
        """expectedMainMultiNodeLWS / expectedPrefillMultiNodeLWS (workload_multi_node.go). Not modelled: the
        <name>-kserve-mn ServiceAccount the controller creates and sets on both templates, and the routing sidecar."""
        meta = obj["metadata"]
        leader_component, worker_component = MN_COMPONENTS[pool]
        common = {"app.kubernetes.io/name": meta["name"], "app.kubernetes.io/part-of": PART_OF}
        role = ("decode" if has_prefill else "both") if pool == "decode" else "prefill"
        worker_labels = dict(common, **{"app.kubernetes.io/component": worker_component})
        if podspec is None:  # without a leader template the workers join the InferencePool selector
            worker_labels.update({"kserve.io/component": "workload", "llm-d.ai/role": "decode" if pool == "decode" else "prefill"})
        leader_labels = dict(common, **{"app.kubernetes.io/component": leader_component, "kserve.io/component": "workload",
                                        "llm-d.ai/role": role})
        section = spec if pool == "decode" else (spec.get("prefill") or {})
        uri = ((spec.get("model") or {}).get("uri")) or ""
        gen = {GEN_ANNOTATION: str(meta.get("generation"))}
        wspec = copy.deepcopy(worker)
        self._attach_model(uri, wspec, self._oci_mode)
        lwt = {"workerTemplate": {"metadata": {"labels": worker_labels, "annotations": dict(gen)}, "spec": wspec},
               "restartPolicy": "RecreateGroupOnPodRestart"}
        size = lws_size(section.get("parallelism"))
        if size is not None:
            lwt["size"] = size
        if podspec is not None:
            lspec = copy.deepcopy(podspec)
            self._attach_model(uri, lspec, self._oci_mode)
            lwt["leaderTemplate"] = {"metadata": {"labels": leader_labels, "annotations": dict(gen)}, "spec": lspec}
        if pool == "prefill" and (section.get("parallelism") or {}).get("data") and size is not None:
            lwt["subGroupPolicy"] = {"subGroupSize": size}
        body_spec = {"leaderWorkerTemplate": lwt, "rolloutStrategy": {"type": "RollingUpdate"}, "startupPolicy": "LeaderCreated"}
        if section.get("replicas") is not None:
            body_spec["replicas"] = section["replicas"]
        # Only a change of what the pods run (not of the LLMInferenceService generation alone) rolls the groups.
        pods_run = [{k: v for k, v in lwt.items() if k not in ("leaderTemplate", "workerTemplate")},
                    (lwt.get("leaderTemplate") or {}).get("spec"), wspec, worker_labels, leader_labels, body_spec.get("replicas")]
        digest = hashlib.sha256(json.dumps(pods_run, sort_keys=True).encode()).hexdigest()[:16]
        return {"apiVersion": f"{LWS_GROUP}/{LWS_VERSION}", "kind": "LeaderWorkerSet",
                "metadata": {"name": lws_name, "namespace": meta["namespace"], "labels": worker_labels,
                             "annotations": {HASH_ANNOTATION: digest},
                             "ownerReferences": [{"apiVersion": obj["apiVersion"], "kind": "LLMInferenceService",
                                                  "name": meta["name"], "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": body_spec}

    @staticmethod
    def _apply_lws(api, desired: dict) -> dict:
        return apply_or_create(api, f"/apis/{LWS_GROUP}/{LWS_VERSION}/namespaces/{desired['metadata']['namespace']}/{LWS_PLURAL}",
                               desired, same_spec_hash)

    @staticmethod
    def _delete_lws(api, ns, lws_name):
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        try:
            api.delete(f"/apis/{LWS_GROUP}/{LWS_VERSION}/namespaces/{ns}/{LWS_PLURAL}/{lws_name}", {"propagationPolicy": "Background"})
        except ApiError as exc:
            if exc.status != 404:
                raise

    def _lws_controller(self, api, lws: dict) -> dict:
        """The LWS controller, collapsed: groups of pods made directly (the real one goes through a leader StatefulSet
        and one worker StatefulSet per group, which the test bed's controller manager would run, but 1.20 has no
        StatefulSet start ordinal for workers numbered from 1). Faithful where product code looks: pod names
        (<lws>-<group>, <lws>-<group>-<worker>), labels (set name, group index, worker index, template revision hash,
        group key) and annotations (size, leader name), the LWS_* env variables, the template (leader template for worker
        index 0 when set, else the worker template), owner references for the garbage collector, a rolling update one
        group at a time from the highest index (maxUnavailable 1, maxSurge 0), and the status as updateConditions writes
        it (readyReplicas, updatedReplicas, replicas, hpaPodSelector, observedGeneration; UpdateInProgress+Progressing
        while groups run an old revision, Available once every group is updated and ready, else Progressing)."""
        from .rest import ApiError  # pylint: disable=import-outside-toplevel
        meta, spec = lws["metadata"], lws.get("spec") or {}
        ns, lname = meta["namespace"], meta["name"]
        lwt = spec.get("leaderWorkerTemplate") or {}
        size = int(lwt.get("size") or 1)
        replicas = 1 if spec.get("replicas") is None else int(spec["replicas"])
        revision = hashlib.sha256(json.dumps(lwt, sort_keys=True).encode()).hexdigest()[:10]
        pod_base = f"/api/v1/namespaces/{ns}/pods"
        pods = api.get(pod_base, labelSelector=f"{LWS_LABELS['name']}={lname}")["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        groups: dict = {}
        for pod in live:
            labels = pod["metadata"].get("labels") or {}
            groups.setdefault(int(labels.get(LWS_LABELS["group"], "0")), []).append(pod)

        def ready(pod):
            st = pod.get("status") or {}
            return st.get("phase") == "Running" and any(c.get("type") == "Ready" and c.get("status") == "True"
                                                        for c in st.get("conditions") or [])

        def updated(members):
            return len(members) == size and all((m["metadata"].get("labels") or {}).get(LWS_LABELS["revision"]) == revision
                                                for m in members)
        # scale down / out-of-range workers: delete
        doomed = [p for g, members in groups.items() for p in members
                  if g >= replicas or int((p["metadata"].get("labels") or {}).get(LWS_LABELS["worker"], "0")) >= size]
        # rolling update: recreate the highest-index old group once every other group is ready
        old = sorted((g for g, members in groups.items() if g < replicas and not updated(members)), reverse=True)
        others_ready = all(len(m) == size and all(ready(p) for p in m) for g, m in groups.items() if g < replicas and g not in old[:1])
        if old and others_ready and any((p["metadata"].get("labels") or {}).get(LWS_LABELS["revision"]) != revision
                                        for p in groups[old[0]]):
            doomed += groups[old[0]]
        for pod in doomed:
            try:
                api.delete(f"{pod_base}/{pod['metadata']['name']}", {"propagationPolicy": "Background"})
            except ApiError as exc:
                if exc.status != 404:
                    raise
        names = {p["metadata"]["name"] for p in pods}
        for group in range(replicas):
            if any((p["metadata"].get("labels") or {}).get(LWS_LABELS["revision"]) != revision for p in groups.get(group, [])):
                continue  # an old group keeps running until its turn
            for worker in range(size):
                pod_name = f"{lname}-{group}" if worker == 0 else f"{lname}-{group}-{worker}"
                if pod_name not in names:
                    try:
                        api.post(pod_base, self._lws_pod(lws, lwt, group, worker, size, revision))
                    except ApiError as exc:
                        if exc.status != 409:  # the previous pod of that name is still terminating
                            raise
        pods = [p for p in api.get(pod_base, labelSelector=f"{LWS_LABELS['name']}={lname}")["items"]
                if not p["metadata"].get("deletionTimestamp")]
        groups = {}
        for pod in pods:
            groups.setdefault(int((pod["metadata"].get("labels") or {}).get(LWS_LABELS["group"], "0")), []).append(pod)
        leaders = [g for g, m in groups.items() if any((p["metadata"].get("labels") or {}).get(LWS_LABELS["worker"]) == "0" for p in m)]
        ready_groups = [g for g in leaders if len(groups[g]) == size and all(ready(p) for p in groups[g])]
        updated_groups = [g for g in leaders if updated(groups[g])]
        current = [g for g in leaders if g < replicas]
        if len([g for g in updated_groups if g < replicas]) < len(current):
            true = ("UpdateInProgress", "Progressing")
        elif len([g for g in ready_groups if g < replicas]) == replicas and \
                len([g for g in current if g in ready_groups and g in updated_groups]) == len(current):
            true = ("Available",)
        else:
            true = ("Progressing",)
        texts = {"Available": ("AllGroupsReady", "All replicas are ready"),
                 "UpdateInProgress": ("GroupsUpdating", "Rolling Upgrade is in progress"),
                 "Progressing": ("GroupsProgressing", "Replicas are progressing")}
        old_status = lws.get("status") or {}
        previous = {c["type"]: c for c in old_status.get("conditions") or []}
        conditions = []
        for ctype in ("Available", "Progressing", "UpdateInProgress"):
            if ctype not in true and ctype not in previous:
                continue
            status = "True" if ctype in true else "False"
            prev = previous.get(ctype) or {}
            conditions.append({"type": ctype, "status": status, "reason": texts[ctype][0], "message": texts[ctype][1],
                               "lastTransitionTime": prev.get("lastTransitionTime") if prev.get("status") == status else _now()})
        status = {"conditions": conditions, "readyReplicas": len(ready_groups), "updatedReplicas": len(updated_groups),
                  "replicas": len(leaders), "hpaPodSelector": f"{LWS_LABELS['name']}={lname},{LWS_LABELS['worker']}=0",
                  "observedGeneration": meta.get("generation")}
        if status == old_status:
            return lws
        return api.put(f"/apis/{LWS_GROUP}/{LWS_VERSION}/namespaces/{ns}/{LWS_PLURAL}/{lname}/status", dict(lws, status=status))

    @staticmethod
    def _lws_pod(lws, lwt, group, worker, size, revision):
        meta = lws["metadata"]
        lname, ns = meta["name"], meta["namespace"]
        template = lwt.get("leaderTemplate") if worker == 0 and lwt.get("leaderTemplate") else lwt["workerTemplate"]
        leader = f"{lname}-{group}"
        name = leader if worker == 0 else f"{leader}-{worker}"
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        labels.update({LWS_LABELS["name"]: lname, LWS_LABELS["group"]: str(group), LWS_LABELS["worker"]: str(worker),
                       LWS_LABELS["revision"]: revision,
                       LWS_LABELS["group_key"]: hashlib.sha1(f"{ns}/{leader}".encode()).hexdigest()})
        annotations = dict((template.get("metadata") or {}).get("annotations") or {})
        annotations[LWS_ANNOTATIONS["size"]] = str(size)
        if worker:
            annotations[LWS_ANNOTATIONS["leader"]] = leader
        podspec = copy.deepcopy(template.get("spec") or {})
        env = [{"name": "LWS_LEADER_ADDRESS", "value": f"{leader}.{lname}.{ns}"}, {"name": "LWS_GROUP_SIZE", "value": str(size)},
               {"name": "LWS_WORKER_INDEX", "value": str(worker)}]
        for container in (podspec.get("containers") or []) + (podspec.get("initContainers") or []):
            container["env"] = [e for e in container.get("env") or [] if e.get("name") not in {v["name"] for v in env}] + env
        podspec.setdefault("hostname", name)
        podspec.setdefault("subdomain", lname)
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations,
                             "ownerReferences": [{"apiVersion": lws["apiVersion"], "kind": "LeaderWorkerSet", "name": lname,
                                                  "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
                "spec": podspec}

    @staticmethod
    def _attach_model(uri: str, podspec: dict, oci_mode: str = "modelcar") -> None:
        main = next((c for c in podspec.get("containers") or [] if c.get("name") == "main"), None)
        if main is None:
            return
        mounts = main.setdefault("volumeMounts", [])
        volumes = podspec.setdefault("volumes", [])
        explicit, normalised, is_oci = kserve_storage.parse_oci_scheme(uri)
        if is_oci and (explicit or oci_mode) == "native":
            # ConfigureOciNativeToContainer at /mnt/models: an ImageVolume (an emptyDir here), subPath models, read-only
            volumes.append({"name": "mnt-models", "emptyDir": {}})
            mounts.append({"name": "mnt-models", "mountPath": "/mnt/models", "subPath": "models", "readOnly": True})
            return
        uri = normalised
        if uri.startswith("pvc://"):
            claim, sub = (uri[len("pvc://"):].split("/", 1) + [""])[:2]
            volumes.append({"name": "kserve-pvc-source", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
            mount = {"name": "kserve-pvc-source", "mountPath": "/mnt/models", "readOnly": True}
            if sub.strip("/"):
                mount["subPath"] = sub.strip("/")
            mounts.append(mount)
        elif uri.startswith("oci://"):
            volumes.append({"name": "kserve-provision-location", "emptyDir": {}})
            mounts.append({"name": "kserve-provision-location", "mountPath": "/mnt"})
            podspec.setdefault("containers", []).append({
                "name": "modelcar", "image": uri[len("oci://"):], "args": kserve_storage.modelcar_args(),
                "volumeMounts": [{"name": "kserve-provision-location", "mountPath": "/mnt"}]})
            podspec["shareProcessNamespace"] = True
        else:
            volumes.append({"name": "kserve-provision-location", "emptyDir": {}})
            mounts.append({"name": "kserve-provision-location", "mountPath": "/mnt/models", "readOnly": True})
            podspec.setdefault("initContainers", []).append({
                "name": "storage-initializer", "image": STORAGE_INITIALIZER_IMAGE, "args": [uri, "/mnt/models"],
                "volumeMounts": [{"name": "kserve-provision-location", "mountPath": "/mnt/models"}]})

    def _deployment(self, obj, spec, pool, podspec, dep_name, has_prefill):
        meta = obj["metadata"]
        labels = {"app.kubernetes.io/component": COMPONENTS[pool], "app.kubernetes.io/name": meta["name"],
                  "app.kubernetes.io/part-of": PART_OF, "kserve.io/component": "workload",
                  "llm-d.ai/role": ("decode" if has_prefill else "both") if pool == "decode" else "prefill"}
        podspec = copy.deepcopy(podspec)
        self._attach_model(((spec.get("model") or {}).get("uri")) or "", podspec, self._oci_mode)
        replicas = spec.get("replicas") if pool == "decode" else (spec.get("prefill") or {}).get("replicas")
        template = {"metadata": {"labels": dict(labels), "annotations": {GEN_ANNOTATION: str(meta.get("generation"))}},
                    "spec": podspec}
        # Only a change of the pod template or replicas rolls the Deployment (a prefill-only edit leaves decode alone).
        digest = hashlib.sha256(json.dumps([podspec, labels, replicas], sort_keys=True).encode()).hexdigest()[:16]
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": dep_name, "namespace": meta["namespace"], "labels": dict(labels),
                             "annotations": {HASH_ANNOTATION: digest},
                             "ownerReferences": [{"apiVersion": obj["apiVersion"], "kind": "LLMInferenceService",
                                                  "name": meta["name"], "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": {"replicas": 1 if replicas is None else replicas, "selector": {"matchLabels": dict(labels)},
                         "template": template}}
