"""How far the chosen cap and clipping bound move an answer: bias estimates for the report.

The cap k drops every row a unit has beyond k, and the bound B clips every value's magnitude
to B; both move an answer one way only, which the noise's error bar does not cover.  These
estimates read the same noisy histograms the choice was made from (``mechanisms.caps``,
``mechanisms.clip_bounds``; their consistent versions, ``mechanisms.consistency``), so they cost
no budget (post-processing).

Units and sign.  Each is a ``Bias``: a fraction of the answer (0.03 is 3%), never negative,
saying the answer comes out LOW by about ``estimate`` and, at the one-sided 95% level, by at
most ``upper``: "up to 3% low".

- ``cap_bias``: the share of the query's rows above the cap, R(k) / N(limit) (rows beyond k of
  every unit, over all rows).  A COUNT or a SUM of non-negative values released as a total is
  low by this share (for a SUM, if heavy units' values are like the others', as the cap rule
  assumes); an AVG is not moved by it in expectation, only through which rows are kept.  Over
  grouped answers it is the share over all groups together.
- ``clip_bias``: the relative change of the sum of magnitudes from clipping at B, loss(B) =
  (mu - mu(B)) / mu.  For a column declared non-negative (or non-positive) that is the relative
  change of its SUM and of its AVG, toward 0 (``one_signed``): low (or high, for negative values:
  the magnitude is low).  For a column whose declared interval holds both signs the shift of a
  SUM is at most this share of the sum of |x|, which bounds it but is not relative to the SUM.
- ``combined``: a total under both, kept share (1 - c)(1 - l): low by 1 - (1 - c)(1 - l).

The upper values.  For the cap, (R + Z sd R) / (N - Z sd N), with sd R = sqrt(V sum_b max(0,
m_b - k)^2) and sd N = sqrt(V sum_b m_b^2) (``mechanisms.caps``): numerator at its upper and
denominator at its lower estimate, hence conservative; 1 (the histogram cannot tell) when the
lower estimate of N is not positive.  For the bound, loss(B) + Z sd loss(B) (the delta method,
``mechanisms.clip_bounds``).  Both are capped at 1: a bias cannot remove more than the answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mechanisms.caps import RowModel
from mechanisms.clip_bounds import ClipColumn, Z


@dataclass(frozen=True)
class Bias:
    """An answer comes out low by about ``estimate`` and by at most ``upper`` (fractions of
    the answer, 0 <= estimate <= upper <= 1; module docstring).  ``one_signed`` is False only
    for a clipping bias of a column with both signs, where the fractions are of sum |x|."""

    estimate: float
    upper: float
    one_signed: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.estimate <= self.upper <= 1.0:
            raise ValueError("need 0 <= estimate <= upper <= 1")


def cap_bias(rows: RowModel, cap: int, z: float = Z) -> Bias:
    """The share of rows above ``cap``, dropped: R(k) / N(limit), and its upper value.

    100 units with 8 rows (exact counts): a cap of 4 drops half the rows.

    >>> cap_bias(RowModel((1, 2, 4, 8), (0, 0, 0, 100), 8, 0.0), 4)
    Bias(estimate=0.5, upper=0.5, one_signed=True)
    """
    if cap < 1:
        raise ValueError("the cap must be >= 1")
    counts = np.asarray(rows.counts())
    middles = rows._middles
    above = np.maximum(middles - cap, 0.0)
    all_rows = float(counts @ middles)
    if all_rows <= 0:
        return Bias(0.0, 1.0)  # no rows measured: nothing known about them
    lost = float(counts @ above)
    estimate = min(lost / all_rows, 1.0)
    lost_upper = lost + z * math.sqrt(rows.variance * float(above @ above))
    rows_lower = all_rows - z * rows.all_rows_sd()
    upper = 1.0 if rows_lower <= 0 else min(lost_upper / rows_lower, 1.0)
    return Bias(estimate, max(upper, estimate))


def clip_bias(column: ClipColumn, bound: float, z: float = Z) -> Bias:
    """The relative change of the sum of magnitudes from clipping at ``bound``: loss(B), and its
    upper value loss(B) + z sd loss(B).

    Half the weight at 8, half near 0 (exact): clipping at 4 takes about half the sum.

    >>> h = [50.0] + [0.0] * 24 + [50.0]
    >>> round(clip_bias(ClipColumn(0.0, 8.0, tuple(h)), 4.0).estimate, 3)
    0.5
    """
    if not bound > 0:
        raise ValueError("the bound must be positive")
    estimate = column.loss(bound) if bound < column.magnitude else 0.0
    upper = 0.0 if bound >= column.magnitude else column.loss_upper(bound, z)
    one_signed = column.lower >= 0 or column.upper <= 0
    return Bias(estimate, min(max(upper, estimate), 1.0), one_signed)


def combined(cap: Bias, clip: Bias) -> Bias:
    """A total under both: low by 1 - (1 - c)(1 - l), estimate and upper alike.

    >>> combined(Bias(0.1, 0.2), Bias(0.5, 0.5))
    Bias(estimate=0.55, upper=0.6, one_signed=True)
    """
    return Bias(1.0 - (1.0 - cap.estimate) * (1.0 - clip.estimate),
                1.0 - (1.0 - cap.upper) * (1.0 - clip.upper),
                cap.one_signed and clip.one_signed)
