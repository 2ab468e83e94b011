"""Stability and L1 sensitivity of the aggregates of a single-table query (DESIGN.md section 5).

Neighbouring databases differ by one privacy unit's rows (one row for event-level DP).  After
contribution bounding each unit has at most ``k = max_rows_per_unit`` rows in the relation that is
aggregated, so that relation has stability k (k = 1 without a privacy unit).  Filters and
projections keep the stability: they can only drop rows.

The noise is calibrated to the L1 sensitivity of the whole vector of groups: one unit's k rows fall
into at most k groups, so a grouped COUNT changes by at most k in total, however the groups are
formed.
"""

from __future__ import annotations


def count_sensitivity(stability: int) -> int:
    """COUNT(*) or COUNT(x): each of the ``stability`` rows adds at most 1.  Delta = s."""
    _check_stability(stability)
    return stability


def count_units_sensitivity(stability: int, grouped: bool, groups: int | None = None) -> int:
    """COUNT(DISTINCT unit): the unit counts once per group it appears in.

    Without GROUP BY it changes the one count by 1: Delta = 1.  With GROUP BY its <= s rows reach
    at most min(s, G) of the G groups, each count moving by 1: Delta = min(s, G) (G unknown: s).
    """
    _check_stability(stability)
    if not grouped:
        return 1
    if groups is None:
        return stability
    return max(1, min(stability, groups))


def sum_sensitivity(stability: int, lower: float, upper: float) -> float:
    """SUM(clip(x, l, u)): each row adds a value of magnitude <= max(|l|, |u|).

    Delta = s * max(|l|, |u|).  (The range u - l would suffice for replace-one neighbours; the
    proxy uses add/remove neighbours, where a removed row takes its whole value with it.)
    """
    _check_stability(stability)
    if lower > upper:
        raise ValueError("lower must be <= upper")
    return stability * max(abs(lower), abs(upper))


def square_bounds(lower: float, upper: float) -> tuple[float, float]:
    """The range of x * x for x in [lower, upper] (used by VARIANCE's sum of squares)."""
    low = 0.0 if lower <= 0.0 <= upper else min(lower * lower, upper * upper)
    return (low, max(lower * lower, upper * upper))


def _check_stability(stability: int) -> None:
    if stability < 1:
        raise ValueError(f"stability must be >= 1, got {stability}")
