# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The noise tests the analysis engine and the keep rule decide with: one test per kind of figure, each giving two
one-sided p-values against the check's limit (``worse``: small when the candidate is beyond the limit; ``within``: small
when it is inside it), so a check is ``fail`` only when the evidence says worse, ``pass`` only when it says within, and
``inconclusive`` in between, never by the side of the limit a point estimate happens to fall on.

- Latency medians and means (TTFT, TPOT, ITL, E2EL): a one-sided Mann-Whitney rank test (tie groups, normal
  approximation with the tie correction) of the candidate against the baseline scaled by the tolerance, on the
  client's per-request samples where it measured them, else on vLLM's histogram buckets.
- Output rate: the same rank test on the per-request rates (tokens over request time) where the client measured them;
  on histograms, on E2E latency, the request-time histogram of the same requests (the rate's reciprocal at the same
  request mix, which a traffic split gives both revisions).
- Tails (p99): the quantile itself, by exceedances: the candidate's requests above (1 + tolerance) times the baseline's
  quantile bound (its confidence bound, on a bucket bound) against the 1% a p99 allows (an exact binomial tail).
- Acceptance (rate, mean acceptance length, per-position rate): the draft as the unit. vLLM accepts a prefix of each
  draft, so ``accepted_tokens_per_position`` gives the distribution of accepted tokens per draft exactly (drafts with at
  least j accepted); a z-test on the per-draft means, or on the share of drafts reaching a position, never on drafted
  tokens as independent trials.
- Histograms are compared on the bounds both sides have (``common_buckets``): a bound one side lacks is dropped on both,
  and with no finite bound in common the comparison is refused with both bound lists named, never made bucket by bucket.
- ``window_alpha`` splits a decision's error rate over the windows of an analysis run (the failure budget's binomial
  tail); the callers split a window's over its deciding checks (Bonferroni), so the family's rate is what is bounded.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import math

INF = float("inf")


class BoundsMismatch(ValueError):
    """The two histograms share no finite bucket bound: their buckets cannot be compared."""


def phi(z):
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def phi_inv(p):
    """The standard normal quantile (bisection on ``phi``; plenty for the confidences used here)."""
    low, high = -40.0, 40.0
    for _step in range(200):
        mid = (low + high) / 2.0
        if phi(mid) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


# -- histograms ----------------------------------------------------------------------------------------------------------

def _upper(le):
    return INF if le in ("+Inf", "Inf", INF) else float(le)


def cumulative(buckets):
    """Cumulative ``[[le, count]...]`` ("+Inf" allowed) as a sorted list of ``(upper, cumulative)``; a histogram
    without the +Inf bucket gets one with its last count."""
    out = sorted((_upper(le), float(count)) for le, count in buckets or [])
    if out and not math.isinf(out[-1][0]):
        out.append((INF, out[-1][1]))
    return out


def common_buckets(baseline, candidate):
    """Both cumulative histograms on the bounds they share: ``(baseline, candidate, dropped)``, ``dropped`` the bounds
    one side lacked. BoundsMismatch when no finite bound is shared."""
    base, cand = cumulative(baseline), cumulative(candidate)
    shared = {u for u, _c in base} & {u for u, _c in cand}
    if base and cand and not any(not math.isinf(u) for u in shared):
        raise BoundsMismatch("the two sides' histograms share no bucket bound: baseline %s, candidate %s" % (
            _bounds_text(base), _bounds_text(cand)))
    dropped = sorted(({u for u, _c in base} | {u for u, _c in cand}) - shared)
    return [b for b in base if b[0] in shared], [c for c in cand if c[0] in shared], dropped


def _bounds_text(cum):
    return "[%s]" % ", ".join("+Inf" if math.isinf(u) else "%g" % u for u, _c in cum)


def bucket_counts(cum):
    """``(lower, upper, count)`` cells of a cumulative histogram (the first cell's lower bound 0)."""
    cells, prev_upper, prev = [], 0.0, 0.0
    for upper, count in cum:
        cells.append((prev_upper, upper, max(count - prev, 0.0)))
        prev_upper, prev = upper, max(count, prev)
    return cells


