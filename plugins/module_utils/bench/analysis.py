# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The analysis engine of the canary and the watchdog: checks on a window's figures, a verdict per window, and budgets
across windows the way Argo Rollouts' AnalysisRun has them.

- A window's figures are ``canary_window.revision_figures`` of the pods' deltas between two /metrics scrapes
  (``window_figures``): requests, TTFT/TPOT/ITL/E2EL quantiles, the bucket counts, acceptance rate, mean acceptance
  length and per-position rates. ``figure`` reads one by name (``acceptance_rate``, ``tpot_median``, ``position_2_rate``).
- A check (``check_spec``) is a condition on one figure: absolute (``min`` / ``max``) or against a baseline (``better``
  ``lower``/``higher`` with a ``tolerance`` fraction); ``dry_run`` checks are evaluated and reported, never decide.
- A window's verdict (``window_verdict``): ``error`` when a scrape or read failed (never a failure), ``inconclusive`` on
  too little traffic, when a check cannot be measured, or when its noise test (bench/noise.py: ranks on the histograms
  for latency medians, exceedances for tails, the draft as the unit for acceptance, E2E latency for the output rate)
  is sure neither that the figure is beyond its limit nor that it is within; ``fail`` when a deciding check is sure to
  be beyond (its share of ``1 - confidence``), ``pass`` when every deciding check is sure to be within.
