"""Fleet discovery (issue 53) on the real kube-apiserver with KServe's CRDs: 12 InferenceServices in 3 namespaces (4 with
a speculative flag reaching vLLM, each from another place: the service's args, its env through a script, a ServingRuntime,
a ClusterServingRuntime; one more whose flag a `bash -c` runtime never passes on), read by module fleet_speculative_info
in-process with each selector form, as the admin and as a ServiceAccount that RBAC keeps out of the third namespace and
from cluster-wide LISTs. Objects only: no pods, no stand-in (status plays no part).

InferenceServices only: creating the LLMInferenceService CRDs on a test bed that has none took 23-40 s here (their 2 MB
schema); the LLMInferenceService records (presets LISTed per namespace) are tests/unit/test_fleet.py's.

The request counts are the design's (one LIST per namespace, one of the ServingRuntimes per namespace whose services need
a runtime, one of the ClusterServingRuntimes when a service names one), written out here, not read back from the module."""
from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest

from tests.module_run import run_module
from tests.testbed.fixtures import module_namespace

pytestmark = pytest.mark.integration
ROLLBACK_FIELD_MANAGER = "alauda-spec-decoding-rollback"  # kube/ssa_conflicts.py: the rollback's writes carry it

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
FLAG = ["--speculative-config", json.dumps(NGRAM)]
KSERVE = "/apis/serving.kserve.io"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def _runtime(name, namespace=None, args=None, command=None):
    container = {"name": "kserve-container", "image": "vllm/vllm-openai:v0.11.2", "args": ["--port=8080"] + (args or [])}
    if command:
        container["command"] = command
    meta = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime" if namespace else "ClusterServingRuntime",
            "metadata": meta, "spec": {"supportedModelFormats": [{"name": "vLLM", "autoSelect": True}], "containers": [container]}}


def _isvc(name, runtime, labels, args=None, command=None, env=None):
    model = {"modelFormat": {"name": "vLLM"}, "runtime": runtime, "storageUri": "pvc://model-store/llama"}
    for key, value in (("args", args), ("command", command), ("env", env)):
        if value:
            model[key] = value
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": name, "labels": labels},
            "spec": {"predictor": {"model": model}}}


class Fleet:
    """The objects of the module's test: namespaces a, b, c, their services, the expected answer per service."""

    def __init__(self, run, namespaces, csr_spec, csr_script):
        self.run = run
        self.a, self.b, self.c = namespaces
        self.csr_spec, self.csr_script = csr_spec, csr_script
        self.expected = {}  # (namespace, name) -> sources that reach vLLM
        self.restricted = None


@pytest.fixture(scope="module")
def fleet(controlplane):
    run = uuid.uuid4().hex[:6]
    api = controlplane.rest()
    cluster_objects = []
    with module_namespace(controlplane, "fleet-a") as a, module_namespace(controlplane, "fleet-b") as b, \
            module_namespace(controlplane, "fleet-c") as c:
        try:
            out = Fleet(run, (a, b, c), "fleet-spec-%s" % run, "fleet-script-%s" % run)
            for body in (_runtime(out.csr_spec, args=FLAG), _runtime(out.csr_script, command=["bash", "-c", "exec vllm serve /mnt/models"])):
                api.post("%s/v1alpha1/clusterservingruntimes" % KSERVE, body)
                cluster_objects.append("%s/v1alpha1/clusterservingruntimes/%s" % (KSERVE, body["metadata"]["name"]))
            for ns in (a, b, c):
                api.post("%s/v1alpha1/namespaces/%s/servingruntimes" % (KSERVE, ns), _runtime("plain-rt", ns))
            api.post("%s/v1alpha1/namespaces/%s/servingruntimes" % (KSERVE, b), _runtime("spec-rt", b, args=FLAG))
            extra = [{"name": "EXTRA", "value": "--speculative-config '%s'" % json.dumps(NGRAM)}]
            script = ["bash", "-c", "exec vllm serve /mnt/models --port 8080 $EXTRA"]
            services = {
                a: [("isvc-0", "plain-rt", {}, None), ("isvc-1", "plain-rt", {"args": FLAG}, ["inference_service"]),
                    ("isvc-2", "plain-rt", {}, None), ("isvc-3", "plain-rt", {}, None)],
                b: [("isvc-0", "spec-rt", {}, ["serving_runtime"]),
                    ("isvc-1", "plain-rt", {"command": script, "env": extra}, ["inference_service"]),
                    ("isvc-2", "plain-rt", {}, None), ("isvc-3", "plain-rt", {}, None)],
                c: [("isvc-0", out.csr_spec, {}, ["cluster_serving_runtime"]),
                    ("isvc-1", out.csr_script, {"args": FLAG}, None),  # the runtime's script never passes its args on
                    ("isvc-2", "plain-rt", {}, None), ("isvc-3", "plain-rt", {}, None)],
            }
            for ns, items in services.items():
                for i, (name, runtime, fields, sources) in enumerate(items):
                    labels = {"fleet-run": run, "tier": "gold" if i % 2 == 0 else "silver"}
                    api.post("%s/v1beta1/namespaces/%s/inferenceservices" % (KSERVE, ns), _isvc(name, runtime, labels, **fields))
                    out.expected[("InferenceService", ns, name)] = sources or []
            out.restricted = _restricted_reader(controlplane, api, a, (a, b), run, cluster_objects)
            yield out
        finally:
            for path in reversed(cluster_objects):
                api.delete(path)
            api.close()