def _regrid(cells, grid):
    """Cells' counts spread over ``grid`` (sorted uppers, +Inf last), uniform within each cell (Prometheus' own
    assumption in ``histogram_quantile``); the +Inf cell's count stays in the grid's last cell."""
    out = [0.0] * len(grid)
    lowers = [0.0] + grid[:-1]
    for low, high, count in cells:
        if not count:
            continue
        if math.isinf(high):
            out[-1] += count  # past the last finite bound: it ranks with everything else past it
            continue
        width = high - low
        for i, g_high in enumerate(grid):
            g_low = lowers[i]
            overlap = min(high, g_high) - max(low, g_low)
            if overlap > 0 and width > 0:
                out[i] += count * overlap / width
            elif width <= 0 and g_low < high <= g_high:
                out[i] += count
    return out


def histogram_groups(baseline, candidate, scale=1.0):
    """Tie groups ``(baseline counts, candidate counts)`` of two histograms on their common bounds, the baseline's
    values multiplied by ``scale`` (the tolerance); uniform within buckets where the scaled bounds interleave."""
    base, cand, _dropped = common_buckets(baseline, candidate)
    b_cells, c_cells = bucket_counts(base), bucket_counts(cand)
    if scale == 1.0:
        return [c for _l, _u, c in b_cells], [c for _l, _u, c in c_cells]
    b_cells = [(low * scale, high * scale if not math.isinf(high) else high, count) for low, high, count in b_cells]
    grid = sorted({u for _l, u, _c in b_cells} | {u for _l, u, _c in c_cells})
    return _regrid(b_cells, grid), _regrid(c_cells, grid)


def sample_groups(baseline, candidate, scale=1.0):
    """Tie groups of two lists of per-request values, the baseline's multiplied by ``scale``."""
    base = [float(v) * scale for v in baseline]
    values = sorted(set(base) | {float(v) for v in candidate})
    index = {v: i for i, v in enumerate(values)}
    b_n, c_n = [0.0] * len(values), [0.0] * len(values)
    for v in base:
        b_n[index[v]] += 1
    for v in candidate:
        c_n[index[float(v)]] += 1
    return b_n, c_n


def rank_z(b_n, c_n):
    """Mann-Whitney's z for the candidate ranking above the baseline (large: the candidate's values are larger), with
    the tie correction; None when a side is empty, 0.0 when every value ties."""
    n1, n2 = sum(c_n), sum(b_n)
    if n1 <= 0 or n2 <= 0:
        return None
    total, start, r_cand, ties = n1 + n2, 0.0, 0.0, 0.0
    for c_k, b_k in zip(c_n, b_n):
        t = c_k + b_k
        if t:
            r_cand += c_k * (start + (t + 1) / 2.0)
            ties += t ** 3 - t
            start += t
    u_cand = r_cand - n1 * (n1 + 1) / 2.0
    var = n1 * n2 / 12.0 * ((total + 1) - ties / (total * (total - 1))) if total > 1 else 0.0
    if var <= 0:
        return 0.0
    return (u_cand - n1 * n2 / 2.0) / math.sqrt(var)


def rank_pvalues(baseline, candidate, better, tolerance=0.0, samples=False):
    """``{"worse", "within"}`` one-sided p-values of the candidate against the baseline's values moved to the limit
    (times ``1 + tolerance`` for lower-is-better figures, ``1 - tolerance`` for higher-is-better); None when a side is
    empty. BoundsMismatch for histograms without a common bound."""
    scale = 1.0 + tolerance if better == "lower" else 1.0 - tolerance
    groups = sample_groups if samples else histogram_groups
    b_n, c_n = groups(baseline, candidate, scale)
    z = rank_z(b_n, c_n)
    if z is None:
        return None
    larger = 1.0 - phi(z)    # p-value of "the candidate's values are larger"
    smaller = phi(z)
    return {"worse": larger if better == "lower" else smaller, "within": smaller if better == "lower" else larger}


# -- tails ---------------------------------------------------------------------------------------------------------------

def binomial_tail(n, p, k, upper=True):
    """P(X >= k) (``upper``) or P(X <= k) for X ~ Binomial(n, p), summed in log space."""
    n, k = int(round(n)), int(round(k))
    if upper and k <= 0 or not upper and k >= n:
        return 1.0
    if upper and k > n or not upper and k < 0:
        return 0.0
    if p <= 0:
        return 0.0 if upper else 1.0
    if p >= 1:
        return 1.0 if upper else 0.0
    terms = range(k, n + 1) if upper else range(0, k + 1)
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p) for i in terms]
    top = max(logs)
    return min(1.0, math.exp(top) * math.fsum(math.exp(v - top) for v in logs))


