"""A vLLM proposer whose per-position conditional acceptance is known in advance (issue #34, ground-truth runs).

Loaded by a real vLLM 0.32 server through ``--speculative-config '{"method": "custom_class", "model":
"known_curve_proposer.KnownCurveProposer", "num_speculative_tokens": K}'`` with this folder on the server's
``PYTHONPATH`` (vLLM imports the class by module path in ``vllm/v1/spec_decode/custom_class_proposer.py`` and calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` once per step from the model
runner, the same call the CPU runner makes). It is test equipment, not product: it lives with the e2e tests.

How it knows the right token. The server samples greedily (temperature 0), and speculative decoding is lossless
under greedy sampling, so every request's output is the target's greedy continuation whatever is drafted. The
proposer sees each running request's whole sequence (prompt and output) at every step and keeps the longest it has
seen per prefix: a request whose prompt was sent before finds its greedy continuation there. A request with fewer
than K + 1 known tokens ahead gets no draft at all (an empty proposal is not counted as a draft by vLLM), so the
first run of a prompt only records it, and a draft is never cut short by the end of what is known.

How it sets the curve. Slot i (1-based) of a draft holds the right token with probability ``p_i`` when slots 1..i-1
hold right ones, a wrong token (``(right + 1) % vocab``) otherwise, and every slot after the first wrong one is wrong
too. vLLM's greedy verification accepts a draft left to right up to the first token that differs from the target's
argmax, so the conditional acceptance of slot i is ``p_i`` and vLLM's per-position rate
``accepted_per_pos[i] / drafts`` is ``p_1 * ... * p_i``.

Control file (``KNOWN_CURVE_CONFIG``, JSON, read again whenever its modification time changes, so one server serves
several curves in turn): ``{"conditional_rates": [p_1, ..., p_K], "seed": 0}``. Every step it writes what it did to
``KNOWN_CURVE_STATS`` (JSON, optional): drafts proposed, right tokens placed per slot, and ``divergences``, the
times a request's greedy output differed from an earlier recorded one for the same prefix (a near-tie the target
broke differently in another batch shape; each one makes one slot that was meant to be accepted be rejected).

A k schedule (``num_speculative_tokens_per_batch_size``). vLLM 0.32's scheduler picks the k of each step from the
schedule by the number of requests it schedules (``Scheduler.dynamic_sd_lookup[len(num_scheduled_tokens)]``) and the
GPU model runner hands it to the proposers that take a k (ngram, suffix, draft models: ``num_spec_tokens_to_schedule``);
a ``custom_class`` proposer is called without it and vLLM does not trim what it returns. So this proposer does what
vLLM's own proposers are told to do: it reads the schedule from the engine's validated config (``None`` when vLLM
dropped it, e.g. for data parallelism), expands it with vLLM's ``build_dynamic_sd_schedule_lookup`` and drafts
``lookup[batch]`` slots for a step of ``batch`` requests (the rows it is called with, the requests the scheduler
scheduled). vLLM counts what it verified (``vllm:spec_decode_num_draft_tokens``): the draft length per load.

Only the standard library and numpy (vLLM's own dependency) are imported: the server's interpreter is the vLLM venv.
"""
import json
import os
import random

import numpy as np

CONFIG_ENV = "KNOWN_CURVE_CONFIG"
STATS_ENV = "KNOWN_CURVE_STATS"