def _restricted_reader(controlplane, api, home, namespaces, run, cluster_objects):
    """A ServiceAccount that may list the serving objects in ``namespaces`` only and ClusterServingRuntimes, nothing
    cluster-wide (not even namespaces)."""
    account = "fleet-reader"
    reader, runtimes = "fleet-reader-%s" % run, "fleet-csr-%s" % run
    api.post("%s/clusterroles" % RBAC, {"metadata": {"name": reader}, "rules": [{
        "apiGroups": ["serving.kserve.io"], "verbs": ["list"],
        "resources": ["inferenceservices", "servingruntimes"]}]})
    api.post("%s/clusterroles" % RBAC, {"metadata": {"name": runtimes}, "rules": [{
        "apiGroups": ["serving.kserve.io"], "verbs": ["list"], "resources": ["clusterservingruntimes"]}]})
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": home}]
    api.post("%s/clusterrolebindings" % RBAC, {"metadata": {"name": runtimes}, "subjects": subject,
                                               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": runtimes}})
    cluster_objects.extend("%s/%s/%s" % (RBAC, plural, name) for plural, name in
                           (("clusterroles", reader), ("clusterroles", runtimes), ("clusterrolebindings", runtimes)))
    for ns in namespaces:
        api.post("%s/namespaces/%s/rolebindings" % (RBAC, ns), {"metadata": {"name": reader}, "subjects": subject,
                                                                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader}})
    return controlplane.kubeconfig_for_service_account(home, account)


def _judged(result):
    return {(r["kind"], r["namespace"], r["name"]): r["sources"] for r in result["services"] if r["found"]}


def _run(kubeconfig, fleet, **args):
    result = run_module("fleet_speculative_info", dict(args, kubeconfig=kubeconfig, kinds=["InferenceService"]))
    assert not result.failed, result
    assert all(r["error"] is None for r in result["services"] if r["found"]), result["services"]
    return result


def test_namespace_list_reads_every_service_with_a_list_per_namespace(kubeconfig, fleet):
    result = _run(kubeconfig, fleet, namespaces=[fleet.a, fleet.b, fleet.c])
    assert _judged(result) == fleet.expected
    by = {(r["namespace"], r["name"]): r for r in result["services"]}
    assert by[(fleet.c, "isvc-0")]["runtime"] == {"kind": "ClusterServingRuntime", "name": fleet.csr_spec}
    assert by[(fleet.b, "isvc-1")]["where"][0]["field"] == "env" and by[(fleet.b, "isvc-1")]["speculative_config"] is None
    assert by[(fleet.a, "isvc-1")]["speculative_config"] == NGRAM
    assert [w["reaches_engine"] for w in by[(fleet.c, "isvc-1")]["where"]] == [False]
    totals = result["totals"]
    assert (totals["services"], totals["with_flag"], totals["without_flag"], totals["errors"]) == (12, 4, 8, 0)
    # 3 namespaces x (InferenceServices, ServingRuntimes), the ClusterServingRuntimes once (c's services name two)
    assert totals["api_requests_by"] == {"LIST inferenceservices": 3, "LIST servingruntimes": 3, "LIST clusterservingruntimes": 1}
    assert totals["api_requests"] == 7 and totals["api_requests_per_service"] < 1


def test_all_namespaces_is_one_cluster_wide_list_per_kind(kubeconfig, fleet):
    result = _run(kubeconfig, fleet, all_namespaces=True, label_selector="fleet-run=%s" % fleet.run)
    assert _judged(result) == fleet.expected
    assert result["totals"]["api_requests_by"] == {"LIST inferenceservices": 1, "LIST servingruntimes": 3, "LIST clusterservingruntimes": 1}
    assert result["forbidden"] == []


def test_label_selector_and_names(kubeconfig, fleet):
    gold = _run(kubeconfig, fleet, namespaces=[fleet.a, fleet.b, fleet.c], label_selector="tier=gold")
    assert sorted(_judged(gold)) == sorted(k for k in fleet.expected if k[0] == "InferenceService" and k[2] in ("isvc-0", "isvc-2"))
    named = _run(kubeconfig, fleet, names=["%s/isvc-1" % fleet.a, "%s/isvc-0" % fleet.c, {"namespace": fleet.c, "name": "nope"}],
                 )
    assert _judged(named) == {k: v for k, v in fleet.expected.items() if k[1:] in ((fleet.a, "isvc-1"), (fleet.c, "isvc-0"))}
    missing = [r for r in named["services"] if not r["found"]]
    assert [(r["namespace"], r["name"]) for r in missing] == [(fleet.c, "nope")]
    assert named["totals"]["api_requests_by"]["LIST inferenceservices"] == 2  # one per namespace, not one per name


def test_forbidden_namespace_is_reported_and_the_others_are_read(fleet):
    result = _run(fleet.restricted, fleet, namespaces=[fleet.a, fleet.b, fleet.c])
    assert _judged(result) == {k: v for k, v in fleet.expected.items() if k[1] != fleet.c}
    assert result["totals"]["forbidden_namespaces"] == [fleet.c]
    assert [(f["kind"], f["namespace"], f["status"]) for f in result["forbidden"]] == [("InferenceService", fleet.c, 403)]
    assert "forbidden" in result["forbidden"][0]["message"].lower()
    # a and b's services name namespaced runtimes: no service left needs the ClusterServingRuntimes, so they are not listed
    assert result["totals"]["api_requests_by"] == {"LIST inferenceservices": 3, "LIST servingruntimes": 2}
    named = _run(fleet.restricted, fleet, names=["%s/isvc-0" % fleet.c])
    assert [r["error"] for r in named["services"]] == ["not readable: the namespace refused the LIST"]
    # nothing cluster-wide: the cluster-wide LIST and the namespaces' are both refused, and the module says what to grant
    refused = run_module("fleet_speculative_info", {"kubeconfig": fleet.restricted, "all_namespaces": True, "kinds": ["InferenceService"]})
    assert refused.failed and refused["field"] == "all_namespaces" and "pass namespaces" in refused["fix"], refused


def test_rollback_role_over_the_fleet_writes_only_where_a_flag_reaches_vllm(tmp_path, kubeconfig, controlplane, fleet):
    """playbooks/rollback.yml over namespaces a and c by label (8 services): one discovery, the per-service run for the two
    whose flag reaches vLLM (a/isvc-1's own args; c/isvc-0's ClusterServingRuntime, given a runtime copy), none for the
    others - c/isvc-1's flag is in args its runtime's script never passes on. No pods here: no wait, no proof.
    Last in this file: it changes the module's fleet."""
    from tests.ansible_run import run_playbook  # pylint: disable=import-outside-toplevel
    api = controlplane.rest()
    path = "%s/v1beta1/namespaces/%%s/inferenceservices/%%s" % KSERVE
    selected = [(ns, "isvc-%d" % i) for ns in (fleet.a, fleet.c) for i in range(4)]
    try:
        before = {key: api.request("GET", path % key) for key in selected}
        run = run_playbook(tmp_path, "playbooks/rollback.yml", kubeconfig=kubeconfig, extra_vars={
            "rollback_names": [], "rollback_namespaces": [fleet.a, fleet.c], "rollback_label_selector": "fleet-run=%s" % fleet.run,
            "rollback_runtime_copy": True, "rollback_wait": False, "rollback_verify": False})
        assert run.rc == 0, run.output
        after = {key: api.request("GET", path % key) for key in selected}
    finally:
        api.close()
    flagged = [(fleet.a, "isvc-1"), (fleet.c, "isvc-0")]
    strips = [name.split(" : ", 1)[-1] for name, _h, _r in run.tasks if "Strip the speculative config from" in name]
    assert sorted(strips) == sorted("Strip the speculative config from %s/%s" % key for key in flagged), strips
    assert "--speculative-config" not in json.dumps(after[(fleet.a, "isvc-1")]["spec"])
    assert after[(fleet.c, "isvc-0")]["spec"]["predictor"]["model"]["runtime"] != fleet.csr_spec
    for key in selected:
        if key not in flagged:
            # not written by the rollback: the same spec and generation, and no field of it owned by the rollback's field
            # manager (the resourceVersion may move: the tier's KServe stand-in writes the status of every InferenceService)
            assert after[key]["spec"] == before[key]["spec"], key
            assert after[key]["metadata"]["generation"] == before[key]["metadata"]["generation"], key
            managers = [entry.get("manager") for entry in after[key]["metadata"].get("managedFields") or []]
            assert ROLLBACK_FIELD_MANAGER not in managers, (key, managers)
    assert ROLLBACK_FIELD_MANAGER in [entry.get("manager") for entry in after[(fleet.a, "isvc-1")]["metadata"]["managedFields"]]
    assert "--speculative-config" in json.dumps(after[(fleet.c, "isvc-1")]["spec"])

    report = run.result("Record per service what was found and done")["ansible_facts"]["rollback_fleet"]
    totals = report["totals"]
    assert (totals["selected"], totals["with_flag"], totals["rolled_back"], totals["skipped_without_flag"]) == (8, 2, 2, 6), totals
    assert totals["forbidden_namespaces"] == [] and totals["undecided"] == 0
    # a LIST of each namespace's InferenceServices and ServingRuntimes, one of the ClusterServingRuntimes: 5 for 8 services
    assert totals["api_requests_to_find"] == 5
    done = {s["service"]: s["done"] for s in report["services"]}
    assert done == {"%s/%s" % key: "rolled_back" if key in flagged else "skipped_without_flag" for key in selected}
    summary = run.result("Summary")["msg"]
    assert summary[0].startswith("8 InferenceService(s) selected; rolled back: %s/isvc-1, %s/isvc-0; already without speculative "
                                 "decoding: %s/isvc-0, " % (fleet.a, fleet.c, fleet.a)), summary
    assert summary[0].endswith("totals: 8 selected, 2 with a flag, 2 rolled back, 6 without a flag (not written), 0 failed, "
                               "0 left for a rerun, 0 forbidden namespace(s), 5 API request(s) to find them"), summary
    assert (totals["failed"], totals["not_run"], totals["acted_on"]) == (0, 0, 2)


# --------------------------------------------------------------------------------------------------
# Several clusters and the faults (issue 53): one rollback.yml run over three inventory hosts, one per cluster
# --------------------------------------------------------------------------------------------------

def _cpu_seconds(pids):
    """CPU seconds (user + system) the processes ``pids`` have used so far (/proc/<pid>/stat)."""
    total = 0.0
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _by_host(run, fragment):
    """The result per host of the last task named like ``fragment``."""
    out = {}
    for name, host, result in run.tasks:
        if fragment in name:
            out[host] = result
    return out


def _container_isvc(name, labels, args):
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": name, "labels": labels},
            "spec": {"predictor": {"containers": [{"name": "kserve-container", "image": "vllm/vllm-openai:v0.11.2",
                                                   "args": ["--model", "/mnt/models"] + args}]}}}


