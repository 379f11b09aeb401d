"""The deploy takes fields back only from the collection's own rollback: the manager names must be read exactly."""

import json

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.ssa_conflicts import ROLLBACK_FIELD_MANAGER, conflict_managers

# The API server's 409 text for an Update-operation manager (printManager quotes it inside %q), as kube-apiserver writes it.
ONE = 'Apply failed with 1 conflict: conflict with "\\"alauda-spec-decoding-rollback\\" using serving.kserve.io/v1beta1": .spec.predictor.model.command'
MANY = ('Apply failed with 3 conflicts: conflicts with "\\"kubectl-edit\\" using serving.kserve.io/v1beta1":\n'
        '- .spec.predictor.model.args\nconflicts with "\\"alauda-spec-decoding-rollback\\" using serving.kserve.io/v1beta1 at 2026-11-29T13:00:00Z":\n'
        '- .spec.predictor.model.command\n- .spec.predictor.model.env')
APPLY_MANAGER = 'Apply failed with 1 conflict: conflict with "argocd-controller": .spec.predictor.minReplicas'


def test_update_manager_from_the_raw_message():
    assert conflict_managers(ONE) == [ROLLBACK_FIELD_MANAGER]


def test_several_managers_in_order():
    assert conflict_managers(MANY) == ["kubectl-edit", ROLLBACK_FIELD_MANAGER]


def test_apply_manager_is_quoted_once():
    assert conflict_managers(APPLY_MANAGER) == ["argocd-controller"]


def test_json_and_bytes_escaped_bodies_as_kubernetes_core_reports_them():
    body = json.dumps({"kind": "Status", "status": "Failure", "message": ONE, "reason": "Conflict", "code": 409,
                       "details": {"causes": [{"reason": "FieldManagerConflict",
                                               "message": 'conflict with "\\"alauda-spec-decoding-rollback\\" using serving.kserve.io/v1beta1"',
                                               "field": ".spec.predictor.model.command"}]}})
    assert conflict_managers("Failed to apply object: %s" % body) == [ROLLBACK_FIELD_MANAGER]
    assert conflict_managers("Failed to apply object: %r" % body.encode()) == [ROLLBACK_FIELD_MANAGER]


def test_not_a_conflict():
    assert conflict_managers("Failed to apply object: Unauthorized") == []
    assert conflict_managers(None) == []


def test_filter_leaves_out_the_collections_rollback_when_asked():
    from ansible_collections.alauda.spec_decoding.plugins.filter.ssa_conflict_managers import ssa_conflict_managers  # pylint: disable=import-outside-toplevel
    assert ssa_conflict_managers(MANY, foreign=True) == ["kubectl-edit"]
    assert ssa_conflict_managers(ONE, foreign=True) == []
    assert ssa_conflict_managers(ONE) == [ROLLBACK_FIELD_MANAGER]
