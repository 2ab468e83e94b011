"""Consistent noisy histograms: non-negative counts whose tail sums are monotone.

A noisy histogram H_b = h_b + X_b (X_b independent, variance V) is read by the selection rules
(``mechanisms.caps``, ``mechanisms.clip_bounds``) through its tail sums: the units with at least
k rows, the weight of values of magnitude at least B.  True tail sums T_b = sum_{i >= b} h_i are
non-negative and non-increasing in b; the noisy ones are neither (a sum of empty bins goes
negative half of the time, and the total can fall below a bin).  This module replaces them by
the closest sequence that is (Hay, Rastogi, Miklau and Suciu, "Boosting the accuracy of
differentially private histograms through consistency", PVLDB 3(1), 2010, arXiv:0904.0942
v5, section 4: constrained inference by isotonic regression, computed by pool adjacent
violators):

    T' = argmin sum_b w_b (T'_b - T_b)^2  over  T'_0 >= T'_1 >= ... >= T'_{n-1} >= 0,

with w_b = 1 / (n - b), the inverse of the number of noisy bins summed in T_b (the variance of
T_b is (n - b) V): the tail sums over few bins, which are the precise ones, weigh most.  The
projection onto the monotone sequences followed by clamping at 0 is the projection onto the
monotone non-negative ones (the isotonic fit commutes with a lower bound).  The consistent
counts are H'_b = T'_b - T'_{b+1} >= 0 (T'_n = 0).

It is post-processing of the noisy histogram: no privacy cost (Dwork and Roth, "The Algorithmic
Foundations of Differential Privacy", 2014, Proposition 2.1).  Unlike clamping each bin at 0,
which turns the noise of every empty bin into phantom mass (about sqrt(V / 2) per bin), the
fit lets a negative bin cancel its positive neighbours; a positive excursion in the tail
survives as phantom mass at the top, which the rules read as a reason to keep a wide cap or
bound (the safe direction).  Exact counts are returned unchanged.

>>> consistent_counts([10.0, -3.0, 5.0, -4.0]).tolist()  # tail sums 8, -2, 1, -4
[8.0, 0.0, 0.0, 0.0]
>>> consistent_counts([3.0, 4.0, 2.0]).tolist()  # already consistent: unchanged
[3.0, 4.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def consistent_counts(noisy: Sequence[float] | np.ndarray) -> np.ndarray:
    """H': non-negative counts whose tail sums (from the last bin down) are the weighted
    isotonic fit of the noisy tail sums (module docstring)."""
    h = np.asarray(noisy, dtype=float)
    n = len(h)
    if n == 0:
        return h.copy()
    if not np.all(np.isfinite(h)):
        raise ValueError("noisy counts must be finite")
    tails = np.cumsum(h[::-1])[::-1]           # T_b = sum_{i >= b} H_i
    weights = 1.0 / np.arange(n, 0, -1)        # w_b = 1 / (n - b)
    fitted = np.maximum(_decreasing_fit(tails, weights), 0.0)
    return fitted - np.append(fitted[1:], 0.0)


def _decreasing_fit(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted least-squares non-increasing fit (pool adjacent violators, O(n))."""
    means: list[float] = []
    sizes: list[float] = []
    counts: list[int] = []
    for value, weight in zip(values.tolist(), weights.tolist(), strict=True):
        means.append(value)
        sizes.append(weight)
        counts.append(1)
        # A block that rises above the one before it violates the order: pool them.
        while len(means) > 1 and means[-1] > means[-2]:
            weight_sum = sizes[-2] + sizes[-1]
            means[-2] = (means[-2] * sizes[-2] + means[-1] * sizes[-1]) / weight_sum
            sizes[-2] = weight_sum
            counts[-2] += counts[-1]
            del means[-1], sizes[-1], counts[-1]
    return np.repeat(np.asarray(means), counts)
