"""The analysis engine on hand-made windows: each verdict, each budget (Argo Rollouts' failureLimit, inconclusiveLimit,
consecutiveErrorLimit, initialDelay), dry-run checks, the rank and proportion tests, and the canary's keep rule as rows."""

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import canary_window
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

BOUNDS = (0.01, 0.02, 0.04, 0.08, 0.16)


def _buckets(values):
    """Cumulative buckets of a histogram holding ``values`` (seconds)."""
    out = [[b, float(sum(1 for v in values if v <= b))] for b in BOUNDS]
    return out + [["+Inf", float(len(values))]]


def window(requests=100, tpot=0.015, accepted=600, drafted=1000, drafts=400, per_pos=(250, 200, 150), spread=0):
    """Figures of a hand-made window: ``requests`` requests at ``tpot`` seconds (+ ``spread`` of them one bucket slower)."""
    values = [tpot] * (requests - spread) + [tpot * 2] * spread
    acc = {"num_accepted_tokens": accepted, "num_draft_tokens": drafted, "num_drafts": drafts, "has_data": bool(drafted),
           "accepted_tokens_per_position": list(per_pos), "draft_acceptance_rate": accepted / drafted if drafted else None,
           "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
           "per_position_acceptance_rate": [p / drafts for p in per_pos] if drafts else []}
    median = canary_window.histogram_quantile(0.5, [(float("inf") if b == "+Inf" else b, c) for b, c in _buckets(values)])
    return {"requests": requests, "tpot_ms": {"median": median * 1000 if median is not None else None, "p99": None, "mean": None},
            "buckets": {"tpot": _buckets(values)}, "acceptance": acc, "output_rate_per_request": 50.0}


ACCEPTANCE = analysis.check_spec({"name": "acceptance", "figure": "acceptance_rate", "better": "higher", "tolerance": 0.2})
FLOOR = analysis.check_spec({"name": "floor", "figure": "acceptance_rate", "min": 0.05})


def test_figures_by_name():
    fig = window()
    assert analysis.figure(fig, "acceptance_rate") == 0.6
    assert analysis.figure(fig, "mean_acceptance_length") == 2.5
    assert analysis.figure(fig, "position_2_rate") == 0.5 and analysis.figure(fig, "position_9_rate") is None
    assert analysis.figure(fig, "requests") == 100 and analysis.figure(fig, "tpot_median") == pytest.approx(fig["tpot_ms"]["median"])
    with pytest.raises(ValidationError, match="unknown figure 'speed'"):
        analysis.figure(fig, "speed")


@pytest.mark.parametrize("check, message", [
    ({"figure": "acceptance_rate"}, "has no condition"),
    ({"figure": "acceptance_rate", "better": "up"}, "better must be lower or higher"),
    ({"figure": "acceptance_rate", "better": "higher", "tolerance": -1}, "tolerance must be a fraction"),
    ({"name": "x"}, "needs a figure"),
])
def test_bad_checks_are_refused(check, message):
    with pytest.raises(ValidationError, match=message):
        analysis.check_spec(check)


def test_each_verdict():
    base = window()
    assert analysis.window_verdict([ACCEPTANCE, FLOOR], window(), base)["verdict"] == analysis.PASS
    collapsed = analysis.window_verdict([ACCEPTANCE, FLOOR], window(accepted=10), base)
    assert collapsed["verdict"] == analysis.FAIL and collapsed["confidence"] > 0.999
    assert any(r.startswith("acceptance:") for r in collapsed["reasons"])
    short = analysis.window_verdict([ACCEPTANCE], window(requests=3), base, min_requests=20)
    assert short["verdict"] == analysis.INCONCLUSIVE and "too little traffic" in short["reasons"][0]
    # 10 drafted tokens: 4 of 10 accepted is below the limit 0.48, but a z-test with the draft as the unit cannot be sure of it
    noise = analysis.window_verdict([ACCEPTANCE], window(accepted=4, drafted=10, drafts=4), base)
    assert noise["verdict"] == analysis.INCONCLUSIVE and "inside the noise" in noise["reasons"][0]
    unread = analysis.window_verdict([ACCEPTANCE], error="GET /metrics on pod p failed: 503")
    assert unread["verdict"] == analysis.ERROR and unread["checks"] == []
    unmeasured = analysis.window_verdict([ACCEPTANCE], window(drafted=0, drafts=0, accepted=0, per_pos=()), base)
    assert unmeasured["verdict"] == analysis.INCONCLUSIVE and "not measured" in unmeasured["reasons"][0]


def test_dry_run_checks_are_reported_never_deciding():
    dry = analysis.check_spec({"name": "floor", "figure": "acceptance_rate", "min": 0.9, "dry_run": True})
    out = analysis.window_verdict([dry], window(), None)
    assert out["verdict"] == analysis.PASS and out["checks"][0]["passed"] is False
    assert out["reasons"][-1].startswith("dry run, not deciding - floor")


