"""Paired statistics over seeds: mean, spread, a 95 % t interval, a paired-t p value, a sign count.

A claim such as "outside beats inside" rests on a few same-seed differences. How strongly it may
be worded follows from these numbers: the direction on k of n seeds, the mean ± sample std, a
95 % Student-t interval for the mean difference (undecided where it spans zero) and the
two-sided p value of the paired t test.

Student's t distribution is computed in closed form (Abramowitz & Stegun 26.7.3 and 26.7.4: a
finite series in cos(theta), theta = atan(t / sqrt(df)), exact for integer degrees of freedom),
and its quantile by bisection on that function. The seed counts here are small integers, so
nothing more general is needed; scipy would add about 40 MB to the wheels a user copies to an
offline GPU node for two numbers per row. tests/test_stats.py checks both against values
computed by hand and against printed t tables.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95


def t_central_probability(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` (a positive integer) degrees of freedom."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a positive integer, got {df!r}")
    if math.isinf(t):
        return 1.0
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:  # A&S 26.7.3: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2.4/3.5 cos^4 ...))
        term = series = 1.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            series += term
        tail = math.sin(theta) * math.cos(theta) * series if df > 1 else 0.0
        return min(1.0, 2.0 / math.pi * (theta + tail))
    term = series = 1.0  # A&S 26.7.4: sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 ...)
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        series += term
    return min(1.0, math.sin(theta) * series)


def t_quantile(confidence: float, df: int) -> float:
    """The t with P(|T| <= t) = confidence: the half-width factor of a two-sided interval."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    low, high = 0.0, 1.0
    while t_central_probability(high, df) < confidence:
        high *= 2.0
    for _ in range(200):  # bisection to the float's resolution
        middle = (low + high) / 2.0
        if middle in (low, high):
            break
        if t_central_probability(middle, df) < confidence:
            low = middle
        else:
            high = middle
    return high


@dataclass(frozen=True)
class PairedStats:
    """What n same-seed differences say about their mean."""

    n: int
    mean: float
    std: float | None        # sample std (n - 1); None for one difference
    ci_low: float | None     # the 95 % t interval of the mean; None below two differences
    ci_high: float | None
    p: float | None          # two-sided paired t test against a zero mean
    positive: int            # how many differences are > 0

    @property
    def undecided(self) -> bool:
        """True where the interval spans zero (or there is none)."""
        return self.ci_low is None or self.ci_low <= 0.0 <= self.ci_high


def paired_stats(differences: list[float], confidence: float = CONFIDENCE) -> PairedStats:
    n = len(differences)
    if n == 0:
        raise ValueError("no differences to summarise")
    mean = statistics.fmean(differences)
    positive = sum(d > 0 for d in differences)
    if n == 1:
        return PairedStats(1, mean, None, None, None, None, positive)
    std = statistics.stdev(differences)
    error = std / math.sqrt(n)
    half = t_quantile(confidence, n - 1) * error
    if error == 0.0:
        p = 1.0 if mean == 0.0 else 0.0
    else:
        p = 1.0 - t_central_probability(mean / error, n - 1)
    return PairedStats(n, mean, std, mean - half, mean + half, max(p, 0.0), positive)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of m p values (family-wise error at the nominal level), in
    the order given: the i-th smallest p is multiplied by m - i + 1 (i from 1), capped at 1 and
    made non-decreasing in that order."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


MATCH_SEEDS = 3  # seeds each side needs before "matches" is said either way


def matches(method: list[float], reference: list[float]) -> bool | None:
    """MLPerf's reference-convergence reading: the method's seed mean lies within the
    reference's mean ± 2 sample std. None below MATCH_SEEDS seeds on either side."""
    if len(method) < MATCH_SEEDS or len(reference) < MATCH_SEEDS:
        return None
    centre, spread = statistics.fmean(reference), statistics.stdev(reference)
    return abs(statistics.fmean(method) - centre) <= 2 * spread
