"""The load sweep per request class (bench/sweep_classes.py, issue #52): per load each class's figures and decision by the
A/B's per-class statistics, per class the break-even by the service-wide interpolation, the decision at the target load
with its confidence, the guard the routing plan takes, the report's section and plot."""
import json
import os

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import report as bench_report
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import request_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep_analysis
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep_classes
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.png_file import check_png
from tests.request_class_records import class_records as _records, spec_decoding_block as _block

LOADS = [1.0, 2.0, 4.0, 8.0]
BASE_TPOT = 0.020
# candidate TPOT (s) per class and load: `code` gains everywhere, `chat` nowhere, `mixed` crosses between 2 and 4 req/s
CANDIDATE_TPOT = {"code": [0.011, 0.011, 0.012, 0.012], "chat": [0.024, 0.025, 0.026, 0.028], "mixed": [0.012, 0.015, 0.024, 0.030]}
SPEC = {"name": "llama-ngram-predictor", "port": 80}
BASE = {"name": "llama-baseline-predictor", "port": 80}

# `chat`'s responses carry no per-request block (the release has none, n > 1, a stream without usage): not reported
BLOCKS = {"code": _block(20, 60, 40), "chat": None, "mixed": _block(30, 90, 30)}


def _side(records, acceptance=None):
    duration = sum(r["latency"] for r in records)
    return {"summary": bench_stats.summarize_run(records, duration), "acceptance": acceptance, "records": records}


def _counters(records):
    sums = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "counter_reset": False}
    for r in records:
        block = r["spec_decoding"] or _block(10, 30, 0)  # a request without its block still drafted on the server
        sums["num_drafts"] += block["num_spec_steps"]
        sums["num_draft_tokens"] += block["num_draft_tokens"]
        sums["num_accepted_tokens"] += block["num_accepted_draft_tokens"]
    return sums


def sides_at(index, classes=None):
    classes = classes or CANDIDATE_TPOT
    baseline = [r for name in classes for r in _records(name, BASE_TPOT)]
    candidate = [r for name in classes for r in _records(name, classes[name][index], block=BLOCKS.get(name))]
    return _side(baseline), _side(candidate, _counters(candidate))


def measurement(load, name, side):
    """What bench/sweep.py's run_units keeps of one measurement (no records)."""
    item = {k: v for k, v in side.items() if k != "records"}
    item.update(kind="request_rate", load=load, side=name, k=None)
    classes = sweep_classes.measured_classes(side, name)
    if classes:
        item["classes"] = classes
        if name == "candidate":
            item["classes_counters_check"] = sweep_classes.measured_counters_check(side)
    return item


def measurements(classes=None):
    out = []
    for index, load in enumerate(LOADS):
        baseline, candidate = sides_at(index, classes)
        out += [measurement(load, "baseline", baseline), measurement(load, "candidate", candidate)]
    return out


SWEEP = {"request_rates": LOADS, "concurrencies": None, "target_qps": 4.0}


@pytest.fixture(scope="module")
def block():
    return sweep_classes.analyse_classes(measurements(), SWEEP)


def by_class(block):
    return {e["class"]: e for e in block["classes"]}


def test_gains_everywhere_never_and_crosses(block):
    entries = by_class(block)
    assert list(entries) == ["chat", "code", "mixed"]
    code, chat, mixed = entries["code"], entries["chat"], entries["mixed"]
    assert code["break_even"]["status"] == "pays_everywhere" and code["break_even_text"] == "gains at every load (up to 8 req/s)"
    assert [row["decision"] for row in code["loads"]] == ["keep"] * 4
    assert chat["break_even"]["status"] == "pays_nowhere" and chat["break_even_text"] == "never gains (not even at 1 req/s)"
    assert [row["decision"] for row in chat["loads"]] == ["roll_back"] * 4
    assert mixed["break_even"]["status"] == "crossed"
    assert (mixed["break_even"]["last_keep_load"], mixed["break_even"]["first_roll_back_load"]) == (2.0, 4.0)
    assert 2.0 < mixed["break_even"]["crossover_load"] < 4.0
    print("\nper-class break-even: %s" % "; ".join("%s %s" % (e["class"], e["break_even_text"]) for e in block["classes"]))