# The second API server's InferenceService CRD: KServe's group, kind and status subresource, its schema left open (KServe's
# 0.7 MB schema took 7-20 s to install here; what this test runs there is the rollback's wiring, which the session's API
# server, with KServe's own CRDs, runs too).
SECOND_CLUSTER_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "inferenceservices.serving.kserve.io"},
    "spec": {"group": "serving.kserve.io", "scope": "Namespaced",
             "names": {"kind": "InferenceService", "listKind": "InferenceServiceList", "plural": "inferenceservices",
                       "singular": "inferenceservice", "shortNames": ["isvc"]},
             "versions": [{"name": "v1beta1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def _second_cluster(k8s_binaries, crd_dir, run):
    """A second API server (no controller manager, no stand-in: status is what this test writes) with an InferenceService
    CRD and namespace fleet-two: t0 and t2 with the flag, Ready at their generation; t1 with the flag in a rollout
    (generation 2, observedGeneration 1); t3 without it."""
    from tests.testbed.controlplane import ControlPlane  # pylint: disable=import-outside-toplevel
    cp2 = ControlPlane(bin_dir=k8s_binaries, controller_manager=False).start()
    try:
        crd_dir.mkdir()
        (crd_dir / "isvc.json").write_text(json.dumps(SECOND_CLUSTER_CRD))
        cp2.install_crds(str(crd_dir), files=["isvc.json"])
        api = cp2.rest()
        try:
            api.post("/api/v1/namespaces", {"metadata": {"name": "fleet-two"}})
            path = "%s/v1beta1/namespaces/fleet-two/inferenceservices" % KSERVE
            for name, args in (("t0", FLAG), ("t1", FLAG), ("t2", FLAG), ("t3", [])):
                api.post(path, _container_isvc(name, {"fleet-run": run}, args))
                if name == "t1":  # a newer spec than KServe has reconciled: generation 2
                    api.patch("%s/%s" % (path, name), {"spec": {"predictor": {"minReplicas": 1}}})
                generation = api.get("%s/%s" % (path, name))["metadata"]["generation"]
                api.patch("%s/%s/status" % (path, name), {"status": {
                    "observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}})
                assert (name, generation) in (("t1", 2), (name, 1))
        finally:
            api.close()
    except BaseException:
        cp2.stop()
        raise
    return cp2


def _main_cluster_account(controlplane, api, d, run):
    """A ServiceAccount that may read and patch InferenceServices and read ServingRuntimes in ``d`` only: the other listed
    namespace refuses its LIST (the forbidden-namespace fault)."""
    role = "fleet-roller-%s" % run
    api.post("%s/namespaces/%s/roles" % (RBAC, d), {"metadata": {"name": role}, "rules": [
        {"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["serving.kserve.io"], "resources": ["servingruntimes"], "verbs": ["get", "list"]}]})
    api.post("%s/namespaces/%s/rolebindings" % (RBAC, d), {"metadata": {"name": role}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "fleet-roller", "namespace": d}]})
    return controlplane.kubeconfig_for_service_account(d, "fleet-roller")


def test_rollback_over_three_clusters_goes_on_past_a_failing_service_a_forbidden_namespace_and_api_servers_that_are_down(
        tmp_path, controlplane, k8s_binaries):
    """rollback.yml over an inventory of one host per cluster (rollback_serial 2, rollback_cluster_max_fail_percentage 50):
    batch 1 is `down` (an API server nobody listens on) and `main` (the session's API server, as an account that may not
    list namespace e); batch 2 is `two` (a second API server, stopped by this test once the first strip landed).

    * down: its host fails at the end, naming the cluster and the address; nothing else stops for it.
    * main: d/s1's flag comes from its ServingRuntime (refused without runtime_copy): recorded as failed, with the
      refusal; d/s0 and d/s2 rolled back; e is named as forbidden and its service keeps its flag; the budget of 100 lets
      the host pass, so 1 of 2 hosts of batch 1 failed (50%, not over the cluster budget) and batch 2 runs.
    * two: t0's strip is written, then its API server stops during the wait: the host fails naming that API server, t1
      (mid-rollout: reported with its generations) and t2 are left for a rerun. The rerun, once the server is back, finds
      t0 stripped but not Ready (its wait and proof again, no write), strips t1 and t2, and passes."""
    from tests.ansible_run import run_playbook  # pylint: disable=import-outside-toplevel
    from tests.testbed.controlplane import free_port  # pylint: disable=import-outside-toplevel
    run = uuid.uuid4().hex[:6]
    api = controlplane.rest()
    t_start = time.monotonic()
    cp2 = _second_cluster(k8s_binaries, tmp_path / "crds", run)
    phases = {"second API server with the CRD and 4 services": time.monotonic() - t_start}
    try:
        with module_namespace(controlplane, "fleet-d") as d, module_namespace(controlplane, "fleet-e") as e:
            labels = {"fleet-run": run}
            api.post("%s/v1alpha1/namespaces/%s/servingruntimes" % (KSERVE, d), _runtime("plain-rt", d))
            api.post("%s/v1alpha1/namespaces/%s/servingruntimes" % (KSERVE, d), _runtime("spec-rt", d, args=FLAG))
            for ns, name, runtime, args in ((d, "s0", "plain-rt", FLAG), (d, "s1", "spec-rt", None), (d, "s2", "plain-rt", FLAG),
                                            (d, "s3", "plain-rt", None), (e, "s0", "plain-rt", FLAG)):
                api.post("%s/v1beta1/namespaces/%s/inferenceservices" % (KSERVE, ns), _isvc(name, runtime, labels, args=args))
            account = _main_cluster_account(controlplane, api, d, run)
            dead = tmp_path / "down.kubeconfig"
            dead_port = free_port()
            dead.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "down",
                                        "clusters": [{"name": "down", "cluster": {"server": "https://127.0.0.1:%d" % dead_port,
                                                                                  "insecure-skip-tls-verify": True}}],
                                        "users": [{"name": "u", "user": {"token": "t"}}],
                                        "contexts": [{"name": "down", "context": {"cluster": "down", "user": "u"}}]}))
            inventory = tmp_path / "clusters.yml"
            inventory.write_text(json.dumps({"all": {
                "vars": {"rollback_names": [], "rollback_label_selector": "fleet-run=%s" % run, "rollback_wait": False,
                         "rollback_verify": False},
                "children": {
                    "cluster_down": {"hosts": {"down": {"spec_decoding_kubeconfig": str(dead)}}},
                    "cluster_main": {"hosts": {"main": {"spec_decoding_kubeconfig": account, "rollback_namespaces": [d, e],
                                                        "rollback_max_fail_percentage": 100}}},
                    "cluster_two": {"hosts": {"two": {"spec_decoding_kubeconfig": cp2.kubeconfig, "rollback_namespaces": ["fleet-two"],
                                                      "rollback_wait": True, "rollback_wait_timeout": 5, "rollback_wait_sleep": 1}}}}}}))
            t0_path = "%s/v1beta1/namespaces/fleet-two/inferenceservices/t0" % KSERVE
            api2 = cp2.rest()
            outcome = {}

            def play():
                outcome["run"] = run_playbook(tmp_path, "playbooks/rollback.yml", inventory=str(inventory), extra_vars={
                    "rollback_hosts": "all", "rollback_serial": 2, "rollback_cluster_max_fail_percentage": 50})

            thread = threading.Thread(target=play)
            thread.start()
            try:
                deadline = time.monotonic() + 240
                while "--speculative-config" in json.dumps(api2.get(t0_path)["spec"]):
                    assert thread.is_alive() and time.monotonic() < deadline, "t0 was never stripped: %s" % (
                        outcome.get("run") and outcome["run"].output)
                    time.sleep(0.05)
            finally:
                api2.close()
            cp2_cpu = _cpu_seconds(cp2.pids())
            cp2.stop_apiserver()  # mid-run: t0 written, its wait under way, t1 and t2 not yet
            thread.join(240)
            first = outcome["run"]
            phases["rollback.yml over the three clusters"] = first.wall
            phases["the run's CPU"] = first.cpu
            assert first.rc != 0, first.output
            verdicts = _by_host(first, "Fail when the cluster's rollback failed")
            assert verdicts["down"]["msg"].startswith("cluster down: not rolled back, its services could not be read: kubeconfig: "
                                                      "the API server 127.0.0.1:%d did not answer" % dead_port), verdicts["down"]
            assert verdicts["main"].get("skipped"), verdicts["main"]
            assert verdicts["two"]["msg"].startswith("cluster two (API server %s) stopped answering during the run (" % cp2.server), verdicts
            assert "0 rolled back, 3 left (fleet-two/t0, fleet-two/t1, fleet-two/t2)" in verdicts["two"]["msg"], verdicts["two"]

            facts = _by_host(first, "Record per service what was found and done")
            main = facts["main"]["ansible_facts"]["rollback_fleet"]
            done = {s["service"]: s["done"] for s in main["services"]}
            assert done == {"%s/s0" % d: "rolled_back", "%s/s1" % d: "failed", "%s/s2" % d: "rolled_back",
                            "%s/s3" % d: "skipped_without_flag"}, done
            error = [s["error"] for s in main["services"] if s["done"] == "failed"][0]
            assert error["task"].endswith("Strip the speculative config from %s/s1" % d), error
            assert "gets --speculative-config from the ServingRuntime spec-rt" in error["message"] and "runtime_copy" in error["message"]
            assert not error["unreachable"]
            assert (main["totals"]["failed"], main["totals"]["acted_on"], main["totals"]["forbidden_namespaces"]) == (1, 3, [e])
            summary = _by_host(first, "Summary")["main"]["msg"]
            assert any(line.startswith("%s: not read, its services were not rolled back (" % e) for line in summary), summary
            assert any(line.startswith('%s/s1: failed at "' % d) for line in summary), summary

            two = facts["two"]["ansible_facts"]["rollback_fleet"]
            done = {s["service"]: s["done"] for s in two["services"]}
            assert done == {"fleet-two/t0": "failed", "fleet-two/t1": "not_run", "fleet-two/t2": "not_run",
                            "fleet-two/t3": "skipped_without_flag"}, done
            t0_error = [s["error"] for s in two["services"] if s["done"] == "failed"][0]
            assert t0_error["unreachable"] and "cannot reach the API server" in t0_error["message"], t0_error
            rollout = {s["service"]: s["rollout"] for s in two["services"] if s["rollout"]}
            assert list(rollout) == ["fleet-two/t1"] and (rollout["fleet-two/t1"]["generation"],
                                                          rollout["fleet-two/t1"]["observed_generation"]) == (2, 1), rollout

            after = {}
            for ns, name in ((d, "s0"), (d, "s1"), (d, "s2"), (e, "s0")):
                after[(ns, name)] = json.dumps(api.get("%s/v1beta1/namespaces/%s/inferenceservices/%s" % (KSERVE, ns, name))["spec"])
            assert ["--speculative-config" in after[k] for k in ((d, "s0"), (d, "s2"), (e, "s0"))] == [False, False, True]
            assert "--speculative-config" not in after[(d, "s1")]  # its flag is in the runtime, which nothing edited
            assert "--speculative-config" in json.dumps(api.get("%s/v1alpha1/namespaces/%s/servingruntimes/spec-rt" % (KSERVE, d)))

            t_restart = time.monotonic()
            cp2.start_apiserver()
            phases["the second API server started again"] = time.monotonic() - t_restart
            api2 = cp2.rest()
            try:
                t0_generation = api2.get(t0_path)["metadata"]["generation"]
                rerun = run_playbook(tmp_path, "playbooks/rollback.yml", inventory=str(inventory), extra_vars={
                    "rollback_hosts": "two", "rollback_wait": False})
                phases["the rerun on the cluster that was down"] = rerun.wall
                phases["the rerun's CPU"] = rerun.cpu
                phases["the second API server's CPU (etcd, kube-apiserver before and after its stop)"] = cp2_cpu + _cpu_seconds(cp2.pids())
                assert rerun.rc == 0, rerun.output
                report = rerun.result("Record per service what was found and done")["ansible_facts"]["rollback_fleet"]
                by = {s["service"]: s for s in report["services"]}
                assert {k: v["done"] for k, v in by.items()} == {
                    "fleet-two/t0": "unchanged", "fleet-two/t1": "rolled_back", "fleet-two/t2": "rolled_back",
                    "fleet-two/t3": "skipped_without_flag"}, by
                assert by["fleet-two/t0"]["why"].startswith("stripped by an earlier rollback and not Ready at its generation yet")
                assert by["fleet-two/t1"]["rollout"]["observed_generation"] == 1
                assert api2.get(t0_path)["metadata"]["generation"] == t0_generation  # not written again
                for name in ("t1", "t2"):
                    assert "--speculative-config" not in json.dumps(api2.get(t0_path.replace("/t0", "/" + name))["spec"])
            finally:
                api2.close()
    finally:
        api.close()
        cp2.stop()
        print("fleet over clusters, seconds: %s (load average %.1f)" % (", ".join("%s %.1f" % item for item in phases.items()),
                                                                        os.getloadavg()[0]))


# --------------------------------------------------------------------------------------------------
# The mid-rollout fault with the wait on (issue 53): the rollback waits for the generation its strip made, not the one
# that was rolling out, and proves it on the pods of that generation
# --------------------------------------------------------------------------------------------------

# How long after m0's strip KServe's controller (the stand-in) gets to it again: the wait sees Ready at the old generation
# meanwhile.
HELD_S = 0.5


def test_rollback_waits_for_the_generation_it_wrote_when_a_service_is_mid_rollout(kubeconfig, controlplane, kserve, namespace, monkeypatch):
    """Three services on the session's test bed (KServe stand-in, the kubelet stand-in's pods logging vLLM 0.32's engine
    lines: ngram for the generations that carry the flag, the baseline's after): m0 and m1 with the flag, m2 without.
    m0 is mid-rollout when the discovery reads it: its spec was edited (generation 2) while KServe's controller has not
    got to it (the stand-in holds its reconcile of m0: status still Ready at observedGeneration 1, the generation-1 pods
    running). The rollback's modules then run in this process as the role runs them (fleet_speculative_info, the plan,
    isvc_speculative with wait: true and engine_config_info per target; the role's wiring is the playbook tests' above):

    * m0: the strip makes generation 3 while the status still says Ready at generation 1; the wait does not take that, it
      returns only once KServe reconciled generation 3 (released HELD_S after the strip landed) and its pods are Ready, and
      the engine line of generation 3's pods proves speculative_config=None; the rollout's own edit is kept.
    * m1 rolled back and proven; m2 not written (same spec and generation, no field of the rollback's manager).
    * the report: m0 mid-rollout with its generations, 2 rolled back, 1 without a flag, nothing failed or left."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet_rollback  # pylint: disable=import-outside-toplevel
    from tests.paths import read_capture  # pylint: disable=import-outside-toplevel
    started = time.monotonic()
    api = controlplane.rest()
    base = "%s/v1beta1/namespaces/%s/inferenceservices" % (KSERVE, namespace)
    run = uuid.uuid4().hex[:6]
    hold, stop = threading.Event(), threading.Event()
    real_reconcile = kserve.reconcile

    def reconcile(rest, isvc):
        meta = isvc["metadata"]
        if hold.is_set() and (meta["namespace"], meta["name"]) == (namespace, "m0"):
            return  # KServe's controller has not got to m0 yet: its status stays as it was
        real_reconcile(rest, isvc)

    monkeypatch.setattr(kserve, "reconcile", reconcile)
    timings = {}
    ngram_line, baseline_line = read_capture("ngram", "startup.log"), read_capture("baseline", "startup.log")
    try:
        api.post("%s/v1alpha1/namespaces/%s/servingruntimes" % (KSERVE, namespace), _runtime("plain-rt", namespace))
        for name, args in (("m0", FLAG), ("m1", FLAG), ("m2", None)):
            kserve.set_behaviour(namespace, name, ready_after=0.3, log_text=baseline_line)
            # the generations that carry the flag log the ngram engine line: the first, and m0's rollout (its second)
            for generation in (1, 2) if name == "m0" else (1,) if args else ():
                kserve.set_behaviour(namespace, name, ready_after=0.3, log_text=ngram_line, generation=generation)
            api.post(base, _isvc(name, "plain-rt", {"fleet-run": run}, args=args))
        # m0 serves at its first generation before its rollout starts (m1's wait and m2's reads need nothing of the kind)
        deadline = time.monotonic() + 30
        while not _ready_at_generation(api.get("%s/m0" % base)):
            assert time.monotonic() < deadline, api.get("%s/m0" % base).get("status")
            time.sleep(0.1)
        before = {name: api.get("%s/%s" % (base, name)) for name in ("m0", "m1", "m2")}
        timings["ready"] = time.monotonic() - started
        hold.set()
        rollout_env = [{"name": "ROLLOUT", "value": "2"}]
        api.patch("%s/m0" % base, {"spec": {"predictor": {"model": {"env": rollout_env}}}})
        rolling = api.get("%s/m0" % base)
        assert (rolling["metadata"]["generation"], rolling["status"]["observedGeneration"]) == (2, 1), rolling["status"]

        discovery = run_module("fleet_speculative_info", {"kubeconfig": kubeconfig, "namespaces": [namespace],
                                                          "label_selector": "fleet-run=%s" % run, "kinds": ["InferenceService"]})
        assert not discovery.failed, discovery
        the_plan = fleet_rollback.plan(discovery)
        assert [(t["namespace"], t["name"]) for t in the_plan["targets"]] == [(namespace, "m0"), (namespace, "m1")]
        assert the_plan["without_flag"] == ["%s/m2" % namespace]

        def release_after_the_strip():
            """KServe gets to m0 again HELD_S after the strip's generation 3 is written (the wait meanwhile sees Ready at 1)."""
            watcher = controlplane.rest()
            try:
                limit = time.monotonic() + 30
                while watcher.get("%s/m0" % base)["metadata"]["generation"] < 3 and time.monotonic() < limit and not stop.is_set():
                    time.sleep(0.05)
                stop.wait(HELD_S)
            finally:
                watcher.close()
                hold.clear()
                kserve.wake()

        releaser = threading.Thread(target=release_after_the_strip, daemon=True)
        releaser.start()
        timings["discovery"] = time.monotonic() - started
        results = []
        for target in the_plan["targets"]:
            t_strip = time.monotonic()
            strip = run_module("isvc_speculative", {
                "kubeconfig": kubeconfig, "name": target["name"], "namespace": target["namespace"], "state": "absent",
                "wait": True, "wait_timeout": 30, "wait_sleep": 1})
            timings[target["name"]] = time.monotonic() - t_strip
            assert not strip.failed, strip
            if target["name"] == "m0":
                releaser.join(5)
            proof = None
            for _attempt in range(20):  # the role's rollback_verify_retries: a pod of the old generation still terminating
                proof = run_module("engine_config_info", {"kubeconfig": kubeconfig, "name": target["name"],
                                                          "namespace": target["namespace"], "expected": {"enabled": False}})
                if not proof.failed:
                    break
                time.sleep(0.2)
            assert not proof.failed, proof
            timings[target["name"] + " proven"] = time.monotonic() - t_strip
            results.append({"isvc": fleet_rollback.service_key(target), "changed": strip["changed"], "strip": strip, "proof": proof,
                            "generation": strip["resource"]["metadata"]["generation"], "verified": True})
        after = {name: api.get("%s/%s" % (base, name)) for name in ("m0", "m1", "m2")}
        pods = api.get("/api/v1/namespaces/%s/pods" % namespace)["items"]
    finally:
        stop.set()
        hold.clear()
        api.close()

    by = {r["isvc"].split("/", 1)[1]: r for r in results}
    m0 = by["m0"]
    # the wait returned for the generation the strip wrote, Ready there, and not before KServe reconciled it
    # (a wait that took the status as it was during the hold would have returned it at observedGeneration 1)
    waited = m0["strip"]["resource"]
    assert (waited["metadata"]["generation"], waited["status"]["observedGeneration"]) == (3, 3), waited["status"]
    assert [c["status"] for c in waited["status"]["conditions"] if c["type"] == "Ready"] == ["True"], waited["status"]
    assert m0["strip"]["ready"]["generation"] == 3 and after["m0"]["status"]["observedGeneration"] == 3, m0["strip"]["ready"]
    assert timings["m0"] >= HELD_S, "the wait took the Ready of generation 1 for the rollback's: %.2f s" % timings["m0"]
    assert m0["strip"]["previous_config"] == NGRAM and m0["strip"]["config"] is None
    # proven on generation 3's pods only: the baseline engine line, speculative_config=None
    proven = m0["proof"]["pods"]
    assert proven and all(p["found"] for p in proven), proven
    generations = {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get("testbed.alauda.io/isvc-generation") for p in pods}
    assert {generations[p["name"]] for p in proven} == {"3"}, (proven, generations)
    assert m0["proof"]["speculative_config"] is None and "speculative_config=None" in m0["proof"]["line"]
    # nothing half-written: the flag gone from both, the rollout's own edit kept, the backup there; m2 untouched
    for name in ("m0", "m1"):
        assert "--speculative-config" not in json.dumps(after[name]["spec"]), name
        assert "spec-decoding.alauda.io/previous-speculative-config" in after[name]["metadata"]["annotations"], name
    assert after["m0"]["spec"]["predictor"]["model"]["env"] == rollout_env
    assert by["m1"]["strip"]["ready"]["generation"] == 2 and by["m1"]["proof"]["speculative_config"] is None
    assert after["m2"]["spec"] == before["m2"]["spec"]
    assert after["m2"]["metadata"]["generation"] == before["m2"]["metadata"]["generation"] == 1
    assert ROLLBACK_FIELD_MANAGER not in [e.get("manager") for e in after["m2"]["metadata"].get("managedFields") or []]

    report = fleet_rollback.report(the_plan, results)
    done = {s["service"]: (s["done"], s["rollout"] and (s["rollout"]["generation"], s["rollout"]["observed_generation"]))
            for s in report["services"]}
    assert done == {"%s/m0" % namespace: ("rolled_back", (2, 1)), "%s/m1" % namespace: ("rolled_back", None),
                    "%s/m2" % namespace: ("skipped_without_flag", None)}, done
    totals = report["totals"]
    assert (totals["rolled_back"], totals["skipped_without_flag"], totals["mid_rollout"], totals["failed"], totals["not_run"]) == \
        (2, 1, 1, 0, 0), totals
    print("mid-rollout rollback with the wait: %s; %.1f s in all" % (
        ", ".join("%s %.2f s" % item for item in timings.items()), time.monotonic() - started))


def _ready_at_generation(isvc):
    status = isvc.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return bool(ready) and ready[0].get("status") == "True" and status.get("observedGeneration") == isvc["metadata"]["generation"]
