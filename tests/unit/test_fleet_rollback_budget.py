"""ops/fleet_rollback.py (issue 53): a fleet rollback that goes on past a failing service - what is kept of a failure, the
report's `failed` and `not_run`, the failure budget (`rollback_max_fail_percentage`) and the verdict per cluster, a service
mid-rollout, a service stripped by an earlier run that stopped before its proof. The discovery runs over a dict of API
paths (tests/unit/test_fleet.py's server); tests/integration/test_fleet.py runs the role against real API servers."""
from __future__ import annotations

import pytest

from ansible_collections.alauda.spec_decoding.plugins.filter.fleet_rollback_failure import fleet_rollback_failure
from ansible_collections.alauda.spec_decoding.plugins.filter.fleet_rollback_verdict import fleet_rollback_verdict
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import fleet, fleet_rollback
from tests.unit.test_fleet import FLAG, ISVC_API, RT_API, Server, _isvc, _run, _runtime

BACKUP = "spec-decoding.alauda.io/previous-speculative-config"
# what kubernetes' client raises when nothing listens (urllib3's MaxRetryError text, as isvc_speculative reports it)
REFUSED = ("isvc_speculative: HTTPSConnectionPool(host='127.0.0.1', port=6443): Max retries exceeded with url: "
           "/apis/serving.kserve.io/v1beta1/namespaces/a/inferenceservices/s2 (Caused by NewConnectionError('Failed to "
           "establish a new connection: [Errno 111] Connection refused'))")