def _quantile(cum, q):
    """The ``q`` quantile of a cumulative histogram, interpolated inside its bucket as Prometheus'
    ``histogram_quantile`` does; None past the last finite bound."""
    total = cum[-1][1] if cum else 0.0
    if total <= 0:
        return None
    rank, prev_upper, prev = q * total, 0.0, 0.0
    for upper, count in cum:
        if count >= rank and count > prev:
            if math.isinf(upper):
                return None
            return prev_upper + (upper - prev_upper) * (rank - prev) / (count - prev)
        prev_upper, prev = upper, count
    return None


def tail_pvalues(baseline, candidate, tolerance=0.0, q=0.99, samples=False, confidence=0.95):
    """Exceedance test of the candidate's ``q`` quantile against ``(1 + tolerance)`` times the baseline's (latencies:
    lower is better). ``worse``: P(at least the candidate's count above the threshold) under a tail of ``1 - q``, the
    threshold taken at the baseline's quantile and counted above the next bucket bound (never below it: the bucket's
    width is the margin for the baseline quantile's own noise); ``within``: at most that many above the baseline
    quantile's lower confidence bound (on the bucket bound below it). None when a side is empty or has no threshold below +Inf."""
    tail = 1.0 - q
    if samples:
        base, cand = sorted(float(v) for v in baseline), [float(v) for v in candidate]
        n_b, n_c = len(base), len(cand)
        if not n_b or not n_c:
            return None
        spread = phi_inv(confidence) * math.sqrt(q * tail / n_b)
        hi = base[min(n_b - 1, int(math.ceil(q * n_b)) - 1)]
        lo = base[max(0, int(math.floor((q - spread) * n_b)) - 1)]
        above_hi = sum(1 for v in cand if v > hi * (1 + tolerance))
        above_lo = sum(1 for v in cand if v > lo * (1 + tolerance))
    else:
        base, cand, _dropped = common_buckets(baseline, candidate)
        n_b, n_c = (base[-1][1] if base else 0.0), (cand[-1][1] if cand else 0.0)
        if n_b <= 0 or n_c <= 0:
            return None
        spread = phi_inv(confidence) * math.sqrt(q * tail / n_b)
        hi, lo = _quantile(base, q), _quantile(base, max(0.0, q - spread))
        bounds = [u for u, _c in cand]
        counts = dict(cand)

        def above(threshold, at_or_above):
            # the candidate's count above a bucket bound at (worse: at or above; within: at or below) the threshold
            pick = [u for u in bounds if (u >= threshold if at_or_above else u <= threshold)]
            if not pick:
                return None
            bound = min(pick) if at_or_above else max(pick)
            return n_c - counts[bound] if not math.isinf(bound) else None
        above_hi = above(hi * (1 + tolerance), True) if hi is not None else None
        above_lo = above(lo * (1 + tolerance), False) if lo is not None else None
    worse = binomial_tail(n_c, tail, above_hi, upper=True) if above_hi is not None else 1.0
    within = binomial_tail(n_c, tail, above_lo, upper=False) if above_lo is not None else 1.0
    return {"worse": worse, "within": within}


# -- acceptance ----------------------------------------------------------------------------------------------------------

def design_effect(acceptance, requests, position=None):
    """How much the variance of a per-draft figure grows because a request's drafts share its acceptance: ``1 + (m - 1)
    rho``, ``m`` drafts per request, ``rho`` the share of the per-draft variance that lies between requests. Measured
    from the per-position counters: drafts reaching positions 1 and 2 give the first two moments of a request's
    acceptance probability ``r`` (E[r], E[r^2], taking ``r`` the same at each position of a request's drafts), and the
    figure's between-request variance follows by the delta method (accepted tokens per draft: sum of r^j; reaching
    ``position``: r^position). 1 without the request count or a second position."""
    acc = acceptance or {}
    drafts, positions = acc.get("num_drafts"), acc.get("accepted_tokens_per_position") or []
    if not requests or not drafts or len(positions) < 2:
        return 1.0
    first, second = positions[0] / float(drafts), positions[1] / float(drafts)
    var_r = second - first * first
    if not 0 < first < 1 or var_r <= 0:
        return 1.0
    k = len(positions)
    if position is None:
        slope = sum(j * first ** (j - 1) for j in range(1, k + 1))
        total = per_draft(acc)[2]
    else:
        slope = position * first ** (position - 1)
        share = positions[position - 1] / float(drafts)
        total = share * (1 - share)
    if total <= 0:
        return 1.0
    rho = min(1.0, slope * slope * var_r / total)
    return 1.0 + max(drafts / float(requests) - 1.0, 0.0) * rho


