"""Several quantiles of one column drawn together: the joint exponential mechanism (Gillenwater,
Joseph and Kulesza, "Differentially Private Quantiles", ICML 2021, arXiv:2102.08244v2,
Section 3), on the histogram of ``mechanisms.exponential``.

Setting.  The values, clipped to [l, u], are counted in B bins; C(t) is the number of values in
bins before t (t = 0..B: C(0) = 0, C(B) = n).  For p_1 <= ... <= p_m the output is a sequence of
cuts 0 <= t_1 <= ... <= t_m <= B (cut t is the value l + t w, w = (u - l) / B).  With t_0 = 0,
t_{m+1} = B, p_0 = 0, p_{m+1} = 1, the utility compares the count between consecutive cuts with
the count the quantiles ask for::

    u(t) = - sum over i = 1..m+1 of | C(t_i) - C(t_{i-1}) - (p_i - p_{i-1}) n |

Every cut's rank error is at most -u: C(t_i) - p_i n is the sum of the first i terms.

Sensitivity (add or remove one unit with r <= k values; the paper's swap neighbours give 2 for
one value).  C(t) moves by a(t), 0 = a(0) <= a(t) <= a(B) = r, non-decreasing in t, so the
gap counts move by a(t_i) - a(t_{i-1}) >= 0, summing to r; the targets move by (p_i - p_{i-1}) r,
summing to r.  So |u'(t) - u(t)| <= 2 r <= 2k =: Delta, for every t, whatever m is: the point of
the joint mechanism.  Independent quantiles each pay Delta_i = k max(p_i, 1 - p_i) at epsilon / m.

Selection.  P(t) proportional to exp(epsilon u(t) / (2 Delta)) over all non-decreasing
sequences: epsilon-DP (the 2 because u is not monotone; McSherry and Talwar 2007, Theorem 6).
Groups of public keys cost epsilon in all, as in ``mechanisms.exponential`` ('Groups'): a unit's
r_g rows in group g move that group's utility by <= 2 r_g.

Sampling (the paper's Algorithm 2, in log space, O(m B log B)).  With a = epsilon / (2 Delta)
and phi_i(s, t) = -a |C(t) - C(s) - g_i|, g_i = (p_i - p_{i-1}) n, the forward tables are
F_1(t) = phi_1(0, t) and F_i(t) = log sum over s <= t of exp(F_{i-1}(s) + phi_i(s, t)).  C is
non-decreasing, so the s with C(s) <= C(t) - g_i are a prefix s <= s*(t) (where phi_i = a (C(s)
- C(t) + g_i)) and the rest a range (s*(t), t] (where phi_i = a (C(t) - g_i - C(s))): each part is
a range log-sum-exp of F_{i-1} + a C or F_{i-1} - a C, answered from a tree of pairwise sums
(depth ceil(log2(B + 1))).  Then t_m is drawn from F_m(t) + phi_{m+1}(t, B) and each t_{i-1},
given t_i, from F_{i-1}(s) + phi_i(s, t_i), s <= t_i, with ``exponential.draw_index``
(os.urandom).  The product of these conditionals is exactly P(t).

Floating point.  Every log-weight is a sum and log-sum-exp of terms of magnitude at most
M = 3 a n + m ln(B + 1) (|F| <= 2 a n + m ln(B + 1), |a C| <= a n), with at most 8 d + 8 roundings
(d the tree depth) per table entry and step, so after m steps an entry is off by at most
(8 d + 10) m ulp(M); a drawn conditional (entry minus normaliser) by twice that, a sequence (m
draws) by 2 (8 d + 10) m^2 ulp(M), and the ratio between neighbours by twice that again, plus
the CDF inversions' m FLOAT_SLACK.  :func:`float_slack` bounds this for n <= :data:`MAX_VALUES`
(ulp(M) <= M 2^-52) and the mechanism runs at epsilon minus it, so its release stays epsilon-DP
including floating point.  A histogram of more values is refused after it was read (the query
is charged; the refusal says only that n > 2^32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mechanisms.base import check_epsilon
from mechanisms.exponential import FLOAT_SLACK, MAX_BINS, draw_index

__all__ = ["MAX_JOINT", "MAX_VALUES", "JointQuantiles", "cut_value", "float_slack",
           "joint_utility", "range_logsumexp"]

#: The most quantiles of one column drawn jointly (the floating-point slack grows as m^2).
MAX_JOINT = 16
#: The most values one histogram may hold for the floating-point bound (module docstring).
MAX_VALUES = 2**32


def joint_utility(counts: np.ndarray, ps: Sequence[float], cuts: Sequence[int]) -> float:
    """u(t) of the module docstring, directly (for tests and checks).

    >>> joint_utility(np.array([2.0, 2.0, 2.0, 2.0]), [0.25, 0.75], [1, 3])  # exact quartiles
    0.0
    >>> joint_utility(np.array([2.0, 2.0, 2.0, 2.0]), [0.5], [1])  # 2 below, 4 asked
    -4.0
    """
    c = np.concatenate([[0.0], np.cumsum(np.asarray(counts, dtype=float))])
    n = float(c[-1])
    points = [0, *cuts, len(c) - 1]
    fractions = [0.0, *ps, 1.0]
    return -float(sum(abs(c[points[i]] - c[points[i - 1]] - (fractions[i] - fractions[i - 1]) * n)
                      for i in range(1, len(points)))) + 0.0  # no -0.0


def float_slack(epsilon: float, cap: int, quantiles: int, bins: int) -> float:
    """The epsilon given up to floating point (module docstring), for n <= MAX_VALUES."""
    depth = max(1, math.ceil(math.log2(bins + 1)))
    a = epsilon / (4.0 * cap)
    magnitude = 3.0 * a * MAX_VALUES + quantiles * math.log(bins + 1)
    per_sequence = 2.0 * (8 * depth + 10) * quantiles ** 2 * magnitude * 2.0 ** -52
    return 2.0 * per_sequence + quantiles * FLOAT_SLACK


@dataclass(frozen=True)
class JointQuantiles:
    """The joint exponential mechanism for the p's of one column (sorted, at most MAX_JOINT),
    one unit contributing at most ``cap`` values: Delta = 2 cap.  Costs ``epsilon``."""

    epsilon: float
    cap: int
    ps: tuple[float, ...]
    bins: int
    name = "joint_exponential"

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        if not 1 <= len(self.ps) <= MAX_JOINT or list(self.ps) != sorted(self.ps) or any(
                not 0.0 <= p <= 1.0 for p in self.ps):
            raise ValueError(f"1 to {MAX_JOINT} sorted quantiles in [0, 1] are drawn jointly")
        if isinstance(self.cap, bool) or not isinstance(self.cap, int) or self.cap < 1:
            raise ValueError(f"the row cap must be an integer >= 1, got {self.cap!r}")
        if not 1 <= self.bins < MAX_BINS:
            raise ValueError(f"the histogram must have 1 to {MAX_BINS - 1} bins")
        if self.working_epsilon <= self.epsilon / 2:
            raise ValueError(f"epsilon {self.epsilon:g} is too small to draw {len(self.ps)} "
                             "quantiles jointly in floating point")

    @property
    def sensitivity(self) -> float:
        """Delta = 2k (module docstring)."""
        return 2.0 * self.cap

    @property
    def working_epsilon(self) -> float:
        """The epsilon the weights use: the cost minus the floating-point slack."""
        return self.epsilon - float_slack(self.epsilon, self.cap, len(self.ps), self.bins)

    def tables(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """C, the targets g_1..g_{m+1} and the forward tables F_1..F_m: a function of the
        counts alone (no draw), so one histogram drawn from again may keep them."""
        counts = np.asarray(counts, dtype=float)
        if counts.ndim != 1 or counts.size != self.bins or np.any(counts < 0):
            raise ValueError(f"counts must be {self.bins} non-negative numbers")
        c = np.concatenate([[0.0], np.cumsum(counts)])
        n = float(c[-1])
        if n > MAX_VALUES:
            raise ValueError(f"a joint quantile draw reads at most {MAX_VALUES} values")
        g = np.diff(np.array([0.0, *self.ps, 1.0])) * n
        a = self.working_epsilon / (2.0 * self.sensitivity)
        positions = np.arange(c.size)
        tables = [-a * np.abs(c - g[0])]  # F_1(t) = phi_1(0, t)
        for i in range(1, len(self.ps)):
            previous = tables[-1]
            target = c - g[i]
            # s*(t): the last s with C(s) <= C(t) - g_i (and s <= t); -1 when there is none.
            cut = np.minimum(np.searchsorted(c, target, side="right") - 1, positions)
            below = range_logsumexp(previous + a * c, np.zeros_like(positions), cut + 1)
            above = range_logsumexp(previous - a * c, cut + 1, positions + 1)
            tables.append(np.logaddexp(below - a * target, above + a * target))
        return c, g, tables

    def sample(self, counts: np.ndarray,
               tables: tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None = None
               ) -> tuple[int, ...]:
        """The cuts t_1 <= ... <= t_m, drawn from os.urandom (module docstring); ``tables``:
        :meth:`tables` of these very counts, when the caller kept them."""
        c, g, tables = tables if tables is not None else self.tables(counts)
        a = self.working_epsilon / (2.0 * self.sensitivity)
        m = len(self.ps)
        cuts = [0] * m
        weights = tables[-1] - a * np.abs(c[-1] - c - g[m])
        cuts[-1] = draw_index(_normalised(weights))
        for i in range(m - 1, 0, -1):
            t = cuts[i]
            weights = tables[i - 1][: t + 1] - a * np.abs(c[t] - c[: t + 1] - g[i])
            cuts[i - 1] = draw_index(_normalised(weights))
        return tuple(cuts)

    def log_probability(self, counts: np.ndarray, cuts: Sequence[int]) -> float:
        """ln P(cuts) as the sampler draws it (the product of its conditionals), for tests."""
        c, g, tables = self.tables(counts)
        a = self.working_epsilon / (2.0 * self.sensitivity)
        m = len(self.ps)
        weights = tables[-1] - a * np.abs(c[-1] - c - g[m])
        total = float(weights[cuts[-1]] - np.logaddexp.reduce(weights))
        for i in range(m - 1, 0, -1):
            t = cuts[i]
            weights = tables[i - 1][: t + 1] - a * np.abs(c[t] - c[: t + 1] - g[i])
            total += float(weights[cuts[i - 1]] - np.logaddexp.reduce(weights))
        return total

    def rank_error(self, confidence: float = 0.95) -> float:
        """With probability ``confidence`` the drawn sequence's utility is within this of the
        best sequence's (McSherry and Talwar, Theorem 8, over the C(B + m, m) sequences), so
        is each cut's rank distance to p n beyond the best sequence's: (2 Delta / epsilon)
        (ln C(B + m, m) + ln(1 / (1 - confidence)))."""
        if not 0.0 < confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
        m, b = len(self.ps), self.bins
        outputs = math.lgamma(b + m + 1) - math.lgamma(m + 1) - math.lgamma(b + 1)
        return 2.0 * self.sensitivity / self.working_epsilon * (
            outputs - math.log(1.0 - confidence))

    def describe(self) -> dict[str, object]:
        """For reports: the mechanism, its cost and its utility's sensitivity."""
        return {"name": self.name, "epsilon": self.epsilon, "sensitivity": self.sensitivity,
                "scale": 2.0 * self.sensitivity / self.epsilon, "quantiles": list(self.ps)}


