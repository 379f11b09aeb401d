"""The known-curve proposer (tests/e2e/known_curve_proposer.py) on its own, without vLLM: it is the ground truth of
the e2e ground-truth test, so its curve is checked here against a binomial bound before any server trusts it."""
import json
import math
import os
import random
from types import SimpleNamespace

import numpy as np
import pytest

from tests.e2e import known_curve_proposer as kcp

VOCAB = 4096


def make(tmp_path, monkeypatch, rates, seed=0):
    config = tmp_path / "curve.json"
    config.write_text(json.dumps({"conditional_rates": rates, "seed": seed}))
    monkeypatch.setenv(kcp.CONFIG_ENV, str(config))
    monkeypatch.setenv(kcp.STATS_ENV, str(tmp_path / "stats.json"))
    vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=len(rates)),
                                  model_config=SimpleNamespace(get_vocab_size=lambda: VOCAB))
    return kcp.KnownCurveProposer(vllm_config), config


def step(proposer, sequences):
    """One propose() call as vLLM's model runner makes it: a token table padded to its widest row."""
    width = max(len(s) for s in sequences)
    table = np.zeros((len(sequences), width), dtype=np.int32)
    for row, seq in enumerate(sequences):
        table[row, :len(seq)] = seq
    return proposer.propose([[int(s[-1])] for s in sequences], np.array([len(s) for s in sequences]), table)


def accepted(draft, truth):
    """vLLM's greedy verification: the draft's tokens are accepted left to right up to the first that differs."""
    count = 0
    for got, want in zip(draft, truth):
        if got != want:
            break
        count += 1
    return count


def test_conditional_acceptance_per_slot_is_the_configured_rate(tmp_path, monkeypatch):
    rates = [0.9, 0.7, 0.4, 0.1]
    k = len(rates)
    proposer = make(tmp_path, monkeypatch, rates)[0]
    rng = random.Random(7)
    truth = np.array([rng.randrange(VOCAB) for _index in range(400)], dtype=np.int32)
    assert step(proposer, [truth[:20]]) == [[]]  # never seen: recorded, not drafted
    step(proposer, [truth])  # the whole greedy run is now known
    reached = [0] * (k + 1)  # reached[i]: drafts whose slots 1..i were all accepted
    for _round in range(12):
        drafts = step(proposer, [truth[:n] for n in range(20, 400 - k - 1)])
        for n, draft in zip(range(20, 400 - k - 1), drafts):
            assert len(draft) == k and all(0 <= t < VOCAB for t in draft)
            for i in range(accepted(draft, truth[n:n + k]) + 1):
                reached[i] += 1
    for i, p in enumerate(rates):
        trials, hits = reached[i], reached[i + 1]
        bound = 4 * math.sqrt(trials * p * (1 - p))
        assert abs(hits - trials * p) <= bound, (i + 1, hits, trials, p)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["right_per_slot"] == reached[1:] and stats["drafts"] == reached[0] and stats["divergences"] == 0


def test_no_draft_near_the_end_of_what_is_known(tmp_path, monkeypatch):
    proposer = make(tmp_path, monkeypatch, [1.0, 1.0, 1.0])[0]
    truth = np.arange(100, 150, dtype=np.int32)
    step(proposer, [truth])
    drafts = step(proposer, [truth[:46], truth[:47]])  # 4 = k + 1 known tokens ahead, then 3
    assert drafts == [[146, 147, 148], []]


def test_wrong_slots_never_hold_the_right_token(tmp_path, monkeypatch):
    proposer = make(tmp_path, monkeypatch, [0.0, 0.0])[0]
    truth = np.full(30, VOCAB - 1, dtype=np.int32)  # the wrong token wraps around the vocabulary
    step(proposer, [truth])
    assert step(proposer, [truth[:10]]) == [[0, 0]]


def test_a_new_curve_is_read_when_the_file_changes(tmp_path, monkeypatch):
    proposer, config = make(tmp_path, monkeypatch, [0.0, 0.0])
    truth = np.arange(10, 60, dtype=np.int32)
    step(proposer, [truth])
    assert accepted(step(proposer, [truth[:5]])[0], truth[5:7]) == 0
    config.write_text(json.dumps({"conditional_rates": [1.0, 1.0], "seed": 3}))
    os.utime(config, ns=(1, 10 ** 18))
    assert step(proposer, [truth[:5]]) == [[15, 16]]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["conditional_rates"] == [1.0, 1.0] and stats["drafts"] == 1 and stats["config_loads"] == 2


def test_a_greedy_run_that_differs_from_the_recorded_one_is_counted(tmp_path, monkeypatch):
    proposer = make(tmp_path, monkeypatch, [1.0])[0]
    truth = np.arange(200, 260, dtype=np.int32)
    step(proposer, [truth])
    other = truth.copy()
    other[40] += 1  # the target broke a near-tie the other way at position 40
    step(proposer, [other[:45]])
    assert json.loads((tmp_path / "stats.json").read_text())["divergences"] == 1
    assert step(proposer, [other[:41]]) == [[int(other[41])]]  # the new run is recorded beside the old one
    assert step(proposer, [other[:44]]) == [[]]  # but known only up to 45 tokens


def test_a_curve_of_the_wrong_length_is_refused(tmp_path, monkeypatch):
    proposer, config = make(tmp_path, monkeypatch, [0.5, 0.5])
    config.write_text(json.dumps({"conditional_rates": [0.5]}))
    os.utime(config, ns=(1, 2 * 10 ** 18))
    with pytest.raises(ValueError, match="conditional_rates must be 2 numbers"):
        step(proposer, [np.arange(5, dtype=np.int32)])