def per_draft(acceptance):
    """``(drafts, mean accepted per draft, variance, mean k)`` from a window's acceptance counters: the per-position
    counters give the distribution of accepted tokens per draft exactly (vLLM accepts a prefix: drafts with at least j
    accepted = position j-1's count); without them the variance is bounded by ``mean * (k - mean)``."""
    acc = acceptance or {}
    drafts, accepted = acc.get("num_drafts"), acc.get("num_accepted_tokens")
    if not drafts or accepted is None:
        return None
    drafts, accepted = float(drafts), float(accepted)
    k = float(acc.get("num_draft_tokens") or 0) / drafts if acc.get("num_draft_tokens") else None
    mean = accepted / drafts
    positions = [float(p) for p in acc.get("accepted_tokens_per_position") or []]
    if positions and abs(sum(positions) - accepted) <= 0.5:
        second = sum((2 * j + 1) * p for j, p in enumerate(positions)) / drafts   # E[A^2] = sum over j of (2j - 1) P(A >= j)
        var = max(second - mean * mean, 0.0)
    else:
        k_max = k or float(len(positions) or 1)
        var = max(mean * (k_max - mean), 0.0)
    return drafts, mean, var, k


def _z_pvalues(diff, var, better):
    """p-values from a difference ``candidate - limit`` and its variance (z-test)."""
    if var <= 0:
        sign = 0.0 if diff == 0 else math.copysign(40.0, diff)
        z = sign
    else:
        z = diff / math.sqrt(var)
    low, high = phi(z), 1.0 - phi(z)   # p of "the candidate is below the limit", "above it"
    return {"worse": low if better == "higher" else high, "within": high if better == "higher" else low}


def acceptance_pvalues(name, baseline, candidate, better="higher", tolerance=0.0, requests=None):
    """``acceptance_rate``, ``mean_acceptance_length`` or ``position_<n>_rate`` of the candidate against the baseline
    moved to the limit, the draft as the unit, its variance grown by the design effect of each side's ``requests``
    (baseline, candidate). None when a side has no drafts."""
    b, c = per_draft(baseline), per_draft(candidate)
    if b is None or c is None:
        return None
    # a request's drafts are not independent: each side's variance grows by its design effect
    # A request's drafts are not independent: both variances grow by the larger side's design effect (each side's own is
    # a noisy estimate, and an unchanged engine has the same on both sides).
    req_b, req_c = requests or (None, None)
    deff = max(design_effect(baseline, req_b), design_effect(candidate, req_c))
    b, c = b[:2] + (b[2] * deff,) + b[3:], c[:2] + (c[2] * deff,) + c[3:]
    factor = 1.0 - tolerance if better == "higher" else 1.0 + tolerance
    (n_b, m_b, v_b, k_b), (n_c, m_c, v_c, k_c) = b, c
    if name == "mean_acceptance_length":
        diff = (1.0 + m_c) - factor * (1.0 + m_b)
        return _z_pvalues(diff, v_c / n_c + factor * factor * v_b / n_b, better)
    if name == "acceptance_rate":
        if not k_b or not k_c:
            return None
        diff = m_c / k_c - factor * m_b / k_b
        return _z_pvalues(diff, v_c / (k_c * k_c * n_c) + factor * factor * v_b / (k_b * k_b * n_b), better)
    pos = int(name[len("position_"):-len("_rate")]) - 1
    b_pos = (baseline or {}).get("accepted_tokens_per_position") or []
    c_pos = (candidate or {}).get("accepted_tokens_per_position") or []
    if pos >= len(b_pos) or pos >= len(c_pos):
        return None
    p_b, p_c = b_pos[pos] / n_b, c_pos[pos] / n_c
    diff = p_c - factor * p_b
    deff = max(design_effect(baseline, req_b, pos + 1), design_effect(candidate, req_c, pos + 1))
    return _z_pvalues(diff, deff * (p_c * (1 - p_c) / n_c + factor * factor * p_b * (1 - p_b) / n_b), better)