def test_the_same_interpolation_as_the_service_wide_break_even(block):
    """The class's break-even is sweep_analysis.break_even over points whose sides are the class's own summaries."""
    mixed = by_class(block)["mixed"]
    points = []
    for index, load in enumerate(LOADS):
        baseline, candidate = sides_at(index, {"mixed": CANDIDATE_TPOT["mixed"]})
        points.append({"kind": "request_rate", "load": load, "baseline": request_classes.class_summary(baseline["records"]),
                       "candidate": request_classes.class_summary(candidate["records"])})
    whole = sweep_analysis.break_even(points)
    assert mixed["break_even"]["crossover_load"] == pytest.approx(whole["crossover_load"])
    assert mixed["break_even"]["crossed_first"] == whole["crossed_first"]
    # the TPOT margin's own interpolation: (limit - candidate) / baseline at 2 and 4 req/s
    tpot = whole["crossover_by_metric"]["tpot"]
    m1 = (points[1]["baseline"]["tpot_ms"]["median"] - points[1]["candidate"]["tpot_ms"]["median"]) / points[1]["baseline"]["tpot_ms"]["median"]
    m2 = (points[2]["baseline"]["tpot_ms"]["median"] - points[2]["candidate"]["tpot_ms"]["median"]) / points[2]["baseline"]["tpot_ms"]["median"]
    assert tpot == pytest.approx(2.0 + 2.0 * m1 / (m1 - m2))


def test_figures_per_load_are_the_ab_per_class_statistics(block):
    """At every load, each class's decision, gain and medians with intervals equal request_classes.class_report's on the
    same requests: one statistic, two reports."""
    for index, load in enumerate(LOADS):
        baseline, candidate = sides_at(index)
        ab = {e["class"]: e for e in request_classes.class_report(baseline, candidate, acceptance=candidate["acceptance"])["classes"]}
        for name, entry in by_class(block).items():
            row = next(r for r in entry["loads"] if r["load"] == load)
            assert row["decision"] == ab[name]["decision"], (name, load)
            assert row["speedup"] == pytest.approx(ab[name]["speedup"])
            assert row["latency"] == ab[name]["latency"]
            assert row["acceptance"] == ab[name]["acceptance"]
            assert row["requests"] == ab[name]["requests"]


def test_decision_at_the_target_with_its_confidence(block):
    entries = by_class(block)
    code = entries["code"]["target"]
    assert (code["load"], code["exact"], code["decision"]) == (4.0, True, "keep")
    baseline, candidate = sides_at(2)
    ab = {e["class"]: e for e in request_classes.class_report(baseline, candidate)["classes"]}
    for name in ("code", "chat", "mixed"):
        target = entries[name]["target"]
        assert (target["decision"], target["outcome"]) == (ab[name]["decision"], ab[name]["outcome"])
        assert target["gain_confidence"] == pytest.approx(ab[name]["gain_confidence"])
        assert target["confidence"] == ab[name]["confidence"]
    assert code["gain_confidence"] > 0.99
    assert entries["mixed"]["target"]["decision"] == "roll_back"


def test_guard_routes_by_break_even_at_the_target(block):
    entries = by_class(block)
    assert entries["code"]["guard"]["pool"] == "speculative" and entries["code"]["guard"]["break_even_load"] is None
    assert entries["chat"]["guard"]["pool"] == "baseline" and "never gains" in entries["chat"]["guard"]["reason"]
    mixed = entries["mixed"]["guard"]
    assert mixed["pool"] == "baseline" and mixed["break_even_load"] == pytest.approx(entries["mixed"]["break_even"]["crossover_load"])
    assert "is below the target load 4 req/s" in mixed["reason"]
    assert block["speculative_classes"] == ["code"]
    # a target below the crossover: the class is still kept where it meets keep (2 req/s is measured, the break-even is above)
    low = sweep_classes.analyse_classes(measurements(), dict(SWEEP, target_qps=2.0))
    assert by_class(low)["mixed"]["guard"]["pool"] == "speculative" and low["speculative_classes"] == ["code", "mixed"]
    # no target: no guard, no decision at a target
    none = sweep_classes.analyse_classes(measurements(), dict(SWEEP, target_qps=None))
    assert all(e["guard"] is None and e["target"] is None for e in none["classes"]) and none["speculative_classes"] == []


