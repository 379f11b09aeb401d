"""canary module_utils: the plan's validation, each step's manifest, readiness per revision, histogram-delta quantiles
checked against prometheus_client's own histogram counting, and the decision (bench_decision.decide's keep rule)."""

import json
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, Counter, generate_latest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import canary_window
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

# vLLM 0.32's bucket bounds for time_to_first_token_seconds (tests/fixtures/vllm/ngram/metrics.txt)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                160.0, 640.0, 2560.0)


class FakeVllm:
    """A prometheus_client registry with vLLM's metric names (the page a pod serves)."""

    def __init__(self, model="m"):
        self.registry = CollectorRegistry()
        self.model = model
        kw = {"labelnames": ["model_name", "engine"], "registry": self.registry}
        self.hists = {key: Histogram("vllm:" + base, "h", buckets=TTFT_BUCKETS, **kw) for key, base in canary_window.HISTOGRAMS.items()}
        self.tokens = Counter("vllm:generation_tokens", "c", **kw)

    def serve(self, ttft, tpot, tokens=10):
        labels = {"model_name": self.model, "engine": "0"}
        self.hists["ttft"].labels(**labels).observe(ttft)
        self.hists["tpot"].labels(**labels).observe(tpot)
        self.hists["itl"].labels(**labels).observe(tpot)
        self.hists["e2el"].labels(**labels).observe(ttft + tpot * (tokens - 1))
        self.tokens.labels(**labels).inc(tokens)

    def page(self):
        return generate_latest(self.registry).decode()

    def value(self, name, **labels):
        return self.registry.get_sample_value(name, dict({"model_name": self.model, "engine": "0"}, **labels))


class SpeculativeVllm(FakeVllm):
    """FakeVllm plus vLLM's spec_decode counters (3 draft positions)."""

    def __init__(self, model="llm"):
        super().__init__(model)
        kw = {"labelnames": ["model_name", "engine"], "registry": self.registry}
        self.drafts = Counter("vllm:spec_decode_num_drafts", "c", **kw)
        self.drafted = Counter("vllm:spec_decode_num_draft_tokens", "c", **kw)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "c", **kw)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "c", labelnames=["model_name", "engine", "position"],
                               registry=self.registry)

    def serve_drafting(self, n, acceptance):
        """n requests of 10 drafts x 3 tokens each, ``acceptance`` of the draft tokens accepted."""
        labels = {"model_name": self.model, "engine": "0"}
        for _i in range(n):
            self.serve(0.05, 0.015)
            self.drafts.labels(**labels).inc(10)
            self.drafted.labels(**labels).inc(30)
            self.accepted.labels(**labels).inc(round(30 * acceptance))
            for pos in range(3):
                self.per_pos.labels(position=str(pos), **labels).inc(round(10 * acceptance))


def test_histogram_delta_counts_equal_prometheus_clients_own_counts():
    rng = random.Random(7)
    server = FakeVllm()
    for _i in range(40):
        server.serve(rng.uniform(0.01, 0.3), rng.uniform(0.005, 0.05))
    before = canary_window.scrape(server.page())
    window = FakeVllm()  # prometheus_client counting only the window's requests
    values = []
    for _i in range(101):
        ttft = rng.uniform(0.02, 0.9)
        values.append(ttft)
        server.serve(ttft, 0.02)
        window.serve(ttft, 0.02)
    after = canary_window.scrape(server.page())
    delta = canary_window.histogram_delta(after["histograms"]["ttft"], before["histograms"]["ttft"])
    assert delta["count"] == 101 == window.value("vllm:time_to_first_token_seconds_count")
    assert delta["sum"] == pytest.approx(window.value("vllm:time_to_first_token_seconds_sum"))
    for upper, count in delta["buckets"]:
        le = "+Inf" if upper == float("inf") else str(upper)
        assert count == window.value("vllm:time_to_first_token_seconds_bucket", le=le), le
    median = canary_window.histogram_quantile(0.5, delta["buckets"])
    true_median = bench_stats.median(values)
    # the histogram's median lies in the bucket that holds the true median
    bounds = [0.0] + [upper for upper, _count in delta["buckets"]]
    bucket = next(i for i in range(1, len(bounds)) if true_median <= bounds[i])
    assert bounds[bucket - 1] <= median <= bounds[bucket]