def proportion_pvalue(base_hits, base_n, cand_hits, cand_n, better="higher"):
    """One-sided pooled two-proportion z-test: how sure (0..1) we are that the candidate's proportion is worse; None
    without trials. ValueError for more hits than trials or a negative count."""
    if not base_n or not cand_n or base_hits is None or cand_hits is None:
        return None
    for hits, trials in ((base_hits, base_n), (cand_hits, cand_n)):
        if hits < 0 or trials < 0 or hits > trials:
            raise ValueError("%s hits in %s trials is no proportion" % (hits, trials))
    p1, p2 = base_hits / float(base_n), cand_hits / float(cand_n)
    pooled = (base_hits + cand_hits) / float(base_n + cand_n)
    var = pooled * (1 - pooled) * (1.0 / base_n + 1.0 / cand_n)
    if var <= 0:
        return 1.0 if (p2 < p1 if better == "higher" else p2 > p1) else 0.5
    z = (p1 - p2) / math.sqrt(var)
    return phi(z if better == "higher" else -z)


# -- the family's error rate -----------------------------------------------------------------------------------------------

def window_alpha(alpha, count=1, failure_limit=0):
    """The false-fail rate one window may have so that an analysis of ``count`` windows, failed when more than
    ``failure_limit`` fail, fails an A/A pair at most ``alpha`` of the time (windows measured on separate traffic are
    independent: the binomial tail), and never more than ``alpha`` per window."""
    count, need = max(int(count), 1), int(failure_limit) + 1
    if need > count:
        return alpha
    low, high = 0.0, alpha
    for _step in range(60):
        mid = (low + high) / 2.0
        if binomial_tail(count, mid, need, upper=True) <= alpha:
            low = mid
        else:
            high = mid
    return low


# -- a figure's test -------------------------------------------------------------------------------------------------------

LATENCIES = ("ttft", "tpot", "itl", "e2el")


def pvalues(name, baseline, candidate, better, tolerance=0.0, confidence=0.95):
    """The noise test of figure ``name`` (``tpot_median``, ``ttft_p99``, ``output_rate``, ``acceptance_rate``,
    ``mean_acceptance_length``, ``position_<n>_rate``, ...) of two sides' evidence (``{"samples": {key: [...]},
    "buckets": {key: [[le, cumulative]...]}, "acceptance": {...}}``, samples first): ``{"worse", "within", "test"}``, or
    None when the sides carry no evidence for it (the figure is then taken as measured). BoundsMismatch as above."""
    base, cand = baseline or {}, candidate or {}
    b_samples, c_samples = base.get("samples") or {}, cand.get("samples") or {}
    b_hist, c_hist = base.get("buckets") or {}, cand.get("buckets") or {}
    key, _sep, stat = name.rpartition("_")
    if key in LATENCIES and stat in ("median", "mean", "p99"):
        if b_samples.get(key) and c_samples.get(key):
            evidence, samples = (b_samples[key], c_samples[key]), True
        elif b_hist.get(key) and c_hist.get(key):
            evidence, samples = (b_hist[key], c_hist[key]), False
        else:
            return None
        if stat == "p99":
            out = tail_pvalues(evidence[0], evidence[1], tolerance, samples=samples, confidence=confidence)
            test = "exceedances over the baseline's p99 bound"
        else:
            out = rank_pvalues(evidence[0], evidence[1], better, tolerance, samples=samples)
            test = "rank test on the %s" % ("per-request samples" if samples else "histogram buckets")
        return dict(out, test=test) if out else None
    if name == "output_rate":
        if b_samples.get("output_rate") and c_samples.get("output_rate"):
            out = rank_pvalues(b_samples["output_rate"], c_samples["output_rate"], better, tolerance, samples=True)
            return dict(out, test="rank test on the per-request output rates") if out else None
        if b_hist.get("e2el") and c_hist.get("e2el"):
            # a higher rate is a shorter request time for the same tokens: the limit (1 - t) on the rate is 1 / (1 - t) on time
            flipped = "lower" if better == "higher" else "higher"
            time_tolerance = (1.0 / (1.0 - tolerance) - 1.0) if better == "higher" else (1.0 - 1.0 / (1.0 + tolerance))
            out = rank_pvalues(b_hist["e2el"], c_hist["e2el"], flipped, time_tolerance)
            return dict(out, test="rank test on the E2E latency histogram (the rate's request times)") if out else None
        return None
    if name in ("acceptance_rate", "mean_acceptance_length") or (name.startswith("position_") and name.endswith("_rate")):
        out = acceptance_pvalues(name, base.get("acceptance"), cand.get("acceptance"), better, tolerance,
                                 (base.get("requests"), cand.get("requests")))
        return dict(out, test="z-test with the draft as the unit") if out else None
    return None
