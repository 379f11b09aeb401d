# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading an LLMInferenceService and what it depends on from the cluster: the object, its presets
(LLMInferenceServiceConfig), the ConfigMaps and Secrets its env reads, the engine line of every serving pod, and whether
its pool Deployments (or LeaderWorkerSets) are still rolling out.

Plain Python, no Ansible imports. What KServe does with the object is in ``model.py``'s docstring.
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import speculative_config as spec_core
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import not_understood as unknown
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc.model import (
    ADDITIONAL_ARGS_ENV, CONFIG_KIND, CONFIG_PLURAL, DEFAULT_API_VERSION, GROUP, LWS_GROUP, LWS_GROUP_INDEX_LABEL, LWS_KIND, LWS_PLURAL, LWS_VERSION,
    LWS_WORKER_INDEX_LABEL, MAIN_CONTAINER, POOLS, _dig, _layers, deployment_name, lws_name, pod_selector,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc.flags import (
    WELL_KNOWN_PREFIX, _effective_containers, env_ref, flags, preset_layers, well_known_presets,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc.status import _index, lws_groups, multi_node, pools_of, rank0_pod

# ----------------------------------------------------------------------------------------------------------------
# Cluster reads (a kubernetes.client.ApiClient or the cluster service, kube/service.py: generic reads go through it)


def api_error(what, exc, field):
    """A SpecDecodingError carrying the API server's own message (a 403 names the user, the verb and the resource)."""
    return kube_service.api_failure(what, exc, field=field)


def _custom_api(api_client):
    return kube_service.service_of(api_client).custom_objects()


def get(api_client, namespace, name, version=DEFAULT_API_VERSION):
    """The LLMInferenceService as a dict; ValidationError naming it when it does not exist."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
    try:
        return kube_service.service_of(api_client).get(kube_service.LLM_INFERENCE_SERVICE.at(version), name, namespace)
    except ApiException as exc:
        raise api_error("reading LLMInferenceService %s/%s" % (namespace, name), exc, "name") from exc


def read_presets(api_client, obj, system_namespace="kserve", version=DEFAULT_API_VERSION, config_prefix=WELL_KNOWN_PREFIX,
                 well_known=True, unreadable=None):
    """The LLMInferenceServiceConfig objects KServe's controller merges into ``obj``: those its spec.baseRefs name and
    (``well_known``) the well-known presets for its shape (well_known_presets), each looked up in the object's namespace
    first and then in KServe's system namespace, as the controller's getConfig does. Missing ones are left out (the
    controller reports them as PresetsCombined=False, ConfigNotFound). Returns ``{name: object}``.

    A well-known preset the caller may not read (403, e.g. no rights in KServe's namespace) is left out and its
    ``namespace/name`` appended to ``unreadable``: the engine line on the pods still proves what runs. A baseRefs
    preset the caller may not read is an error: the resource names it, so its flags cannot be guessed."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError  # pylint: disable=import-outside-toplevel
    api = _custom_api(api_client)
    namespace = obj["metadata"]["namespace"]
    out = {}

    def fetch(name, named_by_resource):
        forbidden = []
        for ns in (namespace, system_namespace):
            try:
                out[name] = api.get_namespaced_custom_object(GROUP, version, ns, CONFIG_PLURAL, name)
                return
            except ApiException as exc:
                if exc.status == 403 and not named_by_resource:
                    forbidden.append("%s/%s" % (ns, name))
                    continue
                if exc.status == 403:
                    raise SpecDecodingError("may not read the %s %s/%s that spec.baseRefs names" % (CONFIG_KIND, ns, name),
                                            field="spec.baseRefs", hint="grant get on llminferenceserviceconfigs in %s" % ns) from exc
                if exc.status != 404:
                    raise
        if unreadable is not None:
            unreadable.extend(forbidden)

    refs = [(ref or {}).get("name") for ref in ((obj.get("spec") or {}).get("baseRefs") or [])]
    for name in refs:
        if name and name not in out:
            fetch(name, True)
    if well_known:
        base_specs = [(out[n].get("spec") or {}) for n in refs if n in out]
        for name in well_known_presets(obj, base_specs, config_prefix):
            if name not in out:
                fetch(name, False)
    return out


def env_configmap_refs(obj, presets=None, config_prefix=WELL_KNOWN_PREFIX):
    """The ``(ConfigMap name, key, optional)`` pairs the merged pods read VLLM_ADDITIONAL_ARGS from (valueFrom
    configMapKeyRef), in every pool, from the layer whose valueFrom survives KServe's merge (a value set over it in a later
    layer does not remove it: merge.py)."""
    layers = preset_layers(obj, presets, config_prefix)
    out = []
    for info in POOLS.values():
        for entry in _effective_containers(layers, info["path"]).values():
            owner = entry["env"].get(ADDITIONAL_ARGS_ENV, {}).get("valueFrom")
            if owner is None:
                continue
            ref = env_ref({"valueFrom": (entry["layers"][owner[0]].get("env") or [])[owner[1]]["valueFrom"]})
            if ref and ref["kind"] == "ConfigMap" and (ref["name"], ref["key"], ref["optional"]) not in out:
                out.append((ref["name"], ref["key"], ref["optional"]))
    return out


def read_env_sources(api_client, obj, presets=None, config_prefix=WELL_KNOWN_PREFIX):
    """The values of the ConfigMap keys VLLM_ADDITIONAL_ARGS comes from (env_configmap_refs), read in the object's
    namespace (where its pods run): ``{(name, key): {"value": str or None, "reason": str or None}}``. A missing ConfigMap
    or key gives the value "" (the pod then has no such variable, or does not start: no flag can come from it); a read
    that fails otherwise (e.g. forbidden) gives None and the reason. Secrets are never read."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
    service = kube_service.service_of(api_client)
    namespace = obj["metadata"]["namespace"]
    out, cache = {}, {}
    for name, key, _optional in env_configmap_refs(obj, presets, config_prefix):
        if name not in cache:
            try:
                cache[name] = (((service.get(kube_service.CONFIG_MAP, name, namespace, missing="none") or {}).get("data") or {}), None)
            except ApiException as exc:
                cache[name] = (None, kube_service.api_error_message(exc))
        data, reason = cache[name]
        out[(name, key)] = {"value": None, "reason": reason} if data is None else {"value": data.get(key) or "", "reason": None}
    return out


def expected_per_pool(found_flags, pools, expected=None):
    """What each pool's engine line must say: the pool's flag (or the given ``expected``) where it has one, no
    speculative decoding where it has none."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log  # pylint: disable=import-outside-toplevel
    out = {}
    for pool in pools:
        mine = [f for f in found_flags if f["pool"] == pool]
        if expected and expected.get("enabled") is False:
            out[pool] = dict(expected)  # after a rollback: no pool may run speculative decoding
        elif not mine:
            out[pool] = {"enabled": False}
        elif expected:
            out[pool] = dict(expected)
        elif mine[0]["config"] is not None:
            out[pool] = engine_log.expected_from_flag(mine[0]["config"])
        else:
            out[pool] = {"enabled": True}
    return out


def data_parallel(obj, pool):
    spec = (obj or {}).get("spec") or {}
    par = (spec.get("prefill") or {}).get("parallelism") if pool.startswith("prefill") else spec.get("parallelism")
    par = par or {}
    return int(par.get("data") or 1) * int(par.get("dataLocal") or 1)


def _flag_pool(obj, pool, presets, multi):
    """Which pod template's flag a pool's engine runs: the leader's (spec.template / spec.prefill.template), or, in a
    LeaderWorkerSet without a leader template, the worker template (the LWS controller then starts leaders from it)."""
    if not multi:
        return pool
    path = POOLS[pool]["path"]
    if any(_dig(layer, path) is not None for layer in _layers(obj, presets)):
        return pool
    return "worker" if pool == "decode" else "prefill_worker"


def _read_engine_lines(api_client, namespace, pods, container, timeout):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError  # pylint: disable=import-outside-toplevel
    out = []
    for pod in pods:
        res = {"name": pod["name"], "found": False, "speculative_config": None, "vllm_version": None, "error": None,
               "not_understood": []}
        labels = pod.get("labels") or {}
        if LWS_WORKER_INDEX_LABEL in labels:
            res.update(group=_index(labels, LWS_GROUP_INDEX_LABEL), worker_index=_index(labels, LWS_WORKER_INDEX_LABEL),
                       role="leader" if _index(labels, LWS_WORKER_INDEX_LABEL) == 0 else "worker")
        try:
            result = engine_log.scan_chunks(k8s_pods.stream_pod_log(api_client, namespace, pod["name"], container=container,
                                                                    timeout=timeout))
            res.update(found=result["found"], speculative_config=result["speculative_config"], vllm_version=result["vllm_version"],
                       not_understood=result["not_understood"])
        except SpecDecodingError as exc:
            res["error"] = str(exc)
        out.append(res)
    return out


def engine_report(api_client, obj, expected=None, container=MAIN_CONTAINER, timeout=60, presets=None):
    """Read the engine-config line of every pod of every pool and compare each pool with what it must run.

    Single-node pools (a Deployment): every pod logs the line, except that with data parallelism (spec.parallelism.data x
    dataLocal > 1) vLLM 0.24+ logs it on data-parallel rank 0 only: the pool passes when one pod logged it and no pod
    contradicts it. Multi-node pools (a LeaderWorkerSet, spec.worker): the leader of each group runs the engine core of
    rank 0 (and the API server) and must log the line; workers (Ray / multiprocessing workers, ``--headless``
    data-parallel ranks) are expected silent, and a worker that does log it must agree. ``engine_pod`` names the pod
    whose line counts, ``groups`` (multi-node) the leader and workers of each group and which pod logged the line.
    Returns ``(report, problems)``; problems are the reasons the check failed (empty: passed)."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import engine_log  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as k8s_pods  # pylint: disable=import-outside-toplevel
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    found_flags = flags(obj, presets)
    pools = pools_of(obj, presets)
    multi = {pool: multi_node(obj, pool, presets) for pool in pools}
    mapped = []
    for pool in pools:
        source = _flag_pool(obj, pool, presets, multi[pool])
        mapped += [dict(f, pool=pool) for f in found_flags if f["pool"] == source]
    want = expected_per_pool(mapped, pools, expected)
    report, problems = {}, []
    for pool in pools:
        selector = pod_selector(name, pool, multi_node=multi[pool])
        pods, skipped = k8s_pods.list_pods(api_client, namespace, selector)
        workload = {"kind": LWS_KIND if multi[pool] else "Deployment",
                    "name": lws_name(name, pool) if multi[pool] else deployment_name(name, pool)}
        entry = {"expected": want[pool], "flag": [f["source"] for f in mapped if f["pool"] == pool], "workload": workload,
                 "pods": [], "skipped_pods": [p["name"] for p in skipped], "engine_pod": None, "speculative_config": None,
                 "vllm_version": None, "differences": [], "data_parallel": data_parallel(obj, pool), "not_understood": []}
        report[pool] = entry
        if not pods:
            problems.append("pool %s: no pods (selector %s)" % (pool, selector))
            continue
        entry["pods"] = _read_engine_lines(api_client, namespace, pods, container, timeout)
        for pod in entry["pods"]:
            unknown.add(entry["not_understood"], pod["not_understood"], pod=pod["name"])
        entry["engine_pod"] = rank0_pod(entry["pods"])
        counted = next((p for p in entry["pods"] if p["name"] == entry["engine_pod"]), None)
        if counted:
            entry["speculative_config"] = counted["speculative_config"]
            entry["vllm_version"] = counted["vllm_version"]
        if multi[pool]:
            _check_groups(pool, entry, pods, container, problems)
        else:
            # vLLM 0.24+ with data parallelism: only rank 0 logs the line, so the other pods' silence is expected
            rank0_only = bool(entry["data_parallel"] > 1 and counted and
                              spec_core.parse_version(counted["vllm_version"] or "0") >= (0, 24, 0))
            for pod in entry["pods"]:
                if pod["error"]:
                    problems.append("pool %s pod %s: %s" % (pool, pod["name"], pod["error"]))
                elif not pod["found"] and not rank0_only:
                    problems.append("pool %s pod %s: no engine-config line in container %s" % (pool, pod["name"], container))
        for pod in entry["pods"]:
            if pod["found"]:
                diffs, _notes = engine_log.compare_expected(pod["speculative_config"], want[pool])
                entry["differences"] += ["pod %s: %s" % (pod["name"], d) for d in diffs]
        problems += ["pool %s %s" % (pool, d) for d in entry["differences"]]
    return report, problems


def _check_groups(pool, entry, pods, container, problems):
    """Multi-node: each group's leader must have logged the line; workers may be silent."""
    by_name = {p["name"]: p for p in entry["pods"]}
    entry["groups"] = []
    for group in lws_groups(pods):
        leader = by_name.get(group["leader"]) if group["leader"] else None
        logged = [n for n in ([group["leader"]] if group["leader"] else []) + group["workers"] if by_name[n]["found"]]
        entry["groups"].append(dict(group, engine_pod=group["leader"] if leader and leader["found"] else None, logged_by=logged))
        if leader is None:
            problems.append("pool %s group %s: no leader pod (worker index 0) running" % (pool, group["group"]))
        elif leader["error"]:
            problems.append("pool %s group %s leader pod %s: %s" % (pool, group["group"], leader["name"], leader["error"]))
        elif not leader["found"]:
            problems.append("pool %s group %s leader pod %s: no engine-config line in container %s (the leader runs "
                            "data-parallel rank 0 and the API server)" % (pool, group["group"], leader["name"], container))
        for worker in group["workers"]:
            if by_name[worker]["error"]:
                problems.append("pool %s group %s worker pod %s: %s" % (pool, group["group"], worker, by_name[worker]["error"]))


def lws_rollout_pending(lws, pool="decode"):
    """Why a LeaderWorkerSet (a dict) has not finished rolling out to its current spec, or None.

    From the LWS controller's status (sigs.k8s.io/lws ``updateConditions``): ``observedGeneration`` (newer releases; else
    the conditions' own observedGeneration when set) caught up with metadata.generation; no ``UpdateInProgress=True``;
    ``updatedReplicas`` (groups whose leader and workers run the current revision) and ``readyReplicas`` reach
    spec.replicas, ``replicas`` (groups created) does not exceed it (no surge or leftover group); ``Available=True``.
    Like a Deployment's Available, LWS's Available stays True on the old groups until the controller has seen the edit,
    so the generation check comes first; an LWS release that reports neither generation cannot be told apart from a
    stale status right after an edit (then the counts decide)."""
    meta, spec, status = lws.get("metadata") or {}, lws.get("spec") or {}, lws.get("status") or {}
    name = meta.get("name")
    conds = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    if observed is None:
        seen = [int(c["observedGeneration"]) for c in conds.values() if c.get("observedGeneration")]
        observed = max(seen) if seen else None
    if observed is not None and generation is not None and int(observed) < int(generation):
        return "pool %s: LeaderWorkerSet %s not observed at generation %s yet" % (pool, name, generation)
    want = 1 if spec.get("replicas") is None else int(spec["replicas"])
    updated, ready, total = int(status.get("updatedReplicas") or 0), int(status.get("readyReplicas") or 0), int(status.get("replicas") or 0)
    in_progress = str((conds.get("UpdateInProgress") or {}).get("status")) == "True"
    if in_progress or updated < want or ready < want or total > want:
        return "pool %s: LeaderWorkerSet %s rolling out (%d of %d groups updated, %d ready, %d created%s)" % (
            pool, name, updated, want, ready, total, ", UpdateInProgress" if in_progress else "")
    available = conds.get("Available") or {}
    if str(available.get("status")) != "True":
        return "pool %s: LeaderWorkerSet %s not Available (%s)" % (pool, name, available.get("reason") or "no Available condition yet")
    return None


def rollout_pending(api_client, obj, presets=None):
    """Why the pools' workloads have not finished rolling out to the current spec, or None.

    KServe's controller marks a pool ready from its Deployment's (or, multi-node, its LeaderWorkerSet's) Available
    condition, which stays True on the old pods during a rolling update: Ready at the current generation alone does not
    mean the new pods run. A Deployment is done as `kubectl rollout status` says (observedGeneration caught up, every
    replica updated and available, no old one left); a LeaderWorkerSet as ``lws_rollout_pending`` says."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.client import ApiException  # pylint: disable=import-outside-toplevel
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    for pool in pools_of(obj, presets):
        if multi_node(obj, pool, presets):
            try:
                lws = _custom_api(api_client).get_namespaced_custom_object(
                    LWS_GROUP, LWS_VERSION, namespace, LWS_PLURAL, lws_name(name, pool))
            except ApiException as exc:
                if exc.status == 404:
                    return "pool %s: LeaderWorkerSet %s does not exist yet" % (pool, lws_name(name, pool))
                raise api_error("reading LeaderWorkerSet %s/%s (the pool's rollout)" % (namespace, lws_name(name, pool)), exc,
                                "name") from exc
            why = lws_rollout_pending(lws, pool)
            if why:
                return why
            continue
        dep_name = deployment_name(name, pool)
        try:
            dep = kube_service.service_of(api_client).get(kube_service.DEPLOYMENT, dep_name, namespace, missing="none")
        except ApiException as exc:
            raise api_error("reading Deployment %s/%s (the pool's rollout)" % (namespace, dep_name), exc, "name") from exc
        if dep is None:
            return "pool %s: Deployment %s does not exist yet" % (pool, dep_name)
        why = kube_wait.pending("Deployment", dep)
        if why:
            return "pool %s: %s" % (pool, why)
    return None
