"""The watchdog's state machine (healthy, degraded, collapsed, no_traffic, unknown) on hand-made windows, its default
checks against a baseline, and where the baseline is kept (a ConfigMap owned by the InferenceService)."""

import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import watchdog
from tests.unit.test_analysis import window

PARAMS = {"min_requests": 20, "confidence": 0.95, "interval": 60, "count": 3, "failure_limit": 1, "inconclusive_limit": 3,
          "consecutive_error_limit": 1, "initial_delay": 0, "checks": None}
CHECKS, _BUDGETS = watchdog.check_params(PARAMS)
BASE = window()


def _fig(**kw):
    return dict(window(**kw), spec_found=True)


def _watch(windows, **budgets):
    """Run the engine over ``windows`` ((figures, error) pairs) and return the state."""
    seq = iter(windows)
    params = dict(PARAMS, **budgets)
    _checks, bud = watchdog.check_params(params)
    run = analysis.run(lambda i: watchdog.judge_window(*next(seq), CHECKS, BASE, params), bud, sleep=lambda s: None)
    return watchdog.state_of(run), run


def test_healthy():
    state, run = _watch([(_fig(), None)] * 3)
    assert state == watchdog.HEALTHY and run["counts"]["pass"] == 3
    state, _run = _watch([(_fig(), None), (_fig(requests=2), None), (_fig(), None)])
    assert state == watchdog.HEALTHY  # a quiet window says nothing against the others


def test_one_failed_window_within_the_budget_is_degraded_two_are_collapsed():
    state, _run = _watch([(_fig(), None), (_fig(accepted=10), None), (_fig(), None)])
    assert state == watchdog.DEGRADED
    state, run = _watch([(_fig(accepted=10), None), (_fig(accepted=5), None), (_fig(), None)])
    assert state == watchdog.COLLAPSED and len(run["windows"]) == 2 and "failure_limit 1" in run["message"]


def test_requests_without_any_draft_is_a_collapse():
    state, _run = _watch([(_fig(accepted=0, drafted=0, drafts=0, per_pos=()), None)] * 2)
    assert state == watchdog.COLLAPSED


def test_no_traffic_never_acts():
    state, run = _watch([(_fig(requests=2), None)] * 3)
    assert state == watchdog.NO_TRAFFIC and run["counts"]["inconclusive"] == 3 and run["windows"][0]["no_traffic"]


def test_unreadable_metrics_is_unknown_after_consecutive_error_limit_and_never_a_failure():
    state, run = _watch([(None, "no vLLM /metrics from the pods p"), (None, "no vLLM /metrics from the pods p"), (_fig(accepted=1), None)])
    assert state == watchdog.UNKNOWN and len(run["windows"]) == 2 and run["counts"]["fail"] == 0
    # no spec_decode series: the pods do not run speculative decoding; unknown, nothing done
    state, run = _watch([(dict(window(), spec_found=False), None)] * 2)
    assert state == watchdog.UNKNOWN and "do not run speculative decoding" in run["windows"][0]["reasons"][0]


def test_without_a_baseline_the_state_is_unknown():
    _state, run = _watch([(_fig(), None)] * 3)
    assert watchdog.state_of(run, had_baseline=False) == watchdog.UNKNOWN


def test_a_slower_tpot_alone_is_reported_not_acted_on():
    state, run = _watch([(_fig(tpot=0.06), None)] * 3)
    assert state == watchdog.HEALTHY
    assert any(r.startswith("dry run, not deciding - median TPOT") for r in run["windows"][0]["reasons"])


def test_baseline_is_a_configmap_owned_by_the_inference_service():
    owner = {"apiVersion": "serving.kserve.io/v1beta1", "metadata": {"name": "llm", "namespace": "models", "uid": "u-1"}}
    body = watchdog.baseline_configmap(owner, "InferenceService", dict(window(), pod_names=["p"]), "verify")
    assert body["metadata"]["name"] == "llm-spec-decoding-baseline"
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                                                    "name": "llm", "uid": "u-1"}]
    doc = json.loads(body["data"]["baseline.json"])
    assert doc["source"] == "verify" and doc["figures"]["acceptance"]["draft_acceptance_rate"] == 0.6
    assert "pod_names" not in doc["figures"] and doc["figures"]["buckets"]["tpot"][-1][0] == "+Inf"


@pytest.mark.parametrize("change, field", [({"interval": 0}, "interval"), ({"min_requests": 0}, "min_requests"),
                                           ({"checks": [{"figure": "nope", "min": 1}]}, "checks"), ({"count": 0}, "count"),
                                           ({"confidence": 1.5}, "confidence")])
def test_bad_options_are_refused_before_anything_is_read(change, field):
    with pytest.raises(ValidationError, match="^%s: " % field):
        watchdog.check_params(dict(PARAMS, **change))