def test_histogram_quantile_interpolates_like_prometheus():
    # 10 requests: 4 in (0, 0.1], 6 in (0.1, 0.25]: rank 5 is 1 of 6 into the second bucket
    buckets = [(0.1, 4.0), (0.25, 10.0), (float("inf"), 10.0)]
    assert canary_window.histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.15 * (1 / 6))
    assert canary_window.histogram_quantile(0.2, buckets) == pytest.approx(0.05)
    assert canary_window.histogram_quantile(0.99, [(0.1, 1.0), (float("inf"), 3.0)]) == 0.1  # in +Inf: highest finite bound
    assert canary_window.histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None


def test_counter_reset_takes_the_later_page():
    server = FakeVllm()
    for _i in range(30):
        server.serve(0.05, 0.01)
    before = canary_window.scrape(server.page())
    restarted = FakeVllm()
    for _i in range(5):
        restarted.serve(0.05, 0.01)
    delta = canary_window.window_delta(canary_window.scrape(restarted.page()), before)
    assert delta["histograms"]["ttft"]["reset"] is True
    assert delta["histograms"]["ttft"]["count"] == 5


def _figures(ttft, tpot, n, model="m"):
    server = FakeVllm(model)
    before = canary_window.scrape(server.page())
    for _i in range(n):
        server.serve(ttft, tpot)
    return canary_window.revision_figures([canary_window.window_delta(canary_window.scrape(server.page()), before)], 10.0)


def test_decision_promotes_a_faster_canary_and_rolls_back_a_slower_one():
    stable = _figures(0.05, 0.03, 30)
    fast = _figures(0.05, 0.015, 30)
    slow = _figures(0.07, 0.045, 30)
    assert stable["requests"] == 30 and stable["tpot_ms"]["median"] is not None
    verdict = canary_window.decide(stable, fast, min_requests=20)
    assert verdict["decision"] == "promote", verdict
    verdict = canary_window.decide(stable, slow, min_requests=20)
    assert verdict["decision"] == "roll_back"
    assert any("median TPOT" in r for r in verdict["reasons"])


def _figures_with_tail(n, ttft, tpot, tail_tpot, tail_n):
    server = FakeVllm()
    before = canary_window.scrape(server.page())
    for i in range(n):
        server.serve(ttft, tail_tpot if i < tail_n else tpot)
    return canary_window.revision_figures([canary_window.window_delta(canary_window.scrape(server.page()), before)], 10.0)


def test_a_worse_p99_rolls_back_a_canary_whose_medians_win():
    stable = _figures(0.05, 0.03, 300)
    # 291 requests twice as fast per token, 9 (3%, three times what a p99 allows) stall at 0.2 s per token: medians and
    # the output rate win, the tail loses beyond the noise (the exceedance test; 2 of 100 would be inside it)
    tail = _figures_with_tail(300, 0.05, 0.015, 0.2, 9)
    assert tail["tpot_ms"]["median"] < stable["tpot_ms"]["median"]
    assert tail["output_rate_per_request"] > stable["output_rate_per_request"]
    assert tail["tpot_ms"]["p99"] > 1.5 * stable["tpot_ms"]["p99"]
    verdict = canary_window.decide(stable, tail, min_requests=20)
    assert verdict["decision"] == "roll_back", verdict
    assert verdict["reasons"] == [r for r in verdict["reasons"] if r.startswith("p99 TPOT (per-token latency) got worse")]
    assert [c["metric"] for c in verdict["checks"] if not c["passed"]] == ["tpot_p99"]
    assert verdict["tolerances"]["p99"] == canary_window.DEFAULT_P99_TOLERANCE
    # a tolerance wide enough for that tail, or none at all, leaves the benchmark's median rule to decide
    assert canary_window.decide(stable, tail, min_requests=20, p99_tolerance=20)["decision"] == "promote"
    unchecked = canary_window.decide(stable, tail, min_requests=20, p99_tolerance=None)
    assert unchecked["decision"] == "promote" and not [c for c in unchecked["checks"] if c["metric"].endswith("_p99")]
    # a slower canary with a worse tail too: the benchmark's median reasons come first, the tail's after them
    slow = canary_window.decide(stable, _figures_with_tail(300, 0.07, 0.045, 0.3, 9), min_requests=20)
    assert slow["decision"] == "roll_back" and slow["reasons"][0].startswith("median TTFT got worse")
    assert slow["reasons"][-1].startswith("p99 TPOT (per-token latency) got worse")


