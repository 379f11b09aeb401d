"""The collection's cluster modules answer alike in the task's own process (their action plugins, over a local
connection) and as module processes (a task `environment` sends them there), on the test bed: the same results, the
same refusals with field and fix, the same check-mode diff and no change. kserve_info has its own such test
(test_kserve_facts.py); plugin_utils/controller_module.py says when each path runs."""
from __future__ import annotations

import yaml

from tests.ansible_run import run_playbook
from tests.integration.test_rollback import GROUP, NAME, PLURAL, VERSION, _api, _capture, _get, _manifest, _wait_ready

# task label: (module, its arguments); {ns} is the test's namespace
TASKS = {
    "wait": ("isvc_wait", {"name": NAME, "namespace": "{ns}", "timeout": 30, "interval": 1}),
    "wait_refused": ("isvc_wait", {"name": "absent", "namespace": "{ns}", "timeout": 1, "interval": 1}),
    # object_info is kubernetes.core.k8s_info's own code (compared with that module below)
    "object_read": ("object_info", {"api_version": "%s/%s" % (GROUP, VERSION), "kind": "InferenceService", "name": NAME, "namespace": "{ns}"}),
    "object_unknown": ("object_info", {"api_version": "v1", "kind": "NoSuchKind", "namespace": "{ns}"}),
    # object_state is kubernetes.core.k8s's own code; in check mode (a server-side dry run) nothing is stored
    "object_write": ("object_state", {"state": "present", "apply": True, "definition": {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cmp-test", "namespace": "{ns}"}, "data": {"a": "1"}}}),
    "engine": ("engine_config_info", {"name": NAME, "namespace": "{ns}", "timeout": 30}),
    "runtime": ("serving_runtime_info", {"namespace": "{ns}", "inference_service": "{{{{ wait_in_process.resource }}}}",
                                         "missing_runtime": "warn"}),
    "strip_check": ("isvc_speculative", {"name": NAME, "namespace": "{ns}", "state": "absent", "wait": False}),
    "both_sources": ("isvc_speculative", {"name": NAME, "namespace": "{ns}", "config": {"method": "ngram"},
                                          "restore_backup": True}),
}
# what differs between two runs of the same read (time spent waiting)
VOLATILE = ("invocation", "elapsed")


def _comparable(result):
    """The result without what two runs of the same task never share: the time waited, and the time a server-side dry
    run stamps on its managedFields entry (in the object returned and in the diff's after)."""
    def scrub(value):
        if isinstance(value, dict):
            return {k: (scrub([{f: x for f, x in e.items() if f != "time"} for e in v]) if k == "managedFields" else scrub(v))
                    for k, v in value.items()}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        return value
    return scrub({k: v for k, v in result.items() if k not in VOLATILE})


def _formatted(args, namespace):
    """The task's arguments with {ns} filled in, also inside a definition."""
    if isinstance(args, dict):
        return {k: _formatted(v, namespace) for k, v in args.items()}
    return args.format(ns=namespace) if isinstance(args, str) else args


def _config_map_data(k8s_client, namespace, name, create=None):
    """The ConfigMap's data (created with `create` first when given)."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    core = client.CoreV1Api(k8s_client)
    if create is not None:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name}, "data": create})
    return core.read_namespaced_config_map(name, namespace).data


def _applies(namespace):
    """server_side_apply in check mode: a new annotation (no conflict, a dry-run answer) and a changed replica count,
    which the creator of the object owns (a conflict, refused without force_conflicts)."""
    annotated = _manifest("guide_example2_eagle3.yaml", namespace)
    annotated["metadata"]["annotations"]["example.com/owner"] = "team-a"
    scaled = _manifest("guide_example2_eagle3.yaml", namespace)
    scaled["spec"]["predictor"]["minReplicas"] = 3
    return {"apply_check": ("server_side_apply", {"definition": annotated, "field_manager": "cmp-test"}),
            "apply_conflict": ("server_side_apply", {"definition": scaled, "field_manager": "cmp-test"})}


def test_cluster_modules_answer_alike_in_the_task_process_and_as_modules(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    kserve.set_behaviour(namespace, NAME, ready_after=0.3, log_text=_capture("eagle3"), generation=1)
    _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _manifest("guide_example2_eagle3.yaml", namespace))
    before = _wait_ready(k8s_client, namespace)
    _config_map_data(k8s_client, namespace, "cmp-test", create={"a": "0"})
    tasks = []
    cases = dict(TASKS, **_applies(namespace))
    for label, (module, args) in cases.items():
        for where in ("in_process", "as_module"):
            task = {"name": "%s_%s" % (label, where), "register": "%s_%s" % (label, where), "ignore_errors": True,
                    "alauda.spec_decoding." + module: _formatted(args, namespace)}
            if label in ("strip_check", "apply_check", "apply_conflict", "object_write"):
                task.update(check_mode=True, diff=True)
            if where == "as_module":
                task["environment"] = {"SPEC_DECODING_TEST_MODULE_PROCESS": "1"}
            tasks.append(task)
        if module in ("object_info", "object_state"):
            core = "kubernetes.core.k8s_info" if module == "object_info" else "kubernetes.core.k8s"
            tasks.append({"name": label + "_core", "register": label + "_core", "check_mode": module == "object_state", "diff": module == "object_state",
                          core: _formatted(args, namespace)})
    run = run_playbook(tmp_path, tasks=yaml.safe_dump(tasks, sort_keys=False, width=1000), kubeconfig=kubeconfig)
    assert run.rc == 0, run.output
    for label in cases:
        in_process, as_module = run.result(label + "_in_process"), run.result(label + "_as_module")
        assert "invocation" not in in_process and "invocation" in as_module, label
        assert _comparable(in_process) == _comparable(as_module), label
    for label in ("object_read", "object_unknown"):
        ours, core = (dict(_comparable(run.result(label + where)), action=None) for where in ("_in_process", "_core"))
        assert ours == core, label
    ours, core = (run.result("object_write" + where) for where in ("_in_process", "_core"))
    assert _comparable(ours) == dict(_comparable(core), action=ours["action"]), (ours, core)
    assert ours["changed"] is True and ours["result"]["data"] == {"a": "1"}
    assert _config_map_data(k8s_client, namespace, "cmp-test") == {"a": "0"}  # a dry run: nothing stored
    read = run.result("object_read_in_process")
    assert read["api_found"] is True and [r["metadata"]["name"] for r in read["resources"]] == [NAME]
    assert read["resources"][0]["metadata"]["uid"] == before["metadata"]["uid"]
    unknown = run.result("object_unknown_in_process")
    assert unknown["api_found"] is False and unknown["resources"] == [] and not unknown.get("failed")
    assert run.result("wait_in_process")["ready"] is True
    refused = run.result("wait_refused_in_process")
    assert refused["failed"] and refused["ready"] is False and refused["resource"] == {}
    engine = run.result("engine_in_process")
    assert engine["changed"] is False and engine["pods"] and all(p["speculative_config"]["method"] == "eagle3" for p in engine["pods"])
    strip = run.result("strip_check_in_process")
    assert strip["changed"] is True and strip["previous_config"]["method"] == "eagle3" and strip["config"] is None
    assert strip.get("diff"), "check mode with diff shows the change"
    both = run.result("both_sources_in_process")
    assert both["failed"] and "mutually exclusive: config|restore_backup" in both["msg"]
    applied = run.result("apply_check_in_process")
    assert applied["changed"] is True and applied["method"] == "apply" and applied["diff"]
    assert applied["result"]["metadata"]["annotations"]["example.com/owner"] == "team-a"
    conflict = run.result("apply_conflict_in_process")
    assert conflict["failed"] and conflict["reason"] == "Conflict" and "minReplicas" in conflict["msg"], conflict
    # check mode wrote nothing: the object is the one the test created
    assert _get(k8s_client, namespace)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
