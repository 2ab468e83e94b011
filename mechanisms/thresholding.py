"""Releasing non-public group keys: a noisy count must clear a threshold derived from delta.

Setting.  A query groups by a column whose values are not declared public.  Each group's key is
released only when the group's noisy count exceeds tau.  The count is the number of distinct
privacy units in the group (user level) or of rows (event level), with discrete Laplace noise of
scale b = D / epsilon_t, where D is the most groups one unit can reach (its row cap k, or 1).

Derivation of tau.  Take neighbours D and D' = D plus one unit.  Groups present in both are
covered by the Laplace argument (epsilon_t for the counts, L1 sensitivity D).  A group present
only in D' holds that unit alone, so its true count is 1, and the unit reaches at most D such
groups.  With X discrete Laplace of parameter a = exp(-1/b),
P(1 + X > tau) = P(X >= m) for m = floor(tau - 1) + 1, and
P(X >= m) = a^m / (1 + a) < exp(-(tau - 1) / b).
A union bound over the D groups gives P(any such key released) < D exp(-(tau - 1) / b), which is
at most delta when

    tau = 1 + b * ln(D / delta).

Then the keys cost (epsilon_t, delta): Korolova et al., "Releasing search queries and clicks
privately" (WWW 2009), and Wilson et al., "Differentially private SQL with bounded user
contribution" (PoPETs 2020, Section 3), argue the same way.
"""

from __future__ import annotations

import math


def key_release_threshold(scale: float, max_groups_per_unit: int, delta: float) -> float:
    """tau = 1 + b ln(D / delta) for a noisy count of scale b (see the module docstring).

    >>> round(key_release_threshold(100.0, 10, 1e-8), 3)
    2073.327
    """
    if not scale > 0 or not math.isfinite(scale):
        raise ValueError("scale must be positive and finite")
    if max_groups_per_unit < 1:
        raise ValueError("max_groups_per_unit must be >= 1")
    if not 0 < delta < 1:
        raise ValueError("releasing non-public group keys needs 0 < delta < 1")
    return 1.0 + scale * math.log(max_groups_per_unit / delta)