class KnownCurveProposer:
    """vLLM 0.32 ``custom_class`` proposer: right token at slot i with conditional probability p_i."""

    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.vocab = int(vllm_config.model_config.get_vocab_size())
        self.config_path = os.environ.get(CONFIG_ENV)
        self.stats_path = os.environ.get(STATS_ENV)
        self.config_mtime = None
        self.rates = [1.0] * self.k
        self.rng = random.Random(0)
        self.known = []  # the longest sequence seen per prefix (numpy int arrays)
        self.stats = {}
        self.lookup = None
        schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None)
        if schedule:
            from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup  # pylint: disable=import-outside-toplevel,import-error
            self.lookup = build_dynamic_sd_schedule_lookup(schedule, vllm_max_batch_size=int(vllm_config.scheduler_config.max_num_seqs),
                                                           vllm_num_speculative_tokens=self.k)
        self.schedule = [list(entry) for entry in schedule] if schedule else None
        self._reset_stats()
        self._reload()

    def _reset_stats(self):
        self.stats = {"k": self.k, "conditional_rates": list(self.rates), "drafts": 0, "right_per_slot": [0] * self.k,
                      "no_draft_unknown": 0, "divergences": 0, "known_sequences": len(self.known), "config_loads": 0,
                      "schedule": self.schedule, "draft_length_by_batch": {}}

    def _reload(self):
        if not self.config_path:
            return
        try:
            mtime = os.stat(self.config_path).st_mtime_ns
        except OSError:
            return
        if mtime == self.config_mtime:
            return
        with open(self.config_path, encoding="utf-8") as handle:
            config = json.load(handle)
        rates = [float(p) for p in config["conditional_rates"]]
        if len(rates) != self.k or not all(0.0 <= p <= 1.0 for p in rates):
            raise ValueError("%s: conditional_rates must be %d numbers in [0, 1], got %r" % (self.config_path, self.k, rates))
        loads = self.stats.get("config_loads", 0) + 1
        self.config_mtime = mtime
        self.rates = rates
        self.rng = random.Random(int(config.get("seed", 0)))
        self._reset_stats()  # stats per curve: the test reads them beside the /metrics deltas of the same curve
        self.stats["config_loads"] = loads

    def load_model(self, *args, **kwargs):  # the CPU runner calls it on every drafter; nothing to load
        return None

    def _learn(self, seq):
        """Keep ``seq`` as the longest known sequence of its prefix; count a divergence from a recorded one."""
        n = len(seq)
        for index, known in enumerate(self.known):
            m = min(n, len(known))
            if np.array_equal(known[:m], seq[:m]):
                if n > len(known):
                    self.known[index] = seq.copy()
                return
        # No recorded sequence is a prefix of this one nor extends it: a new prompt, or the target's greedy output
        # differed from an earlier run of the same prompt (counted when they share more than the prompt's first half).
        for known in self.known:
            m = min(n, len(known))
            same = int(np.argmin(known[:m] == seq[:m]))
            if same > m // 2:
                self.stats["divergences"] += 1
                break
        self.known.append(seq.copy())

    def _truth(self, seq):
        n = len(seq)
        for known in self.known:
            if len(known) >= n + self.k + 1 and np.array_equal(known[:n], seq):
                return known[n:n + self.k]
        return None

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):  # pylint: disable=unused-argument
        self._reload()
        drafts = []
        batch = len(sampled_token_ids)
        width = self.k if self.lookup is None else self.lookup[min(batch, len(self.lookup) - 1)]
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a prefill chunk: vLLM drafts nothing for it
                drafts.append([])
                continue
            seq = np.asarray(token_ids_cpu[row, :int(num_tokens_no_spec[row])])
            self._learn(seq)
            truth = self._truth(seq)
            if width == 0:  # the schedule says no drafts at this batch size
                drafts.append([])
                continue
            if truth is None:
                self.stats["no_draft_unknown"] += 1
                drafts.append([])
                continue
            draft, right = [], True
            for slot in range(width):
                token = int(truth[slot])
                right = right and self.rng.random() < self.rates[slot]
                if right:
                    self.stats["right_per_slot"][slot] += 1
                draft.append(token if right else (token + 1) % self.vocab)
            self.stats["drafts"] += 1
            self.stats["draft_length_by_batch"].setdefault(str(batch), {})
            lengths = self.stats["draft_length_by_batch"][str(batch)]
            lengths[str(width)] = lengths.get(str(width), 0) + 1
            drafts.append(draft)
        self.stats["known_sequences"] = len(self.known)
        self._write_stats()
        return drafts

    def _write_stats(self):
        if not self.stats_path:
            return
        tmp = self.stats_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(self.stats, handle)
        os.replace(tmp, self.stats_path)