def test_a_p99_of_too_few_requests_is_reported_not_decided_on():
    """17 requests: the p99 is the one cold request. The medians decide; the tail checks are kept, undecided."""
    stable = _figures(0.05, 0.03, 17)
    tail = _figures_with_tail(17, 0.05, 0.015, 0.2, 1)
    assert tail["tpot_ms"]["p99"] > 1.5 * stable["tpot_ms"]["p99"]
    verdict = canary_window.decide(stable, tail, min_requests=10)
    assert verdict["decision"] == "promote", verdict
    tails = [c for c in verdict["checks"] if c["metric"].endswith("_p99")]
    assert tails and all(c["passed"] is None and c["decided"] is False for c in tails)
    assert "reported, not decided on: a side finished 17 requests" in verdict["reasons"][-1]


@pytest.mark.parametrize("value", [-0.1, "wide"])
def test_p99_tolerance_must_be_a_fraction_of_at_least_0(value):
    with pytest.raises(ValidationError, match=r"^p99_tolerance: .*Fix:"):
        canary_window.check_p99_tolerance(value)


def test_no_decision_on_too_few_requests_or_missing_metrics():
    stable, canary_fig = _figures(0.05, 0.03, 30), _figures(0.05, 0.01, 3)
    verdict = canary_window.decide(stable, canary_fig, min_requests=20)
    assert verdict["decision"] == "none"
    assert "canary revision finished 3 requests" in verdict["reasons"][0]
    verdict = canary_window.decide(stable, stable, missing={"canary": ["isvc-predictor-spec-abc"]})
    assert verdict["decision"] == "none" and "isvc-predictor-spec-abc" in verdict["reasons"][0]


@pytest.mark.parametrize("value", [0, 100, -5, "ten", 10.5, True])
def test_percent_outside_1_99_is_refused(value):
    with pytest.raises(ValidationError, match=r"^percent: .*Fix:"):
        canary.check_percent(value)


def test_steps():
    assert canary.check_steps([10, 50, 100]) == [10, 50]
    assert canary.check_steps([], percent=10) == [10]
    with pytest.raises(ValidationError, match=r"steps\[1\]: 5 does not rise"):
        canary.check_steps([10, 5])
    with pytest.raises(ValidationError, match=r"steps\[1\]: 100 is outside"):
        canary.check_steps([10, 100, 100])


def test_standard_mode_needs_kserve_0_20():
    assert canary.check_mode("Standard", "0.20.0") == "Standard"
    assert canary.check_mode("Knative", "0.15.2") == "Knative"
    with pytest.raises(ValidationError, match=r"^kserve_version: KServe 0.19.1 has no spec.canary.*Fix: upgrade"):
        canary.check_mode("Standard", "0.19.1")


ISVC = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": "llm", "namespace": "ns", "generation": 3, "annotations": {"serving.kserve.io/deploymentMode": "Standard"}},
        "spec": {"predictor": {"minReplicas": 1, "model": {"modelFormat": {"name": "vLLM"},
                                                           "args": ["--model", "/mnt/models", "--port", "8080"]}}}}
NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'


def test_step_promote_and_rollback_manifests():
    can = canary.canary_predictor(ISVC["spec"]["predictor"], NGRAM, "spec")
    assert can["name"] == "spec" and can["model"]["args"][-2:] == ["--speculative-config", NGRAM]
    assert "--speculative-config" not in ISVC["spec"]["predictor"]["model"]["args"]
    step = canary.manifest(ISVC, canary.step_patch(ISVC, "Standard", 10, can))
    assert step["spec"]["canary"] == [{"trafficPercent": 10, "predictor": can}]
    assert step["spec"]["predictor"] == ISVC["spec"]["predictor"] and "generation" not in step["metadata"]
    promoted = canary.merge_patch(step, canary.promote_patch(step, "Standard", can))
    assert promoted["spec"] == {"predictor": can}
    rolled = canary.merge_patch(step, canary.rollback_patch(step, "Standard", ISVC["spec"]["predictor"]))
    assert rolled["spec"] == ISVC["spec"]
    knative = canary.step_patch(ISVC, "Knative", 10, can)["spec"]["predictor"]
    assert knative["canaryTrafficPercent"] == 10 and "name" not in knative
    with pytest.raises(ValidationError, match="already runs with --speculative-config"):
        canary.canary_predictor(can, NGRAM, "spec")


