"""The routing plan's guard in the routing_plan filter (issue #52): the load sweep's per-class break-even at its target load
holds back a class the A/B keeps; the sweep alone (tune.yml) renders a plan guarded by itself; the benchmark and tune roles
pass the guard where the sweep produced it. The sweep block is bench/sweep_classes.analyse_classes' own answer on records
of three classes: `code` gains at every load, `chat` at none, `mixed` crosses between 2 and 4 req/s (target 4 req/s)."""
import json

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.routing_plan import routing_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import stats as bench_stats
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import sweep_classes
from tests.ansible_run import run_playbook
from tests.request_class_records import class_records

SPEC = {"name": "llama-ngram-predictor", "port": 80}
BASE = {"name": "llama-predictor", "port": 80}
LOADS = [1.0, 2.0, 4.0, 8.0]
# candidate TPOT (s) per class and load against a baseline of 20 ms
CANDIDATE_TPOT = {"code": [0.011, 0.011, 0.012, 0.012], "chat": [0.024, 0.025, 0.026, 0.028], "mixed": [0.012, 0.015, 0.024, 0.030]}


def _side(records):
    return {"summary": bench_stats.summarize_run(records, sum(r["latency"] for r in records)), "acceptance": None, "records": records}


def _sweep_block(target_qps=4.0):
    items = []
    for index, load in enumerate(LOADS):
        for side_name in sweep_classes.SIDES:
            records = [r for name, tpots in CANDIDATE_TPOT.items()
                       for r in class_records(name, 0.020 if side_name == "baseline" else tpots[index])]
            side = _side(records)
            items.append({"kind": "request_rate", "load": load, "side": side_name, "summary": side["summary"],
                          "classes": sweep_classes.measured_classes(side, side_name)})
    return sweep_classes.analyse_classes(items, {"request_rates": LOADS, "concurrencies": None, "target_qps": target_qps})


@pytest.fixture(scope="module")
def sweep():
    block = _sweep_block()
    # what the guard says, from the sweep's own statistics (not from this test)
    assert {e["class"]: e["guard"]["pool"] for e in block["classes"]} == {"chat": "baseline", "code": "speculative", "mixed": "baseline"}
    return block


def _report(**decisions):
    return {"schema": "alauda.spec_decoding/benchmark-report/v1", "decision": {"decision": "keep"},
            "classes": None if not decisions else {"classes": [
                {"class": name, "decision": decision, "outcome": decision, "reasons": ["a/b"]} for name, decision in sorted(decisions.items())]}}


def _pools(route):
    return {r["name"]: r["backendRefs"][0]["name"] for r in route["spec"]["rules"]}


def test_no_class_the_guard_changes_nothing(sweep):
    route = routing_plan(_report(), SPEC, BASE, guard=sweep)
    assert _pools(route) == {"default": BASE["name"]}


def test_one_class_kept_where_the_guard_agrees(sweep):
    plan = routing_plan(_report(code="keep"), SPEC, BASE, guard=sweep, render="plan")
    [code] = plan["classes"]
    assert code["pool"] == "speculative" and code["guard"]["pool"] == "speculative" and plan["speculative_classes"] == ["code"]


def test_all_classes_gain_in_the_ab_the_guard_flips_the_one_below_its_break_even(sweep):
    ab = _report(code="keep", mixed="keep", summarize="keep")
    unguarded = routing_plan(ab, SPEC, BASE)
    assert _pools(unguarded) == {"class-code": SPEC["name"], "class-mixed": SPEC["name"], "class-summarize": SPEC["name"], "default": BASE["name"]}
    guarded = routing_plan(ab, SPEC, BASE, guard=sweep)
    # mixed's break-even (between 2 and 4 req/s) is below the target 4 req/s: the baseline; summarize was not swept: kept
    assert _pools(guarded) == {"class-code": SPEC["name"], "class-mixed": BASE["name"], "class-summarize": SPEC["name"], "default": BASE["name"]}
    annotation = json.loads(guarded["metadata"]["annotations"]["spec-decoding.alauda.io/routing-plan"])
    assert annotation == {"default": "baseline", "classes": {"code": "speculative", "mixed": "baseline", "summarize": "speculative"}}
    plan = routing_plan(ab, SPEC, BASE, guard=sweep, render="plan")
    reasons = {e["class"]: e["reasons"] for e in plan["classes"]}
    assert any("break-even" in r and "is below the target load 4 req/s" in r for r in reasons["mixed"])
    assert reasons["summarize"][-1] == "no guard: the load sweep did not measure this class"