- Budgets (``Budgets``, ``AnalysisRun``): the run is ``failed`` when failures exceed ``failure_limit``,
  ``inconclusive`` when inconclusives exceed ``inconclusive_limit``, ``error`` when consecutive errors exceed
  ``consecutive_error_limit`` (Argo's ``failureLimit``, ``inconclusiveLimit``, ``consecutiveErrorLimit``), else
  ``successful`` after ``count`` windows with at least one ``pass``. ``initial_delay`` seconds pass before the first
  scrape (warm-up).

The error rates these give, measured by a seeded simulation on vLLM's bucket bounds (tests/unit/test_noise_calibration.py),
are in docs/rollback.md. Plain Python, no Ansible imports, no API calls; every test is closed-form (deterministic).
"""

from __future__ import annotations

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import canary_window
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import noise

PASS, FAIL, INCONCLUSIVE, ERROR = "pass", "fail", "inconclusive", "error"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, ERROR)
RUNNING, SUCCESSFUL, FAILED = "running", "successful", "failed"
DEFAULT_CONFIDENCE = 0.95

# figure name -> path into revision_figures' result; latency quantiles are in ms.
_ALIASES = {"requests": ("requests",), "generation_tokens": ("generation_tokens",), "output_rate": ("output_rate_per_request",),
            "request_rate": ("request_rate",), "acceptance_rate": ("acceptance", "draft_acceptance_rate"),
            "mean_acceptance_length": ("acceptance", "mean_acceptance_length")}
for _key in canary_window.HISTOGRAMS:
    for _stat in ("median", "p99", "mean"):
        _ALIASES["%s_%s" % (_key, _stat)] = ("%s_ms" % _key, _stat)


def figure_names():
    return sorted(_ALIASES) + ["position_<n>_rate"]


def figure(figures, name):
    """One figure of a window by name (None when the window cannot give it); ValidationError on an unknown name."""
    if name.startswith("position_") and name.endswith("_rate"):
        try:
            pos = int(name[len("position_"):-len("_rate")])
        except ValueError:
            pos = 0
        if pos < 1:
            raise ValidationError("%r names no draft position" % name, field="checks", hint="write position_1_rate, position_2_rate, ...")
        rates = ((figures or {}).get("acceptance") or {}).get("per_position_acceptance_rate") or []
        return rates[pos - 1] if pos <= len(rates) else None
    path = _ALIASES.get(name)
    if path is None:
        raise ValidationError("unknown figure %r" % name, field="checks", hint="use one of %s" % ", ".join(figure_names()))
    value = figures
    for key in path:
        value = (value or {}).get(key) if isinstance(value, dict) else None
    return value


def window_figures(pod_deltas, window_s):
    """A window's figures from the pods' deltas (``canary_window.window_delta``)."""
    return canary_window.revision_figures(pod_deltas, window_s)


# -- checks -----------------------------------------------------------------------------------------------------------

def check_spec(check, field="checks"):
    """A check, validated: ``{name, figure, min | max | (better, tolerance), dry_run}``."""
    if not isinstance(check, dict) or not check.get("figure"):
        raise ValidationError("each check needs a figure, got %r" % (check,), field=field,
                              hint="e.g. {name: acceptance, figure: acceptance_rate, better: higher, tolerance: 0.3}")
    figure({}, check["figure"])  # the name is known
    out = {"name": check.get("name") or check["figure"], "figure": check["figure"], "dry_run": bool(check.get("dry_run"))}
    bounds = [k for k in ("min", "max") if check.get(k) is not None]
    if check.get("better") is not None:
        if check["better"] not in ("lower", "higher") or bounds:
            raise ValidationError("check %s: better must be lower or higher, without min/max" % out["name"], field=field,
                                  hint="compare with the baseline (better + tolerance) or with a bound (min or max)")
        tol = check.get("tolerance", 0.0)
        if not isinstance(tol, (int, float)) or isinstance(tol, bool) or tol < 0:
            raise ValidationError("check %s: tolerance must be a fraction >= 0, got %r" % (out["name"], tol), field=field,
                                  hint="e.g. 0.2 lets the figure be 20% worse than the baseline")
        out.update(better=check["better"], tolerance=float(tol))
    elif bounds:
        for key in bounds:
            if not isinstance(check[key], (int, float)) or isinstance(check[key], bool):
                raise ValidationError("check %s: %s must be a number" % (out["name"], key), field=field)
            out[key] = float(check[key])
    else:
        raise ValidationError("check %s has no condition" % out["name"], field=field,
                              hint="give min or max (a bound), or better and tolerance (against the baseline)")
    return out


def rank_test(baseline_buckets, candidate_buckets, better="lower"):
    """One-sided Mann-Whitney U on two histograms (each bucket a tie group, on the bounds both sides have): how sure
    (0..1) we are that the candidate is worse than the baseline. None when a side is empty; BoundsMismatch
    (bench/noise.py) when they share no bound."""
    out = noise.rank_pvalues(baseline_buckets, candidate_buckets, better)
    return None if out is None else 1.0 - out["worse"]


def proportion_test(base_hits, base_n, cand_hits, cand_n, better="higher"):
    """One-sided two-proportion z-test: how sure (0..1) we are that the candidate's proportion is worse."""
    try:
        return noise.proportion_pvalue(base_hits, base_n, cand_hits, cand_n, better)
    except ValueError as exc:
        raise ValidationError(str(exc), field="checks", hint="hits are counted among the trials: a count above them is a scrape error") from exc


def evaluate_check(check, figures, baseline=None, confidence=DEFAULT_CONFIDENCE, fail_alpha=None):
    """One check on a window: ``passed`` True / False / None.

    Against the baseline (``better`` + ``tolerance``) the figure's noise test decides, never the side of the limit a
    point estimate falls on: ``False`` when it is sure the figure is beyond the limit (p below ``fail_alpha``, default
    ``1 - confidence``; the window splits its rate over its checks), ``True`` when it is sure (``confidence``) the
    figure is within it, else ``None``, inside the noise. A figure without a test (counts) and the bounds
    (``min``/``max``) are compared as measured."""
    fail_alpha = 1.0 - confidence if fail_alpha is None else fail_alpha
    value = figure(figures, check["figure"])
    row = {"name": check["name"], "figure": check["figure"], "value": value, "dry_run": check["dry_run"], "passed": None,
           "confidence": None}
    if value is None:
        row["why"] = "%s was not measured in the window" % check["figure"]
        return row
    if "better" in check:
        base = figure(baseline, check["figure"]) if baseline else None
        row.update(baseline=base, better=check["better"], tolerance=check["tolerance"])
        if base is None:
            row["why"] = "the baseline has no %s" % check["figure"]
            return row
        limit = base * (1 + check["tolerance"]) if check["better"] == "lower" else base * (1 - check["tolerance"])
        row["limit"] = limit
        beyond = value > limit if check["better"] == "lower" else value < limit
        measured = f"{check['figure']} {value:.4g} vs baseline {base:.4g} (limit {limit:.4g})"
        try:
            test = noise.pvalues(check["figure"], baseline, figures, check["better"], check["tolerance"], confidence)
        except noise.BoundsMismatch as exc:
            row["why"] = f"{measured}: {exc}; scrape both sides with the same buckets"
            return row
        if test is None:
            row["passed"] = not beyond
            row["why"] = measured + ", as measured (a count: no noise test)"
            return row
        row.update(confidence=1.0 - test["worse"], noise_test=test["test"])
        if beyond and test["worse"] < fail_alpha:
            row["passed"] = False
            row["why"] = f"{measured}, {100 * (1 - test['worse']):.1f}% sure it is beyond the limit ({test['test']})"
        elif test["within"] < 1.0 - confidence:
            row["passed"] = True
            row["why"] = f"{measured}, {100 * (1 - test['within']):.1f}% sure it is within ({test['test']})"
        else:
            row["why"] = (f"{measured} is inside the noise: {100 * (1 - test['worse']):.0f}% sure it is beyond the limit "
                          f"({100 * (1 - fail_alpha):.1f}% needed to fail), {100 * (1 - test['within']):.0f}% sure it is within "
                          f"({100 * confidence:.0f}% needed to pass; {test['test']})")
        return row
    row.update({k: check[k] for k in ("min", "max") if k in check})
    row["passed"] = ("min" not in check or value >= check["min"]) and ("max" not in check or value <= check["max"])
    row["why"] = "%s %.4g (%s)" % (check["figure"], value, ", ".join("%s %.4g" % (k, check[k]) for k in ("min", "max") if k in check))
    return row


def window_verdict(checks, figures=None, baseline=None, min_requests=1, error=None, confidence=DEFAULT_CONFIDENCE, extra=None):
    """A window's verdict: ``{"verdict", "reasons", "checks", "confidence"}``.

    ``confidence`` is the window's: its deciding checks share ``1 - confidence`` as their false-fail rate (Bonferroni),
    so an identical pair fails the window at most that often. ``error``: why a scrape or read failed (the verdict is
    then ``error`` and no check is evaluated). ``extra``: rows already evaluated elsewhere (the canary's keep rule) with
    the same keys as ``evaluate_check``'s.
    """
    if error:
        return {"verdict": ERROR, "reasons": list(error) if isinstance(error, (list, tuple)) else [error], "checks": [], "confidence": None}
    requests = (figures or {}).get("requests") or 0
    sides = [("the window", figures)] + ([("the baseline", baseline)] if baseline is not None and "requests" in baseline else [])
    short = ["%s had %d requests, fewer than min_requests %d" % (label, (fig or {}).get("requests") or 0, min_requests)
             for label, fig in sides if ((fig or {}).get("requests") or 0) < min_requests]
    if short:
        return {"verdict": INCONCLUSIVE, "reasons": ["too little traffic: " + s for s in short], "checks": [], "confidence": None,
                "requests": requests}
    fail_alpha = (1.0 - confidence) / max(1, sum(1 for c in checks if not c["dry_run"]))
    rows = list(extra or []) + [evaluate_check(c, figures, baseline, confidence, fail_alpha) for c in checks]
    deciding = [r for r in rows if not r.get("dry_run")]
    failed = [r for r in deciding if r["passed"] is False]
    unsure = [r for r in deciding if r["passed"] is None]
    if failed:
        verdict, why = FAIL, failed
    elif unsure:
        verdict, why = INCONCLUSIVE, unsure
    else:
        verdict, why = PASS, deciding
    sure = [r["confidence"] for r in failed if r.get("confidence") is not None]
    reasons = ["%s: %s" % (r["name"], r.get("why") or ("passed" if r["passed"] else "failed")) for r in why]
    reasons += ["dry run, not deciding - %s: %s" % (r["name"], r.get("why") or "") for r in rows if r.get("dry_run") and r["passed"] is not True]
    return {"verdict": verdict, "reasons": reasons, "checks": rows, "confidence": min(sure) if sure else None, "requests": requests}


# -- budgets across windows -------------------------------------------------------------------------------------------

class Budgets:
    """Argo Rollouts' analysis limits: more failures than ``failure_limit`` fail the run, more inconclusive windows than
    ``inconclusive_limit`` make it inconclusive, more errors in a row than ``consecutive_error_limit`` end it in error."""

    def __init__(self, count=1, interval=None, failure_limit=0, inconclusive_limit=0, consecutive_error_limit=4, initial_delay=0.0):
        self.count, self.interval = count, interval
        self.failure_limit, self.inconclusive_limit = failure_limit, inconclusive_limit
        self.consecutive_error_limit, self.initial_delay = consecutive_error_limit, initial_delay

    @classmethod
    def from_params(cls, params, prefix=""):
        """From module options (``count``, ``interval``, ``failure_limit``, ...), validated."""
        def get(key, default):
            value = params.get(prefix + key)
            return default if value is None else value
        budgets = cls(count=get("count", 1), interval=params.get(prefix + "interval"), failure_limit=get("failure_limit", 0),
                      inconclusive_limit=get("inconclusive_limit", 0), consecutive_error_limit=get("consecutive_error_limit", 4),
                      initial_delay=get("initial_delay", 0.0))
        budgets.check(prefix)
        return budgets

    def check(self, prefix=""):
        if not isinstance(self.count, int) or self.count < 1:
            raise ValidationError("must be at least 1, got %r" % (self.count,), field=prefix + "count", hint="measure 1 or more windows")
        for key in ("failure_limit", "inconclusive_limit", "consecutive_error_limit"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 0:
                raise ValidationError("must be 0 or more, got %r" % (value,), field=prefix + key,
                                      hint="0 ends the analysis at the first such window")
        if self.interval is not None and self.interval <= 0:
            raise ValidationError("must be more than 0 seconds", field=prefix + "interval", hint="measure windows of a few minutes")
        if self.initial_delay < 0:
            raise ValidationError("must be 0 or more seconds", field=prefix + "initial_delay", hint="0 starts measuring at once")

    def window_confidence(self, confidence):
        """The confidence one window decides with so that the whole run (``count`` windows, failed past
        ``failure_limit``) fails an identical pair at most ``1 - confidence`` of the time."""
        return 1.0 - noise.window_alpha(1.0 - confidence, self.count, self.failure_limit)

    def to_dict(self):
        return dict(vars(self))


class AnalysisRun:
    """The windows of one analysis and where it stands (``phase``: running, successful, failed, inconclusive, error)."""

    def __init__(self, budgets):
        self.budgets = budgets
        self.windows = []
        self.phase = RUNNING
        self.message = ""

    def counts(self):
        out = {v: sum(1 for w in self.windows if w["verdict"] == v) for v in VERDICTS}
        streak = 0
        for window in reversed(self.windows):
            if window["verdict"] != ERROR:
                break
            streak += 1
        out["consecutive_errors"] = streak
        return out

    def add(self, window):
        """Count one window's verdict; returns the phase after it."""
        if self.phase != RUNNING:
            raise ValueError("the analysis already ended: %s" % self.phase)
        self.windows.append(window)
        n, b = self.counts(), self.budgets
        if n[FAIL] > b.failure_limit:
            self.phase, self.message = FAILED, "%d failed window(s), failure_limit %d" % (n[FAIL], b.failure_limit)
        elif n[INCONCLUSIVE] > b.inconclusive_limit:
            self.phase, self.message = INCONCLUSIVE, "%d inconclusive window(s), inconclusive_limit %d" % (n[INCONCLUSIVE], b.inconclusive_limit)
        elif n["consecutive_errors"] > b.consecutive_error_limit:
            self.phase, self.message = ERROR, "%d window(s) in a row could not be measured, consecutive_error_limit %d" % (
                n["consecutive_errors"], b.consecutive_error_limit)
        elif len(self.windows) >= b.count:
            if n[PASS]:
                self.phase, self.message = SUCCESSFUL, "%d of %d window(s) passed within the budgets" % (n[PASS], len(self.windows))
            else:
                last = self.windows[-1]["verdict"]
                self.phase = ERROR if last == ERROR else INCONCLUSIVE
                self.message = "no window passed in %d (last: %s)" % (len(self.windows), last)
        return self.phase

    def result(self):
        return {"phase": self.phase, "message": self.message, "counts": self.counts(), "budgets": self.budgets.to_dict(),
                "windows": [dict(w, index=i + 1) for i, w in enumerate(self.windows)]}


def run(measure, budgets, sleep=None):
    """Measure windows until the run ends: ``measure(index)`` returns a window (``window_verdict``'s shape); the first
    one after ``initial_delay`` seconds. Returns ``AnalysisRun.result()``."""
    import time  # pylint: disable=import-outside-toplevel
    sleep = sleep or time.sleep
    analysis = AnalysisRun(budgets)
    if budgets.initial_delay:
        sleep(budgets.initial_delay)
    index = 0
    while analysis.phase == RUNNING:
        analysis.add(measure(index))
        index += 1
    return analysis.result()


# -- the canary's keep rule as checks -----------------------------------------------------------------------------------

# canary_window.decide's check metrics -> figure names
_KEEP_RULE_FIGURES = {"ttft": "ttft_median", "tpot": "tpot_median", "throughput": "output_rate", "ttft_p99": "ttft_p99",
                      "tpot_p99": "tpot_p99"}


def keep_rule_rows(decided_checks):
    """``canary_window.decide``'s checks (the benchmark's keep rule and the p99 guard, each already noise-tested) as rows
    of this engine, the stable revision being the baseline; a p99 not decided on (too few requests) is a dry-run row."""
    rows = []
    for check in decided_checks:
        name = _KEEP_RULE_FIGURES.get(check["metric"], check["metric"])
        row = {"name": check.get("label") or name, "figure": name, "value": check.get("candidate"), "baseline": check.get("baseline"),
               "limit": check.get("limit"), "better": check.get("better"), "tolerance": check.get("tolerance"),
               "passed": check.get("passed"), "dry_run": check.get("decided") is False, "confidence": check.get("confidence"),
               "noise_test": check.get("noise_test")}
        sure = "" if row["confidence"] is None else ", %.1f%% sure it is worse (%s)" % (100 * row["confidence"], row["noise_test"])
        row["why"] = "canary %s vs stable %s%s" % (_num(row["value"]), _num(row["baseline"]), sure)
        rows.append(row)
    return rows


def _num(value):
    return "n/a" if value is None else "%.4g" % value


def canary_window_verdict(stable, canary, decided, missing=None, checks=(), confidence=DEFAULT_CONFIDENCE):
    """One canary window: ``decided`` is ``canary_window.decide``'s result on it (with ``extra_checks`` the number of
    deciding ``checks``, so they share the window's false-fail rate). Missing /metrics -> ``error``; too few requests
    -> ``inconclusive``; a keep-rule guard or a check sure to be worse -> ``fail``; the keep rule's gain shown and every
    check passed -> ``pass``; else ``inconclusive`` (inside the noise)."""
    if decided["decision"] == "none" and not decided.get("checks"):
        verdict = ERROR if any((missing or {}).values()) else INCONCLUSIVE
        return {"verdict": verdict, "reasons": list(decided["reasons"]), "checks": [], "confidence": None, "decision": "none"}
    rows = keep_rule_rows(decided["checks"])
    fail_alpha = decided.get("fail_alpha") or (1.0 - confidence)
    own = [evaluate_check(c, canary, stable, confidence, fail_alpha) for c in checks]
    deciding = [r for r in rows + own if not r.get("dry_run")]
    failed = [r for r in deciding if r["passed"] is False]
    if decided["decision"] == "roll_back" or failed:
        verdict = FAIL
    elif decided["decision"] == "promote" and all(r["passed"] is True for r in own if not r.get("dry_run")):
        verdict = PASS
    else:
        verdict = INCONCLUSIVE
    sure = [r["confidence"] for r in failed if r.get("confidence") is not None]
    reasons = list(decided["reasons"]) + ["%s%s: %s" % ("dry run, not deciding - " if r["dry_run"] else "", r["name"], r.get("why", ""))
                                          for r in own if r["passed"] is not True]
    return {"verdict": verdict, "reasons": reasons, "checks": rows + own, "confidence": min(sure) if sure else None,
            "requests": (canary or {}).get("requests"), "decision": decided["decision"]}


# a run's phase -> the window verdict that ended it
PHASE_VERDICTS = {SUCCESSFUL: PASS, FAILED: FAIL, INCONCLUSIVE: INCONCLUSIVE, ERROR: ERROR}