def test_acceptance_not_reported_is_said_never_guessed(block):
    entries = by_class(block)
    for row in entries["chat"]["loads"]:
        assert row["acceptance"]["reported"] == 0 and row["acceptance"]["mean_acceptance_length"] is None
        assert row["acceptance"]["note"] == request_classes.NOT_REPORTED
    assert entries["code"]["loads"][0]["acceptance"]["mean_acceptance_length"] == pytest.approx(3.0)
    assert entries["mixed"]["loads"][0]["acceptance"]["acceptance_rate"] == pytest.approx(1 / 3)
    # the window's sums cannot equal the /metrics deltas while chat's requests carried no block: not checked, and why
    assert {c["status"] for c in block["counters_check"]} == {"not_checked"}
    assert "12 of 36 requests" in block["counters_check"][0]["reason"]
    lines = "\n".join(sweep_classes.render_markdown(block))
    assert "| `chat` | 1 | 12 / 12 | not reported | not reported |" in lines
    assert "acceptance: " + request_classes.NOT_REPORTED in lines


def test_counters_equal_when_every_response_reports():
    two = {"code": CANDIDATE_TPOT["code"], "mixed": CANDIDATE_TPOT["mixed"]}
    out = sweep_classes.analyse_classes(measurements(two), SWEEP)
    assert [c["status"] for c in out["counters_check"]] == ["equal"] * 4


def test_a_sweep_without_classes_has_no_block():
    records = _records(None, 0.011)
    side = _side(records)
    assert sweep_classes.measured_classes(side, "candidate") is None
    plain = [measurement(load, name, _side(_records(None, BASE_TPOT if name == "baseline" else 0.011)))
             for load in LOADS for name in ("baseline", "candidate")]
    assert all("classes" not in m for m in plain)
    assert sweep_classes.analyse_classes(plain, SWEEP) is None


def test_a_load_resumed_from_a_release_without_classes_is_left_out_and_said():
    items = measurements()
    for item in items[:2]:  # load 1 as an older sweep's JSON holds it
        item.pop("classes")
        item.pop("classes_counters_check", None)
    out = sweep_classes.analyse_classes(items, SWEEP)
    assert [r["load"] for r in by_class(out)["code"]["loads"]] == LOADS[1:]
    assert any("load 1 has no per-class figures on the baseline and the candidate" in note for note in out["notes"])


def test_a_class_missing_at_the_target_load_goes_to_the_baseline():
    items = measurements()
    for item in items[4:]:  # loads 4 and 8: no `mixed` request measured
        item["classes"] = [e for e in item["classes"] if e["class"] != "mixed"]
    out = sweep_classes.analyse_classes(items, SWEEP)
    mixed = by_class(out)["mixed"]
    assert mixed["target"] is None and mixed["guard"]["pool"] == "baseline"
    assert "no figures of this class at or above the target load" in mixed["guard"]["reason"]
    assert any("class mixed: no decision at the target load" in note for note in out["notes"])


# -- the routing plan's guard --------------------------------------------------------------------------------------------------
def _ab_keeps_all():
    return {"classes": [{"class": name, "decision": "keep", "outcome": "keep", "gain_confidence": 0.99, "speedup": 1.5, "reasons": ["r"]}
                        for name in ("chat", "code", "mixed", "summarize")]}