def test_rank_test_on_histograms():
    fast, slow = _buckets([0.015] * 60), _buckets([0.03] * 60)
    assert analysis.rank_test(fast, slow, "lower") > 0.999      # the candidate is slower: sure
    assert analysis.rank_test(slow, fast, "lower") < 0.001
    assert analysis.rank_test(fast, fast, "lower") == 0.5       # one bucket each side: nothing to tell
    mixed = _buckets([0.015] * 30 + [0.03] * 30)
    assert 0.5 < analysis.rank_test(mixed, _buckets([0.015] * 28 + [0.03] * 32), "lower") < 0.95  # a small shift: noise
    assert analysis.rank_test([], slow) is None
    # deterministic: the same buckets give the same figure
    assert analysis.rank_test(mixed, slow) == analysis.rank_test(mixed, slow)


def test_latency_check_against_the_baseline_uses_the_rank_test():
    tpot = analysis.check_spec({"name": "tpot", "figure": "tpot_median", "better": "lower", "tolerance": 0.1})
    out = analysis.window_verdict([tpot], window(tpot=0.03), window(tpot=0.015))
    assert out["verdict"] == analysis.FAIL and out["checks"][0]["confidence"] > 0.999


def _run(verdicts, **budgets):
    seq = iter(verdicts)
    slept = []
    result = analysis.run(lambda i: {"verdict": next(seq), "reasons": [], "confidence": None},
                          analysis.Budgets(**budgets), sleep=slept.append)
    return result, slept


def test_failure_limit():
    result, _slept = _run(["pass", "fail", "pass", "fail"], count=5, failure_limit=1)
    assert result["phase"] == analysis.FAILED and len(result["windows"]) == 4 and "failure_limit 1" in result["message"]
    result, _slept = _run(["fail"], count=3)
    assert result["phase"] == analysis.FAILED and len(result["windows"]) == 1


def test_inconclusive_limit():
    result, _slept = _run(["inconclusive", "pass", "inconclusive"], count=5, inconclusive_limit=1)
    assert result["phase"] == analysis.INCONCLUSIVE and len(result["windows"]) == 3
    result, _slept = _run(["inconclusive", "pass", "pass"], count=3, inconclusive_limit=1)
    assert result["phase"] == analysis.SUCCESSFUL


def test_an_error_streak_stops_at_consecutive_error_limit_and_is_never_a_failure():
    result, _slept = _run(["error", "pass", "error", "error", "error"], count=10, consecutive_error_limit=2)
    assert result["phase"] == analysis.ERROR and len(result["windows"]) == 5
    assert result["counts"]["fail"] == 0 and result["counts"]["consecutive_errors"] == 3
    # errors below the limit, then passes: successful
    result, _slept = _run(["error", "error", "pass"], count=3, consecutive_error_limit=2)
    assert result["phase"] == analysis.SUCCESSFUL
    # every window an error within the limit: error, not failed
    result, _slept = _run(["error"], count=1)
    assert result["phase"] == analysis.ERROR


def test_initial_delay_is_waited_once_before_the_first_window():
    result, slept = _run(["pass", "pass"], count=2, initial_delay=30)
    assert slept == [30] and result["phase"] == analysis.SUCCESSFUL


@pytest.mark.parametrize("budgets, field", [(dict(count=0), "count"), (dict(failure_limit=-1), "failure_limit"),
                                            (dict(interval=0), "interval"), (dict(initial_delay=-1), "initial_delay")])
def test_bad_budgets_are_refused(budgets, field):
    with pytest.raises(ValidationError, match="^%s: " % field):
        analysis.Budgets.from_params(budgets)


def _keep_rule_window(tpot_values):
    fig = window(requests=len(tpot_values))
    fig["buckets"] = {"tpot": _buckets(tpot_values), "ttft": _buckets([0.05] * len(tpot_values))}
    median = canary_window.histogram_quantile(0.5, [(float("inf") if b == "+Inf" else b, c) for b, c in fig["buckets"]["tpot"]])
    fig["tpot_ms"] = {"median": median * 1000, "p99": None, "mean": None}
    fig["ttft_ms"] = {"median": 50.0, "p99": None, "mean": None}
    return fig


def test_the_canary_keep_rule_becomes_rows_and_a_difference_in_the_noise_is_inconclusive():
    # the keep rule (canary_window.decide) tests each check for noise; the rows carry its confidence
    stable, canary = _keep_rule_window([0.015] * 100), _keep_rule_window([0.03] * 100)
    decided = canary_window.decide(stable, canary, min_requests=20)
    out = analysis.canary_window_verdict(stable, canary, decided)
    assert decided["decision"] == "roll_back" and decided["reasons"][0].startswith("median TPOT (per-token latency) got worse")
    assert out["verdict"] == analysis.FAIL and out["reasons"] == decided["reasons"] and out["confidence"] > 0.999
    # 4 requests a side, the slower ones overlapping: neither sure it is worse nor that it gained
    few, base = _keep_rule_window([0.015, 0.015, 0.03, 0.03]), _keep_rule_window([0.015, 0.015, 0.015, 0.03])
    decided = canary_window.decide(base, few, min_requests=1)
    out = analysis.canary_window_verdict(base, few, decided)
    assert out["verdict"] == analysis.INCONCLUSIVE and "no gain beyond the noise" in out["reasons"][0]
    missing = analysis.canary_window_verdict(stable, canary, {"decision": "none", "reasons": ["no /metrics"], "checks": []},
                                             missing={"canary": ["p"]})
    assert missing["verdict"] == analysis.ERROR
