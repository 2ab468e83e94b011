"""Choosing the row cap of a DP quantile query (contribution = "auto"): rows dropped against the
exponential mechanism's rank error.

Why a cap of its own.  A quantile drawn by the exponential mechanism at cap k
(``mechanisms.exponential``) has utility sensitivity Delta = k max(p, 1 - p) (the joint
mechanism, ``mechanisms.joint_quantiles``: 2k), so its 95% rank error

    E_q(k) = (2 Delta(k) / epsilon_q) ln(B / beta)           (one quantile, beta = 0.05)
           = (2 Delta(k) / epsilon_q) (ln C(B + m, m) + ln(1 / beta))   (m of them jointly)

grows linearly with k: at the policy's limit (200 on the demo) a median at epsilon 0.5 is
+-4,882 rows off.  Most units have a few rows, so a small k drops few of them.

What dropping rows costs, in ranks.  Let the query's rows be n, of which the cap keeps n' =
n - R(k) (R(k): each unit's rows beyond k, ``mechanisms.caps.RowModel``).  The p-quantile of
the kept rows has rank p n' among them; among all rows its rank lies in [p n', p n' + R(k)]
(the dropped rows may all fall below it).  The target is p n = p n' + p R(k), so the kept
rows' quantile is off by at most max(p, 1 - p) R(k) ranks of the whole.  (The kept rows are a
random subset of each unit's, independent of the values, so on average the shift is smaller;
the bound is the worst case, which keeps the rule from trading a sure rank error for a bias it
cannot see.)  Over G public groups the dropped rows spread over the groups: R(k) / G per group
(the rule's assumption, as ``mechanisms.caps`` divides rows by G), while every group's draw
has the whole E_q(k).

The rule.  k minimises, over the candidates of ``RowModel.candidates`` (bin starts and ends
and the limit, never above it),

    E(k) = sum over the query's quantiles q of  [ max(p_q, 1 - p_q) R(k) / G + E_q(k) ],

both terms in ranks of the same answer.  Ties go to the smallest k.  E is convex in k: its
slope is r - w U(k), r the rank error per unit of cap (E_q is linear in k) and U(k) the units
with more than k rows (non-increasing), so k is where the units above it no longer pay for
the noise of one more row each: U(k) <= r / w.

Reading R(k) from the noisy histogram.  Unlike the analytic kinds' rule, the limit is not a
safe default that a smaller cap must beat at a 95% confidence limit: for a quantile the limit
is the choice of the largest sure error (E_q at the limit is the +-4,882 above).  Nor do point
estimates do: the consistent counts (``mechanisms.consistency``) keep a positive excursion of
the noise in the empty high bins as phantom units, each worth up to the limit in rows, and R(k)
is a sum over those bins weighted by rows: at epsilon_h = 0.05 (sd of a bin's noise sqrt(V) =
28 units) a phantom excursion of one bin near the limit outweighs the rank error of any cap,
so a quarter of the draws took caps above 60 on data whose best cap is 3 (simulated: 1000
units of 1 to 3 rows and 5 of 100, epsilon_q = 0.45; the rank error at the chosen k over the
best one's: mean 3.7, 99th percentile 16.8).  So each bin is first soft-thresholded by twice
its noise's standard deviation,

    H''_b = max(0, H'_b - 2 sqrt(V)),

(the shrinkage estimator of Donoho and Johnstone, "Ideal spatial adaptation by wavelet
shrinkage", Biometrika 81(3), 1994, at a threshold of 2 noise sd: a bin whose count is within
it is indistinguishable from an empty one, P(X > 2 sqrt(V)) ~ exp(-2 sqrt(2)) = 6% for
Laplace noise) and R(k) = sum_b H''_b max(0, m_b - k).  Simulated as above (and on units of
geometric row counts, means 3 and 10), the rank error at the chosen k over the best one's
fell to a mean of 1.02 to 1.5 and a 99th percentile of at most about 5.5, at epsilon_h = 0.05
to 0.2.
The shrinkage underestimates the rows of a few real heavy units (a smaller k: more rows
dropped); the bound max(p, 1 - p) R(k) is the worst case of their effect, and with exact
counts (V = 0) nothing is shrunk.

Privacy.  k is a function of the noisy histogram only (its epsilon_h is charged as the query's
selection share, ``privacy.cap_epsilon_share``); the quantiles are then drawn at Delta(k) of
the chosen k over at most k rows per unit, at epsilon_q.  By basic composition the query costs
epsilon_h + epsilon_q (+ the key-release count's share, when its keys are thresholded): the
cap is DP post-processing of a released histogram, so the chosen k may be the exponential
mechanism's sensitivity bound.

Example.  1000 units of 2 rows and 10 in the bin [136, 161] (limit 200; taken at its middle,
148.5 rows), one median at epsilon_q = 0.45, B = 10,000 bins, exact counts: E_q(k) = 2 k 0.5
ln(10,000 / 0.05) / 0.45 = 27.124 k; at k = 2, R = 10 (148.5 - 2) = 1465 rows and E = 0.5 *
1465 + 54.25 = 786.7; at k = 1, R = 1000 + 1475 = 2475, E = 1264.6; at k = 161 (nothing
dropped) E = 4367.1: k = 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mechanisms.caps import RowModel, soft_threshold


@dataclass(frozen=True)
class QuantileCap:
    """The chosen cap and E at it, with its two parts (ranks): the rows-dropped term and the
    mechanisms' 95% rank error."""

    cap: int
    error: float
    dropped: float
    rank_error: float


def choose_quantile_cap(rows: RowModel, ps: Sequence[float],
                        rank_error: Callable[[int], float], groups: int = 1) -> QuantileCap:
    """The cap minimising E(k) (module docstring).

    ``ps``: the quantiles asked (one entry per quantile); ``rank_error(k)``: the sum over them
    of their mechanisms' 95% rank errors at cap k (the mechanisms the query would draw with);
    ``groups``: G, the public groups (1 for keys released by a threshold: no spreading
    assumed).  R(k) is read from the soft-thresholded consistent counts.

    >>> from mechanisms.caps import cap_bins
    >>> starts = cap_bins(200)
    >>> counts = [0.0] * len(starts)
    >>> counts[starts.index(2)], counts[starts.index(136)] = 1000.0, 10.0  # [136, 161]: m 148.5
    >>> found = choose_quantile_cap(RowModel(starts, tuple(counts), 200, 0.0), [0.5],
    ...                             lambda k: k * math.log(200_000) / 0.45)
    >>> found.cap, round(found.dropped, 1), round(found.rank_error, 1)
    (2, 732.5, 54.2)
    """
    if not ps or any(not 0.0 <= p <= 1.0 for p in ps):
        raise ValueError("at least one quantile p in [0, 1]")
    weight = sum(max(p, 1.0 - p) for p in ps) / max(groups, 1)
    shrunk = soft_threshold(rows)
    best: QuantileCap | None = None
    caps = [k for k in shrunk.candidates() if 1 <= k <= rows.limit]
    # R(k) at every candidate in one array operation.
    lost = shrunk.lost_at(np.asarray(caps, dtype=float), 0.0).tolist()
    for k, rows_lost in zip(caps, lost, strict=True):
        dropped = weight * rows_lost
        error = rank_error(k)
        if not math.isfinite(error):
            continue
        found = QuantileCap(k, dropped + error, dropped, error)
        if best is None or found.error < best.error:
            best = found
    if best is None:
        raise ValueError("no candidate cap has a finite rank error")
    return best