def test_the_guard_in_every_form_a_playbook_holds_it(sweep):
    ab = _report(code="keep", mixed="keep")
    sweep_json = {"schema": "alauda.spec_decoding/sweep-results/v1", "measurements": [], "result": {"classes": sweep}}
    module_result = {"changed": False, "decision": None, "classes": sweep}
    for guard in (sweep, sweep_json, module_result):
        assert routing_plan(ab, SPEC, BASE, guard=guard, render="plan")["speculative_classes"] == ["code"]
    for empty in (None, {}):
        assert routing_plan(ab, SPEC, BASE, guard=empty, render="plan")["speculative_classes"] == ["code", "mixed"]


def test_the_sweep_alone_is_its_own_guard(sweep):
    """tune.yml without an A/B: the decisions at the target load, guarded by the same sweep; the sweep's JSON file as input."""
    sweep_json = {"schema": "alauda.spec_decoding/sweep-results/v1", "measurements": [], "result": {"classes": sweep}}
    for given in (sweep, sweep_json):
        route = routing_plan(given, SPEC, BASE)
        assert _pools(route) == {"class-chat": BASE["name"], "class-code": SPEC["name"], "class-mixed": BASE["name"], "default": BASE["name"]}
    # a target of 2 req/s: mixed meets keep there and its break-even is above it
    low = _sweep_block(target_qps=2.0)
    assert routing_plan(low, SPEC, BASE, render="plan")["speculative_classes"] == ["code", "mixed"]


def test_refusals_name_the_guard():
    with pytest.raises(AnsibleFilterError, match="guard: the sweep was measured without a target load"):
        routing_plan(_report(code="keep"), SPEC, BASE, guard=_sweep_block(target_qps=None))
    with pytest.raises(AnsibleFilterError, match="guard: the sweep measured no request class"):
        routing_plan(_report(code="keep"), SPEC, BASE, guard={"measurements": [], "result": {"break_even": None}})
    with pytest.raises(AnsibleFilterError, match="guard: is not a load sweep's classes block"):
        routing_plan(_report(code="keep"), SPEC, BASE, guard={"classes": "code"})


def test_the_roles_pass_the_sweeps_guard(tmp_path, sweep):
    """benchmark: benchmark_routing_plan.guard_report (the sweep's JSON); tune: the sweep's JSON is the plan and its guard."""
    ab_path, sweep_path = tmp_path / "ab.json", tmp_path / "sweep.json"
    ab_path.write_text(json.dumps(_report(code="keep", mixed="keep")))
    sweep_path.write_text(json.dumps({"schema": "alauda.spec_decoding/sweep-results/v1", "measurements": [], "result": {"classes": sweep}}))
    plan = """
      speculative_service: {name: llama-ngram-predictor, port: 80}
      baseline_service: {name: llama-predictor, port: 80}"""
    tasks = """
- name: Benchmark routes guarded by the sweep
  ansible.builtin.include_role:
    name: alauda.spec_decoding.benchmark
    tasks_from: routes
  vars:
    benchmark_result: {{report_json: "{ab}"}}
    benchmark_report_dir: "{dir}"
    benchmark_report_name: ab
    benchmark_namespace: models
    benchmark_routing_plan:{plan}
      guard_report: "{sweep}"
- name: Tune's routing step, with the sweep's result as the role registers it
  ansible.builtin.include_role:
    name: alauda.spec_decoding.tune
    tasks_from: routes
  vars:
    tune_result: {{report_json: "{sweep}", classes: {{}}}}
    tune_routing_plan:{plan}
    tune_report_dir: "{dir}"
    tune_report_name: sweep
    tune_namespace: models
""".format(ab=ab_path, sweep=sweep_path, dir=tmp_path, plan=plan)
    run = run_playbook(tmp_path, tasks=tasks)
    assert run.rc == 0, run.output
    ab_route = yaml.safe_load((tmp_path / "ab-httproute.yaml").read_text())
    assert _pools(ab_route) == {"class-code": SPEC["name"], "class-mixed": BASE["name"], "default": BASE["name"]}
    tune_route = yaml.safe_load((tmp_path / "sweep-httproute.yaml").read_text())
    assert _pools(tune_route) == {"class-chat": BASE["name"], "class-code": SPEC["name"], "class-mixed": BASE["name"], "default": BASE["name"]}
