"""The exponential mechanism over a histogram, for DP quantiles (McSherry and Talwar, FOCS 2007,
Theorem 6; the quantile utility follows Smith, STOC 2011, Section 3, on a fixed grid).

Setting.  The values of a column, clipped to its declared bounds [l, u], are counted in B equal
bins of width w = (u - l) / B.  For bin j let L_j be the number of values in bins before j and
R_j = L_j + c_j (c_j: the values in bin j), n the number of values.  The target rank of the
p-quantile is p n.  The utility of bin j is minus the distance from p n to the ranks the bin
covers::

    u(j) = -max(L_j - p n,  p n - R_j,  0)

so a bin holding the target rank scores 0 (the best) and every other bin loses one point per
value between it and the target.

Sensitivity (neighbours: add or remove one privacy unit, whose rows are at most k after the
contribution bound).  Adding a unit with m <= k values changes n by m, L_j by a and R_j by b
with 0 <= a <= b <= m (a of its values fall before bin j, b - a inside it).  Then

    L_j - p n  moves by  a - p m  in [-p m, (1 - p) m]
    p n - R_j  moves by  p m - b  in [-(1 - p) m, p m]

and the constant 0 does not move.  A maximum of terms that each move by at most D moves by at
most D, so |u'(j) - u(j)| <= m max(p, 1 - p) <= k max(p, 1 - p) =: Delta for every j; removing
a unit is the same change read backwards.  (Smith's score, on sorted points, has Delta = 1 for
k = 1 and p = 1/2 written as rank distance; here it is max(p, 1 - p) <= 1, since n itself moves.)

Groups (GROUP BY keys with public values): the mechanism runs once per group, each at epsilon
calibrated to the whole Delta.  A unit's m_g rows in group g move that group's utilities by at
most m_g max(p, 1 - p), so that group's release costs epsilon m_g / k, and the groups together
cost epsilon (sum of m_g) / k <= epsilon: the row cap bounds the sum, not each group.

Selection.  P(j) is proportional to exp(epsilon u(j) / (2 Delta)), which is epsilon-DP (the 2
because u is not monotone: n moves with the data).  The proxy samples it with the kernel CSPRNG
(``mechanisms.randomness``), never numpy's generators, by inverting the CDF with the bins sorted
by increasing probability and a uniform of Mironov's dense kind (``secure_uniform_dense``): a
bin whose cumulative sum is s has probability at least s / B (the bins before it are no more
likely), and the uniform resolves s to a relative error of about 2^-52, so every bin is drawn
with a relative error of at most about ``B 2^-51`` (rounding of the sums included).  The
mechanism is therefore run at epsilon minus :data:`FLOAT_SLACK` (the log of that relative
error, on both sides of the ratio), so the release stays epsilon-DP including its floating
point.  Bins whose weight underflows (exp(-708) below the best bin) are never drawn: their true
probability is below B e^-708, far under any delta the ledger tracks.

Utility error (the report's rank bound, McSherry and Talwar, Theorem 8): with probability at
least 1 - beta, the drawn bin's utility is at least -(2 Delta / epsilon) ln(B / beta): its ranks
lie within that many values of p n.  This is a bound on ranks, not on values: a value interval
would need the data's distribution, which is not released.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mechanisms.base import check_epsilon
from mechanisms.randomness import secure_uniform, secure_uniform_dense

__all__ = ["FLOAT_SLACK", "MAX_BINS", "ExponentialMechanism", "bin_value", "draw_index",
           "rank_sensitivity", "rank_utility"]

#: The largest histogram the mechanism samples: keeps ``B 2^-51`` (the sampler's relative
#: error) below 2^-31.
MAX_BINS = 2**20

#: epsilon given up to the sampler's floating point: 4 B 2^-53 at B = MAX_BINS, an upper bound on
#: the log ratio of a bin's drawn to ideal probability, counted twice (a neighbour's too).
FLOAT_SLACK = 4.0 * MAX_BINS * 2.0**-53 * 2


def rank_utility(counts: np.ndarray, p: float) -> np.ndarray:
    """u(j) = -max(L_j - p n, p n - R_j, 0) for every bin j of ``counts`` (module docstring).

    >>> (rank_utility(np.array([3.0, 0.0, 5.0, 2.0]), 0.5) + 0.0).tolist()  # p n = 5
    [-2.0, -2.0, 0.0, -3.0]
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"the quantile p must be in [0, 1], got {p!r}")
    counts = np.asarray(counts, dtype=float)
    if counts.ndim != 1 or counts.size == 0 or np.any(counts < 0):
        raise ValueError("counts must be a non-empty vector of non-negative numbers")
    right = np.cumsum(counts)
    left = right - counts
    target = p * float(right[-1])
    return -np.maximum(np.maximum(left - target, target - right), 0.0) + 0.0  # no -0.0


