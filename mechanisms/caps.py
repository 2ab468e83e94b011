"""Choosing a query's row cap per privacy unit from a noisy histogram (contribution = "auto").

The cap k trades bias against noise.  Rows a unit has beyond k are dropped, which biases every
total (COUNT, SUM) down, while every noisy measurement's sensitivity, hence its noise, grows
linearly with k.  A fixed table-wide cap is wrong for most queries: too small, and COUNT(*) comes
back far too low at any epsilon; too large, and an AVG drowns in noise it did not need.

The histogram.  In the database, count each unit's rows in the query's own filtered relation,
c_u, and count units per bin of c_u.  The bins partition [1, limit]: one bin per integer up to 8,
then bins about 19% wide (edges grow by a factor 2^(1/4)), and a bin for exactly the limit.
Each unit falls in exactly one bin, so adding or removing a unit changes one count by 1: L1
sensitivity 1.  Discrete Laplace noise of
scale 1 / epsilon_sel makes the histogram epsilon_sel-DP.  k is a function of the noisy histogram
only (post-processing), so the query as a whole costs epsilon_sel + the epsilon of its
measurements, by basic composition.

The rule.  From the noisy counts H_b (clamped at 0), with each unit counted at the start s_b of its
bin (exact below 9, at most 19% low above), estimate the rows kept at cap k,

    N(k) = sum_b H_b * min(s_b, k),

and, for a query with G groups (its public keys; 1 otherwise), the expected relative error of each
noisy measurement m at cap k.  A measurement of epsilon_m has Laplace noise of standard deviation
sqrt(2) * k * d_m / epsilon_m, with d_m its sensitivity per row; d_m is measured in typical values
through the weight w_m: 1 for counts, 2 for sums (a sum's per-row bound is taken as twice a
typical value).  Then

    total m (a COUNT or SUM released as such):
        e_m(k) = [ (N(limit) - N(k)) / G + w_m sqrt(2) k / epsilon_m ] / (N(limit) / G)
    ratio m (only inside AVG / VARIANCE, whose value barely moves when rows are dropped):
        e_m(k) = w_m sqrt(2) k / epsilon_m / (N(k) / G)

and k minimises E(k) = sum_m e_m(k) over the bin starts and the limit (the smallest on ties).
On data where every unit has exactly c rows and c is a bin start, a total's error falls until
k = c and rises after it, so the rule picks c when the histogram noise is small.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CapTerm:
    """One noisy measurement as the rule sees it."""

    weight: float     # w_m: 1 for counts, 2 for sums, 0 when the noise does not grow with k
    epsilon: float    # its epsilon
    total: bool       # released as a total (its bias counts) or only inside a ratio


def cap_bins(limit: int) -> tuple[int, ...]:
    """The starts of the histogram bins over [1, limit] (the last bin ends at ``limit``).

    >>> cap_bins(20)
    (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 17, 20)
    """
    if limit < 1:
        raise ValueError("limit must be >= 1")
    starts = []
    edge = 1
    while edge <= limit:
        starts.append(edge)
        edge = edge + 1 if edge < 8 else max(edge + 1, round(edge * 2 ** 0.25))
    if starts[-1] != limit:
        # Units at exactly the limit get a bin of their own, so a cap just below it does not
        # look free (data often piles up at a cap applied upstream).
        starts.append(limit)
    return tuple(starts)


def choose_cap(starts: Sequence[int], noisy_counts: Sequence[float], limit: int,
               terms: Sequence[CapTerm], groups: int = 1) -> int:
    """The cap minimising E(k) (see the module docstring); never above ``limit``.

    100 units with 8 rows, one count (total): k = 8 loses nothing and costs the least noise.

    >>> choose_cap((1, 2, 4, 8), [0, 0, 0, 100], 10, [CapTerm(1.0, 1.0, True)])
    8
    """
    if len(starts) != len(noisy_counts):
        raise ValueError("one count per bin")
    if any(not t.epsilon > 0 for t in terms):
        raise ValueError("epsilons must be positive")
    counts = np.maximum(np.asarray(noisy_counts, dtype=float), 0.0)
    lower = np.asarray(starts, dtype=float)
    groups = max(groups, 1)
    n_all = max(float(np.sum(counts * np.minimum(lower, limit))), 1.0) / groups
    best_k, best_error = 1, math.inf
    for k in sorted({*starts, limit}):
        if k > limit:
            continue
        n_k = max(float(np.sum(counts * np.minimum(lower, k))), 1.0) / groups
        error = 0.0
        for term in terms:
            noise = term.weight * math.sqrt(2) * k / term.epsilon
            error += (n_all - n_k + noise) / n_all if term.total else noise / n_k
        if error < best_error:
            best_k, best_error = k, error
    return best_k