def test_rollout_state_is_generation_and_revision_aware():
    isvc = dict(ISVC, status={"observedGeneration": 3, "conditions": [{"type": "Ready", "status": "True"}],
                              "canaryStatuses": [{"name": "spec", "ready": False, "trafficPercent": 10}]})
    state = canary.rollout_state(isvc, "Standard", "spec", 10)
    assert not state["done"] and "canary spec not ready" in state["why"]
    isvc["status"]["canaryStatuses"][0]["ready"] = True
    assert canary.rollout_state(isvc, "Standard", "spec", 10)["done"]
    assert not canary.rollout_state(isvc, "Standard", "spec", 50)["done"]
    isvc["status"]["observedGeneration"] = 2
    assert not canary.rollout_state(isvc, "Standard", "spec", 10)["done"]
    assert canary.revision_selectors(isvc, "Standard", "spec") == {"stable": "app=isvc.llm-predictor",
                                                                   "canary": "app=isvc.llm-predictor-spec"}


def test_report_markdown_has_both_sides_and_the_reason():
    stable, fast = _figures(0.05, 0.03, 30), _figures(0.05, 0.015, 30)
    verdict = canary_window.decide(stable, fast, min_requests=20)
    report = {"namespace": "ns", "name": "llm", "mode": "Standard", "canary_name": "spec", "percent": 10, "window_s": 10.0,
              "min_requests": 20, "decision": verdict["decision"], "reasons": verdict["reasons"], "stable": stable, "canary": fast,
              "selectors": {"stable": "app=isvc.llm-predictor", "canary": "app=isvc.llm-predictor-spec"}}
    text = canary.render_markdown(report)
    assert "**promote**" in text and "| requests | 30 | 30 |" in text
    row = [line for line in text.splitlines() if line.startswith("| median TPOT")][0]
    assert row.split("|")[2].strip() != row.split("|")[3].strip()


def test_already_promoted_only_when_no_canary_runs_and_the_serving_config_matches():
    config = {"method": "ngram", "num_speculative_tokens": 3}
    serving = {"spec": {"predictor": {"model": {"args": ["--port", "8080", "--speculative-config", json.dumps(config)]}}}}
    assert canary.already_promoted(serving, config) is True
    assert canary.already_promoted(serving, dict(config, num_speculative_tokens=4)) is False
    with_canary = {"spec": dict(serving["spec"], canary=[{"trafficPercent": 10, "predictor": {"name": "spec"}}])}
    assert canary.already_promoted(with_canary, config) is False
    knative = {"spec": {"predictor": dict(serving["spec"]["predictor"], canaryTrafficPercent=10)}}
    assert canary.already_promoted(knative, config) is False
    assert canary.already_promoted({"spec": {"predictor": {"model": {"args": ["--port", "8080"]}}}}, config) is False


def _knative(traffic, created="llm-predictor-00002", ready="llm-predictor-00002", rolled="llm-predictor-00001", generation=3):
    meta = dict(ISVC["metadata"], annotations={"serving.kserve.io/deploymentMode": "Serverless"}, generation=3)
    return {"metadata": meta, "spec": ISVC["spec"],
            "status": {"observedGeneration": generation, "conditions": [{"type": "Ready", "status": "True"}],
                       "components": {"predictor": {"latestCreatedRevision": created, "latestReadyRevision": ready,
                                                    "latestRolledoutRevision": rolled, "traffic": traffic}}}}


CANARY_10 = [{"revisionName": "llm-predictor-00002", "latestRevision": True, "percent": 10},
             {"revisionName": "llm-predictor-00001", "latestRevision": False, "percent": 90, "tag": "prev"}]


def test_knative_rollout_state_and_selectors_follow_the_revisions_in_the_traffic():
    isvc = _knative(CANARY_10)
    assert canary.deployment_mode(isvc) == "Knative"
    state = canary.rollout_state(isvc, "Knative", "spec", 10)
    assert state["done"] and state["revisions"] == {"stable": "llm-predictor-00001", "canary": "llm-predictor-00002"}
    assert canary.revision_selectors(isvc, "Knative", "spec") == {"stable": "serving.knative.dev/revision=llm-predictor-00001",
                                                                  "canary": "serving.knative.dev/revision=llm-predictor-00002"}
    assert not canary.rollout_state(isvc, "Knative", "spec", 50)["done"]
    assert not canary.rollout_state(_knative(CANARY_10, generation=2), "Knative", "spec", 10)["done"]
    # the canary revision not ready yet: Knative routes the latest target to the previous revision (both entries on 00001)
    waiting = _knative([dict(CANARY_10[0], revisionName="llm-predictor-00001"), CANARY_10[1]], ready="llm-predictor-00001")
    state = canary.rollout_state(waiting, "Knative", "spec", 10)
    assert not state["done"] and "canary spec not ready" in state["why"]
    with pytest.raises(ValidationError, match=r"^name: .*splits no traffic between two revisions"):
        canary.revision_selectors(waiting, "Knative", "spec")
    # a newer revision created (another spec change) than the one on the canary share: not this step's revision
    assert not canary.rollout_state(_knative(CANARY_10, created="llm-predictor-00003"), "Knative", "spec", 10)["done"]