def rank_sensitivity(p: float, k: int) -> float:
    """Delta = k max(p, 1 - p): how far one unit's <= k rows move the rank utility (module
    docstring).

    >>> rank_sensitivity(0.5, 10), rank_sensitivity(0.99, 1)
    (5.0, 0.99)
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"the quantile p must be in [0, 1], got {p!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"the row cap k must be an integer >= 1, got {k!r}")
    return k * max(p, 1.0 - p)


@dataclass(frozen=True)
class ExponentialMechanism:
    """P(j) proportional to exp(epsilon u(j) / (2 sensitivity)), drawn from os.urandom.

    ``epsilon`` is the privacy cost; the draw runs at epsilon - FLOAT_SLACK (module docstring).
    """

    epsilon: float
    sensitivity: float
    name = "exponential"

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        if self.epsilon <= 1000 * FLOAT_SLACK:
            raise ValueError(f"epsilon {self.epsilon:g} is too small for the exponential "
                             f"mechanism's sampler (needs > {1000 * FLOAT_SLACK:g})")
        if not (math.isfinite(self.sensitivity) and self.sensitivity > 0):
            raise ValueError(f"sensitivity must be finite and > 0, got {self.sensitivity!r}")

    @property
    def working_epsilon(self) -> float:
        """The epsilon the sampler's weights use: the cost minus the floating-point slack."""
        return self.epsilon - FLOAT_SLACK

    def probabilities(self, utility: np.ndarray) -> np.ndarray:
        """The exact (up to floating point) output distribution over the bins, in log space."""
        utility = np.asarray(utility, dtype=float)
        if utility.ndim != 1 or utility.size == 0 or utility.size > MAX_BINS:
            raise ValueError(f"the utility must be a vector of 1 to {MAX_BINS} bins")
        logw = self.working_epsilon * utility / (2.0 * self.sensitivity)
        logw -= logw.max()
        weights = np.exp(logw)
        return weights / weights.sum()

    def sample(self, utility: np.ndarray) -> int:
        """One bin index, drawn by inverting the CDF over the bins sorted by probability."""
        return draw_index(self.probabilities(utility))

    def rank_error(self, bins: int, confidence: float = 0.95) -> float:
        """With probability ``confidence`` the drawn bin's ranks lie within this many values of
        the target rank: (2 Delta / epsilon) ln(B / (1 - confidence))."""
        if not 0.0 < confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
        return 2.0 * self.sensitivity / self.working_epsilon * math.log(
            bins / (1.0 - confidence))

    def describe(self) -> dict[str, object]:
        """For reports: the mechanism, its cost and its utility's sensitivity."""
        return {"name": self.name, "epsilon": self.epsilon, "sensitivity": self.sensitivity,
                "scale": 2.0 * self.sensitivity / self.epsilon}


def draw_index(probs: np.ndarray) -> int:
    """An index drawn with probabilities ``probs`` (>= 0, summing to about 1), from os.urandom:
    the CDF inverted over the indexes sorted by increasing probability, with a dense uniform
    (module docstring, "Selection": relative error about ``len(probs) 2^-51`` per index)."""
    order = np.argsort(probs, kind="stable")
    cdf = np.cumsum(probs[order])
    draw = float(secure_uniform_dense(1)[0]) * cdf[-1]
    position = int(np.searchsorted(cdf, draw, side="left"))
    return int(order[min(position, len(order) - 1)])


def bin_value(index: int, bins: int, lower: float, upper: float, integral: bool) -> float:
    """A value drawn uniformly in bin ``index`` of [lower, upper] (post-processing, os.urandom);
    for an integer column, rounded and kept inside the bounds."""
    if not 0 <= index < bins:
        raise ValueError(f"bin {index} outside [0, {bins})")
    width = (upper - lower) / bins
    value = lower + (index + float(secure_uniform(1)[0])) * width
    value = min(max(value, lower), upper)
    if integral:
        value = float(min(max(round(value), math.ceil(lower)), math.floor(upper)))
    return value
