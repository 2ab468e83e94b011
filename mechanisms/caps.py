"""Choosing a query's row cap per privacy unit from a noisy histogram (contribution = "auto").

The cap k trades bias against noise.  Rows a unit has beyond k are dropped (bias), while every
noisy measurement's sensitivity, hence its noise, grows linearly with k.  A fixed table-wide cap
is wrong for most queries: too small, and COUNT(*) comes back far too low at any epsilon.

The histogram.  In the database, count each unit's rows in the query's own filtered relation,
c_u, and count units per bin of c_u.  The bins partition [1, limit]: one bin per integer up to 8,
then bins about 19% wide (edges grow by a factor 2^(1/4)).  Each unit falls in exactly one bin, so
adding or removing a unit changes one count by 1: L1 sensitivity 1.  Discrete Laplace noise of
scale 1 / epsilon_sel makes the histogram epsilon_sel-DP.  k is a function of the noisy histogram
only (post-processing), so the query as a whole costs epsilon_sel + the epsilon of its
measurements, by basic composition.

The rule.  For a candidate cap k (a bin start, or the limit), estimate the total error of the
answer as

    E(k) = lost(k) / G + k * sum_m w_m * sqrt(2) / epsilon_m

- lost(k) = sum over bins b of H_b * max(0, start_b - k): the rows dropped, counting each unit at
  the start of its bin (exact below 9, at most 19% low above), with H_b the noisy count clamped
  at 0;
- G spreads the loss over the groups of a grouped query (the noise hits every group in full);
- the second term is the noise standard deviation of the measurements at cap k (Laplace of scale
  k * (sensitivity per row) / epsilon_m has standard deviation sqrt(2) times the scale), expressed
  in rows: w_m = 1 for counts, and 2 for sums, whose per-row sensitivity max(|l|, |u|) is taken
  as twice a typical value.

k is the smallest minimiser of E.  On data where every unit has exactly c rows and c is a bin
start, E falls until k = c and rises after it, so the rule picks c whenever the noise does not
move the histogram much (a generous epsilon_sel).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


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
    return tuple(starts)


def noise_per_row(epsilons: Sequence[float], weights: Sequence[float]) -> float:
    """sum_m w_m sqrt(2) / epsilon_m: the noise standard deviation one more row of cap adds."""
    if len(epsilons) != len(weights) or not epsilons:
        raise ValueError("one weight per measurement epsilon")
    if any(not e > 0 for e in epsilons):
        raise ValueError("epsilons must be positive")
    return sum(w * math.sqrt(2) / e for e, w in zip(epsilons, weights, strict=True))


def choose_cap(starts: Sequence[int], noisy_counts: Sequence[float], limit: int,
               per_row: float, groups: int = 1) -> int:
    """The cap minimising E(k) (see the module docstring); never above ``limit``.

    >>> choose_cap((1, 2, 4, 8), [0, 0, 0, 1000], 10, per_row=1.0)
    8
    """
    if len(starts) != len(noisy_counts):
        raise ValueError("one count per bin")
    counts = np.maximum(np.asarray(noisy_counts, dtype=float), 0.0)
    lower = np.asarray(starts, dtype=float)
    best_k, best_error = 1, math.inf
    for k in sorted({*starts, limit}):
        if k > limit:
            continue
        lost = float(np.sum(counts * np.maximum(0.0, lower - k)))
        error = lost / max(groups, 1) + per_row * k
        if error < best_error:
            best_k, best_error = k, error
    return best_k
