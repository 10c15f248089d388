"""A ratio of two arms' repetitions with a confidence interval: Hodges-Lehmann on the log scale.

The estimate is the median of every pairwise ratio candidate_i / reference_j (the
Hodges-Lehmann estimator of a scale shift, computed on logs); the interval is the
distribution-free one that inverts the Mann-Whitney U test: with U's exact null distribution
for m x n repetitions, [d_(k), d_(mn-k+1)] of the sorted pairwise log ratios, k the largest
with P(U < k) <= (1 - LEVEL) / 2. Its assumptions: the repetitions of each arm are
independent draws from one distribution (no drift: why bench can interleave the arms), and
the two distributions differ by a factor (a shift of log time); ties count as if broken at
random. Few repetitions cannot reach LEVEL at all (3 x 3 at most 90 %): the interval is then
the widest one (every pairwise ratio) with the confidence it has, and it never separates.
Ties do not shrink the uncertainty: an interval whose ends are equal (all samples equal, a
timer's resolution) has no confidence at all, never certainty.

Swapping the arms inverts everything exactly (1/x, ends swapped): the logs only change sign.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

LEVEL = 0.95  # the confidence an interval must reach to separate
Z = 1.959964  # the normal quantile of LEVEL, two-sided
HL_EFFICIENCY = math.sqrt(math.pi / 3)  # HL's interval over the t interval's width, normal data
MIN_RUNS = 4  # 4 x 4 repetitions are the fewest whose widest interval reaches LEVEL (97.1 %)
EXACT_UP_TO = 400  # m * n up to which U's distribution is counted exactly; a normal approximation above


@dataclass(frozen=True)
class Interval:
    estimate: float
    lower: float
    upper: float
    confidence: float  # what the interval achieves: >= LEVEL, or less when the runs are too few
    log_sd: float | None  # the pooled standard deviation of log samples (None: one sample per arm)
    tied: bool = False  # its ends are equal over several ratios: the samples tie, and it says nothing

    @property
    def reached(self) -> bool:
        return self.confidence >= LEVEL - 1e-12

    def inverted(self) -> Interval:
        return Interval(_inv(self.estimate), _inv(self.upper), _inv(self.lower), self.confidence, self.log_sd,
                        self.tied)


def _inv(x: float) -> float:
    """1 / x over [0, inf]: an estimate that underflowed to 0 inverts to inf, not a ZeroDivisionError."""
    return math.inf if x == 0 else 0.0 if math.isinf(x) else 1.0 / x


@lru_cache(maxsize=256)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) orderings give each U = 0..mn (no ties)."""
    if m == 0 or n == 0:
        return (1,)
    a, b = _u_counts(m - 1, n), _u_counts(m, n - 1)
    out = [0] * (m * n + 1)
    for u, c in enumerate(b):
        out[u] += c
    for u, c in enumerate(a):
        out[u + n] += c
    return tuple(out)


def _k(m: int, n: int) -> tuple[int, float]:
    """(k, confidence): the interval's ends are the k-th smallest and k-th largest pairwise ratio,
    and its confidence is 1 - 2 P(U < k); k = 1 (every pairwise ratio) when LEVEL is out of reach."""
    alpha, mn = (1 - LEVEL) / 2, m * n
    if mn > EXACT_UP_TO:
        u = statistics.NormalDist(mn / 2, math.sqrt(mn * (m + n + 1) / 12))
        k = max(1, math.floor(u.mean - Z * u.stdev + 0.5))
        return k, 1 - 2 * u.cdf(k - 0.5)
    counts = _u_counts(m, n)
    total = sum(counts)
    cum = [0]
    for c in counts:
        cum.append(cum[-1] + c)  # cum[j] = total x P(U < j)
    k = 1
    while k + 1 <= (mn + 1) // 2 and cum[k + 1] / total <= alpha:
        k += 1
    return k, 1 - 2 * cum[k] / total


def _logs(xs: Sequence[float]) -> list[float] | None:
    if not xs or any(not (math.isfinite(x) and x > 0) for x in xs):
        return None
    return [math.log(x) for x in xs]


def _pooled_sd(a: list[float], b: list[float]) -> float | None:
    dof = len(a) + len(b) - 2
    if dof <= 0:
        return None
    ss = sum((x - statistics.fmean(a)) ** 2 for x in a) + sum((x - statistics.fmean(b)) ** 2 for x in b)
    return math.sqrt(ss / dof)


def ratio_interval(candidate: Sequence[float], reference: Sequence[float]) -> Interval | None:
    """candidate / reference with its interval; None when an arm has no positive finite sample."""
    c, r = _logs(candidate), _logs(reference)
    if c is None or r is None:
        return None
    d = sorted(x - y for x in c for y in r)
    k, confidence = _k(len(c), len(r))
    tied = len(d) > 1 and d[k - 1] == d[-k]  # ties broken at random could put the ratio anywhere near: no confidence
    return Interval(_exp(statistics.median(d)), _exp(d[k - 1]), _exp(d[-k]), 0.0 if tied else confidence,
                    _pooled_sd(c, r), tied)


def _exp(x: float) -> float:
    """exp, infinite past the float range (a reference sample of almost 0 tok/s) rather than raising."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def runs_needed(interval: Interval, bar: float, runs: int) -> int | None:
    """Repetitions per arm that would likely separate the estimate from `bar`, from the spread:
    the interval's half-width shrinks as sqrt(2 / n) x Z x sd (x HL's efficiency factor).
    One run has no spread: MIN_RUNS, the fewest that can reach LEVEL. None: the estimate is at
    the bar, or its samples tie (no spread to estimate from)."""
    if interval.tied or not (math.isfinite(bar) and bar > 0 and math.isfinite(interval.estimate)):
        return None
    gap = abs(math.log(interval.estimate) - math.log(bar))
    if gap == 0:
        return None
    if interval.log_sd is None:
        return MIN_RUNS
    n = math.ceil(2 * (Z * HL_EFFICIENCY * interval.log_sd / gap) ** 2)
    return max(n, MIN_RUNS, runs + 1)