def _status(obj, generation, observed, ready=True):
    obj["metadata"]["generation"] = generation
    obj["status"] = {"observedGeneration": observed, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return obj


def _discovery():
    """Namespace a: four services with the flag in their own args (s1 mid-rollout: generation 3, observed 2), one without,
    one stripped by an earlier run and not Ready at its generation, one stripped and proven (Ready at its generation)."""
    stripped = _status(_isvc("a", "stripped"), 2, 1, ready=False)
    stripped["metadata"]["annotations"] = {BACKUP: '{"method": "ngram"}'}
    proven = _status(_isvc("a", "proven"), 2, 2)
    proven["metadata"]["annotations"] = {BACKUP: '{"method": "ngram"}'}
    answers = {
        "%s/namespaces/a/inferenceservices" % ISVC_API: [
            _status(_isvc("a", "s0", args=FLAG), 1, 1), _status(_isvc("a", "s1", args=FLAG), 3, 2),
            _isvc("a", "s2", args=FLAG), _isvc("a", "s3", args=FLAG), _isvc("a", "plain", runtime="plain-sr"), stripped, proven],
        "%s/namespaces/a/servingruntimes" % RT_API: [_runtime("plain-sr", "a")],
        "%s/namespaces/b/inferenceservices" % ISVC_API: 403,
    }
    result, _server = _run(answers, namespaces=["a", "b"], kinds=["InferenceService"], label_selector="team=x")
    return result


def test_the_plan_acts_again_on_a_service_stripped_but_not_proven_and_names_one_mid_rollout():
    plan = fleet_rollback.plan(_discovery())
    targets = {t["name"]: t["why"] for t in plan["targets"]}
    assert sorted(targets) == ["s0", "s1", "s2", "s3", "stripped"]
    assert targets["stripped"].startswith("stripped by an earlier rollback and not Ready at its generation yet")
    # proven: the annotation and Ready at its generation - nothing left to do, no write
    assert plan["without_flag"] == ["a/plain", "a/proven"]
    report = fleet_rollback.report(plan, [{"isvc": "a/%s" % n, "changed": n != "stripped"} for n in targets])
    rollout = {s["service"]: s["rollout"] for s in report["services"] if s["rollout"]}
    # "stripped" (generation 2, observed 1) is in a rollout too, the earlier strip's; services never reconciled (no
    # observedGeneration: s2, s3) are not called mid-rollout
    assert list(rollout) == ["a/s1", "a/stripped"] and report["totals"]["mid_rollout"] == 2
    assert (rollout["a/s1"]["generation"], rollout["a/s1"]["observed_generation"]) == (3, 2)
    assert "the strip makes a newer generation" in rollout["a/s1"]["note"]
    assert {s["service"]: s["done"] for s in report["services"]}["a/stripped"] == "unchanged"


def test_a_failure_keeps_task_field_message_and_fix_only_and_knows_an_api_server_that_did_not_answer():
    result = {"failed": True, "msg": "runtime_copy: the flag comes from ServingRuntime spec-sr. Fix: set rollback_runtime_copy",
              "field": "runtime_copy", "fix": "set rollback_runtime_copy", "changed": False,
              "resource": {"spec": {"env": [{"name": "HF_TOKEN", "value": "hf_secret"}]}}, "invocation": {"module_args": {}}}
    kept = fleet_rollback_failure(result, "a/s1", "Strip the speculative config from a/s1")
    assert kept == {"service": "a/s1", "task": "Strip the speculative config from a/s1", "field": "runtime_copy",
                    "message": result["msg"], "fix": "set rollback_runtime_copy", "unreachable": False}
    assert "hf_secret" not in repr(kept)
    assert fleet_rollback.failure({"msg": REFUSED}, "a/s2")["unreachable"] is True
    assert fleet_rollback.failure({"msg": "timed out waiting: cannot reach the API server: [Errno 111]"}, "a/s2")["unreachable"]
    # a no_log task's result, as Ansible censors it, and an endless message
    censored = fleet_rollback.failure({"censored": "the output has been hidden due to the fact that 'no_log: true'"}, "a/s3")
    assert censored["message"].startswith("the output has been hidden") and censored["field"] is None
    assert len(fleet_rollback.failure({"msg": "x" * 5000}, "a/s3")["message"]) == fleet_rollback.MESSAGE_CHARS + 3


def _report(failed=(), unreachable_after=None):
    """The plan of _discovery() after a run where ``failed`` failed (a refusal naming runtime_copy) and, with
    ``unreachable_after``, the API server stopped answering at that service (the rest not run)."""
    plan = fleet_rollback.plan(_discovery())
    results, failures, down = [], [], None
    for target in plan["targets"]:
        key = "a/%s" % target["name"]
        if down:
            continue
        if target["name"] == unreachable_after:
            failures.append(fleet_rollback.failure({"msg": REFUSED}, key, "Strip"))
            down = failures[-1]["message"]
        elif target["name"] in failed:
            failures.append(fleet_rollback.failure({"msg": "refused", "field": "runtime_copy", "fix": "set it"}, key, "Strip"))
        else:
            results.append({"isvc": key, "changed": True})
    return fleet_rollback.report(dict(plan, api_server="https://api.b:6443"), results, failures, down)


def test_the_report_counts_failed_and_left_services_and_the_others_are_done():
    report = _report(failed=("s1",))
    done = {s["service"]: s["done"] for s in report["services"]}
    assert done == {"a/s0": "rolled_back", "a/s1": "failed", "a/s2": "rolled_back", "a/s3": "rolled_back",
                    "a/stripped": "rolled_back", "a/plain": "skipped_without_flag", "a/proven": "skipped_without_flag"}
    error = [s["error"] for s in report["services"] if s["done"] == "failed"][0]
    assert error == {"task": "Strip", "field": "runtime_copy", "message": "refused", "fix": "set it", "unreachable": False}
    totals = report["totals"]
    assert (totals["acted_on"], totals["rolled_back"], totals["failed"], totals["not_run"]) == (5, 4, 1, 0)

    down = _report(unreachable_after="s2")
    done = {s["service"]: s["done"] for s in down["services"]}
    assert (done["a/s0"], done["a/s1"], done["a/s2"], done["a/s3"], done["a/stripped"]) == (
        "rolled_back", "rolled_back", "failed", "not_run", "not_run")
    left = [s["why"] for s in down["services"] if s["done"] == "not_run"]
    assert all(w.startswith("not tried, left for a rerun: the API server stopped answering (") for w in left), left


@pytest.mark.parametrize("failed, budget, fails, share", [
    ((), 0, False, 0.0),
    (("s1",), 0, True, 20.0),      # the default: any failed service fails the run, once the others are done
    (("s1",), 20, False, 20.0),    # Ansible's rule: greater than the budget fails, equal does not
    (("s1", "s3"), 20, True, 40.0),
    (("s1", "s3"), 100, False, 40.0),
])
def test_the_budget_decides_on_the_share_of_failed_services_among_those_acted_on(failed, budget, fails, share):
    report = _report(failed=failed)
    verdict = fleet_rollback.verdict(report, budget, cluster="cluster-b", all_namespaces=True)
    assert (verdict["failed"], verdict["failed_percentage"]) == (fails, share), verdict
    assert verdict["msg"].startswith("cluster cluster-b (API server https://api.b:6443): ")
    if fails:
        assert "a/s1 (runtime_copy: refused; fix: set it)" in verdict["msg"], verdict["msg"]
        assert "over rollback_max_fail_percentage %d%%" % budget in verdict["msg"]


def test_a_listed_namespace_that_refused_fails_under_any_budget_below_100_and_all_namespaces_only_reports_it():
    report = _report()
    assert report["totals"]["forbidden_namespaces"] == ["b"]
    verdict = fleet_rollback.verdict(report, 50, cluster="cluster-b")
    assert verdict["failed"] and "namespace(s) b refused the LIST" in verdict["msg"], verdict
    assert not fleet_rollback.verdict(report, 100, cluster="cluster-b")["failed"]
    assert not fleet_rollback.verdict(report, 0, cluster="cluster-b", all_namespaces=True)["failed"]


def test_a_cluster_that_stopped_answering_or_could_not_be_read_fails_whatever_the_budget():
    verdict = fleet_rollback.verdict(_report(unreachable_after="s2"), 100, cluster="cluster-b", all_namespaces=True)
    assert verdict["failed"]
    assert verdict["msg"].startswith("cluster cluster-b (API server https://api.b:6443) stopped answering during the run (")
    assert "2 rolled back, 3 left (a/s2, a/s3, a/stripped)" in verdict["msg"] and "run again once it answers" in verdict["msg"]
    unread = fleet_rollback.verdict(fleet_rollback.report(fleet_rollback.plan({}), []), 100, cluster="cluster-c",
                                    cluster_error="kubeconfig: the API server 127.0.0.1:9 did not answer. Fix: check it")
    assert unread["failed"] and unread["msg"] == ("cluster cluster-c: not rolled back, its services could not be read: "
                                                  "kubeconfig: the API server 127.0.0.1:9 did not answer. Fix: check it")


@pytest.mark.parametrize("value", [-1, 101, "ten", "5.5", None, True, 12.0])
def test_a_budget_that_is_not_a_percentage_is_refused_naming_the_field(value):
    with pytest.raises(ValidationError) as err:
        fleet_rollback.check_budget(value)
    assert err.value.field == "rollback_max_fail_percentage"
    from ansible.errors import AnsibleFilterError  # pylint: disable=import-outside-toplevel
    with pytest.raises(AnsibleFilterError, match="rollback_max_fail_percentage"):
        fleet_rollback_verdict(_report(), value)


def test_an_api_server_that_does_not_answer_fails_the_discovery_with_one_message_naming_it():
    class Down(OSError):
        pass

    def refuse(_api_client, _method, _path, query=None):  # pylint: disable=unused-argument
        raise Down("[Errno 111] Connection refused")

    class Client:
        class configuration:  # pylint: disable=invalid-name,too-few-public-methods
            host = "https://api.b:6443"

    with pytest.raises(SpecDecodingError) as err:
        fleet.run(Client(), {"namespaces": ["a"], "kinds": ["InferenceService"]}, request=refuse)
    assert err.value.field == "kubeconfig"
    assert str(err.value).startswith("kubeconfig: the API server https://api.b:6443 did not answer: cannot reach the API server")
    # a client that could not even be built (kubernetes.core asks for /version): urllib3's words name host and port

    def unbuilt():
        raise Down("HTTPSConnectionPool(host='10.0.0.9', port=6443): Max retries exceeded")

    with pytest.raises(SpecDecodingError, match=r"the API server 10\.0\.0\.9:6443 did not answer"):
        fleet.run(unbuilt, {"namespaces": ["a"]})
    answered = fleet.run(Client(), {"namespaces": ["a"], "kinds": ["InferenceService"]}, request=Server({}))
    assert answered["api_server"] == "https://api.b:6443" and answered["services"] == []