def cut_value(cut: int, bins: int, lower: float, upper: float, integral: bool) -> float:
    """The value of cut t: l + t (u - l) / B, inside the bounds; rounded for an integer
    column."""
    if not 0 <= cut <= bins:
        raise ValueError(f"cut {cut} outside [0, {bins}]")
    value = min(max(lower + cut * (upper - lower) / bins, lower), upper)
    if integral:
        value = float(min(max(round(value), math.ceil(lower)), math.floor(upper)))
    return value


def _normalised(log_weights: np.ndarray) -> np.ndarray:
    weights = np.exp(log_weights - log_weights.max())
    return weights / weights.sum()


def range_logsumexp(values: np.ndarray, start: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """log sum exp(values[start_j:stop_j]) for each j (-inf for an empty range), from a tree
    of pairwise log-sum-exps: only sums, never a difference of sums (module docstring)."""
    size = 1 << max(0, math.ceil(math.log2(values.size)))
    level = np.full(size, -np.inf)
    level[: values.size] = values
    levels = [level]
    while level.size > 1:
        level = np.logaddexp(level[0::2], level[1::2])
        levels.append(level)
    lo, hi = start.astype(np.int64).copy(), stop.astype(np.int64).copy()
    out = np.full(lo.shape, -np.inf)
    for level in levels:  # the bottom-up segment-tree query, for every range at once
        left = (lo < hi) & (lo & 1 == 1)
        out[left] = np.logaddexp(out[left], level[lo[left]])
        lo = lo + left
        right = (lo < hi) & (hi & 1 == 1)
        hi = hi - right
        out[right] = np.logaddexp(out[right], level[hi[right]])
        lo, hi = lo >> 1, hi >> 1
    return out
