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
  too little traffic or when a check cannot be measured or its measured difference is inside the noise (a one-sided
  Mann-Whitney rank test on the histograms' buckets, or a two-proportion test on the acceptance counters, below
  ``confidence``), ``fail`` when a deciding check failed, else ``pass``.
- Budgets (``Budgets``, ``AnalysisRun``): the run is ``failed`` when failures exceed ``failure_limit``,
  ``inconclusive`` when inconclusives exceed ``inconclusive_limit``, ``error`` when consecutive errors exceed
  ``consecutive_error_limit`` (Argo's ``failureLimit``, ``inconclusiveLimit``, ``consecutiveErrorLimit``), else
  ``successful`` after ``count`` windows with at least one ``pass``. ``initial_delay`` seconds pass before the first
  scrape (warm-up).

Plain Python, no Ansible imports, no API calls; the rank test is closed-form (deterministic, no sampling).
"""

from __future__ import annotations

import math

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import canary_window

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


def _phi(z):
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _bucket_counts(buckets):
    """Cumulative ``[[le, count]...]`` ("+Inf" allowed) as {upper: cumulative}."""
    return {float("inf") if le in ("+Inf", "Inf", float("inf")) else float(le): float(count) for le, count in buckets or []}


def rank_test(baseline_buckets, candidate_buckets, better="lower"):
    """One-sided Mann-Whitney U on two histograms (each bucket a tie group): how sure (0..1) we are that the candidate
    is worse than the baseline. None when a side is empty."""
    base, cand = _bucket_counts(baseline_buckets), _bucket_counts(candidate_buckets)
    bounds = sorted(set(base) | set(cand))

    def per_bucket(cum):
        out, prev = [], 0.0
        for upper in bounds:
            known = [u for u in cum if u <= upper]
            now = cum[max(known)] if known else 0.0
            out.append(max(now - prev, 0.0))
            prev = max(now, prev)
        return out
    b_n, c_n = per_bucket(base), per_bucket(cand)
    n1, n2 = sum(c_n), sum(b_n)
    if n1 <= 0 or n2 <= 0:
        return None
    total, rank_start, r_cand, ties = n1 + n2, 0.0, 0.0, 0.0
    for c_k, b_k in zip(c_n, b_n):
        t = c_k + b_k
        if t:
            r_cand += c_k * (rank_start + (t + 1) / 2.0)
            ties += t ** 3 - t
            rank_start += t
    u_cand = r_cand - n1 * (n1 + 1) / 2.0   # large: the candidate's values rank high (slower)
    mean = n1 * n2 / 2.0
    var = n1 * n2 / 12.0 * ((total + 1) - ties / (total * (total - 1))) if total > 1 else 0.0
    if var <= 0:
        return 0.5  # every value in one bucket: no difference the histograms can show
    z = (u_cand - mean) / math.sqrt(var)
    return _phi(z if better == "lower" else -z)


def proportion_test(base_hits, base_n, cand_hits, cand_n, better="higher"):
    """One-sided two-proportion z-test: how sure (0..1) we are that the candidate's proportion is worse."""
    if not base_n or not cand_n or base_hits is None or cand_hits is None:
        return None
    p1, p2 = base_hits / float(base_n), cand_hits / float(cand_n)
    pooled = (base_hits + cand_hits) / float(base_n + cand_n)
    var = pooled * (1 - pooled) * (1.0 / base_n + 1.0 / cand_n)
    if var <= 0:
        return 1.0 if (p2 < p1 if better == "higher" else p2 > p1) else 0.5
    z = (p1 - p2) / math.sqrt(var)
    return _phi(z if better == "higher" else -z)


def confidence_worse(name, baseline, candidate, better):
    """How sure the candidate's figure ``name`` is worse than the baseline's, from what the window's counts give; None
    when no test applies (the figure is then taken as measured)."""
    key = name.split("_")[0]
    if key in canary_window.HISTOGRAMS and name.rsplit("_", 1)[-1] in ("median", "p99", "mean"):
        return rank_test(((baseline or {}).get("buckets") or {}).get(key), ((candidate or {}).get("buckets") or {}).get(key), better)
    b_acc, c_acc = (baseline or {}).get("acceptance") or {}, (candidate or {}).get("acceptance") or {}
    if name in ("acceptance_rate", "mean_acceptance_length"):
        return proportion_test(b_acc.get("num_accepted_tokens"), b_acc.get("num_draft_tokens"),
                               c_acc.get("num_accepted_tokens"), c_acc.get("num_draft_tokens"), better)
    if name.startswith("position_"):
        pos = int(name[len("position_"):-len("_rate")]) - 1
        b_pos, c_pos = b_acc.get("accepted_tokens_per_position") or [], c_acc.get("accepted_tokens_per_position") or []
        if pos < len(b_pos) and pos < len(c_pos):
            return proportion_test(b_pos[pos], b_acc.get("num_drafts"), c_pos[pos], c_acc.get("num_drafts"), better)
    return None


def evaluate_check(check, figures, baseline=None, confidence=DEFAULT_CONFIDENCE):
    """One check on a window: ``passed`` True / False / None (not measurable, or a difference inside the noise)."""
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
        row["passed"] = value <= limit if check["better"] == "lower" else value >= limit
        if not row["passed"]:
            sure = confidence_worse(check["figure"], baseline, figures, check["better"])
            row["confidence"] = sure
            if sure is not None and sure < confidence:
                row["passed"] = None
                row["why"] = (f"{check['figure']} {value:.4g} vs baseline {base:.4g} is outside the tolerance, but inside the noise "
                              f"({100 * sure:.0f}% sure, {100 * confidence:.0f}% needed)")
                return row
        sure_text = "" if row["confidence"] is None else f", {100 * row['confidence']:.1f}% sure it is worse"
        row["why"] = f"{check['figure']} {value:.4g} vs baseline {base:.4g} (limit {limit:.4g}){sure_text}"
        return row
    row.update({k: check[k] for k in ("min", "max") if k in check})
    row["passed"] = ("min" not in check or value >= check["min"]) and ("max" not in check or value <= check["max"])
    row["why"] = "%s %.4g (%s)" % (check["figure"], value, ", ".join("%s %.4g" % (k, check[k]) for k in ("min", "max") if k in check))
    return row


def window_verdict(checks, figures=None, baseline=None, min_requests=1, error=None, confidence=DEFAULT_CONFIDENCE, extra=None):
    """A window's verdict: ``{"verdict", "reasons", "checks", "confidence"}``.

    ``error``: why a scrape or read failed (the verdict is then ``error`` and no check is evaluated). ``extra``: rows
    already evaluated elsewhere (the canary's keep rule) with the same keys as ``evaluate_check``'s.
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
    rows = list(extra or []) + [evaluate_check(c, figures, baseline, confidence) for c in checks]
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


def keep_rule_rows(decided_checks, stable, canary, confidence=DEFAULT_CONFIDENCE):
    """``canary_window.decide``'s checks (the benchmark's keep rule and the p99 guard) as rows of this engine, the stable
    revision being the baseline: a failed one whose difference the histograms cannot tell from noise is ``passed=None``;
    a p99 not decided on (too few requests) is a dry-run row."""
    rows = []
    for check in decided_checks:
        name = _KEEP_RULE_FIGURES.get(check["metric"], check["metric"])
        row = {"name": check.get("label") or name, "figure": name, "value": check.get("candidate"), "baseline": check.get("baseline"),
               "limit": check.get("limit"), "better": check.get("better"), "tolerance": check.get("tolerance"),
               "passed": check.get("passed"), "dry_run": check.get("decided") is False, "confidence": None}
        if row["passed"] is False and row["value"] is not None and row["baseline"] is not None:
            sure = confidence_worse(name, stable, canary, check.get("better") or "lower")
            row["confidence"] = sure
            if sure is not None and sure < confidence:
                row["passed"] = None
                row["why"] = "canary %.4g vs stable %.4g is outside the tolerance, but inside the noise (%.0f%% sure, %.0f%% needed)" % (
                    row["value"], row["baseline"], 100 * sure, 100 * confidence)
        if "why" not in row:
            row["why"] = "canary %s vs stable %s" % (_num(row["value"]), _num(row["baseline"]))
        rows.append(row)
    return rows


def _num(value):
    return "n/a" if value is None else "%.4g" % value


def canary_window_verdict(stable, canary, decided, missing=None, checks=(), confidence=DEFAULT_CONFIDENCE):
    """One canary window: ``decided`` is ``canary_window.decide``'s result on it. Missing /metrics -> ``error``; too few
    requests -> ``inconclusive``; else the keep rule's rows and the extra ``checks`` (stable as the baseline) decide."""
    if decided["decision"] == "none":
        verdict = ERROR if any((missing or {}).values()) else INCONCLUSIVE
        return {"verdict": verdict, "reasons": list(decided["reasons"]), "checks": [], "confidence": None, "decision": "none"}
    rows = keep_rule_rows(decided["checks"], stable, canary, confidence)
    out = window_verdict(checks, canary, stable, min_requests=0, extra=rows, confidence=confidence)
    natural = PASS if decided["decision"] == "promote" else FAIL
    if natural == FAIL and out["verdict"] == PASS:
        out["verdict"] = FAIL  # a keep-rule refusal that is no check row (e.g. failed requests)
    own = [r for r in out["checks"][len(rows):] if r["passed"] is not True]
    if out["verdict"] == natural:
        out["reasons"] = list(decided["reasons"]) + ["%s%s: %s" % ("dry run, not deciding - " if r["dry_run"] else "", r["name"], r.get("why", ""))
                                                     for r in own]
    out["decision"] = decided["decision"]
    return out


# a run's phase -> the window verdict that ended it
PHASE_VERDICTS = {SUCCESSFUL: PASS, FAILED: FAIL, INCONCLUSIVE: INCONCLUSIVE, ERROR: ERROR}