def test_knative_settled_after_promotion_and_rollback():
    promoted = _knative([{"revisionName": "llm-predictor-00002", "latestRevision": True, "percent": 100}], rolled="llm-predictor-00002")
    assert canary.knative_settled(promoted, "promoted") and not canary.knative_settled(_knative(CANARY_10), "promoted")
    rolled_back = _knative([{"revisionName": "llm-predictor-00003", "latestRevision": True, "percent": 0},
                            {"revisionName": "llm-predictor-00001", "latestRevision": False, "percent": 100, "tag": "prev"}],
                           created="llm-predictor-00003", ready="llm-predictor-00003")
    assert canary.knative_settled(rolled_back, "absent", "llm-predictor-00001")
    assert not canary.knative_settled(rolled_back, "absent", "llm-predictor-00002")
    assert not canary.knative_settled(_knative(CANARY_10), "absent", "llm-predictor-00001")


def test_knative_step_and_rollback_patches():
    can = canary.canary_predictor(ISVC["spec"]["predictor"], NGRAM, "spec")
    step = canary.manifest(ISVC, canary.step_patch(ISVC, "Knative", 10, can))
    predictor = step["spec"]["predictor"]
    # the predictor as it was plus the flag and the percent: no canary name, no model.name the Standard entry needs
    assert predictor["canaryTrafficPercent"] == 10 and "name" not in predictor and "name" not in predictor["model"]
    assert predictor["model"]["args"] == ISVC["spec"]["predictor"]["model"]["args"] + ["--speculative-config", NGRAM]
    rolled = canary.merge_patch(step, canary.rollback_patch(step, "Knative", canary.rollback_source(step)))
    assert rolled["spec"]["predictor"] == dict(ISVC["spec"]["predictor"], canaryTrafficPercent=0)
    assert canary.rollback_patch(ISVC, "Knative", canary.rollback_source(ISVC)) == {}  # no canary: nothing to remove
    promoted = canary.merge_patch(step, canary.promote_patch(step, "Knative", None))
    assert "canaryTrafficPercent" not in promoted["spec"]["predictor"] and promoted["spec"]["predictor"]["model"] == predictor["model"]


def test_knative_retired_revision_before_promotion_and_rollback():
    assert canary.knative_retired(_knative(CANARY_10), "promoted") == ("llm-predictor-00001", "serving.knative.dev/revision=llm-predictor-00001")
    assert canary.knative_retired(_knative(CANARY_10), "absent") == ("llm-predictor-00001", "serving.knative.dev/revision=llm-predictor-00002")
    # a canary revision that never became ready: the traffic names only the previous revision, the canary still goes
    never = _knative([dict(CANARY_10[0], revisionName="llm-predictor-00001"), CANARY_10[1]], ready="llm-predictor-00001")
    assert canary.knative_retired(never, "absent") == ("llm-predictor-00001", "serving.knative.dev/revision=llm-predictor-00002")
    # no canary: nothing goes
    single = _knative([{"revisionName": "llm-predictor-00001", "latestRevision": True, "percent": 100}], created="llm-predictor-00001",
                      ready="llm-predictor-00001")
    assert canary.knative_retired(single, "absent") == ("llm-predictor-00001", None)
    assert canary.knative_retired(single, "promoted") == ("llm-predictor-00001", None)


def test_knative_promotion_refused_after_a_rollback():
    can = canary.canary_predictor(ISVC["spec"]["predictor"], NGRAM, "spec")
    step = canary.manifest(ISVC, canary.step_patch(ISVC, "Knative", 10, can))
    canary.check_knative_promotion(step)  # a running canary: promotable
    canary.check_knative_promotion(ISVC)  # no canaryTrafficPercent: nothing to do, not an error
    rolled = canary.merge_patch(step, canary.rollback_patch(step, "Knative", canary.rollback_source(step)))
    with pytest.raises(ValidationError, match=r"^spec.predictor: there is no canary to promote.*canaryTrafficPercent 0"):
        canary.check_knative_promotion(rolled)