def test_routing_plan_takes_the_break_even_as_the_guard(block):
    plan = routing_plan.build_plan(_ab_keeps_all(), SPEC, BASE, guard=block)
    pools = {e["class"]: e["pool"] for e in plan["classes"]}
    assert pools == {"chat": "baseline", "code": "speculative", "mixed": "baseline", "summarize": "speculative"}
    reasons = {e["class"]: e["reasons"] for e in plan["classes"]}
    assert any("guard routes it to the baseline: its break-even, about" in r for r in reasons["mixed"])
    assert reasons["summarize"][-1] == "no guard: the load sweep did not measure this class"
    assert plan["speculative_classes"] == ["code", "summarize"]
    route = routing_plan.httproute(plan, "llama-classes", "models")
    backends = {r["name"]: r["backendRefs"][0]["name"] for r in route["spec"]["rules"]}
    assert backends == {"class-chat": BASE["name"], "class-code": SPEC["name"], "class-mixed": BASE["name"],
                        "class-summarize": SPEC["name"], "default": BASE["name"]}
    routing_plan.check_httproute(route)
    # the guard only holds a class back: what the A/B rolled back stays on the baseline whatever the sweep says
    ab = {"classes": [{"class": "code", "decision": "roll_back", "reasons": ["worse"]}]}
    assert routing_plan.build_plan(ab, SPEC, BASE, guard=block)["classes"][0]["pool"] == "baseline"
    # without a guard, the plan is the A/B's
    assert routing_plan.build_plan(_ab_keeps_all(), SPEC, BASE)["speculative_classes"] == ["chat", "code", "mixed", "summarize"]


@pytest.mark.parametrize("guard, needle", [
    ({"classes": "x"}, "is not a load sweep's classes block"),
    ({"classes": [], "target_qps": None}, "without a target load"),
])
def test_routing_plan_guard_refusals_name_the_field(guard, needle):
    with pytest.raises(ValidationError) as err:
        routing_plan.build_plan(_ab_keeps_all(), SPEC, BASE, guard=guard)
    assert err.value.field == "guard" and needle in str(err.value) and err.value.hint


# -- the report --------------------------------------------------------------------------------------------------------------
CONTEXT = bench_report.build_context(
    {"gpu_model": "none (constructed)", "gpu_count": 0, "model": "m", "dtype": "bfloat16", "vllm_version": "0.32.0", "image": "img",
     "baseline_command": "vllm serve m", "candidate_command": "vllm serve m --speculative-config {}"},
    {"temperature": 0.0, "max_tokens": 60, "concurrency": 64, "sampling": {"seed": 0}, "runs_per_prompt": 1, "request_rate": LOADS})


def _sweep_data(items, classes_block):
    result = sweep_analysis.analyse(items, dict(SWEEP, num_speculative_tokens=None), {}, None)
    if classes_block:
        result["classes"] = classes_block
    return {"schema": "alauda.spec_decoding/sweep-results/v1", "title": "T", "context": CONTEXT, "result": result, "notes": [],
            "measurements": items, "protocol": {}}


def test_report_markdown_json_and_plot(block, tmp_path):
    paths = bench_report.write_sweep_report(_sweep_data(measurements(), block), str(tmp_path), basename="s", plots=True)
    text = open(paths["markdown"], encoding="utf-8").read()
    assert "## Per request class" in text
    section = text[text.index("## Per request class"):text.index("## Points")]
    assert "| `code` | gains at every load (up to 8 req/s) | `keep` (keep) at 4 |" in section
    assert "| `chat` | never gains (not even at 1 req/s) | `roll_back`" in section
    assert "| `mixed` | about 3" in section and "| baseline |" in section
    assert "Classes to route to the speculative pool at the target load: `code`." in section
    saved = json.load(open(paths["json"], encoding="utf-8"))
    assert [e["class"] for e in saved["result"]["classes"]["classes"]] == ["chat", "code", "mixed"]
    assert saved["plots"]["classes"] == "s-classes.png"
    assert "![Speedup per request class against load](s-classes.png)" in text
    width, height = check_png(os.path.join(str(tmp_path), "s-classes.png"))[:2]
    assert (width, height) == (800, 450)
    print("\n" + section)


def test_report_without_classes_is_unchanged(tmp_path):
    plain = [measurement(load, name, _side(_records(None, BASE_TPOT if name == "baseline" else 0.011)))
             for load in LOADS for name in ("baseline", "candidate")]
    paths = bench_report.write_sweep_report(_sweep_data(plain, None), str(tmp_path), basename="s", plots=True)
    text = open(paths["markdown"], encoding="utf-8").read()
    assert "Per request class" not in text and "classes" not in json.load(open(paths["json"], encoding="utf-8"))["plots"]
    assert not os.path.exists(os.path.join(str(tmp_path), "s-classes.png"))
